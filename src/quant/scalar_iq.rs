//! Scalar reference decoders of the importance-matrix ("IQ") types: IQ2_XXS, IQ2_XS, IQ2_S,
//! IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, IQ4_NL and IQ4_XS.
//!
//! Layouts follow ggml's `ggml-common.h` (codebooks in [`super::iq_grids`] and
//! [`super::iq1_grid`]); each value is computed with the same f32 roundings as
//! `gguf.quants.dequantize` (gguf-py 0.19.0), checked bit for bit by the fixture tests. In
//! the formulas `*` and `+` are each one f32 rounding, applied left to right; a sign is an
//! exact negation.

use super::iq1_grid::IQ1S_GRID;
use super::iq_grids::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS};
use super::scalar::f16_at;

/// The non-linear 4-bit levels of IQ4_NL and IQ4_XS (ggml `kvalues_iq4nl`, format data).
pub(crate) const IQ4NL_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Little-endian u16 / u32 at `b[o..]`.
#[inline(always)]
fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
#[inline(always)]
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

/// Writes 8 elements `(db * grid byte j) * (−1 if bit j of signs)`, j < 8.
#[inline(always)]
fn put8(out: &mut [f32], db: f32, grid: u64, signs: u8) {
    for (j, v) in out[..8].iter_mut().enumerate() {
        let w = db * ((grid >> (8 * j)) & 0xff) as f32;
        *v = if (signs >> j) & 1 != 0 { -w } else { w };
    }
}

/// Writes 4 elements `(db * grid byte j) * (−1 if bit j of signs)`, j < 4.
#[inline(always)]
fn put4(out: &mut [f32], db: f32, grid: u32, signs: u8) {
    for (j, v) in out[..4].iter_mut().enumerate() {
        let w = db * ((grid >> (8 * j)) & 0xff) as f32;
        *v = if (signs >> j) & 1 != 0 { -w } else { w };
    }
}

/// IQ2_XXS blocks (66 bytes: f16 `d`, 8 × (u32 `a`, u32 `b`)). Chunk `c` (32 elements):
/// `db = d * (0.5 + (b >> 28)) * 0.25`; its 8-element group `k` is grid point `byte k of a`
/// of [`IQ2XXS_GRID`] with signs `KSIGNS[(b >> 7k) & 127]`.
pub(crate) fn decode_iq2_xxs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(66).zip(dst.chunks_exact_mut(256)) {
        let d = f16_at(b);
        for c in 0..8 {
            let (a, s) = (u32_at(b, 2 + 8 * c), u32_at(b, 6 + 8 * c));
            let db = d * (0.5 + (s >> 28) as f32) * 0.25;
            for k in 0..4 {
                let g = IQ2XXS_GRID[((a >> (8 * k)) & 0xff) as usize];
                let sg = KSIGNS[((s >> (7 * k)) & 127) as usize];
                put8(&mut y[32 * c + 8 * k..], db, g, sg);
            }
        }
    }
}

/// IQ2_XS blocks (74 bytes: f16 `d`, 32 × u16 `q`, 8 scale bytes). Group `g` (8 elements):
/// grid point `q & 511` of [`IQ2XS_GRID`], signs `KSIGNS[q >> 9]`; 16-element group `i` has
/// 4-bit scale `s` (nibble `i % 2` of byte `i / 2`): `db = d * (0.5 + s) * 0.25`.
pub(crate) fn decode_iq2_xs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(74).zip(dst.chunks_exact_mut(256)) {
        let d = f16_at(b);
        for g in 0..32 {
            let q = u16_at(b, 2 + 2 * g);
            let s = (b[66 + g / 4] >> (4 * ((g / 2) % 2))) & 15;
            let db = d * (0.5 + s as f32) * 0.25;
            put8(
                &mut y[8 * g..],
                db,
                IQ2XS_GRID[(q & 511) as usize],
                KSIGNS[(q >> 9) as usize],
            );
        }
    }
}

