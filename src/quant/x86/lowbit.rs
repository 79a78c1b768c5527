//! The low-bit types' ([`EXT_TYPES`](crate::quant::EXT_TYPES)) fused dots at the AVX2 and
//! AVX-512 levels for the types without an in-register decoder: each 256-element chunk (or
//! block) is decoded by the scalar reference decoder into a stack buffer (exact values), then
//! accumulated in the level's lanes and order (the same as the level's f32 dot, so
//! `dot_f32(dequantized, x)` equals the fused dot bit for bit). Their dequantization is the
//! scalar one.

use std::arch::x86_64::*;

use super::common::{finish_avx2, finish_avx512};
use crate::quant::scalar::{dot_decoded, Accum};
use crate::quant::{DotFn, N_BASE, N_EXT, SCALAR_DECODE, SLOT_TYPES};

/// The AVX2 accumulation: element `32k + j` into accumulator `j / 8`, lane `j % 8` (fma).
pub(super) struct Avx2Acc([__m256; 4]);

/// The AVX-512 accumulation: element `32k + j` into accumulator `j / 16`, lane `j % 16` (fma).
pub(super) struct Avx512Acc([__m512; 2]);

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn add_avx2(acc: &mut [__m256; 4], w: &[f32], x: &[f32]) {
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    for r in 0..w.len() / 32 {
        for (k, a) in acc.iter_mut().enumerate() {
            let o = 32 * r + 8 * k;
            *a = _mm256_fmadd_ps(_mm256_loadu_ps(wp.add(o)), _mm256_loadu_ps(xp.add(o)), *a);
        }
    }
}

#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn add_avx512(acc: &mut [__m512; 2], w: &[f32], x: &[f32]) {
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    for r in 0..w.len() / 32 {
        for (k, a) in acc.iter_mut().enumerate() {
            let o = 32 * r + 16 * k;
            *a = _mm512_fmadd_ps(_mm512_loadu_ps(wp.add(o)), _mm512_loadu_ps(xp.add(o)), *a);
        }
    }
}

impl Accum for Avx2Acc {
    fn new() -> Self {
        // SAFETY: an all-zero bit pattern is a valid __m256 (eight +0.0).
        Self(unsafe { std::mem::zeroed() })
    }
    #[inline(always)]
    fn add(&mut self, w: &[f32], x: &[f32]) {
        assert!(w.len() == x.len() && w.len().is_multiple_of(32));
        // SAFETY: only reachable through the AVX2 table, handed out after runtime detection;
        // every load reads 8 floats inside `w` / `x` (lengths checked above).
        unsafe { add_avx2(&mut self.0, w, x) }
    }
    fn finish(&self) -> f32 {
        // SAFETY: as for `add`.
        unsafe { finish_avx2(&self.0) }
    }
}

impl Accum for Avx512Acc {
    fn new() -> Self {
        // SAFETY: an all-zero bit pattern is a valid __m512 (sixteen +0.0).
        Self(unsafe { std::mem::zeroed() })
    }
    #[inline(always)]
    fn add(&mut self, w: &[f32], x: &[f32]) {
        assert!(w.len() == x.len() && w.len().is_multiple_of(32));
        // SAFETY: only reachable through the AVX-512 tables, handed out after runtime
        // detection; every load reads 16 floats inside `w` / `x` (lengths checked above).
        unsafe { add_avx512(&mut self.0, w, x) }
    }
    fn finish(&self) -> f32 {
        // SAFETY: as for `add`.
        unsafe { finish_avx512(&self.0) }
    }
}

/// Defines `$name: [DotFn; N_EXT]`, the decode-then-accumulate dots of every low-bit slot in
/// the scheme `$acc`.
macro_rules! ext_dots {
    ($name:ident, $acc:ty; $($f:ident = $i:expr),*) => {
        $(fn $f(row: &[u8], x: &[f32]) -> f32 {
            let ty = SLOT_TYPES[N_BASE + $i];
            dot_decoded::<$acc>(row, x, ty.block_bytes(), ty.block_elems(), SCALAR_DECODE[N_BASE + $i])
        })*
        /// The decode-then-accumulate dots of the low-bit slots, in `EXT_TYPES` order.
        pub(super) const $name: [DotFn; N_EXT] = [$($f),*];
    };
}

ext_dots!(AVX2_DOT, Avx2Acc; a0 = 0, a1 = 1, a2 = 2, a3 = 3, a4 = 4, a5 = 5, a6 = 6, a7 = 7,
    a8 = 8, a9 = 9, a10 = 10, a11 = 11, a12 = 12, a13 = 13, a14 = 14, a15 = 15);
ext_dots!(AVX512_DOT, Avx512Acc; b0 = 0, b1 = 1, b2 = 2, b3 = 3, b4 = 4, b5 = 5, b6 = 6, b7 = 7,
    b8 = 8, b9 = 9, b10 = 10, b11 = 11, b12 = 12, b13 = 13, b14 = 14, b15 = 15);
