//! aarch64 NEON kernels. Element `32k + j` of a row goes to accumulator `j / 4`, lane
//! `j % 4` (fused multiply-add); the reduction is `((a0+a1)+(a2+a3)) + ((a4+a5)+(a6+a7))`,
//! then lane pairs (`lowbit::finish8`). Every block type is decoded in registers from
//! storage: Q8_0, Q4_0, Q5_0, Q4_K, Q6_K and MXFP4 in `base`, the low-bit types
//! ([`EXT_TYPES`](super::EXT_TYPES)) in `lowbit_k` and `lowbit_iq` (helpers in `lowbit`); the
//! float types F32, F16 and BF16 are decoded by the scalar decoders into a stack buffer and
//! accumulated by [`Neon8`] in the same order, so every dot equals the level's `dot_f32`
//! over the dequantized row bit for bit. Run under qemu-user by `tools/neon/test.sh`.

use super::scalar::{dot_decoded, dot_f32 as dot_f32_generic, Accum};
use super::{
    join, DeqFn, DotFn, LevelKernels, N_BASE, N_EXT, N_SLOTS, SCALAR_DECODE, SCALAR_DEQ, SLOT_TYPES,
};
use std::arch::aarch64::*;

mod base;
mod lowbit;
mod lowbit_iq;
mod lowbit_k;
#[cfg(test)]
mod tests;

/// Eight 4-lane fma accumulators.
pub(crate) struct Neon8([float32x4_t; 8]);

impl Accum for Neon8 {
    fn new() -> Self {
        // SAFETY: NEON is part of the aarch64 baseline.
        Self([unsafe { vdupq_n_f32(0.0) }; 8])
    }
    #[inline(always)]
    fn add(&mut self, w: &[f32], x: &[f32]) {
        assert!(w.len() == x.len() && w.len().is_multiple_of(32));
        // SAFETY: NEON is baseline; every load reads 4 floats inside `w`/`x` (length
        // checked to be a multiple of 32 above).
        unsafe {
            for r in 0..w.len() / 32 {
                for k in 0..8 {
                    let o = 32 * r + 4 * k;
                    let wv = vld1q_f32(w.as_ptr().add(o));
                    let xv = vld1q_f32(x.as_ptr().add(o));
                    self.0[k] = vfmaq_f32(self.0[k], wv, xv);
                }
            }
        }
    }
    fn finish(&self) -> f32 {
        // SAFETY: NEON is baseline.
        unsafe { lowbit::finish8(&self.0) }
    }
}

macro_rules! dots {
    ($($name:ident = $slot:expr),*) => {
        $(fn $name(row: &[u8], x: &[f32]) -> f32 {
            let ty = SLOT_TYPES[$slot];
            dot_decoded::<Neon8>(row, x, ty.block_bytes(), ty.block_elems(), SCALAR_DECODE[$slot])
        })*
    };
}
dots!(d0 = 0, d1 = 1, d2 = 2);

/// The low-bit (dot, dequantization) pairs in `EXT_TYPES` order, from the k-quant / legacy /
/// ternary pairs `k` (Q4_1, Q5_1, Q2_K, Q3_K, Q5_K, TQ1_0, TQ2_0) and the IQ pairs `iq`
/// (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS).
const fn ext(k: [(DotFn, DeqFn); 7], iq: [(DotFn, DeqFn); 9]) -> ([DotFn; N_EXT], [DeqFn; N_EXT]) {
    let mut dot = [k[0].0; N_EXT];
    let mut deq = [k[0].1; N_EXT];
    let mut i = 0;
    while i < N_EXT {
        let p = if i < 5 {
            k[i]
        } else if i < 14 {
            iq[i - 5]
        } else {
            k[i - 9]
        };
        dot[i] = p.0;
        deq[i] = p.1;
        i += 1;
    }
    (dot, deq)
}

const EXT: ([DotFn; N_EXT], [DeqFn; N_EXT]) = ext(lowbit_k::PAIRS, lowbit_iq::PAIRS);

/// The first [`N_BASE`] (dot, dequantization) entries: the float types F32, F16, BF16
/// through the scalar decoders and [`Neon8`], then the block types of `base::PAIRS` (Q8_0,
/// Q4_0, Q5_0, Q4_K, Q6_K, MXFP4) in registers.
const fn base() -> ([DotFn; N_BASE], [DeqFn; N_BASE]) {
    let mut dot: [DotFn; N_BASE] = [d0; N_BASE];
    let mut deq = [SCALAR_DEQ[0]; N_BASE];
    dot[1] = d1;
    dot[2] = d2;
    deq[1] = SCALAR_DEQ[1];
    deq[2] = SCALAR_DEQ[2];
    let mut i = 3;
    while i < N_BASE {
        dot[i] = base::PAIRS[i - 3].0;
        deq[i] = base::PAIRS[i - 3].1;
        i += 1;
    }
    (dot, deq)
}

const BASE: ([DotFn; N_BASE], [DeqFn; N_BASE]) = base();

/// The NEON table: the float types through the scalar decoders and [`Neon8`], every block
/// type decoded in registers.
pub(crate) static KERNELS: LevelKernels = LevelKernels {
    dot: join(BASE.0, EXT.0),
    deq: join(BASE.1, EXT.1),
    dot_f32: dot_f32_generic::<Neon8>,
    prep: [None; N_SLOTS],
    f32_tile: None,
    prep_tile: None,
    dot_rows: [None; N_SLOTS],
};
