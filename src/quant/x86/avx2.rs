//! AVX2 + FMA + F16C kernels. Accumulation: element `32k + j` of a row goes to accumulator
//! `j / 8`, lane `j % 8` (fused multiply-add); the reduction is `(a0 + a1) + (a2 + a3)`,
//! then halves 128 → 64 → 32 bits. Blocks are decoded in registers with the same roundings
//! as the scalar decoders, so dequantization is exact and `dot_f32(dequantized, x)` equals
//! the fused dot bit for bit.

use super::avx2_q32 as q32;
use super::common::{
    deq_kernel, dot_f32_as_row, f16s, kernels, level_table, load16, mxfp4_values, no_tail,
    q4k_factors, q6k_factors,
};
use super::tile_avx2 as tile;
use crate::quant::scalar::{decode_bf16, decode_f16, decode_f32, e8m0_half};
use crate::quant::LevelKernels;
use std::arch::x86_64::*;

type Acc = [__m256; 4];

/// Either stores the 32 decoded values at `dst` (`STORE`) or accumulates them against `x`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn emit<const STORE: bool>(w: [__m256; 4], x: *const f32, dst: *mut f32, acc: &mut Acc) {
    for k in 0..4 {
        if STORE {
            _mm256_storeu_ps(dst.add(8 * k), w[k]);
        } else {
            acc[k] = _mm256_fmadd_ps(w[k], _mm256_loadu_ps(x.add(8 * k)), acc[k]);
        }
    }
}

/// Zero-extends the 16 bytes of `v` into two vectors of 8 i32 (bytes 0..8, 8..16).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn widen(v: __m128i) -> (__m256i, __m256i) {
    (
        _mm256_cvtepu8_epi32(v),
        _mm256_cvtepu8_epi32(_mm_srli_si128::<8>(v)),
    )
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scaled(d: __m256, q: __m256i) -> __m256 {
    _mm256_mul_ps(d, _mm256_cvtepi32_ps(q))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn blk_f32<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut Acc) {
    let f = p as *const f32;
    let w = [
        _mm256_loadu_ps(f),
        _mm256_loadu_ps(f.add(8)),
        _mm256_loadu_ps(f.add(16)),
        _mm256_loadu_ps(f.add(24)),
    ];
    emit::<S>(w, x, dst, acc);
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn blk_f16<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut Acc) {
    let w = [0, 16, 32, 48].map(|o| _mm256_cvtph_ps(load16(p.add(o))));
    emit::<S>(w, x, dst, acc);
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn blk_bf16<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut Acc) {
    let w = [0, 16, 32, 48].map(|o| {
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(load16(
            p.add(o),
        ))))
    });
    emit::<S>(w, x, dst, acc);
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn blk_q8_0<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut Acc) {
    let d = _mm256_set1_ps(f16s(p));
    let a = load16(p.add(2));
    let b = load16(p.add(18));
    let w = [
        scaled(d, _mm256_cvtepi8_epi32(a)),
        scaled(d, _mm256_cvtepi8_epi32(_mm_srli_si128::<8>(a))),
        scaled(d, _mm256_cvtepi8_epi32(b)),
        scaled(d, _mm256_cvtepi8_epi32(_mm_srli_si128::<8>(b))),
    ];
    emit::<S>(w, x, dst, acc);
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn blk_q4_0<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut Acc) {
    let d = _mm256_set1_ps(f16s(p));
    let qs = load16(p.add(2));
    let m = _mm_set1_epi8(15);
    let (l0, l1) = widen(_mm_and_si128(qs, m));
    let (h0, h1) = widen(_mm_and_si128(_mm_srli_epi16::<4>(qs), m));
    let e = _mm256_set1_epi32(8);
    let w = [l0, l1, h0, h1].map(|q| scaled(d, _mm256_sub_epi32(q, e)));
    emit::<S>(w, x, dst, acc);
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn blk_q5_0<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut Acc) {
    let d = _mm256_set1_ps(f16s(p));
    let qh = (p.add(2) as *const u32).read_unaligned().to_le();
    let qs = load16(p.add(6));
    let m = _mm_set1_epi8(15);
    let (l0, l1) = widen(_mm_and_si128(qs, m));
    let (h0, h1) = widen(_mm_and_si128(_mm_srli_epi16::<4>(qs), m));
    let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let one = _mm256_set1_epi32(1);
    let b4 = _mm256_set1_epi32(16);
    let q = [(l0, 0), (l1, 8), (h0, 16), (h1, 24)];
    let w = q.map(|(v, j)| {
        let bits = _mm256_srlv_epi32(_mm256_set1_epi32((qh >> j) as i32), lanes);
        let hb = _mm256_slli_epi32::<4>(_mm256_and_si256(bits, one));
        scaled(d, _mm256_sub_epi32(_mm256_or_si256(v, hb), b4))
    });
    emit::<S>(w, x, dst, acc);
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn blk_mxfp4<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut Acc) {
    let d = _mm256_set1_ps(e8m0_half(*p));
    let (lo, hi) = mxfp4_values(load16(p.add(1)));
    let w = [lo, _mm_srli_si128::<8>(lo), hi, _mm_srli_si128::<8>(hi)]
        .map(|v| scaled(d, _mm256_cvtepi8_epi32(v)));
    emit::<S>(w, x, dst, acc);
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn blk_q4_k<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut Acc) {
    let (ds, ms) = q4k_factors(p);
    let m = _mm_set1_epi8(15);
    for g in 0..4 {
        let a0 = load16(p.add(16 + 32 * g));
        let a1 = load16(p.add(32 + 32 * g));
        for h in 0..2 {
            let r = 2 * g + h;
            let d1 = _mm256_set1_ps(ds[r]);
            let m1 = _mm256_set1_ps(ms[r]);
            let (n0, n1) = if h == 0 {
                (_mm_and_si128(a0, m), _mm_and_si128(a1, m))
            } else {
                (
                    _mm_and_si128(_mm_srli_epi16::<4>(a0), m),
                    _mm_and_si128(_mm_srli_epi16::<4>(a1), m),
                )
            };
            let (q0, q1) = widen(n0);
            let (q2, q3) = widen(n1);
            let w = [q0, q1, q2, q3].map(|q| _mm256_sub_ps(scaled(d1, q), m1));
            emit::<S>(w, x.wrapping_add(32 * r), dst.wrapping_add(32 * r), acc);
        }
    }
}

