//! The request log: one `tracing` event at info level per request, when its answer is done
//! (a streamed answer when its last event is sent or its client goes away), with the method,
//! path, status, prompt and completion tokens (0 when nothing was generated) and the
//! milliseconds from the request's arrival:
//!
//! `INFO request method=POST path=/v1/completions status=200 prompt_tokens=5 completion_tokens=8 ms=42`
//!
//! `deltafin serve` shows these events on standard error (`cli::init_tracing`); their target
//! is this module's path, `deltafin::serve::access`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, Method};
use axum::middleware::Next;
use axum::response::Response;
use futures_util::StreamExt;

/// The token counts of a generation, filled in by the handler when they are known (at once
/// for a whole answer, at the end of a stream) and read by the log line; a handler puts it in
/// its response's extensions.
#[derive(Clone, Debug, Default)]
pub struct Tokens(Arc<[AtomicUsize; 2]>);

impl Tokens {
    /// Records `prompt` and `completion` tokens.
    pub fn set(&self, prompt: usize, completion: usize) {
        self.0[0].store(prompt, Ordering::Relaxed);
        self.0[1].store(completion, Ordering::Relaxed);
    }

    /// `(prompt, completion)` tokens recorded so far (0 when none).
    pub fn get(&self) -> (usize, usize) {
        (
            self.0[0].load(Ordering::Relaxed),
            self.0[1].load(Ordering::Relaxed),
        )
    }
}

/// One request's log line, written when dropped.
struct Line {
    method: Method,
    path: String,
    status: u16,
    tokens: Tokens,
    start: Instant,
}

impl Drop for Line {
    fn drop(&mut self) {
        let (prompt_tokens, completion_tokens) = self.tokens.get();
        tracing::info!(
            method = %self.method,
            path = %self.path,
            status = self.status,
            prompt_tokens,
            completion_tokens,
            ms = self.start.elapsed().as_millis() as u64,
            "request"
        );
    }
}

/// Middleware logging every request (see the module header).
pub async fn log_requests(req: Request, next: Next) -> Response {
    let start = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let mut r = next.run(req).await;
    let line = Line {
        method,
        path,
        status: r.status().as_u16(),
        tokens: r.extensions_mut().remove::<Tokens>().unwrap_or_default(),
        start,
    };
    let streamed = r
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if !streamed {
        return r;
    }
    // the line goes with the body: written when the stream ends or its client goes away
    let (parts, body) = r.into_parts();
    let body = body.into_data_stream().map(move |chunk| {
        let _ = &line;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(body))
}
