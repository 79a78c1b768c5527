//! NEON in-register block decoders of the legacy-with-minimum types (Q4_1, Q5_1), the
//! k-quants Q2_K, Q3_K and Q5_K, and the ternary types TQ1_0 / TQ2_0 (see `lowbit` for the
//! scheme).
//!
//! Layouts: ggml `ggml-common.h` (`block_q4_1`, `block_q5_1`, `block_q2_K`, `block_q3_K`,
//! `block_q5_K`, `block_tq1_0`, `block_tq2_0`); values and roundings: `quant::scalar_k`
//! (checked against gguf-py's `gguf.quants` bit for bit). Each decoder computes exactly the
//! scalar formula there, one f32 rounding per operation, never fused.

use std::arch::aarch64::*;

use super::lowbit::{
    bit_bytes, bits, emit, f16s, i8_f32, join, load16, mul, mul_add, mul_sub, pair, u32_at, u8_f32,
    W,
};
use crate::quant::scalar::q4k_scales;
use crate::quant::scalar_k::q3k_scales;
use crate::quant::{DeqFn, DotFn};

/// Q4_1 (20 bytes, 32 elements): `d * q + m`, nibbles in the Q4_0 order.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn blk_q4_1<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut W) {
    let (d, m) = (f16s(p), f16s(p.add(2)));
    let qs = load16(p.add(4));
    let mut w = join(u8_f32(bits(qs, 0, 15)), u8_f32(bits(qs, 4, 15)));
    for v in &mut w {
        *v = mul_add(d, *v, m);
    }
    emit::<S>(acc, w, x, dst);
}

/// Q5_1 (24 bytes, 32 elements): as Q4_1 with fifth bit `j` of the u32 `qh` for element `j`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn blk_q5_1<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut W) {
    let (d, m) = (f16s(p), f16s(p.add(2)));
    let qh = u32_at(p.add(4));
    let qs = load16(p.add(8));
    let b4 = vdupq_n_u8(16);
    let lo = vorrq_u8(bits(qs, 0, 15), vandq_u8(bit_bytes(qh as u16), b4));
    let hi = vorrq_u8(bits(qs, 4, 15), vandq_u8(bit_bytes((qh >> 16) as u16), b4));
    let mut w = join(u8_f32(lo), u8_f32(hi));
    for v in &mut w {
        *v = mul_add(d, *v, m);
    }
    emit::<S>(acc, w, x, dst);
}

/// Q2_K (84 bytes, 256 elements): `(d * (s & 15)) * q - dmin * (s >> 4)` per 16-element
/// group with scale byte `s`; 2-bit values as `scalar_k::two_bits`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn blk_q2_k<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut W) {
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
        let q0 = u8_f32(bits(load16(p.add(16 + 32 * h)), 2 * s, 3));
        let q1 = u8_f32(bits(load16(p.add(32 + 32 * h)), 2 * s, 3));
        let g = 8 * h + 2 * s;
        let mut w = join(q0, q1);
        for (k, v) in w.iter_mut().enumerate() {
            let g = g + k / 4;
            *v = mul_sub(dl[g], *v, ml[g]);
        }
        emit::<S>(acc, w, x.wrapping_add(32 * r), dst.wrapping_add(32 * r));
    }
}

/// Q3_K (110 bytes, 256 elements): `(d * sc) * q` with `q = two_bits - 4` unless the
/// element's `hmask` bit is set (`scalar_k::decode_q3_k`).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn blk_q3_k<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut W) {
    let d = f16s(p.add(108));
    let sc = q3k_scales(std::slice::from_raw_parts(p.add(96), 12));
    let four = vdupq_n_u8(4);
    for r in 0..8 {
        let (h, s) = (r / 4, r % 4);
        let mut q = [[vdupq_n_f32(0.0); 4]; 2];
        for (half, v) in q.iter_mut().enumerate() {
            let lo = bits(load16(p.add(32 + 32 * h + 16 * half)), 2 * s, 3);
            let hb = bits(load16(p.add(16 * half)), 4 * h + s, 1);
            // q2 | hbit << 2, minus 4: −4..3
            let q = vsubq_u8(vorrq_u8(lo, vshlq_n_u8::<2>(hb)), four);
            *v = i8_f32(vreinterpretq_s8_u8(q));
        }
        let g = 8 * h + 2 * s;
        let (d0, d1) = (d * sc[g] as f32, d * sc[g + 1] as f32);
        let mut w = join(q[0], q[1]);
        for (k, v) in w.iter_mut().enumerate() {
            *v = mul(if k < 4 { d0 } else { d1 }, *v);
        }
        emit::<S>(acc, w, x.wrapping_add(32 * r), dst.wrapping_add(32 * r));
    }
}

