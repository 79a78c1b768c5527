//! The HTTP routes: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /health`,
//! `GET /metrics`, and those of [`super::info`] (`/v1/models`, `/tokenize`, `/detokenize`,
//! `/props`); request checking, prompt rendering and tokenization, the API key. Answering (a
//! whole body or a stream of server-sent events) is [`super::answer`].

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Extension, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};

use super::access;
use super::admit::{self, Deadline};
use super::answer::answer;
use super::error::ApiError;
use super::guard;
use super::info::{self, Prompt};
use super::messages;
use super::sse::{Head, Kind};
use super::state::parse;
pub use super::state::AppState;
use super::steer;
use super::types::{self, ChatRequest, Common, CompletionRequest, StopField};
use crate::engine::tools::ToolFormat;
use crate::engine::Params;

/// The wall clock in seconds since the epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The router over `state`, with the API key check, the checks of [`guard`] (Host,
/// content type, CORS), the deadline ([`admit`]), request metrics, the request log
/// ([`access`]) and the body limit.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(info::models))
        .route("/v1/models/{*id}", get(info::model))
        .route("/tokenize", post(info::tokenize))
        .route("/detokenize", post(info::detokenize))
        .route("/props", get(info::props))
        .route(
            "/health",
            get(|| async { axum::Json(json!({"status": "ok"})) }),
        )
        .route("/metrics", get(metrics))
        .fallback(|| async {
            ApiError::new(StatusCode::NOT_FOUND, "not_found_error", "no such endpoint")
        })
        .method_not_allowed_fallback(|req: Request| async move {
            let m = req.method().clone();
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request_error",
                format!("{m} is not allowed on {}", req.uri().path()),
            )
            .code("method_not_allowed")
        })
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            super::upload::read_body,
        ))
        .layer(middleware::from_fn(guard::json_only))
        .layer(middleware::from_fn_with_state(Arc::clone(&state), auth))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            admit::deadline,
        ))
        .layer(guard::cors(&state.cors_origins))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state.hosts),
            guard::check_host,
        ))
        .layer(middleware::from_fn_with_state(Arc::clone(&state), count))
        .layer(middleware::from_fn(access::log_requests))
        .layer(DefaultBodyLimit::max(state.body_limit))
        .with_state(state)
}

/// Counts every answer by path and status.
async fn count(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let path = match req.uri().path() {
        p @ ("/v1/chat/completions"
        | "/v1/completions"
        | "/v1/models"
        | "/health"
        | "/metrics"
        | "/tokenize"
        | "/detokenize"
        | "/props") => p.to_string(),
        p if p.starts_with("/v1/models/") => "/v1/models/{id}".to_string(),
        _ => "other".to_string(),
    };
    let r = next.run(req).await;
    s.metrics.request(&path, r.status().as_u16());
    r
}

/// SHA-256 of `b`: keys are compared through their digests, so the comparison takes the same
/// time whatever the length or content of the presented key.
fn digest(b: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    let mut out = [0u8; 32];
    out.copy_from_slice(&sha2::Sha256::digest(b));
    out
}

/// The credentials of an `Authorization` value of the `Bearer` scheme, whose name is
/// case-insensitive (RFC 9110 §11.1): `bearer KEY` is `Bearer KEY`.
fn bearer(v: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = v.split_at_checked(7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| rest.trim_ascii_start())
}

/// Requires `Authorization: Bearer KEY` when the server has a key (not for `/health`).
async fn auth(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    use subtle::ConstantTimeEq;
    if let Some(key) = &s.api_key {
        if req.uri().path() != "/health" {
            let given = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| bearer(v.as_bytes()))
                .unwrap_or_default();
            if !bool::from(digest(given)[..].ct_eq(&digest(key.as_bytes())[..])) {
                return ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "authentication_error",
                    "missing or wrong API key: send Authorization: Bearer KEY",
                )
                .code("invalid_api_key")
                .into_response();
            }
        }
    }
    next.run(req).await
}

async fn metrics(State(s): State<Arc<AppState>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.metrics.render(),
    )
        .into_response()
}

