//! The two token mixers of Kimi Linear over one layer's normed rows: a KDA layer
//! ([`kda_mixer`], transformers' `KimiLinearDeltaAttention.forward`) and a no-RoPE MLA layer
//! ([`mla_mixer`], `KimiLinearAttention.forward`: DeepSeek's latent attention with the shared
//! "rotary" key used as is, never rotated).

use super::kda::{decay, delta_rule, l2norm_eps, short_conv_silu, sigmoid, DeltaInputs};
use super::mla::{mla_attention, MlaShape, MlaWeights};
use super::{mm, rms_norm_rows};
use crate::backend::cpu::ops::rms_norm;
use crate::backend::cpu::Matrix;
use crate::models::batch::{rows_of, rows_of_mut, Seqs};

/// Sizes of a KDA layer.
#[derive(Clone, Copy, Debug)]
pub struct KdaShape {
    pub n_heads: usize,
    /// Key and value width per head.
    pub head_dim: usize,
    /// Taps of the short convolutions.
    pub conv: usize,
    /// `eps` of the gated output RMSNorm.
    pub eps: f32,
    /// Kimi K3's decay lower bound (`None` for Kimi Linear).
    pub lower_bound: Option<f32>,
    /// `eps` of the q/k L2 norms ([`super::kda::l2norm_eps`]): transformers' 1e-6
    /// ([`super::kda::L2_EPS`]); llama.cpp's `kimi-k3.cpp` uses `rms_norm_eps`.
    pub l2_eps: f32,
}

impl KdaShape {
    /// `n_heads × head_dim`.
    pub fn dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Floats of the convolution part of the state: `(conv − 1) × 3 × dim`.
    pub fn conv_state(&self) -> usize {
        (self.conv - 1) * 3 * self.dim()
    }
}

/// A KDA layer's matrices (views into its spine unit) and resident vectors.
pub struct KdaWeights<'a> {
    pub q: Matrix<'a>,
    pub k: Matrix<'a>,
    pub v: Matrix<'a>,
    /// `f_a_proj` (`head_dim × hidden`) and `f_b_proj` (`dim × head_dim`).
    pub f_a: Matrix<'a>,
    pub f_b: Matrix<'a>,
    /// `b_proj` (`n_heads × hidden`).
    pub b: Matrix<'a>,
    /// The output gate: `g_a_proj` then `g_b_proj` (Kimi Linear), or one full-rank matrix
    /// (`dim × hidden`, `g_a` `None`: Kimi K3).
    pub g_a: Option<Matrix<'a>>,
    pub g_b: Matrix<'a>,
    pub o: Matrix<'a>,
    /// Short-convolution taps of `q`, `k`, `v` channels in that order (`3 · dim × conv`).
    pub conv: &'a [f32],
    /// `A_log` per head.
    pub a_log: &'a [f32],
    /// `dt_bias` (`dim`).
    pub dt_bias: &'a [f32],
    /// `o_norm` weight (`head_dim`).
    pub o_norm: &'a [f32],
}

/// A KDA layer `l` over the normed rows `xn` (`rows × hidden`) of the sequences `seqs` into
/// `out` (`rows × hidden`): each sequence's rows in order through `kda_rows`, with the
/// sequence's layer-`l` state (convolution inputs then `n_heads × head_dim²` floats) carried
/// from its previous tokens and updated.
pub fn kda_mixer(
    sh: &KdaShape,
    w: &KdaWeights<'_>,
    xn: &[f32],
    seqs: &mut Seqs<'_>,
    l: usize,
    out: &mut [f32],
) {
    let (d, dout) = (w.q.cols, w.o.rows);
    for (r0, sq) in seqs.each() {
        let o = rows_of_mut(out, dout, r0, sq.n);
        kda_rows(sh, w, rows_of(xn, d, r0, sq.n), &mut sq.cache.state[l], o);
    }
}

