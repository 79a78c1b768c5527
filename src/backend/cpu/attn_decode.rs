//! Attention of a decode step (one query row, or a few, per sequence) over a long KV cache,
//! without transposing the cache. The query heads that share a key head (a GQA group: 8 at
//! Qwen3-30B-A3B's 32 over 4) sit in the lanes of one vector, so each cached key is read
//! once per step and multiplied by every head of its group: lane `l` of key `j` accumulates
//! `q_l[e] · k_j[e]` over ascending `e` from `-0.0`, a rounded product then a rounded add (no
//! fma), which is exactly the one-key-at-a-time sum of [`super::attn`] (`Σ_e`, as
//! `Iterator::sum` adds), bit for bit. Eight keys run side by side (independent chains).
//!
//! Three parallel regions on the pool ([`super::pool`]): scores by (key head, run of
//! positions); softmax by query head; value sums by (key head, run of 32 outputs), every head
//! of the group at once, so each value row is read once per step too (the per-head sums of
//! `attn::weighted_rows` read each row once per query head, with a 2 KiB stride the
//! prefetchers do not follow: at 4,000 positions that was most of a step's attention). Each
//! output is still its head's sum over ascending positions from `+0.0`. How the work is split
//! changes no value, so results do not depend on the thread count. A short cache (under
//! [`SERIAL_KEYS`] keys over all key heads) is scored and normalized on the calling thread:
//! there a parallel region costs more than its work.

use std::cell::Cell;

use super::attn_simd::{detect, Simd};
use super::ops::softcap;
use super::pool::for_each_task;

/// Query lanes per key head scored together (one AVX2 vector).
pub const LANES: usize = 8;
/// Keys scored side by side.
const KEYS: usize = 8;
/// Value outputs per head one value-sum task covers (two AVX-512 vectors).
const VCOLS: usize = 32;
/// Value rows ahead of the one summed whose cache lines are prefetched.
const PREFETCH_ROWS: usize = 8;
/// Keys (positions × key heads) under which scores and softmax run on the calling thread.
pub const SERIAL_KEYS: usize = 1024;
/// Fewest positions one scoring task covers.
const MIN_RUN: usize = 64;

thread_local! {
    /// The scores buffer of this thread's last decode attention, kept for the next one.
    static SCORES: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// Raw pointer to the scores, written by tasks at disjoint positions.
struct Shared(*mut f32);
// SAFETY: tasks write disjoint elements (distinct (head, position) pairs), read only their
// own rows, and the buffer outlives both regions.
unsafe impl Sync for Shared {}
impl Shared {
    fn at(&self, i: usize) -> *mut f32 {
        // SAFETY (of the callers' writes): see the impl of `Sync`
        self.0.wrapping_add(i)
    }
}

/// The shape of grouped-query attention as [`attention_lanes`] reads it (`attn::AttnShape`'s
/// fields).
pub struct Shape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub window: Option<usize>,
    pub softcap: Option<f32>,
}

/// Whether [`attention_lanes`] takes `n` query rows of this shape (their group's queries fit
/// one vector).
pub fn fits(s: &Shape, n: usize) -> bool {
    let group = s.n_heads / s.n_kv_heads.max(1);
    n >= 1 && n * group <= LANES
}

/// `attn::attention_with_sinks` for `n` rows where [`fits`] holds: the same values bit for
/// bit (see the module header; `attn.rs`'s tests compare them).
pub fn attention_lanes(
    s: &Shape,
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    pos0: usize,
    sinks: Option<&[f32]>,
    out: &mut [f32],
) {
    lanes_on(s, q, k_cache, v_cache, pos0, sinks, false, out)
}

