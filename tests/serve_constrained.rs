//! `deltafin serve` (the real binary on the Qwen3-MoE fixture, raw HTTP as in
//! `tests/serve_http.rs`) steering its output: `response_format` `json_object` and
//! `json_schema`, llama-server's `grammar` (Lark and GBNF) and `json_schema`, `logit_bias` and
//! `ignore_eos`. The fixture's weights are random, so only a constraint makes its output
//! checkable: the text must parse and follow the schema.

mod common;

use common::http::Server;
use serde_json::{json, Value};

/// `<|im_end|>`, the fixture's end of turn.
const IM_END: u32 = 482;

fn chat(extra: Value) -> Value {
    let mut b = json!({"model": "qwen3_moe", "max_tokens": 400,
        "messages": [{"role": "user", "content": "Describe a person."}]});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

/// The error object of a 400 answer.
fn refused(a: &common::http::Answer) -> Value {
    assert_eq!(a.status, 400, "{}", a.body);
    a.json()["error"].clone()
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 99},
            "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 2}
        },
        "required": ["name", "age", "pets"],
        "additionalProperties": false
    })
}

/// Checks a value against [`schema`] field by field.
fn check_person(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    let o = v.as_object().unwrap_or_else(|| panic!("{text}"));
    let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["age", "name", "pets"], "{text}");
    assert!(o["name"].as_str().unwrap().chars().count() <= 6, "{text}");
    assert!((0..=99).contains(&o["age"].as_i64().unwrap()), "{text}");
    let pets = o["pets"].as_array().unwrap();
    assert!(pets.len() <= 2, "{text}");
    assert!(pets.iter().all(|p| p == "cat" || p == "dog"), "{text}");
}

/// `json_schema` through `response_format` (chat, whole and streamed) and llama-server's
/// `json_schema` (completions): text that follows the schema, ended by the grammar
/// (`finish_reason` `stop`). `json_object`: a JSON object.
#[test]
fn json_schema_and_json_object_give_valid_json() {
    let srv = Server::start(&[]);
    let rf = json!({"type": "json_schema",
        "json_schema": {"name": "person", "strict": true, "schema": schema()}});
    let a = srv
        .post(
            "/v1/chat/completions",
            &chat(json!({"response_format": rf})),
        )
        .json();
    assert_eq!(a["choices"][0]["finish_reason"], "stop", "{a}");
    let text = a["choices"][0]["message"]["content"].as_str().unwrap();
    check_person(text);
    let s = srv.post(
        "/v1/chat/completions",
        &chat(json!({"response_format": rf, "stream": true})),
    );
    let mut streamed = String::new();
    let mut finish = Value::Null;
    for line in s.body.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if line == "[DONE]" {
            break;
        }
        let ev: Value = serde_json::from_str(line).unwrap();
        if let Some(t) = ev["choices"][0]["delta"]["content"].as_str() {
            streamed.push_str(t);
        }
        if !ev["choices"][0]["finish_reason"].is_null() {
            finish = ev["choices"][0]["finish_reason"].clone();
        }
    }
    assert_eq!((streamed.as_str(), finish), (text, json!("stop")));
    let c = srv
        .post(
            "/v1/completions",
            &json!({"prompt": "A person:", "max_tokens": 400, "json_schema": schema()}),
        )
        .json();
    assert_eq!(c["choices"][0]["finish_reason"], "stop", "{c}");
    check_person(c["choices"][0]["text"].as_str().unwrap());
    let o = srv
        .post(
            "/v1/chat/completions",
            &chat(json!({"response_format": {"type": "json_object"}, "max_tokens": 12})),
        )
        .json();
    let text = o["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(text.starts_with('{'), "{text}");
    if o["choices"][0]["finish_reason"] == "stop" {
        assert!(serde_json::from_str::<Value>(text).unwrap().is_object());
    }
    srv.stop();
}

