//! Multi-token prediction as a draft source ([`MtpDraft`], `--draft mtp`): the target's own
//! multi-token-prediction layer ([`crate::models::Mtp`], DeepSeek-V3 technical report, sec.
//! 2.2) drafts from the target's final hidden states, which every target pass leaves in its
//! cache ([`crate::models::kv_cache::HiddenRows`]).
//!
//! The layer's entry at position `i` is computed from the target's hidden state `h_i` and the
//! token `t_{i+1}`, and its logits propose `t_{i+2}`. Before each draft the layer catches up in
//! one pass over every position the target has added since the last draft (the prompt after
//! prefill; the accepted drafts and the target's own token after a verification), the last of
//! which gives the first draft; each further draft feeds the layer its own output hidden state
//! and the previous draft (chained), and those chained entries are dropped afterwards, so the
//! layer's cache only ever holds entries built from the target's hidden states and is rolled
//! back with the target's.

use anyhow::{bail, Result};

use super::draft::{draft_sampling, pick, Draft, DraftSource};
use super::sampler::{Sampler, SamplerConfig};
use super::session::Session;
use crate::models::{KvCache, Logits};

/// The multi-token-prediction drafter over a target loaded with its MTP layer
/// ([`crate::models::LoadOptions::mtp`]): the layer's KV cache and the tokens its entries were
/// built from.
pub struct MtpDraft {
    /// The layer's cache: entry `j` from the target's `h_j` and token `t_{j+1}`.
    cache: KvCache,
    /// The tokens the entries depend on: `t_0 ..= t_len` (empty with no entry).
    cached: Vec<u32>,
    sampler: Sampler,
}

impl MtpDraft {
    /// A drafter for `target` sampling with `config` (a seed derived from its seed, as a draft
    /// model's), its cache as large as the target's.
    ///
    /// Errors: the target has no multi-token-prediction layer (its family has none, its
    /// checkpoint ships none, or it was loaded without `LoadOptions::mtp`).
    pub fn new(target: &Session, config: &SamplerConfig) -> Result<Self> {
        let Some(mtp) = target.model.mtp() else {
            bail!(
                "--draft mtp needs a model with a multi-token-prediction layer (a DeepSeek V3 or Kimi K2 checkpoint with num_nextn_predict_layers > 0 that ships the layer's tensors, model.layers.{{num_hidden_layers}}.eh_proj and the rest), but this model has none; use --lookup or --draft-model instead"
            );
        };
        Ok(Self {
            cache: mtp.new_mtp_cache(target.cache.n_ctx),
            cached: Vec::new(),
            sampler: Sampler::new(draft_sampling(config)),
        })
    }

    /// Forgets every entry (after an error).
    fn reset(&mut self) {
        self.cache.clear();
        self.cached.clear();
    }
}

impl DraftSource for MtpDraft {
    fn name(&self) -> &'static str {
        "mtp"
    }

    fn configure(&mut self, sampling: &SamplerConfig) {
        self.sampler = Sampler::new(draft_sampling(sampling));
    }

    /// Without the target nothing can be drafted: an empty draft.
    fn draft(&mut self, _history: &[u32], _k: usize) -> Result<Draft> {
        Ok(Draft::default())
    }

    /// Catches the layer up on the target's new positions and drafts up to `k` tokens (an
    /// empty draft when the target's hidden states of those positions are not at hand, or
    /// the layer's cache is full).
    fn draft_for(&mut self, target: &mut Session, history: &[u32], k: usize) -> Result<Draft> {
        let (model, store, tcache) = (&target.model, &mut target.store, &mut target.cache);
        let Some(mtp) = model.mtp() else {
            return Ok(Draft::default());
        };
        let len = history.len().saturating_sub(1);
        if len == 0 || tcache.len != len || k == 0 {
            return Ok(Draft::default());
        }
        // entries whose tokens are still the sequence's
        let shared = self
            .cached
            .iter()
            .zip(history)
            .take_while(|(a, b)| a == b)
            .count();
        let keep = self.cache.truncate(shared.saturating_sub(1).min(len - 1));
        self.cached.truncate(keep + 1);
        let hid = &tcache.hidden;
        let (Some(_), Some(_)) = (hid.row(keep), hid.row(len - 1)) else {
            return Ok(Draft::default());
        };
        if len + k > self.cache.n_ctx {
            return Ok(Draft::default());
        }
        let w = hid.width;
        let i0 = (keep - hid.pos0) * w;
        let rows = hid.rows[i0..i0 + (len - keep) * w].to_vec();
        let out = match mtp.forward_mtp(
            store,
            &mut self.cache,
            &rows,
            &history[keep + 1..=len],
            Logits::Last,
        ) {
            Ok(o) => o,
            Err(e) => {
                self.reset();
                return Err(e);
            }
        };
        // the target's hidden rows stay (they are budgeted for the whole context): a request
        // that keeps only a prefix of the cache (the server's prefix reuse) may diverge before
        // the positions caught up on, and the entry there is rebuilt from the target's row
        self.cached = history.to_vec();
        let mut logits = out.logits;
        let mut h_last = out.hidden[out.hidden.len() - w..].to_vec();
        let mut h = history.to_vec();
        let mut d = Draft::for_sampler(&self.sampler, k);
        for i in 0..k {
            let t = pick(&mut self.sampler, &mut logits, &h, &mut d);
            d.tokens.push(t);
            h.push(t);
            if i + 1 < k {
                let o = mtp.forward_mtp(store, &mut self.cache, &h_last, &[t], Logits::Last);
                let o = match o {
                    Ok(o) => o,
                    Err(e) => {
                        self.reset();
                        return Err(e);
                    }
                };
                logits = o.logits;
                h_last = o.hidden;
            }
        }
        // chained entries came from the layer's own hidden states: not kept
        self.cache.truncate(len);
        Ok(d)
    }
}
