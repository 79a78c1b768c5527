//! Command-line interface (clap). Each command lives in its own file and calls the library:
//! `run.rs`, `chat.rs`, `serve.rs`, `bench.rs`, `inspect.rs`, `pack.rs`, `pull.rs`, `synth.rs`,
//! `tokenize.rs`, `plan.rs`, `doctor.rs`.
//!
//! Commands do not import one another. What they share:
//!
//! - this file;
//! - `store_args.rs`: the expert-store flags;
//! - `engine_args.rs`: the model, sampling, memory and statistics flag groups (each command
//!   flattens only the groups it honours) and the loading of `run`, `serve` and `chat`
//!   (`checked_budget`, `load_weights`, `load_engine`);
//! - `spec_args.rs`: the speculative decoding flags; the draft model, loaded before the target,
//!   its bytes taken out of the RAM budget (`target_budget`, `explain_budget`); building the
//!   `Speculator`;
//! - `fit_ctx.rs`: the largest context that fits the RAM budget (`chat`);
//! - `interrupt.rs`: Ctrl-C during `run`'s generation;
//! - `out.rs`: standard output (the `out!` / `outln!` macros), ended by SIGPIPE when its reader
//!   goes away while SIGPIPE itself stays ignored for the sockets;
//! - `bench_out.rs`: `bench`'s tables, CSV, Markdown and plot;
//! - `run.rs`'s `describe_prompt`, which `tokenize` reuses.

use clap::{Parser, Subcommand};

/// `print!` through [`out::print`]: a closed reader ends the command by SIGPIPE.
macro_rules! out {
    ($($t:tt)*) => { $crate::cli::out::print(&format!($($t)*)) };
}

/// `println!` through [`out::println`].
macro_rules! outln {
    () => { $crate::cli::out::println("") };
    ($($t:tt)*) => { $crate::cli::out::println(&format!($($t)*)) };
}

pub mod bench;
pub mod bench_out;
pub mod chat;
pub mod doctor;
pub mod engine_args;
pub mod fit_ctx;
pub mod inspect;
pub mod interrupt;
pub mod out;
pub mod pack;
pub mod plan;
pub mod pull;
pub mod run;
pub mod serve;
pub mod spec_args;
pub mod store_args;
pub mod synth;
pub mod tokenize;

/// Deltafin: run language models larger than RAM by streaming weights from disk.
#[derive(Parser, Debug)]
#[command(name = "deltafin", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Fetch a known model into the model cache ($DELTAFIN_HOME, default ~/.cache/deltafin).
    Pull(pull::PullArgs),
    /// Generate text from a model, streaming weights that do not fit the RAM budget (every flag
    /// explained in docs/commands.md).
    Run(Box<run::RunArgs>),
    /// Print a model's architecture, tensors and byte totals.
    Inspect(inspect::InspectArgs),
    /// Run decode and prefill scenarios and report tok/s, bytes/token, hit rate, bandwidth.
    Bench(bench::BenchArgs),
    /// Re-lay a MoE model (Hugging Face folder or GGUF file) out for one read per expert across
    /// drives, or verify a pack.
    Pack(pack::PackArgs),
    /// Write a random-weight checkpoint of a real architecture (for benchmarks).
    Synth(synth::SynthArgs),
    /// Serve the model over an OpenAI-compatible HTTP API (chat, completions, models, metrics).
    Serve(Box<serve::ServeArgs>),
    /// Chat with the model in the terminal (history kept with KV cache reuse).
    Chat(Box<chat::ChatArgs>),
    /// Print the token ids and pieces of a text.
    Tokenize(tokenize::TokenizeArgs),
    /// Predict placement, decode tok/s per drive count and time to first token, without loading.
    Plan(Box<plan::PlanArgs>),
    /// Check this machine: CPU and SIMD, memory, drives (probed), open files, GPUs.
    Doctor(doctor::DoctorArgs),
}

/// Sets the size of the global thread pool once (`--threads`; `None`: all cores).
pub fn init_threads(threads: Option<usize>) {
    if let Some(n) = threads {
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(n.max(1))
            .build_global();
    }
}

/// Installs the stderr subscriber for `tracing` once: warnings of Deltafin (a heat file that
/// cannot be saved, io_uring falling back) always reach standard error; with `trace` (the
/// `--trace` flag of `run` and `bench`) the expert store's debug spans do too; with `serve`
/// (`deltafin serve`) the request log (`crate::serve::access`, info level), with timestamps.
pub fn init_tracing(trace: bool, serve: bool) {
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let _ = if trace {
        builder
            .with_env_filter(tracing_subscriber::EnvFilter::new("deltafin=debug"))
            .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
            .try_init()
    } else if serve {
        builder
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                "deltafin=warn,deltafin::serve::access=info",
            ))
            .with_target(false)
            .try_init()
    } else {
        builder
            .with_env_filter(tracing_subscriber::EnvFilter::new("deltafin=warn"))
            .without_time()
            .with_target(false)
            .try_init()
    };
}