/// Q5_K (176 bytes, 256 elements): `(d * sc[r]) * q - dmin * m[r]` per 32-element
/// sub-block `r`, nibbles as Q4_K plus fifth bit `(qh[l] >> r) & 1`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn blk_q5_k<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut W) {
    let (d, dmin) = (f16s(p), f16s(p.add(2)));
    let (sc, m) = q4k_scales(std::slice::from_raw_parts(p.add(4), 12));
    for r in 0..8 {
        let (d1, m1) = (d * sc[r] as f32, dmin * m[r] as f32);
        let mut q = [[vdupq_n_f32(0.0); 4]; 2];
        for (half, v) in q.iter_mut().enumerate() {
            let nib = bits(
                load16(p.add(48 + 32 * (r / 2) + 16 * half)),
                4 * (r & 1),
                15,
            );
            let hb = bits(load16(p.add(16 + 16 * half)), r, 1);
            *v = u8_f32(vorrq_u8(nib, vshlq_n_u8::<4>(hb)));
        }
        let mut w = join(q[0], q[1]);
        for v in &mut w {
            *v = mul_sub(d1, *v, m1);
        }
        emit::<S>(acc, w, x.wrapping_add(32 * r), dst.wrapping_add(32 * r));
    }
}

/// The 16 ternary digits of the bytes of `v`, digit `n` of byte `j` selected by the
/// multiplier `3^n` in byte `j` of `pw` (`scalar_k::trit`: `((b * 3^n mod 256) * 3) >> 8`,
/// minus 1), as f32.
#[inline]
#[target_feature(enable = "neon")]
fn trits(v: uint8x16_t, pw: uint8x16_t) -> [float32x4_t; 4] {
    let q = vmulq_u8(v, pw);
    let three = vdup_n_u8(3);
    let t = vcombine_u8(
        vshrn_n_u16::<8>(vmull_u8(vget_low_u8(q), three)),
        vshrn_n_u16::<8>(vmull_high_u8(q, vdupq_n_u8(3))),
    );
    i8_f32(vsubq_s8(vreinterpretq_s8_u8(t), vdupq_n_s8(1)))
}

/// TQ1_0 (54 bytes, 256 elements): `d * trit` with the digits laid out as in
/// `scalar_k::decode_tq1_0` (5 digits of `qs[0..32]`, 5 of `qs[32..48]`, 4 of `qh`).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn blk_tq1_0<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut W) {
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];
    const QH_PW: [u8; 16] = [1, 1, 1, 1, 3, 3, 3, 3, 9, 9, 9, 9, 27, 27, 27, 27];
    let d = f16s(p.add(52));
    let (lo, hi, mid) = (load16(p), load16(p.add(16)), load16(p.add(32)));
    // the 4 qh bytes repeated: byte j of the vector is qh[j % 4]
    let qh = vreinterpretq_u8_u32(vdupq_n_u32(u32_at(p.add(48))));
    let pw = POW3.map(|m| vdupq_n_u8(m));
    let qh_pw = vld1q_u8(QH_PW.as_ptr());
    for r in 0..8 {
        let (a, b) = match r {
            0..5 => (trits(lo, pw[r]), trits(hi, pw[r])),
            5 => (trits(mid, pw[0]), trits(mid, pw[1])),
            6 => (trits(mid, pw[2]), trits(mid, pw[3])),
            _ => (trits(mid, pw[4]), trits(qh, qh_pw)),
        };
        let mut w = join(a, b);
        for v in &mut w {
            *v = mul(d, *v);
        }
        emit::<S>(acc, w, x.wrapping_add(32 * r), dst.wrapping_add(32 * r));
    }
}

/// TQ2_0 (66 bytes, 256 elements): `d * (two_bits - 1)`, 2-bit values laid out as Q2_K's.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn blk_tq2_0<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut W) {
    let d = f16s(p.add(64));
    let one = vdupq_n_s8(1);
    for r in 0..8 {
        let (h, s) = (r / 4, r % 4);
        let q = |o: usize| {
            let v = vreinterpretq_s8_u8(bits(load16(p.add(o)), 2 * s, 3));
            i8_f32(vsubq_s8(v, one))
        };
        let mut w = join(q(32 * h), q(32 * h + 16));
        for v in &mut w {
            *v = mul(d, *v);
        }
        emit::<S>(acc, w, x.wrapping_add(32 * r), dst.wrapping_add(32 * r));
    }
}

/// The NEON (dot, dequantization) pairs: Q4_1, Q5_1, Q2_K, Q3_K, Q5_K, TQ1_0, TQ2_0.
pub(super) const PAIRS: [(DotFn, DeqFn); 7] = [
    pair!(blk_q4_1, 20, 32),
    pair!(blk_q5_1, 24, 32),
    pair!(blk_q2_k, 84, 256),
    pair!(blk_q3_k, 110, 256),
    pair!(blk_q5_k, 176, 256),
    pair!(blk_tq1_0, 54, 256),
    pair!(blk_tq2_0, 66, 256),
];
