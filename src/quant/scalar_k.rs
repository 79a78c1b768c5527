//! Scalar reference decoders of the legacy-with-minimum types (Q4_1, Q5_1), the k-quants
//! Q2_K, Q3_K and Q5_K, and the ternary types TQ1_0 / TQ2_0.
//!
//! Layouts follow ggml's `ggml-common.h`; each value is computed with the same f32 roundings
//! as `gguf.quants.dequantize` (gguf-py 0.19.0), which the fixture tests check bit for bit.
//! In the formulas `*`, `+` and `-` are each one f32 rounding, applied left to right.

use super::scalar::{f16_at, q4k_scales};

/// Q4_1 blocks (20 bytes: f16 `d`, f16 `m`, 16 bytes of nibbles in the Q4_0 order):
/// `y = d * q + m`.
pub(crate) fn decode_q4_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(20).zip(dst.chunks_exact_mut(32)) {
        let (d, m) = (f16_at(b), f16_at(&b[2..]));
        for (j, &q) in b[4..20].iter().enumerate() {
            y[j] = d * (q & 15) as f32 + m;
            y[j + 16] = d * (q >> 4) as f32 + m;
        }
    }
}

/// Q5_1 blocks (24 bytes: f16 `d`, f16 `m`, u32 `qh`, 16 bytes of nibbles): element `j` has
/// low bits as in Q4_1 and fifth bit `(qh >> j) & 1`; `y = d * q + m`.
pub(crate) fn decode_q5_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(24).zip(dst.chunks_exact_mut(32)) {
        let (d, m) = (f16_at(b), f16_at(&b[2..]));
        let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        for (j, &q) in b[8..24].iter().enumerate() {
            let lo = (q & 15) as u32 | (((qh >> j) & 1) << 4);
            let hi = (q >> 4) as u32 | (((qh >> (j + 16)) & 1) << 4);
            y[j] = d * lo as f32 + m;
            y[j + 16] = d * hi as f32 + m;
        }
    }
}

/// The 2-bit value of element `e` (0..256) of a Q2_K / Q3_K / TQ2_0 quant array `qs`
/// (64 bytes): half `e / 128` uses bytes `32 * half..+32`, bit pair `(e % 128) / 32`.
#[inline(always)]
pub(crate) fn two_bits(qs: &[u8], e: usize) -> u8 {
    (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3
}

/// Q2_K blocks (84 bytes: 16 scale bytes, 64 bytes of 2-bit quants, f16 `d`, f16 `dmin`).
/// Element `e` is `two_bits(qs, e)`; its 16-element group `e / 16` has scale byte `s`:
/// `y = (d * (s & 15)) * q - dmin * (s >> 4)`.
pub(crate) fn decode_q2_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(84).zip(dst.chunks_exact_mut(256)) {
        let (d, dmin) = (f16_at(&b[80..]), f16_at(&b[82..]));
        let qs = &b[16..80];
        for (g, &s) in b[..16].iter().enumerate() {
            let dl = d * (s & 15) as f32;
            let ml = dmin * (s >> 4) as f32;
            for (e, v) in y.iter_mut().enumerate().skip(16 * g).take(16) {
                *v = dl * two_bits(qs, e) as f32 - ml;
            }
        }
    }
}

/// The sixteen 6-bit Q3_K scales (before the −32 offset) from their 12 packed bytes: scale
/// `i` has low nibble `s[i % 8] >> 4 (i / 8)` and high bits `s[8 + i % 4] >> 2 (i / 4)`.
#[inline(always)]
pub(crate) fn q3k_scales(s: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let lo = (s[i % 8] >> (4 * (i / 8))) & 15;
        let hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        *o = (lo | (hi << 4)) as i8 - 32;
    }
    out
}