/// A request body of type `T` whose fields are all in `accepted` ([`types::check_fields`]):
/// [`parse`], then the field check, then the schema.
fn parse_request<T: serde::de::DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
    accepted: &[&str],
) -> Result<T, ApiError> {
    let v: Value = parse(body)?;
    let Value::Object(mut map) = v else {
        return Err(ApiError::invalid(None, "the body must be a JSON object"));
    };
    types::check_fields(&mut map, accepted)?;
    // counts the schema holds as u32: a bad one is named here (the schema's error does not
    // name its field)
    for key in ["max_tokens", "max_completion_tokens", "n", "top_logprobs"] {
        match map.get(key) {
            Some(v) if !v.is_null() && v.as_u64().is_none_or(|x| x > u32::MAX as u64) => {
                return Err(ApiError::invalid(
                    Some(key),
                    format!(
                        "{key} is {v}, expected a whole number from 0 to {}",
                        u32::MAX
                    ),
                ))
            }
            _ => {}
        }
    }
    types::read_as(Value::Object(map), "")
}

fn check<T: PartialOrd + Copy + std::fmt::Display>(
    v: Option<T>,
    param: &str,
    ok: impl Fn(T) -> bool,
    want: &str,
) -> Result<Option<T>, ApiError> {
    match v {
        Some(x) if !ok(x) => Err(ApiError::invalid(
            Some(param),
            format!("{param} is {x}, expected {want}"),
        )),
        _ => Ok(v),
    }
}

/// Most choices (`n`) one request may ask.
const MAX_CHOICES: usize = 16;

/// Sampling parameters of a request: each field it sets replaces the server's default.
fn params(
    s: &AppState,
    c: &Common,
    prompt_len: usize,
    logprobs: Option<usize>,
    tools: Option<ToolFormat>,
) -> Result<Params, ApiError> {
    if let Some(n) = c.n {
        let most = s.queue.capacity().min(MAX_CHOICES);
        if n == 0 || n as usize > most {
            return Err(ApiError::invalid(
                Some("n"),
                format!(
                    "n is {n}, expected 1 to {most} (choices wait in the queue of --queue jobs)"
                ),
            ));
        }
    }
    let mut sc = s.defaults.clone();
    if let Some(t) = check(
        c.temperature,
        "temperature",
        |t| t >= 0.0 && t.is_finite(),
        "a number >= 0",
    )? {
        sc.temperature = t;
    }
    if let Some(p) = check(
        c.top_p,
        "top_p",
        |p| p > 0.0 && p <= 1.0,
        "a number in (0, 1]",
    )? {
        sc.top_p = p;
    }
    if let Some(k) = check(
        c.top_k,
        "top_k",
        |k| k >= 0,
        "an integer >= 0 (0: no limit)",
    )? {
        sc.top_k = k as usize;
    }
    if let Some(p) = check(
        c.min_p,
        "min_p",
        |p| (0.0..=1.0).contains(&p),
        "a number in [0, 1]",
    )? {
        sc.min_p = p;
    }
    let pen = |p: f32| (-2.0..=2.0).contains(&p);
    if let Some(p) = check(
        c.presence_penalty,
        "presence_penalty",
        pen,
        "a number in [-2, 2]",
    )? {
        sc.presence_penalty = p;
    }
    if let Some(p) = check(
        c.frequency_penalty,
        "frequency_penalty",
        pen,
        "a number in [-2, 2]",
    )? {
        sc.frequency_penalty = p;
    }
    if let Some(p) = check(
        c.repetition_penalty,
        "repetition_penalty",
        |p| p > 0.0 && p.is_finite(),
        "a number > 0",
    )? {
        sc.repeat_penalty = p;
    }
    sc.seed = match c.seed {
        Some(v) => v as u64,
        None => s.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        }),
    };
    let room = s.n_ctx.saturating_sub(prompt_len);
    if prompt_len + 1 > s.n_ctx {
        return Err(ApiError::invalid(
            Some("messages"),
            format!(
                "the prompt has {prompt_len} tokens but the context holds {} (at least one \
                 more token is needed to answer)",
                s.n_ctx
            ),
        )
        .code("context_length_exceeded"));
    }
    let max_tokens = match c.max_tokens {
        Some(0) => {
            return Err(ApiError::invalid(
                Some("max_tokens"),
                "max_tokens is 0, expected at least 1",
            ))
        }
        Some(m) => m as usize,
        None => s.default_max_tokens.map_or(room, |m| m.min(room)),
    };
    let stop = match c.stop {
        None => Vec::new(),
        Some(StopField::One(s)) => vec![s.clone()],
        Some(StopField::Many(v)) => v.clone(),
    };
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid(Some("stop"), "a stop string is empty"));
    }
    Ok(Params {
        sampler: sc,
        max_tokens,
        stop,
        logprobs,
        tools,
        steering: Default::default(),
    })
}

