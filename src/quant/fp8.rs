//! FP8 E4M3 weights with block scales, as DeepSeek V3 publishes them: a `weight` tensor of
//! `float8_e4m3fn` values `[rows, cols]` and `weight_scale_inv` (f32 or bf16)
//! `[ceil(rows/128), ceil(cols/128)]`, with `W[r, c] = f32(q[r, c]) · scale_inv[r/128, c/128]`
//! (the last block of a dimension may be partial; DeepSeek-V3 `inference/kernel.py`
//! `weight_dequant`, and `tools/reference/README.md`).
//!
//! Deltafin computes them in [`GgmlType::F8_E4M3_B128`] rows: each row of `n` elements is
//! `ceil(n/128)` blocks of a little-endian f32 scale followed by up to 128 E4M3 bytes (only the
//! last block may be shorter), so a row carries its own scales and `dot_row` works on it alone.
//! That costs 4 bytes per 128 weights over the stored bytes (3.1%); [`pack_rows`] builds it
//! from the stored tensors.
//!
//! E4M3 (OCP 8-bit floating point spec, "E4M3FN"): sign, 4 exponent bits (bias 7), 3 mantissa
//! bits; exponent 0 is subnormal (`m · 2^-9`); no infinities; `S.1111.111` is NaN. Decoding is
//! exact in f32, then one f32 multiplication by the block scale (the same rounding as
//! `q.to(float32) * scale` in PyTorch).

use std::cell::RefCell;

use super::{DeqFn, DotFn, F32DotFn, GgmlType, SimdLevel};

/// Weights per block (and per scale along a row).
pub const BLOCK: usize = 128;

/// Bytes of a row of `n` elements in [`GgmlType::F8_E4M3_B128`]: `n + 4 · ceil(n / 128)`.
pub fn row_bytes(n: usize) -> Option<usize> {
    n.div_ceil(BLOCK).checked_mul(4)?.checked_add(n)
}

/// The f32 bit pattern of every E4M3 byte (NaN as the quiet NaN with the byte's sign).
const fn e4m3_bits(b: u8) -> u32 {
    let sign = ((b & 0x80) as u32) << 24;
    let exp = ((b >> 3) & 15) as u32;
    let man = (b & 7) as u32;
    if exp == 15 && man == 7 {
        return sign | 0x7FC0_0000;
    }
    if exp == 0 {
        if man == 0 {
            return sign;
        }
        // m · 2^-9 = 1.xx · 2^(-9 + p) with p the position of the leading bit
        let p = 31 - man.leading_zeros(); // 0..=2
        let frac = (man << (23 - p)) & 0x7F_FFFF;
        return sign | ((127 - 9 + p) << 23) | frac;
    }
    sign | ((exp + 120) << 23) | (man << 20)
}

const fn lut() -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = e4m3_bits(i as u8);
        i += 1;
    }
    t
}

static LUT: [u32; 256] = lut();

/// One E4M3 byte as f32 (exact; `0x7f` / `0xff` are NaN).
#[inline(always)]
pub fn e4m3_to_f32(b: u8) -> f32 {
    f32::from_bits(LUT[b as usize])
}

/// Repacks a stored FP8 weight into [`GgmlType::F8_E4M3_B128`] rows.
///
/// `weight`: `rows × cols` E4M3 bytes (row-major); `scales`: `ceil(rows/128) ×
/// ceil(cols/128)` values of `scale_ty` (F32 or BF16, little-endian); `dst`:
/// `rows · row_bytes(cols)` bytes. Panics on other lengths or scale types (loaders check
/// shapes first).
pub fn pack_rows(
    weight: &[u8],
    scales: &[u8],
    scale_ty: GgmlType,
    rows: usize,
    cols: usize,
    dst: &mut [u8],
) {
    let nbc = cols.div_ceil(BLOCK);
    let rb = row_bytes(cols).expect("row size");
    let es = match scale_ty {
        GgmlType::F32 => 4,
        GgmlType::BF16 => 2,
        t => panic!("FP8 scales of type {t}"),
    };
    assert_eq!(weight.len(), rows * cols, "FP8 weight bytes");
    assert_eq!(
        scales.len(),
        rows.div_ceil(BLOCK) * nbc * es,
        "FP8 scale bytes"
    );
    assert_eq!(dst.len(), rows * rb, "packed FP8 bytes");
    for r in 0..rows {
        let out = &mut dst[r * rb..(r + 1) * rb];
        let src = &weight[r * cols..(r + 1) * cols];
        let mut o = 0;
        for j in 0..nbc {
            let si = ((r / BLOCK) * nbc + j) * es;
            let s = match es {
                4 => f32::from_le_bytes(scales[si..si + 4].try_into().expect("4 bytes")),
                _ => {
                    f32::from_bits((u16::from_le_bytes([scales[si], scales[si + 1]]) as u32) << 16)
                }
            };
            out[o..o + 4].copy_from_slice(&s.to_le_bytes());
            let blk = &src[j * BLOCK..((j + 1) * BLOCK).min(cols)];
            out[o + 4..o + 4 + blk.len()].copy_from_slice(blk);
            o += 4 + blk.len();
        }
    }
}

/// Checks that `bytes` is one packed row of `n` elements.
fn check(bytes: usize, n: usize) {
    assert_eq!(
        Some(bytes),
        row_bytes(n),
        "row length mismatch: {bytes} bytes for {n} F8_E4M3_B128 elements"
    );
}

