//! Compute devices: what a forward pass computes with, behind one trait ([`Backend`]).
//!
//! - `cpu/`: the CPU backend ([`cpu::Cpu`]): matvec and batched matmul over encoded weights,
//!   attention over a KV cache, multi-head latent attention, the KDA delta rule, norms, RoPE,
//!   GELU, softmax, at the best SIMD level the CPU runs, split over a rayon pool by output rows
//!   so the thread count never changes a result. Its state is the arithmetic of the matrix
//!   products ([`cpu::Numerics`]) and the pool a pass runs on.
//! - `cuda/`: the CUDA backend ([`cuda::Cuda`]): the driver, NVRTC and cuBLAS loaded at run
//!   time (no CUDA needed to build or to run without a GPU), kernels from committed `.cu`
//!   sources compiled at first use; products over the stored encodings, norms, RoPE, the
//!   GLUs, GQA and latent attention, the KDA scan and every other [`Op`]. Every family runs
//!   on it with `--device cuda` or `auto` (every kernel has passed its tests on an H100:
//!   [`cuda::UNVERIFIED`] is empty) (ARCHITECTURE.md, "Adding a compute device", says what
//!   is done and what is not).
//!
//! The model code above (`models/layers/`, the decoder skeleton) owns the wiring of a layer
//! (which projection feeds which op); a backend owns the buffers and the ops. Routing stays
//! on the host: the expert store needs the chosen expert ids to read them.

pub mod cpu;
pub mod cuda;

use anyhow::Result;

pub use cpu::attn::AttnShape;
pub use cpu::attn_seqs::SeqSpan;
pub use cpu::mla::MlaShape;

/// The gated activations of the feed-forward blocks, applied as `gate ← act(gate) · up`
/// element-wise ([`Backend::glu`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Glu {
    /// `silu(g) · u` (Llama, Qwen, DeepSeek, Mixtral; transformers' `ACT2FN["silu"]`).
    Swiglu,
    /// `gelu_tanh(g) · u` (Gemma 3, `gelu_pytorch_tanh`).
    GegluTanh,
    /// Kimi K3's SiTU: `β·tanh(g/β)·sigmoid(g) · λ·tanh(u/λ)` (`u` as is when `λ ≤ 0`;
    /// llama.cpp `kimi-k3.cpp`, `kimi_k3_situ`).
    Situ { beta: f32, linear_beta: f32 },
}

/// The key and value up-projections of multi-head latent attention: llama.cpp's split
/// `attn_k_b` / `attn_v_b`, or Hugging Face's joint `kv_b_proj` (`v` `None`).
pub struct MlaProj<W> {
    pub k: W,
    pub v: Option<W>,
}

/// A compute device. Buffers are the device's ([`Backend::Buf`], f32 rows, row-major) and
/// weights are views of their stored encoding where the device reads them
/// ([`Backend::Weights`]: host bytes for the CPU, device memory for a GPU). Every op works on
/// `rows` stacked rows of one pass, whatever sequences they belong to; the ops that read
/// positions take one sequence's rows and its cache slot (RoPE, attention, the KDA scan) or
/// every sequence's rows with each one's positions and slots ([`Backend::rope_seqs`],
/// [`Backend::attention_seqs`]: one call per layer for a batch).
///
/// Contract (what the tests hold every backend to): a row's result does not depend on the
/// other rows of its call nor on the device's parallelism, so a batch of sequences equals
/// each sequence alone bit for bit on one backend (`tests/batch_pass.rs`). Across backends,
/// results agree within the tolerance the device's issue states.
///
/// Errors: every op may fail on a device (an allocation, a launch, a transfer); the CPU's
/// never do.
pub trait Backend: Send + Sync {
    /// An f32 activation buffer in the device's memory.
    type Buf: Send;
    /// A weight matrix (`rows × cols`) in its stored encoding, where the device reads it.
    type Weights<'a>: Copy
    where
        Self: 'a;

    /// The device in words, for the placement line (`cpu (avx512, 16 threads)`).
    fn name(&self) -> String;
    /// Runs one forward pass `f` with the backend's state entered (the CPU: its numerics,
    /// on its pool).
    fn run_pass<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R;

