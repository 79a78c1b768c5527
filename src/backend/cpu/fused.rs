//! Several matvecs of one input in one parallel region: q, k and v of an attention layer, or
//! the gate and up projections of a SwiGLU/GeGLU block, read the same normed row. Run one by
//! one, each enters the thread pool and waits for its slowest task; here the rows of all of
//! them are split into one list of tasks, so the pool is entered once and a thread that
//! finishes its share of one matrix goes on with the next. Each output is still
//! `quant::dot_row` of its row, so the values are those of separate [`super::matvec`] calls.

use super::{
    check_shapes, matvec, numerics, rows_per_task, Matrix, Numerics, OutPtr, MIN_TASK_BYTES,
};
use crate::quant::{self, SimdLevel};

/// Tasks a call usually makes at most (the list's first capacity; more only grow it).
const MAX_TASKS: usize = 64;

/// `ys[i] = ws[i] x` for every `i`, in one parallel region: each `ys[i][r]` equals
/// `quant::dot_row(ws[i].ty, ws[i].row(r), x)` exactly, as [`super::matvec`] computes it.
/// Outside exact numerics (see [`super::with_numerics`]) it calls [`super::matvec`] per
/// matrix instead, so any single-token path that mode adds applies. Panics on shape
/// mismatches (every `ws[i].cols == x.len()`, `ys[i].len() == ws[i].rows`).
pub fn matvec_many(ws: &[&Matrix], x: &[f32], ys: &mut [&mut [f32]]) {
    assert_eq!(
        ws.len(),
        ys.len(),
        "{} matrices, {} outputs",
        ws.len(),
        ys.len()
    );
    if numerics::current() != Numerics::Exact {
        for (w, y) in ws.iter().zip(ys.iter_mut()) {
            matvec(w, x, y);
        }
        return;
    }
    matvec_many_at(SimdLevel::detect(), ws, x, ys)
}

/// [`matvec_many`] at a forced SIMD level, always exact. Panics if the level is unavailable.
pub fn matvec_many_at(level: SimdLevel, ws: &[&Matrix], x: &[f32], ys: &mut [&mut [f32]]) {
    let xs = vec![x; ws.len()];
    matvec_each_at(level, ws, &xs, ys)
}

/// `ys[i] = ws[i] xs[i]` for every `i`, in one parallel region: each matrix with its own
/// input (the down projections of a decode step's experts). Each `ys[i][r]` equals
/// `quant::dot_row(ws[i].ty, ws[i].row(r), xs[i])` exactly, as [`super::matvec`] computes it;
/// outside exact numerics it calls [`super::matvec`] per matrix. Panics on shape mismatches.
pub fn matvec_each(ws: &[&Matrix], xs: &[&[f32]], ys: &mut [&mut [f32]]) {
    if numerics::current() != Numerics::Exact {
        assert_eq!(
            ws.len(),
            xs.len(),
            "{} matrices, {} inputs",
            ws.len(),
            xs.len()
        );
        for ((w, x), y) in ws.iter().zip(xs).zip(ys.iter_mut()) {
            matvec(w, x, y);
        }
        return;
    }
    matvec_each_at(SimdLevel::detect(), ws, xs, ys)
}

/// [`matvec_each`] at a forced SIMD level, always exact. Panics if the level is unavailable.
pub fn matvec_each_at(level: SimdLevel, ws: &[&Matrix], xs: &[&[f32]], ys: &mut [&mut [f32]]) {
    assert_eq!(
        ws.len(),
        ys.len(),
        "{} matrices, {} outputs",
        ws.len(),
        ys.len()
    );
    assert_eq!(
        ws.len(),
        xs.len(),
        "{} matrices, {} inputs",
        ws.len(),
        xs.len()
    );
    for (i, (w, y)) in ws.iter().zip(ys.iter()).enumerate() {
        check_shapes(w, xs[i], 1, y);
    }
    let tasks = matrix_tasks(ws, 1);
    let outs: Vec<OutPtr> = ys.iter_mut().map(|y| OutPtr(y.as_mut_ptr())).collect();
    let run = |&(i, r0, count): &(usize, usize, usize)| {
        let w = ws[i];
        let (dot, _, _) = quant::row_kernels(level, w.ty);
        let rb = w.ty.row_bytes(w.cols).unwrap_or(0);
        for r in r0..r0 + count {
            let v = dot(&w.data[r * rb..(r + 1) * rb], xs[i]);
            // SAFETY: row `r` of matrix `i` is inside `ys[i]` (checked shapes) and belongs to
            // this task only (tasks cover disjoint row ranges)
            unsafe { *outs[i].get().add(r) = v };
        }
    };
    run_tasks(ws, 1, &tasks, run);
}

/// The tasks of several matrices' products over `n` rows in one parallel region: `(matrix,
/// first row, rows)`, each matrix split into the ranges a product of it alone gets
/// (`rows_per_task` of its rows at `n` times its row bytes), so that every output is computed
/// as it is alone.
pub(super) fn matrix_tasks(ws: &[&Matrix], n: usize) -> Vec<(usize, usize, usize)> {
    let mut tasks = Vec::with_capacity(MAX_TASKS);
    for (i, w) in ws.iter().enumerate() {
        let rb = w.ty.row_bytes(w.cols).unwrap_or(0);
        let per = rows_per_task(w.rows, rb * n).max(1);
        tasks.extend(
            (0..w.rows)
                .step_by(per)
                .map(|r0| (i, r0, per.min(w.rows - r0))),
        );
    }
    tasks
}

/// Runs `run` over `tasks` ([`matrix_tasks`] of `ws` at `n` rows): in one parallel region, or
/// on this thread when there is one task or the matrices hold less than a task's minimum of
/// work (`MIN_TASK_BYTES` of weights times rows).
pub(super) fn run_tasks(
    ws: &[&Matrix],
    n: usize,
    tasks: &[(usize, usize, usize)],
    run: impl Fn(&(usize, usize, usize)) + Sync,
) {
    let work: usize = ws.iter().map(|w| w.data.len() * n).sum();
    if tasks.len() <= 1 || work < MIN_TASK_BYTES {
        tasks.iter().for_each(run);
    } else {
        super::pool::for_each_task(tasks.len(), |t| run(&tasks[t]));
    }
}
