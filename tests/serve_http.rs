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
        "tokens[1] is 100000, expected a token id below 512 (the vocabulary)"
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
        assert_eq!(a["usage"], text["usage"]);
    }
    assert_eq!(
        refused(&srv.post("/v1/completions", &json!({"prompt": ["a", "b"]})))["message"],
        "prompt holds 2 prompts, but this server completes one per request"
    );
    let p = srv.get("/props").json();
    assert_eq!(p["default_generation_settings"]["n_ctx"], 4096);
    assert_eq!(
        p["default_generation_settings"]["params"]["temperature"],
        0.0
    );
    assert_eq!(p["total_slots"], 1);
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
            json!({"39": 5}),
            "logit_bias is not supported yet",
        ),
        ("ignore_eos", json!(true), "ignore_eos is not supported yet"),
        (
            "grammar",
            json!("root ::= \"a\""),
            "grammar is not supported yet (constrained decoding)",
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
            "response_format type 'json_schema' is not supported (only 'text')",
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