    /// A zeroed buffer of `len` floats.
    fn zeros(&self, len: usize) -> Result<Self::Buf>;
    /// `host` copied to the device.
    fn upload(&self, host: &[f32]) -> Result<Self::Buf>;
    /// `buf` copied to the host into `out` (`out.len()` floats).
    fn download(&self, buf: &Self::Buf, out: &mut [f32]) -> Result<()>;
    /// `buf` (`len` floats) as a host vector, consuming it: a copy on a GPU, the buffer
    /// itself on the CPU (an LM head's `rows × vocab` logits are not copied again there).
    /// Errors: as [`Backend::download`], or `len` not the buffer's length.
    fn download_owned(&self, buf: Self::Buf, len: usize) -> Result<Vec<f32>> {
        let mut out = vec![0f32; len];
        self.download(&buf, &mut out)?;
        Ok(out)
    }
    /// `buf` (`len` floats) to the host as one vector per span of `spans`, consuming it: a
    /// pass's logits, one vector per sequence. The spans are ranges of floats in order, the
    /// first starting at 0, each the next's start, the last ending at most at `len` (the
    /// floats past it are dropped). The default downloads the whole buffer
    /// ([`Backend::download_owned`]), keeps it as the first span's vector and copies the
    /// others out of it in parallel ([`split_spans`]); a GPU copies through a page-locked
    /// staging buffer straight into each span's vector.
    /// Errors: as [`Backend::download_owned`]; spans that do not tile `0..end` (`end ≤ len`).
    fn download_spans(
        &self,
        buf: Self::Buf,
        len: usize,
        spans: &[std::ops::Range<usize>],
    ) -> Result<Vec<Vec<f32>>> {
        check_spans(spans, len)?;
        split_spans(self.download_owned(buf, len)?, spans)
    }

