//! The interface every architecture implements ([`Model`]) and the options and reports of
//! loading one ([`LoadOptions`], [`Placement`]).

use crate::backend::cpu::Numerics;
use crate::backend::DeviceKind;
use crate::store::{ExpertStoreOptions, WeightStore};

use super::batch::SeqPass;
use super::KvCache;

/// How to load a model's weights.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Bytes of RAM for resident weights, KV cache, activations and I/O buffers together;
    /// `None` keeps every weight resident.
    pub ram_budget: Option<u64>,
    /// KV cache capacity in tokens.
    pub n_ctx: usize,
    /// Largest number of tokens one forward pass takes (prompt batch size).
    pub n_batch: usize,
    /// Use `O_DIRECT` reads where the filesystem allows them.
    pub direct_io: bool,
    /// How routed experts are read and cached when they do not all fit the budget.
    pub experts: ExpertStoreOptions,
    /// Load the checkpoint's multi-token-prediction layer (`num_nextn_predict_layers`, for
    /// `--draft mtp`) when it ships one; its weights, KV cache and the hidden rows it reads
    /// then come out of the budget. Off: those layers are ignored (and noted).
    pub mtp: bool,
    /// The arithmetic of the model's matrix products ([`Numerics::Exact`] unless asked;
    /// `Numerics::Q8` is lossy).
    pub numerics: Numerics,
    /// The device the forward passes compute on ([`Model::set_device`]; the CPU unless
    /// asked).
    pub device: DeviceKind,
}

impl Default for LoadOptions {
    /// Everything resident, a 4096-token cache, batches of 512, `O_DIRECT`, default expert
    /// store, exact numerics.
    fn default() -> Self {
        Self {
            ram_budget: None,
            n_ctx: 4096,
            n_batch: 512,
            direct_io: true,
            experts: ExpertStoreOptions::default(),
            mtp: false,
            numerics: Numerics::Exact,
            device: DeviceKind::Cpu,
        }
    }
}

/// The error of a RAM budget too small for what a model needs whatever it streams (KV cache,
/// activations, stream and I/O buffers). Shown as `--ram-budget 1.0 MiB is too small: PARTS need
/// at least 2.5 MiB` (sizes by [`crate::store::plan::size_text`]); [`BudgetTooSmall::under_limit`] rewords it for a default budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BudgetTooSmall {
    /// The budget in bytes.
    pub budget: u64,
    /// Bytes needed at least.
    pub need: u64,
    /// What the need is made of, in words with sizes (e.g. `the KV cache for 64 tokens (0.5
    /// MiB), activations (1.0 MiB) and stream buffers (8.0 MiB)`).
    pub parts: String,
}

impl std::fmt::Display for BudgetTooSmall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (budget, need) = sizes(self.budget, self.need);
        write!(
            f,
            "--ram-budget {budget} is too small: {} need at least {need}",
            self.parts
        )
    }
}

impl std::error::Error for BudgetTooSmall {}

impl BudgetTooSmall {
    /// `e` reworded when it is a [`BudgetTooSmall`] for the default budget under `limit` (no
    /// `--ram-budget` given): the message speaks of the limit, as `the memory limit of 64.0
    /// MiB (cgroup) is too small for this model: it needs at least 80.0 MiB for PARTS, and the
    /// default budget within that limit is 32.0 MiB`. Any other error is returned as it is.
    pub fn under_limit(e: anyhow::Error, limit: &crate::store::plan::MemoryLimit) -> anyhow::Error {
        let Some(t) = e.chain().find_map(|c| c.downcast_ref::<BudgetTooSmall>()) else {
            return e;
        };
        let (budget, need) = sizes(t.budget, t.need);
        anyhow::anyhow!(
            "{} is too small for this model: it needs at least {need} for {}, and the default budget within that limit is {budget}",
            limit.describe(),
            t.parts,
        )
    }
}

/// A budget and a need for messages ([`crate::store::plan::size_text`]), in bytes when the two
/// would read the same (a budget a few bytes short).
fn sizes(budget: u64, need: u64) -> (String, String) {
    use crate::store::plan::size_text;
    match (size_text(budget), size_text(need)) {
        (b, n) if b == n => (format!("{budget} bytes"), format!("{need} bytes")),
        bn => bn,
    }
}

/// Which positions' logits a forward pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token's (`vocab` floats).
    Last,
    /// Every token's (`n × vocab` floats, token-major).
    All,
}