/// IQ2_S blocks (82 bytes: f16 `d`, 32 index bytes, 32 sign bytes, 8 `qh` bytes, 8 scale
/// bytes). Group `g` (8 elements): grid point `idx[g] | ((qh[g / 4] >> 2 (g % 4)) & 3) << 8`
/// of [`IQ2S_GRID`], signs byte `g`; scales as IQ2_XS.
pub(crate) fn decode_iq2_s(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(82).zip(dst.chunks_exact_mut(256)) {
        let d = f16_at(b);
        for g in 0..32 {
            let hi = ((b[66 + g / 4] >> (2 * (g % 4))) & 3) as usize;
            let s = (b[74 + g / 4] >> (4 * ((g / 2) % 2))) & 15;
            let db = d * (0.5 + s as f32) * 0.25;
            put8(
                &mut y[8 * g..],
                db,
                IQ2S_GRID[b[2 + g] as usize | hi << 8],
                b[34 + g],
            );
        }
    }
}

/// IQ3_XXS blocks (98 bytes: f16 `d`, 64 index bytes, 8 × u32 `s`). Chunk `c` (32 elements):
/// `db = d * (0.5 + (s >> 28)) * 0.5`, 8-element group `k` signs `KSIGNS[(s >> 7k) & 127]`;
/// 4-element group `g` is grid point `idx[g]` of [`IQ3XXS_GRID`].
pub(crate) fn decode_iq3_xxs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(98).zip(dst.chunks_exact_mut(256)) {
        let d = f16_at(b);
        for c in 0..8 {
            let s = u32_at(b, 66 + 4 * c);
            let db = d * (0.5 + (s >> 28) as f32) * 0.5;
            for k in 0..4 {
                let sg = KSIGNS[((s >> (7 * k)) & 127) as usize];
                for h in 0..2 {
                    let g = 8 * c + 2 * k + h;
                    let pt = IQ3XXS_GRID[b[2 + g] as usize];
                    put4(&mut y[4 * g..], db, pt, sg >> (4 * h));
                }
            }
        }
    }
}

/// IQ3_S blocks (110 bytes: f16 `d`, 64 index bytes, 8 `qh` bytes, 32 sign bytes, 4 scale
/// bytes). 4-element group `g`: grid point `idx[g] | ((qh[g / 8] >> g % 8) & 1) << 8` of
/// [`IQ3S_GRID`]; element `e` negative when bit `e % 8` of sign byte `e / 8` is set; chunk `i`
/// (32 elements) has 4-bit scale `s` (nibble `i % 2` of byte `i / 2`): `db = d * (1 + 2 s)`.
pub(crate) fn decode_iq3_s(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(110).zip(dst.chunks_exact_mut(256)) {
        let d = f16_at(b);
        for g in 0..64 {
            let hi = ((b[66 + g / 8] >> (g % 8)) & 1) as usize;
            let s = (b[106 + g / 16] >> (4 * ((g / 8) % 2))) & 15;
            let db = d * (1 + 2 * s as u32) as f32;
            let sg = b[74 + g / 2] >> (4 * (g % 2));
            put4(
                &mut y[4 * g..],
                db,
                IQ3S_GRID[b[2 + g] as usize | hi << 8],
                sg,
            );
        }
    }
}

/// The IQ1_S / IQ1_M offset added to every grid value: `±0.125` (ggml `IQ1S_DELTA`).
const IQ1_DELTA: f32 = 0.125;

/// Writes 8 elements `dl * (grid value j + delta)` of an IQ1 grid point.
#[inline(always)]
fn put8_iq1(out: &mut [f32], dl: f32, grid: u64, delta: f32) {
    for (j, v) in out[..8].iter_mut().enumerate() {
        *v = dl * ((grid >> (8 * j)) as u8 as i8 as f32 + delta);
    }
}

