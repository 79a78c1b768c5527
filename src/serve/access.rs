//! The request log: one `tracing` event per request, when its answer is done and its
//! generation has stopped (a streamed answer when its last event is sent or its client goes
//! away; a request cut by `--timeout` or by its client leaving once the model has stopped
//! its generation, so that the line counts the tokens really spent), with the method, path,
//! status, prompt and completion tokens (0 when nothing was generated), the milliseconds from
//! the request's arrival, and the error code of a generation that failed (a stream's status
//! is 200 once its first event is sent, so the code says it failed):
//!
//! `INFO request method=POST path=/v1/completions status=200 prompt_tokens=5 completion_tokens=8 ms=42`
//!
//! `WARN request method=POST path=/v1/completions status=200 prompt_tokens=5 completion_tokens=2 ms=40 error=integrity_error`
//!
//! `deltafin serve` shows these events on standard error (`cli::init_tracing`); their target
//! is this module's path, `deltafin::serve::access`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, Method};
use axum::middleware::Next;
use axum::response::Response;
use futures_util::StreamExt;

/// One request's log record, shared by the log middleware (which puts it in the request's
/// extensions), the handler and the worker's jobs: they fill in the token counts and an
/// error, and the line is written when the last of them lets go (module header).
#[derive(Clone, Debug, Default)]
pub struct Tokens(Arc<Record>);

#[derive(Debug, Default)]
struct Record {
    prompt: AtomicUsize,
    completion: AtomicUsize,
    /// The error code of a failed generation.
    error: Mutex<Option<&'static str>>,
    /// What the middleware knows once the handler answered; the line is written only then.
    line: Mutex<Option<Line>>,
}

/// The request's side of the log line.
#[derive(Debug)]
struct Line {
    method: Method,
    path: String,
    status: u16,
    start: Instant,
}

impl Tokens {
    /// Records `prompt` and `completion` tokens (the request's totals).
    pub fn set(&self, prompt: usize, completion: usize) {
        self.0.prompt.store(prompt, Ordering::Relaxed);
        self.0.completion.store(completion, Ordering::Relaxed);
    }

    /// Records one choice's generation: its prompt (counted once) and its `completion`
    /// tokens, added to the other choices'.
    pub fn add_choice(&self, prompt: usize, completion: usize) {
        self.0.prompt.fetch_max(prompt, Ordering::Relaxed);
        self.0.completion.fetch_add(completion, Ordering::Relaxed);
    }

    /// `(prompt, completion)` tokens recorded so far (0 when none).
    pub fn get(&self) -> (usize, usize) {
        (
            self.0.prompt.load(Ordering::Relaxed),
            self.0.completion.load(Ordering::Relaxed),
        )
    }

    /// Records that the generation failed with error `code` (the first one is kept).
    pub fn fail(&self, code: &'static str) {
        let mut e = self.0.error.lock().unwrap_or_else(|e| e.into_inner());
        e.get_or_insert(code);
    }

    /// The error code recorded, if any.
    pub fn error(&self) -> Option<&'static str> {
        *self.0.error.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Arms the line: written when the last holder drops the record.
    fn arm(&self, line: Line) {
        *self.0.line.lock().unwrap_or_else(|e| e.into_inner()) = Some(line);
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        let Some(l) = self
            .line
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        else {
            return;
        };
        let prompt_tokens = *self.prompt.get_mut();
        let completion_tokens = *self.completion.get_mut();
        let ms = l.start.elapsed().as_millis() as u64;
        match *self.error.get_mut().unwrap_or_else(|e| e.into_inner()) {
            None => tracing::info!(
                method = %l.method,
                path = %l.path,
                status = l.status,
                prompt_tokens,
                completion_tokens,
                ms,
                "request"
            ),
            Some(error) => tracing::warn!(
                method = %l.method,
                path = %l.path,
                status = l.status,
                prompt_tokens,
                completion_tokens,
                ms,
                error,
                "request"
            ),
        }
    }
}

/// Middleware logging every request (see the module header): puts a [`Tokens`] in the
/// request's extensions for the handler and the worker to fill in.
pub async fn log_requests(mut req: Request, next: Next) -> Response {
    let start = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let tokens = Tokens::default();
    req.extensions_mut().insert(tokens.clone());
    let r = next.run(req).await;
    tokens.arm(Line {
        method,
        path,
        status: r.status().as_u16(),
        start,
    });
    let streamed = r
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if !streamed {
        return r;
    }
    // the line goes with the body: written when the stream ends or its client goes away (and
    // the generation has stopped)
    let (parts, body) = r.into_parts();
    let body = body.into_data_stream().map(move |chunk| {
        let _ = &tokens;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_waits_for_every_holder_and_sums_the_choices() {
        let t = Tokens::default();
        let job = t.clone();
        t.arm(Line {
            method: Method::POST,
            path: "/v1/completions".into(),
            status: 504,
            start: Instant::now(),
        });
        drop(t);
        // the worker still holds the record: its counts land before the line is written
        job.add_choice(5, 130);
        job.add_choice(5, 2);
        assert_eq!(job.get(), (5, 132));
        job.fail("integrity_error");
        job.fail("generation_failed");
        assert_eq!(job.error(), Some("integrity_error"));
        assert!(job.0.line.lock().unwrap().is_some());
    }
}
