//! Kimi Delta Attention (KDA, Kimi Linear technical report, Moonshot AI 2025): a gated delta
//! rule with a per-channel decay, as transformers 5.24 runs it
//! (`models/kimi_linear/modeling_kimi_linear.py`: `KimiLinearDeltaAttention`,
//! `recurrent_kimi_delta_attention`, `chunk_kimi_delta_attention`) and llama.cpp's
//! `kimi-linear.cpp` builds it.
//!
//! Per head `h` with key width `dk` and value width `dv`, a state `S` (`dk × dv`) evolves per
//! token `t` (recurrent form, [`delta_step`]):
//!
//! ```text
//! S ← diag(exp g_t) · S                      (g_t ≤ 0: per-channel log decay)
//! S ← S + k_t ⊗ (β_t · (v_t − Sᵀ k_t))       (delta rule, β_t ∈ (0, 1))
//! o_t = Sᵀ q_t
//! ```
//!
//! with `q`, `k` L2-normed (`x / √(Σx² + 1e-6)`) and `q` scaled by `dk^-½`.
//!
//! Every pass runs this recurrent form, a prompt of `n` tokens as `n` steps, so a prompt's
//! outputs equal token-at-a-time decoding bit for bit whatever the batch. transformers and
//! llama.cpp run prompts in the chunked (WY/UT) form instead, which is the same function in
//! exact arithmetic but sums in another order (a 1e-5 relative spread in the logits of the
//! test models). On the CPU the chunked form is also slower: per chunk of 64 tokens it
//! evaluates ~64²·dk exponentials for the decay products where the recurrent form evaluates
//! 64·dk; measured with 32 heads of 128 over 512 tokens, 322 ms against 47 ms (session 14).
//!
//! Inputs go through short causal depthwise convolutions and SiLU first ([`short_conv_silu`]);
//! the decay is `g = −exp(A_log_h) · softplus(f_b(f_a(x)) + dt_bias)` ([`decay`]).

use rayon::prelude::*;

/// Softplus as PyTorch computes it in transformers' forget gate: `x` above 20 unchanged, else
/// `ln(1 + eˣ)`.
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        (1.0 + x.exp()).ln()
    }
}

/// Logistic sigmoid.
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Short causal depthwise convolution then SiLU, in place, over the `n` rows of `x`
/// (`n × ch`, row-major). `w` holds each channel's `k` taps (`ch × k`, oldest input first,
/// PyTorch's `Conv1d(groups=ch)` weight with its middle dimension dropped); `state` holds the
/// `k − 1` inputs before `x` (`(k − 1) × ch`, oldest row first; zeros before the first token)
/// and is updated to the last `k − 1` inputs.
///
/// `y_t,c = silu(Σ_j w_c,j · x_{t−k+1+j},c)`.
pub fn short_conv_silu(x: &mut [f32], ch: usize, w: &[f32], k: usize, state: &mut [f32]) {
    let n = x.len() / ch;
    let mut ext = Vec::with_capacity((k - 1 + n) * ch);
    ext.extend_from_slice(&state[..(k - 1) * ch]);
    ext.extend_from_slice(x);
    for t in 0..n {
        let row = &mut x[t * ch..(t + 1) * ch];
        for (c, y) in row.iter_mut().enumerate() {
            let taps = &w[c * k..(c + 1) * k];
            let mut acc = 0f32;
            for (j, &wj) in taps.iter().enumerate() {
                acc += wj * ext[(t + j) * ch + c];
            }
            *y = acc / (1.0 + (-acc).exp());
        }
    }
    state[..(k - 1) * ch].copy_from_slice(&ext[n * ch..]);
}

/// L2 normalisation as transformers' `l2norm` (and FLA's): `x / √(Σx² + 1e-6)`, in place.
pub fn l2norm(x: &mut [f32]) {
    l2norm_eps(x, L2_EPS);
}

/// The epsilon of transformers' `l2norm`.
pub const L2_EPS: f32 = 1e-6;

