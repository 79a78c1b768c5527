//! Slots sharing one context (`serve` without `--parallel`, or `--kv-unified`;
//! `deltafin::engine::slots::SlotContext::Shared`): each request may use the whole context and
//! gets the text it gets alone; when a step needs more positions than are free, idle slots
//! give up their cached prompts first (least recently used), prompts wait until they can
//! finish beside the requests ahead of them, and when the running requests fill the pool the
//! newest holding positions is preempted: it waits and is prefilled again with what it has
//! generated, going on with the text it gets alone.

mod common;

use std::cell::RefCell;

use common::serve::*;
use deltafin::engine::slots::{Request, SlotContext, Slots};
use deltafin::engine::{Chunk, FinishReason, Outcome, Params};

/// The text and outcome of a request.
#[derive(Default, Debug)]
struct Got {
    text: String,
    outcome: Option<Outcome>,
}

impl Got {
    fn outcome(&self) -> &Outcome {
        self.outcome.as_ref().expect("the request ended")
    }
}

fn params(max_tokens: usize) -> Params {
    Params {
        sampler: greedy(),
        max_tokens,
        stop: Vec::new(),
        logprobs: None,
        tools: None,
        steering: Default::default(),
    }
}

fn request<'a>(prompt: &[u32], max_tokens: usize, got: &'a RefCell<Got>) -> Request<'a> {
    Request {
        prompt: prompt.to_vec(),
        params: params(max_tokens),
        emit: Box::new(move |c: Chunk| got.borrow_mut().text.push_str(&c.text)),
        cancelled: Box::new(|| false),
        done: Box::new(move |r| got.borrow_mut().outcome = Some(r.expect("no error"))),
    }
}

/// The Qwen3-MoE fixture with a context of `n_ctx` positions (64 rows a step).
fn engine_ctx(n_ctx: usize) -> Engine {
    let opened = deltafin::load::open_any(Some(&fixture())).unwrap();
    let (model, store) = opened.load_weights(&Default::default()).unwrap();
    let tok = opened.tokenizer().unwrap();
    let tmpl = opened.chat_template(&tok).unwrap();
    let session = Session::new(model, store, n_ctx, 64);
    Engine::new(session, Arc::new(tok), Some(Arc::new(tmpl)), greedy())
}

/// `prompt` alone through `Engine::generate` (context 1024).
fn alone(prompt: &[u32], max_tokens: usize) -> Got {
    let mut e = real_engine();
    let got = RefCell::new(Got::default());
    let o = e
        .generate(
            prompt,
            &params(max_tokens),
            &mut |c| got.borrow_mut().text.push_str(&c.text),
            &|| false,
        )
        .unwrap();
    got.borrow_mut().outcome = Some(o);
    got.into_inner()
}

/// `n` token ids from `first` on, below 400 (no BOS, so that prompts share no prefix).
fn ids(first: u32, n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (first + i) % 400).collect()
}

fn run_all(slots: &mut Slots, e: &mut Engine) {
    while slots.running() > 0 {
        slots.step(&mut e.session);
    }
}

#[test]
fn each_shared_slot_may_use_the_whole_context() {
    let mut e = real_engine();
    let tok = Arc::clone(&e.tok);
    let (gl, gs) = (RefCell::default(), RefCell::default());
    let mut slots = Slots::new(&mut e.session, &tok, 3, SlotContext::Shared);
    assert_eq!(slots.n_ctx(), 1024, "not 1024 / 3");
    // 600 prompt tokens: more than a third of the context, refused by split slots
    let (long, short) = (ids(20, 600), ids(300, 5));
    slots.admit(request(&long, 4, &gl));
    slots.admit(request(&short, 6, &gs));
    run_all(&mut slots, &mut e);
    let (want_l, want_s) = (alone(&long, 4), alone(&short, 6));
    for (g, w) in [(&gl, &want_l), (&gs, &want_s)] {
        let g = g.borrow();
        assert_eq!(g.text, w.text);
        assert_eq!(g.outcome().completion_tokens, w.outcome().completion_tokens);
        assert_eq!(g.outcome().finish, w.outcome().finish);
    }
    assert_eq!(gl.borrow().outcome().prompt_tokens, 600);
    // what the slots hold: each prompt and its reply but the last token
    let (l, s) = (gl.borrow(), gs.borrow());
    let held = 600 + l.outcome().completion_tokens - 1 + 5 + s.outcome().completion_tokens - 1;
    assert_eq!(slots.held(), held);
}

