//! How many tokens speculative decoding drafts at each step ([`Policy`]): the length that
//! maximizes the expected tokens per unit of cost, or none (a plain pass) when no length is
//! expected to beat plain decoding, or when the acceptance has not been measured yet.
//!
//! The model (that of Leviathan et al. 2023, section 3.3, "Walltime improvement", with the
//! cost measured instead of assumed): each draft is accepted with probability `α`
//! (independently, given the ones before it were), so a verification of `k` drafts yields
//! `E(k) = 1 + α + … + α^k = (1 − α^(k+1)) / (1 − α)` tokens; it costs `c(k)` plain passes.
//! Verification pays when `E(k) / c(k) > 1`; the best `k` in `[draft_min, draft_max]` is
//! taken, and when even that does not pay the step is a plain pass.
//!
//! - `α` is a running (exponentially weighted) share of accepted drafts, from a prior of 1/2
//!   that weighs two observations. **Nothing is verified on the prior**: a verification needs
//!   [`MIN_EVIDENCE`] (decayed) observations of the source's acceptance. They come for (almost)
//!   nothing from *shadow drafts*: on a plain pass the source is asked for one token, which is
//!   compared with the token the plain pass chose ([`Policy::record_shadow`]). Greedy, a hit is
//!   exactly an accepted first draft; sampled, a one-hot draft `x` is accepted with probability
//!   `p(x)`, the probability that the plain pass samples `x` (for a sampled draft model the hit
//!   rate `Σ q·p` stands in for the acceptance `Σ min(p, q)`).
//! - Shadow drafts of a free source (prompt lookup) happen on every plain pass. A source that
//!   costs (a draft model's forward pass, the multi-token-prediction layer, whose experts may
//!   stream) shadow-drafts only within the *probe budget*: the extra cost of speculation (each
//!   verification's cost beyond the plain passes its tokens would have cost, which is negative
//!   when verification pays, plus every draft not verified) stays at most [`PROBE_SHARE`] of
//!   the cost of the generation so far, plus the first draft's cost (a shadow draft is made
//!   only when its running average cost fits, the first one at once: a
//!   multi-token-prediction layer's draft catches up on every position since its last one,
//!   so a late first draft costs more). So a source whose drafts are never accepted
//!   costs at most that share over plain decoding; a free one costs nothing (its drafts are
//!   never verified).
//! - `c(k)` is measured per draft length when passes are measured (bytes read when the model
//!   streams, seconds when it is resident and decoding is greedy): a running average of each
//!   verification's cost over the running cost of plain passes (the first step is then a
//!   plain pass, to measure it). A length not yet measured is estimated on the line from a
//!   plain pass through the longest measured length `j` below it (`1 + (c(j) − 1) k / j`: a
//!   streamed MoE target's rows each add their own experts' bytes, nearly a plain pass
//!   each, while a streamed dense target's rows add nothing), else through the shortest
//!   measured one above it, else as `1 + β₀ k`, `β₀`
//!   = [`BETA_PRIOR`] (on a streamed MoE without an expert cache, 0.9 of the routed experts'
//!   share of a plain pass's bytes, measured on the first: [`Policy::set_row_prior`]; a row
//!   reads its own experts, and wrong drafts route elsewhere): batched passes cost far from linearly in their rows (a resident pass of
//!   2 rows can cost 3 plain passes and one of 9 rows 4), so a length is judged by what it
//!   was measured to cost. A verification tries at most twice the longest length measured
//!   so far (the shortest allowed first), so a length's cost is learned from short probes up:
//!   a streamed model's verification can cost nearly a plain pass more per draft (the union
//!   of its rows' experts), far above the prior. Resident sampled decoding keeps the estimate `1 + β₀ k` and counts
//!   costs in plain passes (a draft not verified at [`SHADOW_PRIOR`]): its choices then depend
//!   on the tokens only, so seeded runs repeat.
//! - With an expert cache, a streamed target's verification is not priced by its bytes
//!   next to plain passes' (the cache warms during a generation and single passes spike, so
//!   the ratio can be off by a factor of ten either way): it is charged what plain decoding
//!   would have read for its tokens plus the bytes read for experts only rejected drafts
//!   used ([`Policy::record_verify_waste`]). In bytes it then pays only where the rows share
//!   streamed spine bytes; where the spine is resident nothing is verified
//!   ([`Policy::no_gain`]): plain decoding reads no more for the same tokens.
//! - A timed cost is not trusted forever: when the acceptance says a verification of the
//!   shortest length would pay at the prior cost but the measured time says it does not, it
//!   is tried again (a *re-probe*) whenever its expected loss fits in the probe budget
//!   ([`Policy::decide`]), so one timed pass that met a busy core cannot hold speculation
//!   off for the rest of a generation. Bytes are not re-probed: a verification reads what
//!   its rows route to, whatever else runs on the machine. Measured costs age by `DECAY` (0.85)
//!   with every plain pass too, so a re-probe after a long hold outweighs what was measured
//!   before it.

