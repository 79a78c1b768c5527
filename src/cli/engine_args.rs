//! The flags `run`, `serve` and `chat` share, in groups that each command flattens into its own
//! arguments, so that it takes (and its `--help` lists) only the flags it honours: the model and
//! how it runs ([`EngineArgs`]: `-m`, then [`SamplingArgs`], [`MemoryArgs`], the expert store's
//! [`StoreArgs`] and speculative decoding's [`SpecArgs`]) and the statistics ([`StatsArgs`],
//! `run` and `chat`); and the loading they share ([`EngineArgs::load_weights`],
//! [`EngineArgs::load_engine`]).

use std::path::{Path, PathBuf};

use anyhow::Result;

use super::spec_args::{explain_budget, target_budget, LoadedDraft, SpecArgs};
use super::store_args::StoreArgs;
use crate::engine::sampler::{ModelSampling, SamplerOrder, WHOLE_SEQUENCE};
use crate::engine::{SamplerConfig, Session};
use crate::load::{open_any, LoadProgress, OpenedModel};
use crate::models::{BudgetTooSmall, LoadOptions, Model};
use crate::store::plan::{parse_size, MemoryLimit};
use crate::store::WeightStore;

/// Help headings of the groups (per flag, so that a command's own flags after a group keep
/// their heading).
const SAMPLING: &str = "Sampling";
const MEMORY: &str = "Memory and compute";
const STATS: &str = "Statistics";

/// The model and how it runs: what `run`, `serve` and `chat` all take.
#[derive(clap::Args, Debug, Clone)]
pub struct EngineArgs {
    /// Model file or folder, or ORG/NAME[:FILE.gguf] in the HF cache [default: demo model]
    #[arg(short, long)]
    pub model: Option<PathBuf>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub memory: MemoryArgs,
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
}

/// Sampling flags: each one given beats the model's `generation_config.json`, which beats
/// Deltafin's defaults ([`sampler_config`]).
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Most tokens to generate (chat: per answer; serve: default of requests)
    #[arg(value_name = "N", help_heading = SAMPLING, short = 'n', long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Temperature, 0: greedy [default: generation_config.json's, else 0.8]
    #[arg(value_name = "T", help_heading = SAMPLING, long = "temp", allow_hyphen_values = true, value_parser = non_negative)]
    pub temperature: Option<f32>,
    /// Top-k filter, 0: off [default: the model's, else 40]
    #[arg(value_name = "N", help_heading = SAMPLING, long)]
    pub top_k: Option<usize>,
    /// Top-p (nucleus) filter, 1: off [default: the model's, else 0.95]
    #[arg(value_name = "P", help_heading = SAMPLING, long, allow_hyphen_values = true, value_parser = probability_above_zero)]
    pub top_p: Option<f32>,
    /// Min-p filter, 0: off [default: the model's, else 0.05]
    #[arg(value_name = "P", help_heading = SAMPLING, long, allow_hyphen_values = true, value_parser = probability)]
    pub min_p: Option<f32>,
    /// Repetition penalty, 1: off [default: the model's, else 1]
    #[arg(value_name = "X", help_heading = SAMPLING, long, allow_hyphen_values = true, value_parser = positive)]
    pub repeat_penalty: Option<f32>,
    /// Tokens the repetition penalty looks at [default: 64; all with the model's]
    #[arg(value_name = "N", help_heading = SAMPLING, long)]
    pub repeat_last_n: Option<usize>,
    /// Seed of the sampler [default: from the clock]
    #[arg(value_name = "N", help_heading = SAMPLING, long)]
    pub seed: Option<u64>,
    /// Stop when this text appears, not printing it (repeatable)
    #[arg(value_name = "TEXT", help_heading = SAMPLING, long, value_parser = non_empty)]
    pub stop: Vec<String>,
}