#[test]
fn idle_slots_give_up_their_cached_prompts_least_recently_used_first() {
    let mut e = engine_ctx(64);
    let tok = Arc::clone(&e.tok);
    let g: Vec<RefCell<Got>> = (0..4).map(|_| RefCell::default()).collect();
    let mut slots = Slots::new(&mut e.session, &tok, 3, SlotContext::Shared);
    // two requests one after the other leave 10 + 2 and 20 + 2 positions cached
    let (a, b, c) = (ids(10, 10), ids(40, 20), ids(100, 36));
    slots.admit(request(&a, 3, &g[0]));
    run_all(&mut slots, &mut e);
    slots.admit(request(&b, 3, &g[1]));
    run_all(&mut slots, &mut e);
    assert_eq!(g[0].borrow().outcome().completion_tokens, 3);
    assert_eq!(g[1].borrow().outcome().completion_tokens, 3);
    assert_eq!(slots.held(), 12 + 22);
    // 36 prompt rows: 30 are free, so the older cached prompt (a's) is given up, b's kept
    slots.admit(request(&c, 3, &g[2]));
    slots.step(&mut e.session);
    assert_eq!(slots.held(), 22 + 36);
    run_all(&mut slots, &mut e);
    assert_eq!(g[2].borrow().text, alone(&c, 3).text);
    // b's prefix is still there: the same prompt reuses all of it but its last token
    slots.admit(request(&b, 3, &g[3]));
    run_all(&mut slots, &mut e);
    assert_eq!(g[3].borrow().outcome().cached_tokens, 19);
    assert_eq!(g[3].borrow().text, g[1].borrow().text);
}

#[test]
fn the_slot_given_up_first_is_the_one_whose_request_ended_first() {
    let mut e = engine_ctx(64);
    let tok = Arc::clone(&e.tok);
    let g: Vec<RefCell<Got>> = (0..4).map(|_| RefCell::default()).collect();
    let mut slots = Slots::new(&mut e.session, &tok, 3, SlotContext::Shared);
    // a is admitted first and ends last: 10 + 7 and 10 + 1 positions cached
    let (a, b, c) = (ids(10, 10), ids(40, 10), ids(100, 40));
    slots.admit(request(&a, 8, &g[0]));
    slots.admit(request(&b, 2, &g[1]));
    run_all(&mut slots, &mut e);
    assert_eq!(g[0].borrow().outcome().completion_tokens, 8);
    assert_eq!(g[1].borrow().outcome().completion_tokens, 2);
    assert_eq!(slots.held(), 17 + 11);
    // 40 prompt rows, 36 free: b's conversation, used less recently, is given up
    slots.admit(request(&c, 3, &g[2]));
    slots.step(&mut e.session);
    assert_eq!(slots.held(), 17 + 40);
    run_all(&mut slots, &mut e);
    slots.admit(request(&a, 8, &g[3]));
    run_all(&mut slots, &mut e);
    assert_eq!(g[3].borrow().outcome().cached_tokens, 9);
    assert_eq!(g[3].borrow().text, g[0].borrow().text);
}

#[test]
fn when_running_requests_fill_the_pool_the_newest_waits_and_goes_on() {
    let mut e = engine_ctx(64);
    let tok = Arc::clone(&e.tok);
    let (gd, gx) = (RefCell::default(), RefCell::default());
    let mut slots = Slots::new(&mut e.session, &tok, 2, SlotContext::Shared);
    let (d, x) = (ids(10, 30), ids(200, 30));
    slots.admit(request(&d, 40, &gd));
    slots.admit(request(&x, 40, &gx));
    // one step prefills both (60 positions), two more decode a token each (64): then there
    // is no position for both, and the newer request is preempted (3 tokens out)
    let mut rows = Vec::new();
    for _ in 0..4 {
        rows.push(slots.step(&mut e.session));
    }
    assert_eq!(rows, [60, 2, 2, 1]);
    assert_eq!(slots.running(), 2);
    assert_eq!(slots.held(), 33, "d's prompt and 3 tokens, x's given up");
    assert_eq!(gx.borrow().text, alone(&x, 3).text);
    // d goes on alone until it fills the context; then x's prompt and 3 tokens (33) are
    // prefilled again and x goes on where it was, until it fills the context too
    while gd.borrow().outcome.is_none() {
        assert_eq!(slots.step(&mut e.session), 1);
    }
    let od = gd.borrow().outcome().clone();
    assert_eq!(
        (od.finish, od.completion_tokens),
        (FinishReason::Length, 35)
    );
    assert_eq!(gd.borrow().text, alone(&d, 35).text);
    assert!(gx.borrow().outcome.is_none());
    assert_eq!(slots.step(&mut e.session), 33);
    run_all(&mut slots, &mut e);
    let ox = gx.borrow().outcome().clone();
    assert_eq!(
        (ox.finish, ox.completion_tokens),
        (FinishReason::Length, 35)
    );
    assert_eq!(ox.prompt_tokens, 30);
    assert_eq!(gx.borrow().text, alone(&x, 35).text);
}

