//! Speculative decoding: a [`DraftSource`] proposes `k` tokens, the target model verifies the
//! last accepted token plus the drafts in ONE forward pass ([`verify`]: each layer routes all
//! `k + 1` rows and the expert store reads the union of their experts once), and the KV cache
//! is rolled back past the rejected drafts ([`crate::models::KvCache::truncate`]).
//!
//! Acceptance:
//! - greedy (temperature 0): the longest prefix of drafts equal to the target's argmax (after
//!   the same penalties as plain decoding), then the target's own next token, so the output is
//!   the one plain decoding gives, token for token;
//! - sampled: the rule of Leviathan et al. 2023 ("Fast inference from transformers via
//!   speculative decoding", Algorithm 1) and Chen et al. 2023 ("Accelerating large language
//!   model decoding with speculative sampling", Algorithm 2): draft `x` drawn from `q` is
//!   accepted with probability `min(1, p(x) / q(x))`, `p` being the target's distribution after
//!   the sampler's penalties, filters and temperature; on rejection the token is drawn from
//!   `norm(max(0, p − q))`; after `k` acceptances one more from `p`. The output then follows
//!   `p` exactly. A deterministic draft (prompt lookup) has `q` one-hot: `x` is accepted with
//!   probability `p(x)`, else drawn from `p` without `x`. Every random number comes from the
//!   target sampler's seeded PRNG, so a seeded run repeats.
//!
//! [`Speculator`] runs one decode step at a time, choosing the draft length from measured
//! acceptance and cost, or a plain pass when verification is not expected to pay or the
//! acceptance is not measured yet; on plain passes the source shadow-drafts one token (free
//! sources always, others within a probe budget) to measure its acceptance
//! ([`Policy`], `spec_policy.rs`).

use anyhow::Result;

use super::draft::{Draft, DraftSource};
use super::sampler::Sampler;
use super::session::Session;
pub use super::spec_types::{check_rollback, SpecConfig, SpecStats};
use crate::models::Logits;

/// The outcome of one verification pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// How many drafts were accepted (a prefix of them).
    pub accepted: usize,
    /// The target's own token after the accepted drafts (a correction, or a bonus token when
    /// every draft was accepted).
    pub next: u32,
    /// Bytes the pass read for experts only rejected drafts used
    /// ([`crate::store::experts::ExpertStore::end_drafts`]; 0 without an expert store).
    pub wasted_bytes: u64,
}

/// The probability of `id` in a sparse distribution (0 when absent).
fn prob(d: &[(u32, f64)], id: u32) -> f64 {
    d.iter().find(|e| e.0 == id).map_or(0.0, |e| e.1)
}

/// `norm(max(0, p − q))` over `p`'s support, `q` being `Some` distribution or one-hot on `x`
/// (`None`); `p` itself when nothing is left (p ≤ q everywhere, which acceptance makes
/// unreachable up to rounding).
pub fn residual(p: &[(u32, f64)], q: Option<&[(u32, f64)]>, x: u32) -> Vec<(u32, f64)> {
    let qv = |id: u32| match q {
        Some(q) => prob(q, id),
        None => f64::from(u8::from(id == x)),
    };
    let mut r: Vec<(u32, f64)> = p
        .iter()
        .map(|&(id, pi)| (id, (pi - qv(id)).max(0.0)))
        .filter(|e| e.1 > 0.0)
        .collect();
    let s: f64 = r.iter().map(|e| e.1).sum();
    if s <= 0.0 {
        return p.to_vec();
    }
    r.iter_mut().for_each(|e| e.1 /= s);
    r
}

/// One acceptance decision on the target's logits `row` for draft `x` (with draft
/// distribution `q`, `None` for one-hot), given the sequence so far `h`: `Ok(())` to accept,
/// `Err(token)` with the target's token instead. Greedy samplers compare with the argmax;
/// others follow the accept/reject rule of the module header.
pub fn accept_or_replace(
    sampler: &mut Sampler,
    row: &mut [f32],
    h: &[u32],
    x: u32,
    q: Option<&[(u32, f64)]>,
) -> std::result::Result<(), u32> {
    if sampler.config.temperature <= 0.0 {
        let t = sampler.sample(row, h);
        return if t == x { Ok(()) } else { Err(t) };
    }
    sampler.penalize(row, h);
    let p = sampler.distribution(row);
    let px = prob(&p, x);
    let qx = q.map_or(1.0, |q| prob(q, x));
    let u = sampler.uniform();
    if qx > 0.0 && u < px / qx {
        return Ok(());
    }
    Err(sampler.draw(&residual(&p, q, x)))
}

