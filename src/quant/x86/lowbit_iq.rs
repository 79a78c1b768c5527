//! In-register block decoders of the importance-matrix ("IQ") types: IQ1_S, IQ1_M, IQ2_XXS,
//! IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL and IQ4_XS, with their AVX2 and AVX-512 kernels
//! (see `lowbit` for the scheme).
//!
//! Layouts: ggml `ggml-common.h` (`block_iq1_s` ... `block_iq4_xs`, codebooks in
//! `quant::iq_grids` / `quant::iq1_grid`); values and roundings: `quant::scalar_iq` (checked
//! against gguf-py's `gguf.quants` bit for bit). Each 8-element group is looked up in its
//! codebook (one u64, or two u32 for the 4-element IQ3 points), widened in a register,
//! scaled and signed exactly as the scalar decoder does.

use std::arch::x86_64::*;

use super::common::{f16s, load16};
use super::lowbit::{bits, i8_f32, pair, signed8, Lanes};
use crate::quant::iq1_grid::IQ1S_GRID;
use crate::quant::iq_grids::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS};
use crate::quant::scalar::f16_to_f32;
use crate::quant::scalar_iq::IQ4NL_VALUES;
use crate::quant::{DeqFn, DotFn};

/// Little-endian u16 / u32 at `p`.
#[inline(always)]
unsafe fn u16_at(p: *const u8) -> u16 {
    (p as *const u16).read_unaligned().to_le()
}
#[inline(always)]
unsafe fn u32_at(p: *const u8) -> u32 {
    (p as *const u32).read_unaligned().to_le()
}

/// `dl * (grid + delta)` for the 8 signed bytes of an IQ1 grid point (`scalar_iq::put8_iq1`:
/// an exact add, then one product).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn iq1_8(dl: f32, grid: u64, delta: f32) -> __m256 {
    let g = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(grid as i64)));
    _mm256_mul_ps(_mm256_set1_ps(dl), _mm256_add_ps(g, _mm256_set1_ps(delta)))
}

/// The IQ1 delta: `−0.125` when `neg`, else `0.125` (ggml `IQ1S_DELTA`).
#[inline(always)]
fn iq1_delta(neg: bool) -> f32 {
    if neg {
        -0.125
    } else {
        0.125
    }
}

/// IQ1_S (50 bytes): chunk `c` scale and delta from `qh[c]`, 8-element group `g` grid point
/// `idx[g] | 3 bits of qh << 8` (`scalar_iq::decode_iq1_s`).
#[inline(always)]
unsafe fn blk_iq1_s<const S: bool>(
    p: *const u8,
    x: *const f32,
    dst: *mut f32,
    acc: &mut impl Lanes,
) {
    let d = f16s(p);
    for c in 0..8 {
        let qh = u16_at(p.add(34 + 2 * c));
        let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
        let delta = iq1_delta(qh & 0x8000 != 0);
        let mut w = [_mm256_setzero_ps(); 4];
        for (k, v) in w.iter_mut().enumerate() {
            let idx = *p.add(2 + 4 * c + k) as usize | (((qh >> (3 * k)) & 7) as usize) << 8;
            *v = iq1_8(dl, IQ1S_GRID[idx], delta);
        }
        acc.emit::<S>(w, x.wrapping_add(32 * c), dst.wrapping_add(32 * c));
    }
}

/// IQ1_M (56 bytes): `d` from the top nibbles of the four u16 scales, 3-bit scale per
/// 16 elements, grid high bits and delta sign per 8 (`scalar_iq::decode_iq1_m`).
#[inline(always)]
unsafe fn blk_iq1_m<const S: bool>(
    p: *const u8,
    x: *const f32,
    dst: *mut f32,
    acc: &mut impl Lanes,
) {
    let sc = [
        u16_at(p.add(48)),
        u16_at(p.add(50)),
        u16_at(p.add(52)),
        u16_at(p.add(54)),
    ];
    let dbits = (sc[0] >> 12) | ((sc[1] >> 8) & 0xF0) | ((sc[2] >> 4) & 0xF00) | (sc[3] & 0xF000);
    let d = f16_to_f32(dbits);
    for c in 0..8 {
        let mut w = [_mm256_setzero_ps(); 4];
        for (k, v) in w.iter_mut().enumerate() {
            let g = 4 * c + k;
            let i = g / 2;
            let s = (sc[i / 4] >> (3 * (i % 4))) & 7;
            let dl = d * (2 * s + 1) as f32;
            let n = (*p.add(32 + g / 2) >> (4 * (g % 2))) & 15;
            let idx = *p.add(g) as usize | ((n & 7) as usize) << 8;
            *v = iq1_8(dl, IQ1S_GRID[idx], iq1_delta(n & 8 != 0));
        }
        acc.emit::<S>(w, x.wrapping_add(32 * c), dst.wrapping_add(32 * c));
    }
}