use super::spec_types::SpecConfig;

/// Weight of the past in the running averages, per observation.
const DECAY: f64 = 0.85;
/// `β₀`: what one more verification row is assumed to cost, in plain passes, until measured.
pub const BETA_PRIOR: f64 = 0.25;
/// Decayed observations of the acceptance (verified or shadow drafts) needed before a
/// verification: two in a row (1 + 0.85).
pub const MIN_EVIDENCE: f64 = 1.5;
/// The probe budget: speculation's extra cost stays at most this share of the generation's.
pub const PROBE_SHARE: f64 = 0.02;
/// What a draft not verified costs, in plain passes, when passes are not measured.
pub const SHADOW_PRIOR: f64 = 0.05;

/// What to do at one decode step ([`Policy::decide`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Drafts to verify; 0 for a plain pass.
    pub draft: usize,
    /// On a plain pass: ask the source for one shadow draft, judged by
    /// [`Policy::record_shadow`].
    pub shadow: bool,
    /// This decision ends a run of verifications because they no longer pay (a fallback).
    pub fallback: bool,
}

/// The draft length policy (see the module header).
#[derive(Clone, Debug)]
pub struct Policy {
    cfg: SpecConfig,
    /// Accepted drafts and drafts judged, exponentially weighted (prior included).
    acc: (f64, f64),
    /// Observations of the acceptance, exponentially weighted (prior excluded).
    seen: f64,
    /// Cost of a verification of `k` drafts in plain passes (weighted sum, weight), index `k`.
    ratio: Vec<(f64, f64)>,
    /// Running cost of a plain pass (weighted sum, weight), when measured.
    plain: (f64, f64),
    /// Running cost of a draft not verified (weighted sum, weight).
    shadow: (f64, f64),
    /// Cost of the generation so far (every pass and draft), in the cost's unit.
    spent: f64,
    /// Speculation's extra cost so far over plain decoding, in the cost's unit.
    extra: f64,
    /// Whether passes are measured (set by the caller at the first step).
    measured: bool,
    /// Whether the measured costs are wall-clock times (noisy: re-probed).
    timed: bool,
    /// Whether no verification can cost less than plain decoding ([`Policy::no_gain`]).
    no_gain: bool,
    /// What one more verification row is assumed to cost until measured, in plain passes
    /// ([`BETA_PRIOR`], or [`Policy::set_row_prior`]'s).
    beta: f64,
    /// Whether the last decision was a plain pass.
    holding: bool,
}

/// Expected tokens from a verification of `k` drafts accepted with probability `a` each.
fn expected(a: f64, k: usize) -> f64 {
    (0..=k).map(|i| a.powi(i as i32)).sum()
}

fn avg(x: (f64, f64)) -> Option<f64> {
    (x.1 > 0.0).then(|| x.0 / x.1)
}

impl Policy {
    /// A policy with the priors (`α` = 1/2, `c(k)` = `1 + β₀ k`), passes not measured.
    pub fn new(cfg: SpecConfig) -> Self {
        Self {
            ratio: vec![(0.0, 0.0); cfg.draft_max + 1],
            cfg,
            acc: (1.0, 2.0),
            seen: 0.0,
            plain: (0.0, 0.0),
            shadow: (0.0, 0.0),
            spent: 0.0,
            extra: 0.0,
            measured: false,
            timed: false,
            no_gain: false,
            beta: BETA_PRIOR,
            holding: true,
        }
    }