/// Memory and compute flags.
#[derive(clap::Args, Debug, Clone)]
pub struct MemoryArgs {
    /// RAM for weights, KV cache and buffers; the rest streams [default: ~90% of free]
    #[arg(value_name = "SIZE", help_heading = MEMORY, long, value_parser = parse_size)]
    pub ram_budget: Option<u64>,
    /// Context (KV cache) in tokens [default: prompt + -n; serve, chat: 4096]
    #[arg(value_name = "N", help_heading = MEMORY, short = 'c', long)]
    pub ctx_size: Option<usize>,
    /// Most prompt tokens in one forward pass
    #[arg(value_name = "N", help_heading = MEMORY, short = 'b', long, default_value_t = 512, value_parser = at_least_one)]
    pub batch_size: usize,
    /// Worker threads [default: all cores]
    #[arg(value_name = "N", help_heading = MEMORY, short = 't', long, value_parser = thread_count)]
    pub threads: Option<usize>,
    /// Read weights through the page cache instead of O_DIRECT
    #[arg(help_heading = MEMORY, long)]
    pub no_direct_io: bool,
    /// Matrix products: exact, or q8 (lossy, faster prompts)
    #[arg(value_name = "MODE", help_heading = MEMORY, long, default_value = "exact")]
    pub numerics: crate::models::Numerics,
    /// Compute device: cpu, cuda, cuda:N, or auto (the first CUDA GPU when the model's kernels there are verified, else the CPU)
    #[arg(value_name = "DEVICE", help_heading = MEMORY, long, default_value = "auto")]
    pub device: crate::backend::DeviceKind,
}

/// Statistics flags (`run`; `chat` per answer).
#[derive(clap::Args, Debug, Clone)]
pub struct StatsArgs {
    /// Print statistics to standard error (chat: speculation's, per answer)
    #[arg(help_heading = STATS, long)]
    pub stats: bool,
    /// Write the statistics as JSON to FILE (chat: one line per answer)
    #[arg(help_heading = STATS, long, value_name = "FILE")]
    pub stats_json: Option<PathBuf>,
}

fn float(s: &str) -> Result<f32, String> {
    let v: f32 = s.parse().map_err(|_| format!("'{s}' is not a number"))?;
    if v.is_finite() {
        Ok(v)
    } else {
        Err(format!("'{s}' is not a finite number"))
    }
}

fn non_negative(s: &str) -> Result<f32, String> {
    float(s).and_then(|v| {
        if v >= 0.0 {
            Ok(v)
        } else {
            Err(format!("{v} is negative; use 0 for greedy"))
        }
    })
}

fn positive(s: &str) -> Result<f32, String> {
    float(s).and_then(|v| {
        if v > 0.0 {
            Ok(v)
        } else {
            Err(format!("{v} must be above 0 (1 turns it off)"))
        }
    })
}

fn probability(s: &str) -> Result<f32, String> {
    float(s).and_then(|v| {
        if (0.0..=1.0).contains(&v) {
            Ok(v)
        } else {
            Err(format!("{v} is not between 0 and 1"))
        }
    })
}

fn probability_above_zero(s: &str) -> Result<f32, String> {
    probability(s).and_then(|v| {
        if v > 0.0 {
            Ok(v)
        } else {
            Err("0 would keep no token; use 1 to turn it off".into())
        }
    })
}

fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(v) if v >= 1 => Ok(v),
        _ => Err(format!("'{s}' is not a whole number of at least 1")),
    }
}

fn thread_count(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(v) if (1..=1024).contains(&v) => Ok(v),
        _ => Err(format!("'{s}' is not a thread count from 1 to 1024")),
    }
}

fn non_empty(s: &str) -> Result<String, String> {
    if s.is_empty() {
        Err("an empty stop string would stop at once".into())
    } else {
        Ok(s.to_string())
    }
}

/// What [`EngineArgs::load_weights`] loads: the model, its weights and the draft model.
pub struct LoadedWeights {
    /// The model, placed under the RAM budget.
    pub model: Box<dyn Model>,
    /// Its weights.
    pub store: WeightStore,
    /// The draft model of `--draft-model`, loaded first.
    pub draft: Option<LoadedDraft>,
    /// The context in tokens: the one asked for, at most the model's trained context.
    pub n_ctx: usize,
}

