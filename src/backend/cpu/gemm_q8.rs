//! The `--numerics q8` matrix product (`numerics::Numerics::Q8`): `Y = X Wᵀ` with the
//! activations quantized once per call (`quant::q8::Q8Acts`: Q8_0 or Q8_K blocks, by the
//! weight type) and integer tiles (`quant::q8`; AVX-512 VNNI, AVX2, scalar).
//!
//! Blocking as in `gemm.rs`: tasks own ranges of weight rows; a task prepares its rows a
//! panel at a time (one byte per element plus block factors, about `PANEL_BYTES`) into a
//! per-thread scratch, then runs the tokens through the panel a tile at a time. Where the
//! level has quad tiles (AVX-512 VNNI), batches of 2 or more tokens regroup the panel into
//! row quads and the activations into token quads (`quant::q8::QuadRows`, `QuadActs`);
//! one token (decode) takes the direct tiles over the prepared rows. Every output is one
//! tile's dot, so the thread count never changes a value; at the VNNI level a token's values
//! differ in the last bits between a batch and a single-token pass (two float orders).

use super::{Matrix, OutPtr};
use crate::quant::q8::{
    int_kernels, int_plan, quad_k_of, quad_of, quantize_rows, ActFormat, IntPlan, KMeta, Q8Acts,
    QuadActs, QuadKActs, QuadKRows, QuadRows, QK, QUAD,
};
use crate::quant::SimdLevel;
use rayon::prelude::*;
use std::cell::RefCell;

/// Bytes of prepared weights per panel (one byte per element): stays in L2 beside a tile's
/// activations.
const PANEL_BYTES: usize = 96 * 1024;

/// Multiply-adds a task should cover at least, so small products run on one thread.
const MIN_TASK_MACS: usize = 1 << 20;

/// Tokens from which a level's quad tiles run: every count, so that one token's values are
/// those of its row in a batch (the direct tiles' float order differs at the VNNI level).
const QUAD_MIN_ROWS: usize = 1;

/// Activation rows above which the quantization is split over threads.
const PAR_QUANT_ROWS: usize = 8;

/// Per-thread panel scratch.
#[derive(Default)]
struct Panel {
    w: Vec<i8>,
    u: Vec<u8>,
    d: Vec<f32>,
    m: Vec<KMeta>,
    out: Vec<f32>,
    quads: QuadRows,
    quads_k: QuadKRows,
}

thread_local! {
    static PANEL: RefCell<Panel> = RefCell::new(Panel::default());
    static ACTS: RefCell<(Q8Acts, QuadActs, QuadKActs)> = RefCell::new(Default::default());
}

/// Whether `w` has an integer path (its type has one; its rows are whole activation blocks).
pub(super) fn supports(w: &Matrix) -> bool {
    int_plan(w.ty).is_some() && w.cols.is_multiple_of(32)
}

