//! The ops only some families need ([`crate::backend::Op`]) on a CUDA device, kernels in
//! `kernels/family_ops.cu`, each with the CPU's semantics (`backend/cpu/device.rs` and the
//! kernels it calls): MLA's partial RMSNorm and RoPE, the KDA convolution, L2 norms, decay,
//! sigmoids and gated norm, Kimi K3's residual mix, GPT-OSS's row biases, input-major
//! products and clamped SwiGLU. Shapes are checked here (errors name the op), never in a
//! kernel.
//!
//! The input-major product ([`Cuda::matmul_t_dev`]) reads its weights as f32 rows: F32 in
//! place, any other type decoded by its `deq_*` kernel into the f32 panel of the cuBLAS path
//! (at most 64 MiB, panels of stored rows) at every call; up to 8 activation rows (or
//! without cuBLAS) the `matmul_t` kernel adds each panel's terms in the CPU's order (bit for
//! bit the CPU's result), more rows go through cuBLAS SGEMM, panel after panel.

use anyhow::{bail, Context, Result};
use cudarc::cublas::{sys::cublasOperation_t, Gemm, GemmConfig};
use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::kernels::{KDA_MAX_CONV, MT_ROWS, RES_MIX_MAX, ROPE_TAIL_MAX};
use super::matmul::DIRECT_MAX_ROWS;
use super::{Cuda, CudaBuf, CudaMatrix};
use crate::quant::GgmlType;

/// Threads per block of the one-thread-per-item kernels.
const THREADS: u32 = 256;