/// This process's memory limit and the RAM budget to load `opened` with: `--ram-budget`
/// (`flag`, or the default under the limit) checked with the model's fixed allowance against
/// the limit ([`crate::store::plan::fit_allowance`]); called before the tokenizer is built.
///
/// Errors: the budget, or the allowance alone, does not fit the limit.
pub fn checked_budget(
    flag: Option<u64>,
    opened: &OpenedModel,
) -> Result<(Option<MemoryLimit>, Option<u64>)> {
    use crate::store::plan::{fit_allowance, ram_budget};
    let limit = MemoryLimit::of_this_process();
    let budget = ram_budget(flag, limit).map_err(anyhow::Error::msg)?;
    let budget = fit_allowance(budget, flag.is_some(), limit, opened.allowance())
        .map_err(anyhow::Error::msg)?;
    Ok((limit, budget))
}

impl EngineArgs {
    /// The path `-m` names, through the one resolver of every command ([`super::model_path`];
    /// a pack on object storage's local copy where `--local-cache` says).
    ///
    /// Errors: as [`super::model_path_s3`].
    pub fn model_path(&self) -> Result<Option<PathBuf>> {
        self.store.s3.model_path(self.model.as_deref())
    }

    /// Loads the weights of `opened` (the model at `path`, [`EngineArgs::model_path`]) under
    /// `limit_budget` (the memory limit and RAM budget of [`checked_budget`]) with a KV cache
    /// of `n_ctx` tokens and batches of `n_batch`, the draft model of `--draft-model` first
    /// (its bytes come out of the budget), showing the phase on `progress`. A `--ctx-size`
    /// above the model's trained context is capped to it, with a warning on standard error.
    /// With `fit_ctx`, a default context that does not fit the budget becomes the largest that
    /// does, said on standard error ([`super::fit_ctx`]).
    ///
    /// Errors: a budget too small (sizes named); with `fit_ctx`, a `--ctx-size` that does not
    /// fit while a smaller one would (the error names the largest); the draft model or the
    /// model does not load.
    #[allow(clippy::too_many_arguments)]
    pub fn load_weights(
        &self,
        opened: &OpenedModel,
        path: Option<&Path>,
        n_ctx: usize,
        n_batch: usize,
        limit_budget: (Option<MemoryLimit>, Option<u64>),
        progress: &LoadProgress,
        fit_ctx: bool,
    ) -> Result<LoadedWeights> {
        let m = &self.memory;
        let (limit, budget) = limit_budget;
        let draft = self.spec.load_draft(n_ctx, n_batch, !m.no_direct_io)?;
        let flag = m.ram_budget.is_some();
        let mut opts = LoadOptions {
            ram_budget: target_budget(budget, flag, draft.as_ref())?,
            n_ctx,
            n_batch,
            direct_io: !m.no_direct_io,
            experts: self.store.options(path),
            mtp: self.spec.mtp(),
            numerics: m.numerics,
            device: m.device,
        };
        progress.phase("loading: weights");
        let mut loaded = opened.load_weights(&opts);
        if let (true, Err(e)) = (fit_ctx, &loaded) {
            use super::fit_ctx::{budget_name, chosen_line, largest_fitting, too_large};
            if let Some((n, t)) = largest_fitting(opened, &opts, e) {
                let name = budget_name(t.budget, flag, draft.is_some());
                if m.ctx_size.is_some() {
                    return Err(too_large(n, n_ctx, &t, &name));
                }
                progress.suspend(|| eprintln!("{}", chosen_line(n, n_ctx, &t, &name)));
                opts.n_ctx = n;
                loaded = opened.load_weights(&opts);
            }
        }
        let n_ctx = opts.n_ctx;
        let (model, store) = loaded
            .map_err(|e| explain_budget(e, budget, flag, draft.as_ref()))
            .map_err(|e| match (m.ram_budget, &limit) {
                (None, Some(l)) => BudgetTooSmall::under_limit(e, l),
                _ => e,
            })?;
        let trained = model.context_length();
        if let Some(c) = m.ctx_size.filter(|&c| c > trained) {
            eprintln!(
                "warning: -c {c} is above the model's trained context of {trained} tokens; the context is {trained} tokens"
            );
        }
        Ok(LoadedWeights {
            model,
            store,
            draft,
            n_ctx: n_ctx.min(trained),
        })
    }