/// `y = X Wᵀ` for `n >= 1` tokens in q8 numerics at `level` (shapes checked by the
/// caller); `false` (and `y` untouched) when `w`'s type has no integer path.
pub(super) fn matmul_q8(level: SimdLevel, w: &Matrix, x: &[f32], n: usize, y: &mut [f32]) -> bool {
    let Some(plan) = int_plan(w.ty) else {
        return false;
    };
    if !supports(w) {
        return false;
    }
    let k = int_kernels(level);
    let mut run = |(a, qa, qk): &mut (Q8Acts, QuadActs, QuadKActs)| {
        quantize(a, plan.act_format(), x, w.cols, n);
        // quad tiles for every token count where the level has them (one token too: the
        // direct tiles' float order differs, see quant::q8)
        let (q32, qkt) = if n >= QUAD_MIN_ROWS {
            (k.quad32, k.quad_k)
        } else {
            (None, None)
        };
        match (plan, q32, qkt) {
            (IntPlan::B32(_), Some((tile, shape)), _) => {
                quads(a, n, qa);
                let nb = w.cols / 32;
                let build = |p: &mut Panel, np: usize, cols: usize| {
                    p.quads.build(&p.w[..np * cols], &p.d[..np * nb], np, cols)
                };
                let run = |p: &Panel, rq0, nrq, tq0, ntq, o: &mut [f32]| {
                    tile(&p.quads, rq0, nrq, qa, tq0, ntq, o)
                };
                quad_products(plan, shape, w, n, y, build, run);
            }
            (IntPlan::K(_), _, Some((tile, shape))) => {
                quads_k(a, n, qk);
                let nsb = w.cols / QK;
                let build = |p: &mut Panel, np: usize, cols: usize| {
                    p.quads_k
                        .build(&p.u[..np * cols], &p.m[..np * nsb], np, cols)
                };
                let run = |p: &Panel, rq0, nrq, tq0, ntq, o: &mut [f32]| {
                    tile(&p.quads_k, rq0, nrq, qk, tq0, ntq, o)
                };
                quad_products(plan, shape, w, n, y, build, run);
            }
            _ => products(level, plan, w, a, n, y),
        }
    };
    // the thread's buffers, unless an enclosing product on this thread holds them
    let done = ACTS.with(|c| match c.try_borrow_mut() {
        Ok(mut a) => {
            run(&mut a);
            true
        }
        Err(_) => false,
    });
    if !done {
        run(&mut Default::default());
    }
    true
}

/// Quantizes the `n` rows of `x`, split over threads for long batches (rows are
/// independent, so the split changes nothing).
fn quantize(a: &mut Q8Acts, fmt: ActFormat, x: &[f32], cols: usize, n: usize) {
    if n < PAR_QUANT_ROWS {
        return a.quantize(fmt, x, cols);
    }
    let be = match fmt {
        ActFormat::Q8_0 => 32,
        ActFormat::Q8K => QK,
    };
    a.cols = cols;
    a.qs.resize(n * cols, 0);
    a.d.resize(n * cols / be, 0.0);
    a.bsums.resize(
        if fmt == ActFormat::Q8K {
            n * cols / 16
        } else {
            0
        },
        0,
    );
    let rows = n.div_ceil(rayon::current_num_threads() * 2).max(1);
    let bs_row = if fmt == ActFormat::Q8K { cols / 16 } else { 0 };
    let qs = a.qs.par_chunks_mut(rows * cols);
    let ds = a.d.par_chunks_mut(rows * cols / be);
    let xs = x.par_chunks(rows * cols);
    if bs_row == 0 {
        xs.zip(qs)
            .zip(ds)
            .for_each(|((xc, qc), dc)| quantize_rows(fmt, xc, qc, dc, &mut []));
    } else {
        let bss = a.bsums.par_chunks_mut(rows * bs_row);
        xs.zip(qs)
            .zip(ds)
            .zip(bss)
            .for_each(|(((xc, qc), dc), bc)| quantize_rows(fmt, xc, qc, dc, bc));
    }
}

