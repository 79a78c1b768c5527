//! The speculative decoding flags of `run`, `bench`, `serve` and `chat` (`--lookup`,
//! `--draft-model`, `--draft mtp`, `--draft-max`, `--draft-min`, `--draft-fixed`) and the [`Speculator`] they
//! build. A draft model is loaded before the target and kept resident; its bytes (weights, KV
//! cache, activations) are taken out of the RAM budget before the target is placed
//! ([`target_budget`], [`explain_budget`]).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use crate::engine::draft::{LookupDraft, ModelDraft};
use crate::engine::draft_mtp::MtpDraft;
use crate::engine::{SamplerConfig, Session, SpecConfig, Speculator};
use crate::load::open_any;
use crate::models::{BudgetTooSmall, LoadOptions, Model};
use crate::store::plan::size_text;
use crate::store::WeightStore;
use crate::tokenizer::ModelTokenizer;

/// The help heading of [`SpecArgs`].
const HEADING: &str = "Speculative decoding";

/// Speculative decoding flags (`run`, `serve`, `chat`, `bench`).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SpecArgs {
    /// Draft by prompt lookup (what followed the last tokens earlier on)
    #[arg(help_heading = HEADING, long, conflicts_with = "draft_model", group = "draft_source")]
    pub lookup: bool,
    /// Draft with this model (same vocabulary, resident, within --ram-budget)
    #[arg(help_heading = HEADING, long, value_name = "MODEL", conflicts_with = "draft", group = "draft_source")]
    pub draft_model: Option<PathBuf>,
    /// Draft with a part of the model: mtp, its multi-token-prediction layer
    #[arg(value_name = "KIND", help_heading = HEADING, long, value_enum, hide_possible_values = true, conflicts_with = "lookup",
          group = "draft_source")]
    pub draft: Option<DraftKind>,
    /// Most tokens drafted per verification pass
    #[arg(value_name = "N", help_heading = HEADING, long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64),
          requires = "draft_source")]
    pub draft_max: u32,
    /// Fewest drafted tokens worth a verification pass
    #[arg(value_name = "N", help_heading = HEADING, long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64),
          requires = "draft_source")]
    pub draft_min: u32,
    /// Always draft --draft-max tokens (no adaptive length, no plain steps)
    #[arg(help_heading = HEADING, long, requires = "draft_source")]
    pub draft_fixed: bool,
}

/// The draft sources of `--draft`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraftKind {
    /// The model's multi-token-prediction layer.
    Mtp,
}

impl SpecArgs {
    /// Whether speculation was asked for.
    pub fn enabled(&self) -> bool {
        self.lookup || self.draft_model.is_some() || self.draft.is_some()
    }

    /// Whether the model is to be loaded with its multi-token-prediction layer (`--draft mtp`,
    /// [`LoadOptions::mtp`]).
    pub fn mtp(&self) -> bool {
        self.draft == Some(DraftKind::Mtp)
    }

    /// The speculation settings.
    ///
    /// Errors: `--draft-min` above `--draft-max`.
    pub fn config(&self) -> Result<SpecConfig> {
        if self.draft_min > self.draft_max {
            bail!(
                "--draft-min {} is above --draft-max {}",
                self.draft_min,
                self.draft_max
            );
        }
        Ok(SpecConfig {
            draft_max: self.draft_max as usize,
            draft_min: self.draft_min as usize,
            adaptive: !self.draft_fixed,
        })
    }

    /// The draft model of `--draft-model`, loaded whole (resident: every weight in RAM) with
    /// a KV cache of `n_ctx` tokens and batches of `n_batch`, BEFORE the target, so that its
    /// bytes can be taken out of the RAM budget ([`target_budget`]); `None` without
    /// `--draft-model`.
    ///
    /// Errors: the flags conflict ([`SpecArgs::config`]); the draft model does not open or
    /// load (the error names it).
    pub fn load_draft(
        &self,
        n_ctx: usize,
        n_batch: usize,
        direct_io: bool,
    ) -> Result<Option<LoadedDraft>> {
        self.config()?;
        let Some(path) = self.draft_model.as_deref() else {
            return Ok(None);
        };
        let label = format!("--draft-model {}", path.display());
        let path = super::model_path(Some(path)).map_err(|e| e.context(label.clone()))?;
        let opened = open_any(path.as_deref()).map_err(|e| e.context(label.clone()))?;
        let tok = opened.tokenizer().map_err(|e| e.context(label.clone()))?;
        let opts = LoadOptions {
            ram_budget: None,
            n_ctx,
            n_batch,
            direct_io,
            ..Default::default()
        };
        let (model, store) = opened
            .load_weights(&opts)
            .map_err(|e| e.context(label.clone()))?;
        let p = model.placement();
        let (weight_bytes, kv_bytes, scratch_bytes) = (
            (p.resident_bytes + p.stream_buffer_bytes) as u64,
            p.kv_bytes as u64,
            p.scratch_bytes as u64,
        );
        Ok(Some(LoadedDraft {
            label,
            model,
            store,
            tok,
            weight_bytes,
            kv_bytes,
            scratch_bytes,
            n_ctx,
        }))
    }

