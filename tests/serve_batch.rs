//! Continuous batching (`serve --parallel N`, `deltafin::engine::slots`): requests decoded
//! together give each the text, tokens, logprobs and finish it gets alone; a long prompt is
//! prefilled in chunks beside the decoding slots; each slot keeps its prefix for the next
//! request; a cancelled request leaves the others as they were; the server answers concurrent
//! requests as it answers them one by one.

mod common;

use std::cell::RefCell;

use common::serve::*;
use deltafin::engine::slots::{slot_ctx, Request, SlotContext, Slots};
use deltafin::engine::{
    Chunk, FinishReason, GrammarSpec, Guide, Outcome, Params, SamplerConfig, Steering,
};

/// What a request produced: its chunks' text and logprob tokens, and its outcome.
#[derive(Default, Debug, Clone, PartialEq)]
struct Got {
    text: String,
    lp_tokens: Vec<String>,
    lp_values: Vec<f32>,
    outcome: Option<Outcome>,
}

impl Got {
    fn outcome(&self) -> &Outcome {
        self.outcome.as_ref().expect("the request ended")
    }
    /// Everything but the timings.
    fn same(&self, other: &Got) {
        assert_eq!(self.text, other.text);
        assert_eq!(self.lp_tokens, other.lp_tokens);
        assert_eq!(self.lp_values, other.lp_values);
        let (a, b) = (self.outcome(), other.outcome());
        assert_eq!(a.finish, b.finish);
        assert_eq!(a.completion_tokens, b.completion_tokens);
        assert_eq!(a.prompt_tokens, b.prompt_tokens);
        assert_eq!(a.tool_calls, b.tool_calls);
    }
}

fn add_chunk(g: &RefCell<Got>, c: Chunk) {
    let mut g = g.borrow_mut();
    g.text.push_str(&c.text);
    for l in c.logprobs {
        g.lp_tokens.push(l.token.clone());
        g.lp_values.push(l.logprob);
    }
}

fn request<'a>(
    prompt: &[u32],
    p: &Params,
    got: &'a RefCell<Got>,
    cancel: Box<dyn Fn() -> bool + 'a>,
) -> Request<'a> {
    Request {
        prompt: prompt.to_vec(),
        params: p.clone(),
        emit: Box::new(move |c| add_chunk(got, c)),
        cancelled: cancel,
        done: Box::new(move |r| got.borrow_mut().outcome = Some(r.expect("no error"))),
    }
}

fn never<'a>() -> Box<dyn Fn() -> bool + 'a> {
    Box::new(|| false)
}

fn params(sampler: SamplerConfig, max_tokens: usize) -> Params {
    Params {
        sampler,
        max_tokens,
        stop: Vec::new(),
        logprobs: None,
        tools: None,
        steering: Default::default(),
    }
}

fn sampled(seed: u64) -> SamplerConfig {
    SamplerConfig {
        temperature: 0.9,
        seed,
        ..Default::default()
    }
}

/// `prompt` run alone through `Engine::generate` on a fresh engine.
fn alone(prompt: &[u32], p: &Params) -> Got {
    let mut e = real_engine();
    let got = RefCell::new(Got::default());
    let o = e
        .generate(prompt, p, &mut |c| add_chunk(&got, c), &|| false)
        .unwrap();
    got.borrow_mut().outcome = Some(o);
    got.into_inner()
}

fn ids(text: &str) -> Vec<u32> {
    real_engine().tok.encode_prompt(text, true).unwrap()
}

