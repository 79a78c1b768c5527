//! `deltafin run`: generate text from a model, streaming weights under a RAM budget.

use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::engine_args::{checked_budget, sampler_config, EngineArgs, StatsArgs};
use super::interrupt;
use crate::engine::report::{expert_table, limit_line, stats_json, stats_table};
use crate::engine::{Finish, GenerateOptions, Sampler, Session};
use crate::load::{open_any, LoadProgress};
use crate::tokenizer::chat::Message;

/// Arguments of `deltafin run`: the model and how it runs ([`EngineArgs`]), the prompt
/// ([`PromptArgs`]) and the statistics ([`StatsArgs`]).
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    #[command(flatten)]
    pub prompt: PromptArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub stats: StatsArgs,
}

/// The help heading of [`PromptArgs`].
const PROMPT: &str = "Prompt";

/// The prompt flags of `run`.
#[derive(clap::Args, Debug, Clone)]
pub struct PromptArgs {
    /// Prompt text [default: -f, else standard input]
    #[arg(value_name = "TEXT", help_heading = PROMPT, short, long, conflicts_with = "file")]
    pub prompt: Option<String>,
    /// Read the prompt from FILE (-: standard input)
    #[arg(help_heading = PROMPT, short, long, value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// Send the prompt as a user message in the model's chat template
    #[arg(help_heading = PROMPT, long)]
    pub chat: bool,
    /// System message (with --chat)
    #[arg(value_name = "TEXT", help_heading = PROMPT, long, requires = "chat")]
    pub system: Option<String>,
    /// Keep special-token text (<|im_start|>) in the prompt literal (without --chat)
    #[arg(help_heading = PROMPT, long, conflicts_with = "chat")]
    pub no_parse_special: bool,
    /// Do not print the prompt before the output (--chat never prints it)
    #[arg(help_heading = PROMPT, long)]
    pub no_display_prompt: bool,
    /// Print the prompt as the model sees it and its tokens to standard error
    #[arg(help_heading = PROMPT, long)]
    pub verbose_prompt: bool,
}

impl PromptArgs {
    /// The prompt text: `--prompt`, else the file of `-f` (`-`: standard input), else standard
    /// input when it is not a terminal.
    ///
    /// Errors: no prompt given and standard input is a terminal; the file or standard input
    /// cannot be read or is not UTF-8.
    pub fn text(&self) -> Result<String> {
        let stdin = || -> Result<String> {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("reading the prompt from standard input")?;
            Ok(s)
        };
        match (&self.prompt, self.file.as_deref()) {
            (Some(p), _) => Ok(p.clone()),
            (None, Some(f)) if f == Path::new("-") => stdin(),
            (None, Some(f)) => std::fs::read_to_string(f)
                .with_context(|| format!("reading the prompt from {}", f.display())),
            (None, None) if std::io::stdin().is_terminal() => bail!(
                "no prompt: pass --prompt TEXT or -f FILE, or pipe the prompt on standard input"
            ),
            (None, None) => stdin(),
        }
    }

    /// The messages of `--chat`: the system message when given, then `prompt` as the user's.
    fn messages(&self, prompt: &str) -> Vec<Message> {
        let mut msgs = Vec::new();
        if let Some(s) = &self.system {
            msgs.push(Message::new("system", s.clone()));
        }
        msgs.push(Message::new("user", prompt.to_string()));
        msgs
    }
}

