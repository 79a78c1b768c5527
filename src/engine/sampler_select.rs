//! How [`Sampler::distribution`](super::sampler::Sampler::distribution) finds its candidates
//! in order without sorting a whole vocabulary: the best k in one streaming pass
//! ([`top_k_candidates`]), or, with no top-k, a radix sort on the logits' `total_cmp` keys
//! ([`sort_candidates`]). Both give exactly what a comparison sort of every eligible
//! `(id, logit)` gives (the order is total); the tests hold them to the distribution as it
//! was computed before, bit for bit.

/// The order of the candidates in [`Sampler::distribution`](super::sampler::Sampler::distribution): most likely first (logits
/// descending under [`f32::total_cmp`]), ties by ascending id. A strict total order on
/// candidates of distinct ids, so any correct sort or selection gives the same result.
pub(super) fn candidate_order(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// `l`'s rank in [`f32::total_cmp`]'s order as an `i32` compared as integers (the same map
/// `total_cmp` uses: negative values have their magnitude bits flipped).
fn total_key(l: f32) -> i32 {
    let b = l.to_bits() as i32;
    b ^ (((b >> 31) as u32) >> 1) as i32
}

/// The `k` (at least 1) best entries of `logits` under [`candidate_order`] as `(id, logit)`,
/// in no particular order (all of them when fewer than `k` are eligible), leaving out −∞ and
/// NaN as [`Sampler::distribution`](super::sampler::Sampler::distribution) does (`l > −∞`).
///
/// One pass in ascending id keeps a buffer of at most `2k` entries; when it fills, the best
/// `k` are selected and the `k`-th best's logit becomes a threshold. An entry whose logit is
/// not above the threshold under `total_cmp` cannot be among the best `k`: `k` kept entries
/// beat it (an equal logit loses the tie, its id being larger than every kept one). So most
/// entries of a large vocabulary cost one integer compare, and the set kept is exactly the
/// best `k` of the eligible entries (unique: the order is total).
pub(super) fn top_k_candidates(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    debug_assert!(k > 0);
    // eligible: total_key(−∞) < key <= total_key(+∞); NaNs lie outside (a NaN with the sign
    // bit below −∞, one without above +∞)
    const INF: i32 = 0x7f80_0000;
    let cap = k.saturating_mul(2);
    let mut kept: Vec<(u32, f32)> = Vec::with_capacity(cap.min(logits.len()));
    let mut thr = total_key(f32::NEG_INFINITY);
    let push = |kept: &mut Vec<(u32, f32)>, thr: &mut i32, i: usize, l: f32| {
        kept.push((i as u32, l));
        if kept.len() == cap {
            kept.select_nth_unstable_by(k - 1, candidate_order);
            kept.truncate(k);
            *thr = total_key(kept[k - 1].1);
        }
    };
    // blocks of 16: a block none of whose entries passes (most of them, once the threshold
    // has risen) costs a few vector compares
    const B: usize = 16;
    let mut blocks = logits.chunks_exact(B);
    for (bi, b) in (&mut blocks).enumerate() {
        let t = thr;
        let any = b.iter().fold(false, |a, &l| {
            let key = total_key(l);
            a | ((key > t) & (key <= INF))
        });
        if any {
            for (j, &l) in b.iter().enumerate() {
                let key = total_key(l);
                if key > thr && key <= INF {
                    push(&mut kept, &mut thr, bi * B + j, l);
                }
            }
        }
    }
    let base = logits.len() - blocks.remainder().len();
    for (j, &l) in blocks.remainder().iter().enumerate() {
        let key = total_key(l);
        if key > thr && key <= INF {
            push(&mut kept, &mut thr, base + j, l);
        }
    }
    if kept.len() > k {
        kept.select_nth_unstable_by(k - 1, candidate_order);
        kept.truncate(k);
    }
    kept
}

/// From how many candidates [`Sampler::distribution`](super::sampler::Sampler::distribution) sorts them by [`sort_candidates`]
/// rather than by comparisons (below, the radix sort's fixed cost of its histograms is not
/// worth it).
pub(super) const RADIX_MIN: usize = 4096;

/// Sorts `cand` (`(id, logit)` in ascending id, as collected from a row of logits) into
/// [`candidate_order`] by a least-significant-digit radix sort on the logits' `total_cmp` keys,
/// descending, in three stable passes of 11, 11 and 10 bits (a pass whose digit all entries
/// share is skipped). Stability keeps equal logits in ascending id, so the result is the
/// comparison sort's exactly (the order is total); a 262k-entry vocabulary sorts in a few
/// linear passes instead of `n log n` comparisons.
pub(super) fn sort_candidates(cand: &mut Vec<(u32, f32)>) {
    debug_assert!(cand.windows(2).all(|w| w[0].0 < w[1].0));
    // descending total_cmp as an ascending u32: flip the sign bit into offset form, then all
    let key = |l: f32| !((total_key(l) as u32) ^ 0x8000_0000);
    const DIGITS: [(u32, usize); 3] = [(0, 11), (11, 11), (22, 10)];
    let mut hist = [[0usize; 1 << 11]; 3];
    for &(_, l) in cand.iter() {
        let k = key(l);
        for (h, &(shift, bits)) in hist.iter_mut().zip(&DIGITS) {
            h[((k >> shift) & ((1 << bits) - 1)) as usize] += 1;
        }
    }
    let n = cand.len();
    let mut other: Vec<(u32, f32)> = vec![(0, 0.0); n];
    for (h, &(shift, bits)) in hist.iter_mut().zip(&DIGITS) {
        if h.contains(&n) {
            continue;
        }
        let mut at = 0;
        for c in h.iter_mut() {
            let here = *c;
            *c = at;
            at += here;
        }
        for &e in cand.iter() {
            let d = ((key(e.1) >> shift) & ((1 << bits) - 1)) as usize;
            other[h[d]] = e;
            h[d] += 1;
        }
        std::mem::swap(cand, &mut other);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::sampler::tests::cfg;
    use crate::engine::sampler::{Rng, Sampler, SamplerConfig, SamplerOrder};
    // not the prelude's glob: it brings rand's `Rng`, which would clash with ours
    use proptest::prelude::{any, Just, Strategy};
    use proptest::prop_oneof;

    /// [`Sampler::distribution`] as it was before the streaming top-k (every eligible entry
    /// collected, the top k selected, then sorted): the reference the proptest compares with.
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
        let probs = |cand: &[(u32, f32)], temp: f32| -> Vec<f64> {
            let m = cand[0].1 as f64;
            let e: Vec<f64> = cand
                .iter()
                .map(|&(_, l)| ((l as f64 - m) / temp as f64).exp())
                .collect();
            let s: f64 = e.iter().sum();
            e.into_iter().map(|v| v / s).collect()
        };
        if c.top_p < 1.0 {
            let p = probs(&cand, t_filter);
            let mut acc = 0.0;
            let mut keep = cand.len();
            for (i, pi) in p.iter().enumerate() {
                acc += pi;
                if acc >= c.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            cand.truncate(keep.max(1));
        }
        if c.min_p > 0.0 {
            let p = probs(&cand, t_filter);
            let thr = p[0] * c.min_p as f64;
            let keep = p.iter().take_while(|&&pi| pi >= thr).count().max(1);
            cand.truncate(keep);
        }
        let p = probs(&cand, c.temperature);
        cand.iter().zip(p).map(|(&(id, _), p)| (id, p)).collect()
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
}
