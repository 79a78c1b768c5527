//! `Y = X Wᵀ` for a batch of 2 to [`max_rows`] rows (a speculative verification: the
//! last token plus a few drafts), each output equal to `quant::dot_row` bit for bit, as the
//! tiled path's are. Each weight row is read once and, where the level has a multi-row dot
//! (`quant::rows_kernel`: AVX-512, up to 8 rows), each of its blocks is decoded once into
//! registers and multiplied into every activation row's accumulators, so a pass of a few
//! rows costs little more than one matvec's decoding plus one multiply-add per row; elsewhere
//! the weight row is dotted with each activation row by the matvec's row kernel (2 rows at
//! most: from 3 rows up the tiled path's decode-once wins there). At these batch sizes the
//! tiled path's per-panel decoding into scratch costs more than it saves. Split over threads
//! by ranges of rows; a multi-row dot walks a task's whole range in one call (the
//! reductions of all activation rows together), on a copy of the activations laid out by
//! 32-element chunks from a 64-byte boundary on (`gemm::with_interleaved_x`: each block's
//! loads for every row are one pointer plus constants, and none straddles two cache lines,
//! as each of the 16 of a block at 8 rows did in a misaligned heap `Vec`).

use super::{check_shapes, rows_per_task, Matrix, OutPtr};
use crate::quant::{self, SimdLevel};

/// Largest batch [`matmul_small`] takes without a multi-row dot.
pub const SMALL_BATCH_MAX: usize = 2;

/// Largest batch [`matmul_small`] takes for weights of type `ty` at `level`: the multi-row
/// dot's maximum where the level has one for `ty`, else [`SMALL_BATCH_MAX`].
pub fn max_rows(level: SimdLevel, ty: quant::GgmlType) -> usize {
    quant::rows_kernel(level, ty).map_or(SMALL_BATCH_MAX, |k| k.1.max(SMALL_BATCH_MAX))
}

/// `y[t * w.rows + r] = dot(w.row(r), x[t])` for the `n` (≤ [`max_rows`]) rows of `x`
/// (`n × w.cols`) into `y` (`n × w.rows`). Panics on a shape mismatch or a larger batch.
pub fn matmul_small(level: SimdLevel, w: &Matrix, x: &[f32], n: usize, y: &mut [f32]) {
    check_shapes(w, x, n, y);
    assert!(n <= max_rows(level, w.ty), "batch of {n} rows");
    match quant::rows_kernel(level, w.ty).filter(|k| n <= k.1) {
        Some((k, _)) => super::gemm::with_interleaved_x(x, n, |xi| multi(k, w, x, xi, n, y)),
        None => per_row(level, w, x, n, y),
    }
}

/// [`matmul_small`] of several matrices over the same `n` rows of `x` (q, k and v of a
/// decode step's sequences, or gate and up) in one parallel region: `ys[i]` (`n × ws[i].rows`)
/// gets `x ws[i]ᵀ`, each output the multi-row dot's, so bit for bit what separate
/// [`matmul_small`] calls give (each matrix split into the same row ranges, the ranges of all
/// of them one list of tasks: the pool is entered once instead of once per matrix, as
/// `fused::matvec_many` does for one row). Returns `false`, computing nothing, when some
/// matrix has no multi-row dot for `n` rows at `level` (the caller then multiplies them one by
/// one). Panics on a shape mismatch.
pub fn matmul_small_many(
    level: SimdLevel,
    ws: &[&Matrix],
    x: &[f32],
    n: usize,
    ys: &mut [&mut [f32]],
) -> bool {
    assert_eq!(
        ws.len(),
        ys.len(),
        "{} matrices, {} outputs",
        ws.len(),
        ys.len()
    );
    let Some(kernels) = ws
        .iter()
        .map(|w| {
            quant::rows_kernel(level, w.ty)
                .filter(|k| n <= k.1)
                .map(|k| k.0)
        })
        .collect::<Option<Vec<_>>>()
    else {
        return false;
    };
    for (w, y) in ws.iter().zip(ys.iter()) {
        check_shapes(w, x, n, y);
    }
    // each matrix split as `multi` splits it alone
    let tasks = super::fused::matrix_tasks(ws, n);
    let outs: Vec<OutPtr> = ys.iter_mut().map(|y| OutPtr(y.as_mut_ptr())).collect();
    super::gemm::with_interleaved_x(x, n, |xi| {
        let run = |&(i, first, count): &(usize, usize, usize)| {
            let w = ws[i];
            let rb = w.ty.row_bytes(w.cols).unwrap_or(0);
            let rows_w = &w.data[first * rb..(first + count) * rb];
            // SAFETY: `ys[i]` is `n × w.rows` (checked shapes), so `t * w.rows + first + r`
            // is inside it for `t < n`, `r < count`; this task alone writes those rows of
            // matrix `i` (its tasks cover disjoint row ranges)
            unsafe { kernels[i](rows_w, x, xi, n, outs[i].get().add(first), w.rows) }
        };
        super::fused::run_tasks(ws, n, &tasks, run);
    });
    true
}

/// The multi-row dot `k` over ranges of stored rows, one range per task.
fn multi(k: quant::DotRowsFn, w: &Matrix, x: &[f32], xi: &[f32], n: usize, y: &mut [f32]) {
    let rows = w.rows;
    let rb = w.ty.row_bytes(w.cols).unwrap_or(0);
    let per = rows_per_task(rows, rb * n);
    let out = OutPtr(y.as_mut_ptr());
    let run = |first: usize, count: usize| {
        let ws = &w.data[first * rb..(first + count) * rb];
        // SAFETY: `y` is `n × rows` (checked shapes), so `t * rows + first + i` is inside it
        // for `t < n`, `i < count`; this task alone writes rows `first .. first + count`.
        unsafe { k(ws, x, xi, n, out.get().add(first), rows) }
    };
    if per >= rows {
        run(0, rows);
    } else {
        super::pool::for_each_task(rows.div_ceil(per), |i| {
            run(i * per, per.min(rows - i * per))
        });
    }
}

/// Each stored row dotted with each activation row by the matvec's row kernel.
fn per_row(level: SimdLevel, w: &Matrix, x: &[f32], n: usize, y: &mut [f32]) {
    let (dot, _, _) = quant::row_kernels(level, w.ty);
    let (rows, cols) = (w.rows, w.cols);
    let rb = w.ty.row_bytes(cols).unwrap_or(0);
    let per = rows_per_task(rows, rb * n);
    let out = OutPtr(y.as_mut_ptr());
    let run = |first: usize, count: usize| {
        for r in first..first + count {
            let wr = &w.data[r * rb..(r + 1) * rb];
            for t in 0..n {
                let v = dot(wr, &x[t * cols..(t + 1) * cols]);
                // SAFETY: index `t * rows + r` is inside `y` (checked shapes) and written by
                // this task only (rows `first .. first + count` are its own)
                unsafe { *out.get().add(t * rows + r) = v };
            }
        }
    };
    if per >= rows {
        run(0, rows);
    } else {
        super::pool::for_each_task(rows.div_ceil(per), |i| {
            run(i * per, per.min(rows - i * per))
        });
    }
}
