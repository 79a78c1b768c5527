//! Attention scores of many queries against the same keys, exact: the keys of a prompt are
//! transposed once per call so that `KEY_BLOCK` keys' dot products run side by side in
//! vector lanes, each still the sequential sum `Σ_e q[e] · k_j[e]` (a product then an add,
//! in ascending `e`, from `-0.0` as `Iterator::sum` starts), so the scores equal the
//! one-key-at-a-time `q.iter().zip(k).map(|(a, b)| a * b).sum()` bit for bit (AVX-512 or
//! AVX2 where the CPU has it, a portable loop otherwise; lanes are independent, so the width
//! never changes a value). The transposed rows start at 64-byte boundaries.

use std::cell::Cell;

use super::attn_decode;
use super::attn_simd::{detect, Simd};
use super::ops::{softcap, softmax_inplace};
use super::pool::for_each_chunk_mut;

/// Keys scored together (lanes of one block: 8 AVX-512 or 16 AVX2 registers).
pub const KEY_BLOCK: usize = 128;

/// Keys of `heads` heads transposed: element `e` of head `h` at position `j` is
/// `data[(h * dim + e) * stride + j]`; `stride` covers the positions plus a whole block of
/// padding (whatever the reused buffer held there), so any block starting at a valid position
/// can be read whole.
pub struct KeysT {
    data: Vec<f32>,
    /// Where the transposed rows begin in `data` (its first 64-byte boundary).
    off: usize,
    stride: usize,
    dim: usize,
}

/// Positions transposed together by [`KeysT::new`].
const TRANSPOSE_TILE: usize = 16;