    /// `y = x Wᵀ` for `rows` rows of `x` (`rows × w.cols`) into `y` (`rows × w.rows`).
    fn matmul(
        &self,
        w: Self::Weights<'_>,
        x: &Self::Buf,
        rows: usize,
        y: &mut Self::Buf,
    ) -> Result<()>;
    /// [`Backend::matmul`] over a weight matrix given by its host bytes `w` (a view into a
    /// unit of the weight store). `keep`: the bytes stay at this address, unchanged, as long
    /// as the backend lives (a resident unit), so a device may copy them once and reuse that
    /// copy at every later call; otherwise (a streamed unit, a routed expert) they are valid
    /// for this call only and a device copies them for it. The CPU reads them in place.
    fn matmul_host(
        &self,
        w: &cpu::Matrix<'_>,
        keep: bool,
        x: &Self::Buf,
        rows: usize,
        y: &mut Self::Buf,
    ) -> Result<()>;
    /// [`Backend::matmul_host`] of several matrices (`(view, keep)`) over the same `rows`
    /// rows of `x`: `ys[i] = x ws[i]ᵀ`, the values of separate calls. The CPU takes one
    /// parallel region for all of them in a one-row pass (a decode step).
    fn matmul_host_many(
        &self,
        ws: &[(&cpu::Matrix<'_>, bool)],
        x: &Self::Buf,
        rows: usize,
        ys: &mut [&mut Self::Buf],
    ) -> Result<()> {
        for (&(w, keep), y) in ws.iter().zip(ys.iter_mut()) {
            self.matmul_host(w, keep, x, rows, y)?;
        }
        Ok(())
    }
    /// [`Backend::matmul_host`] of several matrices (`(view, keep)`), each over its own
    /// input: `ys[i] = xs[i] ws[i]ᵀ` for `rows` rows of every `xs[i]`, the values of separate
    /// calls. The CPU takes one parallel region for all of them in a one-row pass (a decode
    /// step's expert down projections).
    fn matmul_host_each(
        &self,
        ws: &[(&cpu::Matrix<'_>, bool)],
        xs: &[&Self::Buf],
        rows: usize,
        ys: &mut [&mut Self::Buf],
    ) -> Result<()> {
        for ((&(w, keep), x), y) in ws.iter().zip(xs).zip(ys.iter_mut()) {
            self.matmul_host(w, keep, x, rows, y)?;
        }
        Ok(())
    }
    /// `len` floats of `src` from float `src_at` copied into `dst` from float `dst_at` (a
    /// sequence's rows out of a batch, new keys and values into a cache slot).
    fn copy(
        &self,
        src: &Self::Buf,
        src_at: usize,
        dst: &mut Self::Buf,
        dst_at: usize,
        len: usize,
    ) -> Result<()>;
    /// Rows `ids` of an embedding table (`vocab × hidden`) decoded into `out`
    /// (`ids.len() × hidden`).
    fn embed_rows(&self, table: Self::Weights<'_>, ids: &[u32], out: &mut Self::Buf) -> Result<()>;
    /// RMSNorm of every `w.len()`-wide row of `x` into `out` (`x / √(mean x² + eps) · w`).
    fn rms_norm_rows(&self, x: &Self::Buf, w: &[f32], eps: f32, out: &mut Self::Buf) -> Result<()>;
    /// RoPE at positions `pos0 ..` over the `head_dim` slices of `rows` rows of `x`, NeoX
    /// halves or interleaved pairs, then × `scale`.
    #[allow(clippy::too_many_arguments)]
    fn rope(
        &self,
        x: &mut Self::Buf,
        rows: usize,
        head_dim: usize,
        pos0: usize,
        inv_freq: &[f32],
        interleaved: bool,
        scale: f32,
    ) -> Result<()>;
    /// Causal grouped-query attention of one sequence's `q` rows (scaled, at positions
    /// `pos0 ..`) over its layer's keys and values (`k`, `v`: position-major, positions
    /// `0 .. pos0 + rows`), with optional sinks (one logit per head) into `out`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        s: &AttnShape,
        q: &Self::Buf,
        k: &Self::Buf,
        v: &Self::Buf,
        pos0: usize,
        sinks: Option<&[f32]>,
        out: &mut Self::Buf,
    ) -> Result<()>;
    /// [`Backend::rope`] of each sequence's rows of `x` (`width` floats a row, every
    /// sequence's rows stacked) at that sequence's positions (`spans`: `x`'s rows in order,
    /// [`cpu::attn_seqs::spans_error`]; so one span is all of `x`). The default ropes a single
    /// span in place and copies each of several out and back ([`rope_seqs_by_copies`]); a
    /// backend that can address rows of a buffer overrides it.
    #[allow(clippy::too_many_arguments)]
    fn rope_seqs(
        &self,
        x: &mut Self::Buf,
        width: usize,
        spans: &[SeqSpan],
        head_dim: usize,
        inv_freq: &[f32],
        interleaved: bool,
        scale: f32,
    ) -> Result<()> {
        rope_seqs_by_copies(
            self,
            x,
            width,
            spans,
            head_dim,
            inv_freq,
            interleaved,
            scale,
        )
    }
    /// [`Backend::attention`] of several sequences in one call: sequence `i`'s query rows
    /// (`spans[i]` of `q`, every sequence's rows stacked; the spans are `q`'s rows in order,
    /// [`cpu::attn_seqs::spans_error`]) over its keys and values `kv[i]` into the same rows
    /// of `out`; each sequence's values as alone. The default calls
    /// `attention` per sequence (rows copied out and back unless one span covers all); the
    /// CPU's runs the short ones as the tasks of one parallel region
    /// ([`cpu::attn_seqs::attention_seqs`]).
    ///
    /// Errors: `kv` and `spans` of different lengths; the device's.
    fn attention_seqs(
        &self,
        s: &AttnShape,
        q: &Self::Buf,
        kv: &[(&Self::Buf, &Self::Buf)],
        spans: &[SeqSpan],
        sinks: Option<&[f32]>,
        out: &mut Self::Buf,
    ) -> Result<()> {
        attention_seqs_by_copies(self, s, q, kv, spans, sinks, out)
    }
    /// Each sequence's new keys and values into its cache slots: rows `spans[i]` of `k` and
    /// `v` (`rows × width` floats each, every sequence's rows stacked; the spans are their rows
    /// in order, [`cpu::attn_seqs::spans_error`]) into `slots[i]` (keys, values:
    /// position-major rows of `width`) from position `spans[i].pos0`. The default copies per
    /// sequence ([`write_kv_seqs_by_copies`]); a backend where each copy is a launch overrides
    /// it with one.
    ///
    /// Errors: `slots` and `spans` of different lengths; on CUDA also a slot shorter than
    /// `(pos0 + rows) × width` floats or the spans not `k`'s rows
    /// ([`write_kv_seqs_error`]); the default leaves those to [`Backend::copy`]'s errors.
    fn write_kv_seqs(
        &self,
        k: &Self::Buf,
        v: &Self::Buf,
        width: usize,
        spans: &[SeqSpan],
        slots: &mut [(&mut Self::Buf, &mut Self::Buf)],
    ) -> Result<()> {
        write_kv_seqs_by_copies(self, k, v, width, spans, slots)
    }
    /// Multi-head latent attention of one sequence's `q` rows over its latent rows
    /// (`latent`: `rank + rope` floats per position `0 .. pos0 + rows`, more may follow) into
    /// `out`, the up-projections `proj` given by their host bytes (`keep`: resident, as
    /// [`Backend::matmul_host`]) ([`Op::MlaAttention`]).
    #[allow(clippy::too_many_arguments)]
    fn mla_attention(
        &self,
        s: &MlaShape,
        q: &Self::Buf,
        proj: MlaProj<&cpu::Matrix<'_>>,
        keep: bool,
        latent: &Self::Buf,
        pos0: usize,
        out: &mut Self::Buf,
    ) -> Result<()>;
    /// The KDA delta rule of one sequence's rows, token by token, over its recurrent state
    /// (`heads × dk × dv` floats of `state` from float `state_at`, updated): `q`, `k`, `g` are
    /// `rows × heads × dk`, `v` and `out` `rows × heads × dv`, `beta` `rows × heads`
    /// ([`Op::KdaScan`]).
    #[allow(clippy::too_many_arguments)]
    fn kda_scan(
        &self,
        heads: usize,
        dk: usize,
        dv: usize,
        qkvg: [&Self::Buf; 4],
        beta: &Self::Buf,
        state: &mut Self::Buf,
        state_at: usize,
        out: &mut Self::Buf,
    ) -> Result<()>;
    /// KDA's short causal convolutions then SiLU over one sequence's `q`, `k`, `v` rows (each
    /// `rows × dim`, in place), as one `3·dim`-channel convolution over `[q | k | v]` rows:
    /// `taps` holds each channel's `conv` taps (`3·dim × conv`), the first
    /// `(conv − 1) × 3·dim` floats of `state` the inputs before these rows, updated
    /// (`cpu::kda::short_conv_silu`; [`Op::KdaConv`]).
    fn kda_conv(
        &self,
        qkv: [&mut Self::Buf; 3],
        rows: usize,
        taps: &[f32],
        conv: usize,
        state: &mut Self::Buf,
    ) -> Result<()>;
    /// Each `head_dim`-wide slice of `x` divided by `√(Σx² + eps)`, then times `scale` (KDA's
    /// q/k L2 norms; [`Op::L2Norm`]).
    fn l2norm_heads(&self, x: &mut Self::Buf, head_dim: usize, eps: f32, scale: f32) -> Result<()>;
    /// KDA's log decay of every `dt_bias.len()`-wide row of `g` in place
    /// (`cpu::kda::decay`: `−exp(A_log_h) · softplus(g + dt_bias)`, or
    /// `lower_bound · sigmoid(exp(A_log_h) · (g + dt_bias))`; [`Op::KdaDecay`]).
    fn kda_decay(
        &self,
        g: &mut Self::Buf,
        a_log: &[f32],
        dt_bias: &[f32],
        lower_bound: Option<f32>,
    ) -> Result<()>;
    /// `x ← σ(x)`, element-wise ([`Op::Sigmoid`]).
    fn sigmoid(&self, x: &mut Self::Buf) -> Result<()>;
    /// `x ← x · σ(g)`, element-wise (an output gate; [`Op::Sigmoid`]).
    fn mul_sigmoid(&self, x: &mut Self::Buf, g: &Self::Buf) -> Result<()>;
    /// KDA's gated output norm: each `w.len()`-wide head of `o` RMS-normed with `w`, times
    /// `σ` of the same elements of `gate` ([`Op::GatedNorm`]).
    fn gated_head_norm(
        &self,
        o: &mut Self::Buf,
        gate: &Self::Buf,
        w: &[f32],
        eps: f32,
    ) -> Result<()>;
    /// RMSNorm in place of the first `w.len()` floats of every `width`-wide row of `x` (MLA's
    /// latent, ahead of its rotary key; [`Op::NormHead`]).
    fn rms_norm_head(&self, x: &mut Self::Buf, width: usize, w: &[f32], eps: f32) -> Result<()>;
    /// RoPE at positions `pos0 ..` of the last `inv_freq.len() · 2` floats of every
    /// `width`-wide slice of the `rows` rows of `x` (MLA's rotary parts: the NeoX halves, or
    /// interleaved pairs first regrouped into halves as DeepSeek's `rope_interleave`), then ×
    /// `scale` (`cpu::mla::rope_slice`; [`Op::RopeTail`]).
    #[allow(clippy::too_many_arguments)]
    fn rope_tail(
        &self,
        x: &mut Self::Buf,
        rows: usize,
        width: usize,
        pos0: usize,
        inv_freq: &[f32],
        interleaved: bool,
        scale: f32,
    ) -> Result<()>;
    /// Kimi K3's attention-residual mix of the rows of `cur` with the checkpoints `bank`
    /// (each as `cur`) into `out`, row by row with the score weights `w` (`cpu::blocks::res_mix`;
    /// [`Op::ResMix`]).
    fn res_mix(
        &self,
        bank: &[&Self::Buf],
        cur: &Self::Buf,
        w: &[f32],
        eps: f32,
        out: &mut Self::Buf,
    ) -> Result<()>;
    /// `x ← x + b` for every `b.len()`-wide row of `x` (a bias; [`Op::Bias`]).
    fn add_rows(&self, x: &mut Self::Buf, b: &[f32]) -> Result<()>;
    /// `y = x W` for `rows` rows of `x` (`rows × w.rows`) into `y` (`rows × w.cols`): a weight
    /// stored input-major (GPT-OSS's Hugging Face experts), given by its host bytes as
    /// [`Backend::matmul_host`] ([`Op::MatmulT`]).
    fn matmul_host_t(
        &self,
        w: &cpu::Matrix<'_>,
        keep: bool,
        x: &Self::Buf,
        rows: usize,
        y: &mut Self::Buf,
    ) -> Result<()>;
    /// GPT-OSS's clamped SwiGLU into `out`: with `up` `None`, of the interleaved (gate, up)
    /// pairs of `gate_up` (`out` half as long), else of `gate_up` (the gates) and `up`
    /// element-wise: `(clamp(u, ±limit) + 1) · g' · σ(α g')` with `g' = min(g, limit)`
    /// ([`Op::SwigluOai`]).
    fn swiglu_oai(
        &self,
        gate_up: &Self::Buf,
        up: Option<&Self::Buf>,
        alpha: f32,
        limit: f32,
        out: &mut Self::Buf,
    ) -> Result<()>;
    /// `gate ← act(gate) · up`, element-wise ([`Glu`]).
    fn glu(&self, act: Glu, gate: &mut Self::Buf, up: &Self::Buf) -> Result<()>;
    /// `x ← cap · tanh(x / cap)`, element-wise (Gemma's logit soft-capping).
    fn softcap(&self, x: &mut Self::Buf, cap: f32) -> Result<()>;
    /// `x ← x + y`, element-wise (a residual).
    fn add(&self, x: &mut Self::Buf, y: &Self::Buf) -> Result<()>;
    /// The `width`-wide rows `rows` of `x`, in order, into `out` (an expert group's input).
    fn gather_rows(
        &self,
        x: &Self::Buf,
        width: usize,
        rows: &[usize],
        out: &mut Self::Buf,
    ) -> Result<()>;
    /// `out[rows[i]] += weights[i] · y[i]` for the `width`-wide rows of `y` (an expert
    /// group's weighted output back into the batch).
    fn scatter_add_rows(
        &self,
        y: &Self::Buf,
        width: usize,
        rows: &[usize],
        weights: &[f32],
        out: &mut Self::Buf,
    ) -> Result<()>;
}

/// The ops beyond the core set every backend has (products, norms, RoPE, GQA attention,
/// the GLUs, residuals, row gathers): what a family's layers need besides it
/// (`models::decoder::Blocks::needs`) and what a backend may lack ([`cuda::MISSING`]) or
/// have unverified ([`cuda::UNVERIFIED`]). A family needing an op its device lacks is refused
/// on that device by name, one needing an unverified op is kept off it by `--device auto`,
/// in one place (`models::device::choose_device`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// [`Backend::mla_attention`] over latent cache slots.
    MlaAttention,
    /// [`Backend::rope_tail`].
    RopeTail,
    /// [`Backend::rms_norm_head`].
    NormHead,
    /// [`Backend::kda_scan`] over recurrent state slots.
    KdaScan,
    /// [`Backend::kda_conv`].
    KdaConv,
    /// [`Backend::l2norm_heads`].
    L2Norm,
    /// [`Backend::kda_decay`].
    KdaDecay,
    /// [`Backend::sigmoid`], [`Backend::mul_sigmoid`].
    Sigmoid,
    /// [`Backend::gated_head_norm`].
    GatedNorm,
    /// [`Backend::res_mix`].
    ResMix,
    /// [`Backend::add_rows`].
    Bias,
    /// [`Backend::matmul_host_t`].
    MatmulT,
    /// [`Backend::swiglu_oai`].
    SwigluOai,
}

impl Op {
    /// The op's name in messages: its [`Backend`] method.
    pub fn name(self) -> &'static str {
        match self {
            Op::MlaAttention => "mla_attention",
            Op::RopeTail => "rope_tail",
            Op::NormHead => "rms_norm_head",
            Op::KdaScan => "kda_scan",
            Op::KdaConv => "kda_conv",
            Op::L2Norm => "l2norm_heads",
            Op::KdaDecay => "kda_decay",
            Op::Sigmoid => "sigmoid",
            Op::GatedNorm => "gated_head_norm",
            Op::ResMix => "res_mix",
            Op::Bias => "add_rows",
            Op::MatmulT => "matmul_host_t",
            Op::SwigluOai => "swiglu_oai",
        }
    }
}

/// The devices `--device` names: the CPU, a CUDA GPU by ordinal, or the best found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceKind {
    #[default]
    Cpu,
    Cuda(usize),
    Auto,
}

impl std::str::FromStr for DeviceKind {
    type Err = String;

