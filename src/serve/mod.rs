//! `deltafin serve`: an OpenAI-compatible HTTP server (axum on tokio) over one model.
//!
//! - [`routes`]: the endpoints, request checking, API key, body limit; [`answer`]: a queued
//!   request answered whole or streamed (choices, deadline, write timeout);
//! - [`types`]: the request bodies; [`steer`]: `logit_bias`, `ignore_eos` and constrained
//!   output (`response_format`, `grammar`, `json_schema`) checked and compiled, [`gbnf`] reading GBNF grammars into Lark; [`sse`]: response bodies and event-stream framing;
//!   [`error`]: errors in the OpenAI shape;
//! - [`worker`]: the bounded FIFO queue and the model's one thread, which runs the requests
//!   in `--parallel` slots ([`crate::engine::slots`], continuous batching), or one at a time
//!   through [`crate::engine::Engine::generate`] when speculating (the conversation with KV prefix reuse,
//!   logprobs, stop strings, tool calls, cancellation and speculative decoding lives in
//!   [`crate::engine`], with the one generation loop; [`generate`], [`stop`] and [`tools`]
//!   name it here for existing callers);
//! - [`upload`]: the body read within `--body-limit` and `--body-timeout`; [`reading`]: the write timeout (a client that stops reading); [`metrics`]: Prometheus text; [`access`]: the request log (one line per request).

pub mod access;
pub mod admit;
pub mod answer;
pub mod error;
pub mod gbnf;
pub mod guard;
pub mod info;
pub mod listen;
pub mod messages;
pub mod metrics;
pub mod reading;
pub mod routes;
pub mod sse;
pub mod state;
pub mod steer;
pub mod types;
pub mod upload;
pub mod worker;

pub use crate::engine::{stop, tools};

/// The conversation engine's names where the server used to hold them (now
/// [`crate::engine::conversation`]).
pub mod generate {
    pub use crate::engine::conversation::{Chunk, Engine, FinishReason, Outcome, Params};
    pub use crate::engine::logprobs::TokenLogprob;
}

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};

use crate::engine::tools::ToolFormat;
use crate::engine::Engine;
use metrics::Metrics;
use routes::AppState;

pub use crate::engine::slots::SlotContext;

/// How to serve.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Address to bind (`127.0.0.1` by default).
    pub host: String,
    pub port: u16,
    /// Required bearer key (all endpoints but `/health`).
    pub api_key: Option<String>,
    /// Requests that may wait for the model besides the running ones.
    pub queue: usize,
    /// `--parallel`: slots, requests decoded together.
    pub parallel: usize,
    /// How the slots divide the context (`--kv-unified`, or the default 4 slots: one shared
    /// pool; an explicit `--parallel N`: split evenly, [`crate::engine::slots::slot_ctx`]).
    pub slot_context: SlotContext,
    /// Largest request body in bytes.
    pub body_limit: usize,
    /// The id the model is served as (`/v1/models`, the `model` of responses).
    pub model_id: String,
    /// Seed for requests that set none (`None`: drawn per request).
    pub seed: Option<u64>,
    /// `--allowed-hosts`: `Host` names accepted besides loopback and the bound address
    /// (`*`: any).
    pub allowed_hosts: Vec<String>,
    /// `--cors-origin`: origins given CORS headers (`*`: any); none by default.
    pub cors_origins: Vec<String>,
    /// `--timeout`: the wall limit of a request (`None`: none).
    pub timeout: Option<std::time::Duration>,
    /// `--write-timeout`: a stream whose client reads nothing for this long while events wait
    /// is cancelled ([`reading`]).
    pub write_timeout: std::time::Duration,
    /// `--idle-timeout`: a connection that sends no whole request head this long after
    /// connecting or after its last answer is closed.
    pub idle_timeout: std::time::Duration,
    /// `--body-timeout`: a request whose whole body has not arrived this long after its head
    /// is answered 408 ([`upload`]).
    pub body_timeout: std::time::Duration,
}

