//! What keeps a local server from being used by web pages it never meant to serve:
//!
//! - [`check_host`]: the `Host` header must name the server: `localhost`, a loopback address,
//!   the bound address (any IP address when bound to all interfaces), or a name given with
//!   `--allowed-hosts` (`*`: any). A web page that rebinds its own domain name to 127.0.0.1
//!   (DNS rebinding) sends its domain as `Host` and is refused with 403 `host_not_allowed`.
//! - [`json_only`]: a `POST` body must be `Content-Type: application/json` (415 otherwise), so
//!   a page cannot send one as a "simple" cross-site request (`text/plain`) without a CORS
//!   preflight.
//! - [`cors`]: CORS headers only for the origins of `--cors-origin`; `OPTIONS` preflights are
//!   answered (200) for any path, with `Access-Control-Allow-Origin` only for those origins;
//!   the headers a preflight asks for are allowed (reflected).
//! - [`require_host`], [`check_host`]: an HTTP/1.1 request without `Host`, or one with several,
//!   is refused with 400 `invalid_host` (RFC 9112 §3.2).

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

use super::error::ApiError;

/// The hosts a request may name.
#[derive(Clone, Debug)]
pub struct Hosts {
    /// The address the server is bound to, when it is an IP address.
    bound: Option<IpAddr>,
    /// `--allowed-hosts` names, lowercased.
    extra: Vec<String>,
    /// `--allowed-hosts '*'`.
    any: bool,
}

impl Hosts {
    /// The hosts of a server bound to `bind` (an address or `localhost`) with `allowed`
    /// (`--allowed-hosts`) names besides.
    pub fn new(bind: &str, allowed: &[String]) -> Hosts {
        Hosts {
            bound: bind.trim_matches(['[', ']']).parse().ok(),
            extra: allowed.iter().map(|h| h.to_ascii_lowercase()).collect(),
            any: allowed.iter().any(|h| h == "*"),
        }
    }

    /// Whether a `Host` header value (with or without a port) names this server.
    pub fn allows(&self, host: &str) -> bool {
        if self.any {
            return true;
        }
        let name = match host.strip_prefix('[') {
            // [v6]:port
            Some(rest) => rest.split(']').next().unwrap_or(""),
            None => match host.rsplit_once(':') {
                Some((n, port)) if port.bytes().all(|b| b.is_ascii_digit()) => n,
                _ => host,
            },
        }
        .to_ascii_lowercase();
        if name == "localhost" || self.extra.contains(&name) {
            return true;
        }
        match name.parse::<IpAddr>() {
            Ok(ip) => {
                ip.is_loopback()
                    || Some(ip) == self.bound
                    || self.bound.is_some_and(|b| b.is_unspecified())
            }
            Err(_) => false,
        }
    }
}

/// The 400 of a request with several `Host` headers, or of an HTTP/1.1 request without one
/// (RFC 9112 §3.2: a server must answer both with 400).
fn bad_host(m: &str) -> Response {
    ApiError::invalid(None, m)
        .code("invalid_host")
        .into_response()
}

/// Refuses a request with more than one `Host` header (400, RFC 9112 §3.2: only the first
/// would be checked), or whose `Host` does not name the server (403; see the module header).
/// A request without `Host` passes here ([`require_host`] refuses one over HTTP/1.1).
pub async fn check_host(State(h): State<Arc<Hosts>>, req: Request, next: Next) -> Response {
    if req.headers().get_all(header::HOST).iter().count() > 1 {
        return bad_host("the request has several Host headers; send one");
    }
    // an absolute-form target's authority replaces Host (RFC 9112 §3.2.2): it is the name
    // checked then
    let authority = req.uri().authority().map(|a| a.as_str().to_string());
    let host = authority.or_else(|| {
        req.headers()
            .get(header::HOST)
            .map(|v| v.to_str().unwrap_or("").to_string())
    });
    if let Some(host) = host {
        if !h.allows(&host) {
            return ApiError::new(
                StatusCode::FORBIDDEN,
                "invalid_request_error",
                format!(
                    "the host '{host}' does not name this server; serve it under that name \
                     with --allowed-hosts"
                ),
            )
            .code("host_not_allowed")
            .into_response();
        }
    }
    next.run(req).await
}

