//! Blocks shared by the architectures: batched projections, per-row norms and residuals, and
//! grouped-query attention over the KV cache. Every output element is computed the same way
//! whatever the batch size and thread count, so prefill equals token-by-token decode.

use super::rope::RopeStyle;
use rayon::prelude::*;

use crate::kernels::ops::{
    rms_norm, rms_norm_inplace, rope_interleaved, rope_neox, softcap, softmax_inplace,
};
use crate::kernels::{matmul, matvec, Matrix};

/// `Y = X Wᵀ` for `n` rows of `x` (`n × w.cols`) into `y` (`n × w.rows`); matvec for one row.
pub fn mm(w: &Matrix, x: &[f32], n: usize, y: &mut [f32]) {
    if n == 1 {
        matvec(w, x, y)
    } else {
        matmul(w, x, n, y)
    }
}

/// RMSNorm of every `d`-wide row of `x` into `out` (same shape) with weight `w` (`d`).
pub fn rms_norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let d = w.len();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        rms_norm(xr, w, eps, or);
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
    mm(gate, x, n, &mut g);
    mm(up, x, n, &mut u);
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
    for t in 0..n {
        for h in x[t * row..(t + 1) * row].chunks_mut(head_dim) {
            if let Some(w) = w {
                rms_norm_inplace(h, w, eps);
            }
            match style {
                RopeStyle::Neox => rope_neox(h, pos0 + t, inv_freq),
                RopeStyle::Interleaved => rope_interleaved(h, pos0 + t, inv_freq),
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
    let (nh, hd) = (s.n_heads, s.head_dim);
    let (qd, kvd, group) = (nh * hd, s.n_kv_heads * hd, nh / s.n_kv_heads);
    out.par_chunks_mut(hd).enumerate().for_each(|(i, o)| {
        let (t, h) = (i / nh, i % nh);
        let p = pos0 + t;
        let lo = s.window.map_or(0, |w| (p + 1).saturating_sub(w));
        let qh = &q[t * qd + h * hd..t * qd + (h + 1) * hd];
        let kv_off = (h / group) * hd;
        let mut scores: Vec<f32> = (lo..=p)
            .map(|j| {
                let kj = &k_cache[j * kvd + kv_off..j * kvd + kv_off + hd];
                let dot = qh.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>();
                s.softcap.map_or(dot, |c| softcap(dot, c))
            })
            .collect();
        match sinks {
            None => softmax_inplace(&mut scores),
            Some(sk) => {
                scores.push(sk[h]);
                softmax_inplace(&mut scores);
                scores.pop();
            }
        }
        o.iter_mut().for_each(|v| *v = 0.0);
        for (j, &wgt) in (lo..=p).zip(&scores) {
            let vj = &v_cache[j * kvd + kv_off..j * kvd + kv_off + hd];
            for (ov, &vv) in o.iter_mut().zip(vj) {
                *ov += wgt * vv;
            }
        }
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
}
