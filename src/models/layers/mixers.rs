//! The token mixers beyond grouped-query attention, written against any [`Device`]: a KDA
//! layer ([`kda_mixer`], transformers' `KimiLinearDeltaAttention.forward`) and multi-head
//! latent attention ([`mla_mixer`]: DeepSeek V3's `DeepseekV3Attention`, with RoPE on the
//! rotary parts; Kimi Linear's `KimiLinearAttention` and Kimi K3's, without, the shared
//! "rotary" key used as is).
//!
//! On the CPU every value is that of the host kernels they call (`backend::cpu::kda`,
//! `backend::cpu::mla`) in the order transformers applies them; projections run over every
//! row of the pass at once, only the steps that read a sequence's positions or state
//! (convolution, scan, latent rows, attention) per sequence.

use anyhow::Result;

use super::generic::{mm_many_on, mm_on, norm_on, put_rows_on, rows_on, W};
use crate::backend::cpu::Matrix;
use crate::backend::{MlaProj, MlaShape, Op};
use crate::models::batch::Seqs;
use crate::models::device::Device;

/// The ops beyond the core set ([`Op`]) that [`kda_mixer`] and a no-RoPE [`mla_mixer`] call:
/// what a hybrid KDA + MLA stack needs (Kimi Linear; Kimi K3 adds its own).
pub const KDA_MLA_OPS: [Op; 8] = [
    Op::KdaConv,
    Op::L2Norm,
    Op::KdaDecay,
    Op::Sigmoid,
    Op::KdaScan,
    Op::GatedNorm,
    Op::MlaAttention,
    Op::NormHead,
];

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
    pub q: W<'a>,
    pub k: W<'a>,
    pub v: W<'a>,
    /// `f_a_proj` (`head_dim × hidden`) and `f_b_proj` (`dim × head_dim`).
    pub f_a: W<'a>,
    pub f_b: W<'a>,
    /// `b_proj` (`n_heads × hidden`).
    pub b: W<'a>,
    /// The output gate: `g_a_proj` then `g_b_proj` (Kimi Linear), or one full-rank matrix
    /// (`dim × hidden`, `g_a` `None`: Kimi K3).
    pub g_a: Option<W<'a>>,
    pub g_b: W<'a>,
    pub o: W<'a>,
    /// Short-convolution taps of `q`, `k`, `v` channels in that order (`3 · dim × conv`).
    pub conv: &'a [f32],
    /// `A_log` per head.
    pub a_log: &'a [f32],
    /// `dt_bias` (`dim`).
    pub dt_bias: &'a [f32],
    /// `o_norm` weight (`head_dim`).
    pub o_norm: &'a [f32],
}

/// A KDA layer `l` on `dev` over the normed rows `xn` (`rows × hidden`) of the sequences
/// `seqs` into a new `rows × hidden` buffer: the q, k, v, decay, beta and gate projections
/// over every row; per sequence (with its layer-`l` state: convolution inputs then
/// `n_heads × head_dim²` floats, [`Device::state_slot`]) the short convolutions, the q/k L2
/// norms (q scaled by `head_dim^-½`) and the delta rule; then the gated output norm and
/// `o_proj` over every row.
///
/// Errors: the device's.
pub fn kda_mixer<D: Device>(
    dev: &D,
    sh: &KdaShape,
    w: &KdaWeights<'_>,
    xn: &D::Buf,
    seqs: &mut Seqs<'_>,
    l: usize,
) -> Result<D::Buf> {
    let (h, hd, dim) = (sh.n_heads, sh.head_dim, sh.dim());
    let n = seqs.rows();
    let gate_in = w.g_a.as_ref().unwrap_or(&w.g_b);
    let mut ps = mm_many_on(dev, &[&w.q, &w.k, &w.v, &w.f_a, &w.b, gate_in], xn, n)?;
    let gate = ps.pop().expect("six products");
    let mut beta = ps.pop().expect("six products");
    let fa = ps.pop().expect("six products");
    let (mut v, mut k, mut q) = (ps.pop(), ps.pop(), ps.pop());
    let gate = match &w.g_a {
        Some(_) => mm_on(dev, &w.g_b, &gate, n)?,
        None => gate,
    };
    let mut g = mm_on(dev, &w.f_b, &fa, n)?;
    dev.kda_decay(&mut g, w.a_log, w.dt_bias, sh.lower_bound)?;
    dev.sigmoid(&mut beta)?;
    let (mut g, mut beta) = (Some(g), Some(beta));
    let whole = seqs.len() == 1;
    let scale = 1.0 / (hd as f32).sqrt();
    let mut o: Option<D::Buf> = None;
    for (r0, sq) in seqs.each() {
        let m = sq.n;
        let mut qs = rows_on(dev, &mut q, whole, dim, r0, m)?;
        let mut ks = rows_on(dev, &mut k, whole, dim, r0, m)?;
        let mut vs = rows_on(dev, &mut v, whole, dim, r0, m)?;
        let gs = rows_on(dev, &mut g, whole, dim, r0, m)?;
        let bs = rows_on(dev, &mut beta, whole, h, r0, m)?;
        let state = dev.state_slot(sq.cache, l)?;
        dev.kda_conv([&mut qs, &mut ks, &mut vs], m, w.conv, sh.conv, state)?;
        dev.l2norm_heads(&mut qs, hd, sh.l2_eps, scale)?;
        dev.l2norm_heads(&mut ks, hd, sh.l2_eps, 1.0)?;
        let mut os = dev.zeros(m * dim)?;
        let at = sh.conv_state();
        dev.kda_scan(h, hd, hd, [&qs, &ks, &vs, &gs], &bs, state, at, &mut os)?;
        put_rows_on(dev, &mut o, os, whole, (n, dim), (r0, m))?;
    }
    let mut o = o.expect("at least one sequence");
    dev.gated_head_norm(&mut o, &gate, w.o_norm, sh.eps)?;
    mm_on(dev, &w.o, &o, n)
}

