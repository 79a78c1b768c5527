//! What every handler shares ([`AppState`]) and the parsing of a request body ([`parse`]), apart
//! from the routes so that the modules the routes call (`admit`, `info`) can take them without
//! importing the routes back.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;

use super::error::ApiError;
use super::guard;
use super::messages::TemplateTraits;
use super::metrics::Metrics;
use super::worker::Queue;
use crate::engine::tools::ToolFormat;
use crate::engine::{Guide, SamplerConfig};
use crate::tokenizer::chat::ChatTemplate;
use crate::tokenizer::ModelTokenizer;

/// What every handler shares.
pub struct AppState {
    /// The one model's id (`GET /v1/models`, `--alias`); every request is answered by this
    /// model whatever its `model` names, and responses carry this id.
    pub model_id: String,
    pub tok: Arc<ModelTokenizer>,
    pub template: Option<Arc<ChatTemplate>>,
    /// The template's tool-call syntax, when it has one.
    pub tool_format: Option<ToolFormat>,
    /// How the template takes content parts and the `developer` role.
    pub traits: TemplateTraits,
    /// Sampling when a request sets nothing.
    pub defaults: SamplerConfig,
    /// A fixed seed for requests without one (`--seed`); else each request draws one.
    pub seed: Option<u64>,
    /// `max_tokens` of requests that set none (`None`: the rest of the context).
    pub default_max_tokens: Option<usize>,
    /// KV cache capacity in tokens.
    pub n_ctx: usize,
    /// Slots (`--parallel`; 1 when speculating).
    pub slots: usize,
    pub queue: Queue,
    pub metrics: Arc<Metrics>,
    /// The key `Authorization: Bearer` must carry (all endpoints but `/health`).
    pub api_key: Option<String>,
    /// Largest request body in bytes.
    pub body_limit: usize,
    /// Seconds since the epoch for `created` (fixed in tests).
    pub clock: fn() -> u64,
    /// Numbers the response ids.
    pub next_id: AtomicU64,
    /// Most bytes a prompt may have before tokenizing ([`super::admit`]).
    pub prompt_bytes: usize,
    /// Prompts being rendered and tokenized: at most `--queue` + `--parallel` at once.
    pub prep: tokio::sync::Semaphore,
    /// `--timeout`: the wall limit of a request (`None`: none).
    pub timeout: Option<std::time::Duration>,
    /// `--body-timeout`: the time a request's whole body may take to arrive
    /// ([`super::upload`]).
    pub body_timeout: std::time::Duration,
    /// The hosts requests may name ([`guard::check_host`]).
    pub hosts: Arc<guard::Hosts>,
    /// `--cors-origin` values.
    pub cors_origins: Vec<String>,
    /// The grammar compiler of the model's vocabulary, built by the first request that
    /// constrains its output ([`super::steer`]); the message when it cannot be built.
    pub guide: std::sync::OnceLock<Result<Arc<Guide>, String>>,
}

/// The body as JSON of type `T`, or the OpenAI error for a body too large, not JSON, or of
/// the wrong shape.
pub fn parse<T: serde::de::DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let body = body.map_err(|r| {
        let status = r.status();
        let mut e = ApiError::invalid(None, r.body_text());
        e.status = status;
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            e.code = Some("request_too_large");
        }
        e
    })?;
    serde_json::from_slice(&body).map_err(|e| {
        let what = if e.is_syntax() || e.is_eof() {
            "the body is not valid JSON"
        } else {
            "the body does not match the request schema"
        };
        ApiError::invalid(None, format!("{what}: {e}"))
    })
}
