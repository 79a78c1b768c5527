//! How many tokens speculative decoding drafts at each step ([`Policy`]): the length that
//! maximizes the expected tokens per unit of cost, or none (a plain pass) when no length is
//! expected to beat plain decoding.
//!
//! The model (that of Leviathan et al. 2023, section 3.3, "Walltime improvement", with the
//! per-row cost measured instead of assumed): each draft is accepted with probability `α`
//! (independently, given the ones before it were), so a verification of `k` drafts yields
//! `E(k) = 1 + α + … + α^k = (1 − α^(k+1)) / (1 − α)` tokens; it costs `c(k) = 1 + β·k` plain
//! passes. Verification pays when `E(k) / c(k) > 1`; the best `k` in
//! `[draft_min, draft_max]` is taken, and when even that does not pay the step is a plain pass.
//!
//! - `α` is a running (exponentially weighted) share of accepted drafts, starting at 1/2. While
//!   the policy chooses plain passes it keeps learning from drafts it did not verify: a
//!   source that drafts for free (prompt lookup) is asked for one token, which is compared
//!   with the token the plain pass chose ([`Policy::record_shadow`]); other sources get one
//!   verification of `draft_min` drafts after [`EXPLORE_AFTER`] plain decisions in a row.
//! - `β` starts at [`BETA_PRIOR`] and, when passes are measured (bytes read when the model
//!   streams, seconds when it is resident and decoding is greedy), follows
//!   `(cost(verify k) / cost(plain) − 1) / k` from each verification against the running
//!   cost of plain passes. Resident sampled decoding keeps the prior: its choices then depend
//!   on the tokens only, so seeded runs repeat.
//!
//! A policy starts at `E(k) / c(k)` of the priors, which makes its first drafts short (one
//! token with the defaults) and lets the length grow with acceptance.

use super::speculative::SpecConfig;

/// Weight of the past in the running averages, per observation.
const DECAY: f64 = 0.85;
/// `β` before any measurement: a verification row costs a quarter of a plain pass.
pub const BETA_PRIOR: f64 = 0.25;
/// Plain decisions in a row after which a source that is not free gets one verification.
pub const EXPLORE_AFTER: usize = 16;

/// The draft length policy (see the module header).
#[derive(Clone, Debug)]
pub struct Policy {
    cfg: SpecConfig,
    /// Accepted drafts and drafts judged, exponentially weighted.
    acc: (f64, f64),
    /// Extra cost of one verification row, in plain passes.
    beta: f64,
    /// Running cost of a plain pass (weighted sum, weight), when measured.
    plain: (f64, f64),
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
    /// A policy with the priors (`α` = 1/2, `β` = [`BETA_PRIOR`]).
    pub fn new(cfg: SpecConfig) -> Self {
        Self {
            cfg,
            acc: (1.0, 2.0),
            beta: BETA_PRIOR,
            plain: (0.0, 0.0),
            idle: 0,
            holding: false,
        }
    }

    /// The running acceptance probability `α`.
    pub fn alpha(&self) -> f64 {
        self.acc.0 / self.acc.1
    }

    /// The extra cost of a verification row in plain passes `β`.
    pub fn beta(&self) -> f64 {
        self.beta
    }

    /// The best draft length and its expected tokens per unit of cost.
    fn best(&self) -> (usize, f64) {
        let a = self.alpha().min(0.999);
        let lo = self.cfg.draft_min.max(1);
        (lo..=self.cfg.draft_max.max(lo))
            .map(|k| (k, expected(a, k) / (1.0 + self.beta * k as f64)))
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
            if p > 0.0 {
                let b = ((c / p - 1.0) / drafted as f64).max(0.0);
                self.beta = self.beta * DECAY + b * (1.0 - DECAY);
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
        assert_eq!(p.decide(true), (8, false), "α {} β {}", p.alpha(), p.beta());
        // every draft rejected: α falls below β's break-even, a plain pass (one fallback)
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
        // streamed dense model: a verification reads what a plain pass reads
        for _ in 0..30 {
            p.record_plain(Some(100.0));
            p.record_verify(2, 1, Some(100.0));
        }
        assert!(p.beta() < 0.01, "{}", p.beta());
        assert_eq!(p.decide(true).0, 6, "β ≈ 0: the longest draft pays");
        // a verification row costing a whole plain pass never pays
        let mut p = Policy::new(cfg(6, 2));
        for _ in 0..60 {
            p.record_plain(Some(1.0));
            p.record_verify(2, 1, Some(3.0));
        }
        assert!((p.beta() - 1.0).abs() < 0.01, "{}", p.beta());
        assert_eq!(p.decide(false), (0, true));
        for _ in 1..EXPLORE_AFTER {
            assert_eq!(p.decide(false).0, 0);
        }
        assert_eq!(p.decide(false), (2, false), "one exploring verification");
        assert_eq!(p.decide(false), (0, false), "still holding");
        // --draft-fixed: always draft_max
        let mut f = Policy::new(SpecConfig {
            adaptive: false,
            ..cfg(5, 1)
        });
        f.record_verify(5, 0, Some(9.0));
        assert_eq!(f.decide(false), (5, false));
    }
}