/// An MLA layer's matrices (views into its spine unit) and norms.
pub struct MlaLayer<'a> {
    /// `q_a_proj` with its norm weights, then `q_b_proj`; or `None` and `q` is `q_proj`.
    pub q_a: Option<(W<'a>, &'a [f32])>,
    pub q: W<'a>,
    pub kv_a: W<'a>,
    pub kv_a_norm: &'a [f32],
    /// `kv_b_proj` (joint), or llama.cpp's `attn_k_b` when `v_b` is `Some` (`attn_v_b`):
    /// [`MlaProj`]'s two forms.
    pub kv_b: Matrix<'a>,
    pub v_b: Option<Matrix<'a>>,
    /// Whether `kv_b` and `v_b` are in a resident unit.
    pub keep: bool,
    /// Kimi K3's output gate (`n_heads·v_head_dim × hidden`, llama.cpp `attn_gate`): the
    /// attention output times `sigmoid(gate · xn)` before `o_proj` (`kimi-k3.cpp`,
    /// `build_mla_layer`); `None` otherwise.
    pub gate: Option<W<'a>>,
    pub o: W<'a>,
}

/// The RoPE of DeepSeek's MLA: the rotary parts of the queries and of the shared key rotated
/// by `inv_freq` (`rope / 2` frequencies), regrouped first when `interleaved`
/// (`rope_interleave`), then × `scale` (YaRN's attention factor).
pub struct MlaRope<'a> {
    pub inv_freq: &'a [f32],
    pub interleaved: bool,
    pub scale: f32,
}

/// An MLA layer `l` on `dev` over the normed rows `xn` (`rows × hidden`) of the sequences
/// `seqs` into a new `rows × hidden` buffer: the query (through `q_a` and its norm when
/// present) and the compressed KV over every row, the latent part of the KV RMS-normed
/// (`kv_a_layernorm`, `lora_eps`); per sequence at its positions, with `rope` the rotary
/// parts of its queries and shared key rotated, its latent rows (`width = rank + rope`
/// floats) written to its layer-`l` latent slot ([`Device::latent_slot`]) and DeepSeek's
/// absorbed latent attention over them (`Backend::mla_attention`); then the optional sigmoid
/// gate ([`MlaLayer::gate`]) and `o_proj` over every row.
///
/// Errors: the device's.
#[allow(clippy::too_many_arguments)]
pub fn mla_mixer<D: Device>(
    dev: &D,
    s: &MlaShape,
    w: &MlaLayer<'_>,
    rope: Option<&MlaRope>,
    lora_eps: f32,
    xn: &D::Buf,
    seqs: &mut Seqs<'_>,
    l: usize,
) -> Result<D::Buf> {
    let n = seqs.rows();
    let (nh, qh, width) = (s.n_heads, s.nope + s.rope, s.rank + s.rope);
    let (mut q, mut kv) = match &w.q_a {
        Some((qa, nw)) => {
            let mut ps = mm_many_on(dev, &[qa, &w.kv_a], xn, n)?;
            let kv = ps.pop().expect("two products");
            let t = ps.pop().expect("two products");
            let tn = norm_on(dev, &t, n * qa.m.rows, nw, lora_eps)?;
            (Some(mm_on(dev, &w.q, &tn, n)?), kv)
        }
        None => {
            let mut ps = mm_many_on(dev, &[&w.q, &w.kv_a], xn, n)?;
            let kv = ps.pop().expect("two products");
            (ps.pop(), kv)
        }
    };
    dev.rms_norm_head(&mut kv, width, w.kv_a_norm, lora_eps)?;
    let mut kv = Some(kv);
    let whole = seqs.len() == 1;
    let vw = nh * s.v;
    let mut att: Option<D::Buf> = None;
    for (r0, sq) in seqs.each() {
        let (pos0, m) = (sq.pos0, sq.n);
        let mut qs = rows_on(dev, &mut q, whole, nh * qh, r0, m)?;
        let mut kvs = rows_on(dev, &mut kv, whole, width, r0, m)?;
        if let Some(r) = rope {
            dev.rope_tail(&mut qs, m, qh, pos0, r.inv_freq, r.interleaved, r.scale)?;
            dev.rope_tail(&mut kvs, m, width, pos0, r.inv_freq, r.interleaved, r.scale)?;
        }
        let slot = dev.latent_slot(sq.cache, l, pos0 + m)?;
        dev.copy(&kvs, 0, slot, pos0 * width, m * width)?;
        let mut a = dev.zeros(m * vw)?;
        let proj = MlaProj {
            k: &w.kv_b,
            v: w.v_b.as_ref(),
        };
        dev.mla_attention(s, &qs, proj, w.keep, slot, pos0, &mut a)?;
        put_rows_on(dev, &mut att, a, whole, (n, vw), (r0, m))?;
    }
    let mut att = att.expect("at least one sequence");
    if let Some(gw) = &w.gate {
        let g = mm_on(dev, gw, xn, n)?;
        dev.mul_sigmoid(&mut att, &g)?;
    }
    mm_on(dev, &w.o, &att, n)
}
