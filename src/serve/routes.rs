//! The HTTP routes: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /health`,
//! `GET /metrics`, and those of [`super::info`] (`/v1/models`, `/tokenize`, `/detokenize`,
//! `/props`); request checking, prompt rendering and tokenization, the API key, and answering
//! with a whole body or a stream of server-sent events.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Extension, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::access::{self, Tokens};
use super::admit::{self, Deadline};
use super::error::ApiError;
use super::guard;
use super::info::{self, Prompt};
use super::messages;
use super::reading::Reading;
use super::sse::{self, Head, Kind};
use super::state::parse;
pub use super::state::AppState;
use super::steer;
use super::types::{self, ChatRequest, Common, CompletionRequest, StopField};
use super::worker::{Event, Job, SubmitError};
use crate::engine::tools::ToolFormat;
use crate::engine::{Chunk, FinishReason, Outcome, Params, TokenLogprob};

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
        .route("/v1/models/{id}", get(info::model))
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

/// Requires `Authorization: Bearer KEY` when the server has a key (not for `/health`).
async fn auth(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    use subtle::ConstantTimeEq;
    if let Some(key) = &s.api_key {
        if req.uri().path() != "/health" {
            let given = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
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
    serde_json::from_value(Value::Object(map)).map_err(|e| {
        ApiError::invalid(
            None,
            format!("the body does not match the request schema: {e}"),
        )
    })
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
        st.tok
            .encode_messages_json(tmpl, &Value::Array(msgs), tools.as_ref(), true)
            .map_err(|e| ApiError::invalid(Some("messages"), format!("{e:#}")))
    })
    .await?
}

async fn chat(
    State(s): State<Arc<AppState>>,
    Extension(dl): Extension<Deadline>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let r: ChatRequest = match parse_request(body, types::CHAT_FIELDS) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
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
    answer(&s, head, prompt, p, n, r.stream, dl).await
}

async fn completions(
    State(s): State<Arc<AppState>>,
    Extension(dl): Extension<Deadline>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let r: CompletionRequest = match parse_request(body, types::COMPLETION_FIELDS) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
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
    let prompt = match info::read_prompt(&r.prompt, s.tok.vocab_size()) {
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
    let prompt = match prompt {
        Prompt::Ids(ids) => ids,
        Prompt::Text(text) => match prompt_text(&s, text).await {
            Ok(p) if !p.is_empty() => p,
            Ok(_) => {
                return ApiError::invalid(Some("prompt"), "the prompt is empty").into_response()
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
                e.param = Some("prompt".into());
            }
            return e.into_response();
        }
    };
    p.steering = match steer::steering(&s, &r.common()).await {
        Ok(st) => st,
        Err(e) => return e.into_response(),
    };
    let head = Head {
        kind: Kind::Completion,
        id: format!("cmpl-{}", s.next_id.fetch_add(1, Ordering::Relaxed)),
        created: (s.clock)(),
        model: s.model_id.clone(),
        include_usage: r.include_usage(),
    };
    let n = r.common().n.unwrap_or(1) as usize;
    answer(&s, head, prompt, p, n, r.stream, dl).await
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

/// The events of a request's choices, each with its choice's index.
enum Events {
    /// One choice: its job's events.
    One(mpsc::UnboundedReceiver<Event>),
    /// Several: their events merged by forwarding tasks.
    Many(mpsc::UnboundedReceiver<(usize, Event)>),
}

impl Events {
    /// The choices' receivers as one: `rxs` in order of index. With several, each is
    /// forwarded by a task that ends (dropping its receiver, which cancels its job) when
    /// the merged receiver is dropped.
    fn merge(mut rxs: Vec<mpsc::UnboundedReceiver<Event>>) -> Events {
        if rxs.len() == 1 {
            return Events::One(rxs.pop().expect("one"));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        for (i, mut r) in rxs.into_iter().enumerate() {
            let tx = tx.clone();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        ev = r.recv() => match ev {
                            Some(ev) => if tx.send((i, ev)).is_err() { break },
                            None => break,
                        },
                        _ = tx.closed() => break,
                    }
                }
            });
        }
        Events::Many(rx)
    }

    async fn recv(&mut self) -> Option<(usize, Event)> {
        match self {
            Events::One(r) => r.recv().await.map(|e| (0, e)),
            Events::Many(r) => r.recv().await,
        }
    }
}