#[test]
fn requests_decoded_together_get_their_text_alone() {
    let prompts = [
        ids("The capital of France is"),
        ids("Once upon a time, in a land far away, there lived"),
        ids("1, 2, 3,"),
        ids("Rust is"),
    ];
    let mut with_lp = params(greedy(), 9);
    with_lp.logprobs = Some(2);
    let mut ps = vec![
        params(greedy(), 12),
        params(sampled(7), 10),
        with_lp,
        params(sampled(11), 14),
    ];
    // a stop string taken from the last request's own text, so that it ends early
    let whole = alone(&prompts[3], &ps[3]).text;
    let stop: String = whole.chars().skip(6).take(3).collect();
    assert_eq!(stop.chars().count(), 3, "the text {whole:?} is long enough");
    ps[3].stop = vec![stop];
    let want: Vec<Got> = prompts.iter().zip(&ps).map(|(t, p)| alone(t, p)).collect();
    assert_eq!(want[3].outcome().finish, FinishReason::Stop);
    assert!(want[3].outcome().completion_tokens < 14);

    let mut e = real_engine();
    let tok = Arc::clone(&e.tok);
    let got: Vec<RefCell<Got>> = (0..4).map(|_| RefCell::default()).collect();
    let mut slots = Slots::new(&mut e.session, &tok, 4, SlotContext::Split);
    assert_eq!(slots.n_ctx(), 256);
    for ((t, p), g) in prompts.iter().zip(&ps).zip(&got) {
        slots.admit(request(t, p, g, never()));
    }
    assert_eq!(slots.running(), 4);
    let mut steps = 0;
    while slots.running() > 0 {
        assert!(slots.step(&mut e.session) > 0);
        steps += 1;
    }
    for (g, w) in got.iter().zip(&want) {
        g.borrow().same(w);
    }
    // every prompt fits one step: one step per token of the longest request, not their sum
    let longest = want.iter().map(|w| w.outcome().completion_tokens).max();
    assert_eq!(Some(steps), longest);
    assert_eq!(got[2].borrow().lp_tokens.len(), 9);
}

/// The slots sample their tokens in parallel: sampled requests under a grammar (its matcher
/// advanced once per token handed out), with a bias, and plain, decoded together, each get
/// the text they get alone; the grammar's text is (the start of) a JSON object.
#[test]
fn steered_and_sampled_requests_decoded_together_get_their_text_alone() {
    let e = real_engine();
    let guide = Guide::new(&e.tok).unwrap();
    let json = |seed| {
        let mut p = params(sampled(seed), 40);
        p.steering = Steering {
            eog: e.tok.eog_ids().to_vec(),
            grammar: Some(guide.compile(&GrammarSpec::JsonObject).unwrap()),
            ..Default::default()
        };
        p
    };
    let mut biased = params(sampled(5), 12);
    biased.steering.bias = vec![(100, 4.0), (101, -3.0)];
    let prompts = [
        ids("Give me a JSON object:"),
        ids("The capital of France is"),
        ids("A list in JSON:"),
        ids("Rust is"),
        ids("1, 2, 3,"),
    ];
    let ps = [
        json(3),
        params(sampled(9), 16),
        json(4),
        biased,
        params(greedy(), 8),
    ];
    let want: Vec<Got> = prompts.iter().zip(&ps).map(|(t, p)| alone(t, p)).collect();
    for w in [&want[0], &want[2]] {
        // the fixture's random weights rarely close the object within 40 tokens
        assert!(w.text.starts_with('{'), "{:?}", w.text);
        if w.outcome().finish == FinishReason::Stop {
            let v: Value = serde_json::from_str(&w.text).expect("the grammar's text parses");
            assert!(v.is_object(), "{}", w.text);
        }
    }

    let mut e = real_engine();
    let tok = Arc::clone(&e.tok);
    let got: Vec<RefCell<Got>> = (0..5).map(|_| RefCell::default()).collect();
    let mut slots = Slots::new(&mut e.session, &tok, 5, SlotContext::Split);
    for ((t, p), g) in prompts.iter().zip(&ps).zip(&got) {
        slots.admit(request(t, p, g, never()));
    }
    while slots.running() > 0 {
        assert!(slots.step(&mut e.session) > 0);
    }
    for (g, w) in got.iter().zip(&want) {
        g.borrow().same(w);
    }
}