    /// `cpu`, `cuda`, `cuda:N` or `auto`.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda(0)),
            "auto" => Ok(Self::Auto),
            _ => match s.strip_prefix("cuda:").map(str::parse) {
                Some(Ok(n)) => Ok(Self::Cuda(n)),
                _ => Err(format!(
                    "unknown device {s:?}: expected cpu, cuda, cuda:N or auto"
                )),
            },
        }
    }
}

/// [`Backend::rope_seqs`] through the one-sequence ops: a single span (all of `x`, by the
/// spans' contract) roped in place, each of several copied out, roped and copied back (the
/// trait's default).
///
/// Errors: the device's.
#[allow(clippy::too_many_arguments)]
pub fn rope_seqs_by_copies<B: Backend + ?Sized>(
    dev: &B,
    x: &mut B::Buf,
    width: usize,
    spans: &[SeqSpan],
    head_dim: usize,
    inv_freq: &[f32],
    interleaved: bool,
    scale: f32,
) -> Result<()> {
    if let [sp] = spans {
        if sp.r0 == 0 {
            return dev.rope(x, sp.rows, head_dim, sp.pos0, inv_freq, interleaved, scale);
        }
    }
    for sp in spans {
        let len = sp.rows * width;
        let mut t = dev.zeros(len)?;
        dev.copy(x, sp.r0 * width, &mut t, 0, len)?;
        dev.rope(
            &mut t,
            sp.rows,
            head_dim,
            sp.pos0,
            inv_freq,
            interleaved,
            scale,
        )?;
        dev.copy(&t, 0, x, sp.r0 * width, len)?;
    }
    Ok(())
}

