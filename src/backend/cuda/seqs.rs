//! The ops over several sequences of one pass ([`Backend::rope_seqs`],
//! [`Backend::attention_seqs`]) on [`Cuda`], each one launch over every row of the pass: the
//! `rope_rows` kernel reads each row's position from a table, `attention_rows` each row's
//! key slot, value slot and position (the device addresses of the sequences' caches), both
//! uploaded once per call. The arithmetic is that of `rope` and `attention` for one sequence
//! (the same device functions), so each sequence's results are those it has alone, bit for
//! bit (`tests_seqs.rs`); one launch replaces one per sequence (three per layer and sequence
//! of a decode step, which bound a batch's step on the GPU).
//!
//! [`Backend::rope_seqs`]: crate::backend::Backend::rope_seqs
//! [`Backend::attention_seqs`]: crate::backend::Backend::attention_seqs

use anyhow::{bail, Context, Result};
use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::kernels::{ATT_MAX_DIM, ATT_WARPS};
use super::{Cuda, CudaBuf};
use crate::backend::cpu::attn_seqs::spans_error;
use crate::backend::{AttnShape, SeqSpan};

/// Threads per block of the RoPE launch (as `ops.rs`'s element-wise launches).
const THREADS: u32 = 256;

/// Checks that the spans are the rows of a buffer of `len` floats of `width`-wide rows, in
/// order ([`spans_error`]).
pub(super) fn spans_fit(what: &str, spans: &[SeqSpan], width: usize, len: usize) -> Result<()> {
    if width == 0 || !len.is_multiple_of(width) {
        bail!("{what}: {len} floats are not rows of {width}");
    }
    match spans_error(spans, len / width) {
        Some(e) => bail!("{what}: {e}"),
        None => Ok(()),
    }
}

/// [`crate::backend::write_kv_seqs_error`] for device buffers: `k`, `v` and the slots
/// checked against the spans (the errors of `Backend::write_kv_seqs`).
pub(super) fn write_kv_fits(
    k: &CudaBuf,
    v: &CudaBuf,
    width: usize,
    spans: &[SeqSpan],
    slots: &[(&mut CudaBuf, &mut CudaBuf)],
) -> Result<()> {
    let lens: Vec<(usize, usize)> = slots.iter().map(|(k, v)| (k.len, v.len)).collect();
    crate::backend::write_kv_seqs_error(k.len, v.len, width, spans, &lens)
}

