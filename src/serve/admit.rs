//! Bounds on a request's work before the model sees it:
//!
//! - the prompt's size in bytes, checked before any template or tokenizer work: a prompt of
//!   more bytes than the context could hold as tokens (`n_ctx` times the vocabulary's longest
//!   token in bytes, plus 4 per token for normalization) is refused with 400
//!   `context_length_exceeded` ([`AppState::check_prompt_bytes`]);
//! - rendering and tokenizing run off the async threads, at most `--queue` + 1 at a time
//!   (more are answered 503 `queue_full`, as a full queue is): [`AppState::prepare`];
//! - a constraint's size ([`check_grammar_size`]): a JSON schema of more than 5,000 objects or
//!   256 KiB of text, a grammar of more than 256 KiB, is refused with 400 before compiling;
//! - `--timeout`: every request's wall time, from its arrival to its last byte, queue
//!   included ([`deadline`]); a whole answer past it is a 504 `timeout`, a stream past it ends
//!   with an error event, and its generation stops.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use tokio::time::Instant;

use super::error::ApiError;
use super::state::AppState;

/// When the request must be done (`None`: no `--timeout`), in the request's extensions.
#[derive(Clone, Copy, Debug)]
pub struct Deadline(pub Option<Instant>);

/// The error of a request past `--timeout` of `t`.
pub fn timeout_error(t: Option<Duration>) -> ApiError {
    ApiError::new(
        StatusCode::GATEWAY_TIMEOUT,
        "server_error",
        format!(
            "the request ran past the server's --timeout of {} s",
            t.map_or(0, |t| t.as_secs())
        ),
    )
    .code("timeout")
}

/// The 503 of a full queue.
pub fn queue_full() -> ApiError {
    let mut e = ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        "the request queue is full; retry later",
    )
    .code("queue_full");
    e.retry_after = Some(1);
    e
}

/// Puts the request's [`Deadline`] in its extensions and answers 504 when the handler is not
/// done by then (a streamed body keeps to the deadline itself).
pub async fn deadline(State(s): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    let at = s.timeout.map(|t| Instant::now() + t);
    req.extensions_mut().insert(Deadline(at));
    match at {
        None => next.run(req).await,
        Some(at) => match tokio::time::timeout_at(at, next.run(req)).await {
            Ok(r) => r,
            Err(_) => timeout_error(s.timeout).into_response(),
        },
    }
}

/// Bytes of every string inside `v` (object keys included).
pub fn text_bytes(v: &Value) -> usize {
    match v {
        Value::String(s) => s.len(),
        Value::Array(a) => a.iter().map(text_bytes).sum(),
        Value::Object(o) => o.iter().map(|(k, x)| k.len() + text_bytes(x)).sum(),
        _ => 0,
    }
}

/// Most JSON objects (the schema and its subschemas, property definitions included) a
/// `json_schema` may hold: llguidance compiles up to 50,000 before it gives up with `schema
/// too large`, which takes seconds and hundreds of MB per request; OpenAI's structured
/// outputs allow 5,000 object properties in all.
pub const MAX_SCHEMA_OBJECTS: usize = 5_000;

/// Most bytes of text (strings and object keys) a schema, or a grammar, may hold: 256 KiB.
pub const MAX_GRAMMAR_BYTES: usize = 256 * 1024;

/// JSON objects inside `v`, `v` included.
fn objects(v: &Value) -> usize {
    match v {
        Value::Array(a) => a.iter().map(objects).sum(),
        Value::Object(o) => 1 + o.values().map(objects).sum::<usize>(),
        _ => 0,
    }
}

