//! The CPU as a [`Backend`]: buffers are `Vec<f32>` in RAM, weights are [`Matrix`] views of
//! their stored bytes, every op one of this module's kernels. Its state is the arithmetic of
//! the matrix products ([`Numerics`]), entered with the pool for each pass
//! ([`Backend::run_pass`]).

use anyhow::Result;

use super::attn::{attention_with_sinks, AttnShape};
use super::kda::{delta_rule, sigmoid, DeltaInputs};
use super::mla::{mla_attention, MlaShape, MlaWeights};
use super::ops::{rms_norm_rows, rope_angles, rope_interleaved_sc, rope_neox_sc, silu, softcap};
use super::{
    gelu::geglu_rows, matmul, matvec, matvec_each, matvec_many, on_pool, with_numerics, Matrix,
    Numerics,
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
        Ok(vec![0.0; len])
    }

    fn upload(&self, host: &[f32]) -> Result<Vec<f32>> {
        Ok(host.to_vec())
    }

    fn download(&self, buf: &Vec<f32>, out: &mut [f32]) -> Result<()> {
        out.copy_from_slice(buf);
        Ok(())
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
        match rows {
            1 => matvec_many(&ms, x, &mut outs),
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
        let mut sc = Vec::with_capacity(inv_freq.len());
        for (t, row) in x.chunks_exact_mut(width).enumerate() {
            rope_angles(pos0 + t, inv_freq, &mut sc);
            for h in row.chunks_exact_mut(head_dim) {
                match interleaved {
                    true => rope_interleaved_sc(h, &sc),
                    false => rope_neox_sc(h, &sc),
                }
                if scale != 1.0 {
                    h.iter_mut().for_each(|v| *v *= scale);
                }
            }
        }
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
        proj: MlaProj<Matrix<'_>>,
        latent: &Vec<f32>,
        pos0: usize,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let w = match &proj.v {
            Some(v) => MlaWeights::Split { k: &proj.k, v },
            None => MlaWeights::Joint(&proj.k),
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
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let x = DeltaInputs { q, k, v, g, beta };
        delta_rule(&x, heads, dk, dv, state, out);
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
