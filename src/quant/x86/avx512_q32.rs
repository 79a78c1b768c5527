//! AVX-512 (F + BW + VL) dot products of the 32-element, one-scale block types (Q8_0,
//! Q4_0, Q5_0) in the block-scale scheme: for block `b` with integer values `q` (exact in
//! f32) and scale `d` (the f16 scale, exact in f32),
//! `s = q[0..16] * x[0..16]` (rounded product), `s = fma(q[16..32], x[16..32], s)`, then
//! `acc[b % 2] = fma(d, s, acc[b % 2])` lane-wise; the reduction is that of the AVX-512
//! level (`acc0 + acc1`, then halves). One scale multiply per block instead of one per
//! element, and two independent accumulator chains.
//!
//! [`prep_dot`] runs the same operations on rows prepared by the `prep_*` functions (the
//! integer values and scales stored as f32), so a `matmul` that prepares each weight row
//! once equals the fused dot bit for bit.

use super::common::{bit_matrix, finish_avx512, load16, q32_kernels};
use std::arch::x86_64::*;

/// Blocks whose scales are converted together.
const CHUNK: usize = 16;

type Q = [__m512; 2];

/// One block step of the scheme (see the module doc).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn step(q: Q, d: f32, x: *const f32, acc: &mut __m512) {
    let s = _mm512_mul_ps(q[0], _mm512_loadu_ps(x));
    let s = _mm512_fmadd_ps(q[1], _mm512_loadu_ps(x.add(16)), s);
    *acc = _mm512_fmadd_ps(_mm512_set1_ps(d), s, *acc);
}

/// The values of a block to `dst` (32 floats).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn store_q(q: Q, dst: *mut f32) {
    _mm512_storeu_ps(dst, q[0]);
    _mm512_storeu_ps(dst.add(16), q[1]);
}

/// The values of a prepared block at `src` (32 floats).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn load_q(src: *const f32) -> Q {
    [_mm512_loadu_ps(src), _mm512_loadu_ps(src.add(16))]
}

/// The reduction of the two accumulators: the level's.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn finish2(a0: __m512, a1: __m512) -> f32 {
    finish_avx512(&[a0, a1])
}

/// The f16 scales at `p`, `p + bb`, ... (`m <= CHUNK` blocks of `bb >= 4` bytes) as f32
/// (exact conversion), gathered as 32-bit words (the scale and the next two bytes).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn scales(p: *const u8, bb: usize, m: usize, out: &mut [f32; CHUNK]) {
    let idx = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(bb as i32),
    );
    let mask = if m >= CHUNK { !0 } else { (1u16 << m) - 1 };
    let words =
        _mm512_mask_i32gather_epi32::<1>(_mm512_setzero_si512(), mask, idx, p as *const i32);
    let v = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(words));
    _mm512_storeu_ps(out.as_mut_ptr(), v);
}

/// Sign-extends the 16 bytes of `lo` (elements 0..16) and of `hi` (16..32) to f32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn i8x32_to_f32(lo: __m128i, hi: __m128i) -> Q {
    [
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)),
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi)),
    ]
}

/// The 32 integer values of the Q8_0 block at `p`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn q_q8_0(p: *const u8) -> Q {
    i8x32_to_f32(load16(p.add(2)), load16(p.add(18)))
}

/// The 32 integer values (`nibble - 8`) of the Q4_0 block at `p`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn q_q4_0(p: *const u8) -> Q {
    let qs = load16(p.add(2));
    let m = _mm_set1_epi8(15);
    let e = _mm_set1_epi8(8);
    let lo = _mm_sub_epi8(_mm_and_si128(qs, m), e);
    let hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16::<4>(qs), m), e);
    i8x32_to_f32(lo, hi)
}

/// The 32 integer values (`(nibble | bit << 4) - 16`) of the Q5_0 block at `p`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn q_q5_0(p: *const u8) -> Q {
    let qh = (p.add(2) as *const u32).read_unaligned().to_le();
    let qs = load16(p.add(6));
    let m = _mm_set1_epi8(15);
    let b4 = _mm_set1_epi8(16);
    let lo = _mm_and_si128(qs, m);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(qs), m);
    // Where the fifth bit is clear the value is nibble - 16, else the nibble itself.
    let lo = _mm_mask_sub_epi8(lo, !(qh as u16), lo, b4);
    let hi = _mm_mask_sub_epi8(hi, !((qh >> 16) as u16), hi, b4);
    i8x32_to_f32(lo, hi)
}

