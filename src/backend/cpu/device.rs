//! The CPU as a [`Backend`]: buffers are `Vec<f32>` in RAM, weights are [`Matrix`] views of
//! their stored bytes, every op one of this module's kernels. Its state is the arithmetic of
//! the matrix products ([`Numerics`]), entered with the pool for each pass
//! ([`Backend::run_pass`]).

use anyhow::{bail, Result};

use super::attn::{attention_with_sinks, AttnShape};
use super::attn_seqs::{attention_seqs, spans_error, SeqSpan};
use super::blocks::{gated_head_norm, kda_conv_split, res_mix, swiglu_oai};
use super::kda::{decay, delta_rule, l2norm_eps, sigmoid, DeltaInputs};
use super::mla::{mla_attention, rope_slice, MlaShape, MlaWeights};
use super::ops::{
    rms_norm, rms_norm_rows, rope_interleaved_sc, rope_neox_sc, silu, softcap, with_rope_angles,
};
use super::{
    gelu::geglu_rows, matmul, matmul_t, matvec, matvec_each, matvec_many, on_pool, with_numerics,
    Matrix, Numerics,
};
use crate::backend::{Backend, Glu, MlaProj};
use crate::quant::{dequantize_row, SimdLevel};

/// The CPU backend with its numerics ([`Numerics::Exact`] unless set).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cpu {
    /// The arithmetic of the matrix products of every pass.
    pub numerics: Numerics,
}

impl Cpu {
    /// The CPU computing in `numerics`.
    pub fn new(numerics: Numerics) -> Self {
        Self { numerics }
    }
}

impl Backend for Cpu {
    type Buf = Vec<f32>;
    type Weights<'a> = Matrix<'a>;

    fn name(&self) -> String {
        format!(
            "cpu ({}, {} threads)",
            SimdLevel::detect().name(),
            super::pool::threads()
        )
    }