thread_local! {
    /// The buffer of this thread's last [`KeysT`], kept for the next one.
    static SPARE: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

impl Drop for KeysT {
    fn drop(&mut self) {
        let data = std::mem::take(&mut self.data);
        SPARE.with(|s| s.set(data));
    }
}

/// Keys (positions × row width) from which [`KeysT::new`] splits the transposition over
/// threads: at 962 positions of 4 heads of 128 (Qwen3-30B-A3B) one thread's copy was most of
/// the time a 16-thread decode step lost to a long context (issue "CPU speed on real
/// machines"); a decode step at short context stays on its thread.
const PARALLEL_TRANSPOSE_MIN: usize = 1 << 16;

/// Transposed rows per parallel task of [`KeysT::new`].
const TRANSPOSE_ROWS: usize = 32;

/// Transposes columns `c0 ..` of the position-major keys `k` (`width` floats per position,
/// `positions` positions) into `out`, one row of `stride` floats per column, in tiles of
/// `TRANSPOSE_TILE` positions (each tile's source rows stay in L1 while every transposed row
/// gets a contiguous run of them).
fn transpose_rows(
    k: &[f32],
    positions: usize,
    width: usize,
    stride: usize,
    c0: usize,
    out: &mut [f32],
) {
    let cols = out.len() / stride;
    for j0 in (0..positions).step_by(TRANSPOSE_TILE) {
        let j1 = (j0 + TRANSPOSE_TILE).min(positions);
        for (ci, row) in out.chunks_exact_mut(stride).enumerate().take(cols) {
            let c = c0 + ci;
            for (jj, d) in row[j0..j1].iter_mut().enumerate() {
                *d = k[(j0 + jj) * width + c];
            }
        }
    }
}

impl KeysT {
    /// Transposes `positions` cached key rows (`k`: position-major, `heads × dim` floats per
    /// position). Panics if `k` is shorter than `positions * heads * dim`.
    pub fn new(k: &[f32], positions: usize, heads: usize, dim: usize) -> Self {
        let stride = positions.div_ceil(KEY_BLOCK) * KEY_BLOCK + KEY_BLOCK;
        // the thread's buffer of the last call, grown when short: a decode step transposes
        // the keys of every layer, and a fresh zeroed allocation each time cost as much as
        // the transposition. Its padding past `positions` is left as it was: a block's lanes
        // are independent and those past the scored range are dropped.
        let mut data = SPARE.with(Cell::take);
        let need = heads * dim * stride + 16;
        if data.len() < need {
            data.clear();
            data.resize(need, 0.0);
        }
        let off = data.as_ptr().align_offset(64).min(16);
        let t = &mut data[off..];
        let width = heads * dim;
        assert!(k.len() >= positions * width, "keys too short");
        // a long cache is transposed by several threads, each its own run of transposed rows
        // (a copy: the same values whatever the split); a short one on this thread
        let rows = &mut t[..width * stride];
        if positions * width >= PARALLEL_TRANSPOSE_MIN {
            for_each_chunk_mut(rows, TRANSPOSE_ROWS * stride, |i, part| {
                transpose_rows(k, positions, width, stride, i * TRANSPOSE_ROWS, part)
            });
        } else {
            transpose_rows(k, positions, width, stride, 0, rows);
        }
        Self {
            data,
            off,
            stride,
            dim,
        }
    }

    /// Appends to `out` the scores `q · k_j` of head `h` for `j` in `lo..=hi` (`hi` < the
    /// positions given to [`KeysT::new`], `q.len() == dim`), each the sequential sum.
    pub fn scores(&self, h: usize, q: &[f32], lo: usize, hi: usize, out: &mut Vec<f32>) {
        self.scores_at(detect(), h, q, lo, hi, out)
    }

    /// [`KeysT::scores`], through `simd` (only where detected) or the portable loop.
    fn scores_at(&self, simd: Simd, h: usize, q: &[f32], lo: usize, hi: usize, out: &mut Vec<f32>) {
        assert!(
            q.len() == self.dim && hi + KEY_BLOCK < self.stride,
            "score range"
        );
        let _ = simd; // read only on x86-64
        let base = h * self.dim * self.stride;
        let mut j0 = lo;
        while j0 <= hi {
            let m = KEY_BLOCK.min(hi + 1 - j0);
            let mut acc = [-0.0f32; KEY_BLOCK];
            let col = &self.data[self.off + base + j0..];
            #[cfg(target_arch = "x86_64")]
            if simd != Simd::None {
                // SAFETY: the level was detected (`simd` is only set then); `col` holds
                // `(dim - 1) * stride + KEY_BLOCK` elements (`hi + KEY_BLOCK < stride`,
                // asserted above).
                unsafe {
                    if simd == Simd::Avx512 {
                        block_avx512(q, col, self.stride, &mut acc)
                    } else {
                        block_avx2(q, col, self.stride, &mut acc)
                    }
                };
                out.extend_from_slice(&acc[..m]);
                j0 += m;
                continue;
            }
            for (e, &qe) in q.iter().enumerate() {
                let row = &col[e * self.stride..][..KEY_BLOCK];
                for (a, &kv) in acc.iter_mut().zip(row) {
                    *a += qe * kv;
                }
            }
            out.extend_from_slice(&acc[..m]);
            j0 += m;
        }
    }
}

/// One block of keys in AVX-512 registers (see [`block_avx2`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn block_avx512(q: &[f32], col: &[f32], stride: usize, acc: &mut [f32; KEY_BLOCK]) {
    use std::arch::x86_64::*;
    const V: usize = KEY_BLOCK / 16;
    let mut a = [_mm512_set1_ps(-0.0); V];
    for (e, &qe) in q.iter().enumerate() {
        let qv = _mm512_set1_ps(qe);
        let p = col.as_ptr().add(e * stride);
        for (k, ak) in a.iter_mut().enumerate() {
            *ak = _mm512_add_ps(*ak, _mm512_mul_ps(qv, _mm512_loadu_ps(p.add(16 * k))));
        }
    }
    for (k, ak) in a.iter().enumerate() {
        _mm512_storeu_ps(acc.as_mut_ptr().add(16 * k), *ak);
    }
}

