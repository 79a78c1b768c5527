//! The `--numerics q8` matrix × vector product (single-token passes: decode): the
//! activation row is quantized once per call (`quant::q8::vec::VecActs`, the batched path's
//! quantization), then each weight row is dotted as stored by the level's single-row kernel
//! (`quant::q8::vec_kernel`: AVX-512 VNNI, 16 rows per call), split over threads by row
//! ranges as the exact matvec is. Every output equals the batched q8 path's
//! (`gemm_q8.rs`) for the same activation row, bit for bit, so q8 decoding and q8 batches
//! (prompts, speculative verification) agree. Where the level or type has no single-row
//! kernel, the batched path runs with one token (same values, slower: it prepares each row).

use super::Matrix;
use crate::quant::q8::vec::{VecActs, VEC_ROWS};
use crate::quant::q8::vec_kernel;
use crate::quant::SimdLevel;
use rayon::prelude::*;
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

/// The rows of `w` through `kernel`, 16 at a time, tasks owning whole groups of 16.
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
        y.par_chunks_mut(per)
            .enumerate()
            .for_each(|(i, ys)| run(i * per, ys));
    }
}
