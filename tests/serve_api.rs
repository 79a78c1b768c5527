//! The OpenAI-compatible router in process (`tower::ServiceExt::oneshot`): whole SSE streams
//! as `insta` snapshots, request errors, the API key, the body limit, and KV prefix reuse.
//!
//! Most tests drive an *echo model*: a `Model` whose greedy answer to a chat is the token ids
//! of the last user message, then `<|im_end|>`, with the tokenizer and chat template of the
//! committed Qwen3-MoE fixture. That makes the streamed content exact and chosen by the test
//! (a stop string split across tokens, an emoji split across byte tokens, a tool call). The
//! KV reuse test runs the real fixture model.

use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use deltafin::engine::draft::LookupDraft;
use deltafin::engine::{SamplerConfig, Session, SpecConfig, Speculator};
use deltafin::models::{KvCache, Logits, Model, Placement};
use deltafin::serve::generate::Engine;
use deltafin::serve::{routes, state, ServeOptions};
use deltafin::store::WeightStore;
use serde_json::{json, Value};
use tower::ServiceExt;

const IM_START: u32 = 481;
const IM_END: u32 = 482;
const VOCAB: usize = 512;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/qwen3_moe")
}

/// Answers the last user message's tokens, then `<|im_end|>`. The KV cache stores the ids
/// (one float per position), so the model sees the whole conversation.
struct Echo {
    placement: Placement,
    /// Tokens of `user\n` after `<|im_start|>`.
    user_head: usize,
    /// Tokens of `assistant\n` after `<|im_start|>`.
    asst_head: usize,
}

impl Echo {
    /// The greedy token after `seq`: the next token of the last user message, or `<|im_end|>`.
    fn next_after(&self, seq: &[u32]) -> u32 {
        let starts: Vec<usize> = (0..seq.len()).filter(|&i| seq[i] == IM_START).collect();
        match starts.as_slice() {
            [.., u, a] => {
                let content = &seq[u + 1 + self.user_head..];
                let end = content.iter().position(|&t| t == IM_END).unwrap_or(0);
                let k = seq.len() - (a + 1 + self.asst_head);
                content[..end].get(k).copied().unwrap_or(IM_END)
            }
            _ => IM_END,
        }
    }
}

impl Model for Echo {
    fn vocab_size(&self) -> usize {
        VOCAB
    }
    fn context_length(&self) -> usize {
        1024
    }
    fn new_cache(&self, n_ctx: usize) -> KvCache {
        KvCache::new(1, n_ctx.min(1024), 1)
    }
    fn forward(
        &self,
        _: &mut WeightStore,
        cache: &mut KvCache,
        tokens: &[u32],
        logits: Logits,
    ) -> anyhow::Result<Vec<f32>> {
        anyhow::ensure!(cache.len + tokens.len() <= cache.n_ctx, "context full");
        for (i, &t) in tokens.iter().enumerate() {
            cache.k[0][cache.len + i] = t as f32;
        }
        let base = cache.len;
        cache.len += tokens.len();
        let seq: Vec<u32> = cache.k[0][..cache.len].iter().map(|&f| f as u32).collect();
        let first = match logits {
            Logits::Last => cache.len,
            Logits::All => base + 1,
        };
        let mut out = Vec::new();
        for end in first..=cache.len {
            let next = self.next_after(&seq[..end]);
            let mut l = vec![0.0f32; VOCAB];
            l[next as usize] = 10.0;
            l[(next as usize + 1) % VOCAB] = 5.0;
            out.extend_from_slice(&l);
        }
        Ok(out)
    }
    fn placement(&self) -> &Placement {
        &self.placement
    }
}

fn greedy() -> SamplerConfig {
    SamplerConfig {
        temperature: 0.0,
        ..Default::default()
    }
}

fn engine(model: Box<dyn Model>, store: WeightStore) -> Engine {
    let opened = deltafin::load::open_any(Some(&fixture())).unwrap();
    let tok = opened.tokenizer().unwrap();
    let tmpl = opened.chat_template(&tok).unwrap();
    let session = Session::new(model, store, 1024, 64);
    Engine::new(session, Arc::new(tok), Some(Arc::new(tmpl)), greedy())
}