/// IQ2_XXS (66 bytes): chunk `c` is (u32 `a`: four grid indices, u32 `s`: four 7-bit sign
/// indices and the 4-bit scale) (`scalar_iq::decode_iq2_xxs`).
#[inline(always)]
unsafe fn blk_iq2_xxs<const S: bool>(
    p: *const u8,
    x: *const f32,
    dst: *mut f32,
    acc: &mut impl Lanes,
) {
    let d = f16s(p);
    for c in 0..8 {
        let a = u32_at(p.add(2 + 8 * c));
        let s = u32_at(p.add(6 + 8 * c));
        let db = _mm256_set1_ps(d * (0.5 + (s >> 28) as f32) * 0.25);
        let mut w = [_mm256_setzero_ps(); 4];
        for (k, v) in w.iter_mut().enumerate() {
            let g = IQ2XXS_GRID[((a >> (8 * k)) & 0xff) as usize];
            *v = signed8(db, g, KSIGNS[((s >> (7 * k)) & 127) as usize]);
        }
        acc.emit::<S>(w, x.wrapping_add(32 * c), dst.wrapping_add(32 * c));
    }
}

/// The two IQ2_XS / IQ2_S scales of chunk `c` from its scale byte `sb`:
/// `d * (0.5 + nibble) * 0.25` (low nibble: groups 0, 1; high: groups 2, 3).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn iq2_scales(d: f32, sb: u8) -> [__m256; 2] {
    [
        _mm256_set1_ps(d * (0.5 + (sb & 15) as f32) * 0.25),
        _mm256_set1_ps(d * (0.5 + (sb >> 4) as f32) * 0.25),
    ]
}

/// IQ2_XS (74 bytes): 8-element group `g` is the u16 `q`: grid point `q & 511`, signs
/// `KSIGNS[q >> 9]` (`scalar_iq::decode_iq2_xs`).
#[inline(always)]
unsafe fn blk_iq2_xs<const S: bool>(
    p: *const u8,
    x: *const f32,
    dst: *mut f32,
    acc: &mut impl Lanes,
) {
    let d = f16s(p);
    for c in 0..8 {
        let db = iq2_scales(d, *p.add(66 + c));
        let mut w = [_mm256_setzero_ps(); 4];
        for (k, v) in w.iter_mut().enumerate() {
            let q = u16_at(p.add(2 + 2 * (4 * c + k)));
            let g = IQ2XS_GRID[(q & 511) as usize];
            *v = signed8(db[k / 2], g, KSIGNS[(q >> 9) as usize]);
        }
        acc.emit::<S>(w, x.wrapping_add(32 * c), dst.wrapping_add(32 * c));
    }
}

/// IQ2_S (82 bytes): group `g` is grid point `idx[g] | 2 bits of qh << 8`, sign byte `g`
/// (`scalar_iq::decode_iq2_s`).
#[inline(always)]
unsafe fn blk_iq2_s<const S: bool>(
    p: *const u8,
    x: *const f32,
    dst: *mut f32,
    acc: &mut impl Lanes,
) {
    let d = f16s(p);
    for c in 0..8 {
        let db = iq2_scales(d, *p.add(74 + c));
        let qh = *p.add(66 + c);
        let mut w = [_mm256_setzero_ps(); 4];
        for (k, v) in w.iter_mut().enumerate() {
            let g = 4 * c + k;
            let idx = *p.add(2 + g) as usize | (((qh >> (2 * k)) & 3) as usize) << 8;
            *v = signed8(db[k / 2], IQ2S_GRID[idx], *p.add(34 + g));
        }
        acc.emit::<S>(w, x.wrapping_add(32 * c), dst.wrapping_add(32 * c));
    }
}

/// IQ3_XXS (98 bytes): chunk `c` has u32 `s` (four 7-bit sign indices, 4-bit scale);
/// 8-element group `k` is the grid points `idx[8c + 2k]`, `idx[8c + 2k + 1]`
/// (`scalar_iq::decode_iq3_xxs`).
#[inline(always)]
unsafe fn blk_iq3_xxs<const S: bool>(
    p: *const u8,
    x: *const f32,
    dst: *mut f32,
    acc: &mut impl Lanes,
) {
    let d = f16s(p);
    for c in 0..8 {
        let s = u32_at(p.add(66 + 4 * c));
        let db = _mm256_set1_ps(d * (0.5 + (s >> 28) as f32) * 0.5);
        let mut w = [_mm256_setzero_ps(); 4];
        for (k, v) in w.iter_mut().enumerate() {
            let i = 2 + 8 * c + 2 * k;
            let g = IQ3XXS_GRID[*p.add(i) as usize] as u64
                | (IQ3XXS_GRID[*p.add(i + 1) as usize] as u64) << 32;
            *v = signed8(db, g, KSIGNS[((s >> (7 * k)) & 127) as usize]);
        }
        acc.emit::<S>(w, x.wrapping_add(32 * c), dst.wrapping_add(32 * c));
    }
}