impl Cuda {
    /// `Backend::rope_seqs` on the device (see the module header). Errors: a span outside
    /// `x`, a shape the `rope` kernel does not take (as `Backend::rope`), a launch failing.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rope_seqs_dev(
        &self,
        x: &mut CudaBuf,
        width: usize,
        spans: &[SeqSpan],
        head_dim: usize,
        inv_freq: &[f32],
        interleaved: bool,
        scale: f32,
    ) -> Result<()> {
        let half = inv_freq.len();
        if head_dim != 2 * half || half == 0 || width == 0 || !width.is_multiple_of(head_dim) {
            bail!("rope: rows of {width} floats, head_dim {head_dim}, {half} frequencies");
        }
        spans_fit("rope", spans, width, x.len)?;
        let rows = x.len / width;
        if rows == 0 {
            return Ok(());
        }
        // each row's position, as the kernel takes it (i32, as `rope`'s pos0)
        let mut pos = vec![0i32; rows];
        for sp in spans {
            for t in 0..sp.rows {
                pos[sp.r0 + t] = i32::try_from(sp.pos0 + t).context("rope: position past i32")?;
            }
        }
        let f = self.k()?.get("rope_rows");
        let fd = self.put(inv_freq)?;
        let pd = self.put(&pos)?;
        let (r32, w32, h32, il) = (rows as i32, width as i32, half as i32, interleaved as i32);
        let n = rows * width / 2;
        let cfg = LaunchConfig {
            grid_dim: ((n as u64).div_ceil(THREADS as u64).max(1) as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(f);
        b.arg(&mut x.data)
            .arg(&r32)
            .arg(&w32)
            .arg(&h32)
            .arg(&pd)
            .arg(&fd)
            .arg(&il)
            .arg(&scale);
        // SAFETY: one thread per pair of rows × width / 2 pairs of x (rows × width floats);
        // pd holds `rows` positions, fd `half` floats.
        unsafe { b.launch(cfg) }.context("CUDA rope_rows kernel")?;
        Ok(())
    }

    /// `Backend::attention_seqs` on the device (see the module header). Errors: as
    /// `Backend::attention` per sequence, a span outside `q` or `out`, `kv` and `spans` of
    /// different lengths, a launch failing.
    pub(super) fn attention_seqs_dev(
        &self,
        s: &AttnShape,
        q: &CudaBuf,
        kv: &[(&CudaBuf, &CudaBuf)],
        spans: &[SeqSpan],
        sinks: Option<&[f32]>,
        out: &mut CudaBuf,
    ) -> Result<()> {
        let (nh, nkv, hd) = (s.n_heads, s.n_kv_heads, s.head_dim);
        let qd = nh * hd;
        if qd == 0 || nkv == 0 || !nh.is_multiple_of(nkv) || hd > ATT_MAX_DIM {
            bail!("attention: {nh} heads, {nkv} kv heads of {hd} (at most {ATT_MAX_DIM})");
        }
        if kv.len() != spans.len() {
            bail!(
                "attention_seqs: {} key/value slots for {} sequences",
                kv.len(),
                spans.len()
            );
        }
        if q.len != out.len {
            bail!("attention output: {} floats, {} expected", out.len, q.len);
        }
        spans_fit("attention", spans, qd, q.len)?;
        if sinks.is_some_and(|sk| sk.len() != nh) {
            bail!(
                "attention: {} sinks for {nh} heads",
                sinks.map_or(0, |s| s.len())
            );
        }
        for (&(k, v), sp) in kv.iter().zip(spans) {
            let need = (sp.pos0 + sp.rows) * nkv * hd;
            if k.len < need || v.len < need {
                bail!(
                    "attention: keys {} and values {} floats, {need} needed for {} positions",
                    k.len,
                    v.len,
                    sp.pos0 + sp.rows
                );
            }
        }
        let rows = q.len / qd;
        if rows == 0 {
            return Ok(());
        }
        // row t's key slot, value slot (device addresses) and position; the guards keep the
        // slots' stream order until the launch is queued
        let mut meta = vec![0u64; 3 * rows];
        let mut guards = Vec::with_capacity(2 * kv.len());
        for (&(k, v), sp) in kv.iter().zip(spans).filter(|(_, sp)| sp.rows > 0) {
            use cudarc::driver::DevicePtr;
            let (kp, kg) = k.data.device_ptr(&self.stream);
            let (vp, vg) = v.data.device_ptr(&self.stream);
            guards.push(kg);
            guards.push(vg);
            for t in 0..sp.rows {
                let r = sp.r0 + t;
                // the kernel reads the position as an int
                i32::try_from(sp.pos0 + t).context("attention: position past i32")?;
                meta[3 * r..3 * r + 3].copy_from_slice(&[kp, vp, (sp.pos0 + t) as u64]);
            }
        }
        let f = self.k()?.get("attention_rows");
        let md = self.put(&meta)?;
        let sinks_dev = sinks.map(|sk| self.put(sk)).transpose()?;
        let null: u64 = 0;
        let (nh32, nkv32, hd32) = (nh as i32, nkv as i32, hd as i32);
        let window = s.window.map_or(0, |w| w.max(1)) as i32;
        let cap = s.softcap.unwrap_or(0.0);
        let blocks = u32::try_from(rows * nh).context("attention: rows × heads past the grid")?;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (32 * ATT_WARPS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(f);
        b.arg(&q.data)
            .arg(&md)
            .arg(&nh32)
            .arg(&nkv32)
            .arg(&hd32)
            .arg(&window)
            .arg(&cap);
        match &sinks_dev {
            Some(sd) => b.arg(sd),
            None => b.arg(&null),
        };
        b.arg(&mut out.data);
        // SAFETY: q and out hold rows × nh × hd floats; every row's addresses in md are live
        // slots of (pos + 1) × nkv × hd floats at least (checked above), freed after the
        // kernel ran: dropping the guards records the read on the stream, and a slot's free
        // waits for it; sinks nh floats or a null pointer.
        unsafe { b.launch(cfg) }.context("CUDA attention_rows kernel")?;
        drop(guards);
        Ok(())
    }

    /// `Backend::write_kv_seqs` on the device: one `write_kv_rows` launch, each row's
    /// destinations (its slot's address at its position) uploaded as a table. Errors: as
    /// `write_kv_seqs` ([`crate::backend::write_kv_seqs_error`]), a launch failing.
    pub(super) fn write_kv_seqs_dev(
        &self,
        k: &CudaBuf,
        v: &CudaBuf,
        width: usize,
        spans: &[SeqSpan],
        slots: &mut [(&mut CudaBuf, &mut CudaBuf)],
    ) -> Result<()> {
        write_kv_fits(k, v, width, spans, slots)?;
        let rows = k.len / width;
        if rows == 0 {
            return Ok(());
        }
        // keys' destinations (rows), then values'; the guards as in attention_seqs_dev
        let mut dst = vec![0u64; 2 * rows];
        let mut guards = Vec::with_capacity(2 * slots.len());
        for ((kc, vc), sp) in slots.iter_mut().zip(spans).filter(|(_, sp)| sp.rows > 0) {
            use cudarc::driver::DevicePtrMut;
            let (kp, kg) = kc.data.device_ptr_mut(&self.stream);
            let (vp, vg) = vc.data.device_ptr_mut(&self.stream);
            guards.push(kg);
            guards.push(vg);
            for t in 0..sp.rows {
                let at = ((sp.pos0 + t) * width * std::mem::size_of::<f32>()) as u64;
                dst[sp.r0 + t] = kp + at;
                dst[rows + sp.r0 + t] = vp + at;
            }
        }
        let f = self.k()?.get("write_kv_rows");
        let dd = self.put(&dst)?;
        let w32 = i32::try_from(width).context("write_kv_seqs: row width past i32")?;
        let rows32 = u32::try_from(rows).context("write_kv_seqs: rows past the grid")?;
        let cfg = LaunchConfig {
            grid_dim: (rows32, 2, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(f);
        b.arg(&k.data).arg(&v.data).arg(&dd).arg(&w32);
        // SAFETY: k and v hold rows × width floats; every address in dd is a row of `width`
        // floats inside a live slot (lengths checked above), freed after the kernel ran:
        // dropping the guards records the write on the stream, and a slot's free waits for it.
        unsafe { b.launch(cfg) }.context("CUDA write_kv_rows kernel")?;
        drop(guards);
        Ok(())
    }
}