/// One block of keys: `acc[l] += q[e] * col[e * stride + l]` for ascending `e`, a rounded
/// product then a rounded add per lane (no fma), as the portable loop.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn block_avx2(q: &[f32], col: &[f32], stride: usize, acc: &mut [f32; KEY_BLOCK]) {
    use std::arch::x86_64::*;
    const V: usize = KEY_BLOCK / 8;
    let mut a = [_mm256_set1_ps(-0.0); V];
    for (e, &qe) in q.iter().enumerate() {
        let qv = _mm256_set1_ps(qe);
        let p = col.as_ptr().add(e * stride);
        for (k, ak) in a.iter_mut().enumerate() {
            *ak = _mm256_add_ps(*ak, _mm256_mul_ps(qv, _mm256_loadu_ps(p.add(8 * k))));
        }
    }
    for (k, ak) in a.iter().enumerate() {
        _mm256_storeu_ps(acc.as_mut_ptr().add(8 * k), *ak);
    }
}

/// `out[i] = Σ_j w[j] · v[j * stride + i]` for `i < out.len()`, each a sequential sum over
/// ascending `j` from `+0.0` (a rounded product then a rounded add, no fma): the attention
/// output of weights `w` over value rows `stride` apart. AVX2 where the CPU has it, keeping
/// 64 outputs in registers across all rows; the same values either way. Panics if `v` is too
/// short.
pub fn weighted_rows(w: &[f32], v: &[f32], stride: usize, out: &mut [f32]) {
    weighted_rows_at(detect(), w, v, stride, out)
}

fn weighted_rows_at(simd: Simd, w: &[f32], v: &[f32], stride: usize, out: &mut [f32]) {
    let d = out.len();
    if w.is_empty() {
        out.fill(0.0);
        return;
    }
    assert!(
        v.len() >= (w.len() - 1) * stride + d,
        "value rows too short"
    );
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut c = 0;
    #[cfg(target_arch = "x86_64")]
    if simd == Simd::Avx512 {
        while c + 128 <= d {
            // SAFETY: AVX-512 detected; reads stay inside `v` (asserted above) and writes
            // inside `out[c..c + 128]`.
            unsafe { weighted_avx512(w, &v[c..], stride, &mut out[c..c + 128]) };
            c += 128;
        }
    }
    #[cfg(target_arch = "x86_64")]
    if simd != Simd::None {
        while c + 64 <= d {
            // SAFETY: AVX2 detected (`simd` is only set then); reads stay inside `v`
            // (asserted above) and writes inside `out[c..c + 64]`.
            unsafe { weighted_avx2(w, &v[c..], stride, &mut out[c..c + 64]) };
            c += 64;
        }
    }
    out[c..].fill(0.0);
    for (j, &wj) in w.iter().enumerate() {
        let row = &v[j * stride + c..j * stride + d];
        for (o, &x) in out[c..].iter_mut().zip(row) {
            *o += wj * x;
        }
    }
    let _ = simd;
}

/// 128 outputs of [`weighted_rows`] in eight AVX-512 registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn weighted_avx512(w: &[f32], v: &[f32], stride: usize, out: &mut [f32]) {
    use std::arch::x86_64::*;
    let mut a = [_mm512_setzero_ps(); 8];
    for (j, &wj) in w.iter().enumerate() {
        let wv = _mm512_set1_ps(wj);
        let p = v.as_ptr().add(j * stride);
        for (k, ak) in a.iter_mut().enumerate() {
            *ak = _mm512_add_ps(*ak, _mm512_mul_ps(wv, _mm512_loadu_ps(p.add(16 * k))));
        }
    }
    for (k, ak) in a.iter().enumerate() {
        _mm512_storeu_ps(out.as_mut_ptr().add(16 * k), *ak);
    }
}