/// What `deltafin run --stats` and `inspect` report about placement.
#[derive(Clone, Debug, Default)]
pub struct Placement {
    /// Bytes of weights kept in RAM.
    pub resident_bytes: usize,
    /// Bytes of weights read from disk on every forward pass (routed experts that are not
    /// resident included, as if every one were used).
    pub streamed_bytes: usize,
    /// Of those, the bytes that are not routed experts (layers' dense weights, the LM head,
    /// the embedding): what every pass reads whatever its routing, and what the rows of one
    /// batch share.
    pub spine_streamed_bytes: usize,
    /// Bytes of stream buffers.
    pub stream_buffer_bytes: usize,
    /// Bytes of KV cache.
    pub kv_bytes: usize,
    /// Bytes reserved for activations.
    pub scratch_bytes: usize,
    /// Units kept resident / total units, as text (e.g. `"12/18 layers, head streamed"`).
    pub summary: String,
    /// The arithmetic of the model's matrix products (set with the model's numerics).
    pub numerics: Numerics,
    /// Whether the KV cache lives in a GPU's memory (`--device` took one): each cache's
    /// slots there are allocated for its whole context at their first use.
    pub kv_on_device: bool,
    /// That GPU's memory in bytes (0 on the CPU, or when the driver did not say).
    pub device_bytes: u64,
}

/// Checks a forward pass's input before any weight is read: at least one token, room in the
/// KV cache, every id inside the vocabulary of `vocab` tokens.
fn check_forward(tokens: &[u32], cache: &KvCache, vocab: usize) -> anyhow::Result<()> {
    let (n, pos0) = (tokens.len(), cache.len);
    if n == 0 {
        anyhow::bail!("forward pass over zero tokens");
    }
    if pos0 + n > cache.n_ctx {
        anyhow::bail!(
            "context full: {pos0} + {n} tokens exceed the KV cache of {} tokens",
            cache.n_ctx
        );
    }
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
        anyhow::bail!("token id {bad} is outside the vocabulary of {vocab} tokens");
    }
    Ok(())
}

/// Ends a forward pass over `n` tokens: on success the tokens join the KV cache; on failure
/// the reads still queued for the pass are dropped so the next pass starts clean.
fn finish_pass(
    store: &mut WeightStore,
    cache: &mut KvCache,
    n: usize,
    r: anyhow::Result<Vec<f32>>,
) -> anyhow::Result<Vec<f32>> {
    match r {
        Ok(_) => cache.len += n,
        Err(_) => store.reset(),
    }
    r
}

/// One forward pass over `tokens` as every architecture runs it: checks the input
/// (`check_forward`, against a vocabulary of `vocab` tokens) before any weight is read, lets
/// `plan` announce the pass's first streamed reads, runs `body`, and ends the pass
/// (`finish_pass`: the tokens join the cache on success, queued reads are dropped on error).
///
/// Errors: those of `check_forward` and of `body`.
pub fn run_pass(
    store: &mut WeightStore,
    cache: &mut KvCache,
    tokens: &[u32],
    vocab: usize,
    plan: impl FnOnce(&mut WeightStore),
    body: impl FnOnce(&mut WeightStore, &mut KvCache) -> anyhow::Result<Vec<f32>>,
) -> anyhow::Result<Vec<f32>> {
    check_forward(tokens, cache, vocab)?;
    plan(store);
    let r = body(store, cache);
    finish_pass(store, cache, tokens.len(), r)
}