/// Runs `deltafin run`.
///
/// Errors: as loading and generating; [`interrupt::Interrupted`] after Ctrl-C stopped the
/// generation (the text so far and the statistics are written first).
pub fn run(a: RunArgs) -> Result<()> {
    interrupt::install();
    let e = &a.engine;
    let p = &a.prompt;
    let path = e.model_path()?;
    super::init_threads(e.memory.threads);
    let t_load = std::time::Instant::now();
    let opened = open_any(path.as_deref())?;
    let progress = LoadProgress::start("loading: tokenizer");
    let budget = checked_budget(e.memory.ram_budget, &opened)?;
    let tok = opened.tokenizer()?;
    let model_sampling = opened.sampling()?;
    let prompt = p.text()?;
    let ids = if p.chat {
        let tmpl = opened.chat_template(&tok)?;
        tok.encode_messages(&tmpl, &p.messages(&prompt), true)?
    } else {
        tok.encode_prompt(&prompt, !p.no_parse_special)?
    };
    if ids.is_empty() {
        bail!("the prompt is empty");
    }
    if p.verbose_prompt {
        let text = match p.chat {
            true => opened
                .chat_template(&tok)?
                .render(&p.messages(&prompt), true)?,
            false => prompt.clone(),
        };
        progress.suspend(|| eprint!("{}", describe_prompt(&text, &ids, &tok)));
    }
    let max_tokens = e.sampling.max_tokens;
    let n_ctx = match e.memory.ctx_size {
        Some(c) if c < ids.len() + 1 => bail!(
            "--ctx-size {c} is smaller than the prompt ({} tokens) plus one",
            ids.len()
        ),
        Some(c) => c,
        None => ids.len().saturating_add(max_tokens.max(1)),
    };
    let n_batch = e.memory.batch_size.min(ids.len()).max(1);
    let w = e.load_weights(
        &opened,
        path.as_deref(),
        n_ctx,
        n_batch,
        budget,
        &progress,
        false,
    )?;
    drop(progress);
    let limit = w.model.context_length();
    if ids.len() + 1 > limit {
        bail!(
            "the prompt has {} tokens but the model's context holds {limit}: shorten the prompt",
            ids.len()
        );
    }
    let n_ctx = w.n_ctx;
    let placement = w.model.placement().clone();
    drop(opened);
    crate::tokenizer::release_freed_memory();
    let mut session = Session::new(w.model, w.store, n_ctx, n_batch);
    let load_s = t_load.elapsed().as_secs_f64();
    let seed = e.sampling.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    let sampling = sampler_config(&e.sampling, &model_sampling, seed);
    let mut spec = e.spec.speculator(&session, &tok, &sampling, w.draft)?;
    let mut sampler = Sampler::new(sampling);
    let mut dec = tok.decoder();
    let is_eog = |t: u32| tok.is_eog(t);
    let cancel = interrupt::requested;
    let gen_opts = GenerateOptions {
        max_tokens,
        stop: &e.sampling.stop,
        is_eog: &is_eog,
        cancel: Some(&cancel),
    };
    if !p.chat && !p.no_display_prompt {
        out!("{prompt}");
    }
    let mut emit = |s: &str| out!("{s}");
    let generating = interrupt::Generating::start();
    let (_, finish, stats) = session.generate_with(
        &ids,
        &mut sampler,
        &gen_opts,
        spec.as_mut(),
        &mut |t| dec.push(t),
        &mut emit,
    )?;
    drop(generating);
    emit(&dec.finish());
    outln!();
    if finish == Finish::ContextFull {
        eprintln!("{}", context_full(n_ctx, limit));
    }
    let bandwidth = e.store.drive_bandwidth;
    if a.stats.stats {
        eprint!("{}", stats_table(&stats, &placement, &finish, seed, load_s));
        eprint!("{}", expert_table(&stats));
        eprint!("{}", limit_line(&stats, bandwidth));
        if let Some(sp) = &stats.speculative {
            eprint!("{}", sp.table());
        }
    }
    if let Some(p) = &a.stats.stats_json {
        let j = stats_json(&stats, &placement, &finish, seed, load_s, bandwidth);
        std::fs::write(p, j.to_string()).with_context(|| format!("writing {}", p.display()))?;
    }
    if finish == Finish::Interrupted {
        return Err(interrupt::Interrupted.into());
    }
    Ok(())
}

/// The note of a generation that filled its context of `n_ctx` tokens, the model's trained
/// context being `limit`: `context full: 12 tokens (-c 12); a larger -c (up to 32768) lets the
/// text go on`, or, at the model's own limit, `context full: 32768 tokens (-c 32768), the
/// model's whole context`.
pub fn context_full(n_ctx: usize, limit: usize) -> String {
    match n_ctx < limit {
        true => format!(
            "context full: {n_ctx} tokens (-c {n_ctx}); a larger -c (up to {limit}) lets the text go on"
        ),
        false => format!("context full: {n_ctx} tokens (-c {n_ctx}), the model's whole context"),
    }
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
