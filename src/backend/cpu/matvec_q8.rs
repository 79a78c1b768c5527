//! The `--numerics q8` matrix × vector product (single-token passes: decode): the
//! activation row is quantized once per call (`quant::q8::vec::VecActs`, the batched path's
//! quantization), then each weight row is dotted as stored by the level's single-row kernel
//! (`quant::q8::vec_kernel`: AVX-512 VNNI, 16 rows per call), split over threads by row
//! ranges as the exact matvec is. Every output equals the batched q8 path's
//! (`gemm_q8.rs`) for the same activation row, bit for bit, so q8 decoding and q8 batches
//! (prompts, speculative verification) agree. Where the level or type has no single-row
//! kernel, the batched path runs with one token (same values, slower: it prepares each row).
//!
//! A few rows (2 to [`MULTI_MAX`]: sequences decoded together) take [`matmul_q8_small`]: the
//! level's multi-row kernel (`quant::q8::multi_kernel`, AVX-512 VNNI: each 16-row group's
//! blocks transposed once for up to 8 activation rows), same values again.

use super::Matrix;
use crate::quant::q8::vec::{VecActs, MULTI_ACTS, VEC_ROWS};
use crate::quant::q8::{multi_kernel, vec_kernel};
use crate::quant::SimdLevel;
use std::cell::RefCell;

/// Weight bytes a parallel task should cover at least (as the exact matvec's).
const MIN_TASK_BYTES: usize = 64 * 1024;

thread_local! {
    static ACTS: RefCell<VecActs> = RefCell::new(VecActs::default());
}

/// `y = W x` in q8 numerics at `level` (shapes checked by the caller); `false` (and `y`
/// untouched) when `w`'s type or `level` has no single-row kernel.
pub(super) fn matvec_q8(level: SimdLevel, w: &Matrix, x: &[f32], y: &mut [f32]) -> bool {
    let Some((layout, kernel)) = vec_kernel(level, w.ty) else {
        return false;
    };
    let be = layout.format_block();
    if !w.cols.is_multiple_of(be) {
        return false;
    }
    let rb = w.row_bytes();
    let mut run_with = |a: &mut VecActs| {
        a.build(layout, x);
        rows16(w, rb, kernel, a, y);
    };
    // the thread's buffers, unless an enclosing product on this thread holds them
    let done = ACTS.with(|c| match c.try_borrow_mut() {
        Ok(mut a) => {
            run_with(&mut a);
            true
        }
        Err(_) => false,
    });
    if !done {
        run_with(&mut VecActs::default());
    }
    true
}

/// Most rows [`matmul_q8_small`] takes where the type has no multi-row kernel: its cost
/// grows with the rows (the single-row kernel is bound by its integer arithmetic at 2
/// threads, ~12 ms per row for the demo model), while the prepared-panel tiles of
/// `gemm_q8.rs` cost a fixed ~85 ms per call there (their panels are prepared on each call),
/// so from 8 rows the tiles are as fast.
pub(super) const SMALL_MAX: usize = 7;

/// Most rows [`matmul_q8_small`] takes where the type has a multi-row kernel
/// (`quant::q8::multi_kernel`), which runs them [`MULTI_ACTS`] at a time over each 16-row
/// group of weights; larger batches (prompts) take the prepared-panel tiles.
pub(super) const MULTI_MAX: usize = 32;

/// `y[t * w.rows + r]` for the `n` (2 to [`MULTI_MAX`], or [`SMALL_MAX`] without a multi-row
/// kernel) activation rows of `x`, each the value [`matvec_q8`] gives for that row alone (the
/// same quantized activations, and the single-row kernel's float order): a batch of a few
/// sequences decodes each as it decodes alone. A group of 16 weight rows is read once and run
/// against every activation row while it is in cache: by the multi-row kernel (its blocks
/// transposed once for up to [`MULTI_ACTS`] activation rows), else by the single-row kernel
/// once per activation row. `false` where [`matvec_q8`] has no kernel or `n` is larger
/// (nothing written).
pub(super) fn matmul_q8_small(
    level: SimdLevel,
    w: &Matrix,
    x: &[f32],
    n: usize,
    y: &mut [f32],
) -> bool {
    let Some((layout, kernel)) = vec_kernel(level, w.ty) else {
        return false;
    };
    let multi = multi_kernel(level, w.ty);
    let max = if multi.is_some() {
        MULTI_MAX
    } else {
        SMALL_MAX
    };
    if !w.cols.is_multiple_of(layout.format_block()) || n > max {
        return false;
    }
    let layout = multi.map_or(layout, |m| m.0);
    let acts: Vec<VecActs> = x
        .chunks(w.cols)
        .take(n)
        .map(|row| {
            let mut a = VecActs::default();
            a.build(layout, row);
            a
        })
        .collect();
    let (rows, rb) = (w.rows, w.row_bytes());
    let min_rows = MIN_TASK_BYTES.div_ceil((rb * n).max(1));
    let per = rows
        .div_ceil(rayon::current_num_threads() * 4)
        .max(min_rows)
        .max(1)
        .div_ceil(VEC_ROWS)
        * VEC_ROWS;
    let out = super::OutPtr(y.as_mut_ptr());
    let run = |first: usize, count: usize| {
        let mut v = [0f32; VEC_ROWS * MULTI_ACTS];
        let mut r0 = first;
        while r0 < first + count {
            let len = VEC_ROWS.min(first + count - r0);
            let put = |t: usize, v: &[f32]| {
                for (i, &val) in v[..len].iter().enumerate() {
                    // SAFETY: `t * rows + r0 + i` is inside `y` (`n × rows`, checked by the
                    // caller) and rows `first .. first + count` are this task's alone
                    unsafe { *out.get().add(t * rows + r0 + i) = val };
                }
            };
            match multi {
                Some((_, m)) => {
                    for (c, chunk) in acts.chunks(MULTI_ACTS).enumerate() {
                        m(w.data, rb, r0, len, chunk, &mut v[..VEC_ROWS * chunk.len()]);
                        for t in 0..chunk.len() {
                            put(c * MULTI_ACTS + t, &v[VEC_ROWS * t..]);
                        }
                    }
                }
                None => {
                    for (t, a) in acts.iter().enumerate() {
                        kernel(w.data, rb, r0, len, a, &mut v[..len]);
                        put(t, &v);
                    }
                }
            }
            r0 += len;
        }
    };
    if per >= rows {
        run(0, rows);
    } else {
        super::pool::for_each_task(rows.div_ceil(per), |i| {
            run(i * per, per.min(rows - i * per))
        });
    }
    true
}

fn rows16(
    w: &Matrix,
    rb: usize,
    kernel: crate::quant::q8::vec::VecRowsFn,
    a: &VecActs,
    y: &mut [f32],
) {
    let rows = w.rows;
    let min_rows = MIN_TASK_BYTES.div_ceil(rb.max(1));
    let per = rows
        .div_ceil(rayon::current_num_threads() * 4)
        .max(min_rows)
        .max(1)
        .div_ceil(VEC_ROWS)
        * VEC_ROWS;
    let run = |first: usize, ys: &mut [f32]| {
        for (g, out) in ys.chunks_mut(VEC_ROWS).enumerate() {
            let r0 = first + g * VEC_ROWS;
            kernel(w.data, rb, r0, out.len(), a, out);
        }
    };
    if per >= rows {
        run(0, y);
    } else {
        super::pool::for_each_chunk_mut(y, per, |i, ys| run(i * per, ys));
    }
}