/// [`Backend::attention_seqs`] through [`Backend::attention`], one sequence at a time (its
/// rows copied out and back unless it is the only one, which is then all of `q` by the
/// spans' contract; the trait's default).
///
/// Errors: `kv` and `spans` of different lengths; the device's.
pub fn attention_seqs_by_copies<B: Backend + ?Sized>(
    dev: &B,
    s: &AttnShape,
    q: &B::Buf,
    kv: &[(&B::Buf, &B::Buf)],
    spans: &[SeqSpan],
    sinks: Option<&[f32]>,
    out: &mut B::Buf,
) -> Result<()> {
    if kv.len() != spans.len() {
        anyhow::bail!(
            "attention_seqs: {} key/value slots for {} sequences",
            kv.len(),
            spans.len()
        );
    }
    if let ([(k, v)], [sp]) = (kv, spans) {
        if sp.r0 == 0 {
            return dev.attention(s, q, k, v, sp.pos0, sinks, out);
        }
    }
    let qd = s.n_heads * s.head_dim;
    for (&(k, v), sp) in kv.iter().zip(spans) {
        let len = sp.rows * qd;
        let mut qs = dev.zeros(len)?;
        dev.copy(q, sp.r0 * qd, &mut qs, 0, len)?;
        let mut a = dev.zeros(len)?;
        dev.attention(s, &qs, k, v, sp.pos0, sinks, &mut a)?;
        dev.copy(&a, 0, out, sp.r0 * qd, len)?;
    }
    Ok(())
}

