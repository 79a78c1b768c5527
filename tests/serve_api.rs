//! The OpenAI-compatible router in process (`tower::ServiceExt::oneshot`): whole SSE streams
//! as `insta` snapshots, request errors, the API key, the body limit, and KV prefix reuse.
//!
//! Most tests drive an *echo model*: a `Model` whose greedy answer to a chat is the token ids
//! of the last user message, then `<|im_end|>`, with the tokenizer and chat template of the
//! committed Qwen3-MoE fixture. That makes the streamed content exact and chosen by the test
//! (a stop string split across tokens, an emoji split across byte tokens, a tool call). The
//! KV reuse test runs the real fixture model.

mod common;

use common::serve::*;

#[tokio::test]
async fn stream_plain() {
    insta::assert_snapshot!(stream("Hello there", json!({})).await);
}

#[tokio::test]
async fn stream_with_usage() {
    insta::assert_snapshot!(stream("Hi", json!({"stream_options": {"include_usage": true}})).await);
}

#[tokio::test]
async fn stream_stop_split_across_tokens() {
    let body = stream("one two STOP three", json!({"stop": ["STOP", "zzz"]})).await;
    assert!(!body.contains("ST\"") && !body.contains("three"));
    insta::assert_snapshot!(body);
}

#[tokio::test]
async fn stream_emoji_split_across_byte_tokens() {
    let opened = deltafin::load::open_any(Some(&fixture())).unwrap();
    let tok = opened.tokenizer().unwrap();
    // the crab's four bytes are three byte-level tokens in this vocabulary
    assert_eq!(tok.encode_chat("🦀").unwrap().len(), 3);
    insta::assert_snapshot!(stream("a🦀b", json!({})).await);
}

#[tokio::test]
async fn stream_logprobs() {
    insta::assert_snapshot!(stream("Hey", json!({"logprobs": true, "top_logprobs": 2})).await);
}

#[tokio::test]
async fn stream_tool_call() {
    let call = "Let me look.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    let body = stream(call, json!({"tools": weather_tool(), "max_tokens": 100})).await;
    assert_eq!(body.matches("\"id\":\"call_").count(), 1, "{body}");
    insta::assert_snapshot!(mask_call_ids(&body));
}

#[tokio::test]
async fn whole_chat_and_completion() {
    let app = app_with(echo_engine(), None);
    let (s, body) = call(&app, "/v1/chat/completions", chat("Hello", json!({}))).await;
    assert_eq!(s, StatusCode::OK);
    insta::assert_snapshot!(body);
    let call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    let (_, body) = call_tool(&app, call).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(v["choices"][0]["message"]["content"], Value::Null);
    assert_eq!(
        v["choices"][0]["message"]["tool_calls"][0]["function"],
        json!({"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"})
    );
}

async fn call_tool(app: &axum::Router, text: &str) -> (StatusCode, String) {
    call(
        app,
        "/v1/chat/completions",
        chat(text, json!({"tools": weather_tool(), "max_tokens": 100})),
    )
    .await
}

async fn error_of(app: &axum::Router, path: &str, body: Value) -> (u16, Value) {
    let (s, b) = call(app, path, body).await;
    (s.as_u16(), serde_json::from_str(&b).unwrap())
}

#[tokio::test]
async fn request_errors_have_the_openai_shape() {
    let app = app_with(echo_engine(), None);
    let path = "/v1/chat/completions";
    let (s, e) = error_of(&app, path, chat("x", json!({"n": 5}))).await;
    assert_eq!(s, 400);
    assert_eq!(
        e,
        json!({"error": {"message": "n is 5, expected 1 to 4 (choices wait in the queue of --queue jobs)",
            "type": "invalid_request_error", "param": "n", "code": null}})
    );
    // any model name is answered by the one model, named in the answer
    let (s, e) = error_of(&app, path, chat("x", json!({"model": "gpt-4"}))).await;
    assert_eq!((s, e["model"].as_str()), (200, Some("qwen3_moe")));
    let (s, e) = error_of(
        &app,
        path,
        chat("x", json!({"response_format": {"type": "json_html"}})),
    )
    .await;
    assert_eq!(s, 400);
    assert_eq!(
        e["error"]["message"],
        "response_format type 'json_html' is not supported (text, json_object, json_schema)"
    );
    let (s, e) = error_of(&app, path, chat("x", json!({"temperature": "hot"}))).await;
    assert_eq!(s, 400);
    assert_eq!(
        (&e["error"]["message"], &e["error"]["param"]),
        (
            &json!("temperature: invalid type: string \"hot\", expected f32"),
            &json!("temperature")
        )
    );
    let (s, e) = error_of(&app, path, chat("x", json!({"top_p": 0}))).await;
    assert_eq!((s, e["error"]["param"].as_str()), (400, Some("top_p")));
    let long = "word ".repeat(2000);
    let (s, e) = error_of(&app, path, chat(&long, json!({}))).await;
    assert_eq!(s, 413, "{e}");
    assert_eq!(e["error"]["code"], "request_too_large");
    let long = "a b ".repeat(700);
    let (s, e) = error_of(&app, path, chat(&long, json!({}))).await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (400, Some("context_length_exceeded"))
    );
    let req = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from("{\"model\": "))
        .unwrap();
    let (s, b) = send(&app, req).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(
        b.contains("the body is not valid JSON: EOF while parsing"),
        "{b}"
    );
    // a template's own raise_exception message
    let bad = json!({"model": "qwen3_moe", "messages": []});
    let (s, e) = error_of(&app, path, bad).await;
    assert_eq!(
        (s, e["error"]["message"].as_str()),
        (400, Some("messages is empty"))
    );
}

