//! AVX-512 (F + BW + VL) GFNI decoders of the 32-element, one-scale block types Q4_0 and
//! Q5_0: a block's 32 integer values (exact in f32), its nibbles decoded by GF(2) affine
//! maps instead of shifts and masks. The level's Q4_0 / Q5_0 dots (`avx512.rs`) scale them by
//! the block's f16 scale (one rounded product per element, as the plain decoders) and
//! accumulate them like every other dequantized block, so the GFNI table equals the plain one
//! bit for bit.

use super::common::{bit_matrix, load16};
use std::arch::x86_64::*;

/// A block's 32 values: elements 0..16 and 16..32.
pub(super) type Q = [__m512; 2];

/// Sign-extends the 16 bytes of `lo` (elements 0..16) and of `hi` (16..32) to f32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn i8x32_to_f32(lo: __m128i, hi: __m128i) -> Q {
    [
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)),
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi)),
    ]
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
pub(super) unsafe fn q_q4_0_gfni(p: *const u8) -> Q {
    let qs = load16(p.add(2));
    let lo = _mm_gf2p8affine_epi64_epi8::<0xF8>(qs, _mm_set1_epi64x(Q4_LO));
    let hi = _mm_gf2p8affine_epi64_epi8::<0xF8>(qs, _mm_set1_epi64x(Q4_HI));
    i8x32_to_f32(lo, hi)
}

/// The 32 integer values of the Q5_0 block at `p`: `nibble - 16` by a GF(2) affine map,
/// plus 16 where the fifth bit is set.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c,gfni")]
pub(super) unsafe fn q_q5_0_gfni(p: *const u8) -> Q {
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
