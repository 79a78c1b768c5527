//! Answering a queued request: its choices' jobs submitted together ([`answer`]), then the
//! whole body ([`whole`]) or a stream of server-sent events, choice-indexed, ended at the
//! deadline, with the write timeout's bookkeeping ([`Reading`]).

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::access::Tokens;
use super::admit::{self, Deadline};
use super::error::ApiError;
use super::reading::Reading;
use super::sse::{self, Head, Kind};
use super::state::AppState;
use super::worker::{Event, Job, SubmitError};
use crate::engine::{Chunk, FinishReason, Outcome, Params, TokenLogprob};
use std::sync::Arc;

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

/// Queues the request's choices, `n` per prompt of `prompts` (each with its parameters;
/// choice `p × n + i` is prompt `p`'s `i`th, sampled with its seed plus `i`, as OpenAI
/// indexes them) and answers: the whole body, or a stream of events (ended at the deadline).
/// Every job holds the request's log record `log` until it ends ([`super::access`]).
#[allow(clippy::too_many_arguments)]
pub(super) async fn answer(
    s: &AppState,
    head: Head,
    prompts: Vec<(Vec<u32>, Params)>,
    n: usize,
    stream: bool,
    dl: Deadline,
    log: Tokens,
) -> Response {
    let want_lp = prompts.iter().any(|(_, p)| p.logprobs.is_some());
    let reading = stream.then(|| Arc::new(Reading::default()));
    let total = prompts.len() * n;
    let mut rxs = Vec::with_capacity(total);
    let mut jobs = Vec::with_capacity(total);
    for (prompt, p) in &prompts {
        for i in 0..n {
            let (tx, rx) = mpsc::unbounded_channel();
            rxs.push(rx);
            let mut params = p.clone();
            params.sampler.seed = params.sampler.seed.wrapping_add(i as u64);
            jobs.push(Job {
                prompt: prompt.clone(),
                params,
                reading: reading.clone(),
                events: tx,
                log: log.clone(),
            });
        }
    }
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
        return stream_response(head, rx, (total, n), want_lp, reading, dl.0, s.timeout, log);
    }
    whole(head, rx, (total, n), want_lp, &log).await
}

/// The whole answer of `total` choices, `n` per prompt.
async fn whole(
    head: Head,
    mut rx: Events,
    (total, n): (usize, usize),
    want_lp: bool,
    log: &Tokens,
) -> Response {
    let mut texts = vec![String::new(); total];
    let mut lps: Vec<Vec<TokenLogprob>> = vec![Vec::new(); total];
    let mut outcomes: Vec<Option<Outcome>> = vec![None; total];
    let mut left = total;
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
                // the log's totals: each prompt counted once
                let all: Vec<&Outcome> = choices.iter().map(|c| &c.2).collect();
                let u = sse::total_usage(&all, n);
                log.set(u.prompt_tokens, u.completion_tokens);
                return axum::Json(head.complete_all(&choices, n)).into_response();
            }
            Event::Error(code, m) => {
                return ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", m)
                    .code(code)
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
    /// Choices per prompt.
    per_prompt: usize,
    /// Events ready to send, in order.
    out: std::collections::VecDeque<String>,
    ended: bool,
    /// The request's log record (the worker counts the tokens; a failed stream's error code
    /// is recorded here).
    log: Tokens,
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
            Some((_, Event::Error(code, m))) => {
                self.fail(
                    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", m).code(code),
                );
            }
            // the worker dropped the job without ending it: the server is stopping
            None => self.fail(shutdown_error()),
        }
    }

    /// Ends the stream with an error event (then `[DONE]`), its code recorded for the log.
    fn fail(&mut self, e: ApiError) {
        self.log.fail(e.code.unwrap_or("server_error"));
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
        let u = sse::total_usage(&all, self.per_prompt);
        self.log.set(u.prompt_tokens, u.completion_tokens);
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

#[allow(clippy::too_many_arguments)]
fn stream_response(
    head: Head,
    rx: Events,
    (n, per_prompt): (usize, usize),
    want_lp: bool,
    reading: Arc<Reading>,
    deadline: Option<tokio::time::Instant>,
    timeout: Option<std::time::Duration>,
    log: Tokens,
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
        per_prompt,
        reading,
        out: first,
        ended: false,
        log,
    };
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
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}