/// A 1-D launch over `n` items.
fn grid(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((n as u64).div_ceil(THREADS as u64).max(1) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One block of 256 threads per item (row, slice, head).
fn blocks(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn same_len(what: &str, want: usize, got: usize) -> Result<()> {
    if want != got {
        bail!("{what}: {got} floats, {want} expected");
    }
    Ok(())
}

impl Cuda {
    /// RMSNorm in place of the first `w.len()` floats of every `stride`-wide row of `x`,
    /// times `σ(gate)` elementwise when a gate is given (`rms_norm_part`).
    fn norm_part(
        &self,
        what: &str,
        x: &mut CudaBuf,
        stride: usize,
        w: &[f32],
        eps: f32,
        gate: Option<&CudaBuf>,
    ) -> Result<()> {
        let d = w.len();
        if d == 0 || stride < d || !x.len.is_multiple_of(stride) {
            bail!("{what}: {} floats in rows of {stride}, {d} weights", x.len);
        }
        if let Some(g) = gate {
            same_len(&format!("{what} gate"), x.len, g.len)?;
        }
        let rows = x.len / stride;
        if rows == 0 {
            return Ok(());
        }
        let f = self.k()?.get("rms_norm_part");
        let wd = self.put(w)?;
        let null: u64 = 0;
        let (s32, d32) = (stride as i32, d as i32);
        let mut b = self.stream.launch_builder(f);
        b.arg(&mut x.data).arg(&s32).arg(&d32).arg(&wd).arg(&eps);
        match gate {
            Some(g) => b.arg(&g.data),
            None => b.arg(&null),
        };
        // SAFETY: x (and the gate) hold rows × stride floats, w d ≤ stride (checked above).
        unsafe { b.launch(blocks(rows)) }.context("CUDA rms_norm_part kernel")?;
        Ok(())
    }

    /// [`Backend::rms_norm_head`](crate::backend::Backend::rms_norm_head). Errors: rows
    /// narrower than `w` or not dividing `x`, a launch.
    pub(super) fn rms_norm_head_dev(
        &self,
        x: &mut CudaBuf,
        width: usize,
        w: &[f32],
        eps: f32,
    ) -> Result<()> {
        self.norm_part("rms_norm_head", x, width, w, eps, None)
    }

    /// [`Backend::gated_head_norm`](crate::backend::Backend::gated_head_norm). Errors: heads
    /// not dividing `o`, a gate of another length, a launch.
    pub(super) fn gated_head_norm_dev(
        &self,
        o: &mut CudaBuf,
        gate: &CudaBuf,
        w: &[f32],
        eps: f32,
    ) -> Result<()> {
        self.norm_part("gated_head_norm", o, w.len(), w, eps, Some(gate))
    }

    /// [`Backend::rope_tail`](crate::backend::Backend::rope_tail). Errors: `rows` not
    /// dividing `x`, slices not dividing a row, a rotary part wider than a slice or than
    /// [`ROPE_TAIL_MAX`], a launch.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rope_tail_dev(
        &self,
        x: &mut CudaBuf,
        rows: usize,
        width: usize,
        pos0: usize,
        inv_freq: &[f32],
        interleaved: bool,
        scale: f32,
    ) -> Result<()> {
        let half = inv_freq.len();
        let row = x.len.checked_div(rows).unwrap_or(0);
        if rows == 0 && x.len == 0 {
            return Ok(());
        }
        if rows == 0
            || !x.len.is_multiple_of(rows)
            || width == 0
            || !row.is_multiple_of(width)
            || 2 * half > width
            || 2 * half > ROPE_TAIL_MAX
        {
            bail!(
                "rope_tail: {} floats, {rows} rows, slices of {width}, {half} frequencies \
                 (at most {})",
                x.len,
                ROPE_TAIL_MAX / 2
            );
        }
        if half == 0 || x.len == 0 {
            return Ok(());
        }
        let f = self.k()?.get("rope_tail");
        let fd = self.put(inv_freq)?;
        let (w32, per32, h32, p32, il) = (
            width as i32,
            (row / width) as i32,
            half as i32,
            pos0 as i32,
            interleaved as i32,
        );
        let cfg = LaunchConfig {
            grid_dim: ((x.len / width) as u32, 1, 1),
            block_dim: (half.min(256) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(f);
        b.arg(&mut x.data)
            .arg(&w32)
            .arg(&per32)
            .arg(&h32)
            .arg(&p32)
            .arg(&fd)
            .arg(&il)
            .arg(&scale);
        // SAFETY: one block per width-wide slice of x, each rotating its last 2·half ≤ width
        // floats; fd holds half floats.
        unsafe { b.launch(cfg) }.context("CUDA rope_tail kernel")?;
        Ok(())
    }

    /// [`Backend::kda_conv`](crate::backend::Backend::kda_conv): `q`, `k`, `v` of `rows × dim`
    /// floats each, `taps` `3·dim × conv`, the first `(conv − 1) × 3·dim` floats of `state`.
    /// Errors: shapes that disagree, `conv` 0 or over [`KDA_MAX_CONV`], a launch.
    pub(super) fn kda_conv_dev(
        &self,
        [q, k, v]: [&mut CudaBuf; 3],
        rows: usize,
        taps: &[f32],
        conv: usize,
        state: &mut CudaBuf,
    ) -> Result<()> {
        let dim = q.len.checked_div(rows).unwrap_or(0);
        if rows == 0 || !q.len.is_multiple_of(rows) || conv == 0 || conv > KDA_MAX_CONV {
            if rows == 0 && q.len == 0 && k.len == 0 && v.len == 0 && conv > 0 {
                return Ok(());
            }
            bail!(
                "kda_conv: {} query floats in {rows} rows, {conv} taps (at most {KDA_MAX_CONV})",
                q.len
            );
        }
        same_len("kda_conv k", q.len, k.len)?;
        same_len("kda_conv v", q.len, v.len)?;
        same_len("kda_conv taps", 3 * dim * conv, taps.len())?;
        let keep = (conv - 1) * 3 * dim;
        if state.len < keep {
            bail!("kda_conv: state of {} floats, {keep} needed", state.len);
        }
        if dim == 0 {
            return Ok(());
        }
        let f = self.k()?.get("kda_conv");
        let td = self.put(taps)?;
        let (n32, d32, c32) = (rows as i32, dim as i32, conv as i32);
        let mut b = self.stream.launch_builder(f);
        b.arg(&mut q.data)
            .arg(&mut k.data)
            .arg(&mut v.data)
            .arg(&n32)
            .arg(&d32)
            .arg(&td)
            .arg(&c32)
            .arg(&mut state.data);
        // SAFETY: q, k, v hold rows × dim floats, taps 3·dim·conv, state (conv − 1)·3·dim at
        // least (checked above); one thread per channel.
        unsafe { b.launch(grid(3 * dim)) }.context("CUDA kda_conv kernel")?;
        Ok(())
    }

    /// [`Backend::l2norm_heads`](crate::backend::Backend::l2norm_heads). Errors: heads not
    /// dividing `x`, a launch.
    pub(super) fn l2norm_heads_dev(
        &self,
        x: &mut CudaBuf,
        head_dim: usize,
        eps: f32,
        scale: f32,
    ) -> Result<()> {
        if head_dim == 0 || !x.len.is_multiple_of(head_dim) {
            bail!("l2norm_heads: {} floats in heads of {head_dim}", x.len);
        }
        let heads = x.len / head_dim;
        if heads == 0 {
            return Ok(());
        }
        let f = self.k()?.get("l2norm_heads");
        let (h64, d32) = (heads as u64, head_dim as i32);
        let mut b = self.stream.launch_builder(f);
        b.arg(&mut x.data).arg(&h64).arg(&d32).arg(&eps).arg(&scale);
        // SAFETY: x holds heads × head_dim floats; one thread per head.
        unsafe { b.launch(grid(heads)) }.context("CUDA l2norm_heads kernel")?;
        Ok(())
    }

    /// [`Backend::kda_decay`](crate::backend::Backend::kda_decay). Errors: `dt_bias` not
    /// dividing `g`, `a_log` not dividing `dt_bias`, a launch.
    pub(super) fn kda_decay_dev(
        &self,
        g: &mut CudaBuf,
        a_log: &[f32],
        dt_bias: &[f32],
        lower_bound: Option<f32>,
    ) -> Result<()> {
        let (dim, heads) = (dt_bias.len(), a_log.len());
        if dim == 0 || heads == 0 || !dim.is_multiple_of(heads) || !g.len.is_multiple_of(dim) {
            bail!(
                "kda_decay: {} floats in rows of {dim} ({heads} heads)",
                g.len
            );
        }
        if g.len == 0 {
            return Ok(());
        }
        let f = self.k()?.get("kda_decay");
        let (ad, bd) = (self.put(a_log)?, self.put(dt_bias)?);
        let (n64, d32, dk32) = (g.len as u64, dim as i32, (dim / heads) as i32);
        let (has, lb) = (lower_bound.is_some() as i32, lower_bound.unwrap_or(0.0));
        let mut b = self.stream.launch_builder(f);
        b.arg(&mut g.data)
            .arg(&n64)
            .arg(&d32)
            .arg(&dk32)
            .arg(&ad)
            .arg(&bd)
            .arg(&has)
            .arg(&lb);
        // SAFETY: g holds n floats in rows of dim; a_log holds dim / dk floats, dt_bias dim.
        unsafe { b.launch(grid(g.len)) }.context("CUDA kda_decay kernel")?;
        Ok(())
    }

    /// [`Backend::sigmoid`](crate::backend::Backend::sigmoid) (`g` `None`) and
    /// [`Backend::mul_sigmoid`](crate::backend::Backend::mul_sigmoid). Errors: a gate of
    /// another length, a launch.
    pub(super) fn sigmoid_dev(&self, x: &mut CudaBuf, g: Option<&CudaBuf>) -> Result<()> {
        if let Some(g) = g {
            same_len("mul_sigmoid gate", x.len, g.len)?;
        }
        if x.len == 0 {
            return Ok(());
        }
        let f = self.k()?.get("sigmoid_mul");
        let (null, n64) = (0u64, x.len as u64);
        let mut b = self.stream.launch_builder(f);
        b.arg(&mut x.data);
        match g {
            Some(g) => b.arg(&g.data),
            None => b.arg(&null),
        };
        b.arg(&n64);
        // SAFETY: x (and g) hold n floats.
        unsafe { b.launch(grid(x.len)) }.context("CUDA sigmoid kernel")?;
        Ok(())
    }

    /// [`Backend::res_mix`](crate::backend::Backend::res_mix). Errors: buffers of other
    /// lengths than `cur`, rows not dividing it, more than [`RES_MIX_MAX`] sources, a launch.
    pub(super) fn res_mix_dev(
        &self,
        bank: &[&CudaBuf],
        cur: &CudaBuf,
        w: &[f32],
        eps: f32,
        out: &mut CudaBuf,
    ) -> Result<()> {
        let d = w.len();
        if d == 0 || !cur.len.is_multiple_of(d) || bank.len() + 1 > RES_MIX_MAX {
            bail!(
                "res_mix: {} floats in rows of {d}, {} checkpoints (at most {})",
                cur.len,
                bank.len(),
                RES_MIX_MAX - 1
            );
        }
        same_len("res_mix output", cur.len, out.len)?;
        for b in bank {
            same_len("res_mix checkpoint", cur.len, b.len)?;
        }
        if cur.len == 0 {
            return Ok(());
        }
        if bank.is_empty() {
            // the CPU's copy (the kernel would turn a −0 into +0)
            return crate::backend::Backend::copy(self, cur, 0, out, 0, cur.len);
        }
        let f = self.k()?.get("res_mix");
        // the checkpoints' device addresses, for the kernel to read them by index
        let (ptrs, _guards): (Vec<u64>, Vec<_>) = bank
            .iter()
            .map(|b| {
                use cudarc::driver::DevicePtr;
                let (p, g) = b.data.device_ptr(&self.stream);
                (p, g)
            })
            .unzip();
        let pd = self.put(&ptrs)?;
        let wd = self.put(w)?;
        let (nb, d32) = (bank.len() as i32, d as i32);
        let mut b = self.stream.launch_builder(f);
        b.arg(&pd)
            .arg(&nb)
            .arg(&cur.data)
            .arg(&d32)
            .arg(&wd)
            .arg(&eps)
            .arg(&mut out.data);
        // SAFETY: every address in pd is a live buffer of cur.len floats (the borrows of
        // `bank` outlive the launch, which is queued on the stream they belong to); cur and
        // out hold rows × d floats, w d.
        unsafe { b.launch(blocks(cur.len / d)) }.context("CUDA res_mix kernel")?;
        Ok(())
    }

    /// [`Backend::add_rows`](crate::backend::Backend::add_rows). Errors: `b` not dividing
    /// `x`, a launch.
    pub(super) fn add_rows_dev(&self, x: &mut CudaBuf, bias: &[f32]) -> Result<()> {
        let d = bias.len();
        if d == 0 || !x.len.is_multiple_of(d) {
            bail!("add_rows: {} floats in rows of {d}", x.len);
        }
        if x.len == 0 {
            return Ok(());
        }
        let f = self.k()?.get("add_rows");
        let bd = self.put(bias)?;
        let (n64, d32) = (x.len as u64, d as i32);
        let mut b = self.stream.launch_builder(f);
        b.arg(&mut x.data).arg(&bd).arg(&n64).arg(&d32);
        // SAFETY: x holds n floats in rows of d, bd d floats.
        unsafe { b.launch(grid(x.len)) }.context("CUDA add_rows kernel")?;
        Ok(())
    }

    /// [`Backend::swiglu_oai`](crate::backend::Backend::swiglu_oai). Errors: `out` not half
    /// of `gate_up` (pairs) or not its length (with `up`), a launch.
    pub(super) fn swiglu_oai_dev(
        &self,
        gate_up: &CudaBuf,
        up: Option<&CudaBuf>,
        alpha: f32,
        limit: f32,
        out: &mut CudaBuf,
    ) -> Result<()> {
        match up {
            None => {
                if !gate_up.len.is_multiple_of(2) {
                    bail!("swiglu_oai: {} floats of (gate, up) pairs", gate_up.len);
                }
                same_len("swiglu_oai output", gate_up.len / 2, out.len)?;
            }
            Some(u) => {
                same_len("swiglu_oai up", gate_up.len, u.len)?;
                same_len("swiglu_oai output", gate_up.len, out.len)?;
            }
        }
        if out.len == 0 {
            return Ok(());
        }
        let f = self.k()?.get("swiglu_oai");
        let (null, n64) = (0u64, out.len as u64);
        let mut b = self.stream.launch_builder(f);
        b.arg(&gate_up.data);
        match up {
            Some(u) => b.arg(&u.data),
            None => b.arg(&null),
        };
        b.arg(&n64).arg(&alpha).arg(&limit).arg(&mut out.data);
        // SAFETY: out holds n floats; gate_up 2·n (pairs) or n with up of n.
        unsafe { b.launch(grid(out.len)) }.context("CUDA swiglu_oai kernel")?;
        Ok(())
    }

    /// `y = x W` for a weight stored input-major (`w.rows` inputs × `w.cols` outputs): `rows`
    /// rows of `x` (`rows × w.rows`) into `y` (`rows × w.cols`)
    /// ([`Backend::matmul_host_t`](crate::backend::Backend::matmul_host_t); the module header
    /// says how). Errors: shapes that disagree, an allocation or a launch.
    pub(super) fn matmul_t_dev(
        &self,
        w: &CudaMatrix,
        x: &CudaBuf,
        rows: usize,
        y: &mut CudaBuf,
    ) -> Result<()> {
        let (k, m) = (w.rows, w.cols);
        if x.len != rows * k || y.len != rows * m {
            bail!(
                "matmul_host_t: {} matrix {k}x{m} (input-major) with x of {} and y of {} \
                 floats for {rows} rows",
                w.ty,
                x.len,
                y.len
            );
        }
        if rows == 0 || m == 0 {
            return Ok(());
        }
        if k == 0 {
            return self.memset_zero(y);
        }
        // the panel's lock also keeps one thread at a time on the cuBLAS handle
        let mut guard = self.panel.lock().unwrap_or_else(|e| e.into_inner());
        if w.ty == GgmlType::F32 {
            // SAFETY: F32 weights are `k × m` little-endian floats.
            let all = unsafe { w.data.transmute::<f32>(k * m) }.context("F32 matrix bytes")?;
            return self.matmul_t_panel(&all, 0, k, m, x, rows, y);
        }
        let panel_rows = (super::matmul::PANEL_FLOATS / m).clamp(1, k);
        let panel = self.panel_of(&mut guard, panel_rows * m)?;
        let mut i0 = 0;
        while i0 < k {
            let pk = panel_rows.min(k - i0);
            self.dequantize_rows(w, i0, pk, panel)?;
            let view = panel.slice(..pk * m);
            self.matmul_t_panel(&view, i0, pk, m, x, rows, y)?;
            i0 += pk;
        }
        Ok(())
    }

    /// `y (+)= x[:, i0 .. i0 + pk] · P` for the f32 panel `P` (`pk × m`, stored rows `i0 ..`
    /// of the weight), the first panel (`i0` 0) overwriting `y`: the `matmul_t` kernel in
    /// groups of up to 8 rows, or cuBLAS SGEMM for more than [`DIRECT_MAX_ROWS`] rows.
    #[allow(clippy::too_many_arguments)]
    fn matmul_t_panel(
        &self,
        p: &cudarc::driver::CudaView<'_, f32>,
        i0: usize,
        pk: usize,
        m: usize,
        x: &CudaBuf,
        rows: usize,
        y: &mut CudaBuf,
    ) -> Result<()> {
        let k = x.len / rows;
        if let (Some(blas), true) = (&self.blas, rows > DIRECT_MAX_ROWS) {
            // column-major: Yᵀ (m × rows, ldc m) = Pᵀ (m × pk, lda m) · X_subᵀ (pk × rows, ldb k)
            let cfg = GemmConfig {
                transa: cublasOperation_t::CUBLAS_OP_N,
                transb: cublasOperation_t::CUBLAS_OP_N,
                m: m as i32,
                n: rows as i32,
                k: pk as i32,
                alpha: 1.0f32,
                lda: m as i32,
                ldb: k as i32,
                beta: if i0 == 0 { 0.0 } else { 1.0 },
                ldc: m as i32,
            };
            let xs = x.data.slice(i0..);
            let mut c = y.data.slice_mut(..);
            // SAFETY: A is pk × m floats; B from float i0 reads column t's pk floats at
            // t·k, the last ending at (rows − 1)·k + pk ≤ rows·k − i0; C is rows × m.
            unsafe { blas.gemm(cfg, p, &xs, &mut c) }.context("cuBLAS SGEMM")?;
            return Ok(());
        }
        let f = self.k()?.get("matmul_t");
        let mut t0 = 0;
        while t0 < rows {
            let r = MT_ROWS.min(rows - t0);
            let xv = x.data.slice(t0 * k..(t0 + r) * k);
            let mut yv = y.data.slice_mut(t0 * m..(t0 + r) * m);
            let (pk32, m32, k32, i032, r32, acc) = (
                pk as i32,
                m as i32,
                k as i32,
                i0 as i32,
                r as i32,
                (i0 > 0) as i32,
            );
            let mut b = self.stream.launch_builder(f);
            b.arg(p)
                .arg(&pk32)
                .arg(&m32)
                .arg(&xv)
                .arg(&k32)
                .arg(&i032)
                .arg(&r32)
                .arg(&acc)
                .arg(&mut yv);
            // SAFETY: p holds pk × m floats, xv r rows of k ≥ i0 + pk floats, yv r × m.
            unsafe { b.launch(grid(m)) }.context("CUDA matmul_t kernel")?;
            t0 += r;
        }
        Ok(())
    }

    /// `y` set to zeros (a product over no input).
    fn memset_zero(&self, y: &mut CudaBuf) -> Result<()> {
        self.stream.memset_zeros(&mut y.data).context("CUDA memset")
    }
}
