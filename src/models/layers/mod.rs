//! Blocks shared by the architectures: batched projections, per-row norms and residuals, and
//! grouped-query attention over the KV cache. Every output element is computed the same way
//! whatever the batch size and thread count, so prefill equals token-by-token decode.

pub mod hybrid;
pub mod kda;
pub mod mixers;
pub mod mla;

use super::batch::{rows_of, rows_of_mut, Seqs};
use super::rope::RopeStyle;
use rayon::prelude::*;

use crate::kernels::attn::{weighted_rows, KeysT};
use crate::kernels::gelu::geglu_tanh;
use crate::kernels::ops::{
    rms_norm, rms_norm_inplace, rope_angles, rope_interleaved_sc, rope_neox_sc, softmax_inplace,
};
use crate::kernels::{matmul, matmul_t, matvec, matvec_many};
use crate::quant::dequantize_row;

/// Gemma's logit soft-capping `cap · tanh(x / cap)` and the RoPE inverse frequencies, for the
/// families that apply them outside the shared blocks.
pub use crate::kernels::ops::{rope_inv_freq, softcap};
/// A weight matrix view in its stored encoding (`rows × cols`), what the blocks below take.
pub use crate::kernels::Matrix;

/// Elements per parallel task of [`geglu_rows`] (a decode token's 2048-wide row stays on one
/// thread).
const GELU_CHUNK: usize = 8192;

/// `Y = X W` for `n` rows of `x` (`n × w.rows`) into `y` (`n × w.cols`): a weight stored
/// transposed (GPT-OSS's Hugging Face `gate_up_proj` / `down_proj`, `in × out`).
pub fn mm_t(w: &Matrix, x: &[f32], n: usize, y: &mut [f32]) {
    matmul_t(w, x, n, y);
}

/// A one-row weight (a bias, `1 × cols`) decoded to f32 (`cols` values).
pub fn row_f32(b: &Matrix) -> Vec<f32> {
    let mut v = vec![0f32; b.cols];
    dequantize_row(b.ty, b.data, &mut v);
    v
}

/// GeGLU with the tanh GELU in place over `g` (`g ← gelu_tanh(g) · up`, element-wise, any
/// number of rows), split over threads in chunks of 8192 elements: each element's value does
/// not depend on the split.
pub fn geglu_rows(g: &mut [f32], up: &[f32]) {
    g.par_chunks_mut(GELU_CHUNK)
        .zip(up.par_chunks(GELU_CHUNK))
        .for_each(|(gc, uc)| geglu_tanh(gc, uc));
}

/// The threads a forward pass splits its work over (the global pool's size): families size
/// their per-thread scratch with it.
pub fn pass_threads() -> usize {
    rayon::current_num_threads()
}

/// `Y = X Wᵀ` for `n` rows of `x` (`n × w.cols`) into `y` (`n × w.rows`); matvec for one row.
pub fn mm(w: &Matrix, x: &[f32], n: usize, y: &mut [f32]) {
    if n == 1 {
        matvec(w, x, y)
    } else {
        matmul(w, x, n, y)
    }
}

/// [`mm`] of several matrices over the same `n` rows `x`: `ys[i] = X ws[i]ᵀ`. One row (a
/// decode step) takes one parallel region for all of them (`kernels::matvec_many`); a batch
/// runs one product after another. The values are those of separate [`mm`] calls.
pub fn mm_many(ws: &[&Matrix], x: &[f32], n: usize, ys: &mut [&mut [f32]]) {
    if n == 1 {
        matvec_many(ws, x, ys)
    } else {
        for (w, y) in ws.iter().zip(ys.iter_mut()) {
            matmul(w, x, n, y)
        }
    }
}

/// RMSNorm of every `d`-wide row of `x` into `out` (same shape) with weight `w` (`d`).
pub fn rms_norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let d = w.len();
    if x.len() <= d {
        for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            rms_norm(xr, w, eps, or);
        }
    } else {
        // rows are independent: split a prompt's rows over threads (same values per row)
        x.par_chunks_exact(d)
            .zip(out.par_chunks_exact_mut(d))
            .for_each(|(xr, or)| rms_norm(xr, w, eps, or));
    }
}