/// Checks [`Backend::write_kv_seqs`]'s arguments: `k` and `v` of `len_k`, `len_v` floats,
/// the slots' lengths `slot_lens` (keys, values). Errors: as `write_kv_seqs`.
pub fn write_kv_seqs_error(
    len_k: usize,
    len_v: usize,
    width: usize,
    spans: &[SeqSpan],
    slot_lens: &[(usize, usize)],
) -> Result<()> {
    if slot_lens.len() != spans.len() {
        anyhow::bail!(
            "write_kv_seqs: {} key/value slots for {} sequences",
            slot_lens.len(),
            spans.len()
        );
    }
    if width == 0 || len_k != len_v || !len_k.is_multiple_of(width) {
        anyhow::bail!("write_kv_seqs: keys {len_k} and values {len_v} floats in rows of {width}");
    }
    if let Some(e) = cpu::attn_seqs::spans_error(spans, len_k / width) {
        anyhow::bail!("write_kv_seqs: {e}");
    }
    for (&(kl, vl), sp) in slot_lens.iter().zip(spans) {
        let need = (sp.pos0 + sp.rows) * width;
        if kl < need || vl < need {
            anyhow::bail!(
                "write_kv_seqs: slots of {kl} and {vl} floats, {need} needed for {} positions",
                sp.pos0 + sp.rows
            );
        }
    }
    Ok(())
}