/// IQ1_S blocks (50 bytes: f16 `d`, 32 index bytes, 8 × u16 `qh`). Chunk `c` (32 elements):
/// `dl = d * (2 ((qh >> 12) & 7) + 1)`, `delta = −0.125` if bit 15 is set else `0.125`;
/// 8-element group `g` is grid point `idx[g] | ((qh[g / 4] >> 3 (g % 4)) & 7) << 8` of
/// [`IQ1S_GRID`]: `y = dl * (grid + delta)`.
pub(crate) fn decode_iq1_s(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(50).zip(dst.chunks_exact_mut(256)) {
        let d = f16_at(b);
        for c in 0..8 {
            let qh = u16_at(b, 34 + 2 * c);
            let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
            let delta = if qh & 0x8000 != 0 {
                -IQ1_DELTA
            } else {
                IQ1_DELTA
            };
            for k in 0..4 {
                let g = 4 * c + k;
                let idx = b[2 + g] as usize | (((qh >> (3 * k)) & 7) as usize) << 8;
                put8_iq1(&mut y[8 * g..], dl, IQ1S_GRID[idx], delta);
            }
        }
    }
}

/// IQ1_M blocks (56 bytes: 32 index bytes, 16 `qh` bytes, 4 × u16 `sc`). The f16 `d` is the
/// top nibbles of `sc[0..4]` (`sc[0]` lowest); 16-element group `i` has 3-bit scale
/// `s = (sc[i / 4] >> 3 (i % 4)) & 7`, `dl = d * (2 s + 1)`; 8-element group `g` uses nibble
/// `n = qh[g / 2] >> 4 (g % 2)`: grid point `idx[g] | (n & 7) << 8`, delta `−0.125` if
/// `n & 8` else `0.125`: `y = dl * (grid + delta)`.
pub(crate) fn decode_iq1_m(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(56).zip(dst.chunks_exact_mut(256)) {
        let sc = [0, 1, 2, 3].map(|i| u16_at(b, 48 + 2 * i));
        let dbits =
            (sc[0] >> 12) | ((sc[1] >> 8) & 0xF0) | ((sc[2] >> 4) & 0xF00) | (sc[3] & 0xF000);
        let d = super::scalar::f16_to_f32(dbits);
        for g in 0..32 {
            let i = g / 2;
            let s = (sc[i / 4] >> (3 * (i % 4))) & 7;
            let dl = d * (2 * s + 1) as f32;
            let n = (b[32 + g / 2] >> (4 * (g % 2))) & 15;
            let delta = if n & 8 != 0 { -IQ1_DELTA } else { IQ1_DELTA };
            let idx = b[g] as usize | ((n & 7) as usize) << 8;
            put8_iq1(&mut y[8 * g..], dl, IQ1S_GRID[idx], delta);
        }
    }
}

/// IQ4_NL blocks (18 bytes: f16 `d`, 16 bytes of nibbles in the Q4_0 order):
/// `y = d * IQ4NL_VALUES[q]`.
pub(crate) fn decode_iq4_nl(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(18).zip(dst.chunks_exact_mut(32)) {
        let d = f16_at(b);
        for (j, &q) in b[2..18].iter().enumerate() {
            y[j] = d * IQ4NL_VALUES[(q & 15) as usize] as f32;
            y[j + 16] = d * IQ4NL_VALUES[(q >> 4) as usize] as f32;
        }
    }
}

/// IQ4_XS blocks (136 bytes: f16 `d`, u16 `scales_h`, 4 bytes `scales_l`, 128 bytes of
/// nibbles). Sub-block `i` (32 elements) has 6-bit scale `ls = nibble i % 2 of scales_l[i / 2]
/// | ((scales_h >> 2i) & 3) << 4` and nibbles in the Q4_0 order at bytes `8 + 16 i..`:
/// `y = (d * (ls − 32)) * IQ4NL_VALUES[q]`.
pub(crate) fn decode_iq4_xs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(136).zip(dst.chunks_exact_mut(256)) {
        let d = f16_at(b);
        let sh = u16_at(b, 2);
        for i in 0..8 {
            let lo = (b[4 + i / 2] >> (4 * (i % 2))) & 15;
            let ls = lo as i32 | (((sh >> (2 * i)) & 3) as i32) << 4;
            let dl = d * (ls - 32) as f32;
            let out = &mut y[32 * i..];
            for (j, &q) in b[8 + 16 * i..][..16].iter().enumerate() {
                out[j] = dl * IQ4NL_VALUES[(q & 15) as usize] as f32;
                out[j + 16] = dl * IQ4NL_VALUES[(q >> 4) as usize] as f32;
            }
        }
    }
}
