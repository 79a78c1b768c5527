//! The decoder-only transformer every family is: embeddings, a stack of layers, a final norm
//! and the LM head, with [`Model`] implemented once for all of them by [`Decoder`].
//!
//! A pass runs several sequences at once ([`Model::forward_batch`]): their rows are stacked,
//! and a family's spine gets them as [`Seqs`] (row-wise work over all rows, positions and
//! cache slots per sequence).
//!
//! A family supplies its [`Blocks`]: what one layer's *spine* (its resident-or-streamed unit:
//! attention, norms, the dense MLP or the router and shared experts) computes, how a MoE
//! layer routes, and how its routed experts compute. The skeleton owns what they share:
//! placement (the [`Placement`] report, the embedding table and LM head units), the layer loop,
//! and the order in which streamed reads are announced to the store:
//!
//! - a pass first plans its embedding rows and layer 0's spine unit;
//! - a dense layer plans what comes after it (the next spine unit, or the LM head) before it
//!   computes; a MoE layer decides it before its routed experts are planned, with the expert
//!   store's next step (the prefetch of the next MoE layer's guessed experts, or a read-ahead:
//!   `moe::next_experts`), as one `store::NextReads` that the store queues right after the
//!   experts (`WeightStore::plan_next`), so the experts' reads go first;
//! - families whose [`Blocks::plan_whole_pass`] is true (dense models streamed layer by layer,
//!   Gemma 3) announce every unit of the pass at its start instead.
//!
//! Every family's blocks run through the backend: the layer loop is `decoder_dev.rs`'s, on
//! the CPU or a GPU alike, calling [`Blocks::spine_on`], [`Blocks::experts_on`] and the
//! optional [`Blocks::tail_on`] and [`Blocks::finish_hidden_on`]. A family names the ops its
//! layers need beyond the core set ([`Blocks::needs`]); a device lacking one is refused for
//! it, and `auto` keeps it off a device whose kernels for one are unverified
//! (`device::choose_device`).
//!
//! MoE output is `x += (Σ routed + shared)`: the routed experts' weighted sum, then the shared
//! experts' output when the spine wrote one, then the residual, in that order, as transformers
//! adds them.

use anyhow::Result;

pub use super::mtp_layer::{ChunkedMatrix, MtpLayer};

use super::batch::{SeqPass, Seqs};
use super::device::{open_cuda, Device};
use super::embed_head::{Embedding, Head};
use super::moe::{RouterRef, Routers};
use super::moe_dev::ExpertStepOn;
use super::{run_batch, KvCache, Model, Placement};
use crate::backend::cpu::Cpu;
use crate::backend::cuda::Cuda;
use crate::backend::{Backend, DeviceKind, Op};
use crate::store::{UnitBytes, WeightStore};

/// What a layer's spine leaves on the device ([`Blocks::spine_on`]) for the rest of the
/// layer, reused across layers.
pub struct ScratchOn<D: Device> {
    /// The post-attention normed rows (`n × hidden`), the routed experts' input (`n ×
    /// routed_width` for a latent MoE: [`Blocks::routed_width`]).
    pub xn: D::Buf,
    /// A MoE layer's router logits brought to the host (`n × n_experts`, bias added) for
    /// routing.
    pub router: Vec<f32>,
    /// A MoE layer's shared experts' output (`n × hidden`), when the family has shared
    /// experts (the skeleton takes it after the routed experts).
    pub shared: Option<D::Buf>,
    /// Residual-stream checkpoints a family banks during one pass (Kimi K3's attention
    /// residuals: one `n × hidden` copy per block); empty at the start of every pass.
    pub bank: Vec<D::Buf>,
}

/// A MoE layer's router as a family describes it (the skeleton adds the spine unit).
pub struct RouterParts<'a> {
    /// The router matrix (`n_experts × hidden`) inside the layer's spine unit.
    pub router: super::loading::MatRef,
    /// The post-attention RMSNorm weights (`hidden`) the router's input is normed with.
    pub norm: &'a [f32],
    /// That norm's epsilon.
    pub eps: f32,
    /// The router bias (`n_experts`; GPT-OSS), if any.
    pub bias: Option<&'a [f32]>,
}

/// What the KV cache holds per token and layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheShape {
    /// Keys and values, `kv_dim` floats each ([`KvCache::new`]).
    Kv { kv_dim: usize },
    /// One compressed latent row of `width` floats (multi-head latent attention,
    /// [`KvCache::new_latent`]).
    Latent { width: usize },
}

