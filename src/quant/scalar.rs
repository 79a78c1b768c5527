//! Scalar block decoders (the reference dequantization) and the portable accumulation
//! scheme shared by the scalar and NEON levels.
//!
//! Every decoder reproduces GGML's dequantization (`ggml-quants.c`, `dequantize_row_*`) value
//! for value: each output is computed with the same sequence of f32 roundings, so the SIMD
//! decoders (which use the same sequence) and the `gguf` Python package agree bit for bit.

use super::ROUND;

/// Decodes a little-endian IEEE half at `b[0..2]` (exact conversion).
#[inline(always)]
pub(crate) fn f16_at(b: &[u8]) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[0], b[1]]))
}

/// Exact IEEE binary16 → binary32 conversion in integer arithmetic (IEEE 754-2008 §3.6
/// layouts: 5/10 vs 8/23 exponent/fraction bits, bias 15 vs 127). The SIMD levels use it
/// for block scales: a vector conversion of one lane makes LLVM insert into (and so wait
/// for) an unrelated register. NaNs keep their payload bits.
#[inline(always)]
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let exp = ((h >> 10) & 0x1F) as u32;
    let man = (h & 0x3FF) as u32;
    if exp.wrapping_sub(1) < 30 {
        f32::from_bits(sign | ((exp + 112) << 23) | (man << 13))
    } else if exp == 0x1F {
        f32::from_bits(sign | 0x7F80_0000 | (man << 13))
    } else {
        // Zero or subnormal: man × 2^-24, exact in f32.
        let v = man as f32 * (1.0 / 16_777_216.0);
        if sign != 0 {
            -v
        } else {
            v
        }
    }
}

/// F32 rows: little-endian f32 elements (`src.len() == 4 * dst.len()`).
pub(crate) fn decode_f32(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    }
}

/// F16 rows: IEEE binary16 elements, converted exactly.
pub(crate) fn decode_f16(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = f16_at(s);
    }
}

/// BF16 rows: the high 16 bits of an f32.
pub(crate) fn decode_bf16(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = f32::from_bits((u16::from_le_bytes([s[0], s[1]]) as u32) << 16);
    }
}

/// Q8_0 blocks (34 bytes: f16 `d`, 32 × i8 `q`): `y = d * q`.
pub(crate) fn decode_q8_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(34).zip(dst.chunks_exact_mut(32)) {
        let d = f16_at(b);
        for (v, &q) in y.iter_mut().zip(&b[2..34]) {
            *v = d * (q as i8 as f32);
        }
    }
}

/// Q4_0 blocks (18 bytes: f16 `d`, 16 bytes of nibbles): element `j < 16` is the low
/// nibble of byte `j`, element `j + 16` its high nibble; `y = d * (q - 8)`.
pub(crate) fn decode_q4_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(18).zip(dst.chunks_exact_mut(32)) {
        let d = f16_at(b);
        for (j, &q) in b[2..18].iter().enumerate() {
            y[j] = d * (((q & 15) as i32 - 8) as f32);
            y[j + 16] = d * (((q >> 4) as i32 - 8) as f32);
        }
    }
}

/// Q5_0 blocks (22 bytes: f16 `d`, u32 `qh`, 16 bytes of nibbles): element `j` has low bits
/// as in Q4_0 and fifth bit `(qh >> j) & 1`; `y = d * (q - 16)`.
pub(crate) fn decode_q5_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(22).zip(dst.chunks_exact_mut(32)) {
        let d = f16_at(b);
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        for (j, &q) in b[6..22].iter().enumerate() {
            let lo = (q & 15) as u32 | (((qh >> j) & 1) << 4);
            let hi = (q >> 4) as u32 | (((qh >> (j + 16)) & 1) << 4);
            y[j] = d * ((lo as i32 - 16) as f32);
            y[j + 16] = d * ((hi as i32 - 16) as f32);
        }
    }
}

/// E2M1 (FP4) values doubled, indexed by nibble: bit 3 is the sign, bits 0-2 the magnitudes
/// 0, 0.5, 1, 1.5, 2, 3, 4, 6 (OCP Microscaling Formats (MX) v1.0, §5.3.3), times 2 so they
/// are integers; [`e8m0_half`] halves the scale to compensate (ggml `kvalues_mxfp4`).
pub(crate) const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// An E8M0 scale byte `e` (2^(e − 127), OCP MX v1.0 §5.4.1) times ½, i.e. 2^(e − 128), as an
/// f32: subnormal for `e < 2` (ggml `ggml_e8m0_to_fp32_half`). `e = 255` (NaN in the spec)
/// decodes as 2^127, as ggml does.
#[inline(always)]
pub(crate) fn e8m0_half(e: u8) -> f32 {
    if e < 2 {
        f32::from_bits(0x0020_0000 << e)
    } else {
        f32::from_bits((e as u32 - 1) << 23)
    }
}

/// MXFP4 blocks (17 bytes: E8M0 scale `e`, 16 bytes of nibbles): element `j < 16` is the low
/// nibble of byte `j`, element `j + 16` its high nibble (the Q4_0 order);
/// `y = e8m0_half(e) * MXFP4_VALUES[q]` (one exact product).
pub(crate) fn decode_mxfp4(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(17).zip(dst.chunks_exact_mut(32)) {
        let d = e8m0_half(b[0]);
        for (j, &q) in b[1..17].iter().enumerate() {
            y[j] = d * MXFP4_VALUES[(q & 15) as usize] as f32;
            y[j + 16] = d * MXFP4_VALUES[(q >> 4) as usize] as f32;
        }
    }
}

