//! How many tokens speculative decoding drafts at each step ([`Policy`]): the length that
//! maximizes the expected tokens per unit of cost, or none (a plain pass) when no length is
//! expected to beat plain decoding.
//!
//! The model (that of Leviathan et al. 2023, section 3.3, "Walltime improvement", with the
//! cost measured instead of assumed): each draft is accepted with probability `α`
//! (independently, given the ones before it were), so a verification of `k` drafts yields
//! `E(k) = 1 + α + … + α^k = (1 − α^(k+1)) / (1 − α)` tokens; it costs `c(k)` plain passes.
//! Verification pays when `E(k) / c(k) > 1`; the best `k` in `[draft_min, draft_max]` is
//! taken, and when even that does not pay the step is a plain pass.
//!
//! - `α` is a running (exponentially weighted) share of accepted drafts, starting at 1/2. While
//!   the policy chooses plain passes it keeps learning from drafts it did not verify: a
//!   source that drafts for free (prompt lookup) is asked for one token, which is compared
//!   with the token the plain pass chose ([`Policy::record_shadow`]); other sources get one
//!   verification of `draft_min` drafts after [`EXPLORE_AFTER`] plain decisions in a row.
//! - `c(k)` is measured per draft length when passes are measured (bytes read when the model
//!   streams, seconds when it is resident and decoding is greedy): a running average of each
//!   verification's cost over the running cost of plain passes (the first step is then a
//!   plain pass, to measure it). A length not yet measured is estimated from the longest
//!   measured length `j` below it as `c(j) + β₀ (k − j)`, else as `1 + β₀ k`, `β₀` =
//!   [`BETA_PRIOR`]: batched passes cost far from linearly in their rows (a resident pass of
//!   2 rows can cost 3 plain passes and one of 9 rows 4), so a length is judged by what it
//!   was measured to cost. Resident sampled decoding keeps the estimate `1 + β₀ k`: its
//!   choices then depend on the tokens only, so seeded runs repeat.
//!
//! With the priors the first drafts are short (one token with the defaults); the length grows
//! with acceptance.

use super::spec_types::SpecConfig;

/// Weight of the past in the running averages, per observation.
const DECAY: f64 = 0.85;
/// `β₀`: what one more verification row is assumed to cost, in plain passes, until measured.
pub const BETA_PRIOR: f64 = 0.25;
/// Plain decisions in a row after which a source that is not free gets one verification.
pub const EXPLORE_AFTER: usize = 16;

/// The draft length policy (see the module header).
#[derive(Clone, Debug)]
pub struct Policy {
    cfg: SpecConfig,
    /// Accepted drafts and drafts judged, exponentially weighted.
    acc: (f64, f64),
    /// Cost of a verification of `k` drafts in plain passes (weighted sum, weight), index `k`.
    ratio: Vec<(f64, f64)>,
    /// Running cost of a plain pass (weighted sum, weight), when measured.
    plain: (f64, f64),
    /// Whether passes are measured (set by the caller at the first step).
    measured: bool,
    /// Plain decisions in a row.
    idle: usize,
    /// Whether the last decision was a plain pass because verification did not pay.
    holding: bool,
}

/// Expected tokens from a verification of `k` drafts accepted with probability `a` each.
fn expected(a: f64, k: usize) -> f64 {
    (0..=k).map(|i| a.powi(i as i32)).sum()
}

impl Policy {
    /// A policy with the priors (`α` = 1/2, `c(k)` = `1 + β₀ k`), passes not measured.
    pub fn new(cfg: SpecConfig) -> Self {
        Self {
            ratio: vec![(0.0, 0.0); cfg.draft_max + 1],
            cfg,
            acc: (1.0, 2.0),
            plain: (0.0, 0.0),
            measured: false,
            idle: 0,
            holding: false,
        }
    }

    /// Says that passes are measured: costs will come with every record.
    pub fn measure(&mut self) {
        self.measured = true;
    }

    /// The running acceptance probability `α`.
    pub fn alpha(&self) -> f64 {
        self.acc.0 / self.acc.1
    }

    /// The cost of a verification of `k` drafts in plain passes: measured, or estimated (see
    /// the module header).
    pub fn cost(&self, k: usize) -> f64 {
        let m = |j: usize| {
            let (s, w) = self.ratio.get(j).copied().unwrap_or((0.0, 0.0));
            (w > 0.0).then(|| s / w)
        };
        if let Some(c) = m(k) {
            return c;
        }
        match (1..k).rev().find_map(|j| m(j).map(|c| (j, c))) {
            Some((j, c)) => c + BETA_PRIOR * (k - j) as f64,
            None => 1.0 + BETA_PRIOR * k as f64,
        }
    }

    /// The best draft length and its expected tokens per unit of cost (0 when none pays).
    fn best(&self) -> (usize, f64) {
        let a = self.alpha().min(0.999);
        let lo = self.cfg.draft_min.max(1);
        (lo..=self.cfg.draft_max.max(lo))
            .map(|k| (k, expected(a, k) / self.cost(k)))
            .fold((0, 1.0), |b, x| if x.1 > b.1 { x } else { b })
    }