/// The sizes the skeleton needs, taken from a family's config.
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    /// Hidden size (floats per token in the residual stream).
    pub hidden_size: usize,
    /// Vocabulary size (rows of the LM head).
    pub vocab_size: usize,
    /// Longest context the model was trained for, in tokens (`max_position_embeddings`).
    pub context_length: usize,
    /// Decoder layers (`num_hidden_layers`).
    pub num_layers: usize,
    /// Epsilon of the final RMSNorm.
    pub final_norm_eps: f32,
    /// What the cache holds.
    pub cache: CacheShape,
}

impl Dims {
    /// The sizes of a decoder with a plain KV cache of `kv_dim` floats per token and layer
    /// for keys and as many for values.
    pub fn with_kv(
        hidden_size: usize,
        vocab_size: usize,
        context_length: usize,
        num_layers: usize,
        final_norm_eps: f32,
        kv_dim: usize,
    ) -> Self {
        Self {
            hidden_size,
            vocab_size,
            context_length,
            num_layers,
            final_norm_eps,
            cache: CacheShape::Kv { kv_dim },
        }
    }
}

/// What differs between families: one layer's spine, routing and routed experts.
pub trait Blocks: Send + Sync {
    /// One layer's weights (views into its spine unit) and resident vectors (norms, biases).
    type Layer: Send + Sync;
    /// Whether a pass announces all its streamed reads at its start (dense families) rather
    /// than layer by layer. Default: false.
    fn plan_whole_pass(&self) -> bool {
        false
    }
    /// Scales the embedded rows `x` (`n × hidden`) in place (Gemma: by √hidden). Default:
    /// nothing.
    fn scale_embeddings(&self, _x: &mut [f32]) {}
    /// Whether layer `w` ends in routed experts (its spine writes router logits).
    fn is_moe(&self, w: &Self::Layer) -> bool;
    /// The family's name and the ops its layers call beyond the core set every backend has
    /// ([`Op`]): a device lacking one of them is refused for the family, by name, and `auto`
    /// does not pick one whose kernel for it is unverified (`device::choose_device`).
    fn needs(&self) -> (&'static str, &'static [Op]);
    /// Layer `l`'s spine on the device `dev` over its unit's bytes `u` (`keep`: the unit is
    /// resident, so a device may keep its copy), for the rows `x` (`rows × hidden`, on the
    /// device) of the sequences `seqs` (each at its own positions, with its own cache slots
    /// on the device): attention with its residual, then either the dense feed-forward added
    /// to `x`, or (MoE) the routed experts' input in `s.xn`, the router logits on the host in
    /// `s.router` and, with shared experts, their output in `s.shared`. Row-wise steps run
    /// over all rows at once; only the steps that read positions or state run per sequence
    /// ([`Seqs::each`]).
    ///
    /// Errors: the device's.
    #[allow(clippy::too_many_arguments)]
    fn spine_on<D: Device>(
        &self,
        dev: &D,
        l: usize,
        w: &Self::Layer,
        u: &UnitBytes,
        keep: bool,
        seqs: &mut Seqs<'_>,
        x: &mut D::Buf,
        s: &mut ScratchOn<D>,
    ) -> Result<()>;
    /// Runs the routed experts of one MoE layer on `dev` ([`ExpertStepOn`]).
    ///
    /// Errors: an expert could not be read (the message names the file and expert); the
    /// device's. The default (a family without routed experts) refuses.
    fn experts_on<D: Device>(&self, _dev: &D, step: ExpertStepOn<'_, D>) -> Result<()> {
        anyhow::bail!("layer {}: this family has no routed experts", step.layer)
    }
    /// Layer `l`'s router (`None` for a dense layer), as the prefetcher applies it.
    fn router<'a>(&'a self, l: usize, w: &'a Self::Layer) -> Option<RouterParts<'a>>;
    /// Routed experts per MoE layer (columns of the router logits).
    fn n_experts(&self) -> usize;
    /// One token's routing in MoE layer `l` from its router logits (`n_experts`, bias
    /// added): the chosen (expert id, weight) pairs in ascending id order.
    fn route(&self, l: usize, logits: &[f32]) -> Vec<(usize, f32)>;
    /// Adjusts the final logits in place (Gemma: soft-capping). Default: nothing.
    fn finish_logits(&self, _logits: &mut [f32]) {}
    /// Floats of recurrent state layer `l` keeps in the cache ([`KvCache::with_state`]);
    /// 0 (the default) for an attention layer, which keeps per-position rows instead.
    fn recurrent_state(&self, _l: usize) -> usize {
        0
    }
    /// Width of the routed experts' rows when they run in a space other than the residual
    /// stream (Kimi K3's latent MoE): the spine then leaves `n × width` rows in `s.xn`, the
    /// experts write `n × width`, and [`Blocks::tail_on`] maps that back to `n × hidden`.
    /// `None` (the default): experts read and write `hidden`-wide rows.
    fn routed_width(&self) -> Option<usize> {
        None
    }
    /// The unit (id in the store) holding what layer `w` applies to its routed experts'
    /// output ([`Blocks::tail_on`]); planned right after the experts, before the next layer's
    /// spine. `None` (the default): no tail. A family with tails must keep
    /// [`Blocks::plan_whole_pass`] false (the whole-pass plan does not list them).
    fn tail_unit(&self, _w: &Self::Layer) -> Option<usize> {
        None
    }
    /// Layer `l`'s tail on `dev` over its unit's bytes `u` (`keep`: resident): the routed
    /// experts' summed output `routed` (`n × routed_width`) mapped to a new `n × hidden`
    /// buffer. Called only when [`Blocks::tail_unit`] is `Some`; the default refuses.
    ///
    /// Errors: the device's.
    #[allow(clippy::too_many_arguments)]
    fn tail_on<D: Device>(
        &self,
        _dev: &D,
        l: usize,
        _w: &Self::Layer,
        _u: &UnitBytes,
        _keep: bool,
        _routed: &D::Buf,
        _n: usize,
    ) -> Result<D::Buf> {
        anyhow::bail!("layer {l}: this family has no routed tail")
    }
    /// Adjusts the residual stream `x` (`n × hidden`, on `dev`) after the last layer, before
    /// the final norm (Kimi K3's last attention-residual mix over `s.bank`). Default: nothing.
    ///
    /// Errors: the device's.
    fn finish_hidden_on<D: Device>(
        &self,
        _dev: &D,
        _x: &mut D::Buf,
        _n: usize,
        _s: &mut ScratchOn<D>,
    ) -> Result<()> {
        Ok(())
    }
}

