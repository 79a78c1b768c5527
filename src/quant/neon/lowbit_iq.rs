//! NEON in-register block decoders of the importance-matrix ("IQ") types: IQ1_S, IQ1_M,
//! IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL and IQ4_XS (see `lowbit` for the scheme).
//!
//! Layouts: ggml `ggml-common.h` (`block_iq1_s` ... `block_iq4_xs`, codebooks in
//! `quant::iq_grids` / `quant::iq1_grid`, shared with the x86 decoders); values and roundings:
//! `quant::scalar_iq` (checked against gguf-py's `gguf.quants` bit for bit). Each 8-element
//! group is looked up in its codebook (one u64, or two u32 for the 4-element IQ3 points),
//! widened in registers, scaled and signed exactly as the scalar decoder does.

use std::arch::aarch64::*;

use super::lowbit::{
    emit, f16s, i8_f32, i8x8_f32, join, load16, mul, pair, signed8, u16_at, u32_at, W,
};
use crate::quant::iq1_grid::IQ1S_GRID;
use crate::quant::iq_grids::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS};
use crate::quant::scalar::f16_to_f32;
use crate::quant::scalar_iq::IQ4NL_VALUES;
use crate::quant::{DeqFn, DotFn};

/// Four 8-element groups as one round.
#[inline(always)]
fn round(g: [[float32x4_t; 2]; 4]) -> W {
    [
        g[0][0], g[0][1], g[1][0], g[1][1], g[2][0], g[2][1], g[3][0], g[3][1],
    ]
}

/// `dl * (grid + delta)` for the 8 signed bytes of an IQ1 grid point (`scalar_iq::put8_iq1`:
/// an exact add, then one product).
#[inline]
#[target_feature(enable = "neon")]
fn iq1_8(dl: f32, grid: u64, delta: f32) -> [float32x4_t; 2] {
    let g = i8x8_f32(grid);
    let dv = vdupq_n_f32(delta);
    [mul(dl, vaddq_f32(g[0], dv)), mul(dl, vaddq_f32(g[1], dv))]
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
#[inline]
#[target_feature(enable = "neon")]
unsafe fn blk_iq1_s<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut W) {
    let d = f16s(p);
    for c in 0..8 {
        let qh = u16_at(p.add(34 + 2 * c));
        let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
        let delta = iq1_delta(qh & 0x8000 != 0);
        let mut g = [[vdupq_n_f32(0.0); 2]; 4];
        for (k, v) in g.iter_mut().enumerate() {
            let idx = *p.add(2 + 4 * c + k) as usize | (((qh >> (3 * k)) & 7) as usize) << 8;
            *v = iq1_8(dl, IQ1S_GRID[idx], delta);
        }
        emit::<S>(
            acc,
            round(g),
            x.wrapping_add(32 * c),
            dst.wrapping_add(32 * c),
        );
    }
}

/// IQ1_M (56 bytes): `d` from the top nibbles of the four u16 scales, 3-bit scale per
/// 16 elements, grid high bits and delta sign per 8 (`scalar_iq::decode_iq1_m`).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn blk_iq1_m<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut W) {
    let sc = [0, 1, 2, 3].map(|i| u16_at(p.add(48 + 2 * i)));
    let dbits = (sc[0] >> 12) | ((sc[1] >> 8) & 0xF0) | ((sc[2] >> 4) & 0xF00) | (sc[3] & 0xF000);
    let d = f16_to_f32(dbits);
    for c in 0..8 {
        let mut g8 = [[vdupq_n_f32(0.0); 2]; 4];
        for (k, v) in g8.iter_mut().enumerate() {
            let g = 4 * c + k;
            let i = g / 2;
            let s = (sc[i / 4] >> (3 * (i % 4))) & 7;
            let dl = d * (2 * s + 1) as f32;
            let n = (*p.add(32 + g / 2) >> (4 * (g % 2))) & 15;
            let idx = *p.add(g) as usize | ((n & 7) as usize) << 8;
            *v = iq1_8(dl, IQ1S_GRID[idx], iq1_delta(n & 8 != 0));
        }
        emit::<S>(
            acc,
            round(g8),
            x.wrapping_add(32 * c),
            dst.wrapping_add(32 * c),
        );
    }
}