/// A KDA layer over the `n` normed rows `xn` (`n × hidden`) of one sequence into `out`
/// (`n × hidden`), its state (`state`: convolution inputs then `n_heads × head_dim²`) carried
/// from the previous tokens and updated.
fn kda_rows(sh: &KdaShape, w: &KdaWeights<'_>, xn: &[f32], state: &mut [f32], out: &mut [f32]) {
    let (h, hd, dim) = (sh.n_heads, sh.head_dim, sh.dim());
    let n = out.len() / w.o.rows;
    let (conv_st, rec_st) = state.split_at_mut(sh.conv_state());
    // q | k | v per row, convolved
    let mut qkv = vec![0f32; n * 3 * dim];
    {
        let mut t = vec![0f32; n * dim];
        for (i, m) in [&w.q, &w.k, &w.v].into_iter().enumerate() {
            mm(m, xn, n, &mut t);
            for r in 0..n {
                qkv[r * 3 * dim + i * dim..r * 3 * dim + (i + 1) * dim]
                    .copy_from_slice(&t[r * dim..(r + 1) * dim]);
            }
        }
    }
    short_conv_silu(&mut qkv, 3 * dim, w.conv, sh.conv, conv_st);
    let (mut q, mut k, mut v) = (
        vec![0f32; n * dim],
        vec![0f32; n * dim],
        vec![0f32; n * dim],
    );
    let scale = 1.0 / (hd as f32).sqrt();
    for r in 0..n {
        let row = &qkv[r * 3 * dim..(r + 1) * 3 * dim];
        q[r * dim..(r + 1) * dim].copy_from_slice(&row[..dim]);
        k[r * dim..(r + 1) * dim].copy_from_slice(&row[dim..2 * dim]);
        v[r * dim..(r + 1) * dim].copy_from_slice(&row[2 * dim..]);
    }
    for (qh, kh) in q.chunks_exact_mut(hd).zip(k.chunks_exact_mut(hd)) {
        l2norm_eps(qh, sh.l2_eps);
        qh.iter_mut().for_each(|x| *x *= scale);
        l2norm_eps(kh, sh.l2_eps);
    }
    // decay and beta
    let mut fa = vec![0f32; n * w.f_a.rows];
    mm(&w.f_a, xn, n, &mut fa);
    let mut g = vec![0f32; n * dim];
    mm(&w.f_b, &fa, n, &mut g);
    for r in g.chunks_exact_mut(dim) {
        decay(r, w.a_log, w.dt_bias, sh.lower_bound);
    }
    let mut beta = vec![0f32; n * h];
    mm(&w.b, xn, n, &mut beta);
    beta.iter_mut().for_each(|b| *b = sigmoid(*b));
    let mut o = vec![0f32; n * dim];
    let x = DeltaInputs {
        q: &q,
        k: &k,
        v: &v,
        g: &g,
        beta: &beta,
    };
    delta_rule(&x, h, hd, hd, rec_st, &mut o);
    // gated output norm
    let mut gate = vec![0f32; n * dim];
    match &w.g_a {
        Some(ga) => {
            let mut t = vec![0f32; n * ga.rows];
            mm(ga, xn, n, &mut t);
            mm(&w.g_b, &t, n, &mut gate);
        }
        None => mm(&w.g_b, xn, n, &mut gate),
    }
    let mut normed = vec![0f32; hd];
    for (oh, gh) in o.chunks_exact_mut(hd).zip(gate.chunks_exact(hd)) {
        rms_norm(oh, w.o_norm, sh.eps, &mut normed);
        for ((y, &z), &gv) in oh.iter_mut().zip(&normed).zip(gh) {
            *y = z * sigmoid(gv);
        }
    }
    mm(&w.o, &o, n, out);
}

/// An MLA layer's matrices (views into its spine unit) and norms.
pub struct MlaLayer<'a> {
    /// `q_a_proj` with its norm weights, then `q_b_proj`; or `None` and `q` is `q_proj`.
    pub q_a: Option<(Matrix<'a>, &'a [f32])>,
    pub q: Matrix<'a>,
    pub kv_a: Matrix<'a>,
    pub kv_a_norm: &'a [f32],
    /// `kv_b_proj` (joint), or llama.cpp's `attn_k_b` when `v_b` is `Some` (`attn_v_b`): the
    /// two forms of [`MlaWeights`].
    pub kv_b: Matrix<'a>,
    pub v_b: Option<Matrix<'a>>,
    /// Kimi K3's output gate (`n_heads·v_head_dim × hidden`, llama.cpp `attn_gate`): the
    /// attention output times `sigmoid(gate · xn)` before `o_proj` (`kimi-k3.cpp`,
    /// `build_mla_layer`); `None` for Kimi Linear.
    pub gate: Option<Matrix<'a>>,
    pub o: Matrix<'a>,
}

