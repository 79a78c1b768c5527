//! In-register block decoders of the legacy-with-minimum types (Q4_1, Q5_1), the k-quants
//! Q2_K, Q3_K and Q5_K, and the ternary types TQ1_0 / TQ2_0, with their AVX2 and AVX-512
//! kernels (see `lowbit` for the scheme).
//!
//! Layouts: ggml `ggml-common.h` (`block_q4_1`, `block_q5_1`, `block_q2_K`, `block_q3_K`,
//! `block_q5_K`, `block_tq1_0`, `block_tq2_0`); values and roundings: `quant::scalar_k`
//! (checked against gguf-py's `gguf.quants` bit for bit). Each decoder computes exactly the
//! scalar formula there, one f32 rounding per operation, never fused.

use std::arch::x86_64::*;

use super::common::{f16s, load16, q4k_factors};
use super::lowbit::{bit_bytes, bits, i8_f32, mul_add, mul_sub, pair, u8_f32, Lanes};
use crate::quant::scalar_k::q3k_scales;
use crate::quant::{DeqFn, DotFn};

/// Q4_1 (20 bytes, 32 elements): `d * q + m`, nibbles in the Q4_0 order.
#[inline(always)]
unsafe fn blk_q4_1<const S: bool>(
    p: *const u8,
    x: *const f32,
    dst: *mut f32,
    acc: &mut impl Lanes,
) {
    let (d, m) = (f16s(p), f16s(p.add(2)));
    let qs = load16(p.add(4));
    let (a, b) = u8_f32(bits(qs, 0, 15));
    let (c, e) = u8_f32(bits(qs, 4, 15));
    let w = [
        mul_add(d, a, m),
        mul_add(d, b, m),
        mul_add(d, c, m),
        mul_add(d, e, m),
    ];
    acc.emit::<S>(w, x, dst);
}

/// Q5_1 (24 bytes, 32 elements): as Q4_1 with fifth bit `j` of the u32 `qh` for element `j`.
#[inline(always)]
unsafe fn blk_q5_1<const S: bool>(
    p: *const u8,
    x: *const f32,
    dst: *mut f32,
    acc: &mut impl Lanes,
) {
    let (d, m) = (f16s(p), f16s(p.add(2)));
    let qh = (p.add(4) as *const u32).read_unaligned().to_le();
    let qs = load16(p.add(8));
    let b4 = _mm_set1_epi8(16);
    let lo = _mm_or_si128(bits(qs, 0, 15), _mm_and_si128(bit_bytes(qh as u16), b4));
    let hi = _mm_or_si128(
        bits(qs, 4, 15),
        _mm_and_si128(bit_bytes((qh >> 16) as u16), b4),
    );
    let (a, b) = u8_f32(lo);
    let (c, e) = u8_f32(hi);
    let w = [
        mul_add(d, a, m),
        mul_add(d, b, m),
        mul_add(d, c, m),
        mul_add(d, e, m),
    ];
    acc.emit::<S>(w, x, dst);
}

/// Q2_K (84 bytes, 256 elements): `(d * (s & 15)) * q - dmin * (s >> 4)` per 16-element
/// group with scale byte `s`; 2-bit values as `scalar_k::two_bits`.
#[inline(always)]
unsafe fn blk_q2_k<const S: bool>(
    p: *const u8,
    x: *const f32,
    dst: *mut f32,
    acc: &mut impl Lanes,
) {
    let (d, dmin) = (f16s(p.add(80)), f16s(p.add(82)));
    let mut dl = [0f32; 16];
    let mut ml = [0f32; 16];
    for g in 0..16 {
        let s = *p.add(g);
        dl[g] = d * (s & 15) as f32;
        ml[g] = dmin * (s >> 4) as f32;
    }
    for r in 0..8 {
        let (h, s) = (r / 4, r % 4);
        let q0 = bits(load16(p.add(16 + 32 * h)), 2 * s as i32, 3);
        let q1 = bits(load16(p.add(32 + 32 * h)), 2 * s as i32, 3);
        let (a, b) = u8_f32(q0);
        let (c, e) = u8_f32(q1);
        let g = 8 * h + 2 * s;
        let w = [
            mul_sub(dl[g], a, ml[g]),
            mul_sub(dl[g], b, ml[g]),
            mul_sub(dl[g + 1], c, ml[g + 1]),
            mul_sub(dl[g + 1], e, ml[g + 1]),
        ];
        acc.emit::<S>(w, x.wrapping_add(32 * r), dst.wrapping_add(32 * r));
    }
}