/// IQ2_XXS (66 bytes): chunk `c` is (u32 `a`: four grid indices, u32 `s`: four 7-bit sign
/// indices and the 4-bit scale) (`scalar_iq::decode_iq2_xxs`).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn blk_iq2_xxs<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut W) {
    let d = f16s(p);
    for c in 0..8 {
        let a = u32_at(p.add(2 + 8 * c));
        let s = u32_at(p.add(6 + 8 * c));
        let db = d * (0.5 + (s >> 28) as f32) * 0.25;
        let mut g = [[vdupq_n_f32(0.0); 2]; 4];
        for (k, v) in g.iter_mut().enumerate() {
            let pt = IQ2XXS_GRID[((a >> (8 * k)) & 0xff) as usize];
            *v = signed8(db, pt, KSIGNS[((s >> (7 * k)) & 127) as usize]);
        }
        emit::<S>(
            acc,
            round(g),
            x.wrapping_add(32 * c),
            dst.wrapping_add(32 * c),
        );
    }
}

/// The two IQ2_XS / IQ2_S scales of chunk `c` from its scale byte `sb`:
/// `d * (0.5 + nibble) * 0.25` (low nibble: groups 0, 1; high: groups 2, 3).
#[inline(always)]
fn iq2_scales(d: f32, sb: u8) -> [f32; 2] {
    [
        d * (0.5 + (sb & 15) as f32) * 0.25,
        d * (0.5 + (sb >> 4) as f32) * 0.25,
    ]
}

/// IQ2_XS (74 bytes): 8-element group `g` is the u16 `q`: grid point `q & 511`, signs
/// `KSIGNS[q >> 9]` (`scalar_iq::decode_iq2_xs`).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn blk_iq2_xs<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut W) {
    let d = f16s(p);
    for c in 0..8 {
        let db = iq2_scales(d, *p.add(66 + c));
        let mut g = [[vdupq_n_f32(0.0); 2]; 4];
        for (k, v) in g.iter_mut().enumerate() {
            let q = u16_at(p.add(2 + 2 * (4 * c + k)));
            let pt = IQ2XS_GRID[(q & 511) as usize];
            *v = signed8(db[k / 2], pt, KSIGNS[(q >> 9) as usize]);
        }
        emit::<S>(
            acc,
            round(g),
            x.wrapping_add(32 * c),
            dst.wrapping_add(32 * c),
        );
    }
}

/// IQ2_S (82 bytes): group `g` is grid point `idx[g] | 2 bits of qh << 8`, sign byte `g`
/// (`scalar_iq::decode_iq2_s`).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn blk_iq2_s<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut W) {
    let d = f16s(p);
    for c in 0..8 {
        let db = iq2_scales(d, *p.add(74 + c));
        let qh = *p.add(66 + c);
        let mut g8 = [[vdupq_n_f32(0.0); 2]; 4];
        for (k, v) in g8.iter_mut().enumerate() {
            let g = 4 * c + k;
            let idx = *p.add(2 + g) as usize | (((qh >> (2 * k)) & 3) as usize) << 8;
            *v = signed8(db[k / 2], IQ2S_GRID[idx], *p.add(34 + g));
        }
        emit::<S>(
            acc,
            round(g8),
            x.wrapping_add(32 * c),
            dst.wrapping_add(32 * c),
        );
    }
}

/// IQ3_XXS (98 bytes): chunk `c` has u32 `s` (four 7-bit sign indices, 4-bit scale);
/// 8-element group `k` is the grid points `idx[8c + 2k]`, `idx[8c + 2k + 1]`
/// (`scalar_iq::decode_iq3_xxs`).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn blk_iq3_xxs<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut W) {
    let d = f16s(p);
    for c in 0..8 {
        let s = u32_at(p.add(66 + 4 * c));
        let db = d * (0.5 + (s >> 28) as f32) * 0.5;
        let mut g = [[vdupq_n_f32(0.0); 2]; 4];
        for (k, v) in g.iter_mut().enumerate() {
            let i = 2 + 8 * c + 2 * k;
            let pt = IQ3XXS_GRID[*p.add(i) as usize] as u64
                | (IQ3XXS_GRID[*p.add(i + 1) as usize] as u64) << 32;
            *v = signed8(db, pt, KSIGNS[((s >> (7 * k)) & 127) as usize]);
        }
        emit::<S>(
            acc,
            round(g),
            x.wrapping_add(32 * c),
            dst.wrapping_add(32 * c),
        );
    }
}

