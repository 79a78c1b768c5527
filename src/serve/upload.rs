//! Reading a request's body, bounded in size and in time ([`read_body`]), before any handler
//! sees it:
//!
//! - a body declared (`Content-Length`) larger than `--body-limit` is answered 413
//!   `request_too_large` at once, from the header, without reading a byte of it; a body
//!   without a length (chunked) is cut with 413 as soon as it passes the limit;
//! - the whole body must arrive within `--body-timeout` seconds of the request head, else 408
//!   `body_timeout`: a client that sends its body a byte at a time cannot hold a connection
//!   (and its file descriptor) for long. The request's `--timeout` still covers the body too.
//!
//! Both answers carry `Connection: close`: the rest of the body is never read, so the
//! connection cannot serve another request.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;

use super::error::ApiError;
use super::state::AppState;

/// The 413 of a body over `limit` bytes.
pub fn too_large(limit: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "invalid_request_error",
        format!("the request body is larger than the server's --body-limit of {limit} bytes"),
    )
    .code("request_too_large")
}

/// The 408 of a body not received within `t`.
pub fn too_slow(t: Duration) -> ApiError {
    ApiError::new(
        StatusCode::REQUEST_TIMEOUT,
        "invalid_request_error",
        format!(
            "the request body did not arrive within the server's --body-timeout of {} s",
            t.as_secs()
        ),
    )
    .code("body_timeout")
}

/// An error answer that closes the connection (the body is left unread).
fn closing(e: ApiError) -> Response {
    let mut r = e.into_response();
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// Why a body could not be read whole.
#[derive(Debug, PartialEq, Eq)]
pub enum BodyError {
    /// Over the limit (declared or read).
    TooLarge,
    /// Not received within the time allowed.
    TooSlow,
    /// The connection failed while reading (the message).
    Failed(String),
}

/// Reads `body` whole: at most `limit` bytes (a `declared` length above it is refused
/// before reading), within `time`.
pub async fn collect(
    body: Body,
    declared: Option<u64>,
    limit: usize,
    time: Duration,
) -> Result<Bytes, BodyError> {
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(BodyError::TooLarge);
    }
    let read = async {
        let mut chunks = body.into_data_stream();
        let mut out = Vec::with_capacity(declared.unwrap_or(0) as usize);
        while let Some(data) = chunks.next().await {
            let data = data.map_err(|e| BodyError::Failed(e.to_string()))?;
            if out.len() + data.len() > limit {
                return Err(BodyError::TooLarge);
            }
            out.extend_from_slice(&data);
        }
        Ok(Bytes::from(out))
    };
    tokio::time::timeout(time, read)
        .await
        .unwrap_or(Err(BodyError::TooSlow))
}

/// Middleware: replaces the request's body by the bytes read as the module header says, or
/// answers 413 / 408 (with `Connection: close`), or 400 when the connection fails.
pub async fn read_body(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match collect(body, declared, s.body_limit, s.body_timeout).await {
        Ok(bytes) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Err(BodyError::TooLarge) => closing(too_large(s.body_limit)),
        Err(BodyError::TooSlow) => closing(too_slow(s.body_timeout)),
        Err(BodyError::Failed(m)) => closing(ApiError::invalid(
            None,
            format!("reading the request body failed: {m}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn bodies_within_and_over_the_limit() {
        let s = Duration::from_secs(5);
        let b = run(collect(Body::from("{\"a\": 1}"), Some(8), 8, s)).unwrap();
        assert_eq!(&b[..], b"{\"a\": 1}");
        assert_eq!(
            run(collect(Body::from("{}"), Some(999_999_999), 8, s)),
            Err(BodyError::TooLarge),
            "refused from the declared length"
        );
        assert_eq!(
            run(collect(Body::from("123456789"), None, 8, s)),
            Err(BodyError::TooLarge),
            "refused while reading"
        );
    }

    #[test]
    fn a_body_that_never_ends_is_cut() {
        let never =
            Body::from_stream(futures_util::stream::pending::<Result<Bytes, std::io::Error>>());
        let e = run(collect(never, Some(10), 100, Duration::from_millis(50)));
        assert_eq!(e, Err(BodyError::TooSlow));
        assert_eq!(
            too_slow(Duration::from_secs(10)).message,
            "the request body did not arrive within the server's --body-timeout of 10 s"
        );
    }
}
