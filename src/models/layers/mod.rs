//! Blocks shared by the architectures: batched projections, per-row norms and residuals, and
//! grouped-query attention over the KV cache. Every output element is computed the same way
//! whatever the batch size and thread count, so prefill equals token-by-token decode.

pub mod generic;
pub mod hybrid;
pub mod mixers;

/// Causal attention over a KV cache, RMSNorm of rows, GeGLU of rows and the pass's thread
/// count, from the backend.
pub use crate::backend::cpu::{
    attn::{attention, attention_with_sinks, AttnShape},
    gelu::geglu_rows,
    ops::{rms_norm_rows, silu},
    pool::threads as pass_threads,
};
/// The MLA and KDA kernels, with the shared blocks that call them.
pub use crate::backend::cpu::{kda, mla};

use super::batch::{rows_of, rows_of_mut, Seqs};
use super::rope::RopeStyle;

use crate::backend::cpu::ops::{rms_norm_inplace, rope_angles, rope_interleaved_sc, rope_neox_sc};
use crate::backend::cpu::{matmul, matmul_t, matvec, matvec_each, matvec_many};
use crate::quant::dequantize_row;

/// Gemma's logit soft-capping `cap · tanh(x / cap)` and the RoPE inverse frequencies, for the
/// families that apply them outside the shared blocks.
pub use crate::backend::cpu::ops::{rope_inv_freq, softcap};
/// A weight matrix view in its stored encoding (`rows × cols`), what the blocks below take.
pub use crate::backend::cpu::Matrix;

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

/// One row through each of several matrices, each with its own input: `ys[i] = ws[i] xs[i]`
/// in one parallel region (`kernels::matvec_each`: a decode step's expert down projections);
/// the values are those of separate [`mm`] calls with one row.
pub fn mm_each(ws: &[&Matrix], xs: &[&[f32]], ys: &mut [&mut [f32]]) {
    matvec_each(ws, xs, ys)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{cpu::Cpu, Backend};
    use crate::models::KvCache;
    use crate::quant::GgmlType;

    /// f32 bytes of a `rows × cols` matrix filled from `seed`.
    fn f32_bytes(rows: usize, cols: usize, seed: u32) -> Vec<u8> {
        let mut x = seed;
        (0..rows * cols)
            .flat_map(|_| {
                x = x.wrapping_mul(1664525).wrapping_add(1013904223);
                ((x >> 8) as f32 / (1u32 << 24) as f32 - 0.5).to_le_bytes()
            })
            .collect()
    }

    /// The backend's ops, wired as grouped-query attention wires them (projections, RoPE and
    /// scale, the cache, attention, output projection), give `gqa_attention`'s output bit for
    /// bit: the blocks compute with exactly the ops a backend provides.
    #[test]
    fn backend_ops_compose_to_the_attention_block() {
        let (d, nh, nkv, hd, pos0, n) = (32, 4, 2, 8, 3, 2);
        let (qd, kvd) = (nh * hd, nkv * hd);
        let bytes: Vec<Vec<u8>> = [(qd, d), (kvd, d), (kvd, d), (d, qd)]
            .iter()
            .enumerate()
            .map(|(i, &(r, c))| f32_bytes(r, c, 7 + i as u32))
            .collect();
        let m = |i: usize, r, c| Matrix::new(GgmlType::F32, r, c, &bytes[i]).unwrap();
        let (wq, wk, wv, wo) = (m(0, qd, d), m(1, kvd, d), m(2, kvd, d), m(3, d, qd));
        let shape = AttnShape {
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: hd,
            window: None,
            softcap: None,
        };
        let inv_freq = rope_inv_freq(hd, 10000.0, 1.0);
        let rope = GqaRope {
            inv_freq: &inv_freq,
            style: RopeStyle::Neox,
            q_scale: 0.25,
            k_scale: 1.0,
            eps: 1e-6,
        };
        let gqa = Gqa {
            q: wq,
            k: wk,
            v: wv,
            o: wo,
            biases: None,
            qk_norm: None,
            sinks: None,
        };
        let xn: Vec<f32> = f32_bytes(n, d, 99)
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        // earlier positions already in the cache
        let past: Vec<f32> = f32_bytes(pos0, kvd, 5)
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let mut cache = KvCache::new(1, 8, kvd);
        cache.k[0][..pos0 * kvd].copy_from_slice(&past);
        cache.v[0][..pos0 * kvd].copy_from_slice(&past);
        let mut want = vec![0f32; n * d];
        let mut c = KvCache::new(1, 8, kvd);
        c.k[0].clone_from(&cache.k[0]);
        c.v[0].clone_from(&cache.v[0]);
        gqa_attention(
            &shape,
            &gqa,
            &rope,
            &xn,
            &mut Seqs::one(&mut c, pos0, n),
            0,
            &mut want,
        );

        let be = Cpu::default();
        let x = be.upload(&xn).unwrap();
        let (mut q, mut k, mut v) = (
            be.zeros(n * qd).unwrap(),
            be.zeros(n * kvd).unwrap(),
            be.zeros(n * kvd).unwrap(),
        );
        be.matmul(wq, &x, n, &mut q).unwrap();
        be.matmul(wk, &x, n, &mut k).unwrap();
        be.matmul(wv, &x, n, &mut v).unwrap();
        be.rope(&mut q, n, hd, pos0, &inv_freq, false, 0.25)
            .unwrap();
        be.rope(&mut k, n, hd, pos0, &inv_freq, false, 1.0).unwrap();
        let (mut kc, mut vc) = (
            cache.k[0][..pos0 * kvd].to_vec(),
            cache.v[0][..pos0 * kvd].to_vec(),
        );
        kc.extend_from_slice(&k);
        vc.extend_from_slice(&v);
        let mut att = be.zeros(n * qd).unwrap();
        be.attention(&shape, &q, &kc, &vc, pos0, None, &mut att)
            .unwrap();
        let mut o = be.zeros(n * d).unwrap();
        be.matmul(wo, &att, n, &mut o).unwrap();
        let mut got = vec![0f32; n * d];
        be.download(&o, &mut got).unwrap();
        assert!(want.iter().any(|v| *v != 0.0));
        assert_eq!(
            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        assert_eq!(&c.k[0][pos0 * kvd..(pos0 + n) * kvd], &kc[pos0 * kvd..]);
    }
}