/// Low / high nibble, sign-extended from bit 3 after flipping it (with constant 0xF8:
/// `nibble - 8` as i8).
const Q4_LO: i64 = bit_matrix([0, 1, 2, 3, 3, 3, 3, 3]);
const Q4_HI: i64 = bit_matrix([4, 5, 6, 7, 7, 7, 7, 7]);
/// Low / high nibble alone in bits 0..4 (with constant 0xF0: `nibble - 16` as i8).
const NIB_LO: i64 = bit_matrix([0, 1, 2, 3, 8, 8, 8, 8]);
const NIB_HI: i64 = bit_matrix([4, 5, 6, 7, 8, 8, 8, 8]);

/// The 32 integer values of the Q4_0 block at `p`, nibbles decoded by GF(2) affine maps.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c,gfni")]
unsafe fn q_q4_0_gfni(p: *const u8) -> Q {
    let qs = load16(p.add(2));
    let lo = _mm_gf2p8affine_epi64_epi8::<0xF8>(qs, _mm_set1_epi64x(Q4_LO));
    let hi = _mm_gf2p8affine_epi64_epi8::<0xF8>(qs, _mm_set1_epi64x(Q4_HI));
    i8x32_to_f32(lo, hi)
}

/// The 32 integer values of the Q5_0 block at `p`: `nibble - 16` by a GF(2) affine map,
/// plus 16 where the fifth bit is set.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c,gfni")]
unsafe fn q_q5_0_gfni(p: *const u8) -> Q {
    let hl = (p.add(2) as *const u16).read_unaligned().to_le();
    let hh = (p.add(4) as *const u16).read_unaligned().to_le();
    let qs = load16(p.add(6));
    let b4 = _mm_set1_epi8(16);
    let lo = _mm_gf2p8affine_epi64_epi8::<0xF0>(qs, _mm_set1_epi64x(NIB_LO));
    let hi = _mm_gf2p8affine_epi64_epi8::<0xF0>(qs, _mm_set1_epi64x(NIB_HI));
    let lo = _mm_mask_add_epi8(lo, hl, lo, b4);
    let hi = _mm_mask_add_epi8(hi, hh, hi, b4);
    i8x32_to_f32(lo, hi)
}

q32_kernels!(avx512; dot_q8_0, prep_q8_0, q_q8_0, 34);
q32_kernels!(avx512; dot_q4_0, prep_q4_0, q_q4_0, 18);
q32_kernels!(avx512; dot_q5_0, prep_q5_0, q_q5_0, 22);
q32_kernels!(avx512 "avx512f,avx512bw,avx512vl,avx2,fma,f16c,gfni";
    dot_q4_0_gfni, prep_q4_0_gfni, q_q4_0_gfni, 18);
q32_kernels!(avx512 "avx512f,avx512bw,avx512vl,avx2,fma,f16c,gfni";
    dot_q5_0_gfni, prep_q5_0_gfni, q_q5_0_gfni, 22);

/// The block-scale dot over a prepared row (`q`: `x.len()` integer values, `d`: one scale
/// per 32 elements); equals the fused `dot_*` of the row bit for bit.
pub(super) fn prep_dot(q: &[f32], d: &[f32], x: &[f32]) -> f32 {
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn inner(q: &[f32], d: &[f32], x: &[f32]) -> f32 {
        let (qp, xp) = (q.as_ptr(), x.as_ptr());
        let mut a0 = _mm512_setzero_ps();
        let mut a1 = _mm512_setzero_ps();
        let nb = d.len();
        let mut b = 0;
        while b + 1 < nb {
            step(load_q(qp.add(32 * b)), d[b], xp.add(32 * b), &mut a0);
            let c = b + 1;
            step(load_q(qp.add(32 * c)), d[c], xp.add(32 * c), &mut a1);
            b += 2;
        }
        if b < nb {
            step(load_q(qp.add(32 * b)), d[b], xp.add(32 * b), &mut a0);
        }
        finish2(a0, a1)
    }
    assert!(
        q.len() == x.len() && d.len() * 32 == x.len(),
        "prepared row length mismatch"
    );
    // SAFETY: as for the dots above; reads stay inside `q`, `d` and `x`.
    unsafe { inner(q, d, x) }
}