/// 64 outputs of [`weighted_rows`] in eight registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn weighted_avx2(w: &[f32], v: &[f32], stride: usize, out: &mut [f32]) {
    use std::arch::x86_64::*;
    let mut a = [_mm256_setzero_ps(); 8];
    for (j, &wj) in w.iter().enumerate() {
        let wv = _mm256_set1_ps(wj);
        let p = v.as_ptr().add(j * stride);
        for (k, ak) in a.iter_mut().enumerate() {
            *ak = _mm256_add_ps(*ak, _mm256_mul_ps(wv, _mm256_loadu_ps(p.add(8 * k))));
        }
    }
    for (k, ak) in a.iter().enumerate() {
        _mm256_storeu_ps(out.as_mut_ptr().add(8 * k), *ak);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_imports))]
    use crate::quant::SimdLevel;

    /// The paths this CPU can run.
    fn levels() -> Vec<Simd> {
        let mut v = vec![Simd::None];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                v.push(Simd::Avx2);
            }
            if SimdLevel::Avx512.is_available() {
                v.push(Simd::Avx512);
            }
        }
        v
    }

    #[test]
    fn scores_equal_the_sequential_sum_bit_for_bit() {
        let (pos, heads, dim) = (300, 2, 40);
        let mut s = 3u64;
        let mut next = move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * if s & 1 == 0 { 1e4 } else { 1.0 }
        };
        let mut k: Vec<f32> = (0..pos * heads * dim).map(|_| next()).collect();
        // one key of negative zeros against a positive query: the sum is -0.0
        for e in 0..dim {
            k[(5 * heads) * dim + e] = -0.0;
        }
        let q: Vec<f32> = (0..dim).map(|_| next().abs()).collect();
        let kt = KeysT::new(&k, pos, heads, dim);
        for h in 0..heads {
            for (lo, hi) in [
                (0, pos - 1),
                (5, 5),
                (3, 40),
                (33, 76),
                (100, 299),
                (129, 140),
            ] {
                let mut got = Vec::new();
                kt.scores(h, &q, lo, hi, &mut got);
                for simd in levels() {
                    let mut other = Vec::new();
                    kt.scores_at(simd, h, &q, lo, hi, &mut other);
                    assert!(got
                        .iter()
                        .zip(&other)
                        .all(|(a, b)| a.to_bits() == b.to_bits()));
                }
                assert_eq!(got.len(), hi + 1 - lo);
                for (j, g) in (lo..=hi).zip(&got) {
                    let kj = &k[(j * heads + h) * dim..][..dim];
                    let want = q.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>();
                    assert_eq!(g.to_bits(), want.to_bits(), "h{h} j{j}");
                }
            }
        }
        // weighted rows: every path equals the plain ordered loop (200 = 128 + 64 + a
        // portable rest)
        let (rows, d, stride) = (19, 200, 208);
        let wts: Vec<f32> = (0..rows).map(|_| next()).collect();
        let v: Vec<f32> = (0..rows * stride).map(|_| next()).collect();
        let mut want = vec![0f32; d];
        for (j, &wj) in wts.iter().enumerate() {
            for i in 0..d {
                want[i] += wj * v[j * stride + i];
            }
        }
        for simd in levels() {
            let mut o = vec![f32::NAN; d];
            weighted_rows_at(simd, &wts, &v, stride, &mut o);
            assert!(o.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));
        }
        let mut z = Vec::new();
        kt.scores(0, &q, 5, 5, &mut z);
        assert!(z[0] == 0.0 && z[0].is_sign_negative());
    }

    #[test]
    fn a_reused_buffer_leaves_no_trace_in_the_scores() {
        let (heads, dim) = (2, 40);
        // a longer transposition of NaN keys leaves its buffer to the next one
        drop(KeysT::new(
            &vec![f32::NAN; 700 * heads * dim],
            700,
            heads,
            dim,
        ));
        let pos = 150;
        let k: Vec<f32> = (0..pos * heads * dim)
            .map(|i| ((i * 7919) % 1000) as f32 / 999.0 - 0.5)
            .collect();
        let q: Vec<f32> = (0..dim).map(|e| e as f32 / 40.0 - 0.3).collect();
        let kt = KeysT::new(&k, pos, heads, dim);
        for simd in levels() {
            for h in 0..heads {
                let mut got = Vec::new();
                kt.scores_at(simd, h, &q, 0, pos - 1, &mut got);
                for (j, g) in got.iter().enumerate() {
                    let kj = &k[(j * heads + h) * dim..][..dim];
                    let want = q.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>();
                    assert_eq!(g.to_bits(), want.to_bits(), "h{h} j{j}");
                }
            }
        }
    }
}