    /// Says that passes are measured: costs will come with every record.
    pub fn measure(&mut self) {
        self.measured = true;
    }

    /// Says that no verification can cost less than plain decoding for its tokens: every
    /// step is then a plain pass (a free source still shadow-drafts, so its acceptance is
    /// reported). For a streamed target with an expert cache whose spine is resident: there
    /// an accepted draft's experts are the misses its own plain pass would read, the experts
    /// its rows share would be cache hits, and a rejected draft's misses are extra reads.
    pub fn no_gain(&mut self) {
        self.no_gain = true;
    }

    /// Sets what one more verification row is assumed to cost until measured, in plain
    /// passes, when the target says better than [`BETA_PRIOR`]: a streamed MoE without an
    /// expert cache reads each row's own experts, nearly the routed share of a plain pass.
    pub fn set_row_prior(&mut self, beta: f64) {
        self.beta = beta.max(BETA_PRIOR);
    }

    /// Says that passes are measured in wall-clock time, which a busy core can inflate:
    /// dear measurements are re-probed ([`Policy::decide`]).
    pub fn measure_timed(&mut self) {
        self.measured = true;
        self.timed = true;
    }

    /// The running acceptance probability `α`.
    pub fn alpha(&self) -> f64 {
        self.acc.0 / self.acc.1
    }

    /// Speculation's extra cost so far over plain decoding, and the generation's cost so far
    /// (bytes, seconds, or plain passes when passes are not measured).
    pub fn budget(&self) -> (f64, f64) {
        (self.extra, self.spent)
    }

    /// The cost of a verification of `k` drafts in plain passes: measured, or estimated (see
    /// the module header).
    pub fn cost(&self, k: usize) -> f64 {
        let m = |j: usize| avg(self.ratio.get(j).copied().unwrap_or((0.0, 0.0)));
        if let Some(c) = m(k) {
            return c;
        }
        let below = (1..k).rev().find_map(|j| m(j).map(|c| (j, c)));
        match below.or_else(|| (k + 1..self.ratio.len()).find_map(|j| m(j).map(|c| (j, c)))) {
            Some((j, c)) => 1.0 + (c - 1.0).max(0.0) * k as f64 / j as f64,
            None => 1.0 + self.beta * k as f64,
        }
    }

    /// The best draft length and its expected tokens per unit of cost (0 when none pays).
    fn best(&self) -> (usize, f64) {
        let a = self.alpha().min(0.999);
        let lo = self.cfg.draft_min.max(1);
        (lo..=self.longest_eligible(lo))
            .map(|k| (k, expected(a, k) / self.cost(k)))
            .fold((0, 1.0), |b, x| if x.1 > b.1 { x } else { b })
    }

    /// The longest draft length a verification may try now: when passes are measured, at
    /// most twice the longest length measured so far (`lo`, the shortest allowed, before any),
    /// so a length's cost is learned from short, cheap probes up (a streamed model's
    /// verification can cost nearly one plain pass more per draft, far above the prior);
    /// `draft_max` otherwise.
    fn longest_eligible(&self, lo: usize) -> usize {
        let max = self.cfg.draft_max.max(lo);
        if !self.measured {
            return max;
        }
        let longest = (1..self.ratio.len()).rev().find(|&j| self.ratio[j].1 > 0.0);
        longest.map_or(lo, |j| (2 * j).max(lo)).min(max)
    }

    /// A verification of the shortest allowed length that the measured costs say does not
    /// pay, tried again (a *re-probe*) when the acceptance says it would pay at the prior cost
    /// (`E(lo) > 1 + β₀ lo`) and its expected loss (`(c(lo) − E(lo))` plain passes) fits in
    /// the probe budget. One slow measurement (a pass that met a busy core, the first pass of
    /// a batch shape) would otherwise hold speculation off for the rest of the generation;
    /// re-probes cost at most [`PROBE_SHARE`] of the generation, and each one spends part
    /// of it, so they grow rarer while verifications keep measuring dear.
    fn reprobe(&self) -> Option<usize> {
        if !self.timed || self.seen < MIN_EVIDENCE {
            return None;
        }
        let a = self.alpha().min(0.999);
        let lo = self.cfg.draft_min.max(1);
        let gain = expected(a, lo);
        if lo > self.cfg.draft_max || gain <= 1.0 + self.beta * lo as f64 {
            return None;
        }
        let loss = (self.cost(lo) - gain).max(0.0) * self.plain_cost();
        (self.extra + loss <= PROBE_SHARE * self.spent).then_some(lo)
    }