/// Q3_K blocks (110 bytes: 32 bytes `hmask`, 64 bytes of 2-bit quants, 12 bytes of scales,
/// f16 `d`). Element `e` is `two_bits(qs, e) - 4` unless bit `e / 32` of `hmask[e % 32]` is
/// set; group `e / 16` has scale `sc` (`q3k_scales`): `y = (d * sc) * q`.
pub(crate) fn decode_q3_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(110).zip(dst.chunks_exact_mut(256)) {
        let d = f16_at(&b[108..]);
        let (hm, qs) = (&b[..32], &b[32..96]);
        let sc = q3k_scales(&b[96..108]);
        for (g, &s) in sc.iter().enumerate() {
            let dl = d * s as f32;
            for (e, v) in y.iter_mut().enumerate().skip(16 * g).take(16) {
                let h = (hm[e % 32] >> (e / 32)) & 1;
                let q = two_bits(qs, e) as i32 - 4 * (1 - h as i32);
                *v = dl * q as f32;
            }
        }
    }
}

/// Q5_K blocks (176 bytes: f16 `d`, f16 `dmin`, 12 bytes of scales/mins as Q4_K, 32 bytes
/// `qh`, 128 bytes of nibbles). Sub-block `r` (32 elements) takes nibbles as Q4_K and fifth
/// bit `(qh[l] >> r) & 1` for its element `l`; `y = (d * sc[r]) * q - dmin * m[r]`.
pub(crate) fn decode_q5_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(176).zip(dst.chunks_exact_mut(256)) {
        let (d, dmin) = (f16_at(b), f16_at(&b[2..]));
        let (sc, m) = q4k_scales(&b[4..16]);
        let qh = &b[16..48];
        for r in 0..8 {
            let d1 = d * sc[r] as f32;
            let m1 = dmin * m[r] as f32;
            let qs = &b[48 + 32 * (r / 2)..][..32];
            let shift = 4 * (r & 1);
            let out = &mut y[32 * r..32 * r + 32];
            for ((v, &q), &h) in out.iter_mut().zip(qs).zip(qh) {
                let q = ((q >> shift) & 15) | (((h >> r) & 1) << 4);
                *v = d1 * q as f32 - m1;
            }
        }
    }
}

/// The ternary digit `n` (0..5, most significant first) of a TQ1_0 byte `b` holding five
/// base-3 digits scaled by 256/243: `((b * 3^n mod 256) * 3) >> 8`, minus 1.
#[inline(always)]
pub(crate) fn trit(b: u8, n: usize) -> i32 {
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];
    let q = b.wrapping_mul(POW3[n]);
    ((q as i32 * 3) >> 8) - 1
}

/// TQ1_0 blocks (54 bytes: 48 bytes of 5-trit bytes, 4 bytes of 4-trit bytes, f16 `d`).
/// Elements `0..160`: `trit(qs[e % 32], e / 32)`; `160..240`: `trit(qs[32 + (e - 160) % 16],
/// (e - 160) / 16)`; `240..256`: `trit(qh[(e - 240) % 4], (e - 240) / 4)`; `y = d * q`.
pub(crate) fn decode_tq1_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(54).zip(dst.chunks_exact_mut(256)) {
        let d = f16_at(&b[52..]);
        for (e, v) in y.iter_mut().enumerate() {
            let q = match e {
                0..160 => trit(b[e % 32], e / 32),
                160..240 => trit(b[32 + (e - 160) % 16], (e - 160) / 16),
                _ => trit(b[48 + (e - 240) % 4], (e - 240) / 4),
            };
            *v = d * q as f32;
        }
    }
}

/// TQ2_0 blocks (66 bytes: 64 bytes of 2-bit quants, f16 `d`): `y = d * (two_bits(qs, e) - 1)`.
pub(crate) fn decode_tq2_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(66).zip(dst.chunks_exact_mut(256)) {
        let d = f16_at(&b[64..]);
        for (e, v) in y.iter_mut().enumerate() {
            *v = d * (two_bits(&b[..64], e) as i32 - 1) as f32;
        }
    }
}