    /// Loads the model for `serve` and `chat`: tokenizer, chat template (when the model has
    /// one), weights ([`EngineArgs::load_weights`]) with a KV cache of `--ctx-size` tokens
    /// (default `default_ctx`, at most the model's context), and the sampling defaults
    /// ([`sampler_config`]), speculating when asked (`--lookup`, `--draft-model`, `--draft`).
    /// With `fit_ctx` (`chat`), a default context that does not fit the budget becomes the
    /// largest that does ([`EngineArgs::load_weights`]). Returns the engine and the model's id
    /// (the file or folder name `-m` gives).
    ///
    /// Errors: as [`EngineArgs::load_weights`]; speculation the model cannot do
    /// ([`SpecArgs::speculator`]).
    pub fn load_engine(
        &self,
        default_ctx: usize,
        fit_ctx: bool,
    ) -> Result<(crate::engine::Engine, String)> {
        super::init_threads(self.memory.threads);
        let path = self.model_path()?;
        let opened = open_any(path.as_deref())?;
        let progress = LoadProgress::start("loading: tokenizer");
        let budget = checked_budget(self.memory.ram_budget, &opened)?;
        let tok = opened.tokenizer()?;
        let model_sampling = opened.sampling()?;
        let template = match opened.chat_template(&tok) {
            Ok(t) => Some(t),
            Err(e) => {
                progress.suspend(|| {
                    eprintln!("warning: no chat template ({e:#}); chat requests will be refused")
                });
                None
            }
        };
        let n_ctx = self.memory.ctx_size.unwrap_or(default_ctx).max(2);
        let n_batch = self.memory.batch_size;
        let w = self.load_weights(
            &opened,
            path.as_deref(),
            n_ctx,
            n_batch,
            budget,
            &progress,
            fit_ctx,
        )?;
        drop(progress);
        drop(opened);
        crate::tokenizer::release_freed_memory();
        let session = Session::new(w.model, w.store, w.n_ctx, n_batch);
        let s = &self.sampling;
        let defaults = sampler_config(s, &model_sampling, s.seed.unwrap_or(0));
        let spec = self.spec.speculator(&session, &tok, &defaults, w.draft)?;
        let id = self
            .model
            .as_deref()
            .and_then(|p| p.file_name())
            .map_or("deltafin-default".to_string(), |n| {
                n.to_string_lossy().into_owned()
            });
        let mut engine = crate::engine::Engine::new(
            session,
            std::sync::Arc::new(tok),
            template.map(std::sync::Arc::new),
            defaults,
        );
        engine.spec = spec;
        Ok((engine, id))
    }
}

