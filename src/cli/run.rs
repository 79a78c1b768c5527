//! `deltafin run`: generate text from a model, streaming weights under a RAM budget.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use super::spec_args::{explain_budget, target_budget};
use crate::engine::report::{expert_table, limit_line, stats_json, stats_table};
use crate::engine::sampler::{ModelSampling, SamplerOrder, WHOLE_SEQUENCE};
use crate::engine::{GenerateOptions, Sampler, SamplerConfig, Session};
use crate::load::{open_any, LoadProgress};
use crate::models::LoadOptions;
use crate::store::plan::{parse_size, MemoryLimit};
use crate::tokenizer::chat::Message;

/// Arguments of `deltafin run`.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Model: a .gguf file (the first part of a split model), a folder holding one GGUF model,
    /// a Hugging Face checkpoint folder (one with a config.json), or a pack folder written by
    /// `deltafin pack`; or a Hugging Face repository `ORG/NAME` (`ORG/NAME:FILE.gguf` for one
    /// GGUF of several) already in the Hugging Face cache, used in place. Default: the demo
    /// model (Gemma 3 270M Q4_K_M), fetched on first use.
    #[arg(short, long)]
    pub model: Option<PathBuf>,
    /// Prompt text; read from standard input when absent.
    #[arg(short, long)]
    pub prompt: Option<String>,
    /// Treat the prompt as a user message and render the model's chat template around it.
    #[arg(long)]
    pub chat: bool,
    /// System message for --chat.
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// Without --chat: treat special-token texts in the prompt (e.g. `<|im_start|>`) as plain
    /// text. By default they become their control tokens, as in llama.cpp's `-p`, for GGUF and
    /// Hugging Face models alike. With --chat, message texts are always plain text.
    #[arg(long, conflicts_with = "chat")]
    pub no_parse_special: bool,
    /// Maximum number of tokens to generate.
    #[arg(short = 'n', long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy. Default: the model's generation_config.json, else 0.8.
    #[arg(long = "temp", allow_hyphen_values = true, value_parser = non_negative)]
    pub temperature: Option<f32>,
    /// Top-k filter (0: off). Default: the model's generation_config.json, else 40.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Top-p (nucleus) filter (1: off). Default: the model's generation_config.json, else 0.95.
    #[arg(long, allow_hyphen_values = true, value_parser = probability_above_zero)]
    pub top_p: Option<f32>,
    /// Min-p filter (0: off). Default: the model's generation_config.json, else 0.05.
    #[arg(long, allow_hyphen_values = true, value_parser = probability)]
    pub min_p: Option<f32>,
    /// Repetition penalty (1: off). Default: the model's generation_config.json
    /// (`repetition_penalty`), else 1.
    #[arg(long, allow_hyphen_values = true, value_parser = positive)]
    pub repeat_penalty: Option<f32>,
    /// Tokens the repetition penalty looks back over. Default: the whole sequence (prompt
    /// included) when the penalty comes from the model's generation_config.json, as
    /// transformers applies it; else 64, as llama.cpp.
    #[arg(long)]
    pub repeat_last_n: Option<usize>,
    /// Seed of the sampler's random numbers (default: from the clock; printed with --stats).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop when this text appears (repeatable); it is not printed.
    #[arg(long, value_parser = non_empty)]
    pub stop: Vec<String>,
    /// RAM for resident weights, KV cache, activations and I/O buffers together, e.g. 64M or
    /// 2G; weights that do not fit are read from disk on every forward pass. Default: 90% of
    /// the memory this process may use (`MemAvailable`, or the cgroup limit when lower) less
    /// 256 MiB but at least half of it, so a model that fits is loaded whole and a larger one
    /// is streamed. A budget above that memory is refused.
    #[arg(long, value_parser = parse_size)]
    pub ram_budget: Option<u64>,
    /// KV cache size in tokens (default: prompt + max tokens, capped by the model's context).
    #[arg(short = 'c', long)]
    pub ctx_size: Option<usize>,
    /// Largest number of prompt tokens in one forward pass.
    #[arg(short = 'b', long, default_value_t = 512, value_parser = at_least_one)]
    pub batch_size: usize,
    /// Worker threads (default: all cores).
    #[arg(short = 't', long, value_parser = thread_count)]
    pub threads: Option<usize>,
    /// Read weights through the page cache instead of O_DIRECT.
    #[arg(long)]
    pub no_direct_io: bool,
    /// Arithmetic of the matrix products: `exact` (default; every product equals the
    /// stored weights' exact dot) or `q8` (lossy, faster prompts: activations quantized to 8
    /// bits per block and integer dot products, as llama.cpp computes, in prompts and decode
    /// alike; --stats names it).
    #[arg(long, default_value = "exact")]
    pub numerics: crate::models::Numerics,
    #[command(flatten)]
    pub store: super::store_args::StoreArgs,
    #[command(flatten)]
    pub spec: super::spec_args::SpecArgs,
    /// Print statistics to standard error when done.
    #[arg(long)]
    pub stats: bool,
    /// Write the statistics as JSON to this file.
    #[arg(long)]
    pub stats_json: Option<PathBuf>,
    /// Print the prompt as the model sees it (after the chat template, with --chat) and its
    /// token ids and pieces, to standard error, before generating.
    #[arg(long)]
    pub verbose_prompt: bool,
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

