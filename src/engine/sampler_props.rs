//! The streaming top-k and the radix sort of `sampler_select.rs` held to
//! [`Sampler::distribution`] as it was computed before them (every eligible entry collected,
//! the top k selected, then sorted), bit for bit, on random rows (proptest).

use super::tests::cfg;
use super::*;
use crate::engine::sampler_select::{candidate_order, sort_candidates};
// not the prelude's glob: it brings rand's `Rng`, which would clash with ours
use proptest::prelude::{any, Just, Strategy};
use proptest::prop_oneof;

/// [`Sampler::distribution`] as it was before the streaming top-k (every eligible entry
/// collected, the top k selected, then sorted; the filters after top-k shared): the reference
/// the proptest compares with.
fn reference_distribution(c: &SamplerConfig, logits: &[f32]) -> Vec<(u32, f64)> {
    let t_filter = match c.order {
        SamplerOrder::LlamaCpp => 1.0,
        SamplerOrder::Transformers => c.temperature,
    };
    let mut cand: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|&(_, &l)| l > f32::NEG_INFINITY)
        .map(|(i, &l)| (i as u32, l))
        .collect();
    if cand.is_empty() {
        return vec![(0, 1.0)];
    }
    let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if c.top_k > 0 && c.top_k < cand.len() {
        cand.select_nth_unstable_by(c.top_k - 1, order);
        cand.truncate(c.top_k);
    }
    cand.sort_by(order);
    // the filters after top-k did not change: the same code
    top_p_min_p(cand, c, t_filter)
}

/// Ids and probability bits, so that NaN probabilities (a +∞ logit) compare too.
fn bits(d: &[(u32, f64)]) -> Vec<(u32, u64)> {
    d.iter().map(|&(id, p)| (id, p.to_bits())).collect()
}

/// A logit drawn from a few values so that ties are common, with ±0, ±∞, NaNs of both
/// signs and other payloads, and now and then any bit pattern.
fn odd_logit() -> impl Strategy<Value = f32> {
    prop_oneof![
        6 => (-4i32..4).prop_map(|v| v as f32 * 0.5),
        2 => -3.0f32..3.0,
        1 => Just(0.0f32),
        1 => Just(-0.0f32),
        2 => Just(f32::NEG_INFINITY),
        1 => Just(f32::INFINITY),
        1 => Just(f32::NAN),
        1 => Just(-f32::NAN),
        1 => Just(f32::from_bits(0xffc0_0001)),
        1 => Just(f32::from_bits(0x7f80_0001)),
        1 => any::<u32>().prop_map(f32::from_bits),
    ]
}

fn config() -> impl Strategy<Value = SamplerConfig> {
    (
        prop_oneof![Just(0usize), 1usize..6, 6usize..80, Just(usize::MAX)],
        prop_oneof![Just(1.0f32), 0.05f32..1.0],
        prop_oneof![Just(0.0f32), 0.0f32..1.0],
        prop_oneof![Just(1.0f32), 0.1f32..3.0],
        any::<bool>(),
    )
        .prop_map(|(top_k, top_p, min_p, temperature, hf)| SamplerConfig {
            temperature,
            top_k,
            top_p,
            min_p,
            order: if hf {
                SamplerOrder::Transformers
            } else {
                SamplerOrder::LlamaCpp
            },
            ..cfg(1.0)
        })
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

    /// The streaming top-k gives the collect-select-sort result bit for bit: same tokens,
    /// same order, same probabilities, whatever the ties, −∞, NaNs and settings.
    #[test]
    fn distribution_equals_the_reference(
        logits in proptest::collection::vec(odd_logit(), 0..300),
        c in config(),
    ) {
        let got = Sampler::new(c.clone()).distribution(&logits);
        let want = reference_distribution(&c, &logits);
        proptest::prop_assert_eq!(bits(&got), bits(&want));
    }

    /// Long rows of few distinct values with a rising trend (the threshold is passed often
    /// and the buffer refills many times) or a falling one.
    #[test]
    fn distribution_equals_the_reference_on_long_rows(
        n in 1usize..12000,
        levels in 1u32..12,
        rising: bool,
        top_k in prop_oneof![Just(0usize), 1usize..100],
        seed: u64,
    ) {
        let mut r = Rng::new(seed);
        let logits: Vec<f32> = (0..n)
            .map(|i| {
                let trend = if rising { i } else { n - i } as f32 / n as f32 * 4.0;
                let v = (r.next_u64() % levels as u64) as f32 * 0.25 + trend.floor();
                if r.next_u64().is_multiple_of(17) { f32::NEG_INFINITY } else { v }
            })
            .collect();
        let c = SamplerConfig { top_k, top_p: 0.9, min_p: 0.02, ..cfg(0.7) };
        let got = Sampler::new(c.clone()).distribution(&logits);
        let want = reference_distribution(&c, &logits);
        proptest::prop_assert_eq!(bits(&got), bits(&want));
    }

    /// The radix sort gives the comparison sort's order, whatever the length.
    #[test]
    fn radix_sort_equals_the_comparison_sort(
        logits in proptest::collection::vec(odd_logit(), 0..3000),
    ) {
        let mut want: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        let mut got = want.clone();
        want.sort_by(candidate_order);
        sort_candidates(&mut got);
        let b = |v: &[(u32, f32)]| v.iter().map(|&(i, l)| (i, l.to_bits())).collect::<Vec<_>>();
        proptest::prop_assert_eq!(b(&got), b(&want));
    }
}