/// Renders a chat request through the model's template and tokenizes it the way `run --chat`
/// does ([`ModelTokenizer::encode_messages_json`]): message text (contents, tool calls, tool
/// definitions) stays text, never control tokens; only the template's own markup is control.
async fn chat_prompt(s: &Arc<AppState>, r: &ChatRequest) -> Result<Vec<u32>, ApiError> {
    if s.template.is_none() {
        return Err(ApiError::invalid(
            None,
            "this model has no chat template; use /v1/completions",
        ));
    }
    let tools = r
        .tools
        .as_ref()
        .filter(|t| !t.is_empty())
        .map(|t| Value::Array(t.clone()));
    let bytes = admit::text_bytes(&Value::Array(r.messages.clone()))
        + tools.as_ref().map_or(0, admit::text_bytes);
    s.check_prompt_bytes(bytes, "messages")?;
    let msgs = messages::prepare(&r.messages, s.traits)?;
    let st = Arc::clone(s);
    s.prepare(move || {
        let tmpl = st.template.as_ref().expect("checked above");
        messages::check_rendered(tmpl, &msgs, tools.as_ref())?;
        st.tok
            .encode_messages_json(tmpl, &Value::Array(msgs), tools.as_ref(), true)
            .map_err(|e| ApiError::invalid(Some("messages"), format!("{e:#}")))
    })
    .await?
}