/// Queues the request's `n` choices (choice `i` sampled with the request's seed plus `i`)
/// and answers: the whole body, or a stream of events (ended at the deadline).
async fn answer(
    s: &AppState,
    head: Head,
    prompt: Vec<u32>,
    p: Params,
    n: usize,
    stream: bool,
    dl: Deadline,
) -> Response {
    let want_lp = p.logprobs.is_some();
    let reading = stream.then(|| Arc::new(Reading::default()));
    let mut rxs = Vec::with_capacity(n);
    let jobs = (0..n)
        .map(|i| {
            let (tx, rx) = mpsc::unbounded_channel();
            rxs.push(rx);
            let mut params = p.clone();
            params.sampler.seed = params.sampler.seed.wrapping_add(i as u64);
            Job {
                prompt: prompt.clone(),
                params,
                reading: reading.clone(),
                events: tx,
            }
        })
        .collect();
    match s.queue.submit_all(jobs) {
        Ok(()) => {}
        Err(SubmitError::Full) => return admit::queue_full().into_response(),
        Err(SubmitError::Stopped) => {
            return ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "the server is stopping",
            )
            .into_response()
        }
    }
    let rx = Events::merge(rxs);
    if stream {
        let reading = reading.expect("made for streams");
        return stream_response(head, rx, n, want_lp, reading, dl.0, s.timeout);
    }
    whole(head, rx, n, want_lp).await
}

async fn whole(head: Head, mut rx: Events, n: usize, want_lp: bool) -> Response {
    let mut texts = vec![String::new(); n];
    let mut lps: Vec<Vec<TokenLogprob>> = vec![Vec::new(); n];
    let mut outcomes: Vec<Option<Outcome>> = vec![None; n];
    let mut left = n;
    while let Some((i, ev)) = rx.recv().await {
        match ev {
            Event::Chunk(Chunk { text: t, logprobs }) => {
                texts[i].push_str(&t);
                lps[i].extend(logprobs);
            }
            Event::Done(o) if o.finish == FinishReason::Cancelled => {
                return shutdown_error().into_response()
            }
            Event::Done(o) => {
                outcomes[i] = Some(o);
                left -= 1;
                if left > 0 {
                    continue;
                }
                let choices: Vec<(String, Option<Value>, Outcome)> = texts
                    .into_iter()
                    .zip(lps)
                    .zip(outcomes)
                    .map(|((t, l), o)| {
                        let lp = want_lp.then(|| sse::logprobs(head.kind, &l, 0));
                        (t, lp, o.expect("every choice ended"))
                    })
                    .collect();
                let all: Vec<&Outcome> = choices.iter().map(|c| &c.2).collect();
                let u = sse::total_usage(&all);
                let mut r = axum::Json(head.complete_all(&choices)).into_response();
                let tokens = Tokens::default();
                tokens.set(u.prompt_tokens, u.completion_tokens);
                r.extensions_mut().insert(tokens);
                return r;
            }
            Event::Error(m) => {
                return ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", m)
                    .into_response()
            }
        }
    }
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        "the model stopped",
    )
    .into_response()
}

/// State of an event stream being written.
struct Streaming {
    head: Head,
    rx: Events,
    want_lp: bool,
    /// Per choice: bytes of text sent (the legacy logprobs' `text_offset`).
    offset: Vec<usize>,
    /// The choices' outcomes as they end; the stream ends with the last.
    outcomes: Vec<Option<Outcome>>,
    /// Events ready to send, in order.
    out: std::collections::VecDeque<String>,
    ended: bool,
    /// Filled in at the end, for the request log.
    tokens: Tokens,
    /// What the client took, for the write timeout.
    reading: Arc<Reading>,
}