/// Shape of grouped-query attention (Ainslie et al. 2023): `n_heads` query heads share
/// `n_kv_heads` key/value heads of `head_dim` each.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Attend only to the last `window` positions (the current one included), if set.
    pub window: Option<usize>,
    /// Soft-cap of the scores (Gemma 2), if set.
    pub softcap: Option<f32>,
}

/// Causal attention of `n` query rows at positions `pos0..pos0+n` over the cached keys and
/// values of positions `0..pos0+n` (`k_cache`, `v_cache`: position-major, `n_kv_heads ×
/// head_dim` floats per position). `q` (`n × n_heads × head_dim`) must already be scaled;
/// the result goes to `out` (same shape as `q`). One task per (token, head); scores and
/// softmax in f32 in position order.
pub fn attention(
    s: &AttnShape,
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    pos0: usize,
    out: &mut [f32],
) {
    attention_with_sinks(s, q, k_cache, v_cache, pos0, None, out)
}

/// [`attention`] with optional learned attention sinks (`sinks`, one logit per query head, as
/// GPT-OSS defines them in transformers' `models/gpt_oss/modeling_gpt_oss.py`,
/// `eager_attention_forward`): the sink is an extra logit in each head's softmax, counted in
/// the maximum and the denominator, whose probability is dropped, so the weights over the
/// positions sum to less than one.
pub fn attention_with_sinks(
    s: &AttnShape,
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    pos0: usize,
    sinks: Option<&[f32]>,
    out: &mut [f32],
) {
    let n = q.len() / (s.n_heads * s.head_dim).max(1);
    let lanes = lanes_shape(s);
    if attn_decode::fits(&lanes, n) {
        // a decode step: the group's heads in the lanes, the cache read once, no transposition
        return attn_decode::attention_lanes(&lanes, q, k_cache, v_cache, pos0, sinks, out);
    }
    let group = s.n_heads / s.n_kv_heads;
    let transposed = n * group >= TRANSPOSE_MIN_QUERIES;
    attention_at(s, q, k_cache, v_cache, pos0, sinks, transposed, out)
}

/// `s` as `attn_decode.rs` reads it.
pub(super) fn lanes_shape(s: &AttnShape) -> attn_decode::Shape {
    attn_decode::Shape {
        n_heads: s.n_heads,
        n_kv_heads: s.n_kv_heads,
        head_dim: s.head_dim,
        window: s.window,
        softcap: s.softcap,
    }
}

/// Queries per key head from which [`attention_with_sinks`] transposes the keys once
/// ([`KeysT`]) and scores a block of keys at a time; the scores are the same
/// sequential sums bit for bit either way. One query is enough: a decode step's scores one
/// key at a time are a chain of dependent adds per key (9% of Gemma 3 270M's decode time in
/// `perf`), while copying a key into the transposed block costs a load and a store per
/// element (BENCHMARKS.md, "Decode spine").
const TRANSPOSE_MIN_QUERIES: usize = 1;