/// A loaded decoder of any family: its [`Blocks`], the spine units of its layers, the
/// embedding table, final norm and LM head, and where the weights live.
pub struct Decoder<B: Blocks> {
    /// The family's part (its config is there).
    pub blocks: B,
    pub(super) dims: Dims,
    /// Per layer: the spine unit id and the layer's weights.
    pub(super) layers: Vec<(usize, B::Layer)>,
    pub(super) embedding: Embedding,
    pub(super) head: Head,
    /// Final RMSNorm weights (`hidden`).
    pub(super) final_norm: Vec<f32>,
    placement: Placement,
    /// The multi-token-prediction layer, when loaded ([`Decoder::with_mtp`]).
    pub(super) mtp: Option<MtpLayer<B::Layer>>,
    /// The backend every forward pass computes on, with its numerics (the arithmetic of
    /// every matrix product).
    pub(super) cpu: Cpu,
    /// The GPU every forward pass computes on instead, when `--device` picked one
    /// ([`Model::set_device`]; only for families whose ops it has).
    cuda: Option<Box<Cuda>>,
}

impl<B: Blocks> Decoder<B> {
    /// Assembles a decoder from its parts: `layers` pairs each layer's spine unit id (in the
    /// store built alongside) with its weights.
    pub fn new(
        blocks: B,
        dims: Dims,
        layers: Vec<(usize, B::Layer)>,
        embedding: Embedding,
        head: Head,
        final_norm: Vec<f32>,
        placement: Placement,
    ) -> Self {
        Self {
            blocks,
            dims,
            layers,
            embedding,
            head,
            final_norm,
            placement,
            mtp: None,
            cpu: Cpu::default(),
            cuda: None,
        }
    }

    /// [`Decoder::new`] over what [`super::budget::place`] returned: the decoder and its
    /// store.
    pub(super) fn placed(
        blocks: B,
        dims: Dims,
        layers: Vec<(usize, B::Layer)>,
        final_norm: Vec<f32>,
        placed: super::budget::Placed,
    ) -> (Self, WeightStore) {
        let m = Self::new(
            blocks,
            dims,
            layers,
            placed.embedding,
            placed.head,
            final_norm,
            placed.placement,
        );
        (m, placed.store)
    }

    /// Queues what comes after layer `l`: the next spine unit, or the LM head chunks.
    pub(super) fn plan_after(&self, store: &mut WeightStore, l: usize) {
        match self.layers.get(l + 1) {
            Some((u, _)) => store.plan([*u]),
            None => self.head.plan(store),
        }
    }
}