#[test]
fn a_long_prompt_is_prefilled_in_chunks_beside_a_decoding_request() {
    let long = ids("A long prompt that takes several steps to prefill, four rows at a time.");
    let n_long = long.len();
    assert!(n_long > 12, "{n_long} tokens");
    let (pa, pb) = (params(greedy(), 30), params(greedy(), 5));
    // a three-token prompt whose greedy answer runs to max_tokens (no end-of-turn token)
    let (short, want_a) = [
        "Hello there",
        "Count with me",
        "Numbers and letters",
        "Go on",
    ]
    .iter()
    .map(|t| ids(t)[..3].to_vec())
    .map(|p| (p.clone(), alone(&p, &pa)))
    .find(|(_, g)| g.outcome().completion_tokens == 30)
    .expect("a prompt whose answer is 30 tokens long");
    let want_b = alone(&long, &pb);

    let mut e = real_engine();
    e.session.n_batch = 4;
    let tok = Arc::clone(&e.tok);
    let (ga, gb) = (RefCell::default(), RefCell::default());
    let mut slots = Slots::new(&mut e.session, &tok, 2, SlotContext::Split);
    slots.admit(request(&short, &pa, &ga, never()));
    // the short prompt (at most 4 rows) gives its first token in one step
    assert_eq!(slots.step(&mut e.session), short.len());
    slots.admit(request(&long, &pb, &gb, never()));
    let mut rows = Vec::new();
    while gb.borrow().outcome.is_none() {
        rows.push(slots.step(&mut e.session));
    }
    // one decode row of the short request per step; the other three rows go to the long
    // prompt until it is in, then one row each
    let chunks = n_long.div_ceil(3);
    let mut want_rows = vec![4; n_long / 3];
    if !n_long.is_multiple_of(3) {
        want_rows.push(1 + n_long % 3);
    }
    want_rows.extend(std::iter::repeat_n(2, 4));
    assert_eq!(rows, want_rows, "{n_long}-token prompt in {chunks} chunks");
    while slots.running() > 0 {
        slots.step(&mut e.session);
    }
    ga.borrow().same(&want_a);
    gb.borrow().same(&want_b);
}

#[test]
fn each_slot_keeps_its_prefix_for_the_next_request() {
    let p1 = ids("The first conversation starts with these words and goes on");
    let p2 = ids("Another one");
    let mut e = real_engine();
    let tok = Arc::clone(&e.tok);
    let mut slots = Slots::new(&mut e.session, &tok, 2, SlotContext::Split);
    let run = |slots: &mut Slots, e: &mut Engine, prompt: &[u32]| -> Outcome {
        let g = std::rc::Rc::new(RefCell::new(None));
        let g2 = std::rc::Rc::clone(&g);
        slots.admit(Request {
            prompt: prompt.to_vec(),
            params: params(greedy(), 3),
            emit: Box::new(|_| {}),
            cancelled: never(),
            done: Box::new(move |r| *g2.borrow_mut() = Some(r.unwrap())),
        });
        while slots.running() > 0 {
            slots.step(&mut e.session);
        }
        g.take().unwrap()
    };
    assert_eq!(run(&mut slots, &mut e, &p1).cached_tokens, 0);
    assert_eq!(run(&mut slots, &mut e, &p2).cached_tokens, 0);
    // a prompt sharing 8 tokens with the first conversation goes to its slot
    let mut p3 = p1[..8].to_vec();
    p3.extend(ids(" but then"));
    assert_eq!(run(&mut slots, &mut e, &p3).cached_tokens, 8);
    // the second slot still holds the second conversation
    let mut p4 = p2.clone();
    p4.extend(ids(" more"));
    assert_eq!(run(&mut slots, &mut e, &p4).cached_tokens, p2.len());
    // and the same prompt again reuses all of it but its last token
    let o = run(&mut slots, &mut e, &p4);
    assert_eq!(o.cached_tokens, p4.len() - 1);
}

#[test]
fn a_cancelled_request_leaves_the_others_as_they_were() {
    let (pa, pb) = (ids("Stop me"), ids("Let me finish"));
    let p = params(greedy(), 8);
    let want_b = alone(&pb, &p);
    let mut e = real_engine();
    let tok = Arc::clone(&e.tok);
    let (ga, gb) = (RefCell::default(), RefCell::default());
    let steps = std::cell::Cell::new(0);
    let mut slots = Slots::new(&mut e.session, &tok, 2, SlotContext::Split);
    slots.admit(request(&pa, &p, &ga, Box::new(|| steps.get() >= 3)));
    slots.admit(request(&pb, &p, &gb, never()));
    while slots.running() > 0 {
        slots.step(&mut e.session);
        steps.set(steps.get() + 1);
    }
    let a = ga.borrow();
    assert_eq!(a.outcome().finish, FinishReason::Cancelled);
    assert_eq!(a.outcome().completion_tokens, 3);
    gb.borrow().same(&want_b);
}