    /// The speculator these flags ask for over `target` (`None` without `--lookup`,
    /// `--draft-model` or `--draft`), with the draft model `draft` ([`SpecArgs::load_draft`]) when
    /// `--draft-model` is given. The draft model gets a cache of the target's size, must
    /// share the target tokenizer `tok`'s vocabulary, and samples with `sampling`.
    ///
    /// Errors: the flags conflict ([`SpecArgs::config`]); the target keeps a recurrent state
    /// (Kimi Linear); `--draft mtp` for a model without a multi-token-prediction layer; the draft model keeps a recurrent state, or its vocabulary differs
    /// (size, or the first token whose text differs, named).
    pub fn speculator(
        &self,
        target: &Session,
        tok: &ModelTokenizer,
        sampling: &SamplerConfig,
        draft: Option<LoadedDraft>,
    ) -> Result<Option<Speculator>> {
        if !self.enabled() {
            return Ok(None);
        }
        let cfg = self.config()?;
        crate::engine::speculative::check_rollback(&target.cache)?;
        if self.lookup {
            return Ok(Some(Speculator::new(Box::new(LookupDraft::default()), cfg)));
        }
        if self.mtp() {
            let d = MtpDraft::new(target, sampling)?;
            return Ok(Some(Speculator::new(Box::new(d), cfg)));
        }
        let d = draft.context("--draft-model given but the draft model was not loaded")?;
        let label = d.label;
        let (dtok, model, store) = (d.tok, d.model, d.store);
        let (dv, tv) = (model.vocab_size(), target.model.vocab_size());
        if dv != tv {
            bail!("{label}: its vocabulary has {dv} tokens but the model's has {tv}; a draft model needs the same vocabulary");
        }
        if let Some(id) = (0..tv as u32).find(|&i| dtok.token_text(i) != tok.token_text(i)) {
            bail!(
                "{label}: token {id} is '{}' there but '{}' in the model; a draft model needs the same vocabulary",
                dtok.token_text(id).escape_debug(),
                tok.token_text(id).escape_debug()
            );
        }
        let bytes = d.weight_bytes + d.kv_bytes + d.scratch_bytes;
        let session = Session::new(model, store, target.cache.n_ctx, target.n_batch);
        let draft = ModelDraft::new(session, sampling).map_err(|e| e.context(label))?;
        let mut sp = Speculator::new(Box::new(draft), cfg);
        sp.stats.draft_bytes = bytes;
        Ok(Some(sp))
    }
}

/// A draft model loaded before the target ([`SpecArgs::load_draft`]), with what it holds in
/// RAM: its share of the budget.
pub struct LoadedDraft {
    /// `--draft-model PATH`, for messages.
    pub label: String,
    model: Box<dyn Model>,
    store: WeightStore,
    tok: ModelTokenizer,
    /// Bytes of its weights (all resident).
    pub weight_bytes: u64,
    /// Bytes of its KV cache for `n_ctx` tokens.
    pub kv_bytes: u64,
    /// Bytes of its activations.
    pub scratch_bytes: u64,
    /// Tokens its KV cache holds.
    pub n_ctx: usize,
}

impl LoadedDraft {
    /// Its share of the RAM budget in bytes: weights, KV cache and activations.
    pub fn bytes(&self) -> u64 {
        self.weight_bytes + self.kv_bytes + self.scratch_bytes
    }

    /// `--draft-model PATH takes 12.3 MiB (weights 10.0 MiB, KV cache for 4096 tokens 2.0 MiB,
    /// activations 0.3 MiB)`.
    pub fn describe(&self) -> String {
        format!(
            "{} takes {} (weights {}, KV cache for {} tokens {}, activations {})",
            self.label,
            size_text(self.bytes()),
            size_text(self.weight_bytes),
            self.n_ctx,
            size_text(self.kv_bytes),
            size_text(self.scratch_bytes)
        )
    }
}

/// How a budget is named in messages: `--ram-budget 64.0 MiB` when the flag gave it, else
/// `the default RAM budget of 64.0 MiB`.
fn budget_name(budget: u64, flag: bool) -> String {
    match flag {
        true => format!("--ram-budget {}", size_text(budget)),
        false => format!("the default RAM budget of {}", size_text(budget)),
    }
}

/// The RAM budget left for the target once `draft` takes its share of `budget` (`None`, no
/// budget: everything resident, nothing to share); `flag` says whether `--ram-budget` gave it.
///
/// Errors: the draft model alone takes the whole budget or more, as `--ram-budget 8.0 MiB
/// cannot hold the draft model: --draft-model PATH takes 9.1 MiB (weights …, KV cache for N
/// tokens …, activations …), and the model needs room of its own`.
pub fn target_budget(
    budget: Option<u64>,
    flag: bool,
    draft: Option<&LoadedDraft>,
) -> Result<Option<u64>> {
    match (budget, draft) {
        (Some(b), Some(d)) if d.bytes() >= b => bail!(
            "{} cannot hold the draft model: {}, and the model needs room of its own",
            budget_name(b, flag),
            d.describe()
        ),
        (Some(b), Some(d)) => Ok(Some(b - d.bytes())),
        (b, _) => Ok(b),
    }
}

/// `e`, the target's load error under the budget [`target_budget`] left, reworded when it is
/// a [`BudgetTooSmall`] and a draft model took a share: `--ram-budget 64.0 MiB is too small
/// for the model and its draft model: --draft-model PATH takes … , leaving 20.0 MiB, and the
/// model needs at least 30.0 MiB for PARTS`. Any other error is returned as it is.
pub fn explain_budget(
    e: anyhow::Error,
    budget: Option<u64>,
    flag: bool,
    draft: Option<&LoadedDraft>,
) -> anyhow::Error {
    let (Some(b), Some(d)) = (budget, draft) else {
        return e;
    };
    let Some(t) = e.chain().find_map(|c| c.downcast_ref::<BudgetTooSmall>()) else {
        return e;
    };
    anyhow::anyhow!(
        "{} is too small for the model and its draft model: {}, leaving {}, and the model needs at least {} for {}",
        budget_name(b, flag),
        d.describe(),
        size_text(t.budget),
        size_text(t.need),
        t.parts
    )
}
