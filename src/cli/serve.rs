//! `deltafin serve`: the OpenAI-compatible server over one model (see `crate::serve`).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use crate::serve::{serve, ServeOptions, SlotContext};
use crate::store::plan::parse_size;

/// Arguments of `deltafin serve`: the model and how it runs (the sampling flags become the
/// defaults of requests that do not set a field; `-n` the default `max_tokens`), plus the
/// server's own. No prompt or statistics flags: prompts come from the clients, statistics
/// from `/metrics`.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    #[command(flatten)]
    pub engine: super::engine_args::EngineArgs,
    /// Address to listen on. Anything but loopback without --api-key prints a warning.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on every endpoint but /health.
    #[arg(long, conflicts_with = "api_key_file")]
    pub api_key: Option<String>,
    /// Read the API key from this file (its first line), so it stays out of `ps`.
    #[arg(long)]
    pub api_key_file: Option<PathBuf>,
    /// Requests that may wait besides the running ones (and those free slots take at the next
    /// step); more are answered 503 with Retry-After.
    #[arg(long, default_value_t = 16)]
    pub queue: usize,
    /// Slots: requests decoded together, each decode step one forward pass over all of them
    /// (a MoE layer reads the union of their experts once); prompts join between steps and are
    /// prefilled in chunks of at most -b rows shared with the decoding slots. A given N splits
    /// the context (-c) evenly among the slots unless --kv-unified. Unset: 4 slots sharing
    /// the whole context (as llama-server), or 1 with speculative decoding or on a GPU where
    /// 4 whole-context KV caches would take over an eighth of its memory.
    #[arg(long, visible_alias = "np", value_parser = clap::value_parser!(u16).range(1..))]
    pub parallel: Option<u16>,
    /// With --parallel N: the slots share one pool of -c positions (a request may use the
    /// whole context while the others leave room) instead of -c / N each.
    #[arg(long, visible_alias = "kvu")]
    pub kv_unified: bool,
    /// The name the model is served as (`/v1/models`, the `model` of responses); default:
    /// the file or folder name of -m.
    #[arg(long, value_parser = parse_alias)]
    pub alias: Option<String>,
    /// Host names requests may carry in `Host` besides localhost, loopback and the bound
    /// address (comma-separated, repeatable; `*`: any). Others get 403 (DNS rebinding).
    #[arg(long, value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,
    /// Origins whose web pages may call the server (CORS; comma-separated, repeatable; `*`:
    /// any). None by default.
    #[arg(long, value_delimiter = ',', value_parser = parse_origin)]
    pub cors_origin: Vec<String>,
    /// Wall limit of one request in seconds, queue included (0: none); past it a whole
    /// answer is 504, a stream ends with an error event.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Seconds a connection may take to send a request's headers, and may stay idle between
    /// requests; then it is closed.
    #[arg(long, default_value_t = 30)]
    pub idle_timeout: u64,
    /// Seconds a streaming client may leave its events unread (its socket full) before its
    /// generation is cut, freeing its slot; the stream then ends with a `write_timeout` error.
    #[arg(long, default_value_t = 60)]
    pub write_timeout: u64,
    /// Largest request body (e.g. 4M); one declared larger is refused with 413 at once, before
    /// being read, one sent without a length as soon as it passes the limit.
    #[arg(long, default_value = "4M", value_parser = parse_size)]
    pub body_limit: u64,
    /// Seconds a request's whole body may take to arrive after its headers; a slower one is
    /// answered 408 and its connection closed.
    #[arg(long, default_value_t = 10)]
    pub body_timeout: u64,
}

/// Slots unset: llama-server's default (4 slots over one shared context, at most `-b`).
pub const AUTO_SLOTS: usize = 4;

/// Whether the default keeps 1 slot on a GPU: there each slot's KV cache takes its whole
/// context at its first use, so [`AUTO_SLOTS`] caches of `kv_bytes` each must fit in an
/// eighth of the device's `device_bytes` (unknown memory keeps 1 slot). Above that, more
/// slots are asked for explicitly (`--parallel N`).
pub fn gpu_keeps_one_slot(kv_bytes: u64, device_bytes: u64) -> bool {
    (AUTO_SLOTS as u64).saturating_mul(kv_bytes) > device_bytes / 8
}

