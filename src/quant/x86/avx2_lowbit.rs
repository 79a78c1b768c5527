//! AVX2 in-register block decoders of the low-bit types that matter most for MoE experts:
//! Q2_K, Q3_K, Q5_K, IQ2_XXS and IQ4_XS. Each block is decoded 32 elements at a time with
//! the scalar decoders' roundings (`quant::scalar_k`, `quant::scalar_iq`: a product, then a
//! difference, never fused) and accumulated in the AVX2 level's order (element `32k + j` to
//! accumulator `j / 8`, lane `j % 8`), so the dots equal the decode-then-accumulate dots
//! (`lowbit`) and `dot_f32(dequantized, x)` bit for bit.

use std::arch::x86_64::*;

use super::common::{f16s, kernels, load16, no_tail, q4k_factors};
use crate::quant::iq_grids::{IQ2XXS_GRID, KSIGNS};
use crate::quant::scalar_iq::IQ4NL_VALUES;
use crate::quant::scalar_k::q3k_scales;

type Acc = [__m256; 4];

/// Either stores the 32 values at `dst` (`STORE`) or accumulates them against `x`.
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

/// The 16 bytes of `v` as f32: bytes 0..8 and 8..16 (unsigned).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn u8_f32(v: __m128i) -> (__m256, __m256) {
    (
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)),
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128::<8>(v))),
    )
}

/// The 16 bytes of `v` as f32: bytes 0..8 and 8..16 (signed).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn i8_f32(v: __m128i) -> (__m256, __m256) {
    (
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)),
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(v))),
    )
}

/// Bytes `(v >> s) & m` of a 16-byte vector (shift within 16-bit lanes, then mask).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bits(v: __m128i, s: i32, m: i8) -> __m128i {
    _mm_and_si128(_mm_srl_epi16(v, _mm_cvtsi32_si128(s)), _mm_set1_epi8(m))
}

/// `a * q - b` with one rounding each (no fma), as the scalar decoders compute.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn mul_sub(a: f32, q: __m256, b: f32) -> __m256 {
    _mm256_sub_ps(_mm256_mul_ps(_mm256_set1_ps(a), q), _mm256_set1_ps(b))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn blk_q2_k<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut Acc) {
    let (d, dmin) = (f16s(p.add(80)), f16s(p.add(82)));
    let mut dl = [0f32; 16];
    let mut ml = [0f32; 16];
    for (g, (a, m)) in dl.iter_mut().zip(ml.iter_mut()).enumerate() {
        let s = *p.add(g);
        *a = d * (s & 15) as f32;
        *m = dmin * (s >> 4) as f32;
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
        emit::<S>(w, x.wrapping_add(32 * r), dst.wrapping_add(32 * r), acc);
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn blk_q3_k<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut Acc) {
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
        emit::<S>(w, x.wrapping_add(32 * r), dst.wrapping_add(32 * r), acc);
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn blk_q5_k<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut Acc) {
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
        let w = [a, b, c, e].map(|v| mul_sub(ds[r], v, ms[r]));
        emit::<S>(w, x.wrapping_add(32 * r), dst.wrapping_add(32 * r), acc);
    }
}

/// Lane `j` of the result has bit 31 set when bit `j` of `signs` is (sign masks of 8 lanes).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn sign_mask(signs: u8) -> __m256 {
    let bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    let set = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(signs as i32), bit), bit);
    _mm256_castsi256_ps(_mm256_slli_epi32::<31>(_mm256_srli_epi32::<31>(set)))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn blk_iq2_xxs<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut Acc) {
    let d = f16s(p);
    for c in 0..8 {
        let a = (p.add(2 + 8 * c) as *const u32).read_unaligned().to_le();
        let s = (p.add(6 + 8 * c) as *const u32).read_unaligned().to_le();
        let db = _mm256_set1_ps(d * (0.5 + (s >> 28) as f32) * 0.25);
        let w = [0, 1, 2, 3].map(|k| {
            let g = IQ2XXS_GRID[((a >> (8 * k)) & 0xff) as usize];
            let v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(g as i64)));
            let m = sign_mask(KSIGNS[((s >> (7 * k)) & 127) as usize]);
            _mm256_xor_ps(_mm256_mul_ps(db, v), m)
        });
        emit::<S>(w, x.wrapping_add(32 * c), dst.wrapping_add(32 * c), acc);
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn blk_iq4_xs<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut Acc) {
    let d = f16s(p);
    let sh = (p.add(2) as *const u16).read_unaligned().to_le();
    let lut = _mm_loadu_si128(IQ4NL_VALUES.as_ptr() as *const __m128i);
    for i in 0..8 {
        let lo = (*p.add(4 + i / 2) >> (4 * (i % 2))) & 15;
        let ls = lo as i32 | (((sh >> (2 * i)) & 3) as i32) << 4;
        let dl = _mm256_set1_ps(d * (ls - 32) as f32);
        let qs = load16(p.add(8 + 16 * i));
        let (a, b) = i8_f32(_mm_shuffle_epi8(lut, bits(qs, 0, 15)));
        let (c, e) = i8_f32(_mm_shuffle_epi8(lut, bits(qs, 4, 15)));
        let w = [a, b, c, e].map(|v| _mm256_mul_ps(dl, v));
        emit::<S>(w, x.wrapping_add(32 * i), dst.wrapping_add(32 * i), acc);
    }
}

kernels!(avx2; dot_q2_k, deq_q2_k, blk_q2_k, 84, 256, 0, no_tail);
kernels!(avx2; dot_q3_k, deq_q3_k, blk_q3_k, 110, 256, 0, no_tail);
kernels!(avx2; dot_q5_k, deq_q5_k, blk_q5_k, 176, 256, 0, no_tail);
kernels!(avx2; dot_iq2_xxs, deq_iq2_xxs, blk_iq2_xxs, 66, 256, 0, no_tail);
kernels!(avx2; dot_iq4_xs, deq_iq4_xs, blk_iq4_xs, 136, 256, 0, no_tail);

/// The AVX2 low-bit tables (`EXT_TYPES` order): the in-register kernels above where there
/// is one, else the decode-then-accumulate dot (`lowbit`) and the scalar dequantization.
pub(super) const EXT_DOT: [crate::quant::DotFn; crate::quant::N_EXT] = {
    let mut t = super::lowbit::AVX2_DOT;
    t[2] = dot_q2_k;
    t[3] = dot_q3_k;
    t[4] = dot_q5_k;
    t[7] = dot_iq2_xxs;
    t[13] = dot_iq4_xs;
    t
};

/// See [`EXT_DOT`].
pub(super) const EXT_DEQ: [crate::quant::DeqFn; crate::quant::N_EXT] = {
    let mut t = crate::quant::SCALAR_DEQ_EXT;
    t[2] = deq_q2_k;
    t[3] = deq_q3_k;
    t[4] = deq_q5_k;
    t[7] = deq_iq2_xxs;
    t[13] = deq_iq4_xs;
    t
};
