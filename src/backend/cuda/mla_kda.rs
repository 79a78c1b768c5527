//! Multi-head latent attention and the KDA delta rule on a CUDA device: the bodies of
//! [`Backend::mla_attention`](crate::backend::Backend::mla_attention) and
//! [`Backend::kda_scan`](crate::backend::Backend::kda_scan), with the CPU's semantics
//! (`backend/cpu/mla.rs`, `backend/cpu/kda.rs`), kernels in `kernels/mla_kda.cu`.
//!
//! MLA runs in four launches per call: the key up-projection's absorption into the queries
//! (`mla_absorb_joint` for Hugging Face's joint `kv_b_proj`, `mla_head_dot` for llama.cpp's
//! `k_b`), the attention over the latent rows into per-head latent contexts
//! (`mla_attention`), and the value up-projection of the contexts (`mla_head_dot`). The
//! up-projections are read as f32 rows: F32 weights in place, any other type decoded by its
//! `deq_*` kernel into a scratch buffer at every call (`rows × cols` floats: for DeepSeek V3's
//! 128 heads, 2 × 8.4 M floats, 67 MB, per layer and pass), which keeps every type on one
//! path; decoding inside the products instead is the next step.
//!
//! The KDA scan is one launch: a block per head and 32 value columns of its state, the
//! tokens in order ([`Cuda::kda_scan_dev`]).

use anyhow::{bail, Context, Result};
use cudarc::driver::{CudaSlice, CudaView, LaunchConfig, PushKernelArg};

use super::kernels::{type_name, KDA_COLS, KDA_MAX_DK, MLA_MAX_RANK, MLA_MAX_ROPE, MLA_WARPS};
use super::{Cuda, CudaBuf, CudaMatrix};
use crate::backend::{MlaProj, MlaShape};
use crate::quant::GgmlType;

/// Warps per block of `mla_head_dot` (one output each).
const DOT_WARPS: u32 = 8;

/// A weight matrix's values as f32 rows on the device: F32 weights in place, others decoded.
enum F32Rows<'a> {
    Stored(CudaView<'a, f32>),
    Decoded(CudaSlice<f32>),
}

impl F32Rows<'_> {
    fn view(&self) -> CudaView<'_, f32> {
        match self {
            F32Rows::Stored(v) => v.slice(..),
            F32Rows::Decoded(s) => s.slice(..),
        }
    }
}