/// L2 normalisation `x / √(Σx² + eps)` in place (llama.cpp's `build_gdn_l2_norm` in
/// `src/models/models.h` uses `rms_norm_eps` as `eps`).
pub fn l2norm_eps(x: &mut [f32], eps: f32) {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    let inv = 1.0 / (ss + eps).sqrt();
    x.iter_mut().for_each(|v| *v *= inv);
}

/// The per-channel log decay of one token in place: `f` (`n_heads × dk`, the forget
/// projection `f_b(f_a(x))`) becomes `−exp(A_log_h) · softplus(f + dt_bias)`, floored at
/// `lower_bound` when one is given (Kimi K3's `gate_lower_bound`: then
/// `lower_bound · sigmoid(exp(A_log_h) · (f + dt_bias))`, as llama.cpp's `kimi-k3.cpp`).
pub fn decay(f: &mut [f32], a_log: &[f32], dt_bias: &[f32], lower_bound: Option<f32>) {
    let dk = f.len() / a_log.len();
    for (i, v) in f.iter_mut().enumerate() {
        let a = a_log[i / dk].exp();
        let x = *v + dt_bias[i];
        *v = match lower_bound {
            None => -a * softplus(x),
            Some(lb) => lb * sigmoid(a * x),
        };
    }
}

/// One head's recurrent step (see the module header). `s`: the state, `dk × dv` row-major;
/// `q` (scaled), `k` (both L2-normed) and `g` (log decay): `dk`; `v`, `out`: `dv`; `beta`
/// the delta-rule strength.
pub fn delta_step(
    s: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: f32,
    out: &mut [f32],
) {
    let dv = v.len();
    for (row, &gi) in s.chunks_exact_mut(dv).zip(g) {
        let e = gi.exp();
        row.iter_mut().for_each(|x| *x *= e);
    }
    let mut delta = v.to_vec();
    for (row, &ki) in s.chunks_exact(dv).zip(k) {
        for (d, &x) in delta.iter_mut().zip(row) {
            *d -= x * ki;
        }
    }
    delta.iter_mut().for_each(|d| *d *= beta);
    out.fill(0.0);
    for ((row, &ki), &qi) in s.chunks_exact_mut(dv).zip(k).zip(q) {
        for ((x, &d), o) in row.iter_mut().zip(&delta).zip(out.iter_mut()) {
            *x += ki * d;
            *o += *x * qi;
        }
    }
}

/// The per-token inputs of the delta rule for `n` tokens, head-major within a token:
/// `q`, `k`, `g`: `n × n_heads × dk`; `v`: `n × n_heads × dv`; `beta`: `n × n_heads`.
pub struct DeltaInputs<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub g: &'a [f32],
    pub beta: &'a [f32],
}

