//! The exact batched matmul behind [`super::matmul`]: `Y = X Wᵀ` for `n >= 2` tokens, every
//! output bit-identical to the single-row dot `quant::dot_row` of its row and token.
//!
//! Blocking, from the outside in:
//!
//! - **threads**: tasks own ranges of weight rows (output tiles of all `n` tokens), whole
//!   micro-tiles, about four per pool thread and never tiny; a task writes only its outputs.
//! - **panels**: a task decodes its rows a panel at a time (about `PANEL_BYTES` of f32,
//!   so the panel stays in L2) into a per-thread scratch, once per matmul: dequantized rows
//!   (`RowPlan::Dequant`) or integer values plus block scales (`RowPlan::Prepared`).
//! - **token tiles**: the tokens go through each panel `tile.tokens` at a time (fewer where
//!   `TILE_X_BYTES` says so), so the tile's activations (a few rows of `cols` floats) stay in
//!   L1 while the panel's rows pass.
//! - **micro-tiles**: `quant::tile` runs `tile.rows` rows × `tile.tokens` tokens in
//!   registers, each weight vector loaded once per tile, each output summed in its single
//!   dot's order (so no blocking here can change a value).
//!
//! A level without tiles (NEON) runs its plan's single dot per pair within the same blocking.

use super::{Matrix, OutPtr};
use crate::quant::tile::{tile_kernel, TileFn};
use crate::quant::{self, RowPlan, SimdLevel};
use std::cell::RefCell;

/// Bytes of decoded f32 weights per panel (fits L2 with a token tile beside it).
const PANEL_BYTES: usize = 192 * 1024;

/// Bytes of activations a token tile may take, so that it stays in L1 (48 KiB on this
/// generation of x86 cores) beside the few weight rows of a micro-tile.
const TILE_X_BYTES: usize = 32 * 1024;

/// Multiply-adds a task should cover at least, so small products run on one thread.
const MIN_TASK_MACS: usize = 1 << 20;

