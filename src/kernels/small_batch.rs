//! `Y = X Wᵀ` for a batch of 2 to [`SMALL_BATCH_MAX`] rows (a speculative verification: the
//! last token plus a few drafts): each weight row is read once and dotted with every
//! activation row by the same row kernel as [`super::matvec`] (`quant::row_kernels`' dot), so
//! each output equals `quant::dot_row` bit for bit, as the tiled path's do. At these batch
//! sizes the tiled path's per-panel decoding into scratch costs more than it saves; a weight
//! row stays in L1 between its few dots, so the pass reads the matrix from memory once, like
//! a single-row matvec. Split over threads by ranges of rows.

use rayon::prelude::*;

use super::{check_shapes, rows_per_task, Matrix, OutPtr};
use crate::quant::{self, SimdLevel};

/// Largest batch [`matmul_small`] takes.
pub const SMALL_BATCH_MAX: usize = 2;

/// `y[t * w.rows + r] = dot(w.row(r), x[t])` for the `n` (≤ [`SMALL_BATCH_MAX`]) rows of `x`
/// (`n × w.cols`) into `y` (`n × w.rows`). Panics on a shape mismatch.
pub fn matmul_small(level: SimdLevel, w: &Matrix, x: &[f32], n: usize, y: &mut [f32]) {
    check_shapes(w, x, n, y);
    assert!(n <= SMALL_BATCH_MAX, "batch of {n} rows");
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
        (0..rows.div_ceil(per))
            .into_par_iter()
            .for_each(|i| run(i * per, per.min(rows - i * per)));
    }
}
