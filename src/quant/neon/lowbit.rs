//! What the NEON in-register block decoders (`lowbit_k`, `lowbit_iq`, `base`) share: the
//! round accumulator, the widening and bit helpers, and the macro that turns a block decoder
//! into a row's fused dot and dequantization.
//!
//! Every decoder turns the bytes of one block into 32 values at a time in eight 4-lane
//! registers ([`W`], never through memory) with the scalar decoders' roundings
//! (`quant::scalar`, `quant::scalar_k`, `quant::scalar_iq`: one f32 rounding per operation,
//! never fused), then [`emit`] either stores them (dequantization) or accumulates them
//! against the activations in the NEON level's order: element `32k + j` into accumulator
//! `j / 4`, lane `j % 4` (`vfmaq_f32`), reduced by [`finish8`]. So each dot equals the NEON
//! level's `dot_f32(dequantized, x)` (and the scalar-decode path `dot_decoded::<Neon8>`) bit
//! for bit, and the batched GEMM (`row_plan`: the row dequantized once, then the level's f32
//! dot per token) reproduces it exactly.
//!
//! NEON is part of the aarch64 baseline, so every helper carries `target_feature(enable =
//! "neon")` only to make its intrinsics callable; the row wrappers call them under the
//! baseline guarantee.

use std::arch::aarch64::*;

use crate::quant::scalar::f16_to_f32;

/// The 32 values of one accumulation round: register `k` lane `l` is element `4k + l`.
pub(super) type W = [float32x4_t; 8];

/// The IEEE half at `p` as f32 (exact, integer conversion as the scalar decoders use).
///
/// # Safety
/// `p` is valid for 2 bytes.
#[inline(always)]
pub(super) unsafe fn f16s(p: *const u8) -> f32 {
    f16_to_f32((p as *const u16).read_unaligned().to_le())
}

/// Little-endian u16 at `p`.
///
/// # Safety
/// `p` is valid for 2 bytes.
#[inline(always)]
pub(super) unsafe fn u16_at(p: *const u8) -> u16 {
    (p as *const u16).read_unaligned().to_le()
}

/// Little-endian u32 at `p`.
///
/// # Safety
/// `p` is valid for 4 bytes.
#[inline(always)]
pub(super) unsafe fn u32_at(p: *const u8) -> u32 {
    (p as *const u32).read_unaligned().to_le()
}

/// The 16 bytes at `p`.
///
/// # Safety
/// `p` is valid for 16 bytes.
#[inline]
#[target_feature(enable = "neon")]
pub(super) unsafe fn load16(p: *const u8) -> uint8x16_t {
    vld1q_u8(p)
}

/// Eight zeroed accumulators.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn zero8() -> W {
    [vdupq_n_f32(0.0); 8]
}

/// The NEON level's reduction: `((a0+a1)+(a2+a3)) + ((a4+a5)+(a6+a7))`, then lane pairs
/// `(l0+l2) + (l1+l3)`.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn finish8(a: &W) -> f32 {
    let l = vaddq_f32(vaddq_f32(a[0], a[1]), vaddq_f32(a[2], a[3]));
    let h = vaddq_f32(vaddq_f32(a[4], a[5]), vaddq_f32(a[6], a[7]));
    let v = vaddq_f32(l, h);
    let p = vadd_f32(vget_low_f32(v), vget_high_f32(v));
    vget_lane_f32::<0>(p) + vget_lane_f32::<1>(p)
}

/// Stores the 32 values `w` at `dst` (`STORE`) or accumulates them against the 32
/// activations at `x` (`acc[k] += w[k] * x[4k..4k + 4]`, fused).
///
/// # Safety
/// `dst` (`STORE`) or `x` (otherwise) is valid for 32 f32s.
#[inline]
#[target_feature(enable = "neon")]
pub(super) unsafe fn emit<const STORE: bool>(acc: &mut W, w: W, x: *const f32, dst: *mut f32) {
    for k in 0..8 {
        if STORE {
            vst1q_f32(dst.add(4 * k), w[k]);
        } else {
            acc[k] = vfmaq_f32(acc[k], w[k], vld1q_f32(x.add(4 * k)));
        }
    }
}

/// Two 16-value halves as one round (elements 0..16, then 16..32).
#[inline(always)]
pub(super) fn join(a: [float32x4_t; 4], b: [float32x4_t; 4]) -> W {
    [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
}

/// The 16 bytes of `v` as f32, unsigned (exact).
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn u8_f32(v: uint8x16_t) -> [float32x4_t; 4] {
    let lo = vmovl_u8(vget_low_u8(v));
    let hi = vmovl_high_u8(v);
    [
        vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo))),
        vcvtq_f32_u32(vmovl_high_u16(lo)),
        vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi))),
        vcvtq_f32_u32(vmovl_high_u16(hi)),
    ]
}

/// The 16 bytes of `v` as f32, signed (exact).
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn i8_f32(v: int8x16_t) -> [float32x4_t; 4] {
    let lo = vmovl_s8(vget_low_s8(v));
    let hi = vmovl_high_s8(v);
    [
        vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))),
        vcvtq_f32_s32(vmovl_high_s16(lo)),
        vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))),
        vcvtq_f32_s32(vmovl_high_s16(hi)),
    ]
}

