//! CPU math: matrix × vector and matrix × matrix over encoded weights, multi-threaded by
//! output rows so the thread count never changes a result.
//!
//! Files:
//!
//! - `gemm.rs`: the batched matmul: rows decoded once per panel into 64-byte-aligned scratch,
//!   activations aligned likewise, token tiles sized for L1, `quant::tile` micro-tiles, split
//!   over threads by row ranges; every output bit-identical to `quant::dot_row`.
//! - `small_batch.rs`: batches of 2 to 8 rows (a speculative verification, several sequences
//!   decoding together): each weight row read once and, at AVX-512, each of its blocks decoded
//!   once into registers and multiplied into every row's accumulators (`quant::rows_kernel`,
//!   one call per task's range of weight rows, activations 64-byte aligned as in `gemm.rs`);
//!   elsewhere 2 rows at most, dotted by the matvec row kernel; `matmul_small_many`: several
//!   matrices over the same rows (q/k/v, gate/up) in one parallel region.
//! - `gemm_q8.rs`: the lossy q8 product: activations quantized once per call, panels of prepared
//!   rows, `quant::q8` tiles. `matvec_q8.rs`: its single-token product: the activation row laid
//!   out once, `quant::q8::vec_kernel` over 16-row groups split over threads, each row's value
//!   equal to its value in a batch; and its few-rows product (2 to 32 rows: several sequences
//!   decoding together), `quant::q8::multi_kernel` sharing each 16-row group's transposed
//!   blocks among 8 activation rows, each row's value again its value alone. Tests in
//!   `tests_q8.rs`.
//! - `numerics.rs`: the `Numerics` (exact or q8) a model sets for the thread during its forward
//!   pass.
//! - `attn.rs`: attention scores through transposed keys (prompts and batches; the thread's
//!   transposition buffer reused) and value sums, in AVX-512 / AVX2 lanes, the same
//!   sequential sums bit for bit. `attn_decode.rs`: a decode step's attention (a GQA group's
//!   query rows fit one vector): the group's heads in the lanes over the untransposed cache,
//!   scores split by runs of positions, value sums by group and runs of outputs; the same
//!   values bit for bit. `attn_simd.rs`: which SIMD path both take.
//! - `fused.rs`: several matvecs of one input (q/k/v, gate/up) in one parallel region
//!   (`matvec_many`).
//! - `pool.rs`: a forward pass moved onto one pool thread so its products enter the pool without
//!   a hand-off (`on_pool`, carrying the caller's numerics); the kernels' parallel loops
//!   (`for_each_task`, `for_each_chunk_mut`).
//! - `gelu.rs`: GeGLU with the tanh GELU vectorized (`x / (1 + exp(-2y))`,
//!   position-independent).
//! - `ops.rs`: RMSNorm, RoPE (angles once per position), GELU, softmax.
//! - `blocks.rs`: the kernels of the ops only some families need (`backend::Op`) that are not
//!   one call of another module (Kimi K3's residual mix, GPT-OSS's clamped SwiGLU, KDA's
//!   convolution over split q/k/v and its gated norm).

pub mod attn;
mod attn_decode;
pub mod attn_seqs;
mod attn_simd;
pub mod blocks;
mod device;
mod fused;
pub mod gelu;
mod gemm;
mod gemm_q8;
pub mod kda;
mod matvec_q8;
pub mod mla;
pub mod numerics;
pub mod ops;
pub mod pool;
pub mod small_batch;

pub use device::Cpu;
pub use fused::{matvec_each, matvec_each_at, matvec_many, matvec_many_at};
pub use numerics::{with_numerics, Numerics};
pub use pool::on_pool;

use crate::quant::{self, GgmlType, SimdLevel};
use rayon::prelude::*;

/// A row-major weight matrix of `rows` × `cols` elements in its stored encoding
/// (GGML order: `cols` is `ne[0]`, the contiguous dimension). `data.len()` is
/// `rows * ty.row_bytes(cols)`.
#[derive(Clone, Copy, Debug)]
pub struct Matrix<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
}