/// A 1-D launch of `n` threads in blocks of 256.
fn threads(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((n as u64).div_ceil(256).max(1) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl Cuda {
    /// `w`'s values as `rows × cols` f32 (F32 in place, any other type through its `deq_*`
    /// kernel, bit for bit the CPU's `dequantize_row`). Errors: an allocation or a launch.
    fn f32_rows<'a>(&self, w: &'a CudaMatrix) -> Result<F32Rows<'a>> {
        let (m, n) = (w.rows, w.cols);
        if w.ty == GgmlType::F32 {
            // SAFETY: F32 weights are `m × n` little-endian floats.
            let v = unsafe { w.data.transmute::<f32>(m * n) }.context("F32 matrix bytes")?;
            return Ok(F32Rows::Stored(v));
        }
        let mut out = self
            .stream
            .alloc_zeros::<f32>((m * n).max(1))
            .context("CUDA allocation")?;
        if m == 0 || n == 0 {
            return Ok(F32Rows::Decoded(out));
        }
        let deq = self
            .k()?
            .get(&format!("deq_{}", type_name(w.ty).expect("a device type")));
        let units = n.div_ceil(32) as u32;
        let cfg = LaunchConfig {
            grid_dim: (units.div_ceil(128), m.min(65535) as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let null: u64 = 0;
        let (rb, n32, r0, m32) = (w.row_bytes as u64, n as i32, 0i32, m as i32);
        let mut b = self.stream.launch_builder(deq);
        b.arg(&w.data)
            .arg(&rb)
            .arg(&n32)
            .arg(&null)
            .arg(&r0)
            .arg(&m32)
            .arg(&mut out);
        // SAFETY: rows 0 .. m of `w` exist; `out` holds m × n floats.
        unsafe { b.launch(cfg) }.context("CUDA dequantize kernel")?;
        Ok(F32Rows::Decoded(out))
    }

    /// `out[(t·nh + h)·width + o] = Σ_{c < len} w[h·head_stride + w0 + o·len + c] ·
    /// x[(t·nh + h)·x_stride + c]` for `n` rows of `nh` heads (`mla_head_dot`).
    #[allow(clippy::too_many_arguments)]
    fn head_dot(
        &self,
        w: &CudaView<'_, f32>,
        head_stride: usize,
        w0: usize,
        len: usize,
        x: &CudaSlice<f32>,
        x_stride: usize,
        (n, nh, width): (usize, usize, usize),
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let f = self.k()?.get("mla_head_dot");
        let outputs = (n * nh * width) as u64;
        let cfg = LaunchConfig {
            grid_dim: (outputs.div_ceil(DOT_WARPS as u64).max(1) as u32, 1, 1),
            block_dim: (32 * DOT_WARPS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (hs, w064) = (head_stride as u64, w0 as u64);
        let (len32, xs32, n32, nh32, w32) = (
            len as i32,
            x_stride as i32,
            n as i32,
            nh as i32,
            width as i32,
        );
        let mut b = self.stream.launch_builder(f);
        b.arg(w)
            .arg(&hs)
            .arg(&w064)
            .arg(&len32)
            .arg(x)
            .arg(&xs32)
            .arg(&n32)
            .arg(&nh32)
            .arg(&w32)
            .arg(out);
        // SAFETY: the callers check that `w` holds (nh − 1)·head_stride + w0 + width·len
        // floats, `x` (n·nh − 1)·x_stride + len and `out` n·nh·width.
        unsafe { b.launch(cfg) }.context("CUDA mla_head_dot kernel")?;
        Ok(())
    }

    /// [`Backend::mla_attention`](crate::backend::Backend::mla_attention): `q` is
    /// `n × n_heads × (nope + rope)` (rotary parts rotated), `latent` holds `rank + rope`
    /// floats per position `0 .. pos0 + n` (more may follow), `out` is `n × n_heads × v`;
    /// `proj` the joint `kv_b_proj` (`n_heads · (nope + v)` rows × `rank`, `proj.v` `None`) or
    /// the split `k_b` (`n_heads · rank` rows × `nope`) and `v_b` (`n_heads · v` rows ×
    /// `rank`), as `cpu::mla::MlaWeights` documents them.
    ///
    /// Errors: shapes that disagree (named), `rank` over [`MLA_MAX_RANK`] or `rope` over
    /// [`MLA_MAX_ROPE`], an allocation or a launch failing.
    pub(super) fn mla_attention_dev(
        &self,
        s: &MlaShape,
        q: &CudaBuf,
        proj: MlaProj<&CudaMatrix>,
        latent: &CudaBuf,
        pos0: usize,
        out: &mut CudaBuf,
    ) -> Result<()> {
        let (nh, nope, rope, vd, rank) = (s.n_heads, s.nope, s.rope, s.v, s.rank);
        let qh = nope + rope;
        if nh == 0
            || nope == 0
            || vd == 0
            || rank == 0
            || rank > MLA_MAX_RANK
            || rope > MLA_MAX_ROPE
            || !q.len.is_multiple_of(nh * qh)
        {
            bail!(
                "mla_attention: {} query floats, {nh} heads of {nope} + {rope}, values {vd}, \
                 rank {rank} (at most {MLA_MAX_RANK}, rope at most {MLA_MAX_ROPE})",
                q.len
            );
        }
        let n = q.len / (nh * qh);
        same_len("mla_attention output", n * nh * vd, out.len)?;
        let width = rank + rope;
        let need = (pos0 + n) * width;
        if latent.len < need {
            bail!(
                "mla_attention: latent of {} floats, {need} needed for {} positions of {width}",
                latent.len,
                pos0 + n
            );
        }
        let (k, v) = (proj.k, proj.v);
        let shape_ok = match v {
            None => (k.rows, k.cols) == (nh * (nope + vd), rank),
            Some(v) => (k.rows, k.cols, v.rows, v.cols) == (nh * rank, nope, nh * vd, rank),
        };
        if !shape_ok {
            bail!(
                "mla_attention: kv_b {}x{}{} for {nh} heads of {nope} + {vd}, rank {rank}",
                k.rows,
                k.cols,
                v.map_or(String::new(), |v| format!(
                    " with v_b {}x{}",
                    v.rows, v.cols
                ))
            );
        }
        if n == 0 {
            return Ok(());
        }
        let kern = self.k()?;
        let alloc = |len: usize| {
            self.stream
                .alloc_zeros::<f32>(len)
                .context("CUDA allocation")
        };

        // the absorbed queries: n × nh × rank
        let kf = self.f32_rows(k)?;
        let mut qa = alloc(n * nh * rank)?;
        match v {
            None => {
                let f = kern.get("mla_absorb_joint");
                let kv = kf.view();
                let (n32, nh32, qh32, nope32, vd32, r32) = (
                    n as i32,
                    nh as i32,
                    qh as i32,
                    nope as i32,
                    vd as i32,
                    rank as i32,
                );
                let mut b = self.stream.launch_builder(f);
                b.arg(&q.data)
                    .arg(&kv)
                    .arg(&n32)
                    .arg(&nh32)
                    .arg(&qh32)
                    .arg(&nope32)
                    .arg(&vd32)
                    .arg(&r32)
                    .arg(&mut qa);
                // SAFETY: q holds n·nh·qh floats, kv_b nh·(nope + vd)·rank, qa n·nh·rank.
                unsafe { b.launch(threads(n * nh * rank)) }
                    .context("CUDA mla_absorb_joint kernel")?;
            }
            Some(_) => {
                // k_b row h·rank + r (nope floats) against head h's nope query floats
                self.head_dot(
                    &kf.view(),
                    rank * nope,
                    0,
                    nope,
                    &q.data,
                    qh,
                    (n, nh, rank),
                    &mut qa,
                )?;
            }
        }

        // the latent contexts: n × nh × rank
        let mut ctx = alloc(n * nh * rank)?;
        {
            let f = kern.get("mla_attention");
            let (nh32, qh32, nope32, rope32, r32, p32) = (
                nh as i32,
                qh as i32,
                nope as i32,
                rope as i32,
                rank as i32,
                pos0 as i32,
            );
            let cfg = LaunchConfig {
                grid_dim: ((n * nh) as u32, 1, 1),
                block_dim: (32 * MLA_WARPS, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut b = self.stream.launch_builder(f);
            b.arg(&qa)
                .arg(&q.data)
                .arg(&latent.data)
                .arg(&nh32)
                .arg(&qh32)
                .arg(&nope32)
                .arg(&rope32)
                .arg(&r32)
                .arg(&p32)
                .arg(&s.scale)
                .arg(&mut ctx);
            // SAFETY: qa and ctx hold n·nh·rank floats, q n·nh·qh, latent (pos0 + n)·width
            // at least (checked above).
            unsafe { b.launch(cfg) }.context("CUDA mla_attention kernel")?;
        }

        // the outputs: head h's value rows against its context
        match v {
            None => self.head_dot(
                &kf.view(),
                (nope + vd) * rank,
                nope * rank,
                rank,
                &ctx,
                rank,
                (n, nh, vd),
                &mut out.data,
            ),
            Some(v) => {
                let vf = self.f32_rows(v)?;
                self.head_dot(
                    &vf.view(),
                    vd * rank,
                    0,
                    rank,
                    &ctx,
                    rank,
                    (n, nh, vd),
                    &mut out.data,
                )
            }
        }
    }

    /// [`Backend::kda_scan`](crate::backend::Backend::kda_scan) over the state of `heads × dk
    /// × dv` floats of `state` from float `state_at` (a sequence's slot), updated: `q`, `k`,
    /// `g` are `n × heads × dk`, `v` and `out` `n × heads × dv`, `beta` `n × heads`, with `q`
    /// scaled and L2-normed, `k` L2-normed and `g` the log decay, as `cpu::kda::delta_rule`
    /// takes them.
    ///
    /// Errors: shapes that disagree (named), `dk` over [`KDA_MAX_DK`], a launch failing.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn kda_scan_dev(
        &self,
        heads: usize,
        dk: usize,
        dv: usize,
        [q, k, v, g]: [&CudaBuf; 4],
        beta: &CudaBuf,
        state: &mut CudaBuf,
        state_at: usize,
        out: &mut CudaBuf,
    ) -> Result<()> {
        if heads == 0 || dk == 0 || dv == 0 || dk > KDA_MAX_DK || !beta.len.is_multiple_of(heads) {
            bail!(
                "kda_scan: {} beta floats, {heads} heads of {dk} x {dv} (keys at most {KDA_MAX_DK})",
                beta.len
            );
        }
        let n = beta.len / heads;
        same_len("kda_scan q", n * heads * dk, q.len)?;
        same_len("kda_scan k", n * heads * dk, k.len)?;
        same_len("kda_scan g", n * heads * dk, g.len)?;
        same_len("kda_scan v", n * heads * dv, v.len)?;
        same_len("kda_scan output", n * heads * dv, out.len)?;
        let per = heads * dk * dv;
        if state_at + per > state.len {
            bail!(
                "kda_scan: state of {} floats, {per} needed from {state_at}",
                state.len
            );
        }
        if n == 0 {
            return Ok(());
        }
        let f = self.k()?.get("kda_scan");
        let cfg = LaunchConfig {
            grid_dim: (heads as u32, dv.div_ceil(KDA_COLS as usize) as u32, 1),
            block_dim: (KDA_COLS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut st = state.data.slice_mut(state_at..state_at + per);
        let (h32, dk32, dv32, n32) = (heads as i32, dk as i32, dv as i32, n as i32);
        let mut b = self.stream.launch_builder(f);
        b.arg(&q.data)
            .arg(&k.data)
            .arg(&v.data)
            .arg(&g.data)
            .arg(&beta.data)
            .arg(&mut st)
            .arg(&h32)
            .arg(&dk32)
            .arg(&dv32)
            .arg(&n32)
            .arg(&mut out.data);
        // SAFETY: q, k, g hold n·heads·dk floats, v and out n·heads·dv, beta n·heads, the
        // state view heads·dk·dv (checked above).
        unsafe { b.launch(cfg) }.context("CUDA kda_scan kernel")?;
        Ok(())
    }
}

fn same_len(what: &str, want: usize, got: usize) -> Result<()> {
    if want != got {
        bail!("{what}: {got} floats, {want} expected");
    }
    Ok(())
}