/// [`run_pass`] over several sequences at once ([`SeqPass`]): every sequence's input is
/// checked before any weight is read, `plan` announces the pass's first streamed reads,
/// `body` runs, and on success each sequence's tokens join its cache (on failure the queued
/// reads are dropped and no cache grows).
///
/// Errors: no sequence; those of `check_forward` (for the first sequence that fails) and of
/// `body`.
pub fn run_batch(
    store: &mut WeightStore,
    batch: &mut [SeqPass<'_>],
    vocab: usize,
    plan: impl FnOnce(&mut WeightStore),
    body: impl FnOnce(&mut WeightStore, &mut [SeqPass<'_>]) -> anyhow::Result<Vec<Vec<f32>>>,
) -> anyhow::Result<Vec<Vec<f32>>> {
    if batch.is_empty() {
        anyhow::bail!("forward pass over zero sequences");
    }
    for p in batch.iter() {
        check_forward(p.tokens, p.cache, vocab)?;
    }
    plan(store);
    let r = body(store, batch);
    match &r {
        Ok(_) => batch.iter_mut().for_each(|p| p.cache.len += p.tokens.len()),
        Err(_) => store.reset(),
    }
    r
}

/// A loaded model: the forward pass of one architecture.
pub trait Model: Send {
    /// Vocabulary size (rows of the LM head).
    fn vocab_size(&self) -> usize;
    /// Longest context the model was trained for, in tokens.
    fn context_length(&self) -> usize;
    /// A KV cache with room for `n_ctx` tokens.
    fn new_cache(&self, n_ctx: usize) -> KvCache;
    /// Runs every sequence of `batch` through the model in one pass: sequence `i`'s tokens
    /// at positions `batch[i].cache.len ..` over its own cache (its slot), appended to it;
    /// returns one logits vector per sequence, in order (see [`Logits`]). Row-wise work (the
    /// projections, the feed-forward, the LM head) runs once over all the sequences' rows and
    /// a MoE layer reads the union of their experts once; each sequence's logits are those
    /// of the sequence run alone, bit for bit.
    ///
    /// Errors: no sequence; a sequence with no token, a full cache or a token outside the
    /// vocabulary (before any weight is read); a streamed weight could not be read (the
    /// message names the file). On error no cache grows.
    fn forward_batch(
        &self,
        store: &mut WeightStore,
        batch: &mut [SeqPass<'_>],
    ) -> anyhow::Result<Vec<Vec<f32>>>;
    /// Runs `tokens` (positions `cache.len ..`) through the model, appends them to the cache and
    /// returns logits (see [`Logits`]): [`Model::forward_batch`] over one sequence.
    ///
    /// Errors: a streamed weight could not be read (the message names the file), or the cache
    /// is full.
    fn forward(
        &self,
        store: &mut WeightStore,
        cache: &mut KvCache,
        tokens: &[u32],
        logits: Logits,
    ) -> anyhow::Result<Vec<f32>> {
        let mut b = [SeqPass::new(cache, tokens, logits)];
        let mut out = self.forward_batch(store, &mut b)?;
        Ok(out.pop().expect("one logits vector per sequence"))
    }
    /// Where the weights live.
    fn placement(&self) -> &Placement;
    /// The multi-token-prediction module, when the model was loaded with one
    /// ([`LoadOptions::mtp`]); `None` (the default) for every other model.
    fn mtp(&self) -> Option<&dyn Mtp> {
        None
    }
    /// The arithmetic of the model's matrix products (default: exact).
    fn numerics(&self) -> Numerics {
        Numerics::Exact
    }
    /// Sets the device every later forward pass computes on (`cpu`, `cuda:N`, or `auto`:
    /// the first CUDA GPU when the model runs on one with kernels verified on a GPU, else the
    /// CPU), named at the end of [`Placement::summary`].
    ///
    /// Errors: a device the model cannot run on (the default runs on the CPU only), a GPU
    /// that does not open (the message says what is missing).
    fn set_device(&mut self, kind: DeviceKind) -> anyhow::Result<()> {
        match kind {
            DeviceKind::Cpu | DeviceKind::Auto => Ok(()),
            DeviceKind::Cuda(n) => anyhow::bail!("this model does not run on cuda:{n}"),
        }
    }
    /// Sets the arithmetic of the model's matrix products for every later forward pass.
    ///
    /// Errors: the model cannot compute in `n` (the default accepts only
    /// [`Numerics::Exact`]).
    fn set_numerics(&mut self, n: Numerics) -> anyhow::Result<()> {
        match n {
            Numerics::Exact => Ok(()),
            _ => anyhow::bail!("this model does not support --numerics {n}"),
        }
    }
}

/// What one multi-token-prediction pass returns.
#[derive(Clone, Debug, Default)]
pub struct MtpOut {
    /// Logits for the token two places after each input row's position (`vocab`, or
    /// `n × vocab` with [`Logits::All`]).
    pub logits: Vec<f32>,
    /// The module's own hidden rows (`n × hidden`, before its head norm): what the next
    /// chained draft step takes in place of the target's.
    pub hidden: Vec<f32>,
}

/// A multi-token-prediction module (DeepSeek-V3 technical report, sec. 2.2; one depth): for
/// position `i`, `h'_i = eh_proj([enorm(embed(t_{i+1})); hnorm(h_i)])` (embedding first, then
/// hidden, each `hidden` wide), one full decoder block over `h'` with its own KV cache (its
/// attention sees its own earlier positions), then its head norm and an LM head (its own
/// `shared_head.head`, else the model's) give logits for `t_{i+2}`. `h_i` is the target's
/// final hidden state at `i` before the final norm ([`super::kv_cache::HiddenRows`]).
pub trait Mtp {
    /// Floats per hidden row.
    fn hidden_size(&self) -> usize;
    /// An empty cache of `n_ctx` positions for the module's block.
    fn new_mtp_cache(&self, n_ctx: usize) -> KvCache;
    /// One pass over `n` rows at positions `cache.len ..`: `hidden` (`n × hidden`, row `j`
    /// the hidden state at position `cache.len + j`, the target's or a previous pass's
    /// [`MtpOut::hidden`]) with `tokens` (`n`, row `j` the token after that position).
    /// Appends the rows to `cache`. Routed experts are read through `store` like the
    /// target's.
    ///
    /// Errors: zero rows, a full cache, a token outside the vocabulary, `hidden` of another
    /// size; a streamed weight that could not be read.
    fn forward_mtp(
        &self,
        store: &mut WeightStore,
        cache: &mut KvCache,
        hidden: &[f32],
        tokens: &[u32],
        logits: Logits,
    ) -> anyhow::Result<MtpOut>;
}
