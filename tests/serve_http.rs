//! `deltafin serve` as a running server spoken to in raw HTTP (`common::http`): the requests
//! clients send (content parts, roles, refused fields), the extra endpoints, and the safety
//! rules (content type, Host, CORS, timeouts, shutdown).

mod common;

use common::http::Server;
use serde_json::{json, Value};

fn chat(messages: Value) -> Value {
    json!({"model": "qwen3_moe", "max_tokens": 4, "messages": messages})
}

/// The error object of a 400 answer.
fn refused(a: &common::http::Answer) -> Value {
    assert_eq!(a.status, 400, "{}", a.body);
    a.json()["error"].clone()
}

/// Content as a list of text parts renders as the parts joined with a space (the fixture's
/// template reads strings only): the same prompt and answer as the joined string. A
/// `developer` message is a system message. Image parts, null content, a tool message without
/// `tool_call_id` and a negative `top_k` are refused by name.
#[test]
fn content_parts_and_roles() {
    let srv = Server::start(&[]);
    let plain = srv
        .post(
            "/v1/chat/completions",
            &chat(json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hello there friend"}])),
        )
        .json();
    let parts = srv
        .post(
            "/v1/chat/completions",
            &chat(json!([
            {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": [{"type": "text", "text": "Hello"},
                {"type": "text", "text": "there friend"}]}])),
        )
        .json();
    assert_eq!(parts["choices"], plain["choices"]);
    assert_eq!(
        parts["usage"]["prompt_tokens"],
        plain["usage"]["prompt_tokens"]
    );
    assert_eq!(plain["usage"]["prompt_tokens"], 43);
    let image = json!([{"role": "user", "content": [{"type": "text", "text": "What is it?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]);
    assert_eq!(
        refused(&srv.post("/v1/chat/completions", &chat(image))),
        json!({"message": "messages[0].content[1] is an image (type 'image_url'), but this \
            model reads text only; send text parts", "type": "invalid_request_error",
            "param": "messages[0].content[1]", "code": null})
    );
    let null = json!([{"role": "user", "content": null}]);
    assert_eq!(
        refused(&srv.post("/v1/chat/completions", &chat(null)))["param"],
        "messages[0].content"
    );
    let tool = json!([{"role": "user", "content": "x"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "42"}]);
    assert_eq!(
        refused(&srv.post("/v1/chat/completions", &chat(tool)))["message"],
        "messages[2] is a tool message without a string \"tool_call_id\""
    );
    let mut k = chat(json!([{"role": "user", "content": "x"}]));
    k["top_k"] = json!(-1);
    assert_eq!(
        refused(&srv.post("/v1/chat/completions", &k)),
        json!({"message": "top_k is -1, expected an integer >= 0 (0: no limit)",
            "type": "invalid_request_error", "param": "top_k", "code": null})
    );
    let mut m = chat(json!([{"role": "user", "content": "x"}]));
    m["max_tokens"] = json!(-1);
    assert_eq!(
        refused(&srv.post("/v1/chat/completions", &m)),
        json!({"message": "max_tokens is -1, expected a whole number from 0 to 4294967295",
            "type": "invalid_request_error", "param": "max_tokens", "code": null})
    );
    m["max_tokens"] = json!(2.5);
    assert_eq!(
        refused(&srv.post("/v1/chat/completions", &m))["param"],
        "max_tokens"
    );
    srv.stop();
}

/// `--alias` names the model; a request naming another model is answered by it (and the
/// answer names it); `/v1/models/{id}`; `prompt` as token ids answers as the same text does;
/// `/tokenize`, `/detokenize` and `/props` in llama-server's shapes.
#[test]
fn alias_prompts_of_ids_and_llama_server_endpoints() {
    let srv = Server::start(&["--alias", "tiny"]);
    let m = srv.get("/v1/models/tiny");
    assert_eq!(m.status, 200, "{}", m.body);
    assert_eq!(m.json()["id"], "tiny");
    let other = srv.get("/v1/models/qwen3_moe");
    assert_eq!(
        (other.status, other.json()["error"]["code"].clone()),
        (404, json!("model_not_found"))
    );
    let tok = srv.post("/tokenize", &json!({"content": "Hi"}));
    assert_eq!(tok.json(), json!({"tokens": [39, 72]}));
    let tok = srv.post("/tokenize", &json!({"content": "Hi", "with_pieces": true}));
    assert_eq!(
        tok.json(),
        json!({"tokens": [{"id": 39, "piece": "H"}, {"id": 72, "piece": "i"}]})
    );
    assert_eq!(
        srv.post("/detokenize", &json!({"tokens": [39, 72]})).json(),
        json!({"content": "Hi"})
    );
    assert_eq!(
        refused(&srv.post("/detokenize", &json!({"tokens": [39, 100000]})))["message"],
        "tokens[1] is 100000, expected a token id below 487 (the vocabulary)"
    );
    let text = srv
        .post(
            "/v1/completions",
            &json!({"model": "gpt-4", "prompt": "Hi", "max_tokens": 3}),
        )
        .json();
    assert_eq!(text["model"], "tiny");
    for ids in [json!([39, 72]), json!([[39, 72]])] {
        let a = srv
            .post("/v1/completions", &json!({"prompt": ids, "max_tokens": 3}))
            .json();
        assert_eq!(a["choices"], text["choices"], "{ids}");
        assert_eq!(a["usage"]["prompt_tokens"], text["usage"]["prompt_tokens"]);
    }
    let p = srv.get("/props").json();
    assert_eq!(p["default_generation_settings"]["n_ctx"], 4096);
    assert_eq!(
        p["default_generation_settings"]["params"]["temperature"],
        0.0
    );
    // no --parallel: llama-server's 4 slots, each able to hold the whole context
    assert_eq!(p["total_slots"], 4);
    assert_eq!(p["model_alias"], "tiny");
    assert_eq!(p["modalities"], json!({"vision": false, "audio": false}));
    assert!(p["chat_template"]
        .as_str()
        .unwrap()
        .contains("<|im_start|>"));
    srv.stop();
}

/// A field the server does not support is refused by name, never ignored; a field set to
/// `null` is absent; `user` is accepted.
#[test]
fn unsupported_fields_are_refused_by_name() {
    let srv = Server::start(&[]);
    let base = chat(json!([{"role": "user", "content": "Hi"}]));
    let with = |k: &str, v: Value| {
        let mut b = base.clone();
        b[k] = v;
        b
    };
    let cases = [
        (
            "logit_bias",
            json!({"x": 5}),
            "logit_bias key \"x\" is not a token id below 487 (the vocabulary)",
        ),
        (
            "frobnicate",
            json!(1),
            "frobnicate is not a parameter this server supports",
        ),
        (
            "prompt",
            json!("x"),
            "prompt belongs to the other endpoint (/v1/completions)",
        ),
        (
            "tool_choice",
            json!("required"),
            "tool_choice \"required\" is not supported (only \"auto\" and \"none\")",
        ),
        (
            "response_format",
            json!({"type": "json_schema"}),
            "response_format type 'json_schema' needs a json_schema object ({\"name\": ..., \
             \"schema\": {...}})",
        ),
    ];
    for (k, v, msg) in cases {
        let e = refused(&srv.post("/v1/chat/completions", &with(k, v)));
        assert_eq!(
            (e["param"].as_str(), e["message"].as_str()),
            (Some(k), Some(msg))
        );
    }
    let ok = srv.post(
        "/v1/chat/completions",
        &with("user", json!("someone"))
            .as_object()
            .map(|o| {
                let mut o = o.clone();
                o.insert("logit_bias".into(), Value::Null);
                Value::Object(o)
            })
            .unwrap(),
    );
    assert_eq!(ok.status, 200, "{}", ok.body);
    let e = refused(&srv.post("/v1/completions", &json!({"prompt": "x", "best_of": 3})));
    assert_eq!(e["param"], "best_of");
    let e = refused(&srv.post("/v1/completions", &json!({"prompt": "x", "messages": []})));
    assert_eq!(
        e["message"],
        "messages belongs to the other endpoint (/v1/chat/completions)"
    );
    srv.stop();
}

/// A `POST` body must be declared JSON (415); `Host` must name the server (403, unless
/// `--allowed-hosts` names it); a 405 has a JSON body.
#[test]
fn content_type_host_and_method_checks() {
    let srv = Server::start(&["--allowed-hosts", "box.lan"]);
    let body = r#"{"prompt": "Hi", "max_tokens": 1}"#;
    let plain = srv.raw(
        "POST /v1/completions HTTP/1.1\r\nContent-Type: text/plain",
        body,
    );
    assert_eq!(plain.status, 415);
    assert_eq!(
        plain.json()["error"],
        json!({"message": "the body must be sent as Content-Type: application/json (got \
            'text/plain')", "type": "invalid_request_error", "param": null,
            "code": "unsupported_media_type"})
    );
    let none = srv.raw("POST /v1/completions HTTP/1.1", body);
    assert_eq!(none.status, 415);
    let charset = srv.raw(
        "POST /v1/completions HTTP/1.1\r\nContent-Type: Application/JSON; charset=utf-8",
        body,
    );
    assert_eq!(charset.status, 200, "{}", charset.body);
    let port = srv.addr.rsplit_once(':').unwrap().1.to_string();
    for (host, status) in [
        (format!("localhost:{port}"), 200),
        (format!("[::1]:{port}"), 200),
        ("box.lan".to_string(), 200),
        (format!("evil.example:{port}"), 403),
    ] {
        let a = srv.raw(&format!("GET /health HTTP/1.1\r\nHost: {host}"), "");
        assert_eq!(a.status, status, "{host}: {}", a.body);
        if status == 403 {
            assert_eq!(a.json()["error"]["code"], "host_not_allowed");
        }
    }
    let get = srv.get("/v1/chat/completions");
    assert_eq!(get.status, 405);
    assert_eq!(
        get.json()["error"],
        json!({"message": "GET is not allowed on /v1/chat/completions",
            "type": "invalid_request_error", "param": null, "code": "method_not_allowed"})
    );
    srv.stop();
}

/// CORS headers only for `--cors-origin` values; a preflight is answered either way.
#[test]
fn cors_only_for_the_origins_given() {
    let preflight = |srv: &Server, origin: &str| {
        srv.raw(
            &format!(
                "OPTIONS /v1/chat/completions HTTP/1.1\r\nOrigin: {origin}\r\n\
                 Access-Control-Request-Method: POST\r\n\
                 Access-Control-Request-Headers: content-type,authorization,x-stainless-os"
            ),
            "",
        )
    };
    let closed = Server::start(&[]);
    let p = preflight(&closed, "https://app.example");
    assert_eq!(p.status, 200);
    assert_eq!(p.header("access-control-allow-origin"), None);
    let g = closed.raw("GET /v1/models HTTP/1.1\r\nOrigin: https://app.example", "");
    assert_eq!(
        (g.status, g.header("access-control-allow-origin")),
        (200, None)
    );
    closed.stop();
    let open = Server::start(&["--cors-origin", "https://app.example"]);
    let p = preflight(&open, "https://app.example");
    assert_eq!(p.status, 200);
    assert_eq!(
        p.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    assert_eq!(p.header("access-control-allow-methods"), Some("GET,POST"));
    // the headers asked for, as asked (the OpenAI JS SDK adds its x-stainless-* headers)
    assert_eq!(
        p.header("access-control-allow-headers"),
        Some("content-type,authorization,x-stainless-os")
    );
    let g = open.raw("GET /v1/models HTTP/1.1\r\nOrigin: https://app.example", "");
    assert_eq!(
        g.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    let other = preflight(&open, "https://evil.example");
    assert_eq!(other.header("access-control-allow-origin"), None);
    open.stop();
}

/// `--idle-timeout` closes a connection that sends no whole request head (silent, or idle
/// after an answer); `--timeout` answers 504 to a request whose body never comes; a prompt of
/// more bytes than the context can hold is refused before tokenizing.
#[test]
fn timeouts_and_the_prompt_bound() {
    use std::io::{Read, Write};
    let srv = Server::start(&["--idle-timeout", "1", "--timeout", "1", "-c", "64"]);
    for sent in ["", "GET /health HTTP/1.1\r\nHost: localhost\r\n"] {
        let mut s = std::net::TcpStream::connect(&srv.addr).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
            .unwrap();
        s.write_all(sent.as_bytes()).unwrap();
        let mut out = Vec::new();
        // the server closes the connection: EOF, with nothing written
        assert_eq!(s.read_to_end(&mut out).unwrap(), 0, "{sent:?}");
    }
    let slow = srv.raw(
        "POST /v1/completions HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 100",
        "{\"prompt\": ",
    );
    assert_eq!(slow.status, 504, "{}", slow.body);
    assert_eq!(
        slow.json()["error"]["message"],
        "the request ran past the server's --timeout of 1 s"
    );
    let big = "ab ".repeat(40_000);
    let e = refused(&srv.post("/v1/completions", &json!({"prompt": big})));
    assert_eq!(e["code"], "context_length_exceeded");
    let m = e["message"].as_str().unwrap();
    assert!(
        m.starts_with("the prompt has 120000 bytes, more than the context of 64 tokens can hold")
            && m.ends_with("; refused before tokenizing"),
        "{m}"
    );
    let e = refused(&srv.post(
        "/v1/chat/completions",
        &chat(json!([{"role": "user", "content": big}])),
    ));
    assert_eq!(e["param"], "messages");
    srv.stop();
}

/// SIGTERM while a stream runs: the stream ends with an error event (`server_shutdown`) and
/// `[DONE]`, not with a `finish_reason`.
#[test]
fn sigterm_ends_a_running_stream_with_an_error_event() {
    let srv = Server::start(&[]);
    // wait for the first content event, then stop the server
    let (mut r, mut text) = stream_until_text(&srv);
    let rest = {
        let srv = srv;
        // SAFETY: signalling the child this test started, by its id.
        unsafe { libc::kill(srv.child.id() as i32, libc::SIGTERM) };
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut r, &mut rest).unwrap();
        rest
    };
    text.push_str(&rest);
    assert!(
        text.contains(
            r#"data: {"error":{"message":"the server is stopping: the generation was cut short","type":"server_error","param":null,"code":"server_shutdown"}}"#
        ),
        "{text}"
    );
    assert!(text.contains("data: [DONE]"), "{text}");
    assert!(!text.contains("\"finish_reason\":\"stop\""), "{text}");
    assert!(!text.contains("\"finish_reason\":\"length\""), "{text}");
}

/// `/tokenize` and `/detokenize` are bounded as prompts are: text of more bytes than the
/// context can hold, or more ids than it holds, is refused before any tokenizer work; a JSON
/// schema too large to compile cheaply is refused before compiling.
#[test]
fn tokenizer_endpoints_and_schemas_are_bounded() {
    let srv = Server::start(&["-c", "64"]);
    let big = "hello world ".repeat(10_000);
    let e = refused(&srv.post("/tokenize", &json!({"content": big, "with_pieces": true})));
    assert_eq!(
        (e["param"].as_str(), e["code"].as_str()),
        (Some("content"), Some("context_length_exceeded"))
    );
    let m = e["message"].as_str().unwrap();
    assert!(
        m.starts_with("the prompt has 120000 bytes, more than the context of 64 tokens can hold"),
        "{m}"
    );
    let ok = srv.post("/tokenize", &json!({"content": "hello world"}));
    assert_eq!(ok.status, 200, "{}", ok.body);
    let ids: Vec<u32> = vec![1; 65];
    let e = refused(&srv.post("/detokenize", &json!({"tokens": ids})));
    assert_eq!(
        e,
        json!({"message": "tokens holds 65 ids, more than the context of 64 tokens",
            "type": "invalid_request_error", "param": "tokens", "code": "context_length_exceeded"})
    );
    let props: serde_json::Map<String, Value> = (0..6000)
        .map(|i| (format!("p{i}"), json!({"type": "string"})))
        .collect();
    let schema = json!({"type": "object", "properties": props});
    let e = refused(&srv.post(
        "/v1/completions",
        &json!({"prompt": "hi", "max_tokens": 2, "response_format":
            {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}),
    ));
    assert_eq!(
        e,
        json!({"message": "response_format: the schema is too large to compile: 6002 objects \
            (at most 5000)", "type": "invalid_request_error", "param": "response_format",
            "code": "grammar_too_large"})
    );
    srv.stop();
}

/// A body declared larger than `--body-limit` is answered 413 at once, from its header; a
/// body that does not arrive whole within `--body-timeout` (stalled, or sent a byte at a
/// time) is answered 408 and its connection closed, and the server keeps answering.
#[test]
fn bodies_too_large_or_too_slow() {
    use std::io::{Read, Write};
    let srv = Server::start(&["--body-timeout", "1"]);
    let head = "POST /v1/completions HTTP/1.1\r\nContent-Type: application/json\r\n";
    let huge = srv.raw(&format!("{head}Content-Length: 999999999"), "");
    assert_eq!(huge.status, 413, "{}", huge.body);
    assert_eq!(
        huge.json()["error"],
        json!({"message": "the request body is larger than the server's --body-limit of \
            4194304 bytes", "type": "invalid_request_error", "param": null,
            "code": "request_too_large"})
    );
    let slow = srv.raw(&format!("{head}Content-Length: 100"), "{\"prompt\": ");
    assert_eq!(slow.status, 408, "{}", slow.body);
    assert_eq!(slow.header("connection"), Some("close"));
    assert_eq!(
        slow.json()["error"],
        json!({"message": "the request body did not arrive within the server's \
            --body-timeout of 1 s", "type": "invalid_request_error", "param": null,
            "code": "body_timeout"})
    );
    // a byte every 100 ms would take 10 s: the server cuts it (an answer or a reset)
    let mut s = std::net::TcpStream::connect(&srv.addr).unwrap();
    write!(s, "{head}Host: localhost\r\nContent-Length: 100\r\n\r\n{{").unwrap();
    let mut w = s.try_clone().unwrap();
    let drip = std::thread::spawn(move || {
        for sent in 0..100 {
            std::thread::sleep(std::time::Duration::from_millis(100));
            if w.write_all(b" ").is_err() {
                return sent;
            }
        }
        100
    });
    s.set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let mut out = Vec::new();
    match s.read_to_end(&mut out) {
        Ok(_) => assert!(
            String::from_utf8_lossy(&out).starts_with("HTTP/1.1 408"),
            "{}",
            String::from_utf8_lossy(&out)
        ),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
    drop(s);
    assert!(
        drip.join().unwrap() < 100,
        "the dripping client was never cut"
    );
    assert_eq!(srv.get("/health").status, 200);
    srv.stop();
}

/// RFC 9112 §3.2: several `Host` headers, or none over HTTP/1.1, are refused with 400 (an
/// HTTP/1.0 request may omit it); the `Bearer` scheme is case-insensitive (RFC 9110 §11.1).
#[test]
fn host_header_rules_and_the_bearer_scheme() {
    use std::io::{Read, Write};
    let srv = Server::start(&["--api-key", "k3y"]);
    let port = srv.addr.rsplit_once(':').unwrap().1.to_string();
    let two = srv.raw(
        &format!("GET /health HTTP/1.1\r\nHost: localhost:{port}\r\nHost: evil.com"),
        "",
    );
    assert_eq!(two.status, 400, "{}", two.body);
    assert_eq!(
        two.json()["error"],
        json!({"message": "the request has several Host headers; send one",
            "type": "invalid_request_error", "param": null, "code": "invalid_host"})
    );
    let bare = |version: &str| {
        let mut s = std::net::TcpStream::connect(&srv.addr).unwrap();
        write!(s, "GET /health HTTP/{version}\r\nConnection: close\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        common::http::parse(&out)
    };
    let a = bare("1.1");
    assert_eq!(a.status, 400, "{}", a.body);
    assert_eq!(
        a.json()["error"]["message"],
        "an HTTP/1.1 request must carry a Host header"
    );
    assert_eq!(bare("1.0").status, 200);
    // an absolute-form target's authority replaces Host (RFC 9112 §3.2.2): it is checked
    let absolute = srv.raw(
        &format!("GET http://evil.com/health HTTP/1.1\r\nHost: localhost:{port}"),
        "",
    );
    assert_eq!(absolute.status, 403, "{}", absolute.body);
    assert_eq!(
        absolute.json()["error"]["message"],
        "the host 'evil.com' does not name this server; serve it under that name with \
         --allowed-hosts"
    );
    let local = srv.raw(
        &format!("GET http://localhost:{port}/health HTTP/1.1\r\nHost: localhost:{port}"),
        "",
    );
    assert_eq!(local.status, 200, "{}", local.body);
    for (auth, status) in [
        ("Bearer k3y", 200),
        ("bearer k3y", 200),
        ("BEARER k3y", 200),
        ("Bearer wrong", 401),
        ("Basic k3y", 401),
        ("k3y", 401),
    ] {
        let a = srv.raw(
            &format!("GET /v1/models HTTP/1.1\r\nAuthorization: {auth}"),
            "",
        );
        assert_eq!(a.status, status, "{auth}: {}", a.body);
    }
    srv.stop();
}

/// A stream whose client leaves after its first event is logged with the tokens the model
/// really generated (counted when the generation stops), not 0.
#[test]
fn a_cut_stream_is_logged_with_its_tokens() {
    let srv = Server::start(&[]);
    let (r, _) = stream_until_text(&srv);
    drop(r);
    // the server answers a request after it, so the cut one has been seen
    assert_eq!(srv.get("/health").status, 200);
    std::thread::sleep(std::time::Duration::from_millis(500));
    let log = srv.stop();
    let line = log
        .lines()
        .find(|l| l.contains("path=/v1/completions"))
        .unwrap_or_else(|| panic!("{log}"));
    let tokens = |f: &str| -> u64 {
        let v = line.split(&format!(" {f}=")).nth(1).unwrap();
        v.split(' ').next().unwrap().parse().unwrap()
    };
    assert!(tokens("prompt_tokens") >= 1, "{line}");
    assert!(tokens("completion_tokens") >= 1, "{line}");
}

/// Opens a streamed completion of 4,000 tokens on `srv` and reads it up to its first content
/// event: the reader (to read on or drop) and the text read so far.
fn stream_until_text(srv: &Server) -> (std::io::BufReader<std::net::TcpStream>, String) {
    use std::io::{BufRead, Write};
    let body = json!({"prompt": "Hi", "max_tokens": 4000, "stream": true}).to_string();
    let mut s = std::net::TcpStream::connect(&srv.addr).unwrap();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        srv.addr,
        body.len()
    )
    .unwrap();
    let mut r = std::io::BufReader::new(s);
    let mut text = String::new();
    while !text.contains("\"text\"") {
        let mut line = String::new();
        assert!(r.read_line(&mut line).unwrap() > 0, "{text}");
        text.push_str(&line);
    }
    (r, text)
}