/// [`Backend::write_kv_seqs`] by two [`Backend::copy`]s per sequence (the trait's default).
///
/// Errors: as `write_kv_seqs`.
pub fn write_kv_seqs_by_copies<B: Backend + ?Sized>(
    dev: &B,
    k: &B::Buf,
    v: &B::Buf,
    width: usize,
    spans: &[SeqSpan],
    slots: &mut [(&mut B::Buf, &mut B::Buf)],
) -> Result<()> {
    if slots.len() != spans.len() {
        anyhow::bail!(
            "write_kv_seqs: {} key/value slots for {} sequences",
            slots.len(),
            spans.len()
        );
    }
    for ((kc, vc), sp) in slots.iter_mut().zip(spans) {
        let (at, len) = (sp.r0 * width, sp.rows * width);
        dev.copy(k, at, kc, sp.pos0 * width, len)?;
        dev.copy(v, at, vc, sp.pos0 * width, len)?;
    }
    Ok(())
}

/// Errors unless `spans` tile `0..end` in order for some `end ≤ len` (see
/// [`Backend::download_spans`]); no span is fine.
pub fn check_spans(spans: &[std::ops::Range<usize>], len: usize) -> Result<()> {
    let mut at = 0;
    for r in spans {
        if r.start != at || r.end < r.start || r.end > len {
            anyhow::bail!("download_spans: span {r:?} after {at} of {len} floats");
        }
        at = r.end;
    }
    Ok(())
}