fn echo_engine() -> Engine {
    let opened = deltafin::load::open_any(Some(&fixture())).unwrap();
    let tok = opened.tokenizer().unwrap();
    let n = |s: &str| tok.encode_chat(s).unwrap().len();
    let model = Echo {
        placement: Placement::default(),
        user_head: n("user\n"),
        asst_head: n("assistant\n"),
    };
    let store = WeightStore::open(&[], Vec::new(), &[], 0, 0, false).unwrap();
    engine(Box::new(model), store)
}

fn real_engine() -> Engine {
    let opened = deltafin::load::open_any(Some(&fixture())).unwrap();
    let (model, store) = opened
        .load_weights(&deltafin::models::LoadOptions {
            n_ctx: 1024,
            ..Default::default()
        })
        .unwrap();
    engine(model, store)
}

fn opts(key: Option<&str>) -> ServeOptions {
    ServeOptions {
        host: "127.0.0.1".into(),
        port: 0,
        api_key: key.map(str::to_string),
        queue: 4,
        body_limit: 8192,
        model_id: "qwen3_moe".into(),
        seed: Some(1),
    }
}

fn app_with(engine: Engine, key: Option<&str>) -> axum::Router {
    let (st, _, _) = state(engine, &opts(key), || 0);
    routes::router(st)
}

async fn call(app: &axum::Router, path: &str, body: Value) -> (StatusCode, String) {
    let req = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    send(app, req).await
}

async fn send(app: &axum::Router, req: Request<Body>) -> (StatusCode, String) {
    let r = app.clone().oneshot(req).await.unwrap();
    let status = r.status();
    let b = axum::body::to_bytes(r.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, String::from_utf8(b.to_vec()).unwrap())
}

fn chat(user: &str, extra: Value) -> Value {
    let mut v = json!({"model": "qwen3_moe", "max_tokens": 40,
        "messages": [{"role": "user", "content": user}]});
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

async fn stream(user: &str, extra: Value) -> String {
    let app = app_with(echo_engine(), None);
    let mut e = extra;
    e["stream"] = json!(true);
    let (s, body) = call(&app, "/v1/chat/completions", chat(user, e)).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    body
}

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

fn weather_tool() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])
}