/// IQ3_S (110 bytes): chunk `c` has scale `d * (1 + 2 s)`, 4-element group `g` grid point
/// `idx[g] | bit g % 8 of qh[c] << 8`, sign byte per 8 elements (`scalar_iq::decode_iq3_s`).
#[inline(always)]
unsafe fn blk_iq3_s<const S: bool>(
    p: *const u8,
    x: *const f32,
    dst: *mut f32,
    acc: &mut impl Lanes,
) {
    let d = f16s(p);
    for c in 0..8 {
        let s = (*p.add(106 + c / 2) >> (4 * (c % 2))) & 15;
        let db = _mm256_set1_ps(d * (1 + 2 * s as u32) as f32);
        let qh = *p.add(66 + c) as usize;
        let mut w = [_mm256_setzero_ps(); 4];
        for (k, v) in w.iter_mut().enumerate() {
            let i = 8 * c + 2 * k;
            let lo = *p.add(2 + i) as usize | ((qh >> (2 * k)) & 1) << 8;
            let hi = *p.add(3 + i) as usize | ((qh >> (2 * k + 1)) & 1) << 8;
            let g = IQ3S_GRID[lo] as u64 | (IQ3S_GRID[hi] as u64) << 32;
            *v = signed8(db, g, *p.add(74 + 4 * c + k));
        }
        acc.emit::<S>(w, x.wrapping_add(32 * c), dst.wrapping_add(32 * c));
    }
}

/// The 32 IQ4 levels of 16 nibble bytes `qs` (Q4_0 order: low nibbles are elements 0..16)
/// times `dl` (`scalar_iq::decode_iq4_nl`: one product each).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4_32(dl: __m256, qs: __m128i) -> [__m256; 4] {
    let lut = _mm_loadu_si128(IQ4NL_VALUES.as_ptr() as *const __m128i);
    let (a, b) = i8_f32(_mm_shuffle_epi8(lut, bits(qs, 0, 15)));
    let (c, e) = i8_f32(_mm_shuffle_epi8(lut, bits(qs, 4, 15)));
    [
        _mm256_mul_ps(dl, a),
        _mm256_mul_ps(dl, b),
        _mm256_mul_ps(dl, c),
        _mm256_mul_ps(dl, e),
    ]
}

/// IQ4_NL (18 bytes, 32 elements): `d * IQ4NL_VALUES[q]`.
#[inline(always)]
unsafe fn blk_iq4_nl<const S: bool>(
    p: *const u8,
    x: *const f32,
    dst: *mut f32,
    acc: &mut impl Lanes,
) {
    let w = iq4_32(_mm256_set1_ps(f16s(p)), load16(p.add(2)));
    acc.emit::<S>(w, x, dst);
}

/// IQ4_XS (136 bytes): sub-block `i` has 6-bit scale `ls` and `(d * (ls − 32)) *
/// IQ4NL_VALUES[q]` (`scalar_iq::decode_iq4_xs`).
#[inline(always)]
unsafe fn blk_iq4_xs<const S: bool>(
    p: *const u8,
    x: *const f32,
    dst: *mut f32,
    acc: &mut impl Lanes,
) {
    let d = f16s(p);
    let sh = u16_at(p.add(2));
    for i in 0..8 {
        let lo = (*p.add(4 + i / 2) >> (4 * (i % 2))) & 15;
        let ls = lo as i32 | (((sh >> (2 * i)) & 3) as i32) << 4;
        let dl = _mm256_set1_ps(d * (ls - 32) as f32);
        let w = iq4_32(dl, load16(p.add(8 + 16 * i)));
        acc.emit::<S>(w, x.wrapping_add(32 * i), dst.wrapping_add(32 * i));
    }
}

/// The AVX2 (dot, dequantization) pairs: IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
/// IQ3_S, IQ4_NL, IQ4_XS.
pub(super) const AVX2: [(DotFn, DeqFn); 9] = [
    pair!(avx2; blk_iq1_s, 50, 256),
    pair!(avx2; blk_iq1_m, 56, 256),
    pair!(avx2; blk_iq2_xxs, 66, 256),
    pair!(avx2; blk_iq2_xs, 74, 256),
    pair!(avx2; blk_iq2_s, 82, 256),
    pair!(avx2; blk_iq3_xxs, 98, 256),
    pair!(avx2; blk_iq3_s, 110, 256),
    pair!(avx2; blk_iq4_nl, 18, 32),
    pair!(avx2; blk_iq4_xs, 136, 256),
];

/// The AVX-512 pairs, same order as [`AVX2`].
pub(super) const AVX512: [(DotFn, DeqFn); 9] = [
    pair!(avx512; blk_iq1_s, 50, 256),
    pair!(avx512; blk_iq1_m, 56, 256),
    pair!(avx512; blk_iq2_xxs, 66, 256),
    pair!(avx512; blk_iq2_xs, 74, 256),
    pair!(avx512; blk_iq2_s, 82, 256),
    pair!(avx512; blk_iq3_xxs, 98, 256),
    pair!(avx512; blk_iq3_s, 110, 256),
    pair!(avx512; blk_iq4_nl, 18, 32),
    pair!(avx512; blk_iq4_xs, 136, 256),
];
