//! The accept loop: HTTP/1.1 connections served by hyper with a header-read timeout, which
//! also bounds how long a kept-alive connection may sit idle (hyper starts the timer whenever
//! the connection waits for a request head), so idle or slow clients do not hold file
//! descriptors; graceful shutdown through hyper-util. An HTTP/1.1 request without `Host` is
//! refused here ([`super::guard::require_host`]).

use std::future::Future;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

/// Serves `app` on `listener` until `shutdown` resolves, then stops accepting and waits for
/// the open connections to finish their requests. A connection that has not sent a whole
/// request head `idle` after connecting or after its last answer is closed.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    idle: Duration,
    shutdown: impl Future<Output = ()>,
) {
    // RFC 9112's Host rule for what comes over the wire
    let app = app.layer(axum::middleware::from_fn(super::guard::require_host));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(idle);
    let mut shutdown = std::pin::pin!(shutdown);
    // out of descriptors, accept fails every 50 ms: say so once a second at most
    let mut warned: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            conn = listener.accept() => {
                let stream = match conn {
                    Ok((s, _)) => s,
                    Err(e) => {
                        // out of descriptors and the like: back off instead of spinning
                        if warned.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                            tracing::warn!("accepting a connection: {e}");
                            warned = Some(tokio::time::Instant::now());
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let svc = TowerToHyperService::new(app.clone());
                let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), svc));
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
            _ = &mut shutdown => break,
        }
    }
    drop(listener);
    graceful.shutdown().await;
}