#[tokio::test]
async fn stream_tool_call() {
    let call = "Let me look.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    insta::assert_snapshot!(
        stream(call, json!({"tools": weather_tool(), "max_tokens": 100})).await
    );
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
    let (s, e) = error_of(&app, path, chat("x", json!({"n": 2}))).await;
    assert_eq!(s, 400);
    assert_eq!(
        e,
        json!({"error": {"message": "n is 2, but this server generates one choice per request (n = 1)",
            "type": "invalid_request_error", "param": "n", "code": null}})
    );
    let (s, e) = error_of(&app, path, chat("x", json!({"model": "gpt-4"}))).await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (404, Some("model_not_found"))
    );
    let (s, e) = error_of(
        &app,
        path,
        chat("x", json!({"response_format": {"type": "json_object"}})),
    )
    .await;
    assert_eq!(s, 400);
    assert_eq!(
        e["error"]["message"],
        "response_format type 'json_object' is not supported (only 'text')"
    );
    let (s, e) = error_of(&app, path, chat("x", json!({"temperature": "hot"}))).await;
    assert_eq!(s, 400);
    let m = e["error"]["message"].as_str().unwrap();
    assert!(
        m.starts_with("the body does not match the request schema: invalid type: string \"hot\", expected f32"),
        "{m}"
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
    fn forward(
        &self,
        s: &mut WeightStore,
        c: &mut KvCache,
        t: &[u32],
        l: Logits,
    ) -> anyhow::Result<Vec<f32>> {
        let (m, cv) = &*self.open;
        let mut g = m.lock().unwrap();
        while !*g {
            g = cv.wait(g).unwrap();
        }
        drop(g);
        self.inner.forward(s, c, t, l)
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

/// `engine` decoding speculatively with prompt lookup (default settings).
fn with_lookup(mut e: Engine) -> Engine {
    e.spec = Some(Speculator::new(
        Box::new(LookupDraft::default()),
        SpecConfig::default(),
    ));
    e
}

async fn call_on(e: Engine, path: &str, body: Value) -> String {
    let (s, b) = call(&app_with(e, None), path, body).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    b
}

/// With `--lookup` the server streams the same events as without: text split the same way,
/// stop strings cut in the same place, the same logprobs, the same tool calls. The echo model
/// answers its prompt's text, so lookup drafts (and the model accepts) most of the answer.
#[tokio::test]
async fn speculation_streams_exactly_what_plain_decoding_streams() {
    let tool_call = "Let me look.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    let cases = [
        ("Hello there, hello there", json!({})),
        ("one two STOP three", json!({"stop": ["STOP", "zzz"]})),
        ("a🦀b a🦀b", json!({})),
        ("Hey Hey Hey", json!({"logprobs": true, "top_logprobs": 2})),
        (
            tool_call,
            json!({"tools": weather_tool(), "max_tokens": 100}),
        ),
        ("abc abc abc abc", json!({"max_tokens": 9})),
    ];
    for (user, extra) in cases {
        let mut e = extra.clone();
        e["stream"] = json!(true);
        let body = chat(user, e);
        let plain = call_on(echo_engine(), "/v1/chat/completions", body.clone()).await;
        let spec = call_on(with_lookup(echo_engine()), "/v1/chat/completions", body).await;
        assert_eq!(spec, plain, "{user}");
        let whole = chat(user, extra);
        let plain = call_on(echo_engine(), "/v1/chat/completions", whole.clone()).await;
        let spec = call_on(with_lookup(echo_engine()), "/v1/chat/completions", whole).await;
        let (p, s): (Value, Value) = (
            serde_json::from_str(&plain).unwrap(),
            serde_json::from_str(&spec).unwrap(),
        );
        assert_eq!(s["choices"], p["choices"], "{user}");
        assert_eq!(
            s["usage"]["completion_tokens"],
            p["usage"]["completion_tokens"]
        );
        assert!(p["usage"].get("speculative").is_none(), "{plain}");
        let sp = &s["usage"]["speculative"];
        assert_eq!(sp["source"], "lookup");
        let (drafted, accepted) = (
            sp["drafted"].as_u64().unwrap(),
            sp["accepted"].as_u64().unwrap(),
        );
        assert!(accepted > 0, "{user}: {sp}");
        assert_eq!(
            s["usage"]["completion_tokens_details"],
            json!({"accepted_prediction_tokens": accepted,
                   "rejected_prediction_tokens": drafted - accepted})
        );
    }
    // the completions endpoint, streamed with a stop string
    let prompt = "<|im_start|>user\nOK go OK go<|im_end|>\n<|im_start|>assistant\n";
    let body = json!({"model": "qwen3_moe", "prompt": prompt, "max_tokens": 10,
        "stream": true, "stop": " go"});
    let plain = call_on(echo_engine(), "/v1/completions", body.clone()).await;
    let spec = call_on(with_lookup(echo_engine()), "/v1/completions", body).await;
    assert_eq!(spec, plain);
    assert!(
        plain.contains("\"text\":\"K\"") && !plain.contains("go"),
        "{plain}"
    );
}

/// Speculation's counters per request in `usage` and summed in /metrics. The echo model
/// answers "abc abc abc abc" (tokens `a b c ␣a b c ␣a b c ␣a b c`) with those 12 tokens and
/// `<|im_end|>`: the first from the prompt's logits; then a verification of 8 drafts (the prompt's
/// `\n a` matched, the 8 tokens after it), all accepted, plus the model's `␣a`; then one of the 3
/// tokens that followed the latest earlier `b c ␣a` (in the output), 2 accepted, plus
/// `<|im_end|>`.
#[tokio::test]
async fn speculation_counters_reach_usage_and_metrics() {
    // a fixed draft length of 8 (`--draft-fixed`): the adaptive policy times passes here
    let mut e = echo_engine();
    e.spec = Some(Speculator::new(
        Box::new(LookupDraft::default()),
        SpecConfig {
            draft_max: 8,
            draft_min: 1,
            adaptive: false,
        },
    ));
    let app = app_with(e, None);
    let mut accepted = 0;
    let mut drafted = 0;
    let mut passes = 0;
    for user in ["abc abc abc abc", "xyz xyz"] {
        let (_, b) = call(&app, "/v1/chat/completions", chat(user, json!({}))).await;
        let v: Value = serde_json::from_str(&b).unwrap();
        assert_eq!(v["choices"][0]["message"]["content"], user);
        let sp = &v["usage"]["speculative"];
        let n = v["usage"]["completion_tokens"].as_u64().unwrap();
        // every token after the first came from a verification or a plain pass (the last
        // pass may yield more than the answer used)
        assert!(
            sp["verify_tokens"].as_u64().unwrap() + sp["plain_passes"].as_u64().unwrap() >= n - 1,
            "{sp}"
        );
        if user == "abc abc abc abc" {
            assert_eq!(n, 13, "{sp}");
            assert_eq!(
                (
                    &sp["drafted"],
                    &sp["accepted"],
                    &sp["verify_passes"],
                    &sp["plain_passes"]
                ),
                (&json!(11), &json!(10), &json!(2), &json!(0)),
                "{sp}"
            );
        }
        accepted += sp["accepted"].as_u64().unwrap();
        drafted += sp["drafted"].as_u64().unwrap();
        passes += sp["verify_passes"].as_u64().unwrap();
    }
    assert!(accepted > 0 && passes > 0);
    let (s, m) = send(&app, Request::get("/metrics").body(Body::empty()).unwrap()).await;
    assert_eq!(s, StatusCode::OK);
    for line in [
        format!("deltafin_spec_accepted_tokens_total {accepted}\n"),
        format!("deltafin_spec_drafted_tokens_total {drafted}\n"),
        format!("deltafin_spec_verify_passes_total {passes}\n"),
    ] {
        assert!(m.contains(&line), "{line} in {m}");
    }
}

/// The real fixture model, resident and streamed (every weight read per pass), answers the
/// same text and the same logprobs (bit for bit: they come from the verification pass's
/// logits, which are the target's) with and without speculation, over two turns (the second
/// reusing the first's KV cache); a seeded sampled request repeats.
#[tokio::test]
async fn speculation_on_the_real_model_keeps_text_logprobs_and_prefix_reuse() {
    let streamed = {
        let mut b = 4u64 << 10;
        loop {
            let opened = deltafin::load::open_any(Some(&fixture())).unwrap();
            let o = deltafin::models::LoadOptions {
                n_ctx: 1024,
                ram_budget: Some(b),
                ..Default::default()
            };
            match opened.load_weights(&o) {
                Ok(_) => break b,
                Err(_) => b += 4 << 10,
            }
        }
    };
    let load = |budget: Option<u64>| {
        let opened = deltafin::load::open_any(Some(&fixture())).unwrap();
        let (model, store) = opened
            .load_weights(&deltafin::models::LoadOptions {
                n_ctx: 1024,
                ram_budget: budget,
                ..Default::default()
            })
            .unwrap();
        if budget.is_some() {
            assert_eq!(model.placement().resident_bytes, 0);
        }
        engine(model, store)
    };
    let turn1 = json!({"model": "qwen3_moe", "max_tokens": 24, "logprobs": true,
        "top_logprobs": 3,
        "messages": [{"role": "user", "content": "Hello Hello Hello Hello"}]});
    for budget in [None, Some(streamed)] {
        let plain = app_with(load(budget), None);
        let spec = app_with(with_lookup(load(budget)), None);
        let (_, a) = call(&plain, "/v1/chat/completions", turn1.clone()).await;
        let (_, b) = call(&spec, "/v1/chat/completions", turn1.clone()).await;
        let (a, b): (Value, Value) = (
            serde_json::from_str(&a).unwrap(),
            serde_json::from_str(&b).unwrap(),
        );
        assert_eq!(b["choices"], a["choices"], "budget {budget:?}");
        let sp = &b["usage"]["speculative"];
        // drafts were accepted, so some logprobs come from inside a verification pass
        assert!(sp["accepted"].as_u64().unwrap() > 0, "{sp}");
        if budget.is_some() {
            assert!(sp["verify_bytes"].as_u64().unwrap() > 0, "{sp}");
        }
        let answer = a["choices"][0]["message"]["content"].as_str().unwrap();
        let turn2 = json!({"model": "qwen3_moe", "max_tokens": 16, "logprobs": true,
            "messages": [
            {"role": "user", "content": "Hello Hello Hello Hello"},
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "More"}]});
        let (_, a) = call(&plain, "/v1/chat/completions", turn2.clone()).await;
        let (_, b) = call(&spec, "/v1/chat/completions", turn2).await;
        let (a, b): (Value, Value) = (
            serde_json::from_str(&a).unwrap(),
            serde_json::from_str(&b).unwrap(),
        );
        assert_eq!(b["choices"], a["choices"], "turn 2, budget {budget:?}");
        let cached = b["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        assert!(cached > 10, "{b}");
        assert_eq!(
            cached,
            a["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap()
        );
    }
    // sampled with a seed: the same request twice gives the same answer
    let spec = app_with(with_lookup(load(None)), None);
    let sampled = json!({"model": "qwen3_moe", "max_tokens": 24, "temperature": 0.9,
        "seed": 7, "messages": [{"role": "user", "content": "Hello Hello Hello"}]});
    let (_, a) = call(&spec, "/v1/chat/completions", sampled.clone()).await;
    let (_, other) = call(&spec, "/v1/chat/completions", turn1).await;
    let (_, b) = call(&spec, "/v1/chat/completions", sampled).await;
    let (a, b): (Value, Value) = (
        serde_json::from_str(&a).unwrap(),
        serde_json::from_str(&b).unwrap(),
    );
    assert!(other.contains("\"speculative\""));
    assert_eq!(a["choices"], b["choices"]);
}

/// A speculative generation cancelled after its third token has emitted exactly what a plain
/// one cancelled there emits, and the next request (reusing the cache the cancelled one left)
/// answers what a fresh engine answers.
#[test]
fn a_cancelled_speculative_generation_leaves_a_sound_cache() {
    use deltafin::serve::generate::{FinishReason, Params};
    let opened = deltafin::load::open_any(Some(&fixture())).unwrap();
    let tok = opened.tokenizer().unwrap();
    let tmpl = opened.chat_template(&tok).unwrap();
    let ids = |user: &str| {
        tok.encode_messages_json(
            &tmpl,
            &json!([{"role": "user", "content": user}]),
            None,
            true,
        )
        .unwrap()
    };
    let p = Params {
        sampler: greedy(),
        max_tokens: 12,
        stop: Vec::new(),
        logprobs: None,
        tools: None,
    };
    let run = |e: &mut Engine, prompt: &[u32], cancel_after: Option<usize>| {
        let checks = std::cell::Cell::new(0usize);
        let mut text = String::new();
        let o = e
            .generate(prompt, &p, &mut |c| text.push_str(&c.text), &|| {
                checks.set(checks.get() + 1);
                cancel_after.is_some_and(|n| checks.get() > n)
            })
            .unwrap();
        (text, o.finish, o.completion_tokens)
    };
    let first = ids("Hello Hello Hello Hello");
    let second = ids("Hi Hi Hi");
    let mut plain = real_engine();
    let mut spec = with_lookup(real_engine());
    let a = run(&mut plain, &first, Some(3));
    let b = run(&mut spec, &first, Some(3));
    assert_eq!(a, b);
    assert_eq!((a.1, a.2), (FinishReason::Cancelled, 3));
    let want = run(&mut real_engine(), &second, None);
    assert_eq!(run(&mut spec, &second, None), want);
    assert_eq!(run(&mut spec, &first, None), run(&mut plain, &first, None));
}