/// Verifies `draft` after `history` (whose last token is not yet in the cache) in one forward
/// pass of `1 + k` rows over the target, accepts a prefix of the drafts and draws the target's
/// next token, then rolls the cache back to hold `history` and the accepted drafts.
///
/// Errors: the forward pass failed (the cache is then left as the failed pass left it; the
/// generation ends there).
pub fn verify(
    s: &mut Session,
    sampler: &mut Sampler,
    history: &[u32],
    draft: &Draft,
) -> Result<Verdict> {
    verify_rows(s, sampler, history, draft).map(|r| r.0)
}

/// [`verify`], also returning the target's logits of the pass as they came out of the model
/// (before penalties): `(accepted + 1) × vocab` floats, row `i` being the distribution the
/// `i`-th yielded token was chosen from (the accepted drafts, then the target's own token).
/// These are exactly the logits plain decoding computes for those positions.
///
/// Errors: as [`verify`].
pub fn verify_rows(
    s: &mut Session,
    sampler: &mut Sampler,
    history: &[u32],
    draft: &Draft,
) -> Result<(Verdict, Vec<f32>)> {
    let last = *history.last().expect("a token to continue from");
    let base = s.cache.len;
    let mut batch = Vec::with_capacity(draft.tokens.len() + 1);
    batch.push(last);
    batch.extend_from_slice(&draft.tokens);
    // row 0 is the token plain decoding would run; the drafts' own experts stay tentative in
    // the expert store until the verdict (store/experts/speculative.rs). A pass refused
    // before any read does not reset the store, so a failure ends the drafts here.
    if let Some(es) = s.store.experts_mut() {
        es.begin_drafts(1);
    }
    // in the model's numerics: under q8 a row's values are the same in this batch and in
    // a plain single-token step (kernels::matvec_q8), so greedy output equals plain decoding
    let all = s
        .model
        .forward(&mut s.store, &mut s.cache, &batch, Logits::All);
    let all = match all {
        Ok(all) => all,
        Err(e) => {
            if let Some(es) = s.store.experts_mut() {
                es.end_drafts(0);
            }
            return Err(e);
        }
    };
    let v = s.model.vocab_size();
    let mut h = history.to_vec();
    let mut accepted = 0;
    let mut next = None;
    for (i, &x) in draft.tokens.iter().enumerate() {
        let mut row = all[i * v..(i + 1) * v].to_vec();
        let q = draft.q.as_ref().map(|q| q[i].as_slice());
        match accept_or_replace(sampler, &mut row, &h, x, q) {
            Ok(()) => {
                accepted += 1;
                h.push(x);
            }
            Err(t) => {
                next = Some(t);
                break;
            }
        }
    }
    let next = match next {
        Some(t) => t,
        None => {
            let k = draft.tokens.len();
            let mut row = all[k * v..(k + 1) * v].to_vec();
            sampler.sample(&mut row, &h)
        }
    };
    s.cache.truncate(base + 1 + accepted);
    let wasted_bytes = s
        .store
        .experts_mut()
        .map_or(0, |es| es.end_drafts(1 + accepted));
    let mut all = all;
    all.truncate((accepted + 1) * v);
    Ok((
        Verdict {
            accepted,
            next,
            wasted_bytes,
        },
        all,
    ))
}

pub use super::spec_policy::Policy;

/// Speculative decoding over a draft source: one [`Speculator::step`] per decode step.
pub struct Speculator {
    /// Where drafts come from.
    pub source: Box<dyn DraftSource>,
    /// The draft length and fallback policy.
    pub policy: Policy,
    /// Settings.
    pub config: SpecConfig,
    /// Counters of the current generation.
    pub stats: SpecStats,
    /// What the policy compares, chosen at the first step.
    cost: Option<Cost>,
    /// Whether the target has an expert store with a cache (set with `cost`).
    cached: bool,
}

/// What [`Policy`] compares per token between verification and plain passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cost {
    /// Bytes read from disk: the target streams weights or experts.
    Bytes,
    /// Wall-clock seconds: every weight is resident and decoding is greedy, so the policy's
    /// choices (which follow the machine's speed) cannot change the output.
    Seconds,
    /// Nothing: resident and sampled. Seeded runs must repeat, and the policy's choices
    /// decide which random numbers are drawn, so only the acceptance-based draft length adapts.
    None,
}

