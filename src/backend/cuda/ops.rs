//! [`Backend`] for [`Cuda`]: every op a launch (or a few) on the device's stream. Small host
//! inputs of an op (norm weights, RoPE frequencies, sinks, row indices, token ids) are copied
//! to the device per call; the models' next step (holding them on the device) removes that.
//! Shape mismatches are errors, never panics.

use std::ops::Range;

use anyhow::{bail, Context, Result};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use rayon::prelude::*;

use super::kernels::{type_name, ATT_MAX_DIM, ATT_WARPS};
use super::{Cuda, CudaBuf, CudaMatrix};
use crate::backend::cpu::Matrix;
use crate::backend::{
    check_spans, split_spans, AttnShape, Backend, Glu, MlaProj, MlaShape, Op, SeqSpan,
};

impl Cuda {
    /// The error of an op this backend has no kernel for ([`super::MISSING`]):
    /// `cuda:N: OP is not implemented on cuda` (the stub of an op added to the trait before
    /// its kernel; none today).
    #[allow(dead_code)]
    fn missing(&self, op: Op) -> Result<()> {
        bail!(
            "cuda:{}: {} is not implemented on cuda",
            self.ordinal,
            op.name()
        )
    }
}

/// The downloads [`Backend::download_spans`] copies through the page-locked staging buffer,
/// in floats: from 1 MiB (one sequence's logits over a 262k vocabulary) to 64 MiB (64 such
/// rows; every row's logits of a long prompt are copied into pageable memory directly rather
/// than pinning that much host memory for the device's life).
const STAGED: std::ops::RangeInclusive<usize> = 1 << 18..=1 << 24;

/// Threads per block of the element-wise kernels.
const THREADS: u32 = 256;