async fn chat(
    State(s): State<Arc<AppState>>,
    Extension(dl): Extension<Deadline>,
    Extension(log): Extension<access::Tokens>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let r: ChatRequest = match parse_request(body, types::CHAT_FIELDS) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    if let Err(e) = r.check_common().and_then(|_| r.check_tools()) {
        return e.into_response();
    }
    if r.parallel_tool_calls == Some(false) {
        return ApiError::invalid(
            Some("parallel_tool_calls"),
            "parallel_tool_calls false is not supported (every call the model writes is returned)",
        )
        .into_response();
    }
    let choice = match &r.tool_choice {
        None => "auto",
        Some(Value::String(c)) if c == "auto" || c == "none" => c.as_str(),
        Some(other) => {
            return ApiError::invalid(
                Some("tool_choice"),
                format!("tool_choice {other} is not supported (only \"auto\" and \"none\")"),
            )
            .into_response()
        }
    };
    let logprobs = match (r.logprobs, r.top_logprobs) {
        (_, Some(n)) if n > 20 => {
            return ApiError::invalid(
                Some("top_logprobs"),
                format!("top_logprobs is {n}, expected 0 to 20"),
            )
            .into_response()
        }
        (true, n) => Some(n.unwrap_or(0) as usize),
        (false, Some(_)) => {
            return ApiError::invalid(Some("top_logprobs"), "top_logprobs needs logprobs: true")
                .into_response()
        }
        (false, None) => None,
    };
    let none = choice == "none";
    let tools = match &r.tools {
        Some(t) if !t.is_empty() && !none => s.tool_format,
        _ => None,
    };
    let prompt = match chat_prompt(&s, &r).await {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let mut p = match params(&s, &r.common(), prompt.len(), logprobs, tools) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    p.steering = match steer::steering(&s, &r.common()).await {
        Ok(st) => st,
        Err(e) => return e.into_response(),
    };
    let head = Head {
        kind: Kind::Chat,
        id: format!("chatcmpl-{}", s.next_id.fetch_add(1, Ordering::Relaxed)),
        created: (s.clock)(),
        model: s.model_id.clone(),
        include_usage: r.include_usage(),
    };
    let n = r.common().n.unwrap_or(1) as usize;
    answer(&s, head, vec![(prompt, p)], n, r.stream, dl, log).await
}

async fn completions(
    State(s): State<Arc<AppState>>,
    Extension(dl): Extension<Deadline>,
    Extension(log): Extension<access::Tokens>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let r: CompletionRequest = match parse_request(body, types::COMPLETION_FIELDS) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    if let Err(e) = r.check_common() {
        return e.into_response();
    }
    if let Some(b) = r.best_of.filter(|&b| b != 1) {
        return ApiError::invalid(
            Some("best_of"),
            format!("best_of is {b}, but this server generates one choice per request (1)"),
        )
        .into_response();
    }
    if r.echo {
        return ApiError::invalid(Some("echo"), "echo is not supported").into_response();
    }
    if r.suffix.as_ref().is_some_and(|x| !x.is_empty()) {
        return ApiError::invalid(Some("suffix"), "suffix is not supported").into_response();
    }
    let read = match info::read_prompts(&r.prompt, s.tok.vocab_size()) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    if let Some(n) = r.logprobs.filter(|&n| n > 20) {
        return ApiError::invalid(
            Some("logprobs"),
            format!("logprobs is {n}, expected 0 to 20"),
        )
        .into_response();
    }
    let n = r.common().n.unwrap_or(1) as usize;
    let most = s.queue.capacity().min(MAX_CHOICES);
    if read.len() > 1 && read.len() * n > most {
        return ApiError::invalid(
            Some("prompt"),
            format!(
                "prompt holds {} prompts of {n} choices each: {} choices, more than the {most} \
                 one request may ask (choices wait in the queue of --queue jobs)",
                read.len(),
                read.len() * n
            ),
        )
        .into_response();
    }
    let steering = match steer::steering(&s, &r.common()).await {
        Ok(st) => st,
        Err(e) => return e.into_response(),
    };
    let several = read.len() > 1;
    let mut prompts = Vec::with_capacity(read.len());
    for (i, prompt) in read.into_iter().enumerate() {
        let at = if several {
            format!("prompt[{i}]")
        } else {
            "prompt".into()
        };
        let prompt = match prompt {
            Prompt::Ids(ids) => ids,
            Prompt::Text(text) => match prompt_text(&s, text).await {
                Ok(p) if !p.is_empty() => p,
                Ok(_) => {
                    let m = if several {
                        format!("{at} is empty")
                    } else {
                        "the prompt is empty".into()
                    };
                    return ApiError::invalid(Some(&at), m).into_response();
                }
                Err(e) => return e.into_response(),
            },
        };
        let mut p = match params(
            &s,
            &r.common(),
            prompt.len(),
            r.logprobs.map(|n| n as usize),
            None,
        ) {
            Ok(p) => p,
            Err(mut e) => {
                if e.param.as_deref() == Some("messages") {
                    if several {
                        e.message = format!("{at}: {}", e.message);
                    }
                    e.param = Some(at);
                }
                return e.into_response();
            }
        };
        p.steering = steering.clone();
        prompts.push((prompt, p));
    }
    let head = Head {
        kind: Kind::Completion,
        id: format!("cmpl-{}", s.next_id.fetch_add(1, Ordering::Relaxed)),
        created: (s.clock)(),
        model: s.model_id.clone(),
        include_usage: r.include_usage(),
    };
    answer(&s, head, prompts, n, r.stream, dl, log).await
}

/// The ids of a raw prompt, bounded as [`admit`] says.
async fn prompt_text(s: &Arc<AppState>, text: String) -> Result<Vec<u32>, ApiError> {
    s.check_prompt_bytes(text.len(), "prompt")?;
    let st = Arc::clone(s);
    s.prepare(move || {
        st.tok
            .encode_prompt(&text, true)
            .map_err(|e| ApiError::invalid(Some("prompt"), format!("{e:#}")))
    })
    .await?
}