/// Q3_K (110 bytes, 256 elements): `(d * sc) * q` with `q = two_bits - 4` unless the
/// element's `hmask` bit is set (`scalar_k::decode_q3_k`).
#[inline(always)]
unsafe fn blk_q3_k<const S: bool>(
    p: *const u8,
    x: *const f32,
    dst: *mut f32,
    acc: &mut impl Lanes,
) {
    let d = f16s(p.add(108));
    let sc = q3k_scales(std::slice::from_raw_parts(p.add(96), 12));
    let four = _mm_set1_epi8(4);
    for r in 0..8 {
        let (h, s) = (r / 4, r % 4);
        let mut q = [_mm_setzero_si128(); 2];
        for (half, v) in q.iter_mut().enumerate() {
            let lo = bits(load16(p.add(32 + 32 * h + 16 * half)), 2 * s as i32, 3);
            let hb = bits(load16(p.add(16 * half)), (4 * h + s) as i32, 1);
            // q2 | hbit << 2, minus 4: −4..3
            *v = _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16::<2>(hb)), four);
        }
        let (a, b) = i8_f32(q[0]);
        let (c, e) = i8_f32(q[1]);
        let g = 8 * h + 2 * s;
        let (d0, d1) = (
            _mm256_set1_ps(d * sc[g] as f32),
            _mm256_set1_ps(d * sc[g + 1] as f32),
        );
        let w = [
            _mm256_mul_ps(d0, a),
            _mm256_mul_ps(d0, b),
            _mm256_mul_ps(d1, c),
            _mm256_mul_ps(d1, e),
        ];
        acc.emit::<S>(w, x.wrapping_add(32 * r), dst.wrapping_add(32 * r));
    }
}

/// Q5_K (176 bytes, 256 elements): `(d * sc[r]) * q - dmin * m[r]` per 32-element
/// sub-block `r`, nibbles as Q4_K plus fifth bit `(qh[l] >> r) & 1`.
#[inline(always)]
unsafe fn blk_q5_k<const S: bool>(
    p: *const u8,
    x: *const f32,
    dst: *mut f32,
    acc: &mut impl Lanes,
) {
    // d, dmin and the 12 scale bytes sit where Q4_K has them
    let (ds, ms) = q4k_factors(p);
    for r in 0..8 {
        let mut q = [_mm_setzero_si128(); 2];
        for (half, v) in q.iter_mut().enumerate() {
            let nib = bits(
                load16(p.add(48 + 32 * (r / 2) + 16 * half)),
                4 * (r & 1) as i32,
                15,
            );
            let hb = bits(load16(p.add(16 + 16 * half)), r as i32, 1);
            *v = _mm_or_si128(nib, _mm_slli_epi16::<4>(hb));
        }
        let (a, b) = u8_f32(q[0]);
        let (c, e) = u8_f32(q[1]);
        let w = [
            mul_sub(ds[r], a, ms[r]),
            mul_sub(ds[r], b, ms[r]),
            mul_sub(ds[r], c, ms[r]),
            mul_sub(ds[r], e, ms[r]),
        ];
        acc.emit::<S>(w, x.wrapping_add(32 * r), dst.wrapping_add(32 * r));
    }
}

/// The 16 ternary digits of the bytes of `v`, digit `n` of byte `j` selected by the
/// multiplier `3^n` in 16-bit lane `j` of `pw` (`scalar_k::trit`: `((b * 3^n mod 256) * 3)
/// >> 8`, minus 1), as f32: elements 0..8 and 8..16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn trits(v: __m128i, pw: __m256i) -> (__m256, __m256) {
    let q = _mm256_and_si256(
        _mm256_mullo_epi16(_mm256_cvtepu8_epi16(v), pw),
        _mm256_set1_epi16(0xFF),
    );
    let t = _mm256_srli_epi16::<8>(_mm256_mullo_epi16(q, _mm256_set1_epi16(3)));
    let t = _mm256_sub_epi16(t, _mm256_set1_epi16(1));
    (
        _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(t))),
        _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256::<1>(t))),
    )
}