/// The 8 bytes of `g` (byte `j` is element `j`) as f32, unsigned.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn u8x8_f32(g: u64) -> [float32x4_t; 2] {
    let v = vmovl_u8(vcreate_u8(g));
    [
        vcvtq_f32_u32(vmovl_u16(vget_low_u16(v))),
        vcvtq_f32_u32(vmovl_high_u16(v)),
    ]
}

/// The 8 bytes of `g` (byte `j` is element `j`) as f32, signed.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn i8x8_f32(g: u64) -> [float32x4_t; 2] {
    let v = vmovl_s8(vcreate_s8(g));
    [
        vcvtq_f32_s32(vmovl_s16(vget_low_s16(v))),
        vcvtq_f32_s32(vmovl_high_s16(v)),
    ]
}

/// Bytes `(v >> s) & m` (per-byte shift, `s` in 0..8).
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn bits(v: uint8x16_t, s: usize, m: u8) -> uint8x16_t {
    vandq_u8(vshlq_u8(v, vdupq_n_s8(-(s as i8))), vdupq_n_u8(m))
}

/// Byte `j` of the result is `0xFF` when bit `j` of `h` is set, else 0 (16 bit masks).
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn bit_bytes(h: u16) -> uint8x16_t {
    const BIT: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    let v = vcombine_u8(vdup_n_u8(h as u8), vdup_n_u8((h >> 8) as u8));
    // SAFETY: BIT is 16 bytes.
    vtstq_u8(v, unsafe { vld1q_u8(BIT.as_ptr()) })
}

/// `a * q` (one rounding).
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn mul(a: f32, q: float32x4_t) -> float32x4_t {
    vmulq_n_f32(q, a)
}

/// `a * q + b` with one rounding each (no fma), as the scalar decoders compute.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn mul_add(a: f32, q: float32x4_t, b: f32) -> float32x4_t {
    vaddq_f32(vmulq_n_f32(q, a), vdupq_n_f32(b))
}

/// `a * q - b` with one rounding each (no fma), as the scalar decoders compute.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn mul_sub(a: f32, q: float32x4_t, b: f32) -> float32x4_t {
    vsubq_f32(vmulq_n_f32(q, a), vdupq_n_f32(b))
}

/// `db * grid`, negated (sign bit flipped: an exact negation, as the scalar decoders' `-w`)
/// in the elements whose bit of `signs` is set: 8 elements of the IQ2 / IQ3 codebook types
/// (`scalar_iq::put8`).
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn signed8(db: f32, grid: u64, signs: u8) -> [float32x4_t; 2] {
    const BIT: [u32; 8] = [1, 2, 4, 8, 16, 32, 64, 128];
    let g = u8x8_f32(grid);
    let s = vdupq_n_u32(signs as u32);
    let top = vdupq_n_u32(0x8000_0000);
    let mut out = [vdupq_n_f32(0.0); 2];
    for (h, o) in out.iter_mut().enumerate() {
        // SAFETY: BIT[4h..4h + 4] is in bounds.
        let bit = unsafe { vld1q_u32(BIT.as_ptr().add(4 * h)) };
        let m = vandq_u32(vtstq_u32(s, bit), top);
        *o = vreinterpretq_f32_u32(veorq_u32(vreinterpretq_u32_f32(vmulq_n_f32(g[h], db)), m));
    }
    out
}

/// A row's dot and dequantization `(DotFn, DeqFn)` from a block decoder `$blk` of `$bb`
/// bytes and `$be` elements (`$be` a multiple of 32): `$blk::<STORE>(block, x, dst, acc)`
/// handles one block. Both check the row length first (`quant::check_len`).
macro_rules! pair {
    ($blk:ident, $bb:expr, $be:expr) => {{
        /// # Safety
        /// `row` holds `n / $be` whole blocks; `x` (dot) or `dst` (`S`) is valid for `n` f32s.
        #[target_feature(enable = "neon")]
        unsafe fn run<const S: bool>(row: &[u8], x: *const f32, dst: *mut f32, n: usize) -> f32 {
            let mut acc = $crate::quant::neon::lowbit::zero8();
            for b in 0..n / $be {
                $blk::<S>(
                    row.as_ptr().add(b * $bb),
                    x.wrapping_add(b * $be),
                    dst.wrapping_add(b * $be),
                    &mut acc,
                );
            }
            $crate::quant::neon::lowbit::finish8(&acc)
        }
        fn dot(row: &[u8], x: &[f32]) -> f32 {
            $crate::quant::check_len(row.len(), x.len(), $bb, $be);
            // Whole blocks leave no tail; `dot_f32` still adds its empty tail sum (0.0),
            // and so does this, for bit equality.
            let tail = 0f32;
            // SAFETY: NEON is baseline on aarch64; the length was checked above.
            unsafe { run::<false>(row, x.as_ptr(), std::ptr::null_mut(), x.len()) + tail }
        }
        fn deq(src: &[u8], dst: &mut [f32]) {
            $crate::quant::check_len(src.len(), dst.len(), $bb, $be);
            // SAFETY: as in `dot`.
            unsafe { run::<true>(src, std::ptr::null(), dst.as_mut_ptr(), dst.len()) };
        }
        (dot as $crate::quant::DotFn, deq as $crate::quant::DeqFn)
    }};
}
pub(super) use pair;