#[test]
fn prompts_that_cannot_finish_together_wait_first_come_first_served() {
    let mut e = engine_ctx(64);
    e.session.n_batch = 16;
    let tok = Arc::clone(&e.tok);
    let (ga, gb) = (RefCell::default(), RefCell::default());
    let mut slots = Slots::new(&mut e.session, &tok, 2, SlotContext::Shared);
    let (a, b) = (ids(10, 40), ids(200, 40));
    slots.admit(request(&a, 5, &ga));
    slots.admit(request(&b, 5, &gb));
    // 16 rows a step: a's prompt in 3 steps; b's 40 do not fit beside a's 40 and its reply,
    // so b waits with no position until a ends, instead of being cut with an empty reply
    let mut rows = Vec::new();
    while slots.running() > 0 {
        rows.push(slots.step(&mut e.session));
    }
    // (b's reply ends at its first token, an end of generation, as it does alone)
    assert_eq!(rows, [16, 16, 8, 1, 1, 1, 1, 16, 16, 8]);
    for (g, p, end) in [
        (&ga, &a, (FinishReason::Length, 5)),
        (&gb, &b, (FinishReason::Stop, 1)),
    ] {
        let (got, want) = (g.borrow(), alone(p, 5));
        let o = got.outcome();
        assert_eq!((o.finish, o.completion_tokens), end);
        assert_eq!(
            (want.outcome().finish, want.outcome().completion_tokens),
            end
        );
        assert_eq!(got.text, want.text);
    }
}

