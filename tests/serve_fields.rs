//! A parameter the server does not support is refused by name, never silently ignored: fields
//! the chat template would drop (`tools`, a message's `tool_calls` or `name`), unknown keys
//! inside nested objects, `stream_options` without a stream, `strict` tools, and values of the
//! wrong type (named with their path). Several prompts in one `/v1/completions` request get
//! one choice each. Spoken to in raw HTTP (`common::http`) on the Qwen3-MoE fixture and the
//! Gemma 3 demo model.

mod common;

use common::http::{Answer, Server};
use serde_json::{json, Value};

fn chat(messages: Value) -> Value {
    json!({"model": "m", "max_tokens": 4, "messages": messages})
}

fn user() -> Value {
    json!([{"role": "user", "content": "What is the weather?"}])
}

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {}}}}])
}

/// The error of a 400 answer: `(param, message)`.
fn refused(a: &Answer) -> (Value, String) {
    assert_eq!(a.status, 400, "{}", a.body);
    let e = a.json()["error"].clone();
    assert_eq!(e["type"], "invalid_request_error");
    (
        e["param"].clone(),
        e["message"].as_str().unwrap().to_string(),
    )
}

/// `body` with `extra`'s fields set.
fn with(mut body: Value, extra: Value) -> Value {
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// On the built-in Gemma template (the demo model), which renders neither tools nor tool
/// calls nor names, each is refused by name instead of dropped.
#[test]
fn gemma_refuses_what_its_template_drops() {
    let model = common::demo_gguf();
    let srv = Server::start_model(model.to_str().unwrap(), &[]);
    let plain = srv.post("/v1/chat/completions", &chat(user()));
    assert_eq!(plain.status, 200, "{}", plain.body);
    let t = with(chat(user()), json!({"tools": tools()}));
    assert_eq!(
        refused(&srv.post("/v1/chat/completions", &t)),
        (
            json!("tools"),
            "tools is not supported by this model: its chat template does not render tool \
             definitions, so the model would never see them"
                .into()
        )
    );
    let history = json!([{"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Looking.", "tool_calls": [{"id": "c1",
            "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "user", "content": "And?"}]);
    assert_eq!(
        refused(&srv.post("/v1/chat/completions", &chat(history))),
        (
            json!("messages[1].tool_calls"),
            "messages[1].tool_calls is not supported by this model: its chat template does \
             not render tool calls, so the model would never see it"
                .into()
        )
    );
    let named = json!([{"role": "user", "content": "Hi", "name": "ann"}]);
    assert_eq!(
        refused(&srv.post("/v1/chat/completions", &chat(named))).0,
        json!("messages[0].name")
    );
    srv.stop();
}

/// Qwen3-MoE's template renders tools and tool calls: both keep working (the tools lengthen
/// the prompt). It ignores `name`, which is refused.
#[test]
fn qwen3_renders_tools_and_tool_calls() {
    let srv = Server::start(&[]);
    let plain = srv.post("/v1/chat/completions", &chat(user())).json();
    let t = srv
        .post(
            "/v1/chat/completions",
            &with(chat(user()), json!({"tools": tools()})),
        )
        .json();
    assert!(
        t["usage"]["prompt_tokens"].as_u64() > plain["usage"]["prompt_tokens"].as_u64(),
        "{t}"
    );
    let history = json!([{"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1",
            "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]);
    let a = srv.post(
        "/v1/chat/completions",
        &with(chat(history), json!({"tools": tools()})),
    );
    assert_eq!(a.status, 200, "{}", a.body);
    // an empty list of tool calls is no tool call (as null is)
    let empty = json!([{"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "x", "tool_calls": []},
        {"role": "user", "content": "ok"}]);
    let a = srv.post("/v1/chat/completions", &chat(empty));
    assert_eq!(a.status, 200, "{}", a.body);
    // a role the template would drop without a word
    let bogus = json!([{"role": "bogus", "content": "secret"}, {"role": "user", "content": "Hi"}]);
    assert_eq!(
        refused(&srv.post("/v1/chat/completions", &chat(bogus))),
        (
            json!("messages[0].role"),
            "messages[0].role is 'bogus'; expected one of system, developer, user, assistant, \
             tool"
                .into()
        )
    );
    let named = json!([{"role": "user", "content": "Hi", "name": "ann"}]);
    assert_eq!(
        refused(&srv.post("/v1/chat/completions", &chat(named))),
        (
            json!("messages[0].name"),
            "messages[0].name is not supported by this model: its chat template does not \
             render message names, so the model would never see it"
                .into()
        )
    );
    srv.stop();
}

/// Unknown keys inside nested objects, `stream_options` without a stream, `strict` tools and
/// tools that are not functions are refused with their path.
#[test]
fn nested_fields_are_refused_by_path() {
    let srv = Server::start(&[]);
    let cases = [
        (
            json!({"stream_options": {"include_usage": true}}),
            "stream_options",
            "stream_options is only allowed with stream: true",
        ),
        (
            json!({"stream": true, "stream_options": {"continuous_usage_stats": true}}),
            "stream_options.continuous_usage_stats",
            "stream_options.continuous_usage_stats: unknown field `continuous_usage_stats`, \
             expected `include_usage`",
        ),
        (
            json!({"response_format": {"type": "text", "foo": 1}}),
            "response_format.foo",
            "response_format.foo is not supported (known: type, json_schema)",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {},
                "foo": 1}}}),
            "response_format.json_schema.foo",
            "response_format.json_schema.foo is not supported (known: name, description, \
             schema, strict)",
        ),
        (
            json!({"tools": [{"type": "function", "foo": 1,
                "function": {"name": "f"}}]}),
            "tools[0].foo",
            "tools[0].foo: unknown field `foo`, expected `type` or `function`",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "strict": true}}]}),
            "tools[0].function.strict",
            "tools[0].function.strict true is not supported: tool calls are read from the \
             output, not constrained to the parameters' schema",
        ),
        (
            json!({"tools": [{"type": "function"}]}),
            "tools[0]",
            "tools[0]: missing field `function`",
        ),
        (
            json!({"tools": [{"type": "code_interpreter"}]}),
            "tools[0].type",
            "tools[0].type: unknown variant `code_interpreter`, expected `function`",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x", "foo": 1}]}),
            "messages[0].foo",
            "messages[0].foo is not a message field this server supports (known: role, \
             content, name, tool_calls, tool_call_id, reasoning_content, reasoning, thinking)",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x", "tool_calls": [{"id": "c",
                "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}),
            "messages[0].tool_calls",
            "messages[0].tool_calls is only allowed in an assistant message, not a user message",
        ),
    ];
    for (extra, param, message) in cases {
        let body = with(chat(user()), extra.clone());
        assert_eq!(
            refused(&srv.post("/v1/chat/completions", &body)),
            (json!(param), message.to_string()),
            "{extra}"
        );
    }
    let c = json!({"prompt": "Hi", "max_tokens": 2, "stream_options": {"include_usage": true}});
    assert_eq!(
        refused(&srv.post("/v1/completions", &c)).0,
        json!("stream_options")
    );
    srv.stop();
}

/// A value of the wrong type is named with its path in the message and in `param`.
#[test]
fn wrong_types_name_the_field() {
    let srv = Server::start(&[]);
    let cases = [
        (
            json!({"stop": [1]}),
            "stop",
            "stop: 1 is not a string; expected a string or a list of strings",
        ),
        (
            json!({"stop": 1}),
            "stop",
            "stop: 1 is not a string or a list of strings",
        ),
        (
            json!({"seed": 1.5}),
            "seed",
            "seed: invalid type: floating point `1.5`, expected i64",
        ),
        (
            json!({"top_k": 2.5}),
            "top_k",
            "top_k: invalid type: floating point `2.5`, expected i64",
        ),
        (
            json!({"temperature": "0.5"}),
            "temperature",
            "temperature: invalid type: string \"0.5\", expected f32",
        ),
    ];
    for (extra, param, message) in cases {
        let body = with(chat(user()), extra.clone());
        assert_eq!(
            refused(&srv.post("/v1/chat/completions", &body)),
            (json!(param), message.to_string()),
            "{extra}"
        );
    }
    assert_eq!(
        refused(&srv.post(
            "/v1/completions",
            &json!({"prompt": "Hi", "logprobs": true})
        )),
        (
            json!("logprobs"),
            "logprobs: invalid type: boolean `true`, expected u32".to_string()
        )
    );
    srv.stop();
}

/// Several prompts in one request: one choice per prompt and sample (index = prompt × n +
/// sample), each the answer the prompt gets alone, whole and streamed; usage summed.
#[test]
fn several_prompts_get_one_choice_each() {
    let srv = Server::start(&[]);
    let alone = |p: Value| {
        srv.post("/v1/completions", &json!({"prompt": p, "max_tokens": 3}))
            .json()
    };
    let (a, b) = (alone(json!("Hi")), alone(json!("The sky is")));
    let ids = |t: &str| {
        srv.post("/tokenize", &json!({"content": t, "add_special": true}))
            .json()["tokens"]
            .clone()
    };
    for prompts in [
        json!(["Hi", "The sky is"]),
        json!([ids("Hi"), ids("The sky is")]),
    ] {
        let both = srv
            .post(
                "/v1/completions",
                &json!({"prompt": prompts, "max_tokens": 3, "n": 2}),
            )
            .json();
        let ch = both["choices"].as_array().unwrap();
        assert_eq!(ch.len(), 4, "{both}");
        for (i, c) in ch.iter().enumerate() {
            assert_eq!(c["index"], i, "{both}");
            let one = if i < 2 { &a } else { &b };
            assert_eq!(c["text"], one["choices"][0]["text"], "{both}");
        }
        let pt = |v: &Value| v["usage"]["prompt_tokens"].as_u64().unwrap();
        assert_eq!(pt(&both), pt(&a) + pt(&b));
        let ct = |v: &Value| v["usage"]["completion_tokens"].as_u64().unwrap();
        assert_eq!(ct(&both), 2 * (ct(&a) + ct(&b)));
    }
    let s = srv.post(
        "/v1/completions",
        &json!({"prompt": ["Hi", "The sky is"], "max_tokens": 3, "stream": true,
            "stream_options": {"include_usage": true}}),
    );
    assert_eq!(s.status, 200, "{}", s.body);
    let mut texts = [String::new(), String::new()];
    let mut usage = Value::Null;
    for line in s.body.lines() {
        let Some(d) = line.strip_prefix("data: ") else {
            continue;
        };
        if d == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(d).unwrap();
        if let Some(c) = v["choices"].as_array().and_then(|c| c.first()) {
            texts[c["index"].as_u64().unwrap() as usize] += c["text"].as_str().unwrap_or("");
        } else {
            usage = v["usage"].clone();
        }
    }
    assert_eq!(texts[0], a["choices"][0]["text"].as_str().unwrap());
    assert_eq!(texts[1], b["choices"][0]["text"].as_str().unwrap());
    assert_eq!(
        usage["prompt_tokens"].as_u64().unwrap(),
        a["usage"]["prompt_tokens"].as_u64().unwrap()
            + b["usage"]["prompt_tokens"].as_u64().unwrap()
    );
    assert_eq!(
        refused(&srv.post("/v1/completions", &json!({"prompt": ["Hi", ""]}))),
        (json!("prompt"), "prompt[1] is empty".to_string())
    );
    srv.stop();
}

/// Tool call ids differ; `--alias ""` is refused at start; a model id with a slash is routed.
#[test]
fn alias_and_model_ids_with_slashes() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_deltafin"))
        .args(["serve", "-m", common::http::MODEL, "--alias", ""])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "invalid value '' for '--alias <ALIAS>': the model id is empty; give the name \
             clients send as \"model\""
        ),
        "{err}"
    );
    let srv = Server::start(&["--alias", "google/gemma-3-270m"]);
    for path in [
        "/v1/models/google/gemma-3-270m",
        "/v1/models/google%2Fgemma-3-270m",
    ] {
        let m = srv.get(path);
        assert_eq!(m.status, 200, "{path}: {}", m.body);
        assert_eq!(m.json()["id"], "google/gemma-3-270m");
    }
    assert_eq!(srv.get("/v1/models/google/other").status, 404);
    srv.stop();
}