impl<B: Blocks> Routers for Decoder<B> {
    fn n_layers(&self) -> usize {
        self.layers.len()
    }

    fn router(&self, l: usize) -> Option<RouterRef<'_>> {
        let (unit, w) = self.layers.get(l)?;
        let r = self.blocks.router(l, w)?;
        Some(RouterRef {
            unit: *unit,
            router: r.router,
            norm: r.norm,
            eps: r.eps,
            bias: r.bias,
        })
    }

    fn route(&self, l: usize, logits: &[f32]) -> Vec<(usize, f32)> {
        self.blocks.route(l, logits)
    }
}

impl<B: Blocks> Model for Decoder<B> {
    fn vocab_size(&self) -> usize {
        self.dims.vocab_size
    }

    fn context_length(&self) -> usize {
        self.dims.context_length
    }

    fn new_cache(&self, n_ctx: usize) -> KvCache {
        let (l, n) = (self.dims.num_layers, n_ctx.min(self.dims.context_length));
        // no memory until a pass writes: the CPU grows the host vectors, a GPU makes its slots
        let cache = match self.dims.cache {
            CacheShape::Kv { kv_dim } => KvCache::new(l, n, kv_dim),
            CacheShape::Latent { width } => KvCache::new_latent(l, n, width),
        };
        let state: Vec<usize> = (0..l).map(|i| self.blocks.recurrent_state(i)).collect();
        let mut cache = match state.iter().any(|&f| f > 0) {
            true => cache.with_state(&state),
            false => cache,
        };
        cache.hidden.on = self.mtp.is_some();
        cache
    }

    fn mtp(&self) -> Option<&dyn super::Mtp> {
        self.mtp.as_ref().map(|_| self as &dyn super::Mtp)
    }

    fn placement(&self) -> &Placement {
        &self.placement
    }

    fn numerics(&self) -> crate::backend::cpu::Numerics {
        self.cpu.numerics
    }

    /// Every numerics applies to every family: the kernels choose per matrix type.
    fn set_numerics(&mut self, n: crate::backend::cpu::Numerics) -> Result<()> {
        if let (Some(c), crate::backend::cpu::Numerics::Q8) = (&self.cuda, n) {
            anyhow::bail!(
                "--numerics {n} is CPU arithmetic; {} computes in f32",
                c.name()
            );
        }
        self.cpu = Cpu::new(n);
        self.placement.numerics = n;
        Ok(())
    }

    /// The device `kind` names ([`open_cuda`]; `auto` takes a GPU only for a family whose
    /// ops it has, all verified on a GPU), said at the end of the placement summary (`; device
    /// cpu`, `; device cpu (cuda: OPS not yet verified on a GPU)`, `; device cuda:0 (NVIDIA
    /// H200, 140 GiB)`).
    fn set_device(&mut self, kind: DeviceKind) -> Result<()> {
        let (family, needs) = self.blocks.needs();
        let (cuda, name) = open_cuda(kind, family, needs, self.cpu.numerics)?;
        self.cuda = cuda;
        self.placement.kv_on_device = self.cuda.is_some();
        self.placement.device_bytes = self.cuda.as_ref().map_or(0, |c| c.total_bytes());
        self.placement.summary = format!("{}; device {name}", self.placement.summary);
        Ok(())
    }

    fn forward_batch(
        &self,
        store: &mut WeightStore,
        batch: &mut [SeqPass<'_>],
    ) -> Result<Vec<Vec<f32>>> {
        let d = self.dims.hidden_size;
        let tokens: Vec<u32> = batch
            .iter()
            .flat_map(|p| p.tokens.iter().copied())
            .collect();
        let plan = |s: &mut WeightStore| {
            self.embedding.plan(s, &tokens, d);
            if self.blocks.plan_whole_pass() {
                s.plan(self.layers.iter().map(|(u, _)| *u));
                self.head.plan(s);
            } else {
                s.plan([self.layers[0].0]);
            }
        };
        let vocab = self.dims.vocab_size;
        match &self.cuda {
            Some(c) => c.run_pass(|| {
                run_batch(store, batch, vocab, plan, |s, b| {
                    self.forward_on(c.as_ref(), s, b, &tokens)
                })
            }),
            None => self.cpu.run_pass(|| {
                run_batch(store, batch, vocab, plan, |s, b| {
                    self.forward_on(&self.cpu, s, b, &tokens)
                })
            }),
        }
    }
}
