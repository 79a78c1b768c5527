//! The ops over several sequences of one pass ([`Backend::rope_seqs`],
//! [`Backend::attention_seqs`]) on [`Cuda`]: the `rope` and `attention` kernels launched once
//! per sequence on its rows of the pass's buffers, addressed in place (views at the
//! sequence's first float), instead of the trait's default, which copies each sequence's
//! rows out and back (five launches more per sequence and layer). The kernels and their
//! arguments are those of one sequence alone; only the pointers move. The RoPE frequencies
//! and the sinks are uploaded once per call, not once per sequence.
//!
//! [`Backend::rope_seqs`]: crate::backend::Backend::rope_seqs
//! [`Backend::attention_seqs`]: crate::backend::Backend::attention_seqs

use anyhow::{bail, Context, Result};
use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::kernels::{ATT_MAX_DIM, ATT_WARPS};
use super::{Cuda, CudaBuf};
use crate::backend::cpu::attn_seqs::spans_error;
use crate::backend::{AttnShape, SeqSpan};

/// Whether [`Backend::rope_seqs`] and [`Backend::attention_seqs`] on the GPU take the views
/// of this file (else the trait's copies): false until `tests_seqs.rs`'s
/// `several_sequences_equal_each_alone` has passed on a GPU (written without one).
///
/// [`Backend::rope_seqs`]: crate::backend::Backend::rope_seqs
/// [`Backend::attention_seqs`]: crate::backend::Backend::attention_seqs
pub(super) const VIEWS_VERIFIED: bool = false;

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
        let f = self.k()?.get("rope");
        let fd = self.put(inv_freq)?;
        for sp in spans.iter().filter(|sp| sp.rows > 0) {
            let (r32, w32, h32, p32, il) = (
                sp.rows as i32,
                width as i32,
                half as i32,
                sp.pos0 as i32,
                interleaved as i32,
            );
            let mut rows = x.data.slice_mut(sp.r0 * width..(sp.r0 + sp.rows) * width);
            let n = sp.rows * width / 2;
            let cfg = LaunchConfig {
                grid_dim: ((n as u64).div_ceil(THREADS as u64).max(1) as u32, 1, 1),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut b = self.stream.launch_builder(f);
            b.arg(&mut rows)
                .arg(&r32)
                .arg(&w32)
                .arg(&h32)
                .arg(&p32)
                .arg(&fd)
                .arg(&il)
                .arg(&scale);
            // SAFETY: one thread per pair of the span's rows × width / 2 pairs, inside the
            // view (checked above); fd holds `half` floats.
            unsafe { b.launch(cfg) }.context("CUDA rope kernel")?;
        }
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
        let f = self.k()?.get("attention");
        let sinks_dev = sinks.map(|sk| self.put(sk)).transpose()?;
        let null: u64 = 0;
        let (nh32, nkv32, hd32) = (nh as i32, nkv as i32, hd as i32);
        let window = s.window.map_or(0, |w| w.max(1)) as i32;
        let cap = s.softcap.unwrap_or(0.0);
        for (&(k, v), sp) in kv.iter().zip(spans).filter(|(_, sp)| sp.rows > 0) {
            let rows = sp.r0 * qd..(sp.r0 + sp.rows) * qd;
            let qs = q.data.slice(rows.clone());
            let mut os = out.data.slice_mut(rows);
            let p32 = sp.pos0 as i32;
            let cfg = LaunchConfig {
                grid_dim: ((sp.rows * nh) as u32, 1, 1),
                block_dim: (32 * ATT_WARPS, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut b = self.stream.launch_builder(f);
            b.arg(&qs)
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
            b.arg(&mut os);
            // SAFETY: the views hold the span's rows × nh × hd floats, k and v (pos0 + rows)
            // × nkv × hd at least, sinks nh floats or a null pointer (checked above).
            unsafe { b.launch(cfg) }.context("CUDA attention kernel")?;
        }
        Ok(())
    }
}