/// Gemma-style post-norm residual: each `d`-wide row of `o` is RMS-normed with `w` (in place)
/// and added to the same row of `x`.
pub fn add_post_normed(x: &mut [f32], o: &mut [f32], w: &[f32], eps: f32) {
    let d = w.len();
    for (xr, or) in x.chunks_exact_mut(d).zip(o.chunks_exact_mut(d)) {
        rms_norm_inplace(or, w, eps);
        xr.iter_mut().zip(or.iter()).for_each(|(a, b)| *a += b);
    }
}

/// SiLU (swish), `x · σ(x) = x / (1 + e^(−x))` (Elfwing et al. 2017; Hugging Face `ACT2FN["silu"]`).
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// SwiGLU feed-forward (Shazeer 2020; Hugging Face `LlamaMLP`/`Qwen3MLP`):
/// `down(silu(gate(x)) · up(x))` for `n` rows of `x` (`n × gate.cols`) into `out`
/// (`n × down.rows`). `gate` and `up` are `ff × d`, `down` is `d × ff`.
pub fn swiglu_mlp(gate: &Matrix, up: &Matrix, down: &Matrix, x: &[f32], n: usize, out: &mut [f32]) {
    let ff = gate.rows;
    let mut g = vec![0f32; n * ff];
    let mut u = vec![0f32; n * ff];
    mm_many(&[gate, up], x, n, &mut [&mut g, &mut u]);
    g.iter_mut().zip(&u).for_each(|(a, b)| *a = silu(*a) * b);
    mm(down, &g, n, out);
}

/// Per-head RMSNorm (weight `w`, `head_dim` wide; skipped when `None`), then RoPE of `style`
/// at positions `pos0 + t`, then a multiplication by `scale`, for every `head_dim` slice of the
/// `n` rows of `x` (`n × heads × head_dim`). Qwen3 / Gemma 3 q/k norms come before RoPE.
#[allow(clippy::too_many_arguments)]
pub fn norm_rope_heads(
    x: &mut [f32],
    n: usize,
    head_dim: usize,
    w: Option<&[f32]>,
    eps: f32,
    pos0: usize,
    inv_freq: &[f32],
    style: RopeStyle,
    scale: f32,
) {
    let row = x.len() / n.max(1);
    // the angles of a position, once for all its heads
    let mut sc = Vec::with_capacity(inv_freq.len());
    for t in 0..n {
        rope_angles(pos0 + t, inv_freq, &mut sc);
        for h in x[t * row..(t + 1) * row].chunks_mut(head_dim) {
            if let Some(w) = w {
                rms_norm_inplace(h, w, eps);
            }
            match style {
                RopeStyle::Neox => rope_neox_sc(h, &sc),
                RopeStyle::Interleaved => rope_interleaved_sc(h, &sc),
            }
            if scale != 1.0 {
                h.iter_mut().for_each(|v| *v *= scale);
            }
        }
    }
}

/// `x += y` element-wise (residual connection).
pub fn add_into(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}

/// Adds the bias `b` to every `b.len()`-wide row of `y`.
pub fn add_bias(y: &mut [f32], b: &[f32]) {
    for r in y.chunks_exact_mut(b.len()) {
        add_into(r, b);
    }
}

/// One grouped-query attention layer's weights, as the Llama, GPT-OSS and Gemma 3 families
/// hold them: projections `q` (`q_dim × hidden`), `k`, `v` (`kv_dim × hidden`), `o`
/// (`hidden × q_dim`) and the optional extras each family adds.
pub struct Gqa<'a> {
    pub q: Matrix<'a>,
    pub k: Matrix<'a>,
    pub v: Matrix<'a>,
    pub o: Matrix<'a>,
    /// Biases of q, k, v (`q_dim`, `kv_dim`, `kv_dim`) and o (`hidden`), each added right
    /// after its projection (GPT-OSS).
    pub biases: Option<[&'a [f32]; 4]>,
    /// Per-head RMSNorm weights of q and k (`head_dim` each), applied before RoPE (Qwen3,
    /// Gemma 3).
    pub qk_norm: Option<[&'a [f32]; 2]>,
    /// One learned sink logit per query head ([`attention_with_sinks`], GPT-OSS).
    pub sinks: Option<&'a [f32]>,
}

/// How [`gqa_attention`] rotates and scales q and k.
pub struct GqaRope<'a> {
    /// Inverse frequencies (`head_dim / 2`).
    pub inv_freq: &'a [f32],
    pub style: RopeStyle,
    /// Multiplies q after RoPE (the score scale, times any YaRN attention factor).
    pub q_scale: f32,
    /// Multiplies k after RoPE (a YaRN attention factor, else 1).
    pub k_scale: f32,
    /// Epsilon of the q/k norms.
    pub eps: f32,
}