/// [`attention_with_sinks`], scoring through transposed keys or one key at a time (never the
/// lanes of `attn_decode.rs`).
#[allow(clippy::too_many_arguments)]
fn attention_at(
    s: &AttnShape,
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    pos0: usize,
    sinks: Option<&[f32]>,
    transposed: bool,
    out: &mut [f32],
) {
    let (nh, hd) = (s.n_heads, s.head_dim);
    let (qd, kvd, group) = (nh * hd, s.n_kv_heads * hd, nh / s.n_kv_heads);
    let n = q.len() / qd.max(1);
    // the first position any row attends to (a sliding window drops the ones before)
    let lo0 = s.window.map_or(0, |w| (pos0 + 1).saturating_sub(w));
    let kt =
        transposed.then(|| KeysT::new(&k_cache[lo0 * kvd..], pos0 + n - lo0, s.n_kv_heads, hd));
    for_each_chunk_mut(out, hd, |i, o| {
        let (t, h) = (i / nh, i % nh);
        let p = pos0 + t;
        let lo = s.window.map_or(0, |w| (p + 1).saturating_sub(w));
        let qh = &q[t * qd + h * hd..t * qd + (h + 1) * hd];
        let kv_off = (h / group) * hd;
        let mut scores: Vec<f32> = match &kt {
            Some(kt) => {
                let mut v = Vec::with_capacity(p + 1 - lo);
                kt.scores(h / group, qh, lo - lo0, p - lo0, &mut v);
                v
            }
            None => (lo..=p)
                .map(|j| {
                    let kj = &k_cache[j * kvd + kv_off..j * kvd + kv_off + hd];
                    qh.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>()
                })
                .collect(),
        };
        if let Some(c) = s.softcap {
            scores.iter_mut().for_each(|v| *v = softcap(*v, c));
        }
        match sinks {
            None => softmax_inplace(&mut scores),
            Some(sk) => {
                scores.push(sk[h]);
                softmax_inplace(&mut scores);
                scores.pop();
            }
        }
        weighted_rows(&scores, &v_cache[lo * kvd + kv_off..], kvd, o);
    });
}

#[cfg(test)]
mod tests_attention {
    use super::*;