    /// A plain pass's cost in the cost's unit (1 when passes are not measured).
    fn plain_cost(&self) -> f64 {
        if self.measured {
            avg(self.plain).unwrap_or(0.0)
        } else {
            1.0
        }
    }

    /// What to do now. `free`: the source drafts at no cost (prompt lookup): it then
    /// shadow-drafts on every plain pass; other sources only within the probe budget.
    pub fn decide(&mut self, free: bool) -> Decision {
        if !self.cfg.adaptive {
            return Decision {
                draft: self.cfg.draft_max,
                shadow: false,
                fallback: false,
            };
        }
        if self.no_gain {
            return Decision {
                draft: 0,
                shadow: free,
                fallback: false,
            };
        }
        if self.measured && self.plain.1 == 0.0 {
            // the baseline first
            return Decision {
                draft: 0,
                shadow: free,
                fallback: false,
            };
        }
        let (k, _) = self.best();
        if k > 0 && self.seen >= MIN_EVIDENCE {
            self.holding = false;
            return Decision {
                draft: k,
                shadow: false,
                fallback: false,
            };
        }
        if let Some(k) = self.reprobe() {
            self.holding = false;
            return Decision {
                draft: k,
                shadow: false,
                fallback: false,
            };
        }
        let fallback = !self.holding;
        self.holding = true;
        // the first draft of a source not measured yet at once: a multi-token-prediction
        // layer catches up on every position since its last draft, so later is dearer
        let probe = avg(self.shadow).unwrap_or(0.0);
        Decision {
            draft: 0,
            shadow: free || self.extra + probe <= PROBE_SHARE * self.spent,
            fallback,
        }
    }

    /// Records a verification of `drafted` tokens with `accepted` accepted, which cost `cost`
    /// with its drafting (`None` when passes are not measured).
    pub fn record_verify(&mut self, drafted: usize, accepted: usize, cost: Option<f64>) {
        if !self.cfg.adaptive || drafted == 0 {
            return;
        }
        let judged = accepted + usize::from(accepted < drafted);
        let d = DECAY.powi(judged as i32);
        self.acc = (
            self.acc.0 * d + accepted as f64,
            self.acc.1 * d + judged as f64,
        );
        self.seen = self.seen * d + judged as f64;
        let p = self.plain_cost();
        let c = cost.unwrap_or_else(|| self.cost(drafted));
        self.spent += c;
        self.extra += c - (accepted + 1) as f64 * p;
        if let (Some(c), true) = (cost, p > 0.0) {
            if drafted < self.ratio.len() {
                let r = &mut self.ratio[drafted];
                *r = (r.0 * DECAY + c / p, r.1 * DECAY + 1.0);
            }
        }
    }

    /// Records a verification of `drafted` tokens with `accepted` accepted whose cost is
    /// charged as plain decoding's for its tokens (`accepted + 1` plain passes at the running
    /// plain cost) plus `waste`, in the cost's unit: for a streamed target with an expert
    /// cache, the bytes read for experts only rejected drafts used, less the streamed spine
    /// bytes the accepted rows shared (an accepted draft's own experts are misses its plain
    /// pass would read too, and experts its rows share would be cache hits for plain
    /// decoding). A measured plain pass must come first (the first step is one).
    pub fn record_verify_waste(&mut self, drafted: usize, accepted: usize, waste: f64) {
        let p = self.plain_cost();
        self.record_verify(drafted, accepted, Some((accepted + 1) as f64 * p + waste));
    }

    /// Records a plain pass that cost `cost` (`None` when passes are not measured).
    pub fn record_plain(&mut self, cost: Option<f64>) {
        if let Some(c) = cost {
            self.plain = (self.plain.0 * DECAY + c, self.plain.1 * DECAY + 1.0);
            // verification costs age with the passes after them: a re-probe after a long
            // hold replaces what was measured before it (down to a floor, never to nothing)
            for r in self.ratio.iter_mut().filter(|r| r.1 > 1e-6) {
                *r = (r.0 * DECAY, r.1 * DECAY);
            }
        }
        self.spent += cost.unwrap_or(1.0);
    }