/// Per-thread scratch: the panel's decoded rows, their block scales, a tile's outputs.
#[derive(Default)]
struct Scratch {
    w: Vec<f32>,
    d: Vec<f32>,
    out: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
    /// The calling thread's 64-byte-aligned copy of misaligned activations.
    static X_COPY: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `len` elements of `v` from a 64-byte boundary on (grows `v`), so that the tiles' vector
/// loads never straddle two cache lines (each such load costs two).
fn take_aligned(v: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if v.len() < len + 16 {
        v.resize(len + 16, 0.0);
    }
    let off = v.as_ptr().align_offset(64).min(16);
    &mut v[off..off + len]
}

/// Runs `f` on the `n` rows of `x` laid out for the multi-row dots by
/// `quant::interleave_rows`, from a 64-byte boundary on: in the calling thread's scratch,
/// or (when an enclosing product on this thread holds it) in a buffer of its own.
pub(super) fn with_interleaved_x<R>(x: &[f32], n: usize, f: impl FnOnce(&[f32]) -> R) -> R {
    X_COPY.with(|c| match c.try_borrow_mut() {
        Ok(mut c) => {
            let xi = take_aligned(&mut c, x.len());
            crate::quant::interleave_rows(x, n, xi);
            f(xi)
        }
        Err(_) => {
            let mut own = Vec::new();
            let xi = take_aligned(&mut own, x.len());
            crate::quant::interleave_rows(x, n, xi);
            f(xi)
        }
    })
}

/// Grows `v` to at least `len` elements and returns its first `len`.
fn take(v: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if v.len() < len {
        v.resize(len, 0.0);
    }
    &mut v[..len]
}

/// `y = X Wᵀ` for `n >= 2` tokens at `level` (shapes checked by the caller): `y[t * rows + r]`
/// equals `quant::dot_row_at(level, w.ty, w.row(r), x_t)` bit for bit.
pub(super) fn matmul_tiled(level: SimdLevel, w: &Matrix, x: &[f32], n: usize, y: &mut [f32]) {
    with_aligned_x(x, w.cols, |x| matmul_aligned(level, w, x, n, y))
}

/// Runs `f` on activation rows (of `cols` elements) that start at 64-byte boundaries: `x`
/// itself when it does, else a copy in the calling thread's scratch when `cols` keeps every
/// row aligned and the scratch is free (not held by an enclosing product on this thread),
/// else `x` as it is. A vector load straddling two cache lines costs two, and the batched
/// products load each activation vector once per multiply-add.
pub(super) fn with_aligned_x<R>(x: &[f32], cols: usize, f: impl FnOnce(&[f32]) -> R) -> R {
    if x.as_ptr().align_offset(64) == 0 || !cols.is_multiple_of(16) {
        return f(x);
    }
    X_COPY.with(|c| match c.try_borrow_mut() {
        Ok(mut c) => {
            let xa = take_aligned(&mut c, x.len());
            xa.copy_from_slice(x);
            f(xa)
        }
        Err(_) => f(x),
    })
}

/// [`matmul_tiled`] after the activations' alignment is settled.
fn matmul_aligned(level: SimdLevel, w: &Matrix, x: &[f32], n: usize, y: &mut [f32]) {
    let plan = quant::row_plan(level, w.ty);
    let tile = tile_kernel(level, w.ty);
    let (tr, tt) = tile.map_or((4, 4), |k| (k.rows, k.tokens));
    let (rows, cols) = (w.rows, w.cols);
    // a tile taking many tokens gets as many as stay in L1 (at least 4)
    let tt = tt.min((TILE_X_BYTES / (4 * cols.max(1))).max(4));
    let rb = w.ty.row_bytes(cols).unwrap_or(0);
    let nb = match plan {
        RowPlan::Prepared(..) => cols / w.ty.block_elems(),
        RowPlan::Dequant(..) => 0,
    };
    let panel = (PANEL_BYTES / (4 * cols.max(1))).max(1).div_ceil(tr) * tr;
    let min_rows = MIN_TASK_MACS.div_ceil((cols * n).max(1));
    let per = rows
        .div_ceil(rayon::current_num_threads() * 4)
        .max(min_rows)
        .max(1)
        .div_ceil(tr)
        * tr;
    let out = OutPtr(y.as_mut_ptr());
    let run = |first: usize| {
        let last = (first + per).min(rows);
        SCRATCH.with(|s| {
            let s = &mut *s.borrow_mut();
            let mut p0 = first;
            while p0 < last {
                let p1 = (p0 + panel).min(last);
                let np = p1 - p0;
                let wbuf = take_aligned(&mut s.w, np * cols);
                let dbuf = take(&mut s.d, np * nb);
                for (i, r) in (p0..p1).enumerate() {
                    let src = &w.data[r * rb..(r + 1) * rb];
                    match plan {
                        RowPlan::Dequant(deq, _) => deq(src, &mut wbuf[i * cols..(i + 1) * cols]),
                        RowPlan::Prepared(prep, _) => prep(
                            src,
                            &mut wbuf[i * cols..(i + 1) * cols],
                            &mut dbuf[i * nb..(i + 1) * nb],
                        ),
                    }
                }
                let obuf = take(&mut s.out, tr * tt);
                let mut t0 = 0;
                while t0 < n {
                    let nt = tt.min(n - t0);
                    let xs = &x[t0 * cols..(t0 + nt) * cols];
                    let mut r0 = 0;
                    while r0 < np {
                        let nr = tr.min(np - r0);
                        let ws = &wbuf[r0 * cols..(r0 + nr) * cols];
                        let ds = &dbuf[r0 * nb..(r0 + nr) * nb];
                        match tile.map(|k| k.f) {
                            Some(TileFn::F32(f)) => f(ws, nr, xs, nt, obuf),
                            Some(TileFn::Prepared(f)) => f(ws, ds, nr, xs, nt, obuf),
                            None => pair_dots(plan, ws, ds, nr, xs, nt, obuf),
                        }
                        for i in 0..nr {
                            for t in 0..nt {
                                let idx = (t0 + t) * rows + p0 + r0 + i;
                                // SAFETY: `idx < n * rows == y.len()` (checked by the caller),
                                // and row `p0 + r0 + i` belongs to this task only.
                                unsafe { *out.get().add(idx) = obuf[i * nt + t] };
                            }
                        }
                        r0 += nr;
                    }
                    t0 += nt;
                }
                p0 = p1;
            }
        })
    };
    let tasks = rows.div_ceil(per);
    if tasks == 1 {
        run(0);
    } else {
        super::pool::for_each_task(tasks, |i| run(i * per));
    }
}

/// The tile's outputs by the plan's single dot per pair (levels without tiles).
fn pair_dots(
    plan: RowPlan,
    ws: &[f32],
    ds: &[f32],
    nr: usize,
    xs: &[f32],
    nt: usize,
    out: &mut [f32],
) {
    let cols = ws.len() / nr;
    let nb = ds.len() / nr;
    for i in 0..nr {
        for t in 0..nt {
            let (wi, xt) = (&ws[i * cols..][..cols], &xs[t * cols..][..cols]);
            out[i * nt + t] = match plan {
                RowPlan::Dequant(_, dot) => dot(wi, xt),
                RowPlan::Prepared(_, dot) => dot(wi, &ds[i * nb..][..nb], xt),
            };
        }
    }
}
