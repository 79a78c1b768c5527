//! The CPU kernels of the ops only some families need ([`crate::backend::Op`]) that are not
//! one call of another module: Kimi K3's attention-residual mix ([`res_mix`]), GPT-OSS's
//! clamped SwiGLU ([`swiglu_oai`]), KDA's convolution over split q/k/v rows
//! ([`kda_conv_split`]) and its gated output norm ([`gated_head_norm`]).

use super::kda::{short_conv_silu, sigmoid};
use super::ops::rms_norm;

/// One attention-residual mix (llama.cpp `kimi-k3.cpp`, `res_mix`) of the rows of `cur`
/// (`n × d`, `d = w.len()`) with the checkpoints `bank` (each `n × d`) into `out`
/// (`n × d`), row by row: each source `s` (the checkpoints in banked order, then `cur`)
/// scores `Σ_e rmsnorm(s)_e · w_e` (an RMSNorm without weight, `eps`); the scores are
/// softmaxed and the *raw* sources summed with those weights (checkpoints in order, then
/// `cur`). With an empty bank `out` is `cur`.
pub fn res_mix(bank: &[&[f32]], cur: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let d = w.len();
    if bank.is_empty() {
        out.copy_from_slice(cur);
        return;
    }
    let score = |row: &[f32]| -> f32 {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let r = 1.0 / (ms + eps).sqrt();
        row.iter().zip(w).map(|(v, ww)| v * r * ww).sum()
    };
    let mut p = vec![0f32; bank.len() + 1];
    for (t, o) in out.chunks_exact_mut(d).enumerate() {
        let rows = bank
            .iter()
            .map(|b| &b[t * d..(t + 1) * d])
            .chain([&cur[t * d..(t + 1) * d]]);
        for (pi, row) in p.iter_mut().zip(rows) {
            *pi = score(row);
        }
        let m = p.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        p.iter_mut().for_each(|v| *v = (*v - m).exp());
        let sum: f32 = p.iter().sum();
        p.iter_mut().for_each(|v| *v /= sum);
        o.fill(0.0);
        for (b, &pi) in bank.iter().zip(&p) {
            o.iter_mut()
                .zip(&b[t * d..(t + 1) * d])
                .for_each(|(y, v)| *y += v * pi);
        }
        let pc = p[bank.len()];
        o.iter_mut()
            .zip(&cur[t * d..(t + 1) * d])
            .for_each(|(y, v)| *y += v * pc);
    }
}

/// The clamped SwiGLU of GPT-OSS on one gate and up value (transformers'
/// `GptOssExperts`): `g' = min(g, limit)`, `u' = clamp(u, −limit, limit)`,
/// `(u' + 1) · g' · σ(α g')`.
pub fn swiglu_oai_one(g: f32, u: f32, alpha: f32, limit: f32) -> f32 {
    let g = g.min(limit);
    let u = u.clamp(-limit, limit);
    (u + 1.0) * (g / (1.0 + (-(g * alpha)).exp()))
}

/// [`swiglu_oai_one`] over interleaved (gate, up) pairs of `gate_up` (`up` `None`; `out` half
/// as long) or over `gate_up` (the gates) and `up` element-wise, into `out`.
pub fn swiglu_oai(gate_up: &[f32], up: Option<&[f32]>, alpha: f32, limit: f32, out: &mut [f32]) {
    match up {
        None => {
            for (o, p) in out.iter_mut().zip(gate_up.chunks_exact(2)) {
                *o = swiglu_oai_one(p[0], p[1], alpha, limit);
            }
        }
        Some(u) => {
            for ((o, &g), &u) in out.iter_mut().zip(gate_up).zip(u) {
                *o = swiglu_oai_one(g, u, alpha, limit);
            }
        }
    }
}