    fn run_pass<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        // the whole pass on one pool thread: its products enter the pool without a hand-off
        on_pool(|| with_numerics(self.numerics, f))
    }

    fn zeros(&self, len: usize) -> Result<Vec<f32>> {
        Ok(zeros_host(len))
    }

    fn upload(&self, host: &[f32]) -> Result<Vec<f32>> {
        Ok(host.to_vec())
    }

    fn download(&self, buf: &Vec<f32>, out: &mut [f32]) -> Result<()> {
        out.copy_from_slice(buf);
        Ok(())
    }

    fn download_owned(&self, buf: Vec<f32>, len: usize) -> Result<Vec<f32>> {
        if buf.len() != len {
            bail!("download_owned: {} floats, {len} expected", buf.len());
        }
        Ok(buf)
    }

    fn matmul(&self, w: Matrix<'_>, x: &Vec<f32>, rows: usize, y: &mut Vec<f32>) -> Result<()> {
        match rows {
            1 => matvec(&w, x, y),
            _ => matmul(&w, x, rows, y),
        }
        Ok(())
    }

    fn matmul_host(
        &self,
        w: &Matrix<'_>,
        _keep: bool,
        x: &Vec<f32>,
        rows: usize,
        y: &mut Vec<f32>,
    ) -> Result<()> {
        self.matmul(*w, x, rows, y)
    }

    fn matmul_host_many(
        &self,
        ws: &[(&Matrix<'_>, bool)],
        x: &Vec<f32>,
        rows: usize,
        ys: &mut [&mut Vec<f32>],
    ) -> Result<()> {
        let ms: Vec<&Matrix> = ws.iter().map(|w| w.0).collect();
        let mut outs: Vec<&mut [f32]> = ys.iter_mut().map(|y| y.as_mut_slice()).collect();
        let level = crate::quant::SimdLevel::detect();
        match rows {
            1 => matvec_many(&ms, x, &mut outs),
            // a decode step's few rows: one region for every matrix (exact numerics; q8 has
            // its own integer paths)
            _ if super::numerics::current() == Numerics::Exact
                && super::small_batch::matmul_small_many(level, &ms, x, rows, &mut outs) => {}
            _ => {
                for (w, y) in ms.iter().zip(outs.iter_mut()) {
                    matmul(w, x, rows, y)
                }
            }
        }
        Ok(())
    }

    fn matmul_host_each(
        &self,
        ws: &[(&Matrix<'_>, bool)],
        xs: &[&Vec<f32>],
        rows: usize,
        ys: &mut [&mut Vec<f32>],
    ) -> Result<()> {
        let ms: Vec<&Matrix> = ws.iter().map(|w| w.0).collect();
        let mut outs: Vec<&mut [f32]> = ys.iter_mut().map(|y| y.as_mut_slice()).collect();
        match rows {
            1 => {
                let ins: Vec<&[f32]> = xs.iter().map(|x| x.as_slice()).collect();
                matvec_each(&ms, &ins, &mut outs)
            }
            _ => {
                for ((w, x), y) in ms.iter().zip(xs).zip(outs.iter_mut()) {
                    matmul(w, x, rows, y)
                }
            }
        }
        Ok(())
    }

    fn copy(
        &self,
        src: &Vec<f32>,
        src_at: usize,
        dst: &mut Vec<f32>,
        dst_at: usize,
        len: usize,
    ) -> Result<()> {
        dst[dst_at..dst_at + len].copy_from_slice(&src[src_at..src_at + len]);
        Ok(())
    }

    fn embed_rows(&self, table: Matrix<'_>, ids: &[u32], out: &mut Vec<f32>) -> Result<()> {
        for (&id, row) in ids.iter().zip(out.chunks_exact_mut(table.cols)) {
            dequantize_row(table.ty, table.row(id as usize), row);
        }
        Ok(())
    }

    fn rms_norm_rows(&self, x: &Vec<f32>, w: &[f32], eps: f32, out: &mut Vec<f32>) -> Result<()> {
        rms_norm_rows(x, w, eps, out);
        Ok(())
    }

    fn rope(
        &self,
        x: &mut Vec<f32>,
        rows: usize,
        head_dim: usize,
        pos0: usize,
        inv_freq: &[f32],
        interleaved: bool,
        scale: f32,
    ) -> Result<()> {
        let width = x.len() / rows.max(1);
        rope_rows(x, width, head_dim, pos0, inv_freq, interleaved, scale);
        Ok(())
    }

    fn rope_seqs(
        &self,
        x: &mut Vec<f32>,
        width: usize,
        spans: &[SeqSpan],
        head_dim: usize,
        inv_freq: &[f32],
        interleaved: bool,
        scale: f32,
    ) -> Result<()> {
        if let Some(e) = spans_error(spans, x.len() / width.max(1)) {
            bail!("rope_seqs: {e}");
        }
        for sp in spans {
            let rows = &mut x[sp.r0 * width..(sp.r0 + sp.rows) * width];
            rope_rows(rows, width, head_dim, sp.pos0, inv_freq, interleaved, scale);
        }
        Ok(())
    }

    fn attention_seqs(
        &self,
        s: &AttnShape,
        q: &Vec<f32>,
        kv: &[(&Vec<f32>, &Vec<f32>)],
        spans: &[SeqSpan],
        sinks: Option<&[f32]>,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        if kv.len() != spans.len() {
            bail!(
                "attention_seqs: {} key/value slots for {} sequences",
                kv.len(),
                spans.len()
            );
        }
        let qd = (s.n_heads * s.head_dim).max(1);
        if let Some(e) = spans_error(spans, q.len() / qd) {
            bail!("attention_seqs: {e}");
        }
        if out.len() != q.len() {
            bail!(
                "attention_seqs: {} output floats for {} queries",
                out.len(),
                q.len()
            );
        }
        let kv: Vec<(&[f32], &[f32])> = kv.iter().map(|(k, v)| (&k[..], &v[..])).collect();
        attention_seqs(s, q, &kv, spans, sinks, out);
        Ok(())
    }

    fn attention(
        &self,
        s: &AttnShape,
        q: &Vec<f32>,
        k: &Vec<f32>,
        v: &Vec<f32>,
        pos0: usize,
        sinks: Option<&[f32]>,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        attention_with_sinks(s, q, k, v, pos0, sinks, out);
        Ok(())
    }

    fn mla_attention(
        &self,
        s: &MlaShape,
        q: &Vec<f32>,
        proj: MlaProj<&Matrix<'_>>,
        _keep: bool,
        latent: &Vec<f32>,
        pos0: usize,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let w = match proj.v {
            Some(v) => MlaWeights::Split { k: proj.k, v },
            None => MlaWeights::Joint(proj.k),
        };
        mla_attention(s, q, w, latent, pos0, out);
        Ok(())
    }

    fn kda_scan(
        &self,
        heads: usize,
        dk: usize,
        dv: usize,
        [q, k, v, g]: [&Vec<f32>; 4],
        beta: &Vec<f32>,
        state: &mut Vec<f32>,
        state_at: usize,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let x = DeltaInputs { q, k, v, g, beta };
        delta_rule(&x, heads, dk, dv, &mut state[state_at..], out);
        Ok(())
    }

    fn kda_conv(
        &self,
        [q, k, v]: [&mut Vec<f32>; 3],
        rows: usize,
        taps: &[f32],
        conv: usize,
        state: &mut Vec<f32>,
    ) -> Result<()> {
        kda_conv_split([q, k, v], rows, taps, conv, state);
        Ok(())
    }

    fn l2norm_heads(&self, x: &mut Vec<f32>, head_dim: usize, eps: f32, scale: f32) -> Result<()> {
        for h in x.chunks_exact_mut(head_dim) {
            l2norm_eps(h, eps);
            if scale != 1.0 {
                h.iter_mut().for_each(|v| *v *= scale);
            }
        }
        Ok(())
    }

    fn kda_decay(
        &self,
        g: &mut Vec<f32>,
        a_log: &[f32],
        dt_bias: &[f32],
        lower_bound: Option<f32>,
    ) -> Result<()> {
        for r in g.chunks_exact_mut(dt_bias.len()) {
            decay(r, a_log, dt_bias, lower_bound);
        }
        Ok(())
    }

    fn sigmoid(&self, x: &mut Vec<f32>) -> Result<()> {
        x.iter_mut().for_each(|b| *b = sigmoid(*b));
        Ok(())
    }

    fn mul_sigmoid(&self, x: &mut Vec<f32>, g: &Vec<f32>) -> Result<()> {
        x.iter_mut().zip(g).for_each(|(a, &z)| *a *= sigmoid(z));
        Ok(())
    }

    fn gated_head_norm(
        &self,
        o: &mut Vec<f32>,
        gate: &Vec<f32>,
        w: &[f32],
        eps: f32,
    ) -> Result<()> {
        gated_head_norm(o, gate, w, eps);
        Ok(())
    }

    fn rms_norm_head(&self, x: &mut Vec<f32>, width: usize, w: &[f32], eps: f32) -> Result<()> {
        let mut normed = vec![0f32; w.len()];
        for row in x.chunks_exact_mut(width) {
            let head = &mut row[..w.len()];
            rms_norm(head, w, eps, &mut normed);
            head.copy_from_slice(&normed);
        }
        Ok(())
    }

    fn rope_tail(
        &self,
        x: &mut Vec<f32>,
        rows: usize,
        width: usize,
        pos0: usize,
        inv_freq: &[f32],
        interleaved: bool,
        scale: f32,
    ) -> Result<()> {
        let tail = 2 * inv_freq.len();
        let row = x.len() / rows.max(1);
        for (t, r) in x.chunks_exact_mut(row).enumerate() {
            for h in r.chunks_exact_mut(width) {
                rope_slice(
                    &mut h[width - tail..],
                    pos0 + t,
                    inv_freq,
                    interleaved,
                    scale,
                );
            }
        }
        Ok(())
    }

    fn res_mix(
        &self,
        bank: &[&Vec<f32>],
        cur: &Vec<f32>,
        w: &[f32],
        eps: f32,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let bank: Vec<&[f32]> = bank.iter().map(|b| b.as_slice()).collect();
        res_mix(&bank, cur, w, eps, out);
        Ok(())
    }

    fn add_rows(&self, x: &mut Vec<f32>, b: &[f32]) -> Result<()> {
        for r in x.chunks_exact_mut(b.len()) {
            r.iter_mut().zip(b).for_each(|(a, v)| *a += v);
        }
        Ok(())
    }

    fn matmul_host_t(
        &self,
        w: &Matrix<'_>,
        _keep: bool,
        x: &Vec<f32>,
        rows: usize,
        y: &mut Vec<f32>,
    ) -> Result<()> {
        matmul_t(w, x, rows, y);
        Ok(())
    }

    fn swiglu_oai(
        &self,
        gate_up: &Vec<f32>,
        up: Option<&Vec<f32>>,
        alpha: f32,
        limit: f32,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        swiglu_oai(gate_up, up.map(|u| u.as_slice()), alpha, limit, out);
        Ok(())
    }

    fn glu(&self, act: Glu, gate: &mut Vec<f32>, up: &Vec<f32>) -> Result<()> {
        match act {
            Glu::Swiglu => gate
                .iter_mut()
                .zip(up)
                .for_each(|(g, &u)| *g = silu(*g) * u),
            Glu::GegluTanh => geglu_rows(gate, up),
            Glu::Situ { beta, linear_beta } => {
                for (g, &u) in gate.iter_mut().zip(up) {
                    let act = beta * (*g / beta).tanh() * sigmoid(*g);
                    let up = if linear_beta > 0.0 {
                        linear_beta * (u / linear_beta).tanh()
                    } else {
                        u
                    };
                    *g = act * up;
                }
            }
        }
        Ok(())
    }

    fn softcap(&self, x: &mut Vec<f32>, cap: f32) -> Result<()> {
        x.iter_mut().for_each(|v| *v = softcap(*v, cap));
        Ok(())
    }

    fn add(&self, x: &mut Vec<f32>, y: &Vec<f32>) -> Result<()> {
        x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
        Ok(())
    }

    fn gather_rows(
        &self,
        x: &Vec<f32>,
        width: usize,
        rows: &[usize],
        out: &mut Vec<f32>,
    ) -> Result<()> {
        for (&r, o) in rows.iter().zip(out.chunks_exact_mut(width)) {
            o.copy_from_slice(&x[r * width..(r + 1) * width]);
        }
        Ok(())
    }

    fn scatter_add_rows(
        &self,
        y: &Vec<f32>,
        width: usize,
        rows: &[usize],
        weights: &[f32],
        out: &mut Vec<f32>,
    ) -> Result<()> {
        for ((&r, &w), yr) in rows.iter().zip(weights).zip(y.chunks_exact(width)) {
            for (o, &v) in out[r * width..(r + 1) * width].iter_mut().zip(yr) {
                *o += w * v;
            }
        }
        Ok(())
    }
}

/// RoPE at positions `pos0 ..` over the `head_dim` slices of the `width`-wide rows of `x`,
/// then × `scale` ([`Backend::rope`] on the CPU).
fn rope_rows(
    x: &mut [f32],
    width: usize,
    head_dim: usize,
    pos0: usize,
    inv_freq: &[f32],
    interleaved: bool,
    scale: f32,
) {
    for (t, row) in x.chunks_exact_mut(width.max(1)).enumerate() {
        with_rope_angles(pos0 + t, inv_freq, |sc| {
            for h in row.chunks_exact_mut(head_dim) {
                match interleaved {
                    true => rope_interleaved_sc(h, sc),
                    false => rope_neox_sc(h, sc),
                }
                if scale != 1.0 {
                    h.iter_mut().for_each(|v| *v *= scale);
                }
            }
        });
    }
}

/// Floats from which [`zeros_host`] fills in parallel (1 MiB: an LM head's output over a
/// 262k vocabulary for one row or more).
const PAR_ZEROS: usize = 1 << 18;

/// `len` zeros. Past [`PAR_ZEROS`] floats the pool's threads write them, each its share of
/// the pages, instead of the calling thread alone: the LM head's output of a decode step of 8
/// sequences over a 262k vocabulary is 8 MiB, which the allocator clears (memset) on one
/// thread while the others wait for the product (1.7% of such a step on 2 cores, `perf`).
pub fn zeros_host(len: usize) -> Vec<f32> {
    if len < PAR_ZEROS {
        return vec![0.0; len];
    }
    use rayon::prelude::*;
    let mut v: Vec<f32> = Vec::with_capacity(len);
    v.spare_capacity_mut()[..len]
        .par_chunks_mut(PAR_ZEROS / 4)
        .for_each(|c| c.fill(std::mem::MaybeUninit::new(0.0)));
    // SAFETY: the first `len` elements of the capacity were all written just above
    unsafe { v.set_len(len) };
    v
}

#[cfg(test)]
mod zeros_tests {
    /// Zeros on both sides of the parallel threshold, of the length asked for.
    #[test]
    fn zeros_host_is_len_zeros_either_way() {
        for len in [
            0,
            5,
            super::PAR_ZEROS - 1,
            super::PAR_ZEROS,
            3 * super::PAR_ZEROS + 7,
        ] {
            let v = super::zeros_host(len);
            assert_eq!(v.len(), len);
            assert!(v.iter().all(|x| x.to_bits() == 0), "{len}");
        }
    }
}