/// The sampling settings of a run: each flag given on the command line, else the model's
/// setting ([`ModelSampling`]), else Deltafin's default (temperature 0.8, top-k 40, top-p 0.95,
/// min-p 0.05, no repetition penalty: llama.cpp's defaults).
///
/// The source also decides how the settings act, as in the program each source comes from:
/// - the repetition penalty looks back `--repeat-last-n` tokens when the flag is given; else
///   over the whole sequence when the penalty is the model's (transformers), else 64 tokens
///   (llama.cpp);
/// - the filters run in transformers' order ([`SamplerOrder::Transformers`]: temperature,
///   top-k, top-p, min-p) when any setting in use is the model's, else in llama.cpp's order
///   ([`SamplerOrder::LlamaCpp`]: top-k, top-p, min-p, temperature).
pub fn sampler_config(a: &SamplingArgs, model: &ModelSampling, seed: u64) -> SamplerConfig {
    let from_model = |m: bool, flag: bool| m && !flag;
    let model_penalty = from_model(model.repeat_penalty.is_some(), a.repeat_penalty.is_some());
    let any_model = model_penalty
        || from_model(model.temperature.is_some(), a.temperature.is_some())
        || from_model(model.top_k.is_some(), a.top_k.is_some())
        || from_model(model.top_p.is_some(), a.top_p.is_some())
        || from_model(model.min_p.is_some(), a.min_p.is_some());
    let mut c = SamplerConfig {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.95,
        min_p: 0.05,
        repeat_penalty: 1.0,
        repeat_last_n: match a.repeat_last_n {
            Some(n) => n,
            None if model_penalty => WHOLE_SEQUENCE,
            None => 64,
        },
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        seed,
        order: if any_model {
            SamplerOrder::Transformers
        } else {
            SamplerOrder::LlamaCpp
        },
    };
    model.apply(&mut c);
    if let Some(t) = a.temperature {
        c.temperature = t;
    }
    if let Some(k) = a.top_k {
        c.top_k = k;
    }
    if let Some(p) = a.top_p {
        c.top_p = p;
    }
    if let Some(p) = a.min_p {
        c.min_p = p;
    }
    if let Some(r) = a.repeat_penalty {
        c.repeat_penalty = r;
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct W {
        #[command(flatten)]
        sampling: SamplingArgs,
    }

    fn args(extra: &[&str]) -> SamplingArgs {
        W::parse_from(["deltafin"].iter().chain(extra)).sampling
    }

    #[test]
    fn flags_beat_the_model_settings_which_beat_the_defaults() {
        let model = ModelSampling {
            temperature: Some(0.6),
            top_k: Some(20),
            repeat_penalty: Some(1.1),
            ..Default::default()
        };
        let c = sampler_config(&args(&[]), &ModelSampling::default(), 3);
        assert_eq!(
            (
                c.temperature,
                c.top_k,
                c.top_p,
                c.min_p,
                c.repeat_penalty,
                c.seed
            ),
            (0.8, 40, 0.95, 0.05, 1.0, 3)
        );
        let c = sampler_config(&args(&[]), &model, 3);
        assert_eq!(
            (c.temperature, c.top_k, c.top_p, c.repeat_penalty),
            (0.6, 20, 0.95, 1.1)
        );
        let c = sampler_config(&args(&["--temp", "0", "--top-k", "5"]), &model, 3);
        assert_eq!((c.temperature, c.top_k, c.repeat_penalty), (0.0, 5, 1.1));
    }

    #[test]
    fn the_source_of_a_setting_decides_its_window_and_order() {
        let model = ModelSampling {
            repeat_penalty: Some(1.1),
            ..Default::default()
        };
        let none = ModelSampling::default();
        let get = |flags: &[&str], m: &ModelSampling| {
            let c = sampler_config(&args(flags), m, 0);
            (c.repeat_penalty, c.repeat_last_n, c.order)
        };
        use SamplerOrder::{LlamaCpp, Transformers};
        // generation_config.json's penalty: whole sequence, transformers' order.
        assert_eq!(get(&[], &model), (1.1, WHOLE_SEQUENCE, Transformers));
        // --repeat-last-n given: that window, whatever the source of the penalty.
        assert_eq!(
            get(&["--repeat-last-n", "16"], &model),
            (1.1, 16, Transformers)
        );
        // the flag's penalty: llama.cpp's 64-token window and order.
        assert_eq!(
            get(&["--repeat-penalty", "1.3"], &model),
            (1.3, 64, LlamaCpp)
        );
        assert_eq!(
            get(&["--repeat-penalty", "1.3"], &none),
            (1.3, 64, LlamaCpp)
        );
        assert_eq!(get(&[], &none), (1.0, 64, LlamaCpp));
        // any other setting of the model's in use selects transformers' order.
        let temp = ModelSampling {
            temperature: Some(0.6),
            ..Default::default()
        };
        assert_eq!(get(&[], &temp).2, Transformers);
        assert_eq!(get(&["--temp", "0.5"], &temp).2, LlamaCpp);
    }
}
