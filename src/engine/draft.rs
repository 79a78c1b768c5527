//! Draft sources of speculative decoding ([`DraftSource`]): prompt lookup ([`LookupDraft`],
//! n-gram matches in the prompt and the output so far, no model) and a smaller model with the
//! same vocabulary ([`ModelDraft`], with its own KV cache rolled back like the target's).

use anyhow::Result;

use super::sampler::{Sampler, SamplerConfig};
use super::session::Session;
use crate::models::Logits;

/// Tokens proposed to follow the sequence, with the distributions they were drawn from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Draft {
    /// The proposed tokens, in order (possibly fewer than asked, possibly none).
    pub tokens: Vec<u32>,
    /// For each token, the draft's distribution `q` it was sampled from (`(id, probability)`
    /// pairs summing to 1, as [`Sampler::distribution`] returns them); `None` when the draft
    /// is deterministic (prompt lookup, greedy drafting): `q` is then one-hot on the token.
    pub q: Option<Vec<Vec<(u32, f64)>>>,
}

impl Draft {
    /// An empty draft of room `k` for drafts sampled by `sampler`: with distributions unless
    /// it is greedy.
    pub(super) fn for_sampler(sampler: &Sampler, k: usize) -> Self {
        Self {
            tokens: Vec::with_capacity(k),
            q: (sampler.config.temperature > 0.0).then(Vec::new),
        }
    }
}

/// The next draft token from a drafter's `logits` after the sequence `h`: the argmax (after
/// penalties) when `sampler` is greedy, else drawn from its distribution, which is pushed to
/// `d.q`.
pub(super) fn pick(sampler: &mut Sampler, logits: &mut [f32], h: &[u32], d: &mut Draft) -> u32 {
    if sampler.config.temperature <= 0.0 {
        return sampler.sample(logits, h);
    }
    sampler.penalize(logits, h);
    let dist = sampler.distribution(logits);
    let t = sampler.draw(&dist);
    if let Some(q) = d.q.as_mut() {
        q.push(dist);
    }
    t
}

/// Something that proposes the next tokens of a sequence (`Send`: the server moves it to its
/// model thread).
pub trait DraftSource: Send {
    /// A short name for statistics (`lookup`, `draft-model`).
    fn name(&self) -> &'static str;
    /// Up to `k` tokens to follow `history` (prompt and output so far, last token included).
    ///
    /// Errors: a draft model's forward pass failed.
    fn draft(&mut self, history: &[u32], k: usize) -> Result<Draft>;
    /// [`DraftSource::draft`] with the target's session at hand, whose cache holds `history`
    /// but its last token: what a drafter that reads the target's own weights and hidden
    /// states needs (multi-token prediction, [`super::draft_mtp::MtpDraft`]). The default
    /// ignores the target.
    ///
    /// Errors: as [`DraftSource::draft`].
    fn draft_for(&mut self, _target: &mut Session, history: &[u32], k: usize) -> Result<Draft> {
        self.draft(history, k)
    }
    /// Follows the sampling settings of a new generation (a draft model samples its drafts
    /// with them, from its own seeded stream); nothing by default.
    fn configure(&mut self, _sampling: &SamplerConfig) {}
    /// Whether drafting costs nothing worth counting (no model runs): the policy then drafts
    /// even on steps it does not verify, to keep measuring acceptance
    /// ([`super::spec_policy::Policy::record_shadow`]). False by default.
    fn free(&self) -> bool {
        false
    }
}

/// Prompt-lookup decoding (Saxena 2023, "prompt lookup decoding"; llama.cpp's `lookup`
/// example): the longest suffix of the sequence, `ngram_max` down to `ngram_min` tokens, that
/// occurred earlier is looked up at its most recent earlier occurrence, and the tokens that
/// followed it there are the draft.
#[derive(Clone, Debug)]
pub struct LookupDraft {
    /// Longest suffix tried, in tokens.
    pub ngram_max: usize,
    /// Shortest suffix tried, in tokens (at least 1).
    pub ngram_min: usize,
}

impl Default for LookupDraft {
    /// Suffixes of 3 down to 1 tokens.
    fn default() -> Self {
        Self {
            ngram_max: 3,
            ngram_min: 1,
        }
    }
}

impl LookupDraft {
    /// The tokens that followed the most recent earlier occurrence of the longest matching
    /// suffix of `h` (at most `k`; empty when no suffix of `ngram_min` tokens or more recurs).
    pub fn lookup(&self, h: &[u32], k: usize) -> Vec<u32> {
        let len = h.len();
        for n in (self.ngram_min.max(1)..=self.ngram_max).rev() {
            if len <= n {
                continue;
            }
            let pat = &h[len - n..];
            if let Some(j) = (0..len - n).rev().find(|&j| &h[j..j + n] == pat) {
                let start = j + n;
                return h[start..(start + k).min(len)].to_vec();
            }
        }
        Vec::new()
    }
}

