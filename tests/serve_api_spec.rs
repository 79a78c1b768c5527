//! Speculative decoding through the OpenAI router (`--lookup` and `--draft mtp` in `serve`): streams, whole bodies,
//! logprobs, usage and metrics identical to plain decoding; the echo model and the real fixture of
//! `tests/common/serve.rs` (see `tests/serve_api.rs`).

mod common;

use common::serve::*;
use deltafin::engine::draft::LookupDraft;
use deltafin::engine::{SpecConfig, Speculator};

/// `engine` decoding speculatively with prompt lookup (default settings).
/// The engine with prompt lookup at fixed draft lengths (`--draft-fixed`): the adaptive
/// policy times resident passes, so whether it verifies would depend on the machine's load,
/// and these tests assert accepted drafts.
fn with_lookup(mut e: Engine) -> Engine {
    e.spec = Some(Speculator::new(
        Box::new(LookupDraft::default()),
        SpecConfig {
            adaptive: false,
            ..SpecConfig::default()
        },
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
        assert_eq!(mask_call_ids(&spec), mask_call_ids(&plain), "{user}");
        let whole = chat(user, extra);
        let plain =
            mask_call_ids(&call_on(echo_engine(), "/v1/chat/completions", whole.clone()).await);
        let spec = mask_call_ids(
            &call_on(with_lookup(echo_engine()), "/v1/chat/completions", whole).await,
        );
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
        steering: Default::default(),
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

/// An engine over the `deepseek_v3_mtp` fixture (its own tokenizer and chat template), with
/// its multi-token-prediction layer drafting (`--draft mtp`) at the fixed draft length
/// `draft` (`--draft-max N --draft-fixed`: these tests assert accepted drafts), or plain
/// (loaded without the layer) with `None`.
fn mtp_engine(draft: Option<usize>) -> Engine {
    use deltafin::engine::draft_mtp::MtpDraft;
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/deepseek_v3_mtp");
    let opened = deltafin::load::open_any(Some(&path)).unwrap();
    let tok = opened.tokenizer().unwrap();
    let tmpl = opened.chat_template(&tok).unwrap();
    let (model, store) = opened
        .load_weights(&deltafin::models::LoadOptions {
            n_ctx: 256,
            mtp: draft.is_some(),
            ..Default::default()
        })
        .unwrap();
    let session = Session::new(model, store, 256, 64);
    let mut e = Engine::new(session, Arc::new(tok), Some(Arc::new(tmpl)), greedy());
    if let Some(k) = draft {
        let d = MtpDraft::new(&e.session, &greedy()).unwrap();
        e.spec = Some(Speculator::new(
            Box::new(d),
            SpecConfig {
                draft_max: k,
                draft_min: 1,
                adaptive: false,
            },
        ));
    }
    e
}

/// `--draft mtp` through the router on the DeepSeek V3 fixture with its MTP layer: greedy
/// /v1/completions and /v1/chat/completions, streamed and whole, answer exactly what the
/// model answers without speculation (logprobs too, bit for bit), over requests that reuse
/// the previous request's KV cache; `usage` reports the source `mtp` and its counters.
#[tokio::test]
async fn draft_mtp_through_the_router_answers_what_plain_decoding_answers() {
    let r: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/hf/deepseek_v3_mtp/reference.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let prompt = r["prompt_text"].as_str().unwrap();
    let plain = app_with(mtp_engine(None), None);
    let spec = app_with(mtp_engine(Some(3)), None);
    let completion = |extra: Value| {
        let mut v = json!({"model": "qwen3_moe", "prompt": prompt, "max_tokens": 20});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    };
    let requests = [
        ("/v1/completions", completion(json!({}))),
        ("/v1/completions", completion(json!({"stream": true}))),
        ("/v1/completions", completion(json!({"logprobs": 2}))),
        (
            "/v1/chat/completions",
            chat("Which experts?", json!({"max_tokens": 20})),
        ),
        (
            "/v1/chat/completions",
            chat("Which experts?", json!({"max_tokens": 20, "stream": true})),
        ),
        (
            "/v1/chat/completions",
            chat(
                "Why café",
                json!({"max_tokens": 24, "logprobs": true, "top_logprobs": 2}),
            ),
        ),
    ];
    let mut got = Vec::new();
    for (path, body) in requests {
        let (s, a) = call(&plain, path, body.clone()).await;
        assert_eq!(s, StatusCode::OK, "{a}");
        let (s, b) = call(&spec, path, body.clone()).await;
        assert_eq!(s, StatusCode::OK, "{b}");
        if body["stream"] == json!(true) {
            assert_eq!(b, a, "{path} {body}");
            got.push(json!(null));
            continue;
        }
        let (a, b): (Value, Value) = (
            serde_json::from_str(&a).unwrap(),
            serde_json::from_str(&b).unwrap(),
        );
        assert_eq!(b["choices"], a["choices"], "{path} {body}");
        assert_eq!(
            b["usage"]["completion_tokens"],
            a["usage"]["completion_tokens"]
        );
        assert_eq!(
            b["usage"]["prompt_tokens_details"],
            a["usage"]["prompt_tokens_details"]
        );
        assert!(a["usage"].get("speculative").is_none(), "{a}");
        let sp = &b["usage"]["speculative"];
        assert_eq!(sp["source"], "mtp", "{sp}");
        let (drafted, accepted) = (
            sp["drafted"].as_u64().unwrap(),
            sp["accepted"].as_u64().unwrap(),
        );
        assert_eq!(
            b["usage"]["completion_tokens_details"],
            json!({"accepted_prediction_tokens": accepted,
                   "rejected_prediction_tokens": drafted - accepted})
        );
        got.push(json!([
            b["usage"]["completion_tokens"],
            b["usage"]["prompt_tokens_details"]["cached_tokens"],
            sp["drafted"],
            sp["accepted"],
            sp["verify_passes"],
            sp["plain_passes"]
        ]));
    }
    // [completion tokens, cached prompt tokens, drafted, accepted, verifications, plain
    // passes]: 3 drafts per verification but the last, whose one token left is a plain pass;
    // none accepted (the fixture's MTP layer has random weights: its drafts are never the
    // target's tokens). The chat requests reuse 1 and 3 tokens of the previous request's
    // cache, and draft from their first step (the layer rebuilds its entries from the target's
    // hidden rows of the reused prefix).
    assert_eq!(
        Value::Array(got),
        json!([
            [20, 0, 51, 0, 18, 1],
            null,
            [20, 37, 51, 0, 18, 1],
            [20, 1, 51, 0, 18, 1],
            null,
            [24, 3, 63, 0, 22, 1]
        ])
    );
}