impl<'a> Matrix<'a> {
    /// Checks that `data` holds exactly `rows` encoded rows of `cols` elements.
    pub fn new(ty: GgmlType, rows: usize, cols: usize, data: &'a [u8]) -> Result<Self, String> {
        let rb = ty
            .row_bytes(cols)
            .ok_or_else(|| format!("{cols} columns is not a whole number of {ty} blocks"))?;
        if rows.checked_mul(rb) != Some(data.len()) {
            return Err(format!(
                "{ty} matrix {rows}x{cols} needs {} bytes, got {}",
                rows as u128 * rb as u128,
                data.len()
            ));
        }
        Ok(Self {
            ty,
            rows,
            cols,
            data,
        })
    }

    /// Bytes of one encoded row.
    pub fn row_bytes(&self) -> usize {
        self.data.len() / self.rows.max(1)
    }

    /// The encoded bytes of row `r`.
    pub fn row(&self, r: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }
}

/// Weight bytes a parallel task should cover at least, so small matrices run on one thread.
const MIN_TASK_BYTES: usize = 64 * 1024;

/// Rows per parallel task for a matrix of `rows` rows of `row_bytes` bytes: about four
/// tasks per pool thread, never fewer than `MIN_TASK_BYTES` of weights per task. Only the
/// split changes with the thread count; each output is computed the same way regardless.
fn rows_per_task(rows: usize, row_bytes: usize) -> usize {
    let min_rows = MIN_TASK_BYTES.div_ceil(row_bytes.max(1));
    let by_threads = rows.div_ceil(rayon::current_num_threads() * 4);
    by_threads.max(min_rows).max(1)
}

fn check_shapes(w: &Matrix, x: &[f32], n: usize, y: &[f32]) {
    assert_eq!(
        w.ty.row_bytes(w.cols).map(|rb| rb * w.rows),
        Some(w.data.len()),
        "{} matrix {}x{} has {} bytes",
        w.ty,
        w.rows,
        w.cols,
        w.data.len()
    );
    assert_eq!(
        x.len(),
        n * w.cols,
        "x has {} elements, want {n}x{}",
        x.len(),
        w.cols
    );
    assert_eq!(
        y.len(),
        n * w.rows,
        "y has {} elements, want {n}x{}",
        y.len(),
        w.rows
    );
}

/// `y = W x`: `x` has `w.cols` elements, `y` has `w.rows`. Each `y[r]` equals
/// `quant::dot_row(w.ty, w.row(r), x)` exactly. Runs on the current rayon pool, split by
/// output rows. Panics on shape mismatches or a type without kernels.
///
/// Inside [`with_numerics`]`(Numerics::Q8, ..)`, a weight type with an integer path takes
/// [`matmul_q8_at`] with one token instead (equal to the q8 batched product's row for the
/// same activation row, bit for bit).
pub fn matvec(w: &Matrix, x: &[f32], y: &mut [f32]) {
    if numerics::current() == Numerics::Q8 && gemm_q8::supports(w) {
        return matmul_q8_at(SimdLevel::detect(), w, x, 1, y);
    }
    matvec_at(SimdLevel::detect(), w, x, y)
}

/// [`matvec`] at a forced SIMD level (tests, benches); equals `quant::dot_row_at(level, ..)`
/// per row. Panics if the level is unavailable.
pub fn matvec_at(level: SimdLevel, w: &Matrix, x: &[f32], y: &mut [f32]) {
    check_shapes(w, x, 1, y);
    let (dot, _, _) = quant::row_kernels(level, w.ty);
    let rb = w.ty.row_bytes(w.cols).unwrap_or(0);
    let per = rows_per_task(w.rows, rb);
    let run = |first: usize, ys: &mut [f32]| {
        for (j, yv) in ys.iter_mut().enumerate() {
            let r = first + j;
            *yv = dot(&w.data[r * rb..(r + 1) * rb], x);
        }
    };
    if per >= w.rows {
        run(0, y);
    } else {
        pool::for_each_chunk_mut(y, per, |i, ys| run(i * per, ys));
    }
}

