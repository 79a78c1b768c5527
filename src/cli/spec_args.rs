//! The speculative decoding flags of `run` and `bench` (`--lookup`, `--draft-model`,
//! `--draft-max`, `--draft-min`, `--draft-fixed`) and the [`Speculator`] they build.

use std::path::PathBuf;

use anyhow::{bail, Result};

use crate::engine::draft::{LookupDraft, ModelDraft};
use crate::engine::{SamplerConfig, Session, SpecConfig, Speculator};
use crate::load::open_any;
use crate::models::LoadOptions;
use crate::tokenizer::ModelTokenizer;

/// Speculative decoding flags.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SpecArgs {
    /// Speculative decoding with prompt lookup: drafts are the tokens that followed the latest
    /// earlier occurrence of the last 3 (down to 1) tokens in the prompt and output so far.
    #[arg(long, conflicts_with = "draft_model")]
    pub lookup: bool,
    /// Speculative decoding with this draft model (any model `run` accepts, with the same
    /// vocabulary: the same number of tokens and the same token texts), kept resident with its
    /// own KV cache.
    #[arg(long)]
    pub draft_model: Option<PathBuf>,
    /// Most tokens drafted per verification pass.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub draft_max: u32,
    /// Fewest drafted tokens worth a verification pass (fewer: a plain decoding step).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub draft_min: u32,
    /// Always draft --draft-max tokens: no adaptive draft length, no fallback to plain decoding.
    #[arg(long)]
    pub draft_fixed: bool,
}

impl SpecArgs {
    /// Whether speculation was asked for.
    pub fn enabled(&self) -> bool {
        self.lookup || self.draft_model.is_some()
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

    /// The speculator these flags ask for over `target` (`None` without `--lookup` or
    /// `--draft-model`). A draft model is loaded whole (no RAM budget) with a cache of the
    /// target's size, and must share the target tokenizer `tok`'s vocabulary; it samples with
    /// `sampling`.
    ///
    /// Errors: the flags conflict ([`SpecArgs::config`]); the target keeps a recurrent state
    /// (Kimi Linear); the draft model does not load, keeps a recurrent state, or its
    /// vocabulary differs (size, or the first token whose text differs, named).
    pub fn speculator(
        &self,
        target: &Session,
        tok: &ModelTokenizer,
        sampling: &SamplerConfig,
        direct_io: bool,
    ) -> Result<Option<Speculator>> {
        if !self.enabled() {
            return Ok(None);
        }
        let cfg = self.config()?;
        crate::engine::speculative::check_rollback(&target.cache)?;
        if self.lookup {
            return Ok(Some(Speculator::new(Box::new(LookupDraft::default()), cfg)));
        }
        let path = self.draft_model.as_deref().expect("enabled");
        let label = format!("--draft-model {}", path.display());
        let opened = open_any(Some(path)).map_err(|e| e.context(label.clone()))?;
        let dtok = opened.tokenizer()?;
        let opts = LoadOptions {
            ram_budget: None,
            n_ctx: target.cache.n_ctx,
            n_batch: target.n_batch,
            direct_io,
            ..Default::default()
        };
        let (model, store) = opened
            .load_weights(&opts)
            .map_err(|e| e.context(label.clone()))?;
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
        let session = Session::new(model, store, target.cache.n_ctx, target.n_batch);
        let draft = ModelDraft::new(session, sampling).map_err(|e| e.context(label))?;
        Ok(Some(Speculator::new(Box::new(draft), cfg)))
    }
}