/// Refuses, before any compiling, a constraint too large to compile cheaply: a JSON schema of
/// more than [`MAX_SCHEMA_OBJECTS`] objects or [`MAX_GRAMMAR_BYTES`] bytes of text, a
/// grammar of more than [`MAX_GRAMMAR_BYTES`] bytes. Errors: 400 naming `field`, code
/// `grammar_too_large`.
pub fn check_grammar_size(field: &str, spec: &crate::engine::GrammarSpec) -> Result<(), ApiError> {
    use crate::engine::GrammarSpec;
    let (what, bytes, objs) = match spec {
        GrammarSpec::JsonSchema(v) => ("schema", text_bytes(v), objects(v)),
        GrammarSpec::Lark(g) => ("grammar", g.len(), 0),
        GrammarSpec::JsonObject => return Ok(()),
    };
    let too = if objs > MAX_SCHEMA_OBJECTS {
        format!("{objs} objects (at most {MAX_SCHEMA_OBJECTS})")
    } else if bytes > MAX_GRAMMAR_BYTES {
        format!("{bytes} bytes of text (at most {MAX_GRAMMAR_BYTES})")
    } else {
        return Ok(());
    };
    Err(ApiError::invalid(
        Some(field),
        format!("{field}: the {what} is too large to compile: {too}"),
    )
    .code("grammar_too_large"))
}

/// Bytes a prompt may have: `n_ctx` tokens of at most the longest token's bytes plus 4.
pub fn prompt_byte_limit(tok: &crate::tokenizer::ModelTokenizer, n_ctx: usize) -> usize {
    let longest = (0..tok.vocab_size() as u32)
        .map(|t| tok.token_text(t).len())
        .max()
        .unwrap_or(0);
    n_ctx.saturating_mul(longest + 4)
}

impl AppState {
    /// Refuses a prompt of `bytes` bytes that cannot fit the context (see the module
    /// header); `param` names the field.
    pub fn check_prompt_bytes(&self, bytes: usize, param: &str) -> Result<(), ApiError> {
        if bytes <= self.prompt_bytes {
            return Ok(());
        }
        Err(ApiError::invalid(
            Some(param),
            format!(
                "the prompt has {bytes} bytes, more than the context of {} tokens can hold (at \
                 most {} bytes); refused before tokenizing",
                self.n_ctx, self.prompt_bytes
            ),
        )
        .code("context_length_exceeded"))
    }

    /// Runs `job` (rendering, tokenizing) on a blocking thread, if fewer than `--queue` + 1
    /// jobs are running. Errors: 503 `queue_full`; 500 if the job panicked.
    pub async fn prepare<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, ApiError> {
        let _permit = self.prep.try_acquire().map_err(|_| queue_full())?;
        tokio::task::spawn_blocking(job).await.map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                format!("preparing the prompt failed: {e}"),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::GrammarSpec;

    #[test]
    fn schemas_and_grammars_too_large_are_refused_before_compiling() {
        let props = |n: usize| {
            let p: serde_json::Map<String, Value> = (0..n)
                .map(|i| (format!("p{i}"), serde_json::json!({"type": "string"})))
                .collect();
            GrammarSpec::JsonSchema(serde_json::json!({"type": "object", "properties": p}))
        };
        // the schema, its `properties` object and one object per property
        assert!(check_grammar_size("json_schema", &props(4998)).is_ok());
        let e = check_grammar_size("json_schema", &props(4999)).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("json_schema"));
        assert_eq!(e.code, Some("grammar_too_large"));
        assert_eq!(
            e.message,
            "json_schema: the schema is too large to compile: 5001 objects (at most 5000)"
        );
        let long = GrammarSpec::JsonSchema(serde_json::json!({"enum": ["x".repeat(300_000)]}));
        let e = check_grammar_size("response_format", &long).unwrap_err();
        assert_eq!(
            e.message,
            "response_format: the schema is too large to compile: 300004 bytes of text (at \
             most 262144)"
        );
        let g = GrammarSpec::Lark(format!("start: \"{}\"", "a".repeat(MAX_GRAMMAR_BYTES)));
        assert!(check_grammar_size("grammar", &g).is_err());
        assert!(check_grammar_size("grammar", &GrammarSpec::JsonObject).is_ok());
    }
}
