//! The parts of Kimi K3 that Kimi Linear does not have, outside the token mixers: the SiTU
//! activation of every feed-forward block, the routed experts computed with it in the latent
//! space, and the cross-layer attention residuals, as llama.cpp computes them
//! (`src/models/kimi-k3.cpp`: `kimi_k3_situ`, `build_latent_moe`, `res_mix`).

use std::io;

use crate::models::layers::kda::sigmoid;
use crate::models::layers::{mm, Matrix};
use crate::models::moe::{moe_forward_with, ExpertStep, StoreExperts, UnitExperts};

/// SiTU's two parameters (`activation.situ_beta`, `activation.situ_linear_beta`).
#[derive(Clone, Copy, Debug)]
pub struct Situ {
    pub beta: f32,
    /// `≤ 0`: the up branch is used as is.
    pub linear_beta: f32,
}

impl Situ {
    /// `situ(g, u) = β·tanh(g/β)·sigmoid(g) · β_lin·tanh(u/β_lin)` element-wise into `g`
    /// (`kimi-k3.cpp`, `kimi_k3_situ`; the `u` factor is `u` itself when `β_lin ≤ 0`).
    pub fn apply(&self, g: &mut [f32], u: &[f32]) {
        let (b, lb) = (self.beta, self.linear_beta);
        for (a, &v) in g.iter_mut().zip(u) {
            let act = b * (*a / b).tanh() * sigmoid(*a);
            let up = if lb > 0.0 { lb * (v / lb).tanh() } else { v };
            *a = act * up;
        }
    }

    /// The SiTU feed-forward `down(situ(gate·x, up·x))` for `n` rows of `x`
    /// (`n × gate.cols`) into `out` (`n × down.rows`).
    pub fn mlp(&self, gate: &Matrix, up: &Matrix, down: &Matrix, x: &[f32], n: usize, out: &mut [f32]) {
        let ff = gate.rows;
        let (mut g, mut u) = (vec![0f32; n * ff], vec![0f32; n * ff]);
        mm(gate, x, n, &mut g);
        mm(up, x, n, &mut u);
        self.apply(&mut g, &u);
        mm(down, &g, n, out);
    }
}

/// One MoE layer's routed experts through the store ([`moe_forward_with`]) with the SiTU
/// activation, over rows `width` wide (the latent width when the experts are latent): the
/// step's `xn` and `out` are `n × width`.
///
/// Errors: an expert could not be read (the message names the file and expert).
pub fn situ_experts(table: &UnitExperts, width: usize, act: Situ, step: ExpertStep<'_>) -> io::Result<()> {
    let mut src = StoreExperts {
        table,
        store: step.store,
    };
    moe_forward_with(&mut src, step.layer, step.routes, step.xn, width, step.out, &step.next, |w, xg, m, y| {
        act.mlp(&w.gate, &w.up, &w.down, xg, m, y)
    })
}

/// One attention-residual mix (`kimi-k3.cpp`, `res_mix`) of the `n` rows of `cur`
/// (`n × d`) with the checkpoints `bank` (each `n × d`) into `out` (`n × d`), row by row: each
/// source `s` (the checkpoints in banked order, then `cur`) scores
/// `Σ_e rmsnorm(s)_e · w_e` (an RMSNorm without weight, `eps`); the scores are softmaxed and
/// the *raw* sources summed with those weights (checkpoints in order, then `cur`). With an
/// empty bank `out` is `cur`.
pub fn res_mix(bank: &[Vec<f32>], cur: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
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
        let rows = bank.iter().map(|b| &b[t * d..(t + 1) * d]).chain([&cur[t * d..(t + 1) * d]]);
        for (pi, row) in p.iter_mut().zip(rows) {
            *pi = score(row);
        }
        let m = p.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        p.iter_mut().for_each(|v| *v = (*v - m).exp());
        let sum: f32 = p.iter().sum();
        p.iter_mut().for_each(|v| *v /= sum);
        o.fill(0.0);
        for (b, &pi) in bank.iter().zip(&p) {
            o.iter_mut().zip(&b[t * d..(t + 1) * d]).for_each(|(y, v)| *y += v * pi);
        }
        let pc = p[bank.len()];
        o.iter_mut().zip(&cur[t * d..(t + 1) * d]).for_each(|(y, v)| *y += v * pc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn situ_matches_its_formula_and_skips_the_linear_part_when_off() {
        let s = Situ { beta: 2.0, linear_beta: 3.0 };
        let mut g = [1.0f32, -4.0];
        s.apply(&mut g, &[6.0, 0.5]);
        let want0 = 2.0 * 0.5f32.tanh() * sigmoid(1.0) * 3.0 * 2f32.tanh();
        assert!((g[0] - want0).abs() < 1e-6, "{g:?}");
        let off = Situ { beta: 2.0, linear_beta: 0.0 };
        let mut g = [1.0f32];
        off.apply(&mut g, &[6.0]);
        assert!((g[0] - 2.0 * 0.5f32.tanh() * sigmoid(1.0) * 6.0).abs() < 1e-5, "{g:?}");
    }

    #[test]
    fn res_mix_weights_raw_rows_by_a_softmax_of_normed_scores() {
        // d = 2, one token; bank row [2, 0] scores 1·√2·... : rmsnorm([2,0]) = [√2, 0]
        let w = [1.0f32, 0.0];
        let bank = vec![vec![2.0f32, 0.0]];
        let cur = [0.0f32, 3.0]; // rmsnorm = [0, √2]: score 0
        let mut out = [0f32; 2];
        res_mix(&bank, &cur, &w, 0.0, &mut out);
        let s0 = 2f32.sqrt();
        let p0 = s0.exp() / (s0.exp() + 1.0);
        assert!((out[0] - 2.0 * p0).abs() < 1e-6 && (out[1] - 3.0 * (1.0 - p0)).abs() < 1e-6, "{out:?}");
        res_mix(&[], &cur, &w, 0.0, &mut out);
        assert_eq!(out, cur);
    }
}
