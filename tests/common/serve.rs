//! The in-process OpenAI router over an *echo model* and the real Qwen3-MoE fixture, shared by
//! `tests/serve_api.rs` and `tests/serve_api_spec.rs` (see the former's module doc).

pub use std::path::PathBuf;
pub use std::sync::Arc;

pub use axum::body::Body;
pub use axum::http::{Request, StatusCode};
pub use deltafin::engine::{SamplerConfig, Session};
pub use deltafin::models::{KvCache, Logits, Model, Placement};
pub use deltafin::serve::generate::Engine;
pub use deltafin::serve::{routes, state, ServeOptions};
pub use deltafin::store::WeightStore;
pub use serde_json::{json, Value};
pub use tower::ServiceExt;

pub const IM_START: u32 = 481;
pub const IM_END: u32 = 482;
pub const VOCAB: usize = 512;

pub fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/qwen3_moe")
}

/// Answers the last user message's tokens, then `<|im_end|>`. The KV cache stores the ids
/// (one float per position), so the model sees the whole conversation.
pub struct Echo {
    pub placement: Placement,
    /// Tokens of `user\n` after `<|im_start|>`.
    pub user_head: usize,
    /// Tokens of `assistant\n` after `<|im_start|>`.
    pub asst_head: usize,
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
        let upto = cache.len + tokens.len();
        KvCache::reserve_rows(&mut cache.k[0], upto, cache.n_ctx, 1);
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
    /// One sequence after another (a mock: no batching).
    fn forward_batch(
        &self,
        s: &mut WeightStore,
        batch: &mut [deltafin::models::SeqPass<'_>],
    ) -> anyhow::Result<Vec<Vec<f32>>> {
        batch
            .iter_mut()
            .map(|p| self.forward(s, p.cache, p.tokens, p.logits))
            .collect()
    }
    fn placement(&self) -> &Placement {
        &self.placement
    }
}

pub fn greedy() -> SamplerConfig {
    SamplerConfig {
        temperature: 0.0,
        ..Default::default()
    }
}

pub fn engine(model: Box<dyn Model>, store: WeightStore) -> Engine {
    let opened = deltafin::load::open_any(Some(&fixture())).unwrap();
    let tok = opened.tokenizer().unwrap();
    let tmpl = opened.chat_template(&tok).unwrap();
    let session = Session::new(model, store, 1024, 64);
    Engine::new(session, Arc::new(tok), Some(Arc::new(tmpl)), greedy())
}

pub fn echo_engine() -> Engine {
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

pub fn real_engine() -> Engine {
    let opened = deltafin::load::open_any(Some(&fixture())).unwrap();
    let (model, store) = opened
        .load_weights(&deltafin::models::LoadOptions {
            n_ctx: 1024,
            ..Default::default()
        })
        .unwrap();
    engine(model, store)
}

pub fn opts(key: Option<&str>) -> ServeOptions {
    ServeOptions {
        host: "127.0.0.1".into(),
        port: 0,
        api_key: key.map(str::to_string),
        queue: 4,
        parallel: 1,
        slot_context: deltafin::serve::SlotContext::Split,
        body_limit: 8192,
        model_id: "qwen3_moe".into(),
        seed: Some(1),
        allowed_hosts: Vec::new(),
        cors_origins: Vec::new(),
        timeout: None,
        idle_timeout: std::time::Duration::from_secs(30),
        body_timeout: std::time::Duration::from_secs(10),
        write_timeout: std::time::Duration::from_secs(60),
    }
}

pub fn app_with(engine: Engine, key: Option<&str>) -> axum::Router {
    let (st, _, _) = state(engine, &opts(key), || 0);
    routes::router(st)
}

pub async fn call(app: &axum::Router, path: &str, body: Value) -> (StatusCode, String) {
    let req = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    send(app, req).await
}

pub async fn send(app: &axum::Router, req: Request<Body>) -> (StatusCode, String) {
    let r = app.clone().oneshot(req).await.unwrap();
    let status = r.status();
    let b = axum::body::to_bytes(r.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, String::from_utf8(b.to_vec()).unwrap())
}

pub fn chat(user: &str, extra: Value) -> Value {
    let mut v = json!({"model": "qwen3_moe", "max_tokens": 40,
        "messages": [{"role": "user", "content": user}]});
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

pub async fn stream(user: &str, extra: Value) -> String {
    let app = app_with(echo_engine(), None);
    let mut e = extra;
    e["stream"] = json!(true);
    let (s, body) = call(&app, "/v1/chat/completions", chat(user, e)).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    body
}

/// `s` with every fresh tool call id (`call_` and 24 hex digits, different in each answer)
/// written `call_ID`, so answers compare.
#[allow(dead_code)]
pub fn mask_call_ids(s: &str) -> String {
    regex::Regex::new("call_[0-9a-f]{24}")
        .unwrap()
        .replace_all(s, "call_ID")
        .into_owned()
}

pub fn weather_tool() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])
}