#[test]
fn a_prompt_longer_than_a_slot_is_refused() {
    let err = RefCell::new(None);
    let mut e = real_engine();
    let tok = Arc::clone(&e.tok);
    let mut slots = Slots::new(&mut e.session, &tok, 4, SlotContext::Split);
    assert_eq!(slot_ctx(1024, 4), 256);
    slots.admit(Request {
        prompt: vec![1; 256],
        params: params(greedy(), 4),
        emit: Box::new(|_| {}),
        cancelled: never(),
        done: Box::new(|r| *err.borrow_mut() = r.err()),
    });
    assert_eq!(
        err.borrow().as_deref(),
        Some("the prompt has 256 tokens but the context holds 256")
    );
    assert_eq!(slots.running(), 0);
}

/// The chat completion of `text`, greedy, as the server's whole answer.
fn chat_body(text: &str) -> Value {
    json!({"messages": [{"role": "user", "content": text}], "max_tokens": 10,
           "temperature": 0, "logprobs": true, "top_logprobs": 1})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_server_answers_concurrent_requests_as_it_answers_them_alone() {
    let texts = [
        "Hi there",
        "What is two plus two?",
        "Tell me a story",
        "Bye",
    ];
    let serial = app_with(real_engine(), None);
    let mut want = Vec::new();
    for t in texts {
        let (st, body) = call(&serial, "/v1/chat/completions", chat_body(t)).await;
        assert_eq!(st, StatusCode::OK, "{body}");
        want.push(serde_json::from_str::<Value>(&body).unwrap()["choices"].clone());
    }
    let mut o = opts(None);
    o.parallel = 3;
    let (st, _, _) = state(real_engine(), &o, || 0);
    assert_eq!(st.slots, 3);
    assert_eq!(st.n_ctx, 341);
    let app = routes::router(st);
    let tasks: Vec<_> = texts
        .iter()
        .map(|t| {
            let app = app.clone();
            let body = chat_body(t);
            tokio::spawn(async move { call(&app, "/v1/chat/completions", body).await })
        })
        .collect();
    for (task, w) in tasks.into_iter().zip(&want) {
        let (st, body) = task.await.unwrap();
        assert_eq!(st, StatusCode::OK, "{body}");
        let got = serde_json::from_str::<Value>(&body).unwrap()["choices"].clone();
        assert_eq!(&got, w);
    }
    let req = axum::http::Request::get("/props")
        .body(Body::empty())
        .unwrap();
    let (_, props) = send(&app, req).await;
    let props: Value = serde_json::from_str(&props).unwrap();
    assert_eq!(props["total_slots"], 3);
    assert_eq!(props["default_generation_settings"]["n_ctx"], 341);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn n_choices_are_the_requests_of_consecutive_seeds() {
    let body = |n: u32, seed: u64, stream: bool| {
        let mut b = json!({"messages": [{"role": "user", "content": "Say something"}],
               "max_tokens": 6, "temperature": 0.9, "seed": seed, "n": n, "stream": stream});
        if stream {
            // refused without a stream
            b["stream_options"] = json!({"include_usage": true});
        }
        b
    };
    let mut o = opts(None);
    o.parallel = 2;
    let (st, _, _) = state(real_engine(), &o, || 0);
    let app = routes::router(st);
    let mut single = Vec::new();
    let mut tokens = 0;
    for seed in 5..8 {
        let (code, b) = call(&app, "/v1/chat/completions", body(1, seed, false)).await;
        assert_eq!(code, StatusCode::OK, "{b}");
        let v: Value = serde_json::from_str(&b).unwrap();
        single.push(v["choices"][0]["message"]["content"].clone());
        tokens += v["usage"]["completion_tokens"].as_u64().unwrap();
    }
    assert_ne!(single[0], single[1], "different seeds, different texts");
    let (code, b) = call(&app, "/v1/chat/completions", body(3, 5, false)).await;
    assert_eq!(code, StatusCode::OK, "{b}");
    let v: Value = serde_json::from_str(&b).unwrap();
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["message"]["content"], single[i]);
    }
    assert_eq!(v["usage"]["completion_tokens"], tokens);

    // streamed: every choice's deltas under its index, a finish chunk each, usage at the end
    let (code, b) = call(&app, "/v1/chat/completions", body(3, 5, true)).await;
    assert_eq!(code, StatusCode::OK, "{b}");
    let mut text = vec![String::new(); 3];
    let mut finishes = 0;
    let mut usage = Value::Null;
    for line in b.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if line == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(line).unwrap();
        if let Some(c) = v["choices"].as_array().and_then(|c| c.first()) {
            let i = c["index"].as_u64().unwrap() as usize;
            text[i].push_str(c["delta"]["content"].as_str().unwrap_or(""));
            finishes += c["finish_reason"].is_string() as usize;
        } else {
            usage = v["usage"].clone();
        }
    }
    assert_eq!(finishes, 3);
    for (t, s) in text.iter().zip(&single) {
        assert_eq!(t, s.as_str().unwrap());
    }
    assert_eq!(usage["completion_tokens"], tokens);
    assert!(b.ends_with("data: [DONE]\n\n"));

    for bad in [0, 17] {
        let (code, b) = call(&app, "/v1/chat/completions", body(bad, 5, false)).await;
        assert_eq!(code, StatusCode::BAD_REQUEST);
        let v: Value = serde_json::from_str(&b).unwrap();
        assert_eq!(v["error"]["param"], "n");
        assert_eq!(
            v["error"]["message"],
            format!("n is {bad}, expected 1 to 4 (choices wait in the queue of --queue jobs)")
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_nobody_reads_is_cut_at_the_write_timeout_and_frees_its_slot() {
    let mut o = opts(None);
    o.write_timeout = std::time::Duration::ZERO;
    let (st, _, _) = state(real_engine(), &o, || 0);
    let metrics = Arc::clone(&st.metrics);
    let app = routes::router(st);
    let body = json!({"messages": [{"role": "user", "content": "Go on and on"}],
                      "max_tokens": 200, "ignore_eos": true, "stream": true});
    let req = axum::http::Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    // the response's body is not polled: its events wait unread
    let unread = app.clone().oneshot(req).await.unwrap();
    assert_eq!(unread.status(), StatusCode::OK);
    // the one slot is free again: a second request is answered whole
    let (code, b) = call(&app, "/v1/chat/completions", chat_body("Hi there")).await;
    assert_eq!(code, StatusCode::OK, "{b}");
    let generated = metrics
        .generated_tokens
        .load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        generated < 200,
        "the unread stream was cut: {generated} tokens in all"
    );
    let text = String::from_utf8(
        axum::body::to_bytes(unread.into_body(), usize::MAX)
            .await
            .unwrap()
            .to_vec(),
    )
    .unwrap();
    assert!(text.contains("\"code\":\"write_timeout\""), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"));
    assert!(!text.contains("finish_reason\":\"length"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_fills_the_free_slots_and_the_queue() {
    let mut o = opts(None);
    o.parallel = 4;
    o.queue = 1;
    let (st, _, _) = state(real_engine(), &o, || 0);
    let app = routes::router(st);
    let tasks: Vec<_> = (0..5)
        .map(|i| {
            let app = app.clone();
            let body = chat_body(&format!("Item {i}"));
            tokio::spawn(async move { call(&app, "/v1/chat/completions", body).await })
        })
        .collect();
    for t in tasks {
        let (code, b) = t.await.unwrap();
        assert_eq!(code, StatusCode::OK, "four slots and one queue place: {b}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_queued_whole_answer_is_a_503_when_the_server_stops() {
    let (st, stopping, _) = state(real_engine(), &opts(None), || 0);
    let metrics = Arc::clone(&st.metrics);
    let app = routes::router(st);
    // a stream nobody reads holds the one slot
    let body = json!({"messages": [{"role": "user", "content": "Go on"}],
                      "max_tokens": 500, "ignore_eos": true, "stream": true});
    let req = axum::http::Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let _held = app.clone().oneshot(req).await.unwrap();
    let app2 = app.clone();
    let queued =
        tokio::spawn(
            async move { call(&app2, "/v1/chat/completions", chat_body("Waiting")).await },
        );
    while metrics.queued.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    stopping.store(true, std::sync::atomic::Ordering::SeqCst);
    let (code, b) = queued.await.unwrap();
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE, "{b}");
    let v: Value = serde_json::from_str(&b).unwrap();
    assert_eq!(v["error"]["code"], "server_shutdown");
}
