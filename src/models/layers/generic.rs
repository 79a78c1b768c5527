//! The shared blocks written against any [`Device`] (the CPU or a GPU): grouped-query
//! attention over the device's KV slots, the gated feed-forward, norms and residuals, and
//! the row helpers of per-sequence steps. Every family's layers are made of these and of
//! `mixers.rs` (`models::decoder::Blocks::spine_on`).
//!
//! On the CPU every block computes exactly what the host blocks they replaced computed (the
//! same kernels in the same order); on a GPU the same wiring calls the device's kernels.
//!
//! Weights are host views of their stored bytes ([`W`]) with whether their unit is resident:
//! a GPU keeps a resident matrix's copy after its first use and copies any other for the one
//! product that needs it ([`crate::backend::Backend::matmul_host`]).

use anyhow::Result;

use super::GqaRope;
use crate::backend::cpu::Matrix;
use crate::backend::{AttnShape, Glu, SeqSpan};
use crate::models::batch::Seqs;
use crate::models::device::Device;
use crate::models::rope::RopeStyle;

/// A weight matrix as the blocks take it: its host view and whether its unit is resident
/// (its bytes stay put for the model's life).
#[derive(Clone, Copy, Debug)]
pub struct W<'a> {
    pub m: Matrix<'a>,
    pub keep: bool,
}

/// `y = x Wᵀ` for `n` rows of `x` (`n × w.cols`): a new `n × w.rows` buffer.
///
/// Errors: the device's.
pub fn mm_on<D: Device>(dev: &D, w: &W, x: &D::Buf, n: usize) -> Result<D::Buf> {
    let mut y = dev.zeros(n * w.m.rows)?;
    dev.matmul_host(&w.m, w.keep, x, n, &mut y)?;
    Ok(y)
}

/// [`mm_on`] of several matrices over the same `n` rows (one parallel region on the CPU in a
/// decode step): one new buffer per matrix.
///
/// Errors: the device's.
pub fn mm_many_on<D: Device>(dev: &D, ws: &[&W], x: &D::Buf, n: usize) -> Result<Vec<D::Buf>> {
    let mut ys = ws
        .iter()
        .map(|w| dev.zeros(n * w.m.rows))
        .collect::<Result<Vec<_>>>()?;
    let views: Vec<(&Matrix, bool)> = ws.iter().map(|w| (&w.m, w.keep)).collect();
    let mut refs: Vec<&mut D::Buf> = ys.iter_mut().collect();
    dev.matmul_host_many(&views, x, n, &mut refs)?;
    Ok(ys)
}

/// RMSNorm of every `w.len()`-wide row of `x` (`len` floats): a new buffer.
///
/// Errors: the device's.
pub fn norm_on<D: Device>(dev: &D, x: &D::Buf, len: usize, w: &[f32], eps: f32) -> Result<D::Buf> {
    let mut out = dev.zeros(len)?;
    dev.rms_norm_rows(x, w, eps, &mut out)?;
    Ok(out)
}

/// Gemma-style post-norm residual: the rows of `o` (`len` floats) RMS-normed with `w`, added
/// to `x`.
///
/// Errors: the device's.
pub fn add_post_normed_on<D: Device>(
    dev: &D,
    x: &mut D::Buf,
    o: &D::Buf,
    len: usize,
    w: &[f32],
    eps: f32,
) -> Result<()> {
    let t = norm_on(dev, o, len, w, eps)?;
    dev.add(x, &t)
}

/// The gated feed-forward `down(act(gate(x)) · up(x))` for `n` rows of `x` into a new
/// `n × down.rows` buffer (SwiGLU: Llama, Qwen; GeGLU: Gemma 3).
///
/// Errors: the device's.
pub fn glu_mlp_on<D: Device>(
    dev: &D,
    act: Glu,
    [gate, up, down]: [&W; 3],
    x: &D::Buf,
    n: usize,
) -> Result<D::Buf> {
    let mut gu = mm_many_on(dev, &[gate, up], x, n)?;
    let u = gu.pop().expect("two products");
    let mut g = gu.pop().expect("two products");
    dev.glu(act, &mut g, &u)?;
    mm_on(dev, down, &g, n)
}

/// Per-head RMSNorm (weight `w`, `head_dim` wide; skipped when `None`) of every row of `x`
/// (`len` floats, `width` a row), then RoPE of `style` at each sequence's positions (`spans`)
/// and a multiplication by `scale`: [`super::norm_rope_heads`] on the device.
///
/// Errors: the device's.
#[allow(clippy::too_many_arguments)]
fn norm_rope_on<D: Device>(
    dev: &D,
    x: &mut D::Buf,
    len: usize,
    width: usize,
    spans: &[SeqSpan],
    w: Option<&[f32]>,
    r: &GqaRope,
    scale: f32,
    head_dim: usize,
) -> Result<()> {
    if let Some(w) = w {
        *x = norm_on(dev, x, len, w, r.eps)?;
    }
    let inter = r.style == RopeStyle::Interleaved;
    dev.rope_seqs(x, width, spans, head_dim, r.inv_freq, inter, scale)
}