/// A 1-D launch over `n` items.
fn grid(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((n as u64).div_ceil(THREADS as u64).max(1) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn same_len(what: &str, a: usize, b: usize) -> Result<()> {
    if a != b {
        bail!("{what}: {a} and {b} floats");
    }
    Ok(())
}

impl Backend for Cuda {
    type Buf = CudaBuf;
    type Weights<'a> = &'a CudaMatrix;

    fn name(&self) -> String {
        self.label.clone()
    }

    fn run_pass<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        // the context is current on the calling thread for the pass (the ops bind it too)
        let _ = self.ctx.bind_to_thread();
        f()
    }

    fn zeros(&self, len: usize) -> Result<CudaBuf> {
        let data = self
            .stream
            .alloc_zeros::<f32>(len.max(1))
            .context("CUDA allocation")?;
        Ok(CudaBuf { len, data })
    }

    fn upload(&self, host: &[f32]) -> Result<CudaBuf> {
        Ok(CudaBuf {
            len: host.len(),
            data: self.put(host)?,
        })
    }

    fn download(&self, buf: &CudaBuf, out: &mut [f32]) -> Result<()> {
        same_len("download", buf.len, out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        let src = buf.data.slice(..buf.len);
        self.stream
            .memcpy_dtoh(&src, out)
            .context("CUDA download")?;
        self.synchronize()
    }

    fn download_spans(
        &self,
        buf: CudaBuf,
        len: usize,
        spans: &[Range<usize>],
    ) -> Result<Vec<Vec<f32>>> {
        check_spans(spans, len)?;
        same_len("download_spans", buf.len, len)?;
        if !STAGED.contains(&len) {
            return split_spans(self.download_owned(buf, len)?, spans);
        }
        let mut staging = self.staging.lock().unwrap_or_else(|e| e.into_inner());
        if staging.as_ref().is_none_or(|p| p.len() < len) {
            // the old buffer freed before the larger one is pinned
            *staging = None;
            // SAFETY: the memory is unset; only the `len` floats the copy below writes are read
            let p = unsafe { self.ctx.alloc_pinned_with_flags::<f32>(len, 0) };
            *staging = Some(p.context("CUDA page-locked allocation")?);
        }
        let pinned = staging.as_mut().expect("allocated above");
        let ptr = pinned.as_mut_ptr().context("CUDA page-locked buffer")?;
        // SAFETY: `ptr` holds at least `len` floats (grown above), owned by `staging`, whose
        // lock is held until the copies below are done; f32 is valid for any bits, and the
        // floats read are those the device copy writes, complete at `synchronize`.
        let host = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
        self.stream
            .memcpy_dtoh(&buf.data.slice(..len), host)
            .context("CUDA download")?;
        self.synchronize()?;
        Ok(spans.par_iter().map(|r| host[r.clone()].to_vec()).collect())
    }

    fn matmul(&self, w: &CudaMatrix, x: &CudaBuf, rows: usize, y: &mut CudaBuf) -> Result<()> {
        self.matmul_dev(w, x, rows, y)
    }

    fn matmul_host(
        &self,
        w: &Matrix<'_>,
        keep: bool,
        x: &CudaBuf,
        rows: usize,
        y: &mut CudaBuf,
    ) -> Result<()> {
        self.with_matrix(w, keep, |w| self.matmul_dev(w, x, rows, y))
    }

    fn copy(
        &self,
        src: &CudaBuf,
        src_at: usize,
        dst: &mut CudaBuf,
        dst_at: usize,
        len: usize,
    ) -> Result<()> {
        if src_at + len > src.len || dst_at + len > dst.len {
            bail!(
                "copy: {len} floats from {src_at} of {} to {dst_at} of {}",
                src.len,
                dst.len
            );
        }
        if len == 0 {
            return Ok(());
        }
        let from = src.data.slice(src_at..src_at + len);
        let mut to = dst.data.slice_mut(dst_at..dst_at + len);
        self.stream.memcpy_dtod(&from, &mut to).context("CUDA copy")
    }

    fn embed_rows(&self, table: &CudaMatrix, ids: &[u32], out: &mut CudaBuf) -> Result<()> {
        same_len("embed_rows", ids.len() * table.cols, out.len)?;
        if ids.is_empty() {
            return Ok(());
        }
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= table.rows) {
            bail!("embed_rows: token {id} of {}", table.rows);
        }
        let k = self.k()?;
        let f = k.get(&format!(
            "deq_{}",
            type_name(table.ty).expect("a device type")
        ));
        let dev_ids = self.put(ids)?;
        let units = table.cols.div_ceil(32) as u32;
        let cfg = LaunchConfig {
            grid_dim: (units.div_ceil(128), ids.len().min(65535) as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let (rb, cols, row0, n) = (
            table.row_bytes as u64,
            table.cols as i32,
            0i32,
            ids.len() as i32,
        );
        let mut b = self.stream.launch_builder(f);
        b.arg(&table.data)
            .arg(&rb)
            .arg(&cols)
            .arg(&dev_ids)
            .arg(&row0)
            .arg(&n)
            .arg(&mut out.data);
        // SAFETY: every id is a row of `table` (checked); `out` holds ids × cols floats.
        unsafe { b.launch(cfg) }.context("CUDA embed kernel")?;
        Ok(())
    }

    fn rms_norm_rows(&self, x: &CudaBuf, w: &[f32], eps: f32, out: &mut CudaBuf) -> Result<()> {
        same_len("rms_norm_rows", x.len, out.len)?;
        let d = w.len();
        if d == 0 || !x.len.is_multiple_of(d) {
            bail!("rms_norm_rows: {} floats in rows of {d}", x.len);
        }
        if x.len == 0 {
            return Ok(());
        }
        let f = self.k()?.get("rms_norm");
        let wd = self.put(w)?;
        let cfg = LaunchConfig {
            grid_dim: ((x.len / d) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let d32 = d as i32;
        let mut b = self.stream.launch_builder(f);
        b.arg(&x.data)
            .arg(&wd)
            .arg(&eps)
            .arg(&d32)
            .arg(&mut out.data);
        // SAFETY: x and out hold (x.len / d) rows of d floats, w holds d.
        unsafe { b.launch(cfg) }.context("CUDA rms_norm kernel")?;
        Ok(())
    }

    fn rope(
        &self,
        x: &mut CudaBuf,
        rows: usize,
        head_dim: usize,
        pos0: usize,
        inv_freq: &[f32],
        interleaved: bool,
        scale: f32,
    ) -> Result<()> {
        if rows == 0 {
            return Ok(());
        }
        let width = x.len / rows;
        let half = inv_freq.len();
        if !x.len.is_multiple_of(rows)
            || head_dim != 2 * half
            || half == 0
            || !width.is_multiple_of(head_dim)
        {
            bail!(
                "rope: {} floats, {rows} rows, head_dim {head_dim}, {half} frequencies",
                x.len
            );
        }
        let f = self.k()?.get("rope");
        let fd = self.put(inv_freq)?;
        let (r32, w32, h32, p32, il) = (
            rows as i32,
            width as i32,
            half as i32,
            pos0 as i32,
            interleaved as i32,
        );
        let mut b = self.stream.launch_builder(f);
        b.arg(&mut x.data)
            .arg(&r32)
            .arg(&w32)
            .arg(&h32)
            .arg(&p32)
            .arg(&fd)
            .arg(&il)
            .arg(&scale);
        // SAFETY: one thread per pair of rows × width / 2 pairs of x; fd holds `half` floats.
        unsafe { b.launch(grid(rows * width / 2)) }.context("CUDA rope kernel")?;
        Ok(())
    }

    fn attention(
        &self,
        s: &AttnShape,
        q: &CudaBuf,
        k: &CudaBuf,
        v: &CudaBuf,
        pos0: usize,
        sinks: Option<&[f32]>,
        out: &mut CudaBuf,
    ) -> Result<()> {
        let (nh, nkv, hd) = (s.n_heads, s.n_kv_heads, s.head_dim);
        let qd = nh * hd;
        if qd == 0
            || nkv == 0
            || !nh.is_multiple_of(nkv)
            || hd > ATT_MAX_DIM
            || !q.len.is_multiple_of(qd)
        {
            bail!(
                "attention: {} query floats, {nh} heads, {nkv} kv heads of {hd} (at most {ATT_MAX_DIM})",
                q.len
            );
        }
        same_len("attention output", q.len, out.len)?;
        let n = q.len / qd;
        let need = (pos0 + n) * nkv * hd;
        if k.len < need || v.len < need {
            bail!(
                "attention: keys {} and values {} floats, {need} needed for {} positions",
                k.len,
                v.len,
                pos0 + n
            );
        }
        if sinks.is_some_and(|sk| sk.len() != nh) {
            bail!(
                "attention: {} sinks for {nh} heads",
                sinks.map_or(0, |s| s.len())
            );
        }
        if n == 0 {
            return Ok(());
        }
        let f = self.k()?.get("attention");
        let sinks_dev = sinks.map(|sk| self.put(sk)).transpose()?;
        let null: u64 = 0;
        let (nh32, nkv32, hd32, p32) = (nh as i32, nkv as i32, hd as i32, pos0 as i32);
        let window = s.window.map_or(0, |w| w.max(1)) as i32;
        let cap = s.softcap.unwrap_or(0.0);
        let cfg = LaunchConfig {
            grid_dim: ((n * nh) as u32, 1, 1),
            block_dim: (32 * ATT_WARPS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(f);
        b.arg(&q.data)
            .arg(&k.data)
            .arg(&v.data)
            .arg(&nh32)
            .arg(&nkv32)
            .arg(&hd32)
            .arg(&p32)
            .arg(&window)
            .arg(&cap);
        match &sinks_dev {
            Some(sd) => b.arg(sd),
            None => b.arg(&null),
        };
        b.arg(&mut out.data);
        // SAFETY: q and out hold n × nh × hd floats, k and v (pos0 + n) × nkv × hd at least,
        // sinks nh floats or a null pointer (checked above).
        unsafe { b.launch(cfg) }.context("CUDA attention kernel")?;
        Ok(())
    }

    fn rope_seqs(
        &self,
        x: &mut CudaBuf,
        width: usize,
        spans: &[SeqSpan],
        head_dim: usize,
        inv_freq: &[f32],
        interleaved: bool,
        scale: f32,
    ) -> Result<()> {
        super::seqs::spans_fit("rope", spans, width, x.len)?;
        match spans {
            [sp] => self.rope(x, sp.rows, head_dim, sp.pos0, inv_freq, interleaved, scale),
            _ => self.rope_seqs_dev(x, width, spans, head_dim, inv_freq, interleaved, scale),
        }
    }

    fn attention_seqs(
        &self,
        s: &AttnShape,
        q: &CudaBuf,
        kv: &[(&CudaBuf, &CudaBuf)],
        spans: &[SeqSpan],
        sinks: Option<&[f32]>,
        out: &mut CudaBuf,
    ) -> Result<()> {
        let qd = s.n_heads * s.head_dim;
        super::seqs::spans_fit("attention", spans, qd, q.len)?;
        match (kv, spans) {
            ([(k, v)], [sp]) => self.attention(s, q, k, v, sp.pos0, sinks, out),
            _ => self.attention_seqs_dev(s, q, kv, spans, sinks, out),
        }
    }

    fn write_kv_seqs(
        &self,
        k: &CudaBuf,
        v: &CudaBuf,
        width: usize,
        spans: &[SeqSpan],
        slots: &mut [(&mut CudaBuf, &mut CudaBuf)],
    ) -> Result<()> {
        // one sequence: two copies (checked here); several: one launch (checked there)
        match slots {
            [_] => {
                super::seqs::write_kv_fits(k, v, width, spans, slots)?;
                crate::backend::write_kv_seqs_by_copies(self, k, v, width, spans, slots)
            }
            _ => self.write_kv_seqs_dev(k, v, width, spans, slots),
        }
    }

    fn mla_attention(
        &self,
        s: &MlaShape,
        q: &CudaBuf,
        proj: MlaProj<&Matrix<'_>>,
        keep: bool,
        latent: &CudaBuf,
        pos0: usize,
        out: &mut CudaBuf,
    ) -> Result<()> {
        // the projections as `matmul_host` takes them: kept on the device when resident
        self.with_matrix(proj.k, keep, |k| match proj.v {
            Some(v) => self.with_matrix(v, keep, |v| {
                let proj = MlaProj { k, v: Some(v) };
                self.mla_attention_dev(s, q, proj, latent, pos0, out)
            }),
            None => self.mla_attention_dev(s, q, MlaProj { k, v: None }, latent, pos0, out),
        })
    }

    fn kda_scan(
        &self,
        heads: usize,
        dk: usize,
        dv: usize,
        qkvg: [&CudaBuf; 4],
        beta: &CudaBuf,
        state: &mut CudaBuf,
        state_at: usize,
        out: &mut CudaBuf,
    ) -> Result<()> {
        self.kda_scan_dev(heads, dk, dv, qkvg, beta, state, state_at, out)
    }

    fn kda_conv(
        &self,
        qkv: [&mut CudaBuf; 3],
        rows: usize,
        taps: &[f32],
        conv: usize,
        state: &mut CudaBuf,
    ) -> Result<()> {
        self.kda_conv_dev(qkv, rows, taps, conv, state)
    }

    fn l2norm_heads(&self, x: &mut CudaBuf, head_dim: usize, eps: f32, scale: f32) -> Result<()> {
        self.l2norm_heads_dev(x, head_dim, eps, scale)
    }

    fn kda_decay(
        &self,
        g: &mut CudaBuf,
        a_log: &[f32],
        dt_bias: &[f32],
        lower_bound: Option<f32>,
    ) -> Result<()> {
        self.kda_decay_dev(g, a_log, dt_bias, lower_bound)
    }

    fn sigmoid(&self, x: &mut CudaBuf) -> Result<()> {
        self.sigmoid_dev(x, None)
    }

    fn mul_sigmoid(&self, x: &mut CudaBuf, g: &CudaBuf) -> Result<()> {
        self.sigmoid_dev(x, Some(g))
    }

    fn gated_head_norm(&self, o: &mut CudaBuf, gate: &CudaBuf, w: &[f32], eps: f32) -> Result<()> {
        self.gated_head_norm_dev(o, gate, w, eps)
    }

    fn rms_norm_head(&self, x: &mut CudaBuf, width: usize, w: &[f32], eps: f32) -> Result<()> {
        self.rms_norm_head_dev(x, width, w, eps)
    }

    fn rope_tail(
        &self,
        x: &mut CudaBuf,
        rows: usize,
        width: usize,
        pos0: usize,
        inv_freq: &[f32],
        interleaved: bool,
        scale: f32,
    ) -> Result<()> {
        self.rope_tail_dev(x, rows, width, pos0, inv_freq, interleaved, scale)
    }

    fn res_mix(
        &self,
        bank: &[&CudaBuf],
        cur: &CudaBuf,
        w: &[f32],
        eps: f32,
        out: &mut CudaBuf,
    ) -> Result<()> {
        self.res_mix_dev(bank, cur, w, eps, out)
    }

    fn add_rows(&self, x: &mut CudaBuf, b: &[f32]) -> Result<()> {
        self.add_rows_dev(x, b)
    }

    fn matmul_host_t(
        &self,
        w: &Matrix<'_>,
        keep: bool,
        x: &CudaBuf,
        rows: usize,
        y: &mut CudaBuf,
    ) -> Result<()> {
        self.with_matrix(w, keep, |w| self.matmul_t_dev(w, x, rows, y))
    }

    fn swiglu_oai(
        &self,
        gate_up: &CudaBuf,
        up: Option<&CudaBuf>,
        alpha: f32,
        limit: f32,
        out: &mut CudaBuf,
    ) -> Result<()> {
        self.swiglu_oai_dev(gate_up, up, alpha, limit, out)
    }

    fn glu(&self, act: Glu, gate: &mut CudaBuf, up: &CudaBuf) -> Result<()> {
        same_len("glu", gate.len, up.len)?;
        let (code, beta, linear_beta) = match act {
            Glu::Swiglu => (0i32, 0f32, 0f32),
            Glu::GegluTanh => (1, 0.0, 0.0),
            Glu::Situ { beta, linear_beta } => (2, beta, linear_beta),
        };
        let f = self.k()?.get("glu");
        let n = gate.len as u64;
        let mut b = self.stream.launch_builder(f);
        b.arg(&mut gate.data)
            .arg(&up.data)
            .arg(&n)
            .arg(&code)
            .arg(&beta)
            .arg(&linear_beta);
        // SAFETY: gate and up hold n floats.
        unsafe { b.launch(grid(gate.len)) }.context("CUDA glu kernel")?;
        Ok(())
    }

    fn softcap(&self, x: &mut CudaBuf, cap: f32) -> Result<()> {
        let f = self.k()?.get("softcap");
        let n = x.len as u64;
        let mut b = self.stream.launch_builder(f);
        b.arg(&mut x.data).arg(&n).arg(&cap);
        // SAFETY: x holds n floats.
        unsafe { b.launch(grid(x.len)) }.context("CUDA softcap kernel")?;
        Ok(())
    }

    fn add(&self, x: &mut CudaBuf, y: &CudaBuf) -> Result<()> {
        same_len("add", x.len, y.len)?;
        let f = self.k()?.get("add");
        let n = x.len as u64;
        let mut b = self.stream.launch_builder(f);
        b.arg(&mut x.data).arg(&y.data).arg(&n);
        // SAFETY: x and y hold n floats.
        unsafe { b.launch(grid(x.len)) }.context("CUDA add kernel")?;
        Ok(())
    }

    fn gather_rows(
        &self,
        x: &CudaBuf,
        width: usize,
        rows: &[usize],
        out: &mut CudaBuf,
    ) -> Result<()> {
        same_len("gather_rows output", rows.len() * width, out.len)?;
        if rows.is_empty() || width == 0 {
            return Ok(());
        }
        let idx = self.put_rows(rows, x.len / width, "gather_rows")?;
        let f = self.k()?.get("gather_rows");
        let (w32, n32) = (width as i32, rows.len() as i32);
        let mut b = self.stream.launch_builder(f);
        b.arg(&x.data)
            .arg(&w32)
            .arg(&idx)
            .arg(&n32)
            .arg(&mut out.data);
        // SAFETY: every index is a row of x (checked); out holds rows × width floats.
        unsafe { b.launch(grid(out.len)) }.context("CUDA gather kernel")?;
        Ok(())
    }

    fn scatter_add_rows(
        &self,
        y: &CudaBuf,
        width: usize,
        rows: &[usize],
        weights: &[f32],
        out: &mut CudaBuf,
    ) -> Result<()> {
        same_len("scatter_add_rows input", rows.len() * width, y.len)?;
        same_len("scatter_add_rows weights", rows.len(), weights.len())?;
        if rows.is_empty() || width == 0 {
            return Ok(());
        }
        let idx = self.put_rows(rows, out.len / width, "scatter_add_rows")?;
        let wd = self.put(weights)?;
        let f = self.k()?.get("scatter_add_rows");
        let (w32, n32) = (width as i32, rows.len() as i32);
        let mut b = self.stream.launch_builder(f);
        b.arg(&y.data)
            .arg(&w32)
            .arg(&idx)
            .arg(&wd)
            .arg(&n32)
            .arg(&mut out.data);
        // SAFETY: every index is a row of out (checked); y holds rows × width floats.
        unsafe { b.launch(grid(width)) }.context("CUDA scatter kernel")?;
        Ok(())
    }
}