/// Unpacks the eight 6-bit (scale, min) pairs of a Q4_K block from its 12 packed bytes
/// (GGML `get_scale_min_k4`).
#[inline(always)]
pub(crate) fn q4k_scales(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..4 {
        sc[j] = s[j] & 63;
        m[j] = s[j + 4] & 63;
        sc[j + 4] = (s[j + 8] & 15) | ((s[j] >> 6) << 4);
        m[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
    }
    (sc, m)
}

/// Q4_K blocks (144 bytes: f16 `d`, f16 `dmin`, 12 bytes of scales/mins, 128 bytes of
/// nibbles). Sub-block `r` (32 elements) uses byte range `32 * (r / 2)..+32`, low nibbles for
/// even `r`, high for odd; `y = (d * sc[r]) * q - (dmin * m[r])` (two roundings, no fma).
pub(crate) fn decode_q4_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(144).zip(dst.chunks_exact_mut(256)) {
        let d = f16_at(b);
        let dmin = f16_at(&b[2..]);
        let (sc, m) = q4k_scales(&b[4..16]);
        for r in 0..8 {
            let d1 = d * sc[r] as f32;
            let m1 = dmin * m[r] as f32;
            let qs = &b[16 + 32 * (r / 2)..][..32];
            let shift = 4 * (r & 1);
            for (v, &q) in y[32 * r..32 * r + 32].iter_mut().zip(qs) {
                *v = d1 * ((q >> shift) & 15) as f32 - m1;
            }
        }
    }
}

/// Q6_K blocks (210 bytes: 128 bytes `ql`, 64 bytes `qh`, 16 × i8 scales, f16 `d`). In half
/// `h` (128 elements), 16-element chunk `c` takes low (c < 4) or high nibbles of
/// `ql[64h + 16 (c % 4)..]`, two bits `(qh[32h + 16 (c % 2)..] >> 2 (c / 2)) & 3` on top, and
/// scale `sc[8h + c]`; `y = (d * sc) * (q - 32)`.
pub(crate) fn decode_q6_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(210).zip(dst.chunks_exact_mut(256)) {
        let d = f16_at(&b[208..]);
        for h in 0..2 {
            let ql = &b[64 * h..];
            let qh = &b[128 + 32 * h..];
            for c in 0..8 {
                let ds = d * (b[192 + 8 * h + c] as i8 as f32);
                let lo = &ql[16 * (c & 3)..][..16];
                let hi = &qh[16 * (c & 1)..][..16];
                let (ns, hs) = (4 * (c >> 2), 2 * (c >> 1));
                let out = &mut y[128 * h + 16 * c..][..16];
                for k in 0..16 {
                    let q = ((lo[k] >> ns) & 15) | (((hi[k] >> hs) & 3) << 4);
                    out[k] = ds * ((q as i32 - 32) as f32);
                }
            }
        }
    }
}

/// An accumulation scheme for one SIMD level: rounds of `ROUND` elements are accumulated
/// into fixed lanes, then reduced in a fixed order.
pub(crate) trait Accum {
    fn new() -> Self;
    /// Adds `w[i] * x[i]`; `w.len() == x.len()` is a multiple of `ROUND`.
    fn add(&mut self, w: &[f32], x: &[f32]);
    /// The fixed-order reduction of all lanes.
    fn finish(&self) -> f32;
}

/// Scalar scheme: element `i` of the row goes to accumulator `i % 8` (`acc += w * x`, two
/// roundings); the reduction is `((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))`.
pub(crate) struct Scalar8([f32; 8]);

impl Scalar8 {
    /// The scheme's state from its eight accumulators (the batch tiles accumulate them
    /// themselves and reduce here).
    pub(crate) fn from_lanes(a: [f32; 8]) -> Self {
        Self(a)
    }
}

impl Accum for Scalar8 {
    fn new() -> Self {
        Self([0.0; 8])
    }
    #[inline(always)]
    fn add(&mut self, w: &[f32], x: &[f32]) {
        for (wc, xc) in w.chunks_exact(8).zip(x.chunks_exact(8)) {
            for j in 0..8 {
                self.0[j] += wc[j] * xc[j];
            }
        }
    }
    fn finish(&self) -> f32 {
        let a = &self.0;
        let s = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
        (s[0] + s[2]) + (s[1] + s[3])
    }
}

/// Dot product of `x` with a row decoded by `decode` (`bb` bytes per block of `be`
/// elements), in the scheme `A`: whole rounds go through `A`, the last `len % ROUND`
/// elements are summed in order (`t += w * x`) and added after the reduction.
pub(crate) fn dot_decoded<A: Accum>(
    row: &[u8],
    x: &[f32],
    bb: usize,
    be: usize,
    decode: fn(&[u8], &mut [f32]),
) -> f32 {
    let n = x.len();
    super::check_len(row.len(), n, bb, be);
    let step = be.max(256);
    let mut buf = [0f32; 256];
    let mut acc = A::new();
    let mut tail = 0f32;
    let mut i = 0;
    while i < n {
        let m = step.min(n - i);
        decode(&row[i / be * bb..(i + m) / be * bb], &mut buf[..m]);
        let full = m / ROUND * ROUND;
        acc.add(&buf[..full], &x[i..i + full]);
        for k in full..m {
            tail += buf[k] * x[i + k];
        }
        i += m;
    }
    acc.finish() + tail
}

/// Dot product of two f32 vectors in the scheme `A`, with the same round/tail split as
/// [`dot_decoded`], so `dot_f32::<A>(decoded, x) == dot_decoded::<A>(row, x, ..)` exactly.
pub(crate) fn dot_f32<A: Accum>(w: &[f32], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len(), "vector length mismatch");
    let full = x.len() / ROUND * ROUND;
    let mut acc = A::new();
    acc.add(&w[..full], &x[..full]);
    let mut tail = 0f32;
    for k in full..x.len() {
        tail += w[k] * x[k];
    }
    acc.finish() + tail
}