impl Cost {
    /// The cost measure for `s` decoding with `sampler`.
    pub fn of(s: &Session, sampler: &Sampler) -> Self {
        let streams = s.model.placement().streamed_bytes > 0 || s.store.experts().is_some();
        if streams {
            Cost::Bytes
        } else if sampler.config.temperature <= 0.0 {
            Cost::Seconds
        } else {
            Cost::None
        }
    }
}

/// On a streamed MoE without an expert cache, the share of a plain pass's routed-expert
/// bytes one more verification row is assumed to read until measured (the rest: experts it
/// shares with the other rows; measured 12% on a random-weight Qwen3-MoE shape with wrong
/// drafts, BENCHMARKS.md "Speculation, session 12").
const ROW_PRIOR_SHARE: f64 = 0.9;

impl Speculator {
    /// Speculation from `source` with `config`.
    pub fn new(source: Box<dyn DraftSource>, config: SpecConfig) -> Self {
        let stats = SpecStats {
            source: source.name().to_string(),
            ..Default::default()
        };
        Self {
            source,
            policy: Policy::new(config.clone()),
            config,
            stats,
            cost: None,
            cached: false,
        }
    }

    /// One decode step after `history` (whose last token is not yet in the target's cache,
    /// which must have room for it), yielding at most `left` (≥ 1) tokens: a verification pass
    /// when the policy asks for drafts and the source gives at least `draft_min`, else a plain
    /// pass. Returns the new tokens (accepted drafts, then the target's own).
    ///
    /// Errors: a forward pass of the target or the draft model failed.
    pub fn step(
        &mut self,
        s: &mut Session,
        sampler: &mut Sampler,
        history: &[u32],
        left: usize,
    ) -> Result<Vec<u32>> {
        self.step_rows(s, sampler, history, left, false)
            .map(|r| r.0)
    }

    /// Starts a new generation sampled with `sampling`: zeroes the counters (but
    /// [`SpecStats::draft_bytes`]), forgets what the
    /// policy measured (so a request's output depends on the request only, whatever ran
    /// before it) and lets the draft source follow `sampling` ([`DraftSource::configure`]).
    pub fn begin(&mut self, sampling: &super::sampler::SamplerConfig) {
        self.stats = SpecStats {
            source: self.source.name().to_string(),
            draft_bytes: self.stats.draft_bytes,
            ..Default::default()
        };
        self.policy = Policy::new(self.config.clone());
        self.cost = None;
        self.source.configure(sampling);
    }