/// This process's memory limit and the RAM budget to load `opened` with: `--ram-budget` (or
/// the default under the limit) checked with the model's fixed allowance against the limit
/// ([`crate::store::plan::fit_allowance`]), before the tokenizer is built.
///
/// Errors: the budget, or the allowance alone, does not fit the limit.
pub fn checked_budget(
    flag: Option<u64>,
    opened: &crate::load::OpenedModel,
) -> Result<(Option<MemoryLimit>, Option<u64>)> {
    use crate::store::plan::{fit_allowance, ram_budget};
    let limit = MemoryLimit::of_this_process();
    let budget = ram_budget(flag, limit).map_err(anyhow::Error::msg)?;
    let budget = fit_allowance(budget, flag.is_some(), limit, opened.allowance())
        .map_err(anyhow::Error::msg)?;
    Ok((limit, budget))
}

/// Runs `deltafin run`.
pub fn run(mut a: RunArgs) -> Result<()> {
    a.model = super::model_path(a.model.as_deref())?;
    super::init_threads(a.threads);
    let t_load = std::time::Instant::now();
    let opened = open_any(a.model.as_deref())?;
    let progress = LoadProgress::start("loading: tokenizer");
    let (limit, budget) = checked_budget(a.ram_budget, &opened)?;
    let tok = opened.tokenizer()?;
    let model_sampling = opened.sampling()?;
    let prompt = match &a.prompt {
        Some(p) => p.clone(),
        None => {
            if std::io::stdin().is_terminal() {
                bail!("no prompt: pass --prompt TEXT or pipe the prompt on standard input");
            }
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("reading the prompt from standard input")?;
            s
        }
    };
    let ids = if a.chat {
        let tmpl = opened.chat_template(&tok)?;
        let mut msgs = Vec::new();
        if let Some(s) = &a.system {
            msgs.push(Message::new("system", s.clone()));
        }
        msgs.push(Message::new("user", prompt.clone()));
        tok.encode_messages(&tmpl, &msgs, true)?
    } else {
        tok.encode_prompt(&prompt, !a.no_parse_special)?
    };
    if ids.is_empty() {
        bail!("the prompt is empty");
    }
    if a.verbose_prompt {
        let text = match a.chat {
            true => opened.chat_template(&tok)?.render(
                &{
                    let mut msgs = Vec::new();
                    if let Some(s) = &a.system {
                        msgs.push(Message::new("system", s.clone()));
                    }
                    msgs.push(Message::new("user", prompt.clone()));
                    msgs
                },
                true,
            )?,
            false => prompt.clone(),
        };
        progress.suspend(|| eprint!("{}", describe_prompt(&text, &ids, &tok)));
    }
    let n_ctx = match a.ctx_size {
        Some(c) if c < ids.len() + 1 => bail!(
            "--ctx-size {c} is smaller than the prompt ({} tokens) plus one",
            ids.len()
        ),
        Some(c) => c,
        None => ids.len().saturating_add(a.max_tokens.max(1)),
    };
    let n_batch = a.batch_size.min(ids.len()).max(1);
    let draft = a.spec.load_draft(n_ctx, n_batch, !a.no_direct_io)?;
    let flag = a.ram_budget.is_some();
    let opts = LoadOptions {
        ram_budget: target_budget(budget, flag, draft.as_ref())?,
        n_ctx,
        n_batch,
        direct_io: !a.no_direct_io,
        experts: a.store.options(a.model.as_deref()),
        mtp: a.spec.mtp(),
        numerics: a.numerics,
    };
    progress.phase("loading: weights");
    let (model, store) = opened
        .load_weights(&opts)
        .map_err(|e| explain_budget(e, budget, flag, draft.as_ref()))
        .map_err(|e| match (a.ram_budget, &limit) {
            (None, Some(l)) => crate::models::BudgetTooSmall::under_limit(e, l),
            _ => e,
        })?;
    drop(progress);
    let limit = model.context_length();
    if ids.len() + 1 > limit {
        bail!(
            "the prompt has {} tokens but the model's context holds {limit}: shorten the prompt",
            ids.len()
        );
    }
    let n_ctx = n_ctx.min(limit);
    let placement = model.placement().clone();
    drop(opened);
    crate::tokenizer::release_freed_memory();
    let mut session = Session::new(model, store, n_ctx, opts.n_batch);
    let load_s = t_load.elapsed().as_secs_f64();
    let seed = a.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    let sampling = sampler_config(&a, &model_sampling, seed);
    let mut spec = a.spec.speculator(&session, &tok, &sampling, draft)?;
    let mut sampler = Sampler::new(sampling);
    let mut dec = tok.decoder();
    let is_eog = |t: u32| tok.is_eog(t);
    let gen_opts = GenerateOptions {
        max_tokens: a.max_tokens,
        stop: &a.stop,
        is_eog: &is_eog,
    };
    let mut stdout = std::io::stdout().lock();
    if !a.chat {
        let _ = write!(stdout, "{prompt}");
        let _ = stdout.flush();
    }
    let mut emit = |s: &str| {
        let _ = write!(stdout, "{s}");
        let _ = stdout.flush();
    };
    let (_, finish, stats) = session.generate_with(
        &ids,
        &mut sampler,
        &gen_opts,
        spec.as_mut(),
        &mut |t| dec.push(t),
        &mut emit,
    )?;
    emit(&dec.finish());
    let _ = writeln!(stdout);
    drop(stdout);
    if a.stats {
        eprint!("{}", stats_table(&stats, &placement, &finish, seed, load_s));
        eprint!("{}", expert_table(&stats));
        eprint!("{}", limit_line(&stats, a.store.drive_bandwidth));
        if let Some(sp) = &stats.speculative {
            eprint!("{}", sp.table());
        }
    }
    if let Some(p) = &a.stats_json {
        std::fs::write(
            p,
            stats_json(
                &stats,
                &placement,
                &finish,
                seed,
                load_s,
                a.store.drive_bandwidth,
            )
            .to_string(),
        )
        .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

/// What `--verbose-prompt` and `deltafin tokenize` print: the text, the number of tokens,
/// then one line per token, `ID -> 'PIECE'` (pieces with special tokens shown as their text,
/// escapes as Rust's `escape_debug`).
pub fn describe_prompt(text: &str, ids: &[u32], tok: &crate::tokenizer::ModelTokenizer) -> String {
    let mut out = format!(
        "prompt: '{}'\nnumber of tokens in prompt = {}\n",
        text.escape_debug(),
        ids.len()
    );
    for &id in ids {
        out.push_str(&format!(
            "{id:>8} -> '{}'\n",
            tok.token_text(id).escape_debug()
        ));
    }
    out
}

/// Loads the model of `a` for `serve` and `chat`: tokenizer, chat template (when the model
/// has one), weights under `a`'s budget with a KV cache of `--ctx-size` tokens (default
/// `default_ctx`, at most the model's context), and the sampling defaults of `a` (flags, else
/// the model's generation config, else Deltafin's), speculating when `a` asks for it
/// (`--lookup`, `--draft-model`). With `fit_ctx`, a default context that does not fit the
/// budget becomes the largest that does, said on standard error ([`super::fit_ctx`]).
/// Returns the engine and the model's id (its file or folder name).
///
/// Errors: as `run`'s loading; a prompt flag (`--prompt`, `--chat`), which these commands
/// take from their clients instead; speculation the model cannot do
/// ([`super::spec_args::SpecArgs::speculator`]); with `fit_ctx`, a `--ctx-size` that does not
/// fit the budget while a smaller one would (the error names the largest).
pub fn load_engine(
    a: &RunArgs,
    default_ctx: usize,
    fit_ctx: bool,
) -> Result<(crate::serve::generate::Engine, String)> {
    if a.prompt.is_some() || a.chat {
        bail!("--prompt and --chat belong to `deltafin run`; this command takes its prompts from its clients");
    }
    super::init_threads(a.threads);
    let opened = open_any(a.model.as_deref())?;
    let progress = LoadProgress::start("loading: tokenizer");
    let (limit, budget) = checked_budget(a.ram_budget, &opened)?;
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
    let n_ctx = a.ctx_size.unwrap_or(default_ctx).max(2);
    let draft = a.spec.load_draft(n_ctx, a.batch_size, !a.no_direct_io)?;
    let flag = a.ram_budget.is_some();
    let mut opts = LoadOptions {
        ram_budget: target_budget(budget, flag, draft.as_ref())?,
        n_ctx,
        n_batch: a.batch_size,
        direct_io: !a.no_direct_io,
        experts: a.store.options(a.model.as_deref()),
        mtp: a.spec.mtp(),
        numerics: a.numerics,
    };
    progress.phase("loading: weights");
    let mut loaded = opened.load_weights(&opts);
    if let (true, Err(e)) = (fit_ctx, &loaded) {
        use super::fit_ctx::{budget_name, chosen_line, largest_fitting, too_large};
        if let Some((n, t)) = largest_fitting(&opened, &opts, e) {
            let name = budget_name(t.budget, flag, draft.is_some());
            if a.ctx_size.is_some() {
                return Err(too_large(n, n_ctx, &t, &name));
            }
            eprintln!("{}", chosen_line(n, n_ctx, &t, &name));
            opts.n_ctx = n;
            loaded = opened.load_weights(&opts);
        }
    }
    let n_ctx = opts.n_ctx;
    let (model, store) = loaded
        .map_err(|e| explain_budget(e, budget, flag, draft.as_ref()))
        .map_err(|e| match (a.ram_budget, &limit) {
            (None, Some(l)) => crate::models::BudgetTooSmall::under_limit(e, l),
            _ => e,
        })?;
    drop(progress);
    drop(opened);
    crate::tokenizer::release_freed_memory();
    let session = Session::new(model, store, n_ctx, opts.n_batch);
    let defaults = sampler_config(a, &model_sampling, a.seed.unwrap_or(0));
    let spec = a.spec.speculator(&session, &tok, &defaults, draft)?;
    let id = a
        .model
        .as_deref()
        .and_then(|p| p.file_name())
        .map_or("deltafin-default".to_string(), |n| {
            n.to_string_lossy().into_owned()
        });
    let mut engine = crate::serve::generate::Engine::new(
        session,
        std::sync::Arc::new(tok),
        template.map(std::sync::Arc::new),
        defaults,
    );
    engine.spec = spec;
    Ok((engine, id))
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
pub fn sampler_config(a: &RunArgs, model: &ModelSampling, seed: u64) -> SamplerConfig {
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
        run: RunArgs,
    }

    fn args(extra: &[&str]) -> RunArgs {
        W::parse_from(["deltafin"].iter().chain(extra)).run
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