/// IQ3_S (110 bytes): chunk `c` has scale `d * (1 + 2 s)`, 4-element group `g` grid point
/// `idx[g] | bit g % 8 of qh[c] << 8`, sign byte per 8 elements (`scalar_iq::decode_iq3_s`).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn blk_iq3_s<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut W) {
    let d = f16s(p);
    for c in 0..8 {
        let s = (*p.add(106 + c / 2) >> (4 * (c % 2))) & 15;
        let db = d * (1 + 2 * s as u32) as f32;
        let qh = *p.add(66 + c) as usize;
        let mut g = [[vdupq_n_f32(0.0); 2]; 4];
        for (k, v) in g.iter_mut().enumerate() {
            let i = 8 * c + 2 * k;
            let lo = *p.add(2 + i) as usize | ((qh >> (2 * k)) & 1) << 8;
            let hi = *p.add(3 + i) as usize | ((qh >> (2 * k + 1)) & 1) << 8;
            let pt = IQ3S_GRID[lo] as u64 | (IQ3S_GRID[hi] as u64) << 32;
            *v = signed8(db, pt, *p.add(74 + 4 * c + k));
        }
        emit::<S>(
            acc,
            round(g),
            x.wrapping_add(32 * c),
            dst.wrapping_add(32 * c),
        );
    }
}

/// The 32 IQ4 levels of the 16 nibble bytes at `p` (Q4_0 order: low nibbles are elements
/// 0..16) times `dl` (`scalar_iq::decode_iq4_nl`: one product each), through a 16-entry
/// byte table.
///
/// # Safety
/// `p` is valid for 16 bytes.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn iq4_32(dl: f32, p: *const u8) -> W {
    let lut = vld1q_s8(IQ4NL_VALUES.as_ptr());
    let qs = load16(p);
    let lo = i8_f32(vqtbl1q_s8(lut, vandq_u8(qs, vdupq_n_u8(15))));
    let hi = i8_f32(vqtbl1q_s8(lut, vshrq_n_u8::<4>(qs)));
    let mut w = join(lo, hi);
    for v in &mut w {
        *v = mul(dl, *v);
    }
    w
}

/// IQ4_NL (18 bytes, 32 elements): `d * IQ4NL_VALUES[q]`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn blk_iq4_nl<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut W) {
    emit::<S>(acc, iq4_32(f16s(p), p.add(2)), x, dst);
}

/// IQ4_XS (136 bytes): sub-block `i` has 6-bit scale `ls` and `(d * (ls − 32)) *
/// IQ4NL_VALUES[q]` (`scalar_iq::decode_iq4_xs`).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn blk_iq4_xs<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut W) {
    let d = f16s(p);
    let sh = u16_at(p.add(2));
    for i in 0..8 {
        let lo = (*p.add(4 + i / 2) >> (4 * (i % 2))) & 15;
        let ls = lo as i32 | (((sh >> (2 * i)) & 3) as i32) << 4;
        let w = iq4_32(d * (ls - 32) as f32, p.add(8 + 16 * i));
        emit::<S>(acc, w, x.wrapping_add(32 * i), dst.wrapping_add(32 * i));
    }
}

/// The NEON (dot, dequantization) pairs: IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
/// IQ3_S, IQ4_NL, IQ4_XS.
pub(super) const PAIRS: [(DotFn, DeqFn); 9] = [
    pair!(blk_iq1_s, 50, 256),
    pair!(blk_iq1_m, 56, 256),
    pair!(blk_iq2_xxs, 66, 256),
    pair!(blk_iq2_xs, 74, 256),
    pair!(blk_iq2_s, 82, 256),
    pair!(blk_iq3_xxs, 98, 256),
    pair!(blk_iq3_s, 110, 256),
    pair!(blk_iq4_nl, 18, 32),
    pair!(blk_iq4_xs, 136, 256),
];