impl Streaming {
    fn on(&mut self, ev: Option<(usize, Event)>) {
        if let Some((_, Event::Chunk(_))) = &ev {
            self.reading.took();
        }
        match ev {
            Some((i, Event::Chunk(c))) => {
                let lp = self
                    .want_lp
                    .then(|| sse::logprobs(self.head.kind, &c.logprobs, self.offset[i]));
                self.offset[i] += c.text.len();
                let delta = json!({"content": c.text});
                self.out
                    .push_back(sse::event(&self.head.chunk_of(i, delta, lp, None)));
            }
            Some((i, Event::Done(o))) => self.done(i, o),
            Some((_, Event::Error(m))) => {
                self.fail(ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    m,
                ));
            }
            // the worker dropped the job without ending it: the server is stopping
            None => self.fail(shutdown_error()),
        }
    }

    /// Ends the stream with an error event (then `[DONE]`).
    fn fail(&mut self, e: ApiError) {
        self.out.push_back(sse::event(&e.body()));
        self.out.push_back(sse::DONE.into());
        self.ended = true;
    }

    /// Choice `i` ended as `o`: its tool calls and finish chunk; after the last choice, the
    /// usage (when asked) and `[DONE]`.
    fn done(&mut self, i: usize, o: Outcome) {
        if o.finish == FinishReason::Cancelled {
            // the handler still listens, so the client stopped reading or the server is
            // stopping: not a normal end
            self.tokens.set(o.prompt_tokens, o.completion_tokens);
            let e = if self.reading.was_cut() {
                ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "timeout",
                    "the client did not read the stream within --write-timeout: the generation was cut short",
                )
                .code("write_timeout")
            } else {
                shutdown_error()
            };
            return self.fail(e);
        }
        if !o.tool_calls.is_empty() {
            let delta = json!({"tool_calls": sse::tool_calls(&o.tool_calls, true)});
            self.out
                .push_back(sse::event(&self.head.chunk_of(i, delta, None, None)));
        }
        let delta = json!({});
        let finish = Some(o.finish.as_str());
        self.out
            .push_back(sse::event(&self.head.chunk_of(i, delta, None, finish)));
        self.outcomes[i] = Some(o);
        if self.outcomes.iter().any(Option::is_none) {
            return;
        }
        let all: Vec<&Outcome> = self.outcomes.iter().flatten().collect();
        let u = sse::total_usage(&all);
        self.tokens.set(u.prompt_tokens, u.completion_tokens);
        if self.head.include_usage {
            self.out.push_back(sse::event(&self.head.usage_chunk(&u)));
        }
        self.out.push_back(sse::DONE.into());
        self.ended = true;
    }
}

/// The error of a generation cut by the server stopping.
fn shutdown_error() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        "the server is stopping: the generation was cut short",
    )
    .code("server_shutdown")
}

fn stream_response(
    head: Head,
    rx: Events,
    n: usize,
    want_lp: bool,
    reading: Arc<Reading>,
    deadline: Option<tokio::time::Instant>,
    timeout: Option<std::time::Duration>,
) -> Response {
    let mut first = std::collections::VecDeque::new();
    let role = match head.kind {
        Kind::Chat => json!({"role": "assistant", "content": ""}),
        Kind::Completion => json!({"content": ""}),
    };
    if head.kind == Kind::Chat {
        for i in 0..n {
            first.push_back(sse::event(&head.chunk_of(i, role.clone(), None, None)));
        }
    }
    let st = Streaming {
        head,
        rx,
        want_lp,
        offset: vec![0; n],
        outcomes: vec![None; n],
        reading,
        out: first,
        ended: false,
        tokens: Tokens::default(),
    };
    let tokens = st.tokens.clone();
    let body = futures_util::stream::unfold(st, move |mut st| async move {
        loop {
            if let Some(e) = st.out.pop_front() {
                return Some((Ok::<_, Infallible>(Bytes::from(e)), st));
            }
            if st.ended {
                return None;
            }
            let ev = match deadline {
                None => st.rx.recv().await,
                Some(at) => match tokio::time::timeout_at(at, st.rx.recv()).await {
                    Ok(ev) => ev,
                    Err(_) => {
                        st.fail(admit::timeout_error(timeout));
                        continue;
                    }
                },
            };
            st.on(ev);
        }
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .extension(tokens)
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}