/// TQ1_0 (54 bytes, 256 elements): `d * trit` with the digits laid out as in
/// `scalar_k::decode_tq1_0` (5 digits of `qs[0..32]`, 5 of `qs[32..48]`, 4 of `qh`).
#[inline(always)]
unsafe fn blk_tq1_0<const S: bool>(
    p: *const u8,
    x: *const f32,
    dst: *mut f32,
    acc: &mut impl Lanes,
) {
    const POW3: [i16; 5] = [1, 3, 9, 27, 81];
    let d = _mm256_set1_ps(f16s(p.add(52)));
    let (lo, hi) = (load16(p), load16(p.add(16)));
    let mid = load16(p.add(32));
    let qh = _mm_set1_epi32((p.add(48) as *const i32).read_unaligned());
    let mut pw = [_mm256_setzero_si256(); 5];
    for (v, &m) in pw.iter_mut().zip(&POW3) {
        *v = _mm256_set1_epi16(m);
    }
    let qh_pw = _mm256_setr_epi16(1, 1, 1, 1, 3, 3, 3, 3, 9, 9, 9, 9, 27, 27, 27, 27);
    for r in 0..8 {
        let ((a, b), (c, e)) = match r {
            0..5 => (trits(lo, pw[r]), trits(hi, pw[r])),
            5 => (trits(mid, pw[0]), trits(mid, pw[1])),
            6 => (trits(mid, pw[2]), trits(mid, pw[3])),
            _ => (trits(mid, pw[4]), trits(qh, qh_pw)),
        };
        let w = [
            _mm256_mul_ps(d, a),
            _mm256_mul_ps(d, b),
            _mm256_mul_ps(d, c),
            _mm256_mul_ps(d, e),
        ];
        acc.emit::<S>(w, x.wrapping_add(32 * r), dst.wrapping_add(32 * r));
    }
}

/// TQ2_0 (66 bytes, 256 elements): `d * (two_bits - 1)`, 2-bit values laid out as Q2_K's.
#[inline(always)]
unsafe fn blk_tq2_0<const S: bool>(
    p: *const u8,
    x: *const f32,
    dst: *mut f32,
    acc: &mut impl Lanes,
) {
    let d = _mm256_set1_ps(f16s(p.add(64)));
    let one = _mm_set1_epi8(1);
    for r in 0..8 {
        let (h, s) = (r / 4, r % 4);
        let q0 = _mm_sub_epi8(bits(load16(p.add(32 * h)), 2 * s as i32, 3), one);
        let q1 = _mm_sub_epi8(bits(load16(p.add(32 * h + 16)), 2 * s as i32, 3), one);
        let (a, b) = i8_f32(q0);
        let (c, e) = i8_f32(q1);
        let w = [
            _mm256_mul_ps(d, a),
            _mm256_mul_ps(d, b),
            _mm256_mul_ps(d, c),
            _mm256_mul_ps(d, e),
        ];
        acc.emit::<S>(w, x.wrapping_add(32 * r), dst.wrapping_add(32 * r));
    }
}

/// The AVX2 (dot, dequantization) pairs: Q4_1, Q5_1, Q2_K, Q3_K, Q5_K, TQ1_0, TQ2_0.
pub(super) const AVX2: [(DotFn, DeqFn); 7] = [
    pair!(avx2; blk_q4_1, 20, 32),
    pair!(avx2; blk_q5_1, 24, 32),
    pair!(avx2; blk_q2_k, 84, 256),
    pair!(avx2; blk_q3_k, 110, 256),
    pair!(avx2; blk_q5_k, 176, 256),
    pair!(avx2; blk_tq1_0, 54, 256),
    pair!(avx2; blk_tq2_0, 66, 256),
];

/// The AVX-512 pairs, same order as [`AVX2`].
pub(super) const AVX512: [(DotFn, DeqFn); 7] = [
    pair!(avx512; blk_q4_1, 20, 32),
    pair!(avx512; blk_q5_1, 24, 32),
    pair!(avx512; blk_q2_k, 84, 256),
    pair!(avx512; blk_q3_k, 110, 256),
    pair!(avx512; blk_q5_k, 176, 256),
    pair!(avx512; blk_tq1_0, 54, 256),
    pair!(avx512; blk_tq2_0, 66, 256),
];