/// Scalar decoder (the reference): `dst[i] = e4m3(q_i) · scale_of_block(i)`.
pub(crate) fn decode_scalar(src: &[u8], dst: &mut [f32]) {
    check(src.len(), dst.len());
    for (blk, y) in src.chunks(BLOCK + 4).zip(dst.chunks_mut(BLOCK)) {
        let s = f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]);
        for (v, &q) in y.iter_mut().zip(&blk[4..]) {
            *v = e4m3_to_f32(q) * s;
        }
    }
}

thread_local! {
    /// Per-thread decoded row for the dots that go through the level's f32 dot.
    static ROW: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Decodes `row` with `deq` into a per-thread buffer and dots it with `x` by `dot`: the same
/// computation `kernels::matmul` does (dequantize once, then the level's f32 dot), so the two
/// agree bit for bit.
#[inline]
fn dot_via(row: &[u8], x: &[f32], deq: DeqFn, dot: F32DotFn) -> f32 {
    check(row.len(), x.len());
    ROW.with(|b| {
        let mut b = b.borrow_mut();
        if b.len() < x.len() {
            b.resize(x.len(), 0.0);
        }
        let w = &mut b[..x.len()];
        deq(row, w);
        dot(w, x)
    })
}

fn dot_scalar(row: &[u8], x: &[f32]) -> f32 {
    dot_via(
        row,
        x,
        decode_scalar,
        super::scalar::dot_f32::<super::scalar::Scalar8>,
    )
}

#[cfg(target_arch = "aarch64")]
fn dot_neon(row: &[u8], x: &[f32]) -> f32 {
    let dot = super::level_kernels(SimdLevel::Neon).dot_f32;
    dot_via(row, x, decode_scalar, dot)
}

/// The (dot, dequantize) kernels of [`GgmlType::F8_E4M3_B128`] at `level` (available).
/// AVX2 and AVX-512: fused decode + fma in the level's accumulation order (AVX2 decoder for
/// dequantization); scalar and NEON: scalar decode, then the level's f32 dot.
pub(crate) fn kernels(level: SimdLevel) -> (DotFn, DeqFn) {
    match level {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => (super::x86_fp8::dot, super::x86_fp8::decode),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 => (super::x86_fp8::dot512, super::x86_fp8::decode),
        #[cfg(target_arch = "aarch64")]
        SimdLevel::Neon => (dot_neon, decode_scalar),
        _ => (dot_scalar, decode_scalar),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_decodes_every_class_exactly() {
        assert_eq!(e4m3_to_f32(0x00), 0.0);
        assert_eq!(e4m3_to_f32(0x80).to_bits(), (-0.0f32).to_bits());
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9)); // smallest subnormal
        assert_eq!(e4m3_to_f32(0x07), 7.0 * 2f32.powi(-9)); // largest subnormal
        assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6)); // smallest normal
        assert_eq!(e4m3_to_f32(0x38), 1.0);
        assert_eq!(e4m3_to_f32(0x3c), 1.5);
        assert_eq!(e4m3_to_f32(0xbc), -1.5);
        assert_eq!(e4m3_to_f32(0x7e), 448.0); // largest finite
        assert_eq!(e4m3_to_f32(0xfe), -448.0);
        assert!(e4m3_to_f32(0x7f).is_nan() && e4m3_to_f32(0xff).is_nan());
        assert!(e4m3_to_f32(0x78).is_finite()); // 256: E4M3FN has no infinity
        assert_eq!(e4m3_to_f32(0x78), 256.0);
        // every byte: the formula in f64
        for b in 0..=255u8 {
            let (s, e, m) = (b >> 7, (b >> 3) & 15, b & 7);
            if e == 15 && m == 7 {
                continue;
            }
            let mag = if e == 0 {
                m as f64 * 2f64.powi(-9)
            } else {
                (1.0 + m as f64 / 8.0) * 2f64.powi(e as i32 - 7)
            };
            let v = if s == 1 { -mag } else { mag };
            assert_eq!(e4m3_to_f32(b) as f64, v, "byte {b:#x}");
        }
    }

    #[test]
    fn packing_puts_each_block_scale_before_its_bytes() {
        // 130 rows × 130 cols: blocks (0,0), (0,1), (1,0), (1,1), the second ones partial
        let (rows, cols) = (130, 130);
        let w: Vec<u8> = (0..rows * cols).map(|i| (i % 7) as u8 * 8 + 0x30).collect();
        let sc = [1.0f32, 2.0, 4.0, 8.0];
        let sb: Vec<u8> = sc.iter().flat_map(|s| s.to_le_bytes()).collect();
        let rb = row_bytes(cols).unwrap();
        assert_eq!(rb, 130 + 8);
        let mut p = vec![0u8; rows * rb];
        pack_rows(&w, &sb, GgmlType::F32, rows, cols, &mut p);
        let mut y = vec![0f32; cols];
        for r in [0, 127, 128, 129] {
            decode_scalar(&p[r * rb..(r + 1) * rb], &mut y);
            for c in [0, 127, 128, 129] {
                let s = sc[(r / 128) * 2 + c / 128];
                assert_eq!(y[c], e4m3_to_f32(w[r * cols + c]) * s, "r{r} c{c}");
            }
        }
        // bf16 scales read the same
        let sb16: Vec<u8> = sc
            .iter()
            .flat_map(|s| ((s.to_bits() >> 16) as u16).to_le_bytes())
            .collect();
        let mut p2 = vec![0u8; rows * rb];
        pack_rows(&w, &sb16, GgmlType::BF16, rows, cols, &mut p2);
        assert_eq!(p, p2);
    }
}