/// [`attention_lanes`], its regions on the pool unless `serial` (then on the calling thread
/// alone: one task of a region over several sequences, `attn_seqs::attention_seqs`). The
/// same values bit for bit either way.
#[allow(clippy::too_many_arguments)]
pub fn lanes_on(
    s: &Shape,
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    pos0: usize,
    sinks: Option<&[f32]>,
    serial: bool,
    out: &mut [f32],
) {
    let (nh, nkv, hd) = (s.n_heads, s.n_kv_heads, s.head_dim);
    let (qd, kvd, group) = (nh * hd, nkv * hd, nh / nkv);
    let n = q.len() / qd.max(1);
    assert!(fits(s, n), "{n} rows of {group} heads per key head");
    let lo_of = |p: usize| s.window.map_or(0, |w| (p + 1).saturating_sub(w));
    let lo0 = lo_of(pos0);
    let len = pos0 + n - lo0;
    assert!(k_cache.len() >= (pos0 + n) * kvd && v_cache.len() >= (pos0 + n) * kvd);
    // queries lane-major per key head: qt[g][e * LANES + t * group + hh]
    let mut qt = vec![0f32; nkv * hd * LANES];
    for g in 0..nkv {
        for t in 0..n {
            for hh in 0..group {
                let qh = &q[t * qd + (g * group + hh) * hd..][..hd];
                for (e, &v) in qh.iter().enumerate() {
                    qt[(g * hd + e) * LANES + t * group + hh] = v;
                }
            }
        }
    }
    let mut scores = SCORES.with(Cell::take);
    scores.clear();
    scores.resize(n * nh * len, 0.0);
    let sp = Shared(scores.as_mut_ptr());
    let simd = detect();
    // scores: (key head, run of positions) tasks, about four per thread
    let want = (rayon::current_num_threads() * 4).div_ceil(nkv).max(1);
    let run = len.div_ceil(want).max(MIN_RUN).div_ceil(KEYS) * KEYS;
    let runs = len.div_ceil(run);
    let par = !serial && len * nkv >= SERIAL_KEYS;
    tasks(par, nkv * runs, |i| {
        let (g, r) = (i / runs, i % runs);
        let j0 = r * run;
        let j1 = (j0 + run).min(len);
        let keys = &k_cache[lo0 * kvd + g * hd..];
        let qg = &qt[g * hd * LANES..(g + 1) * hd * LANES];
        let mut tile = [0f32; KEYS * LANES];
        let mut j = j0;
        while j < j1 {
            let m = KEYS.min(j1 - j);
            block(simd, qg, keys, kvd, j, m, hd, &mut tile);
            for t in 0..n {
                let p = pos0 + t;
                let (lo, hi) = (lo_of(p) - lo0, p - lo0);
                for hh in 0..group {
                    let row = (t * nh + g * group + hh) * len;
                    for (kk, jj) in (j..j + m).enumerate() {
                        if jj >= lo && jj <= hi {
                            // SAFETY: `row + jj < n * nh * len`; (head, position) pairs
                            // are this task's alone (its key head, its positions)
                            unsafe { *sp.at(row + jj) = tile[kk * LANES + t * group + hh] };
                        }
                    }
                }
            }
            j += m;
        }
    });
    // softmax: one task per (row, head)
    let sp = &sp;
    tasks(par, n * nh, |i| {
        let (t, h) = (i / nh, i % nh);
        let p = pos0 + t;
        let lo = lo_of(p);
        // SAFETY: row `i` of the scores belongs to this task only; the scoring region is over
        let sc = unsafe { std::slice::from_raw_parts_mut(sp.at(i * len + lo - lo0), p + 1 - lo) };
        if let Some(c) = s.softcap {
            sc.iter_mut().for_each(|v| *v = softcap(*v, c));
        }
        softmax_with_sink(sc, sinks.map(|sk| sk[h]));
    });
    // the value sums: one task per (row, key head, run of VCOLS outputs), every head of the
    // group at once, so each value row is read once per step
    let all = &scores;
    let op = Shared(out.as_mut_ptr());
    let op = &op;
    let chunks = hd.div_ceil(VCOLS);
    tasks(!serial, n * nkv * chunks, |i| {
        let (t, g, c) = (i / (nkv * chunks), i / chunks % nkv, i % chunks);
        let p = pos0 + t;
        let lo = lo_of(p);
        let c0 = c * VCOLS;
        let w = VCOLS.min(hd - c0);
        let mut ws: [&[f32]; LANES] = [&[]; LANES];
        for (hh, wh) in ws.iter_mut().enumerate().take(group) {
            let r = (t * nh + g * group + hh) * len;
            *wh = &all[r + lo - lo0..r + p + 1 - lo0];
        }
        let mut acc = [[0f32; VCOLS]; LANES];
        weighted_group(
            simd,
            &ws[..group],
            &v_cache[lo * kvd + g * hd + c0..],
            kvd,
            w,
            &mut acc,
        );
        for (hh, a) in acc.iter().enumerate().take(group) {
            let o = t * qd + (g * group + hh) * hd + c0;
            // SAFETY: outputs `o .. o + w` of head `g * group + hh` of row `t` are this
            // task's alone (its row, key head and columns), inside `out` (n × qd)
            unsafe { std::ptr::copy_nonoverlapping(a.as_ptr(), op.at(o), w) };
        }
    });
    SCORES.with(|c| c.set(scores));
}