/// Raw output pointer shared by row tasks that write disjoint elements.
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint indices (distinct rows `r`), and the pointer outlives them
// (`matmul_at` borrows `y` mutably until every task has finished).
unsafe impl Sync for OutPtr {}
impl OutPtr {
    fn get(&self) -> *mut f32 {
        self.0
    }
}

/// `Y = X Wᵀ` for a batch: `x` is `n × w.cols` (row-major), `y` is `n × w.rows`. Each
/// `y[t * w.rows + r]` equals `quant::dot_row(w.ty, w.row(r), &x[t * w.cols..][..w.cols])` exactly,
/// so a prompt batch gives the same numbers as token-by-token decode. Each weight row is
/// decoded once into a per-thread scratch panel (dequantized, or integer values plus block
/// scales for the levels' block-scale types) and dotted with all `n` tokens by register-blocked
/// tiles (several rows × several tokens) whose every output follows the fused `dot_row`'s
/// accumulation order (`gemm.rs`). Split over threads by ranges of rows.
///
/// Inside [`with_numerics`]`(Numerics::Q8, ..)`, a weight type with an integer path takes
/// it instead ([`matmul_q8_at`]); every other type stays exact.
pub fn matmul(w: &Matrix, x: &[f32], n: usize, y: &mut [f32]) {
    if n >= 1 && numerics::current() == Numerics::Q8 && gemm_q8::supports(w) {
        return matmul_q8_at(SimdLevel::detect(), w, x, n, y);
    }
    matmul_at(SimdLevel::detect(), w, x, n, y)
}

/// The lossy q8 product at a forced level: `x` (`n × w.cols`) is quantized to 8 bits per
/// block (Q8_0 per 32 values for Q8_0 / Q4_0 / Q5_0 / MXFP4 weights, Q8_K per 256 for
/// Q4_K / Q5_K / Q6_K) and each `y[t * w.rows + r]` is the integer dot of `quant::q8`
/// (equal to its scalar reference at the level's lane width). Each row's value does not
/// depend on `n`: one token (decode, `matvec_q8.rs`'s single-row kernels where the level has
/// them) gives the values of that token's row in a batch, bit for bit. Types without an
/// integer path run [`matmul_at`] (exact). Panics on shape mismatches or an unavailable
/// level.
pub fn matmul_q8_at(level: SimdLevel, w: &Matrix, x: &[f32], n: usize, y: &mut [f32]) {
    check_shapes(w, x, n, y);
    if n == 0 || w.rows == 0 {
        return;
    }
    if n == 1 && matvec_q8::matvec_q8(level, w, x, y) {
        return;
    }
    if n <= matvec_q8::MULTI_MAX && matvec_q8::matmul_q8_small(level, w, x, n, y) {
        return;
    }
    if !gemm_q8::matmul_q8(level, w, x, n, y) {
        matmul_at(level, w, x, n, y)
    }
}

/// [`matmul`] at a forced SIMD level. Panics if the level is unavailable.
pub fn matmul_at(level: SimdLevel, w: &Matrix, x: &[f32], n: usize, y: &mut [f32]) {
    if n == 1 {
        return matvec_at(level, w, x, y);
    }
    check_shapes(w, x, n, y);
    if n == 0 || w.rows == 0 {
        return;
    }
    if n <= small_batch::max_rows(level, w.ty) {
        return small_batch::matmul_small(level, w, x, n, y);
    }
    gemm::matmul_tiled(level, w, x, n, y)
}