/// Refuses an HTTP/1.1 request without a `Host` header with 400 (RFC 9112 §3.2); HTTP/1.0
/// requests may omit it. Applied to the connections [`super::listen::serve`] accepts (not in
/// the router, whose requests built in-process carry no `Host`).
pub async fn require_host(req: Request, next: Next) -> Response {
    if req.version() == axum::http::Version::HTTP_11 && !req.headers().contains_key(header::HOST) {
        return bad_host("an HTTP/1.1 request must carry a Host header");
    }
    next.run(req).await
}

/// Refuses a `POST` whose body is not declared `application/json` with 415.
pub async fn json_only(req: Request, next: Next) -> Response {
    if req.method() == Method::POST {
        let ct = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let media = ct.split(';').next().unwrap_or("").trim();
        if !media.eq_ignore_ascii_case("application/json") {
            let got = if ct.is_empty() {
                "none".to_string()
            } else {
                format!("'{ct}'")
            };
            return ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "invalid_request_error",
                format!("the body must be sent as Content-Type: application/json (got {got})"),
            )
            .code("unsupported_media_type")
            .into_response();
        }
    }
    next.run(req).await
}

/// Whether `o` can be a `--cors-origin` value (`*`, or an origin that is a valid header
/// value, such as `https://example.com`).
pub fn valid_origin(o: &str) -> bool {
    o == "*" || HeaderValue::from_str(o).is_ok_and(|_| o.contains("://"))
}

/// The CORS layer for `origins` (`--cors-origin`, checked by [`valid_origin`]; others are
/// skipped; `*`: any origin): preflights answered, `GET` and `POST` allowed from those
/// origins only, with the request headers the preflight names (reflected, as llama-server's
/// and vLLM's CORS middleware do, so SDKs that add their own headers, such as the OpenAI JS
/// SDK's `x-stainless-*`, pass).
pub fn cors(origins: &[String]) -> CorsLayer {
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(
            origins
                .iter()
                .filter_map(|o| HeaderValue::from_str(o.trim_end_matches('/')).ok()),
        )
    };
    CorsLayer::new()
        .allow_origin(allow)
        .allow_methods([Method::GET, Method::POST])
        .allow_headers(AllowHeaders::mirror_request())
        .max_age(std::time::Duration::from_secs(600))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_of_a_loopback_server() {
        let h = Hosts::new("127.0.0.1", &[]);
        for ok in [
            "localhost",
            "LOCALHOST:8080",
            "127.0.0.1:8080",
            "127.0.0.2",
            "[::1]:80",
        ] {
            assert!(h.allows(ok), "{ok}");
        }
        for no in [
            "evil.com",
            "evil.com:8080",
            "10.0.0.1",
            "localhost.evil.com",
        ] {
            assert!(!h.allows(no), "{no}");
        }
        let h = Hosts::new("127.0.0.1", &["box.lan".into()]);
        assert!(h.allows("box.lan:8080") && !h.allows("evil.com"));
        assert!(Hosts::new("127.0.0.1", &["*".into()]).allows("evil.com"));
    }

    #[test]
    fn hosts_of_a_server_on_all_interfaces() {
        let h = Hosts::new("0.0.0.0", &[]);
        assert!(h.allows("192.168.1.5:8080") && h.allows("localhost"));
        assert!(!h.allows("evil.com"));
        let h = Hosts::new("10.0.0.7", &[]);
        assert!(h.allows("10.0.0.7:8080") && !h.allows("10.0.0.8"));
    }
}