/// Grouped-query attention of the normed rows `xn` (`rows × hidden`) of the sequences `seqs`
/// in layer `l`: q, k, v projections (plus biases) over every row, then per sequence its rows'
/// per-head q/k RMSNorm when present, RoPE and scaling at its positions ([`norm_rope_heads`]),
/// its new keys and values written to its layer-`l` caches (position-major, `kv_dim` floats
/// per position), its causal attention ([`attention_with_sinks`]); then the output projection
/// (plus bias) over every row into `out` (`rows × hidden`, the residual not added).
pub fn gqa_attention(
    s: &AttnShape,
    w: &Gqa,
    r: &GqaRope,
    xn: &[f32],
    seqs: &mut Seqs<'_>,
    l: usize,
    out: &mut [f32],
) {
    let hd = s.head_dim;
    let n = seqs.rows();
    let (qd, kvd) = (s.n_heads * hd, s.n_kv_heads * hd);
    let mut q = vec![0f32; n * qd];
    let mut k = vec![0f32; n * kvd];
    let mut v = vec![0f32; n * kvd];
    mm_many(&[&w.q, &w.k, &w.v], xn, n, &mut [&mut q, &mut k, &mut v]);
    if let Some([bq, bk, bv, _]) = w.biases {
        add_bias(&mut q, bq);
        add_bias(&mut k, bk);
        add_bias(&mut v, bv);
    }
    let (qn, kn) = match w.qk_norm {
        Some([a, b]) => (Some(a), Some(b)),
        None => (None, None),
    };
    let mut att = vec![0f32; n * qd];
    for (r0, sq) in seqs.each() {
        let (pos0, m) = (sq.pos0, sq.n);
        let qs = rows_of_mut(&mut q, qd, r0, m);
        let ks = rows_of_mut(&mut k, kvd, r0, m);
        norm_rope_heads(qs, m, hd, qn, r.eps, pos0, r.inv_freq, r.style, r.q_scale);
        norm_rope_heads(ks, m, hd, kn, r.eps, pos0, r.inv_freq, r.style, r.k_scale);
        let (k_cache, v_cache) = (&mut sq.cache.k[l], &mut sq.cache.v[l]);
        k_cache[pos0 * kvd..(pos0 + m) * kvd].copy_from_slice(ks);
        v_cache[pos0 * kvd..(pos0 + m) * kvd].copy_from_slice(rows_of(&v, kvd, r0, m));
        let a = rows_of_mut(&mut att, qd, r0, m);
        attention_with_sinks(s, qs, k_cache, v_cache, pos0, w.sinks, a);
    }
    mm(&w.o, &att, n, out);
    if let Some([_, _, _, bo]) = w.biases {
        add_bias(out, bo);
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
    let group = s.n_heads / s.n_kv_heads;
    let transposed = n * group >= TRANSPOSE_MIN_QUERIES;
    attention_at(s, q, k_cache, v_cache, pos0, sinks, transposed, out)
}

/// Queries per key head from which [`attention_with_sinks`] transposes the keys once
/// (`kernels::attn::KeysT`) and scores a block of keys at a time; the scores are the same
/// sequential sums bit for bit either way. One query is enough: a decode step's scores one
/// key at a time are a chain of dependent adds per key (9% of Gemma 3 270M's decode time in
/// `perf`), while copying a key into the transposed block costs a load and a store per
/// element (BENCHMARKS.md, "Decode spine").
const TRANSPOSE_MIN_QUERIES: usize = 1;

/// [`attention_with_sinks`], scoring through transposed keys or one key at a time.
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
    out.par_chunks_mut(hd).enumerate().for_each(|(i, o)| {
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
mod tests {
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
    /// window starts past the first positions (only the window is transposed), with grouped
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
        for (pos0, n) in [(9, 70), (120, 1), (49, 1), (50, 1), (0, 1)] {
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