    /// [`Speculator::step`], also returning, when `rows` is set, the target's logits for each
    /// yielded token as the model produced them (before penalties; `tokens × vocab` floats,
    /// from the verification pass or the plain pass: the target's own logits, equal to plain
    /// decoding's), else an empty vector.
    ///
    /// Errors: as [`Speculator::step`].
    pub fn step_rows(
        &mut self,
        s: &mut Session,
        sampler: &mut Sampler,
        history: &[u32],
        left: usize,
        rows: bool,
    ) -> Result<(Vec<u32>, Vec<f32>)> {
        let bytes = |s: &Session| s.store.stats().snapshot().0;
        let b0 = bytes(s);
        let t0 = std::time::Instant::now();
        if self.cost.is_none() {
            let kind = Cost::of(s, sampler);
            match kind {
                Cost::Bytes => self.policy.measure(),
                Cost::Seconds => self.policy.measure_timed(),
                Cost::None => {}
            }
            // bytes with an expert cache and a resident spine: verification cannot read less
            // than plain decoding (see `Policy::no_gain`)
            self.cached = s.store.experts().is_some_and(|e| e.cache().budget() > 0);
            if kind == Cost::Bytes && self.cached && s.model.placement().spine_streamed_bytes == 0 {
                self.policy.no_gain();
            }
            self.cost = Some(kind);
        }
        let kind = self.cost.expect("set");
        let cost = |b: u64, t: std::time::Instant| match kind {
            Cost::Bytes => Some(b as f64),
            Cost::Seconds => Some(t.elapsed().as_secs_f64()),
            Cost::None => None,
        };
        let room = s.cache.n_ctx - s.cache.len - 1;
        let free = self.source.free();
        let dec = self.policy.decide(free);
        if dec.fallback {
            self.stats.fallbacks += 1;
        }
        let k = dec.draft.min(room).min(left.saturating_sub(1));
        let min = self.config.draft_min.max(1);
        // a draft not verified, whose first token is judged against the plain pass's
        let mut shadow = None;
        if k >= min || (dec.draft == 0 && dec.shadow && room > 0 && left > 1) {
            let n = if k >= min { k } else { 1 };
            let mut d = self.source.draft_for(s, history, n)?;
            d.tokens.truncate(n);
            if let Some(q) = d.q.as_mut() {
                q.truncate(n);
            }
            if k >= min && d.tokens.len() >= min {
                let (v, all) = verify_rows(s, sampler, history, &d)?;
                let b = bytes(s) - b0;
                let st = &mut self.stats;
                st.drafted += d.tokens.len() as u64;
                st.accepted += v.accepted as u64;
                st.verify_passes += 1;
                st.verify_tokens += v.accepted as u64 + 1;
                st.verify_bytes += b;
                // with an expert cache a verification's bytes next to plain passes' say
                // little (the cache warms, passes spike): charge what it wasted instead
                if kind == Cost::Bytes && self.cached {
                    let shared =
                        v.accepted as u64 * s.model.placement().spine_streamed_bytes as u64;
                    self.policy.record_verify_waste(
                        d.tokens.len(),
                        v.accepted,
                        v.wasted_bytes as f64 - shared as f64,
                    );
                } else {
                    self.policy
                        .record_verify(d.tokens.len(), v.accepted, cost(b, t0));
                }
                let mut out = d.tokens[..v.accepted].to_vec();
                out.push(v.next);
                return Ok((out, if rows { all } else { Vec::new() }));
            }
            let b = bytes(s) - b0;
            self.stats.shadow_drafts += 1;
            self.stats.shadow_bytes += b;
            if !free {
                self.policy.record_draft_cost(cost(b, t0));
            }
            shadow = d.tokens.first().copied();
        }
        let (b1, t1) = (bytes(s), std::time::Instant::now());
        // expert bytes before the first plain pass (for the row prior below)
        let experts = |s: &Session| s.store.experts().map(|e| e.counters().bytes);
        let first = self.stats.plain_passes == 0 && kind == Cost::Bytes && !self.cached;
        let e1 = if first { experts(s) } else { None };
        let last = *history.last().expect("a token to continue from");
        let mut l = s
            .model
            .forward(&mut s.store, &mut s.cache, &[last], Logits::Last)?;
        let raw = if rows { l.clone() } else { Vec::new() };
        let t = sampler.sample(&mut l, history);
        let b = bytes(s) - b1;
        if let (Some(a), true) = (e1, b > 0) {
            // a streamed MoE without an expert cache: an extra row costs about the routed
            // experts' share of a pass (less what rows share, unknown until measured)
            let z = experts(s).unwrap_or(a);
            self.policy
                .set_row_prior(ROW_PRIOR_SHARE * (z - a) as f64 / b as f64);
        }
        self.stats.plain_passes += 1;
        self.stats.plain_bytes += b;
        self.policy.record_plain(cost(b, t1));
        if let Some(x) = shadow {
            self.policy.record_shadow(x == t);
        }
        Ok((vec![t], raw))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn residual_removes_the_draft_mass() {
        let p = [(3, 0.5), (1, 0.3), (2, 0.2)];
        // one-hot q on 3: p without 3, renormalized
        let r = residual(&p, None, 3);
        assert_eq!(r.len(), 2);
        assert!((r[0].1 - 0.6).abs() < 1e-12 && r[0].0 == 1);
        assert!((r[1].1 - 0.4).abs() < 1e-12 && r[1].0 == 2);
        // q = (3: 0.2, 1: 0.5, 7: 0.3): max(0, p - q) = (3: 0.3, 1: 0, 2: 0.2)
        let q = [(1, 0.5), (7, 0.3), (3, 0.2)];
        let r = residual(&p, Some(&q), 1);
        assert_eq!(r.iter().map(|e| e.0).collect::<Vec<_>>(), vec![3, 2]);
        assert!((r[0].1 - 0.6).abs() < 1e-12 && (r[1].1 - 0.4).abs() < 1e-12);
        // p == q: nothing left, p itself
        assert_eq!(residual(&p, Some(&p), 3), p.to_vec());
    }
}
