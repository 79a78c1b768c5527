//! NEON in-register block decoders of the first block types: Q8_0, Q4_0, Q5_0, Q4_K, Q6_K
//! and MXFP4 (see `lowbit` for the scheme; the float types F32 / F16 / BF16 keep the
//! scalar-decode path, which needs no unpacking).
//!
//! Layouts: ggml `ggml-common.h` (`block_q8_0`, `block_q4_0`, `block_q5_0`, `block_q4_K`,
//! `block_q6_K`, `block_mxfp4`); values and roundings: `quant::scalar` (checked against
//! gguf-py's `gguf.quants` bit for bit), one f32 rounding per operation, never fused.

use std::arch::aarch64::*;

use super::lowbit::{bit_bytes, bits, emit, f16s, i8_f32, join, load16, mul, mul_sub, pair};
use super::lowbit::{u32_at, u8_f32, W};
use crate::quant::scalar::{e8m0_half, q4k_scales, MXFP4_VALUES};
use crate::quant::{DeqFn, DotFn};

/// Scales every value of `w` by `d` (one product each).
#[inline]
#[target_feature(enable = "neon")]
fn scale(d: f32, mut w: W) -> W {
    for v in &mut w {
        *v = mul(d, *v);
    }
    w
}

/// Q8_0 (34 bytes, 32 elements): `d * q`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn blk_q8_0<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut W) {
    let q = |o: usize| i8_f32(vreinterpretq_s8_u8(load16(p.add(o))));
    emit::<S>(acc, scale(f16s(p), join(q(2), q(18))), x, dst);
}

/// Q4_0 (18 bytes, 32 elements): `d * (q - 8)`, low nibbles are elements 0..16.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn blk_q4_0<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut W) {
    let qs = load16(p.add(2));
    let eight = vdupq_n_s8(8);
    let q = |v: uint8x16_t| i8_f32(vsubq_s8(vreinterpretq_s8_u8(v), eight));
    let w = join(q(bits(qs, 0, 15)), q(bits(qs, 4, 15)));
    emit::<S>(acc, scale(f16s(p), w), x, dst);
}

/// Q5_0 (22 bytes, 32 elements): `d * (q - 16)`, fifth bit `j` of the u32 `qh` for element
/// `j`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn blk_q5_0<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut W) {
    let qh = u32_at(p.add(2));
    let qs = load16(p.add(6));
    let b4 = vdupq_n_u8(16);
    let sixteen = vdupq_n_s8(16);
    let q = |nib: uint8x16_t, h: u16| {
        let v = vorrq_u8(nib, vandq_u8(bit_bytes(h), b4));
        i8_f32(vsubq_s8(vreinterpretq_s8_u8(v), sixteen))
    };
    let w = join(
        q(bits(qs, 0, 15), qh as u16),
        q(bits(qs, 4, 15), (qh >> 16) as u16),
    );
    emit::<S>(acc, scale(f16s(p), w), x, dst);
}

/// Q4_K (144 bytes, 256 elements): `(d * sc[r]) * q - dmin * m[r]` per 32-element
/// sub-block `r`, nibbles of bytes `16 + 32 (r / 2)..`, low for even `r`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn blk_q4_k<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut W) {
    let (d, dmin) = (f16s(p), f16s(p.add(2)));
    let (sc, m) = q4k_scales(std::slice::from_raw_parts(p.add(4), 12));
    for r in 0..8 {
        let (d1, m1) = (d * sc[r] as f32, dmin * m[r] as f32);
        let o = 16 + 32 * (r / 2);
        let s = 4 * (r & 1);
        let mut w = join(
            u8_f32(bits(load16(p.add(o)), s, 15)),
            u8_f32(bits(load16(p.add(o + 16)), s, 15)),
        );
        for v in &mut w {
            *v = mul_sub(d1, *v, m1);
        }
        emit::<S>(acc, w, x.wrapping_add(32 * r), dst.wrapping_add(32 * r));
    }
}

/// Q6_K (210 bytes, 256 elements): 16-element chunk `c` of half `h` is
/// `(d * sc[8h + c]) * (q - 32)` with `q` = nibble of `ql` | two bits of `qh` << 4
/// (`scalar::decode_q6_k`).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn blk_q6_k<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut W) {
    let d = f16s(p.add(208));
    let off = vdupq_n_s8(32);
    for r in 0..8 {
        let h = r / 4;
        let chunk = |c: usize| {
            let lo = bits(load16(p.add(64 * h + 16 * (c & 3))), 4 * (c >> 2), 15);
            let hi = bits(load16(p.add(128 + 32 * h + 16 * (c & 1))), 2 * (c >> 1), 3);
            let q = vreinterpretq_s8_u8(vorrq_u8(lo, vshlq_n_u8::<4>(hi)));
            let ds = d * (*p.add(192 + 8 * h + c) as i8 as f32);
            let mut v = i8_f32(vsubq_s8(q, off));
            for e in &mut v {
                *e = mul(ds, *e);
            }
            v
        };
        let c = 2 * (r % 4);
        let w = join(chunk(c), chunk(c + 1));
        emit::<S>(acc, w, x.wrapping_add(32 * r), dst.wrapping_add(32 * r));
    }
}

/// MXFP4 (17 bytes, 32 elements): `e8m0_half(e) * MXFP4_VALUES[q]` (one exact product),
/// nibbles in the Q4_0 order, through a 16-entry byte table.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn blk_mxfp4<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut W) {
    let lut = vld1q_s8(MXFP4_VALUES.as_ptr());
    let qs = load16(p.add(1));
    let lo = i8_f32(vqtbl1q_s8(lut, vandq_u8(qs, vdupq_n_u8(15))));
    let hi = i8_f32(vqtbl1q_s8(lut, vshrq_n_u8::<4>(qs)));
    emit::<S>(acc, scale(e8m0_half(*p), join(lo, hi)), x, dst);
}

/// The NEON (dot, dequantization) pairs of slots 3..9: Q8_0, Q4_0, Q5_0, Q4_K, Q6_K,
/// MXFP4.
pub(super) const PAIRS: [(DotFn, DeqFn); 6] = [
    pair!(blk_q8_0, 34, 32),
    pair!(blk_q4_0, 18, 32),
    pair!(blk_q5_0, 22, 32),
    pair!(blk_q4_k, 144, 256),
    pair!(blk_q6_k, 210, 256),
    pair!(blk_mxfp4, 17, 32),
];
