//! What the low-bit block decoders ([`EXT_TYPES`](crate::quant::EXT_TYPES): `lowbit_k`,
//! `lowbit_iq`) share; their kernel tables at the AVX2 and AVX-512 levels are
//! `lowbit_tables`.
//!
//! Every decoder turns the bytes of one block into 32 values at a time in four 8-lane
//! registers (never through memory) with the scalar decoders' roundings (`quant::scalar_k`,
//! `quant::scalar_iq`), then hands them to a [`Lanes`] accumulator, which either stores them
//! (dequantization) or multiplies them with the activations in its level's order: AVX2
//! element `32k + j` into accumulator `j / 8`, lane `j % 8`; AVX-512 element `32k + j` into
//! accumulator `j / 16`, lane `j % 16` (two 8-lane halves joined into one 16-lane register).
//! So each dot equals the level's `dot_f32(dequantized, x)` bit for bit, and the batched
//! GEMM (`row_plan`: the row decoded once into the per-thread scratch row, then the level's
//! f32 dot per token) reproduces it exactly.
//!
//! The decoders and [`Lanes::emit`] are `#[inline(always)]` without target features of their
//! own: they are compiled inside the level's row wrapper (`common::kernels!`), whose target
//! features (AVX2, or AVX-512) they take.

use std::arch::x86_64::*;

/// The accumulators of a level: `[__m256; 4]` (AVX2) or `[__m512; 2]` (AVX-512).
pub(super) trait Lanes {
    /// Stores the 32 values `w` at `dst` (`STORE`) or accumulates them against the 32
    /// activations at `x` (fma, in the level's lanes).
    ///
    /// # Safety
    /// The level's target features are enabled; `dst` (`STORE`) or `x` (otherwise) is
    /// valid for 32 f32s.
    unsafe fn emit<const STORE: bool>(&mut self, w: [__m256; 4], x: *const f32, dst: *mut f32);
}

impl Lanes for [__m256; 4] {
    #[inline(always)]
    unsafe fn emit<const STORE: bool>(&mut self, w: [__m256; 4], x: *const f32, dst: *mut f32) {
        for k in 0..4 {
            if STORE {
                _mm256_storeu_ps(dst.add(8 * k), w[k]);
            } else {
                self[k] = _mm256_fmadd_ps(w[k], _mm256_loadu_ps(x.add(8 * k)), self[k]);
            }
        }
    }
}

impl Lanes for [__m512; 2] {
    #[inline(always)]
    unsafe fn emit<const STORE: bool>(&mut self, w: [__m256; 4], x: *const f32, dst: *mut f32) {
        for k in 0..2 {
            if STORE {
                _mm256_storeu_ps(dst.add(16 * k), w[2 * k]);
                _mm256_storeu_ps(dst.add(16 * k + 8), w[2 * k + 1]);
            } else {
                let lo = _mm512_castpd256_pd512(_mm256_castps_pd(w[2 * k]));
                let v = _mm512_insertf64x4::<1>(lo, _mm256_castps_pd(w[2 * k + 1]));
                let v = _mm512_castpd_ps(v);
                self[k] = _mm512_fmadd_ps(v, _mm512_loadu_ps(x.add(16 * k)), self[k]);
            }
        }
    }
}

/// The 16 bytes of `v` as f32: bytes 0..8 and 8..16 (unsigned).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn u8_f32(v: __m128i) -> (__m256, __m256) {
    (
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)),
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128::<8>(v))),
    )
}

/// The 16 bytes of `v` as f32: bytes 0..8 and 8..16 (signed).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn i8_f32(v: __m128i) -> (__m256, __m256) {
    (
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)),
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(v))),
    )
}

/// The 8 bytes of `g` (byte `j` is lane `j`) as f32, unsigned.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn u8x8_f32(g: u64) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(g as i64)))
}

/// Bytes `(v >> s) & m` of a 16-byte vector (shift within 16-bit lanes, then mask).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn bits(v: __m128i, s: i32, m: i8) -> __m128i {
    _mm_and_si128(_mm_srl_epi16(v, _mm_cvtsi32_si128(s)), _mm_set1_epi8(m))
}

/// Byte `j` of the result is `0xFF` when bit `j` of `h` is set, else 0 (16 bit masks).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn bit_bytes(h: u16) -> __m128i {
    let v = _mm_shuffle_epi8(
        _mm_set1_epi16(h as i16),
        _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
    );
    let bit = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
    _mm_cmpeq_epi8(_mm_and_si128(v, bit), bit)
}

/// `a * q - b` with one rounding each (no fma), as the scalar decoders compute.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn mul_sub(a: f32, q: __m256, b: f32) -> __m256 {
    _mm256_sub_ps(_mm256_mul_ps(_mm256_set1_ps(a), q), _mm256_set1_ps(b))
}

/// A row's dot and dequantization `(DotFn, DeqFn)` at a level (`avx2`, `avx512`) from a
/// block decoder `$blk` of `$bb` bytes and `$be` elements (`common::kernels!`).
macro_rules! pair {
    ($lvl:ident; $blk:ident, $bb:expr, $be:expr) => {{
        $crate::quant::x86::common::kernels!($lvl; dot, deq, $blk, $bb, $be, 0,
            $crate::quant::x86::common::no_tail);
        (dot as $crate::quant::DotFn, deq as $crate::quant::DeqFn)
    }};
}
pub(super) use pair;

/// `a * q + b` with one rounding each (no fma), as the scalar decoders compute.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn mul_add(a: f32, q: __m256, b: f32) -> __m256 {
    _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(a), q), _mm256_set1_ps(b))
}

/// Lane `j` of the result has bit 31 set when bit `j` of `signs` is (sign masks of 8 lanes,
/// applied by xor: an exact negation, as the scalar decoders' `-w`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn sign_mask(signs: u8) -> __m256 {
    let bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    let set = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(signs as i32), bit), bit);
    _mm256_castsi256_ps(_mm256_slli_epi32::<31>(_mm256_srli_epi32::<31>(set)))
}

/// `db * grid`, negated in the lanes whose bit of `signs` is set: 8 elements of the IQ2 /
/// IQ3 codebook types (`scalar_iq::put8`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn signed8(db: __m256, grid: u64, signs: u8) -> __m256 {
    _mm256_xor_ps(_mm256_mul_ps(db, u8x8_f32(grid)), sign_mask(signs))
}