impl DraftSource for LookupDraft {
    fn name(&self) -> &'static str {
        "lookup"
    }

    fn free(&self) -> bool {
        true
    }

    fn draft(&mut self, history: &[u32], k: usize) -> Result<Draft> {
        Ok(Draft {
            tokens: self.lookup(history, k),
            q: None,
        })
    }
}

/// A draft model: a smaller model with the target's vocabulary, kept resident in its own
/// session. It drafts autoregressively with the target's sampling settings (its own PRNG
/// stream); its KV cache keeps the tokens it has seen and is rolled back
/// ([`crate::models::KvCache::truncate`]) to the prefix it shares with the next request.
pub struct ModelDraft {
    /// The draft model's session.
    pub session: Session,
    sampler: Sampler,
    /// Token ids whose keys and values are in the draft's cache.
    cached: Vec<u32>,
}

impl ModelDraft {
    /// A drafter over `session` sampling with `config` (a seed derived from its seed, so the
    /// draft's random numbers never repeat the target's).
    ///
    /// Errors: the draft model keeps a recurrent state, which cannot be rolled back.
    pub fn new(session: Session, config: &SamplerConfig) -> Result<Self> {
        super::spec_types::check_rollback(&session.cache)?;
        Ok(Self {
            session,
            sampler: Sampler::new(draft_sampling(config)),
            cached: Vec::new(),
        })
    }
}

/// The draft's sampling: `config` with a seed derived from its seed.
pub(super) fn draft_sampling(config: &SamplerConfig) -> SamplerConfig {
    let mut c = config.clone();
    c.seed = c.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1AF_7D1A_F7D1_AF7D;
    c
}

impl DraftSource for ModelDraft {
    fn name(&self) -> &'static str {
        "draft-model"
    }

    fn configure(&mut self, sampling: &SamplerConfig) {
        self.sampler = Sampler::new(draft_sampling(sampling));
    }

    fn draft(&mut self, history: &[u32], k: usize) -> Result<Draft> {
        let s = &mut self.session;
        let shared = self
            .cached
            .iter()
            .zip(history)
            .take_while(|(a, b)| a == b)
            .count();
        // keep at least one token to run, for the logits of the next position
        let keep = s.cache.truncate(shared.min(history.len() - 1));
        self.cached.truncate(keep);
        if history.len() > s.cache.n_ctx || k == 0 {
            return Ok(Draft::default());
        }
        let mut logits = match s.prefill(&history[keep..], Logits::Last) {
            Ok(l) => l,
            Err(e) => {
                s.cache.clear();
                self.cached.clear();
                return Err(e);
            }
        };
        self.cached.extend_from_slice(&history[keep..]);
        // each drafted token but the last runs through the draft model
        let k = k.min(s.cache.n_ctx - s.cache.len + 1);
        let mut h = history.to_vec();
        let mut d = Draft::for_sampler(&self.sampler, k);
        for i in 0..k {
            let t = pick(&mut self.sampler, &mut logits, &h, &mut d);
            d.tokens.push(t);
            h.push(t);
            if i + 1 < k {
                logits = s
                    .model
                    .forward(&mut s.store, &mut s.cache, &[t], Logits::Last)?;
                self.cached.push(t);
            }
        }
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_takes_the_longest_recent_match() {
        let l = LookupDraft::default();
        // suffix [1, 2] recurs at 0 and 5; the most recent (5) is followed by 9, 1, 2
        let h = [1, 2, 3, 4, 0, 1, 2, 9, 1, 2];
        assert_eq!(l.lookup(&h, 2), vec![9, 1]);
        assert_eq!(l.lookup(&h, 8), vec![9, 1, 2]);
        // the 3-token suffix [7, 1, 2] has no match, nor [1, 2]... only [2]: after index 1
        let h = [5, 2, 6, 7, 8, 2];
        assert_eq!(l.lookup(&h, 3), vec![6, 7, 8]);
        // no earlier occurrence of the last token
        assert!(l.lookup(&[1, 2, 3], 4).is_empty());
        let l2 = LookupDraft {
            ngram_max: 3,
            ngram_min: 2,
        };
        assert!(l2.lookup(&[5, 2, 6, 7, 8, 2], 3).is_empty());
        // a periodic sequence drafts its own continuation
        assert_eq!(l.lookup(&[4, 5, 4, 5, 4], 4), vec![5, 4]);
    }
}