/// `f(i)` for `i in 0..n`: split over the pool when `par`, else in order on this thread.
fn tasks(par: bool, n: usize, f: impl Fn(usize) + Sync) {
    match par {
        true => for_each_task(n, f),
        false => (0..n).for_each(f),
    }
}

/// The softmax of `x` with an optional extra logit `sink` counted in the maximum and the
/// denominator (its probability dropped): the values `ops::softmax_inplace` gives `x` with
/// `sink` pushed last, bit for bit (maximum, then `exp(v - max)` summed in f64 in order, the
/// sink's last, then each value times the rounded inverse).
fn softmax_with_sink(x: &mut [f32], sink: Option<f32>) {
    let m = x
        .iter()
        .copied()
        .chain(sink)
        .fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for v in x.iter_mut() {
        *v = (*v - m).exp();
        sum += *v as f64;
    }
    if let Some(sk) = sink {
        sum += (sk - m).exp() as f64;
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `acc[h][i] = Σ_j ws[h][j] · v[j * stride + i]` for each head `h` of `ws` (≤ `LANES`, all
/// of one length) and `i < w` (≤ `VCOLS`): each a sequential sum over ascending `j` from
/// `+0.0`, a rounded product then a rounded add, as `attn::weighted_rows` sums, so the values
/// are its values bit for bit. AVX-512 keeps every head's outputs in registers while each
/// value row is loaded once (and prefetched [`PREFETCH_ROWS`] ahead).
fn weighted_group(
    simd: Simd,
    ws: &[&[f32]],
    v: &[f32],
    stride: usize,
    w: usize,
    acc: &mut [[f32; VCOLS]; LANES],
) {
    let rows = ws.first().map_or(0, |x| x.len());
    assert!(ws.len() <= LANES && w <= VCOLS && ws.iter().all(|x| x.len() == rows));
    if rows == 0 {
        return;
    }
    assert!(v.len() >= (rows - 1) * stride + w, "value rows too short");
    #[cfg(target_arch = "x86_64")]
    if simd == Simd::Avx512 && w == VCOLS {
        // SAFETY: AVX-512 detected; reads stay inside `v` (asserted) and the weights.
        return unsafe { weighted_group_avx512(ws, v, stride, rows, acc) };
    }
    let _ = simd;
    for (h, wh) in ws.iter().enumerate() {
        for (j, &wj) in wh.iter().enumerate() {
            let row = &v[j * stride..j * stride + w];
            for (a, &x) in acc[h].iter_mut().zip(row) {
                *a += wj * x;
            }
        }
    }
}

/// [`weighted_group`]'s AVX-512 path: two vectors of outputs per head.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn weighted_group_avx512(
    ws: &[&[f32]],
    v: &[f32],
    stride: usize,
    rows: usize,
    acc: &mut [[f32; VCOLS]; LANES],
) {
    use std::arch::x86_64::*;
    let heads = ws.len();
    let mut a = [[_mm512_setzero_ps(); 2]; LANES];
    let mut wp = [ws[0].as_ptr(); LANES];
    for (h, p) in wp.iter_mut().enumerate().take(heads) {
        *p = ws[h].as_ptr();
    }
    let base = v.as_ptr();
    for j in 0..rows {
        let r = base.add(j * stride);
        if j + PREFETCH_ROWS < rows {
            let f = base.add((j + PREFETCH_ROWS) * stride) as *const i8;
            _mm_prefetch::<_MM_HINT_T0>(f);
            _mm_prefetch::<_MM_HINT_T0>(f.add(64));
        }
        let (x0, x1) = (_mm512_loadu_ps(r), _mm512_loadu_ps(r.add(16)));
        for h in 0..LANES {
            if h < heads {
                let wv = _mm512_set1_ps(*wp[h].add(j));
                a[h][0] = _mm512_add_ps(a[h][0], _mm512_mul_ps(wv, x0));
                a[h][1] = _mm512_add_ps(a[h][1], _mm512_mul_ps(wv, x1));
            }
        }
    }
    for (h, ah) in a.iter().enumerate().take(heads) {
        _mm512_storeu_ps(acc[h].as_mut_ptr(), ah[0]);
        _mm512_storeu_ps(acc[h].as_mut_ptr().add(16), ah[1]);
    }
}

/// Scores of keys `j .. j + m` (`m ≤ KEYS`; key `j` at `keys[j * kvd..][..hd]`) against the
/// lane-major queries `qt` (`hd × LANES`) into `tile[kk * LANES + l]`.
#[allow(clippy::too_many_arguments)]
fn block(
    simd: Simd,
    qt: &[f32],
    keys: &[f32],
    kvd: usize,
    j: usize,
    m: usize,
    hd: usize,
    tile: &mut [f32; KEYS * LANES],
) {
    assert!(qt.len() == hd * LANES && m <= KEYS && keys.len() >= (j + m - 1) * kvd + hd);
    #[cfg(target_arch = "x86_64")]
    if simd != Simd::None {
        // SAFETY: AVX2 detected (AVX-512 implies it); reads stay inside `qt` and keys `j .. j + m` (asserted).
        return unsafe { block_avx2(qt, keys, kvd, j, m, hd, tile) };
    }
    let _ = simd;
    let mut acc = [[-0.0f32; LANES]; KEYS];
    for e in 0..hd {
        let qe = &qt[e * LANES..(e + 1) * LANES];
        for (kk, a) in acc.iter_mut().enumerate().take(m) {
            let kv = keys[(j + kk) * kvd + e];
            for (al, &ql) in a.iter_mut().zip(qe) {
                *al += ql * kv;
            }
        }
    }
    for (kk, a) in acc.iter().enumerate() {
        tile[kk * LANES..(kk + 1) * LANES].copy_from_slice(a);
    }
}

/// [`block`] in AVX2 registers: one accumulator per key, the queries' element `e` loaded once
/// and multiplied by each key's element `e` broadcast.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn block_avx2(
    qt: &[f32],
    keys: &[f32],
    kvd: usize,
    j: usize,
    m: usize,
    hd: usize,
    tile: &mut [f32; KEYS * LANES],
) {
    use std::arch::x86_64::*;
    let mut p = [keys.as_ptr().add(j * kvd); KEYS];
    for (kk, pk) in p.iter_mut().enumerate().take(m) {
        *pk = keys.as_ptr().add((j + kk) * kvd);
    }
    // the next block's keys, one cache line of each per 16 elements
    let next = j + KEYS;
    if next + KEYS <= keys.len().saturating_sub(hd) / kvd.max(1) {
        for kk in 0..KEYS {
            let f = keys.as_ptr().add((next + kk) * kvd) as *const i8;
            for l in (0..hd * 4).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(f.add(l));
            }
        }
    }
    let mut a = [_mm256_set1_ps(-0.0); KEYS];
    let q = qt.as_ptr();
    for e in 0..hd {
        let qv = _mm256_loadu_ps(q.add(e * LANES));
        for kk in 0..KEYS {
            let kv = _mm256_set1_ps(*p[kk].add(e));
            a[kk] = _mm256_add_ps(a[kk], _mm256_mul_ps(qv, kv));
        }
    }
    for (kk, ak) in a.iter().enumerate() {
        _mm256_storeu_ps(tile.as_mut_ptr().add(kk * LANES), *ak);
    }
}