/// Parses the command line, runs the command and maps errors to exit code 1.
pub fn main() -> std::process::ExitCode {
    // SIGPIPE stays ignored (a client hanging up must not kill `serve`, nor a closed
    // connection `pull` or an S3 upload); output to a closed pipe ends the command through
    // `out.rs` instead.
    let cli = Cli::parse();
    init_tracing(
        match &cli.command {
            Command::Run(a) => a.engine.store.trace,
            Command::Bench(a) => a.store.trace,
            Command::Serve(a) => a.engine.store.trace,
            Command::Chat(a) => a.engine.store.trace,
            _ => false,
        },
        matches!(cli.command, Command::Serve(_)),
    );
    let result = match cli.command {
        Command::Pull(a) => pull::run(a),
        Command::Run(a) => run::run(*a),
        Command::Inspect(a) => inspect::run(a),
        Command::Synth(a) => synth::run(a),
        Command::Pack(a) => pack::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Serve(a) => serve::run(*a),
        Command::Chat(a) => chat::run(*a),
        Command::Tokenize(a) => tokenize::run(a),
        Command::Plan(a) => plan::run(*a),
        Command::Doctor(a) => doctor::run(a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) if e.is::<interrupt::Interrupted>() => {
            eprintln!("{e}");
            std::process::ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The value of the environment variable `name`, `None` when unset or empty (the Hugging Face
/// tools' standard variables: `HF_ENDPOINT`, `HF_TOKEN`, `HF_HUB_CACHE`, `HF_HOME`).
pub fn env_text(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The Hugging Face hub cache folder from the environment ([`crate::pull::hf_cache::hub_cache_dir`]
/// over `HF_HUB_CACHE`, `HF_HOME`, `XDG_CACHE_HOME`, `HOME`). Errors: none of them is set.
pub fn hf_hub_cache() -> anyhow::Result<std::path::PathBuf> {
    crate::pull::hf_cache::hub_cache_dir(
        env_text("HF_HUB_CACHE").as_deref(),
        env_text("HF_HOME").as_deref(),
        env_text("XDG_CACHE_HOME").as_deref(),
        env_text("HOME").as_deref(),
    )
    .ok_or_else(|| anyhow::anyhow!("no Hugging Face cache: set HF_HUB_CACHE or HF_HOME"))
}

/// The path a model flag names (`-m MODEL` of every command, `--draft-model MODEL`): the one
/// resolver they all go through. `MODEL` itself when it exists; else, when it reads as a
/// Hugging Face repository (`ORG/NAME` or `ORG/NAME:FILE.gguf`), the model in the Hugging Face
/// cache ([`crate::pull::hf_cache::resolve`]), used in place; else `MODEL` (opening it then
/// says what is wrong). `None` (no flag) stays `None`: the demo model.
///
/// Errors: `MODEL` is one `.safetensors` file ([`crate::load::check_model_path`]: the folder
/// that holds it is named); a repository not in the cache, or no cache folder known.
pub fn model_path(model: Option<&std::path::Path>) -> anyhow::Result<Option<std::path::PathBuf>> {
    model_path_s3(model, None, &crate::store::remote::FetchOptions::default())
}

/// [`model_path`], where `s3://BUCKET/PREFIX` names a pack on object storage: its local copy
/// ([`crate::remote::local_copy`]: manifest, spine and small files fetched and checked) in
/// `local_cache` (`--local-cache`), else in `$DELTAFIN_HOME/remote`, fetching with `fetch`.
///
/// Errors: as [`model_path`]; the pack on object storage cannot be reached, is not there or
/// fails its checks (named).
pub fn model_path_s3(
    model: Option<&std::path::Path>,
    local_cache: Option<&std::path::Path>,
    fetch: &crate::store::remote::FetchOptions,
) -> anyhow::Result<Option<std::path::PathBuf>> {
    use crate::pull::hf_cache::{resolve, RepoSpec};
    let Some(m) = model else {
        return Ok(None);
    };
    if let Some(url) = m.to_str().filter(|u| crate::store::remote::is_s3_url(u)) {
        let root = match local_cache {
            Some(d) => d.to_path_buf(),
            None => crate::pull::home_dir().join("remote"),
        };
        return Ok(Some(crate::remote::local_copy(url, &root, fetch)?));
    }
    if m.exists() {
        crate::load::check_model_path(m)?;
        return Ok(Some(m.to_path_buf()));
    }
    match m.to_str().and_then(RepoSpec::parse) {
        Some(spec) => Ok(Some(resolve(&hf_hub_cache()?, &spec)?)),
        None => Ok(Some(m.to_path_buf())),
    }
}

/// The error and its causes joined by ": ", skipping a cause whose text the message before it
/// already ends with (io errors wrapped by a message that quotes them).
pub fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn error_chain_skips_repeated_causes() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file");
        let e = anyhow::Error::new(io)
            .context("model.gguf: No such file")
            .context("opening the model");
        assert_eq!(
            super::error_chain(&e),
            "opening the model: model.gguf: No such file"
        );
    }
}