/// Starts the worker over `engine` and returns the shared state (with `clock` for `created`)
/// and what stops it: the flag that cancels work, and the worker's handle.
pub fn state(
    engine: Engine,
    opts: &ServeOptions,
    clock: fn() -> u64,
) -> (
    Arc<AppState>,
    Arc<AtomicBool>,
    std::thread::JoinHandle<Engine>,
) {
    let metrics = Arc::new(Metrics::default());
    let stopping = Arc::new(AtomicBool::new(false));
    let tok = Arc::clone(&engine.tok);
    let template = engine.template.clone();
    let tool_format = template
        .as_ref()
        .and_then(|t| ToolFormat::detect(t.source()));
    let traits = template
        .as_ref()
        .map(|t| messages::TemplateTraits::of(t.source()))
        .unwrap_or_default();
    let defaults = engine.defaults.clone();
    let parallel = if engine.spec.is_some() {
        1
    } else {
        opts.parallel.max(1)
    };
    let n_ctx = crate::engine::slots::slot_ctx_for(engine.n_ctx(), parallel, opts.slot_context);
    let prompt_bytes = admit::prompt_byte_limit(&tok, n_ctx);
    let default_max_tokens = engine.default_max_tokens;
    let (queue, handle) = worker::start(
        engine,
        (parallel, opts.slot_context),
        opts.queue,
        opts.write_timeout,
        Arc::clone(&metrics),
        Arc::clone(&stopping),
    );
    let st = AppState {
        model_id: opts.model_id.clone(),
        tok,
        template,
        tool_format,
        traits,
        defaults,
        seed: opts.seed,
        default_max_tokens,
        n_ctx,
        slots: parallel,
        queue,
        metrics,
        api_key: opts.api_key.clone(),
        body_limit: opts.body_limit,
        clock,
        next_id: AtomicU64::new(1),
        prompt_bytes,
        prep: tokio::sync::Semaphore::new(opts.queue.max(1) + parallel),
        timeout: opts.timeout,
        body_timeout: opts.body_timeout,
        hosts: Arc::new(guard::Hosts::new(&opts.host, &opts.allowed_hosts)),
        cors_origins: opts.cors_origins.clone(),
        guide: std::sync::OnceLock::new(),
    };
    (Arc::new(st), stopping, handle)
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// Serves `engine` until SIGINT or SIGTERM: then stops accepting, cancels the running and
/// queued generations (a cut stream ends with an error event `server_shutdown`, a whole
/// answer is a 503) and returns within about two seconds.
///
/// Errors: the address cannot be bound; the runtime cannot start.
pub fn serve(engine: Engine, opts: ServeOptions) -> Result<()> {
    if opts.api_key.is_none()
        && opts.host != "127.0.0.1"
        && opts.host != "localhost"
        && opts.host != "::1"
    {
        eprintln!(
            "warning: serving on {} without --api-key: anyone who can reach this address can use the model",
            opts.host
        );
    }
    let (st, stopping, handle) = state(engine, &opts, routes::unix_now);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async {
        let addr = format!("{}:{}", opts.host, opts.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        eprintln!(
            "serving {} on http://{} (OpenAI API under /v1)",
            opts.model_id,
            listener
                .local_addr()
                .map_or(addr.clone(), |a| a.to_string())
        );
        let app = routes::router(Arc::clone(&st));
        let stop2 = Arc::clone(&stopping);
        let server = listen::serve(listener, app, opts.idle_timeout, async move {
            shutdown_signal().await;
            eprintln!("stopping: cancelling generations");
            stop2.store(true, Ordering::SeqCst);
        });
        let mut server = std::pin::pin!(server);
        tokio::select! {
            _ = &mut server => {},
            _ = async {
                while !stopping.load(Ordering::SeqCst) {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            } => {}
        }
        anyhow::Ok(())
    })?;
    rt.shutdown_timeout(std::time::Duration::from_millis(200));
    drop(st);
    // the worker ends once the last queue handle is gone; do not wait on a stuck connection
    let t = std::time::Instant::now();
    while !handle.is_finished() && t.elapsed() < std::time::Duration::from_secs(1) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Ok(())
}