    /// Records that a source that is not free drafted without a verification (a shadow
    /// draft, or a draft too short to verify), which cost `cost` (`None` when passes are not
    /// measured: [`SHADOW_PRIOR`] plain passes).
    pub fn record_draft_cost(&mut self, cost: Option<f64>) {
        if !self.cfg.adaptive {
            return;
        }
        let c = cost.unwrap_or(SHADOW_PRIOR * self.plain_cost());
        self.shadow = (self.shadow.0 * DECAY + c, self.shadow.1 * DECAY + 1.0);
        self.spent += c;
        self.extra += c;
    }

    /// Records a draft that was not verified: `hit` when its first token is the one the plain
    /// pass chose (see the module header for why that measures the acceptance).
    pub fn record_shadow(&mut self, hit: bool) {
        if self.cfg.adaptive {
            self.acc = (
                self.acc.0 * DECAY + f64::from(u8::from(hit)),
                self.acc.1 * DECAY + 1.0,
            );
            self.seen = self.seen * DECAY + 1.0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(max: usize, min: usize) -> SpecConfig {
        SpecConfig {
            draft_max: max,
            draft_min: min,
            adaptive: true,
        }
    }

    #[test]
    fn expected_tokens_follow_the_geometric_sum() {
        assert_eq!(expected(0.5, 0), 1.0);
        assert_eq!(expected(0.5, 2), 1.75);
        assert!((expected(0.9, 8) - (1.0 - 0.9f64.powi(9)) / 0.1).abs() < 1e-12);
    }

    fn d(draft: usize, shadow: bool, fallback: bool) -> Decision {
        Decision {
            draft,
            shadow,
            fallback,
        }
    }

    #[test]
    fn nothing_is_verified_before_acceptance_is_measured() {
        let mut p = Policy::new(cfg(8, 1));
        // the prior alone (α = 1/2, E(1)/c(1) = 1.2) would verify: it does not
        assert_eq!(p.decide(true), d(0, true, false));
        // a free source's shadow drafts are judged: one hit is not evidence enough, two are
        p.record_plain(None);
        p.record_shadow(true);
        assert_eq!(p.decide(true), d(0, true, false));
        p.record_plain(None);
        p.record_shadow(true);
        assert_eq!(p.decide(true), d(3, false, false), "α {}", p.alpha());
        // shadow drafts that always miss: never a verification, every plain pass shadowed
        let mut p = Policy::new(cfg(8, 1));
        for _ in 0..100 {
            assert_eq!(p.decide(true), d(0, true, false));
            p.record_plain(None);
            p.record_shadow(false);
        }
        assert_eq!(p.budget(), (0.0, 100.0), "no extra cost");
    }

    #[test]
    fn drafts_grow_with_acceptance_and_stop_when_rejected() {
        let mut p = Policy::new(cfg(8, 1));
        for _ in 0..6 {
            p.record_verify(4, 4, None);
        }
        assert!(p.alpha() > 0.9, "{}", p.alpha());
        assert_eq!(p.decide(true), d(8, false, false), "α {}", p.alpha());
        // every draft rejected: α falls below the break-even, a plain pass (one fallback)
        for _ in 0..12 {
            p.record_verify(1, 0, None);
        }
        assert!(p.alpha() < BETA_PRIOR, "{}", p.alpha());
        assert_eq!(p.decide(true), d(0, true, true));
        assert_eq!(p.decide(true), d(0, true, false), "still holding");
        // free drafts that would have been accepted bring verification back
        for _ in 0..8 {
            p.record_shadow(true);
        }
        assert!(p.decide(true).draft > 0);
    }

    #[test]
    fn sources_that_cost_shadow_draft_within_the_probe_budget() {
        // streamed: plain passes read 100 bytes, a shadow draft 10 (an MTP layer's experts)
        let mut p = Policy::new(cfg(4, 1));
        p.measure();
        assert_eq!(p.decide(false), d(0, false, false), "the baseline first");
        p.record_plain(Some(100.0));
        let mut shadows = 0;
        for _ in 0..1000 {
            let dec = p.decide(false);
            assert_eq!(dec.draft, 0, "never accepted: never verified");
            if dec.shadow {
                shadows += 1;
                p.record_draft_cost(Some(10.0));
                p.record_shadow(false);
            }
            p.record_plain(Some(100.0));
            let (extra, spent) = p.budget();
            assert!(extra <= PROBE_SHARE * spent + 10.0, "{extra} of {spent}");
        }
        // 2% of 1001 plain passes' bytes in shadow drafts of 10 bytes: 204 of them, give or take one
        assert_eq!(shadows, 204);
        let (extra, spent) = p.budget();
        assert_eq!((extra, spent), (2040.0, 102140.0));
        // unmeasured (resident, sampled): plain passes count 1, a shadow draft SHADOW_PRIOR
        let mut p = Policy::new(cfg(4, 1));
        let mut shadows = 0;
        for _ in 0..100 {
            if p.decide(false).shadow {
                shadows += 1;
                p.record_draft_cost(None);
                p.record_shadow(false);
            }
            p.record_plain(None);
            let (extra, spent) = p.budget();
            assert!(
                extra <= PROBE_SHARE * spent + SHADOW_PRIOR,
                "{extra} of {spent}"
            );
        }
        assert_eq!(shadows, 40, "2% of 102 plain-pass units in drafts of 0.05");
    }

    #[test]
    fn measured_lengths_grow_by_doubling_from_the_shortest() {
        let mut p = Policy::new(cfg(8, 1));
        p.measure();
        p.record_plain(Some(100.0));
        for _ in 0..20 {
            p.record_shadow(true);
        }
        // α ≈ 1 and the prior prices 8 drafts at 3 passes, but nothing is measured: 1 draft
        assert_eq!(p.decide(true), d(1, false, false));
        p.record_verify(1, 1, Some(110.0));
        assert_eq!(
            p.decide(true),
            d(2, false, false),
            "twice the longest measured"
        );
        p.record_verify(2, 2, Some(120.0));
        assert_eq!(p.decide(true), d(4, false, false));
        p.record_verify(4, 4, Some(140.0));
        assert_eq!(p.decide(true), d(8, false, false), "then draft_max");
        // not measured (resident sampled): the prior's best length at once
        let mut q = Policy::new(cfg(8, 1));
        for _ in 0..20 {
            q.record_shadow(true);
        }
        assert_eq!(q.decide(true), d(8, false, false));
    }

    #[test]
    fn a_dear_measurement_is_re_probed_within_the_probe_budget() {
        // resident, timed: plain passes take 1 s; the first verification met a busy core (3 s)
        let mut p = Policy::new(cfg(4, 1));
        p.measure_timed();
        p.record_plain(Some(1.0));
        for _ in 0..4 {
            p.record_shadow(true);
        }
        assert_eq!(p.decide(true), d(1, false, false));
        p.record_verify(1, 1, Some(3.0));
        // α ≈ 0.9: E(1) ≈ 1.9 tokens for 3 passes does not pay; the loss (1.1 passes) must
        // first fit in 2% of what was spent (1 + 3 s, then 1 s per plain pass)
        assert_eq!(p.decide(true), d(0, true, true));
        let mut plain = 0;
        while p.decide(true).draft == 0 {
            p.record_plain(Some(1.0));
            p.record_shadow(true);
            plain += 1;
        }
        // α → 0.999: 1 s extra + 1.0 s expected loss ≤ 2% of (4 + n) s from n = 97
        assert_eq!(plain, 97, "{:?}", p.budget());
        // the re-probe measures 1.2 s, which outweighs the old 3 s (aged by every plain pass
        // since): α stays high, verifying pays, and the next length is tried
        p.record_verify(1, 1, Some(1.2));
        assert_eq!(p.decide(true), d(2, false, false), "c(1) = {}", p.cost(1));
        // the same in bytes (a streamed target): what a verification reads is no accident of
        // the machine's load, so it is not re-probed
        let mut b = Policy::new(cfg(4, 1));
        b.measure();
        b.record_plain(Some(1.0));
        for _ in 0..4 {
            b.record_shadow(true);
        }
        b.record_verify(1, 1, Some(3.0));
        for _ in 0..1000 {
            assert_eq!(b.decide(true).draft, 0);
            b.record_plain(Some(1.0));
            b.record_shadow(true);
        }
        // drafts never accepted: no re-probe, however long the generation
        let mut q = Policy::new(cfg(4, 1));
        q.measure_timed();
        q.record_plain(Some(1.0));
        q.record_shadow(true);
        q.record_shadow(true);
        q.record_verify(1, 0, Some(3.0));
        for _ in 0..1000 {
            assert_eq!(q.decide(true).draft, 0);
            q.record_plain(Some(1.0));
            q.record_shadow(false);
        }
    }

    #[test]
    fn a_row_prior_from_the_target_prices_unmeasured_rows() {
        // a streamed MoE without a cache: a row reads 0.85 of a pass until measured
        let mut p = Policy::new(cfg(4, 1));
        p.measure();
        p.set_row_prior(0.85);
        assert_eq!(p.cost(1), 1.85);
        p.record_plain(Some(100.0));
        p.record_shadow(true);
        p.record_shadow(true);
        // α ≈ 0.78: E(1) ≈ 1.78 < 1.85, so no probe (at 0.25 a row it would verify)
        assert!(p.alpha() > 0.7 && p.alpha() < 0.85, "{}", p.alpha());
        assert_eq!(p.decide(true), d(0, true, false));
        // never below the default prior
        p.set_row_prior(0.1);
        assert_eq!(p.cost(1), 1.0 + BETA_PRIOR);
        assert_eq!(p.decide(true), d(1, false, false));
    }

    #[test]
    fn measured_costs_set_the_length() {
        let mut p = Policy::new(cfg(6, 2));
        p.measure();
        // streamed dense model: a verification reads what a plain pass reads
        p.record_plain(Some(100.0));
        p.record_verify(2, 1, Some(100.0));
        assert_eq!(p.cost(2), 1.0);
        assert_eq!(p.cost(5), 1.0, "on the line through c(2): rows add nothing");
        assert_eq!(p.cost(1), 1.0, "on the line from a plain pass to c(2)");
        assert_eq!(p.budget(), (-100.0, 200.0), "2 tokens for the bytes of one");
        // streamed MoE without a cache: each row reads its own experts, c(1) = 1.875 plain
        // passes; longer lengths are priced on the line through it, not at c(1) + β₀ per row
        let mut p = Policy::new(cfg(6, 1));
        p.measure();
        p.record_plain(Some(100.0));
        p.record_verify(1, 0, Some(187.5));
        assert_eq!(p.cost(2), 2.75);
        assert_eq!(p.cost(4), 4.5);
        // streamed MoE: c(4) = 3 plain passes; c(2) interpolated at 2
        let mut p = Policy::new(cfg(6, 2));
        p.measure();
        p.record_plain(Some(100.0));
        p.record_verify(4, 0, Some(300.0));
        assert_eq!(p.cost(2), 2.0);
        assert_eq!(p.budget(), (200.0, 400.0));
        // resident: 2 drafts cost 3 plain passes, 6 drafts 4; α = 1/2
        let mut p = Policy::new(cfg(6, 2));
        p.measure();
        p.record_plain(Some(1.0));
        for _ in 0..30 {
            p.record_verify(2, 1, Some(3.0));
            p.record_verify(6, 1, Some(4.0));
        }
        assert!((p.cost(2) - 3.0).abs() < 1e-9 && (p.cost(6) - 4.0).abs() < 1e-9);
        assert!((p.alpha() - 0.5).abs() < 0.01, "{}", p.alpha());
        // (no verification was decided here, so this is not a fallback)
        assert_eq!(
            p.decide(false),
            d(0, false, false),
            "E(6) ≈ 2 tokens for 4 passes; the verifications lost more than the probe budget"
        );
        // the same costs with α ≈ 0.95: the long draft pays (E(6) ≈ 6.3 for 4 passes)
        for _ in 0..60 {
            p.record_shadow(true);
        }
        assert_eq!(p.decide(true), d(6, false, false));
        // --draft-fixed: always draft_max
        let mut f = Policy::new(SpecConfig {
            adaptive: false,
            ..cfg(5, 1)
        });
        f.record_verify(5, 0, Some(9.0));
        assert_eq!(f.decide(false), d(5, false, false));
    }
}