#[test]
fn a_slot_that_takes_a_new_request_keeps_only_its_prefix_memory() {
    let mut e = engine_ctx(128);
    let tok = Arc::clone(&e.tok);
    let g: Vec<RefCell<Got>> = (0..3).map(|_| RefCell::default()).collect();
    let mut slots = Slots::new(&mut e.session, &tok, 2, SlotContext::Shared);
    // a long conversation ends in one slot while a short one runs on in the other
    slots.admit(request(&ids(10, 60), 2, &g[0]));
    slots.admit(request(&ids(200, 5), 30, &g[1]));
    while g[0].borrow().outcome.is_none() {
        slots.step(&mut e.session);
    }
    assert!(slots.memory_positions() >= 61);
    // the only free slot is the long one's: a new prompt sharing nothing gives its memory up
    slots.admit(request(&ids(300, 10), 2, &g[2]));
    slots.step(&mut e.session);
    let (held, mem) = (slots.held(), slots.memory_positions());
    assert!(
        mem <= held + held / 4 + 1,
        "{mem} positions of memory for {held} held"
    );
    run_all(&mut slots, &mut e);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_default_server_shares_the_context_among_four_slots() {
    let texts = [
        "Hi there",
        "What is two plus two?",
        "Tell me a story",
        "Bye",
    ];
    let body = |t: &str| json!({"messages": [{"role": "user", "content": t}], "max_tokens": 8, "temperature": 0});
    let serial = app_with(real_engine(), None);
    let mut want = Vec::new();
    for t in texts {
        let (st, b) = call(&serial, "/v1/chat/completions", body(t)).await;
        assert_eq!(st, StatusCode::OK, "{b}");
        want.push(serde_json::from_str::<Value>(&b).unwrap()["choices"].clone());
    }
    let (parallel, how) = deltafin::cli::serve::slots_for(None, false, false, 512);
    assert_eq!((parallel, how), (4, SlotContext::Shared));
    let mut o = opts(None);
    (o.parallel, o.slot_context) = (parallel, how);
    let (st, _, _) = state(real_engine(), &o, || 0);
    assert_eq!((st.slots, st.n_ctx), (4, 1024));
    let app = routes::router(st);
    let tasks: Vec<_> = texts
        .iter()
        .map(|t| {
            let (app, b) = (app.clone(), body(t));
            tokio::spawn(async move { call(&app, "/v1/chat/completions", b).await })
        })
        .collect();
    for (task, w) in tasks.into_iter().zip(&want) {
        let (st, b) = task.await.unwrap();
        assert_eq!(st, StatusCode::OK, "{b}");
        assert_eq!(&serde_json::from_str::<Value>(&b).unwrap()["choices"], w);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_give_the_kv_positions_the_slots_hold() {
    let mut o = opts(None);
    (o.parallel, o.slot_context) = (4, SlotContext::Shared);
    let (st, _, _) = state(real_engine(), &o, || 0);
    let app = routes::router(st);
    let body = json!({"messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 6,
                      "temperature": 0});
    let (code, b) = call(&app, "/v1/chat/completions", body).await;
    assert_eq!(code, StatusCode::OK, "{b}");
    // the slot keeps the conversation: the prompt and the reply but its last token
    let u = serde_json::from_str::<Value>(&b).unwrap()["usage"].clone();
    let held = u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap() - 1;
    // set after the step that ended the request, which may come after the answer
    let mut seen = String::new();
    for _ in 0..500 {
        let req = axum::http::Request::get("/metrics")
            .body(Body::empty())
            .unwrap();
        let (_, m) = send(&app, req).await;
        seen = m
            .lines()
            .find(|l| l.starts_with("deltafin_kv_cache_tokens "))
            .unwrap_or("")
            .to_string();
        if seen == format!("deltafin_kv_cache_tokens {held}") {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("{seen:?}, want {held} positions");
}

#[test]
fn the_slots_of_each_flag_combination() {
    use deltafin::cli::serve::slots_for;
    // unset: 4 shared, 1 when speculating or on a GPU, at most -b
    assert_eq!(slots_for(None, false, true, 512), (1, SlotContext::Split));
    assert_eq!(slots_for(None, false, false, 2), (2, SlotContext::Shared));
    // --parallel N: split evenly, shared with --kv-unified
    assert_eq!(
        slots_for(Some(3), false, false, 512),
        (3, SlotContext::Split)
    );
    assert_eq!(
        slots_for(Some(3), true, false, 512),
        (3, SlotContext::Shared)
    );
    // on a GPU: 4 whole-context caches within an eighth of its memory, else 1 slot
    use deltafin::cli::serve::gpu_keeps_one_slot;
    assert!(
        !gpu_keeps_one_slot(151 << 20, 80 << 30),
        "the demo model on an 80 GiB card"
    );
    assert!(!gpu_keeps_one_slot(2560 << 20, 80 << 30));
    assert!(gpu_keeps_one_slot((2560 << 20) + 1, 80 << 30));
    assert!(gpu_keeps_one_slot(1, 0), "memory unknown");
    assert_eq!(
        deltafin::cli::serve::slots_line(4, SlotContext::Shared, 4096),
        "4 slots sharing a context of 4096 tokens (--kv-unified)"
    );
}

#[test]
fn a_waiting_prompt_that_holds_no_position_is_not_ended_for_room() {
    let mut e = engine_ctx(64);
    let tok = Arc::clone(&e.tok);
    let (ga, gc, gb) = (RefCell::default(), RefCell::default(), RefCell::default());
    let mut slots = Slots::new(&mut e.session, &tok, 3, SlotContext::Shared);
    let (a, c, b) = (ids(10, 30), ids(200, 30), ids(300, 5));
    slots.admit(request(&a, 40, &ga));
    slots.admit(request(&c, 40, &gc));
    // a prefill step and two decode steps: the pool is full
    for _ in 0..3 {
        slots.step(&mut e.session);
    }
    assert_eq!(slots.held(), 64);
    // b comes now, newest, holding no position: preempting it frees none, so c (the newest
    // holding some) is preempted and waits with its 3 tokens; b, after c in the queue, waits
    // behind it (first come, first served) and nothing is ended for room
    slots.admit(request(&b, 3, &gb));
    assert_eq!(slots.step(&mut e.session), 1);
    assert_eq!(slots.running(), 3);
    assert!(gc.borrow().outcome.is_none());
    run_all(&mut slots, &mut e);
    for (g, p, n) in [(&ga, &a, 35), (&gc, &c, 35), (&gb, &b, 3)] {
        let got = g.borrow();
        assert_eq!(got.outcome().completion_tokens, n);
        assert_eq!(got.text, alone(p, n).text);
    }
    let (want, got) = (alone(&b, 3), gb.borrow());
    assert_eq!(got.outcome().finish, want.outcome().finish);
}
