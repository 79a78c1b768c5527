//! aarch64 NEON kernels. Blocks are decoded by the scalar decoders (exact values) into a
//! stack buffer, then accumulated: element `32k + j` of a row goes to accumulator `j / 4`,
//! lane `j % 4` (fused multiply-add); the reduction is
//! `((a0+a1)+(a2+a3)) + ((a4+a5)+(a6+a7))`, then lane pairs. Untested on hardware here
//! (this crate's CI machines are x86-64); it only has to compile.

use super::scalar::{dot_decoded, dot_f32 as dot_f32_generic, Accum};
use super::{LevelKernels, N_SLOTS, SCALAR_DECODE, SCALAR_DEQ, SLOT_TYPES};
use std::arch::aarch64::*;

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
        let a = &self.0;
        // SAFETY: NEON is baseline.
        unsafe {
            let l = vaddq_f32(vaddq_f32(a[0], a[1]), vaddq_f32(a[2], a[3]));
            let h = vaddq_f32(vaddq_f32(a[4], a[5]), vaddq_f32(a[6], a[7]));
            let v = vaddq_f32(l, h);
            let p = vadd_f32(vget_low_f32(v), vget_high_f32(v));
            vget_lane_f32::<0>(p) + vget_lane_f32::<1>(p)
        }
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
dots!(
    d0 = 0,
    d1 = 1,
    d2 = 2,
    d3 = 3,
    d4 = 4,
    d5 = 5,
    d6 = 6,
    d7 = 7,
    d8 = 8,
    d9 = 9,
    d10 = 10,
    d11 = 11,
    d12 = 12,
    d13 = 13,
    d14 = 14,
    d15 = 15,
    d16 = 16,
    d17 = 17,
    d18 = 18,
    d19 = 19,
    d20 = 20,
    d21 = 21,
    d22 = 22,
    d23 = 23,
    d24 = 24
);

/// The NEON table.
pub(crate) static KERNELS: LevelKernels = LevelKernels {
    dot: [
        d0, d1, d2, d3, d4, d5, d6, d7, d8, d9, d10, d11, d12, d13, d14, d15, d16, d17, d18, d19,
        d20, d21, d22, d23, d24,
    ],
    deq: SCALAR_DEQ,
    dot_f32: dot_f32_generic::<Neon8>,
    prep: [None; N_SLOTS],
    f32_tile: None,
    prep_tile: None,
};