/// `all` cut into one vector per span ([`Backend::download_spans`]' default, checked spans):
/// the first span keeps `all`'s allocation (truncated), the others are copied out of it in
/// parallel (a step of 8 sequences over a 262k vocabulary moves 7 MiB).
pub fn split_spans(mut all: Vec<f32>, spans: &[std::ops::Range<usize>]) -> Result<Vec<Vec<f32>>> {
    use rayon::prelude::*;
    let Some(first) = spans.first() else {
        return Ok(Vec::new());
    };
    let rest: Vec<Vec<f32>> = spans[1..]
        .par_iter()
        .map(|r| all[r.clone()].to_vec())
        .collect();
    all.truncate(first.end);
    let mut outs = Vec::with_capacity(spans.len());
    outs.push(all);
    outs.extend(rest);
    Ok(outs)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default `write_kv_seqs` puts each sequence's rows at its positions of its slots and
    /// leaves the rest; mismatched arguments are refused by name.
    #[test]
    fn write_kv_seqs_puts_each_sequences_rows_at_its_positions() {
        let dev = cpu::Cpu::default();
        let spans = [
            SeqSpan {
                r0: 0,
                rows: 1,
                pos0: 2,
            },
            SeqSpan {
                r0: 1,
                rows: 2,
                pos0: 0,
            },
        ];
        // 3 rows of width 2: keys 1..6, values -1..-6
        let k: Vec<f32> = (1..=6).map(|i| i as f32).collect();
        let v: Vec<f32> = k.iter().map(|x| -x).collect();
        let mut slots: Vec<(Vec<f32>, Vec<f32>)> = vec![(vec![9.0; 8], vec![9.0; 8]); 2];
        let mut s: Vec<(&mut Vec<f32>, &mut Vec<f32>)> =
            slots.iter_mut().map(|(a, b)| (a, b)).collect();
        dev.write_kv_seqs(&k, &v, 2, &spans, &mut s).unwrap();
        assert_eq!(slots[0].0, [9.0, 9.0, 9.0, 9.0, 1.0, 2.0, 9.0, 9.0]);
        assert_eq!(slots[1].1, [-3.0, -4.0, -5.0, -6.0, 9.0, 9.0, 9.0, 9.0]);
        let mut s: Vec<(&mut Vec<f32>, &mut Vec<f32>)> =
            slots.iter_mut().take(1).map(|(a, b)| (a, b)).collect();
        let err = dev.write_kv_seqs(&k, &v, 2, &spans, &mut s).unwrap_err();
        assert_eq!(
            err.to_string(),
            "write_kv_seqs: 1 key/value slots for 2 sequences"
        );
        let err = write_kv_seqs_error(6, 6, 2, &spans, &[(8, 8), (8, 3)]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "write_kv_seqs: slots of 8 and 3 floats, 4 needed for 2 positions"
        );
        let err = write_kv_seqs_error(6, 4, 2, &spans, &[(8, 8), (8, 8)]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "write_kv_seqs: keys 6 and values 4 floats in rows of 2"
        );
    }

    /// The default `download_spans` cuts the buffer at the spans (the floats past the last
    /// dropped) and refuses spans that do not tile a prefix, by name.
    #[test]
    fn download_spans_cuts_a_buffer_into_each_sequences_vector() {
        let dev = cpu::Cpu::default();
        let all: Vec<f32> = (0..10).map(|i| i as f32).collect();
        let got = dev
            .download_spans(all.clone(), 10, &[0..2, 2..3, 3..7])
            .unwrap();
        assert_eq!(got, [vec![0.0, 1.0], vec![2.0], vec![3.0, 4.0, 5.0, 6.0]]);
        assert!(dev.download_spans(all.clone(), 10, &[]).unwrap().is_empty());
        let err = dev
            .download_spans(all.clone(), 10, &[0..2, 3..4])
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "download_spans: span 3..4 after 2 of 10 floats"
        );
        let err = dev
            .download_spans(all.clone(), 10, &[0..11, 11..11])
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "download_spans: span 0..11 after 0 of 10 floats"
        );
        let err = dev.download_spans(all, 9, &[0..2, 2..2]).unwrap_err();
        assert_eq!(err.to_string(), "download_owned: 10 floats, 9 expected");
    }

    #[test]
    fn device_names_parse_and_bad_ones_are_refused_by_name() {
        assert_eq!("cpu".parse(), Ok(DeviceKind::Cpu));
        assert_eq!("cuda".parse(), Ok(DeviceKind::Cuda(0)));
        assert_eq!("cuda:3".parse(), Ok(DeviceKind::Cuda(3)));
        assert_eq!("auto".parse(), Ok(DeviceKind::Auto));
        assert_eq!(
            "gpu".parse::<DeviceKind>(),
            Err("unknown device \"gpu\": expected cpu, cuda, cuda:N or auto".into())
        );
        assert!("cuda:x".parse::<DeviceKind>().is_err());
    }
}