/// One grouped-query attention layer's weights for [`gqa_attention_on`]: projections `q`
/// (`q_dim × hidden`), `k`, `v` (`kv_dim × hidden`), `o` (`hidden × q_dim`), the biases of
/// q, k, v and o (GPT-OSS: `q_dim`, `kv_dim`, `kv_dim`, `hidden`), the per-head q/k RMSNorm
/// weights (Qwen3, Gemma 3) and the sinks (one logit per query head, GPT-OSS).
pub struct GqaOn<'a> {
    pub q: W<'a>,
    pub k: W<'a>,
    pub v: W<'a>,
    pub o: W<'a>,
    pub biases: Option<[&'a [f32]; 4]>,
    pub qk_norm: Option<[&'a [f32]; 2]>,
    pub sinks: Option<&'a [f32]>,
}

/// `width`-wide rows `r0 .. r0 + m` of `x`: `x` itself when they are all of it (`whole`),
/// else a copy.
///
/// Errors: the device's.
pub fn rows_on<D: Device>(
    dev: &D,
    x: &mut Option<D::Buf>,
    whole: bool,
    width: usize,
    r0: usize,
    m: usize,
) -> Result<D::Buf> {
    if whole {
        return Ok(x.take().expect("one sequence takes the rows once"));
    }
    let mut out = dev.zeros(m * width)?;
    dev.copy(
        x.as_ref().expect("rows"),
        r0 * width,
        &mut out,
        0,
        m * width,
    )?;
    Ok(out)
}

/// Grouped-query attention of the normed rows `xn` (`rows × hidden`) of the sequences `seqs`
/// in layer `l` on `dev` into a new `rows × hidden` buffer (the residual not added): q, k, v
/// projections, q/k norms, RoPE and scaling over every row (RoPE at each sequence's
/// positions: [`crate::backend::Backend::rope_seqs`]); each sequence's new keys and values
/// written to its layer-`l` slots ([`Device::kv_slots`]); every sequence's causal attention
/// in one call ([`crate::backend::Backend::attention_seqs`]); the output projection over
/// every row.
/// With `biases`, each added right after its projection (GPT-OSS).
///
/// Errors: the device's.
pub fn gqa_attention_on<D: Device>(
    dev: &D,
    s: &AttnShape,
    w: &GqaOn,
    r: &GqaRope,
    xn: &D::Buf,
    seqs: &mut Seqs<'_>,
    l: usize,
) -> Result<D::Buf> {
    let hd = s.head_dim;
    let n = seqs.rows();
    let (qd, kvd) = (s.n_heads * hd, s.n_kv_heads * hd);
    let mut qkv = mm_many_on(dev, &[&w.q, &w.k, &w.v], xn, n)?;
    if let Some([bq, bk, bv, _]) = w.biases {
        for (y, b) in qkv.iter_mut().zip([bq, bk, bv]) {
            dev.add_rows(y, b)?;
        }
    }
    let (v, mut k, mut q) = (
        qkv.pop().expect("three products"),
        qkv.pop().expect("three products"),
        qkv.pop().expect("three products"),
    );
    let (qn, kn) = match w.qk_norm {
        Some([a, b]) => (Some(a), Some(b)),
        None => (None, None),
    };
    // every sequence's rows through each op at once; positions per sequence
    let spans: Vec<SeqSpan> = seqs
        .each()
        .map(|(r0, sq)| SeqSpan {
            r0,
            rows: sq.n,
            pos0: sq.pos0,
        })
        .collect();
    norm_rope_on(dev, &mut q, n * qd, qd, &spans, qn, r, r.q_scale, hd)?;
    norm_rope_on(dev, &mut k, n * kvd, kvd, &spans, kn, r, r.k_scale, hd)?;
    let mut slots = Vec::with_capacity(spans.len());
    for (_, sq) in seqs.each() {
        slots.push(dev.kv_slots(sq.cache, l, sq.pos0 + sq.n)?);
    }
    dev.write_kv_seqs(&k, &v, kvd, &spans, &mut slots)?;
    let kv: Vec<(&D::Buf, &D::Buf)> = slots.iter().map(|(k, v)| (&**k, &**v)).collect();
    let mut att = dev.zeros(n * qd)?;
    dev.attention_seqs(s, &q, &kv, &spans, w.sinks, &mut att)?;
    let mut o = mm_on(dev, &w.o, &att, n)?;
    if let Some([_, _, _, bo]) = w.biases {
        dev.add_rows(&mut o, bo)?;
    }
    Ok(o)
}

/// Collects one sequence's output rows `a` (`m × width`, rows `r0 .. r0 + m` of the pass)
/// into the pass's buffer `all` (`rows × width`): `a` itself when the pass has one sequence
/// (`whole`), else copied into `all` (allocated at the first sequence).
///
/// Errors: the device's.
pub fn put_rows_on<D: Device>(
    dev: &D,
    all: &mut Option<D::Buf>,
    a: D::Buf,
    whole: bool,
    (rows, width): (usize, usize),
    (r0, m): (usize, usize),
) -> Result<()> {
    if whole {
        *all = Some(a);
        return Ok(());
    }
    if all.is_none() {
        *all = Some(dev.zeros(rows * width)?);
    }
    let out = all.as_mut().expect("allocated above");
    dev.copy(&a, 0, out, r0 * width, m * width)
}