#[tokio::test]
async fn api_key_guards_all_but_health() {
    let app = app_with(echo_engine(), Some("sekret"));
    let get = |p: &str, key: Option<&str>| {
        let mut r = Request::get(p);
        if let Some(k) = key {
            r = r.header("authorization", format!("Bearer {k}"));
        }
        r.body(Body::empty()).unwrap()
    };
    assert_eq!(send(&app, get("/health", None)).await.0, StatusCode::OK);
    let (s, b) = send(&app, get("/v1/models", None)).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert!(b.contains("\"code\":\"invalid_api_key\""), "{b}");
    assert_eq!(
        send(&app, get("/metrics", Some("wrong"))).await.0,
        StatusCode::UNAUTHORIZED
    );
    let (s, b) = send(&app, get("/v1/models", Some("sekret"))).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        serde_json::from_str::<Value>(&b).unwrap(),
        json!({"object": "list", "data": [{"id": "qwen3_moe", "object": "model",
            "created": 0, "owned_by": "deltafin"}]})
    );
    let (s, m) = send(&app, get("/metrics", Some("sekret"))).await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        m.contains("deltafin_requests_total{endpoint=\"/v1/models\",status=\"401\"} 1\n"),
        "{m}"
    );
}

/// The second turn of a chat reuses the first turn's KV cache and answers exactly what a
/// fresh server answers.
#[tokio::test]
async fn second_turn_reuses_the_kv_cache() {
    let app = app_with(real_engine(), None);
    let turn1 = json!({"model": "qwen3_moe", "max_tokens": 6,
        "messages": [{"role": "user", "content": "Hello"}]});
    let (_, b) = call(&app, "/v1/chat/completions", turn1).await;
    let v: Value = serde_json::from_str(&b).unwrap();
    let answer = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let turn2 = json!({"model": "qwen3_moe", "max_tokens": 6, "messages": [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "More"}]});
    let (_, b) = call(&app, "/v1/chat/completions", turn2.clone()).await;
    let reused: Value = serde_json::from_str(&b).unwrap();
    let (_, b) = call(
        &app_with(real_engine(), None),
        "/v1/chat/completions",
        turn2,
    )
    .await;
    let fresh: Value = serde_json::from_str(&b).unwrap();
    assert_eq!(fresh["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let cached = reused["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    // everything up to the first answer's end is shared
    assert!(cached > 10, "{reused}");
    assert_eq!(reused["choices"], fresh["choices"]);
    assert_eq!(
        reused["usage"]["prompt_tokens"],
        fresh["usage"]["prompt_tokens"]
    );
}

/// Blocks every forward pass until opened; wraps the echo model.
struct Gated {
    inner: Box<dyn Model>,
    open: Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
}

impl Model for Gated {
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
    fn context_length(&self) -> usize {
        self.inner.context_length()
    }
    fn new_cache(&self, n_ctx: usize) -> KvCache {
        self.inner.new_cache(n_ctx)
    }
    fn forward_batch(
        &self,
        s: &mut WeightStore,
        batch: &mut [deltafin::models::SeqPass<'_>],
    ) -> anyhow::Result<Vec<Vec<f32>>> {
        let (m, cv) = &*self.open;
        let mut g = m.lock().unwrap();
        while !*g {
            g = cv.wait(g).unwrap();
        }
        drop(g);
        self.inner.forward_batch(s, batch)
    }
    fn placement(&self) -> &Placement {
        self.inner.placement()
    }
}

/// With one request running and the queue (of 1) full, the next is refused at once with 503
/// and `Retry-After`; once the model is free, the running and queued ones complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_503_with_retry_after() {
    let open = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
    let mut e = echo_engine();
    let store = WeightStore::open(&[], Vec::new(), &[], 0, 0, false).unwrap();
    let inner = std::mem::replace(
        &mut e.session,
        Session::new(
            Box::new(Echo {
                placement: Placement::default(),
                user_head: 0,
                asst_head: 0,
            }),
            store,
            8,
            8,
        ),
    );
    let gated = Gated {
        inner: inner.model,
        open: Arc::clone(&open),
    };
    let e = engine(Box::new(gated), inner.store);
    let mut o = opts(None);
    o.queue = 1;
    let (st, _, _) = state(e, &o, || 0);
    let app = routes::router(Arc::clone(&st));
    let spawn = |app: axum::Router| {
        tokio::spawn(async move { call(&app, "/v1/chat/completions", chat("Hi", json!({}))).await })
    };
    let first = spawn(app.clone());
    while st
        .metrics
        .in_flight
        .load(std::sync::atomic::Ordering::SeqCst)
        == 0
    {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let second = spawn(app.clone());
    while st.metrics.queued.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let r = app
        .clone()
        .oneshot(
            Request::post("/v1/chat/completions")
                .header("content-type", "application/json")
                .body(Body::from(chat("Hi", json!({})).to_string()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.headers()["retry-after"], "1");
    *open.0.lock().unwrap() = true;
    open.1.notify_all();
    for h in [first, second] {
        let (s, b) = h.await.unwrap();
        assert_eq!(s, StatusCode::OK);
        assert!(b.contains("\"content\":\"Hi\""), "{b}");
    }
}

/// `/v1/completions` takes a raw prompt (here one the echo model answers), streams
/// `text_completion` chunks, and reports logprobs in the legacy shape.
#[tokio::test]
async fn completions_stream_and_legacy_logprobs() {
    let app = app_with(echo_engine(), None);
    let prompt = "<|im_start|>user\nOK go<|im_end|>\n<|im_start|>assistant\n";
    let body = json!({"model": "qwen3_moe", "prompt": prompt, "max_tokens": 10,
        "stream": true, "stop": " g"});
    let (s, b) = call(&app, "/v1/completions", body).await;
    assert_eq!(s, StatusCode::OK);
    insta::assert_snapshot!(b);
    let body = json!({"model": "qwen3_moe", "prompt": [prompt], "max_tokens": 2, "logprobs": 1});
    let (s, b) = call(&app, "/v1/completions", body).await;
    assert_eq!(s, StatusCode::OK);
    let v: Value = serde_json::from_str(&b).unwrap();
    let c = &v["choices"][0];
    assert_eq!(c["text"], "OK");
    assert_eq!(c["finish_reason"], "length");
    assert_eq!(c["logprobs"]["tokens"], json!(["O", "K"]));
    assert_eq!(c["logprobs"]["text_offset"], json!([0, 1]));
    assert_eq!(
        c["logprobs"]["top_logprobs"][0].as_object().unwrap().len(),
        1
    );
    assert_eq!(v["usage"]["completion_tokens"], 2);
    let (s, e) = error_of(
        &app,
        "/v1/completions",
        json!({"model": "qwen3_moe", "prompt": "x", "echo": true}),
    )
    .await;
    assert_eq!((s, e["error"]["param"].as_str()), (400, Some("echo")));
}

/// A template's own `raise_exception` reaches the client as a 400 with its message.
#[tokio::test]
async fn a_template_raise_exception_is_a_400_with_its_message() {
    let mut e = echo_engine();
    e.template = Some(Arc::new(
        deltafin::tokenizer::chat::ChatTemplate::new(
            "{%- if messages[0].role != 'user' %}{{ raise_exception('the first message must be the user\\'s') }}{%- endif %}{{ messages[0].content }}",
            "",
            "",
        )
        .unwrap(),
    ));
    let app = app_with(e, None);
    let body = json!({"model": "qwen3_moe", "max_tokens": 4,
        "messages": [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "x"}]});
    let (s, err) = error_of(&app, "/v1/chat/completions", body).await;
    assert_eq!(s, 400, "{err}");
    assert_eq!(err["error"]["type"], "invalid_request_error");
    assert_eq!(err["error"]["param"], "messages");
    let m = err["error"]["message"].as_str().unwrap();
    assert!(m.contains("the first message must be the user's"), "{m}");
}
