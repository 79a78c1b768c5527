//! How `Sampler::distribution` finds its candidates
//! in order without sorting a whole vocabulary: the best k in one streaming pass
//! ([`top_k_candidates`]), or, with no top-k, a radix sort on the logits' `total_cmp` keys
//! ([`sort_candidates`]). Both give exactly what a comparison sort of every eligible
//! `(id, logit)` gives (the order is total); the tests hold them to the distribution as it
//! was computed before, bit for bit.

/// The order of the candidates in `Sampler::distribution`: most likely first (logits
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
/// NaN as `Sampler::distribution` does (`l > −∞`).
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

/// From how many candidates `Sampler::distribution` sorts them by [`sort_candidates`]
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