/// The register-tiled batch path of [`matmul_at`] whatever the batch size (`n ≥ 2`), for
/// benches comparing it with [`small_batch::matmul_small`]. Panics as [`matmul_at`].
pub fn matmul_tiled_at(level: SimdLevel, w: &Matrix, x: &[f32], n: usize, y: &mut [f32]) {
    check_shapes(w, x, n, y);
    if n == 0 || w.rows == 0 {
        return;
    }
    gemm::matmul_tiled(level, w, x, n, y)
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_gemm;
#[cfg(test)]
mod tests_q8;

/// `Y = X W` for a weight stored input-major (`w.rows` = inputs, `w.cols` = outputs, as
/// Hugging Face stores GPT-OSS's BF16 expert matrices `[in, out]`): `n` rows of `x`
/// (`n × w.rows`) into `y` (`n × w.cols`). Each stored row `i` is dequantized once and added
/// as `y[t] += x[t][i] · w[i]` in ascending `i` (a multiply then an add, no fma), so every
/// output is the same sum in the same order for any `n`, thread count or SIMD level; tasks
/// split the outputs by column ranges. Panics on a shape mismatch.
pub fn matmul_t(w: &Matrix, x: &[f32], n: usize, y: &mut [f32]) {
    let (k, m) = (w.rows, w.cols);
    assert_eq!(x.len(), n * k, "x has {} elements, want {n}x{k}", x.len());
    assert_eq!(y.len(), n * m, "y has {} elements, want {n}x{m}", y.len());
    assert_eq!(
        w.ty.row_bytes(m).map(|rb| rb * k),
        Some(w.data.len()),
        "{} matrix {k}x{m} has {} bytes",
        w.ty,
        w.data.len()
    );
    // columns per task: whole blocks, about four tasks per thread, at least 256 columns
    let be = w.ty.block_elems();
    let per = m
        .div_ceil(rayon::current_num_threads() * 4)
        .max(256)
        .div_ceil(be)
        * be;
    let chunks: Vec<(usize, usize)> = (0..m)
        .step_by(per.max(1))
        .map(|c0| (c0, per.min(m - c0)))
        .collect();
    let bb = w.ty.block_bytes();
    let rb = w.data.len() / k.max(1);
    let parts: Vec<Vec<f32>> = chunks
        .par_iter()
        .map(|&(c0, cw)| {
            let mut acc = vec![0f32; n * cw];
            // four stored rows at a time: each output still adds its terms one by one in
            // ascending row order, with fewer passes over the accumulators
            let mut rows = vec![0f32; 4 * cw];
            let mut i = 0;
            while i < k {
                let r = (k - i).min(4);
                for q in 0..r {
                    let o = (i + q) * rb;
                    let bytes = &w.data[o + c0 / be * bb..o + (c0 + cw) / be * bb];
                    quant::dequantize_row(w.ty, bytes, &mut rows[q * cw..(q + 1) * cw]);
                }
                for t in 0..n {
                    let xs = &x[t * k + i..t * k + i + r];
                    let a = &mut acc[t * cw..(t + 1) * cw];
                    if r == 4 {
                        let (r0, rest) = rows.split_at(cw);
                        let (r1, rest) = rest.split_at(cw);
                        let (r2, r3) = rest.split_at(cw);
                        for j in 0..cw {
                            let mut v = a[j];
                            v += xs[0] * r0[j];
                            v += xs[1] * r1[j];
                            v += xs[2] * r2[j];
                            v += xs[3] * r3[j];
                            a[j] = v;
                        }
                    } else {
                        for (q, &xv) in xs.iter().enumerate() {
                            for (av, &wv) in a.iter_mut().zip(&rows[q * cw..(q + 1) * cw]) {
                                *av += xv * wv;
                            }
                        }
                    }
                }
                i += r;
            }
            acc
        })
        .collect();
    for (&(c0, cw), part) in chunks.iter().zip(&parts) {
        for t in 0..n {
            y[t * m + c0..t * m + c0 + cw].copy_from_slice(&part[t * cw..(t + 1) * cw]);
        }
    }
}