/// Runs the delta rule for every head over `n` tokens (one rayon task per head), token by
/// token in the recurrent form ([`delta_step`]). `state`: `n_heads × dk × dv`, updated;
/// `out`: `n × n_heads × dv`.
pub fn delta_rule(
    x: &DeltaInputs<'_>,
    n_heads: usize,
    dk: usize,
    dv: usize,
    state: &mut [f32],
    out: &mut [f32],
) {
    let n = x.beta.len() / n_heads;
    let per_head: Vec<Vec<f32>> = state
        .par_chunks_mut(dk * dv)
        .enumerate()
        .map(|(h, s)| {
            let gather = |src: &[f32], w: usize| -> Vec<f32> {
                (0..n)
                    .flat_map(|t| {
                        src[(t * n_heads + h) * w..(t * n_heads + h + 1) * w]
                            .iter()
                            .copied()
                    })
                    .collect()
            };
            let (q, k, v, g) = (
                gather(x.q, dk),
                gather(x.k, dk),
                gather(x.v, dv),
                gather(x.g, dk),
            );
            let beta: Vec<f32> = (0..n).map(|t| x.beta[t * n_heads + h]).collect();
            let mut o = vec![0f32; n * dv];
            for t in 0..n {
                let (a, b) = (t * dk, (t + 1) * dk);
                delta_step(
                    s,
                    &q[a..b],
                    &k[a..b],
                    &v[t * dv..(t + 1) * dv],
                    &g[a..b],
                    beta[t],
                    &mut o[t * dv..(t + 1) * dv],
                );
            }
            o
        })
        .collect();
    for (h, o) in per_head.iter().enumerate() {
        for t in 0..n {
            out[(t * n_heads + h) * dv..(t * n_heads + h + 1) * dv]
                .copy_from_slice(&o[t * dv..(t + 1) * dv]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| (((i * 7919 + seed * 104_729) % 1000) as f32 / 500.0) - 1.0)
            .collect()
    }

    /// A pass over `n` tokens equals `n` one-token passes bit for bit (heads gathered and
    /// scattered per token), from a non-zero state, and the state moves as per `delta_step`.
    #[test]
    fn a_pass_of_n_tokens_equals_n_passes_of_one() {
        let (h, dk, dv, n) = (2, 8, 6, 150);
        let mut q = data(n * h * dk, 1);
        let mut k = data(n * h * dk, 2);
        for r in q.chunks_mut(dk).chain(k.chunks_mut(dk)) {
            l2norm(r);
        }
        q.iter_mut().for_each(|x| *x /= (dk as f32).sqrt());
        let v = data(n * h * dv, 3);
        let g: Vec<f32> = data(n * h * dk, 4)
            .iter()
            .map(|x| -0.3 * (x + 1.0))
            .collect();
        let beta: Vec<f32> = data(n * h, 5).iter().map(|&x| sigmoid(2.0 * x)).collect();
        let x = DeltaInputs {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            beta: &beta,
        };
        let s0 = data(h * dk * dv, 6);
        let (mut s1, mut s2) = (s0.clone(), s0.clone());
        let mut o1 = vec![0f32; n * h * dv];
        delta_rule(&x, h, dk, dv, &mut s1, &mut o1);
        let mut o2 = Vec::new();
        for t in 0..n {
            let one = DeltaInputs {
                q: &q[t * h * dk..(t + 1) * h * dk],
                k: &k[t * h * dk..(t + 1) * h * dk],
                v: &v[t * h * dv..(t + 1) * h * dv],
                g: &g[t * h * dk..(t + 1) * h * dk],
                beta: &beta[t * h..(t + 1) * h],
            };
            let mut o = vec![0f32; h * dv];
            delta_rule(&one, h, dk, dv, &mut s2, &mut o);
            o2.extend(o);
        }
        assert_eq!(o1, o2);
        assert_eq!(s1, s2);
        // head 1's first output from s0 by hand: decay, delta, read
        let (mut s, mut o) = (s0[dk * dv..].to_vec(), vec![0f32; dv]);
        delta_step(
            &mut s,
            &q[dk..2 * dk],
            &k[dk..2 * dk],
            &v[dv..2 * dv],
            &g[dk..2 * dk],
            beta[1],
            &mut o,
        );
        assert_eq!(o, o1[dv..2 * dv]);
        assert_ne!(s, s0[dk * dv..]);
    }

    /// The convolution keeps the last `k − 1` inputs, so two calls equal one.
    #[test]
    fn conv_state_carries_across_calls() {
        let (ch, k, n) = (3, 4, 7);
        let w = data(ch * k, 9);
        let x = data(n * ch, 10);
        let mut one = x.clone();
        let mut st = vec![0f32; (k - 1) * ch];
        short_conv_silu(&mut one, ch, &w, k, &mut st);
        let mut st2 = vec![0f32; (k - 1) * ch];
        let (mut a, mut b) = (x[..2 * ch].to_vec(), x[2 * ch..].to_vec());
        short_conv_silu(&mut a, ch, &w, k, &mut st2);
        short_conv_silu(&mut b, ch, &w, k, &mut st2);
        a.extend(b);
        assert_eq!(one, a);
        assert_eq!(st, st2);
        // first token of channel 0: only the newest tap sees it
        let y = w[k - 1] * x[0];
        assert!((one[0] - y / (1.0 + (-y).exp())).abs() < 1e-7);
    }
}
