//! The low-bit kernel tables ([`EXT_TYPES`](crate::quant::EXT_TYPES) order) at the AVX2 and
//! AVX-512 levels, joined from `lowbit_k` and `lowbit_iq` (whose shared decoding helpers are
//! `lowbit`).

use crate::quant::{DeqFn, DotFn, N_EXT};

use super::{lowbit_iq, lowbit_k};

/// One level's low-bit (dot, dequantization) pairs in `EXT_TYPES` order, from the k-quant /
/// legacy / ternary pairs `k` (Q4_1, Q5_1, Q2_K, Q3_K, Q5_K, TQ1_0, TQ2_0) and the IQ pairs
/// `iq` (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS).
type Pairs = ([DotFn; N_EXT], [DeqFn; N_EXT]);

const fn ext(k: [(DotFn, DeqFn); 7], iq: [(DotFn, DeqFn); 9]) -> Pairs {
    let mut all = [k[0]; N_EXT];
    let mut i = 0;
    while i < N_EXT {
        all[i] = if i < 5 {
            k[i]
        } else if i < 14 {
            iq[i - 5]
        } else {
            k[i - 9]
        };
        i += 1;
    }
    let mut dot = [all[0].0; N_EXT];
    let mut deq = [all[0].1; N_EXT];
    let mut j = 0;
    while j < N_EXT {
        dot[j] = all[j].0;
        deq[j] = all[j].1;
        j += 1;
    }
    (dot, deq)
}

const AVX2: Pairs = ext(lowbit_k::AVX2, lowbit_iq::AVX2);
const AVX512: Pairs = ext(lowbit_k::AVX512, lowbit_iq::AVX512);

/// The AVX2 low-bit dots, `EXT_TYPES` order (every type decoded in registers).
pub(super) const AVX2_DOT: [DotFn; N_EXT] = AVX2.0;
/// The AVX2 low-bit dequantization, `EXT_TYPES` order.
pub(super) const AVX2_DEQ: [DeqFn; N_EXT] = AVX2.1;
/// The AVX-512 low-bit dots, `EXT_TYPES` order (the same decoders, 16-lane accumulation).
pub(super) const AVX512_DOT: [DotFn; N_EXT] = AVX512.0;
/// The AVX-512 low-bit dequantization, `EXT_TYPES` order.
pub(super) const AVX512_DEQ: [DeqFn; N_EXT] = AVX512.1;
