//! AVX2 (+ FMA, F16C) dot products of the 32-element, one-scale block types (Q8_0, Q4_0,
//! Q5_0) in the block-scale scheme: for block `b` with integer values `q` (exact in f32)
//! and scale `d`, `s = q[0..8] * x[0..8]`, then `s = fma(q[8k..], x[8k..], s)` for
//! `k = 1, 2, 3`, then `acc[b % 2] = fma(d, s, acc[b % 2])` lane-wise; the reduction is
//! the AVX2 level's (`(acc0 + acc1) + (0 + 0)`, then halves).
//!
//! [`prep_dot`] runs the same operations on prepared rows (integer values and scales as
//! f32), so `matmul` equals the fused dot bit for bit.

use super::common::{finish_avx2, load16, q32_kernels};
use std::arch::x86_64::*;

/// Blocks whose scales are converted together.
const CHUNK: usize = 8;

type Q = [__m256; 4];

/// One block step of the scheme (see the module doc).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn step(q: Q, d: f32, x: *const f32, acc: &mut __m256) {
    let mut s = _mm256_mul_ps(q[0], _mm256_loadu_ps(x));
    s = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(x.add(8)), s);
    s = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(x.add(16)), s);
    s = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(x.add(24)), s);
    *acc = _mm256_fmadd_ps(_mm256_set1_ps(d), s, *acc);
}

/// The values of a block to `dst` (32 floats).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn store_q(q: Q, dst: *mut f32) {
    for (k, v) in q.into_iter().enumerate() {
        _mm256_storeu_ps(dst.add(8 * k), v);
    }
}

/// The reduction of the two accumulators: the level's, over `[acc0, acc1, 0, 0]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn finish2(a0: __m256, a1: __m256) -> f32 {
    let z = _mm256_setzero_ps();
    finish_avx2(&[a0, a1, z, z])
}

/// The f16 scales at `p`, `p + bb`, ... (`m <= CHUNK` blocks of `bb >= 4` bytes) as f32
/// (exact conversion), gathered as 32-bit words.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scales(p: *const u8, bb: usize, m: usize, out: &mut [f32; CHUNK]) {
    let idx = _mm256_mullo_epi32(
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        _mm256_set1_epi32(bb as i32),
    );
    let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(m as i32), lane);
    let w = _mm256_mask_i32gather_epi32::<1>(_mm256_setzero_si256(), p as *const i32, idx, mask);
    let w = _mm256_and_si256(w, _mm256_set1_epi32(0xFFFF));
    let h = _mm_packus_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256::<1>(w));
    _mm256_storeu_ps(out.as_mut_ptr(), _mm256_cvtph_ps(h));
}

/// Sign-extends the 16 bytes of `v` into two vectors of 8 f32 (bytes 0..8, 8..16).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn i8x16_to_f32(v: __m128i) -> (__m256, __m256) {
    (
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)),
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(v))),
    )
}

/// The 32 integer values of the Q8_0 block at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q_q8_0(p: *const u8) -> Q {
    let (a, b) = i8x16_to_f32(load16(p.add(2)));
    let (c, d) = i8x16_to_f32(load16(p.add(18)));
    [a, b, c, d]
}

/// The 32 integer values (`nibble - 8`) of the Q4_0 block at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q_q4_0(p: *const u8) -> Q {
    let qs = load16(p.add(2));
    let m = _mm_set1_epi8(15);
    let e = _mm_set1_epi8(8);
    let (a, b) = i8x16_to_f32(_mm_sub_epi8(_mm_and_si128(qs, m), e));
    let (c, d) = i8x16_to_f32(_mm_sub_epi8(_mm_and_si128(_mm_srli_epi16::<4>(qs), m), e));
    [a, b, c, d]
}

/// 16 bytes, 0xFF where bit `j` of the 16-bit `bits` is set (byte `j`), else 0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bits_to_bytes(bits: u32) -> __m128i {
    let sel = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    let bit = _mm_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let v = _mm_shuffle_epi8(_mm_cvtsi32_si128(bits as i32), sel);
    _mm_cmpeq_epi8(_mm_and_si128(v, bit), bit)
}

/// The 32 integer values (`(nibble | bit << 4) - 16`) of the Q5_0 block at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q_q5_0(p: *const u8) -> Q {
    let qh = (p.add(2) as *const u32).read_unaligned().to_le();
    let qs = load16(p.add(6));
    let m = _mm_set1_epi8(15);
    let f0 = _mm_set1_epi8(0xF0u8 as i8);
    // Where the fifth bit is clear the value is nibble - 16 = nibble | 0xF0 (as i8).
    let lo = _mm_or_si128(
        _mm_and_si128(qs, m),
        _mm_andnot_si128(bits_to_bytes(qh & 0xFFFF), f0),
    );
    let hi = _mm_or_si128(
        _mm_and_si128(_mm_srli_epi16::<4>(qs), m),
        _mm_andnot_si128(bits_to_bytes(qh >> 16), f0),
    );
    let (a, b) = i8x16_to_f32(lo);
    let (c, d) = i8x16_to_f32(hi);
    [a, b, c, d]
}

q32_kernels!(avx2; dot_q8_0, prep_q8_0, q_q8_0, 34);
q32_kernels!(avx2; dot_q4_0, prep_q4_0, q_q4_0, 18);
q32_kernels!(avx2; dot_q5_0, prep_q5_0, q_q5_0, 22);

/// The block-scale dot over a prepared row (`q`: `x.len()` integer values, `d`: one scale
/// per 32 elements); equals the fused `dot_*` of the row bit for bit.
pub(super) fn prep_dot(q: &[f32], d: &[f32], x: &[f32]) -> f32 {
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn inner(q: &[f32], d: &[f32], x: &[f32]) -> f32 {
        let (qp, xp) = (q.as_ptr(), x.as_ptr());
        let ld = |o: usize| -> Q { [0, 8, 16, 24].map(|k| _mm256_loadu_ps(qp.add(o + k))) };
        let mut a0 = _mm256_setzero_ps();
        let mut a1 = _mm256_setzero_ps();
        let nb = d.len();
        let mut b = 0;
        while b + 1 < nb {
            step(ld(32 * b), d[b], xp.add(32 * b), &mut a0);
            step(ld(32 * b + 32), d[b + 1], xp.add(32 * b + 32), &mut a1);
            b += 2;
        }
        if b < nb {
            step(ld(32 * b), d[b], xp.add(32 * b), &mut a0);
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