/// A no-RoPE MLA layer `l` over the normed rows `xn` (`rows × hidden`) of the sequences
/// `seqs` into `out` (`rows × hidden`), per sequence at its positions: the new tokens' latent
/// rows (`kv_a_layernorm`ed latent, unrotated shared key) go into the sequence's layer-`l`
/// latent cache (rows of `width = rank + rope` floats for positions `0..pos0 + n`),
/// then DeepSeek's absorbed latent attention ([`mla_attention`]) with softmax scale
/// `(nope + rope)^-½`, then the optional sigmoid gate ([`MlaLayer::gate`]), then `o_proj`. `lora_eps`: `eps` of the latent norms (transformers'
/// `KimiLinearRMSNorm` default, 1e-6).
#[allow(clippy::too_many_arguments)]
pub fn mla_mixer(
    s: &MlaShape,
    w: &MlaLayer<'_>,
    lora_eps: f32,
    xn: &[f32],
    seqs: &mut Seqs<'_>,
    l: usize,
    out: &mut [f32],
) {
    let (d, dout) = (w.kv_a.cols, w.o.rows);
    for (r0, sq) in seqs.each() {
        let (pos0, n) = (sq.pos0, sq.n);
        let o = rows_of_mut(out, dout, r0, n);
        mla_rows(
            s,
            w,
            lora_eps,
            rows_of(xn, d, r0, n),
            &mut sq.cache.k[l],
            pos0,
            o,
        );
    }
}

/// [`mla_mixer`] over the `n` rows `xn` of one sequence at positions `pos0 ..`, its latent
/// rows in `cache`.
#[allow(clippy::too_many_arguments)]
fn mla_rows(
    s: &MlaShape,
    w: &MlaLayer<'_>,
    lora_eps: f32,
    xn: &[f32],
    cache: &mut [f32],
    pos0: usize,
    out: &mut [f32],
) {
    let n = out.len() / w.o.rows;
    let (nh, qh, width) = (s.n_heads, s.nope + s.rope, s.rank + s.rope);
    let mut q = vec![0f32; n * nh * qh];
    match &w.q_a {
        Some((qa, nw)) => {
            let mut t = vec![0f32; n * qa.rows];
            mm(qa, xn, n, &mut t);
            let mut tn = vec![0f32; t.len()];
            rms_norm_rows(&t, nw, lora_eps, &mut tn);
            mm(&w.q, &tn, n, &mut q);
        }
        None => mm(&w.q, xn, n, &mut q),
    }
    let mut kv = vec![0f32; n * width];
    mm(&w.kv_a, xn, n, &mut kv);
    let mut normed = vec![0f32; s.rank];
    for row in kv.chunks_exact_mut(width) {
        rms_norm(&row[..s.rank], w.kv_a_norm, lora_eps, &mut normed);
        row[..s.rank].copy_from_slice(&normed);
    }
    cache[pos0 * width..(pos0 + n) * width].copy_from_slice(&kv);
    let mut att = vec![0f32; n * nh * s.v];
    let kvw = match &w.v_b {
        Some(v) => MlaWeights::Split { k: &w.kv_b, v },
        None => MlaWeights::Joint(&w.kv_b),
    };
    mla_attention(s, &q, kvw, &cache[..(pos0 + n) * width], pos0, &mut att);
    if let Some(gw) = &w.gate {
        let mut g = vec![0f32; att.len()];
        mm(gw, xn, n, &mut g);
        att.iter_mut().zip(&g).for_each(|(a, &z)| *a *= sigmoid(z));
    }
    mm(&w.o, &att, n, out);
}