/// The slots and how they divide the context: `--parallel N` (`explicit`) splits it evenly
/// unless `--kv-unified`; unset, [`AUTO_SLOTS`] share it, or 1 slot where `one` (speculative
/// decoding runs one request at a time; [`gpu_keeps_one_slot`]).
pub fn slots_for(
    explicit: Option<usize>,
    kv_unified: bool,
    one: bool,
    batch_size: usize,
) -> (usize, SlotContext) {
    match explicit {
        Some(n) if kv_unified => (n, SlotContext::Shared),
        Some(n) => (n, SlotContext::Split),
        None if one => (1, SlotContext::Split),
        None => (AUTO_SLOTS.min(batch_size.max(1)), SlotContext::Shared),
    }
}

/// The start-up line that says how the slots divide the context of `n_ctx` positions.
pub fn slots_line(parallel: usize, how: SlotContext, n_ctx: usize) -> String {
    match how {
        SlotContext::Split => format!(
            "{parallel} slots of {} tokens each (-c {n_ctx} split evenly)",
            crate::engine::slots::slot_ctx(n_ctx, parallel)
        ),
        SlotContext::Shared => {
            format!("{parallel} slots sharing a context of {n_ctx} tokens (--kv-unified)")
        }
    }
}

/// `--alias`: a non-empty id (clients send it as `model`; an empty one names nothing).
fn parse_alias(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err("the model id is empty; give the name clients send as \"model\"".into());
    }
    Ok(s.to_string())
}

fn parse_origin(s: &str) -> Result<String, String> {
    if crate::serve::guard::valid_origin(s) {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{s:?} is not an origin (scheme://host[:port], or *)"
        ))
    }
}

/// Runs `deltafin serve`.
pub fn run(a: ServeArgs) -> Result<()> {
    let api_key = match (&a.api_key, &a.api_key_file) {
        (Some(k), _) => Some(k.clone()),
        (None, Some(p)) => {
            let s = std::fs::read_to_string(p)
                .with_context(|| format!("reading the API key from {}", p.display()))?;
            let k = s.lines().next().unwrap_or("").trim().to_string();
            if k.is_empty() {
                bail!("{}: the API key file is empty", p.display());
            }
            Some(k)
        }
        (None, None) => None,
    };
    if api_key.as_deref() == Some("") {
        bail!("--api-key is empty");
    }
    let explicit = a.parallel.map(usize::from);
    let parallel = explicit.unwrap_or(1);
    if parallel > 1 && a.engine.spec.enabled() {
        bail!(
            "--parallel {parallel} does not combine with speculative decoding (--lookup, \
             --draft-model, --draft): speculation runs one request at a time"
        );
    }
    if parallel > a.engine.memory.batch_size {
        bail!(
            "--parallel {parallel} is more than -b {}: each decode step takes a row per slot",
            a.engine.memory.batch_size
        );
    }
    let (mut engine, model_id) = a.engine.load_engine(4096, false)?;
    let p = engine.session.model.placement();
    let gpu_tight = p.kv_on_device && gpu_keeps_one_slot(p.kv_bytes as u64, p.device_bytes);
    let (parallel, slot_context) = slots_for(
        explicit,
        a.kv_unified,
        a.engine.spec.enabled() || gpu_tight,
        a.engine.memory.batch_size,
    );
    // said when asked for; the default's slots are in /props (the first line stays
    // "serving …", which scripts wait for)
    if explicit.is_some_and(|n| n > 1) {
        eprintln!("{}", slots_line(parallel, slot_context, engine.n_ctx()));
    }
    engine.default_max_tokens = Some(a.engine.sampling.max_tokens);
    serve(
        engine,
        ServeOptions {
            host: a.host,
            port: a.port,
            api_key,
            queue: a.queue,
            parallel,
            slot_context,
            body_limit: usize::try_from(a.body_limit).unwrap_or(usize::MAX),
            model_id: a.alias.unwrap_or(model_id),
            seed: a.engine.sampling.seed,
            allowed_hosts: a.allowed_hosts,
            cors_origins: a.cors_origin,
            timeout: (a.timeout > 0).then(|| std::time::Duration::from_secs(a.timeout)),
            idle_timeout: std::time::Duration::from_secs(a.idle_timeout.max(1)),
            write_timeout: std::time::Duration::from_secs(a.write_timeout.max(1)),
            body_timeout: std::time::Duration::from_secs(a.body_timeout.max(1)),
        },
    )
}