/// KDA's short convolutions over the `rows` rows of `q`, `k`, `v` (each `rows × dim`, in
/// place) as one `3·dim`-channel [`short_conv_silu`] over `[q | k | v]` rows, its state the
/// first `(conv − 1) × 3·dim` floats of `state`.
pub fn kda_conv_split(
    [q, k, v]: [&mut [f32]; 3],
    rows: usize,
    taps: &[f32],
    conv: usize,
    state: &mut [f32],
) {
    let dim = q.len() / rows.max(1);
    let mut qkv = vec![0f32; rows * 3 * dim];
    for (i, m) in [&*q, &*k, &*v].into_iter().enumerate() {
        for r in 0..rows {
            qkv[r * 3 * dim + i * dim..r * 3 * dim + (i + 1) * dim]
                .copy_from_slice(&m[r * dim..(r + 1) * dim]);
        }
    }
    short_conv_silu(
        &mut qkv,
        3 * dim,
        taps,
        conv,
        &mut state[..(conv - 1) * 3 * dim],
    );
    for (r, row) in qkv.chunks_exact(3 * dim).enumerate() {
        q[r * dim..(r + 1) * dim].copy_from_slice(&row[..dim]);
        k[r * dim..(r + 1) * dim].copy_from_slice(&row[dim..2 * dim]);
        v[r * dim..(r + 1) * dim].copy_from_slice(&row[2 * dim..]);
    }
}

/// KDA's gated output norm in place: each `w.len()`-wide head of `o` RMS-normed with `w`,
/// times `σ` of the same elements of `gate`.
pub fn gated_head_norm(o: &mut [f32], gate: &[f32], w: &[f32], eps: f32) {
    let hd = w.len();
    let mut normed = vec![0f32; hd];
    for (oh, gh) in o.chunks_exact_mut(hd).zip(gate.chunks_exact(hd)) {
        rms_norm(oh, w, eps, &mut normed);
        for ((y, &z), &gv) in oh.iter_mut().zip(&normed).zip(gh) {
            *y = z * sigmoid(gv);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{cpu::Cpu, Backend, Glu};

    #[test]
    fn situ_matches_its_formula_and_skips_the_linear_part_when_off() {
        let cpu = Cpu::default();
        let situ = Glu::Situ {
            beta: 2.0,
            linear_beta: 3.0,
        };
        let mut g = vec![1.0f32, -4.0];
        cpu.glu(situ, &mut g, &vec![6.0, 0.5]).unwrap();
        let want0 = 2.0 * 0.5f32.tanh() * sigmoid(1.0) * 3.0 * 2f32.tanh();
        assert!((g[0] - want0).abs() < 1e-6, "{g:?}");
        let off = Glu::Situ {
            beta: 2.0,
            linear_beta: 0.0,
        };
        let mut g = vec![1.0f32];
        cpu.glu(off, &mut g, &vec![6.0]).unwrap();
        assert!(
            (g[0] - 2.0 * 0.5f32.tanh() * sigmoid(1.0) * 6.0).abs() < 1e-5,
            "{g:?}"
        );
    }

    #[test]
    fn res_mix_weights_raw_rows_by_a_softmax_of_normed_scores() {
        // d = 2, one token: rmsnorm([2, 0]) = [√2, 0] scores √2, rmsnorm([0, 3]) scores 0
        let w = [1.0f32, 0.0];
        let bank = [2.0f32, 0.0];
        let cur = [0.0f32, 3.0];
        let mut out = [0f32; 2];
        res_mix(&[&bank], &cur, &w, 0.0, &mut out);
        let s0 = 2f32.sqrt();
        let p0 = s0.exp() / (s0.exp() + 1.0);
        assert!(
            (out[0] - 2.0 * p0).abs() < 1e-6 && (out[1] - 3.0 * (1.0 - p0)).abs() < 1e-6,
            "{out:?}"
        );
        res_mix(&[], &cur, &w, 0.0, &mut out);
        assert_eq!(out, cur);
    }

    #[test]
    fn swiglu_oai_clamps_and_reads_pairs_or_two_inputs() {
        // g = 10 clamps to 7, u = -9 clamps to -7: (−7 + 1) · 7 · σ(1.702 · 7)
        let want = -6.0 * 7.0 / (1.0 + (-(7.0f32 * 1.702)).exp());
        let mut out = [0f32; 1];
        swiglu_oai(&[10.0, -9.0], None, 1.702, 7.0, &mut out);
        assert!((out[0] - want).abs() < 1e-5, "{out:?}");
        swiglu_oai(&[10.0], Some(&[-9.0]), 1.702, 7.0, &mut out);
        assert!((out[0] - want).abs() < 1e-5, "{out:?}");
    }
}