/// `grammar` in llguidance's Lark syntax, on both endpoints, and in GBNF; GBNF that does not
/// read, a grammar that does not compile, a bad schema and two constraints at once are
/// refused by name before queuing.
#[test]
fn lark_and_gbnf_grammars_and_refusals() {
    let srv = Server::start(&[]);
    let g = r#"start: "yes" | "no" | "it depends""#;
    let a = srv
        .post("/v1/chat/completions", &chat(json!({"grammar": g})))
        .json();
    let text = a["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(["yes", "no", "it depends"].contains(&text), "{text}");
    assert_eq!(a["choices"][0]["finish_reason"], "stop");
    let c = srv
        .post(
            "/v1/completions",
            &json!({"prompt": "Count:", "max_tokens": 50,
                "grammar": "start: DIGIT DIGIT \" apples\"\nDIGIT: /[0-9]/"}),
        )
        .json();
    let text = c["choices"][0]["text"].as_str().unwrap();
    assert_eq!(text.len(), 9, "{text}");
    assert!(text.ends_with(" apples") && text[..2].chars().all(|c| c.is_ascii_digit()));
    // GBNF (llama.cpp's format), read into Lark: a dashed name, a comment, a class count
    let c = srv
        .post(
            "/v1/completions",
            &json!({"prompt": "Answer:", "max_tokens": 50,
                "grammar": "root ::= yes-no | \" maybe \" [0-9]{2}  # a comment\n\
                            yes-no ::= \" yes\" | \" no\""}),
        )
        .json();
    let text = c["choices"][0]["text"].as_str().unwrap();
    let maybe = text
        .strip_prefix(" maybe ")
        .is_some_and(|d| d.len() == 2 && d.chars().all(|c| c.is_ascii_digit()));
    assert!(text == " yes" || text == " no" || maybe, "{text:?}");
    assert_eq!(c["choices"][0]["finish_reason"], "stop");
    let e = refused(&srv.post(
        "/v1/chat/completions",
        &chat(json!({"grammar": "root ::= \"yes\" | \"no"})),
    ));
    assert_eq!(e["param"], "grammar");
    assert_eq!(
        e["message"],
        "grammar (GBNF) at line 1, column 18: unterminated string literal"
    );
    let e = refused(&srv.post(
        "/v1/completions",
        &json!({"prompt": "x", "grammar": "root ::= []"}),
    ));
    assert_eq!(e["param"], "grammar");
    assert_eq!(
        e["message"],
        "grammar: the grammar allows no text: no token can start it and it does not accept \
         the empty text"
    );
    let e = refused(&srv.post(
        "/v1/completions",
        &json!({"prompt": "x", "grammar": "root ::= answer"}),
    ));
    assert_eq!(e["param"], "grammar");
    assert_eq!(
        e["message"],
        "grammar (GBNF) at line 1, column 10: rule 'answer' is used but not defined"
    );
    let e = refused(&srv.post(
        "/v1/chat/completions",
        &chat(json!({"grammar": "start: nowhere"})),
    ));
    assert_eq!(e["param"], "grammar");
    let m = e["message"].as_str().unwrap();
    assert!(m.starts_with("grammar: ") && m.contains("nowhere"), "{m}");
    let bad = json!({"type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "wat"}}}}});
    let e = refused(&srv.post(
        "/v1/chat/completions",
        &chat(json!({"response_format": bad})),
    ));
    assert_eq!(e["param"], "response_format");
    let m = e["message"].as_str().unwrap();
    assert!(
        m.starts_with("response_format: ") && m.contains("wat"),
        "{m}"
    );
    let e = refused(&srv.post(
        "/v1/chat/completions",
        &chat(json!({"response_format": {"type": "json_object"}, "grammar": g})),
    ));
    assert_eq!(
        (e["param"].as_str(), e["message"].as_str()),
        (
            Some("grammar"),
            Some("response_format and grammar each constrain the output; send only one")
        )
    );
    let e = refused(&srv.post(
        "/v1/chat/completions",
        &chat(json!({"response_format": {"type": "json_schema"}})),
    ));
    assert_eq!(e["param"], "response_format");
    let e = refused(&srv.post(
        "/v1/chat/completions",
        &chat(json!({"response_format": {"type": "xml"}})),
    ));
    assert_eq!(
        e["message"],
        "response_format type 'xml' is not supported (text, json_object, json_schema)"
    );
    // nothing was queued for the refused requests: the server still answers
    let ok = srv.post("/v1/chat/completions", &chat(json!({"max_tokens": 2})));
    assert_eq!(ok.status, 200, "{}", ok.body);
    srv.stop();
}

/// Banning the greedy first token with `logit_bias` changes the first token; a bias of 100
/// on `<|im_end|>` ends the answer at once, and `ignore_eos` then runs it to `max_tokens`.
/// A key that is not a token id, or a bias out of range, is refused by name.
#[test]
fn logit_bias_and_ignore_eos() {
    let srv = Server::start(&[]);
    let first = |extra: Value| -> (String, Value) {
        let mut b = json!({"prompt": "Hello", "max_tokens": 1});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        let a = srv.post("/v1/completions", &b).json();
        (
            a["choices"][0]["text"].as_str().unwrap().to_string(),
            a["usage"].clone(),
        )
    };
    let (greedy, _) = first(json!({}));
    let ids = srv.post("/tokenize", &json!({"content": greedy})).json()["tokens"].clone();
    assert_eq!(ids.as_array().unwrap().len(), 1, "{greedy:?} is {ids}");
    let id = ids[0].as_u64().unwrap();
    let (banned, _) = first(json!({"logit_bias": {id.to_string(): -100}}));
    assert_ne!(banned, greedy);
    let (weak, _) = first(json!({"logit_bias": {id.to_string(): -0.0001}}));
    assert_eq!(weak, greedy);
    let end = json!({IM_END.to_string(): 100});
    let a = srv
        .post(
            "/v1/chat/completions",
            &chat(json!({"logit_bias": end, "max_tokens": 8})),
        )
        .json();
    assert_eq!(
        (
            a["choices"][0]["finish_reason"].clone(),
            a["usage"]["completion_tokens"].clone()
        ),
        (json!("stop"), json!(1)),
        "{a}"
    );
    let a = srv
        .post(
            "/v1/chat/completions",
            &chat(json!({"logit_bias": end, "ignore_eos": true, "max_tokens": 8})),
        )
        .json();
    assert_eq!(
        (
            a["choices"][0]["finish_reason"].clone(),
            a["usage"]["completion_tokens"].clone()
        ),
        (json!("length"), json!(8)),
        "{a}"
    );
    let e = refused(&srv.post(
        "/v1/chat/completions",
        &chat(json!({"logit_bias": {"99999": 1}})),
    ));
    assert_eq!(
        (e["param"].as_str(), e["message"].as_str()),
        (
            Some("logit_bias"),
            Some("logit_bias key \"99999\" is not a token id below 487 (the vocabulary)")
        )
    );
    let e = refused(&srv.post(
        "/v1/chat/completions",
        &chat(json!({"logit_bias": {"5": -101}})),
    ));
    assert_eq!(
        e["message"],
        "logit_bias[\"5\"] is -101, expected a number from -100 to 100"
    );
    srv.stop();
}

/// The value of a counter in `/metrics`.
fn counter(srv: &Server, name: &str) -> u64 {
    let m = srv.get("/metrics").body;
    m.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {m}"))
}

/// A server that speculates (`--lookup`) decodes a request with a grammar plainly (its
/// passes are not counted as speculation's) and still follows the schema; a request without
/// one speculates.
#[test]
fn constrained_requests_do_not_speculate() {
    let srv = Server::start(&["--lookup"]);
    let passes = |srv: &Server| {
        counter(srv, "deltafin_spec_plain_passes_total")
            + counter(srv, "deltafin_spec_verify_passes_total")
    };
    let c = srv
        .post(
            "/v1/completions",
            &json!({"prompt": "A person:", "max_tokens": 400, "json_schema": schema()}),
        )
        .json();
    assert_eq!(c["choices"][0]["finish_reason"], "stop", "{c}");
    check_person(c["choices"][0]["text"].as_str().unwrap());
    assert_eq!(passes(&srv), 0);
    let plain = srv.post(
        "/v1/completions",
        &json!({"prompt": "one two one two one two", "max_tokens": 8}),
    );
    assert_eq!(plain.status, 200, "{}", plain.body);
    assert!(passes(&srv) > 0);
    srv.stop();
}

/// Long chains of rules (GBNF and Lark) and of a schema's `$ref`s, within the size bounds:
/// llguidance walks them recursively, which overflowed a 2 MiB stack and aborted the whole
/// server; they compile on a thread with room, constrain the text, and the server lives on.
#[test]
fn long_chains_of_rules_compile_and_the_server_lives_on() {
    let srv = Server::start(&[]);
    let n = 3000;
    let gbnf = (0..n).fold("root ::= r0\n".to_string(), |g, i| {
        g + &format!("r{i} ::= \"{}\" r{}\n", i % 10, i + 1)
    }) + &format!("r{n} ::= \"e\"\n");
    let lark = (0..n).fold("start: r0\n".to_string(), |g, i| {
        g + &format!("r{i}: \"{}\" r{}\n", i % 10, i + 1)
    }) + &format!("r{n}: \"e\"\n");
    for g in [gbnf, lark] {
        let c = srv
            .post(
                "/v1/completions",
                &json!({"prompt": "x", "max_tokens": 12, "grammar": g}),
            )
            .json();
        assert_eq!(c["choices"][0]["text"], "012345678901", "{c}");
    }
    let mut defs = serde_json::Map::new();
    for i in 0..1600 {
        defs.insert(
            format!("d{i}"),
            json!({"type": "object", "properties": {"n": {"$ref": format!("#/$defs/d{}", i + 1)}}}),
        );
    }
    defs.insert("d1600".into(), json!({"type": "integer"}));
    let schema = json!({"$ref": "#/$defs/d0", "$defs": defs});
    let a = srv.post(
        "/v1/completions",
        &json!({"prompt": "x", "max_tokens": 4, "json_schema": schema}),
    );
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(a.json()["choices"][0]["text"]
        .as_str()
        .unwrap()
        .starts_with('{'));
    assert_eq!(srv.get("/health").status, 200);
    srv.stop();
}
