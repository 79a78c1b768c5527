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
//!
//! This module packs rows and picks each level's kernels; the format itself (block size, row
//! sizes, E4M3 decoding) is the leaf `format`, the x86 SIMD kernels are in `quant/x86/fp8.rs`.

use std::cell::RefCell;

use super::{DeqFn, DotFn, F32DotFn, GgmlType, SimdLevel};

pub(super) mod format;
pub use format::{e4m3_to_f32, row_bytes, BLOCK};

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
        SimdLevel::Avx2 => (super::x86::fp8::dot, super::x86::fp8::decode),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 => (super::x86::fp8::dot512, super::x86::fp8::decode),
        #[cfg(target_arch = "aarch64")]
        SimdLevel::Neon => (dot_neon, decode_scalar),
        _ => (dot_scalar, decode_scalar),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