/// 8 Q6_K values (before the -32 offset) of chunk `c` of a half, elements `8 k..8 k + 8`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_8(ql: *const u8, qh: *const u8, c: usize, k: usize) -> __m256i {
    let l = _mm256_cvtepu8_epi32(_mm_loadl_epi64(
        ql.add(16 * (c & 3) + 8 * k) as *const __m128i
    ));
    let h = _mm256_cvtepu8_epi32(_mm_loadl_epi64(
        qh.add(16 * (c & 1) + 8 * k) as *const __m128i
    ));
    let l = _mm256_srl_epi32(l, _mm_cvtsi32_si128(4 * (c >> 2) as i32));
    let h = _mm256_srl_epi32(h, _mm_cvtsi32_si128(2 * (c >> 1) as i32));
    let l = _mm256_and_si256(l, _mm256_set1_epi32(15));
    let h = _mm256_and_si256(h, _mm256_set1_epi32(3));
    _mm256_or_si256(l, _mm256_slli_epi32::<4>(h))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn blk_q6_k<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut Acc) {
    let f = q6k_factors(p);
    let off = _mm256_set1_epi32(32);
    for h in 0..2 {
        let ql = p.add(64 * h);
        let qh = p.add(128 + 32 * h);
        for c in (0..8).step_by(2) {
            let d0 = _mm256_set1_ps(f[8 * h + c]);
            let d1 = _mm256_set1_ps(f[8 * h + c + 1]);
            let w = [
                scaled(d0, _mm256_sub_epi32(q6_8(ql, qh, c, 0), off)),
                scaled(d0, _mm256_sub_epi32(q6_8(ql, qh, c, 1), off)),
                scaled(d1, _mm256_sub_epi32(q6_8(ql, qh, c + 1, 0), off)),
                scaled(d1, _mm256_sub_epi32(q6_8(ql, qh, c + 1, 1), off)),
            ];
            let e = 128 * h + 16 * c;
            emit::<S>(w, x.wrapping_add(e), dst.wrapping_add(e), acc);
        }
    }
}

kernels!(avx2; dot_f32row, deq_f32, blk_f32, 4, 1, 4, decode_f32);
kernels!(avx2; dot_f16, deq_f16, blk_f16, 2, 1, 2, decode_f16);
kernels!(avx2; dot_bf16, deq_bf16, blk_bf16, 2, 1, 2, decode_bf16);
deq_kernel!(avx2; deq_q8_0, blk_q8_0, 34, 32, 0, no_tail);
deq_kernel!(avx2; deq_q4_0, blk_q4_0, 18, 32, 0, no_tail);
deq_kernel!(avx2; deq_q5_0, blk_q5_0, 22, 32, 0, no_tail);
kernels!(avx2; dot_q4_k, deq_q4_k, blk_q4_k, 144, 256, 0, no_tail);
kernels!(avx2; dot_q6_k, deq_q6_k, blk_q6_k, 210, 256, 0, no_tail);
kernels!(avx2; dot_mxfp4, deq_mxfp4, blk_mxfp4, 17, 32, 0, no_tail);

// The low-bit types' dots and dequantization (`EXT_TYPES` order).
use super::lowbit_tables::{AVX2_DEQ as EXT_DEQ, AVX2_DOT as EXT_DOT};

/// f32 · f32 in this level's order (F32 rows are the same computation).
fn dot_f32(w: &[f32], x: &[f32]) -> f32 {
    dot_f32_as_row(dot_f32row, w, x)
}

/// The AVX2 table. Only returned by `level_kernels` after detection.
pub(crate) static KERNELS: LevelKernels = level_table!();