    /// Drafts to ask for now; 0 for a plain pass. `free`: the source drafts at no cost (it is
    /// then asked anyway and judged by [`Policy::record_shadow`], so it never needs an
    /// exploring verification). Returns `(k, switched)`, `switched` when this decision starts
    /// a run of plain passes because verification does not pay (a fallback).
    pub fn decide(&mut self, free: bool) -> (usize, bool) {
        if !self.cfg.adaptive {
            return (self.cfg.draft_max, false);
        }
        if self.measured && self.plain.1 == 0.0 {
            // the baseline first
            return (0, false);
        }
        let (k, _) = self.best();
        if k > 0 {
            self.idle = 0;
            self.holding = false;
            return (k, false);
        }
        self.idle += 1;
        if !free && self.idle > EXPLORE_AFTER {
            self.idle = 0;
            return (self.cfg.draft_min.max(1), false);
        }
        let switched = !self.holding;
        self.holding = true;
        (0, switched)
    }

    /// Records a verification of `drafted` tokens with `accepted` accepted, which cost `cost`
    /// (`None` when passes are not measured).
    pub fn record_verify(&mut self, drafted: usize, accepted: usize, cost: Option<f64>) {
        if !self.cfg.adaptive || drafted == 0 {
            return;
        }
        let judged = accepted + usize::from(accepted < drafted);
        self.acc = (
            self.acc.0 * DECAY.powi(judged as i32) + accepted as f64,
            self.acc.1 * DECAY.powi(judged as i32) + judged as f64,
        );
        if let (Some(c), true) = (cost, self.plain.1 > 0.0) {
            let p = self.plain.0 / self.plain.1;
            if p > 0.0 && drafted < self.ratio.len() {
                let r = &mut self.ratio[drafted];
                *r = (r.0 * DECAY + c / p, r.1 * DECAY + 1.0);
            }
        }
    }

    /// Records a plain pass that cost `cost` (`None` when passes are not measured).
    pub fn record_plain(&mut self, cost: Option<f64>) {
        if let Some(c) = cost {
            self.plain = (self.plain.0 * DECAY + c, self.plain.1 * DECAY + 1.0);
        }
    }

    /// Records a draft that was not verified: `hit` when its first token is the one the plain
    /// pass chose. Greedy, that is exactly whether it would have been accepted; sampled, a
    /// one-hot draft `x` is accepted with probability `p(x)`, the probability that the plain
    /// pass samples `x`, so the event has the acceptance's probability.
    pub fn record_shadow(&mut self, hit: bool) {
        if self.cfg.adaptive {
            self.acc = (
                self.acc.0 * DECAY + f64::from(u8::from(hit)),
                self.acc.1 * DECAY + 1.0,
            );
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

    #[test]
    fn drafts_start_short_grow_with_acceptance_and_stop_when_rejected() {
        let mut p = Policy::new(cfg(8, 1));
        // priors: E(1)/c(1) = 1.5 / 1.25 = 1.2 beats E(2)/c(2) = 1.75 / 1.5
        assert_eq!(p.decide(true), (1, false));
        for _ in 0..6 {
            p.record_verify(4, 4, None);
        }
        assert!(p.alpha() > 0.9, "{}", p.alpha());
        assert_eq!(p.decide(true), (8, false), "α {}", p.alpha());
        // every draft rejected: α falls below the break-even, a plain pass (one fallback)
        for _ in 0..12 {
            p.record_verify(1, 0, None);
        }
        assert!(p.alpha() < BETA_PRIOR, "{}", p.alpha());
        assert_eq!(p.decide(true), (0, true));
        assert_eq!(
            p.decide(true),
            (0, false),
            "still holding: not a new fallback"
        );
        // free drafts that would have been accepted bring verification back
        for _ in 0..8 {
            p.record_shadow(true);
        }
        assert!(p.decide(true).0 > 0);
    }

    #[test]
    fn measured_costs_set_the_length_and_sources_that_cost_explore() {
        let mut p = Policy::new(cfg(6, 2));
        p.measure();
        assert_eq!(
            p.decide(true),
            (0, false),
            "a plain pass first, to measure it"
        );
        // streamed dense model: a verification reads what a plain pass reads
        p.record_plain(Some(100.0));
        p.record_verify(2, 1, Some(100.0));
        assert_eq!(p.cost(2), 1.0);
        assert_eq!(p.cost(5), 1.75, "c(2) + 3 β₀");
        assert_eq!(p.cost(1), 1.25, "no shorter measurement: the prior");
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
        assert_eq!(p.decide(false), (0, true), "E(6) ≈ 2 tokens for 4 passes");
        for _ in 1..EXPLORE_AFTER {
            assert_eq!(p.decide(false).0, 0);
        }
        assert_eq!(p.decide(false), (2, false), "one exploring verification");
        assert_eq!(p.decide(false), (0, false), "still holding");
        // the same costs with α ≈ 0.95: the long draft pays (E(6) ≈ 6.3 for 4 passes)
        for _ in 0..60 {
            p.record_shadow(true);
        }
        assert_eq!(p.decide(true), (6, false));
        // --draft-fixed: always draft_max
        let mut f = Policy::new(SpecConfig {
            adaptive: false,
            ..cfg(5, 1)
        });
        f.record_verify(5, 0, Some(9.0));
        assert_eq!(f.decide(false), (5, false));
    }
}