/// The tiles over row ranges (see the module header).
fn products(level: SimdLevel, plan: IntPlan, w: &Matrix, a: &Q8Acts, n: usize, y: &mut [f32]) {
    let k = int_kernels(level);
    let (rows, cols) = (w.rows, w.cols);
    let (tr, tt) = match plan {
        IntPlan::B32(_) => k.shape32,
        IntPlan::K(_) => k.shape_k,
    };
    let rb = w.ty.row_bytes(cols).unwrap_or(0);
    let (nb, nsb) = (cols / 32, cols / QK);
    let panel = (PANEL_BYTES / cols.max(1)).max(1).div_ceil(tr) * tr;
    let min_rows = MIN_TASK_MACS.div_ceil((cols * n).max(1));
    let per = rows
        .div_ceil(rayon::current_num_threads() * 4)
        .max(min_rows)
        .max(1)
        .div_ceil(tr)
        * tr;
    let out = OutPtr(y.as_mut_ptr());
    let task = |first: usize| {
        let last = (first + per).min(rows);
        PANEL.with(|p| {
            let p = &mut *p.borrow_mut();
            let mut p0 = first;
            while p0 < last {
                let p1 = (p0 + panel).min(last);
                let np = p1 - p0;
                match plan {
                    IntPlan::B32(prep) => {
                        grow(&mut p.w, np * cols, 0);
                        grow(&mut p.d, np * nb, 0.0);
                        for (i, r) in (p0..p1).enumerate() {
                            let src = &w.data[r * rb..(r + 1) * rb];
                            prep(src, &mut p.w[i * cols..][..cols], &mut p.d[i * nb..][..nb]);
                        }
                    }
                    IntPlan::K(prep) => {
                        grow(&mut p.u, np * cols, 0);
                        grow(&mut p.m, np * nsb, KMeta::default());
                        for (i, r) in (p0..p1).enumerate() {
                            let src = &w.data[r * rb..(r + 1) * rb];
                            prep(
                                src,
                                &mut p.u[i * cols..][..cols],
                                &mut p.m[i * nsb..][..nsb],
                            );
                        }
                    }
                }
                grow(&mut p.out, tr * tt, 0.0);
                let mut t0 = 0;
                while t0 < n {
                    let nt = tt.min(n - t0);
                    let mut r0 = 0;
                    while r0 < np {
                        let nr = tr.min(np - r0);
                        match plan {
                            IntPlan::B32(_) => (k.tile32)(
                                &p.w[r0 * cols..(r0 + nr) * cols],
                                &p.d[r0 * nb..(r0 + nr) * nb],
                                nr,
                                a,
                                t0,
                                nt,
                                &mut p.out,
                            ),
                            IntPlan::K(_) => (k.tile_k)(
                                &p.u[r0 * cols..(r0 + nr) * cols],
                                &p.m[r0 * nsb..(r0 + nr) * nsb],
                                nr,
                                a,
                                t0,
                                nt,
                                &mut p.out,
                            ),
                        }
                        for i in 0..nr {
                            for t in 0..nt {
                                let idx = (t0 + t) * rows + p0 + r0 + i;
                                // SAFETY: `idx < n * rows == y.len()` (checked by the caller),
                                // and row `p0 + r0 + i` belongs to this task only.
                                unsafe { *out.get().add(idx) = p.out[i * nt + t] };
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
        task(0);
    } else {
        super::pool::for_each_task(tasks, |i| task(i * per));
    }
}

/// `a`'s first `n` rows in token quads (split over threads for long batches).
fn quads(a: &Q8Acts, n: usize, qa: &mut QuadActs) {
    let cols = a.cols;
    let (nb, ng) = (cols / 32, cols / 4);
    qa.cols = cols;
    qa.quads = n.div_ceil(QUAD);
    qa.a.resize(qa.quads * ng * 16, 0);
    qa.dx.resize(qa.quads * nb * QUAD, 0.0);
    let chunks =
        qa.a.par_chunks_mut(ng * 16)
            .zip(qa.dx.par_chunks_mut(nb * QUAD))
            .enumerate();
    if n < PAR_QUANT_ROWS {
        qa.a.chunks_exact_mut(ng * 16)
            .zip(qa.dx.chunks_exact_mut(nb * QUAD))
            .enumerate()
            .for_each(|(q, (ac, dc))| quad_of(a, n, q, ac, dc));
    } else {
        chunks.for_each(|(q, (ac, dc))| quad_of(a, n, q, ac, dc));
    }
}

/// `a`'s first `n` Q8_K rows in token quads (split over threads for long batches).
fn quads_k(a: &Q8Acts, n: usize, qk: &mut QuadKActs) {
    let (la, lb, ld) = qk.shape(n, a.cols);
    let chunks =
        qk.a.par_chunks_mut(la)
            .zip(qk.bs.par_chunks_mut(lb))
            .zip(qk.dx.par_chunks_mut(ld))
            .enumerate();
    chunks.for_each(|(q, ((ac, bc), dc))| quad_k_of(a, n, q, ac, bc, dc));
}

/// The quad tiles over row ranges: as [`products`], with a panel's rows prepared (`plan`)
/// then regrouped into row quads (`build(panel, rows, cols)`), and `tile(panel, rq0, nrq,
/// tq0, ntq, out)` running one tile.
fn quad_products<B, T>(
    plan: IntPlan,
    (tr, tt): (usize, usize),
    w: &Matrix,
    n: usize,
    y: &mut [f32],
    build: B,
    tile: T,
) where
    B: Fn(&mut Panel, usize, usize) + Sync,
    T: Fn(&Panel, usize, usize, usize, usize, &mut [f32]) + Sync,
{
    let nsb = w.cols / QK;
    let (rows, cols) = (w.rows, w.cols);
    let rb = w.ty.row_bytes(cols).unwrap_or(0);
    let nb = cols / 32;
    // whole tiles of row quads per panel and per task
    let step = tr * QUAD;
    let panel = (PANEL_BYTES / cols.max(1)).max(1).div_ceil(step) * step;
    let min_rows = MIN_TASK_MACS.div_ceil((cols * n).max(1));
    let per = rows
        .div_ceil(rayon::current_num_threads() * 4)
        .max(min_rows)
        .max(1)
        .div_ceil(step)
        * step;
    let out = OutPtr(y.as_mut_ptr());
    let tq_all = n.div_ceil(QUAD);
    let task = |first: usize| {
        let last = (first + per).min(rows);
        PANEL.with(|p| {
            let p = &mut *p.borrow_mut();
            let mut p0 = first;
            while p0 < last {
                let p1 = (p0 + panel).min(last);
                let np = p1 - p0;
                match plan {
                    IntPlan::B32(prep) => {
                        grow(&mut p.w, np * cols, 0);
                        grow(&mut p.d, np * nb, 0.0);
                        for (i, r) in (p0..p1).enumerate() {
                            let src = &w.data[r * rb..(r + 1) * rb];
                            prep(src, &mut p.w[i * cols..][..cols], &mut p.d[i * nb..][..nb]);
                        }
                    }
                    IntPlan::K(prep) => {
                        grow(&mut p.u, np * cols, 0);
                        grow(&mut p.m, np * nsb, KMeta::default());
                        for (i, r) in (p0..p1).enumerate() {
                            let src = &w.data[r * rb..(r + 1) * rb];
                            prep(
                                src,
                                &mut p.u[i * cols..][..cols],
                                &mut p.m[i * nsb..][..nsb],
                            );
                        }
                    }
                }
                build(p, np, cols);
                let rq_all = np.div_ceil(QUAD);
                let mut obuf = std::mem::take(&mut p.out);
                grow(&mut obuf, tr * tt * 16, 0.0);
                let mut tq0 = 0;
                while tq0 < tq_all {
                    let ntq = tt.min(tq_all - tq0);
                    let mut rq0 = 0;
                    while rq0 < rq_all {
                        let nrq = tr.min(rq_all - rq0);
                        tile(p, rq0, nrq, tq0, ntq, &mut obuf);
                        for i in 0..nrq {
                            for j in 0..ntq {
                                let o = &obuf[(i * ntq + j) * 16..][..16];
                                for q in 0..QUAD {
                                    let t = (tq0 + j) * QUAD + q;
                                    if t >= n {
                                        break;
                                    }
                                    for pr in 0..QUAD {
                                        let r = p0 + (rq0 + i) * QUAD + pr;
                                        if r >= p1 {
                                            break;
                                        }
                                        // SAFETY: `t < n`, `r < rows`: inside `y`; row `r`
                                        // belongs to this task only.
                                        unsafe { *out.get().add(t * rows + r) = o[4 * q + pr] };
                                    }
                                }
                            }
                        }
                        rq0 += nrq;
                    }
                    tq0 += ntq;
                }
                p.out = obuf;
                p0 = p1;
            }
        })
    };
    let tasks = rows.div_ceil(per);
    if tasks == 1 {
        task(0);
    } else {
        super::pool::for_each_task(tasks, |i| task(i * per));
    }
}

/// Grows `v` to at least `len` elements.
fn grow<T: Clone>(v: &mut Vec<T>, len: usize, fill: T) {
    if v.len() < len {
        v.resize(len, fill);
    }
}