    #[test]
    fn attention_weights_values_by_softmax_and_respects_the_window() {
        // one head of dim 2; keys at positions 0..3, query at position 2
        let k = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0];
        let v = [1.0, 0.0, 0.0, 1.0, 2.0, 2.0];
        let q = [1.0f32, 0.0];
        let full = AttnShape {
            n_heads: 1,
            n_kv_heads: 1,
            head_dim: 2,
            window: None,
            softcap: None,
        };
        let mut o = [0f32; 2];
        attention(&full, &q, &k, &v, 2, &mut o);
        // scores [1, 0, 1] → weights e/(2e+1), 1/(2e+1), e/(2e+1)
        let e = std::f32::consts::E;
        let (a, b) = (e / (2.0 * e + 1.0), 1.0 / (2.0 * e + 1.0));
        assert!(
            (o[0] - (a + 2.0 * a)).abs() < 1e-6 && (o[1] - (b + 2.0 * a)).abs() < 1e-6,
            "{o:?}"
        );
        // a window of 1 sees only the current position
        let win = AttnShape {
            window: Some(1),
            ..full
        };
        attention(&win, &q, &k, &v, 2, &mut o);
        assert_eq!(o, [2.0, 2.0]);
        // a sink of logit 1 next to the one visible score 1 takes half the weight
        attention_with_sinks(&win, &q, &k, &v, 2, Some(&[1.0]), &mut o);
        assert_eq!(o, [1.0, 1.0]);
    }

    /// Scoring through transposed keys gives the outputs of scoring one key at a time, bit
    /// for bit: a 70-token prompt after 9 cached positions, and single decode rows whose
    /// window starts past the first positions (only the window is transposed), caches long
    /// enough to be transposed by several threads, with grouped
    /// heads, a window, a cap, with and without sinks.
    #[test]
    fn transposed_keys_change_no_bit() {
        let s = AttnShape {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 48,
            window: Some(50),
            softcap: Some(30.0),
        };
        let whole = AttnShape { window: None, ..s };
        let cases = [
            (9, 70),
            (120, 1),
            (49, 1),
            (50, 1),
            (0, 1),
            (700, 1),
            (3, 700),
        ];
        for (s, (pos0, n)) in [s, whole].into_iter().flat_map(|s| cases.map(|c| (s, c))) {
            let total = pos0 + n;
            let mut x = 1u32 + pos0 as u32;
            let mut next = move || {
                x = x.wrapping_mul(1664525).wrapping_add(1013904223);
                (x >> 8) as f32 / (1u32 << 24) as f32 - 0.5
            };
            let kvd = s.n_kv_heads * s.head_dim;
            let k: Vec<f32> = (0..total * kvd).map(|_| 3.0 * next()).collect();
            let v: Vec<f32> = (0..total * kvd).map(|_| next()).collect();
            let q: Vec<f32> = (0..n * s.n_heads * s.head_dim).map(|_| next()).collect();
            let sinks = [0.5f32, -1.0, 2.0, 0.0];
            for sk in [None, Some(&sinks[..])] {
                let run = |transposed: bool| {
                    let mut o = vec![0f32; q.len()];
                    attention_at(&s, &q, &k, &v, pos0, sk, transposed, &mut o);
                    o
                };
                let (a, b) = (run(false), run(true));
                assert!(a.iter().any(|v| *v != 0.0));
                assert!(
                    a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "pos0 {pos0} n {n}"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests_lanes {
    use super::super::attn_decode::{attention_lanes, fits};
    use super::*;

    /// The lanes path gives the transposed path's outputs bit for bit (and so the
    /// one-key-at-a-time sums'): one row and two rows, grouped heads of 8 and 4 and 1, with a
    /// window, a cap and sinks, at short and long caches, on pools of 1, 2 and 5 threads.
    #[test]
    fn lanes_change_no_bit() {
        for threads in [1, 2, 5] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            for (nh, nkv, hd) in [(8, 1, 40), (16, 4, 32), (4, 4, 24)] {
                for window in [None, Some(50)] {
                    for (pos0, n) in [(0, 1), (9, 1), (70, 2), (700, 1), (49, 1)] {
                        let s = AttnShape {
                            n_heads: nh,
                            n_kv_heads: nkv,
                            head_dim: hd,
                            window,
                            softcap: window.map(|_| 30.0),
                        };
                        if !fits(&lanes_shape(&s), n) {
                            continue;
                        }
                        let total = pos0 + n;
                        let mut x = 11u32 + pos0 as u32;
                        let mut next = move || {
                            x = x.wrapping_mul(1664525).wrapping_add(1013904223);
                            (x >> 8) as f32 / (1u32 << 24) as f32 - 0.5
                        };
                        let kvd = nkv * hd;
                        let k: Vec<f32> = (0..total * kvd).map(|_| 3.0 * next()).collect();
                        let v: Vec<f32> = (0..total * kvd).map(|_| next()).collect();
                        let q: Vec<f32> = (0..n * nh * hd).map(|_| next()).collect();
                        let sinks: Vec<f32> = (0..nh).map(|_| next()).collect();
                        for sk in [None, Some(&sinks[..])] {
                            let mut want = vec![0f32; q.len()];
                            attention_at(&s, &q, &k, &v, pos0, sk, false, &mut want);
                            let mut got = vec![f32::NAN; q.len()];
                            pool.install(|| {
                                attention_lanes(&lanes_shape(&s), &q, &k, &v, pos0, sk, &mut got)
                            });
                            assert!(want.iter().any(|v| *v != 0.0));
                            assert!(
                                want.iter()
                                    .zip(&got)
                                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                                "{threads} threads, {nh}/{nkv} heads, pos0 {pos0} n {n}"
                            );
                        }
                    }
                }
            }
        }
    }
}
