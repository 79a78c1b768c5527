//! The model's one worker thread and its bounded FIFO queue. Handlers submit [`Job`]s with
//! [`Queue::submit`] (refused at once when the queue is full); the worker runs them in its
//! slots (4 by default, `--parallel N`; [`crate::engine::slots::Slots`]: every running job
//! advances by one forward pass per step, and queued jobs join, first come first served, as
//! slots free up) or, when the engine speculates, one at a time ([`Engine::generate`]),
//! sending [`Event`]s back. A queued job whose client has gone (its event receiver dropped)
//! gives up its place at the next submit and is never run; a running one stops before its
//! next step.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;

use super::access::Tokens;
use super::metrics::Metrics;
use super::reading::Reading;
use crate::engine::slots::{Request, SlotContext, Slots};
use crate::engine::{Chunk, Engine, Finish, Outcome, Params};

/// What the worker reports about one job.
#[derive(Debug)]
pub enum Event {
    /// Final text (and logprobs).
    Chunk(Chunk),
    /// The generation ended.
    Done(Outcome),
    /// The generation failed: the error for the client (a code and a message without the
    /// server's paths; the full reason is in the server's log, [`client_error`]).
    Error(&'static str, String),
}

/// What a client is told of a generation that failed with `e` (the engine's message, which
/// may name files of the server): a code and a message without paths. A checksum mismatch
/// (an expert's bytes on the server's storage are damaged) is `integrity_error`; anything
/// else `generation_failed`, with the engine's message when it names no path (no `/` or `\`:
/// a slot's refusal, such as a prompt over its context), else a message of its own.
pub fn client_error(e: &str) -> (&'static str, String) {
    if e.contains("checksum") {
        (
            "integrity_error",
            "the model's data failed an integrity check on the server (a checksum did not \
             match); the generation was stopped and the server's log has the details"
                .into(),
        )
    } else if e.contains(['/', '\\']) {
        (
            "generation_failed",
            "the generation failed on the server; the server's log has the details".into(),
        )
    } else {
        ("generation_failed", e.to_string())
    }
}

/// One request for the model.
pub struct Job {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Sampling, stops, logprobs, tools.
    pub params: Params,
    /// How far a streaming client has read (`None` for a whole answer): the job is cancelled
    /// once its events wait unread past the write timeout ([`super::reading`]).
    pub reading: Option<Arc<Reading>>,
    /// Where events go; dropped by the handler when its client disconnects.
    pub events: UnboundedSender<Event>,
    /// The request's log record: the worker adds the job's tokens when it ends (cut ones
    /// included) and holds it until then, so the line counts them ([`super::access`]).
    pub log: Tokens,
}

/// The sending side of the queue (cloned into every handler).
#[derive(Clone)]
pub struct Queue {
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
    /// Counts the live `Queue` values; the worker ends when the last is dropped.
    _handle: Arc<Handle>,
}

/// The jobs waiting, their bound, and whether every `Queue` is gone.
struct Shared {
    state: Mutex<State>,
    ready: Condvar,
    capacity: usize,
    /// Slots the worker has free (set between its steps): jobs that will start at its next
    /// step, so they wait besides the `capacity` others.
    free: std::sync::atomic::AtomicUsize,
}

struct State {
    jobs: VecDeque<Job>,
    closed: bool,
}

/// Dropped with the last [`Queue`]: closes the queue and wakes the worker.
struct Handle(Arc<Shared>);

impl Drop for Handle {
    fn drop(&mut self) {
        let mut st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        st.closed = true;
        self.0.ready.notify_all();
    }
}

/// Why a job was not queued.
#[derive(Debug, PartialEq, Eq)]
pub enum SubmitError {
    /// The queue holds its maximum of jobs.
    Full,
    /// The worker has stopped.
    Stopped,
}

impl Queue {
    /// A queue of at most `capacity` waiting jobs (at least 1), with no worker yet.
    fn new(capacity: usize, metrics: Arc<Metrics>) -> Queue {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                jobs: VecDeque::new(),
                closed: false,
            }),
            ready: Condvar::new(),
            capacity: capacity.max(1),
            free: std::sync::atomic::AtomicUsize::new(0),
        });
        Queue {
            _handle: Arc::new(Handle(Arc::clone(&shared))),
            shared,
            metrics,
        }
    }

    /// Queues `job`, or says why not at once. Queued jobs whose clients have disconnected are
    /// dropped first (counted as cancelled), so they hold no slot.
    pub fn submit(&self, job: Job) -> Result<(), SubmitError> {
        self.submit_all(vec![job])
    }

    /// Queues every job of `jobs` (the choices of one request), or none of them and says why
    /// not at once (as [`Queue::submit`]). The queue holds `capacity` jobs besides those
    /// the worker's free slots will take at its next step.
    pub fn submit_all(&self, jobs: Vec<Job>) -> Result<(), SubmitError> {
        let mut st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.closed {
            return Err(SubmitError::Stopped);
        }
        let before = st.jobs.len();
        st.jobs.retain(|j| !j.events.is_closed());
        let gone = (before - st.jobs.len()) as u64;
        if gone > 0 {
            self.metrics.cancelled.fetch_add(gone, Ordering::Relaxed);
            self.metrics.queued.fetch_sub(gone, Ordering::SeqCst);
        }
        let room = self.shared.capacity + self.shared.free.load(Ordering::SeqCst);
        if st.jobs.len() + jobs.len() > room {
            return Err(SubmitError::Full);
        }
        let n = jobs.len();
        st.jobs.extend(jobs);
        self.metrics.queued.fetch_add(n as u64, Ordering::SeqCst);
        self.shared.ready.notify_one();
        Ok(())
    }

    /// Most jobs that may wait.
    pub fn capacity(&self) -> usize {
        self.shared.capacity
    }

    /// Jobs waiting now (abandoned ones included until the next submit).
    pub fn len(&self) -> usize {
        let st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        st.jobs.len()
    }

    /// Whether no job is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The worker's end: the next job, or `None` once every [`Queue`] is dropped and the queue
/// is empty.
struct Receiver(Arc<Shared>);

impl Receiver {
    fn recv(&self) -> Option<Job> {
        let mut st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(j) = st.jobs.pop_front() {
                return Some(j);
            }
            if st.closed {
                return None;
            }
            st = self.0.ready.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Tells submitters how many slots are free.
    fn set_free(&self, n: usize) {
        self.0.free.store(n, Ordering::SeqCst);
    }

    /// The next job if one waits, without waiting.
    fn try_recv(&self) -> Option<Job> {
        let mut st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        st.jobs.pop_front()
    }
}

/// Starts the worker thread over `engine` with `parallel` slots (at least 1; one request at a
/// time when the engine speculates) dividing the context as `how` says, and a queue of
/// `capacity` waiting jobs (at least 1). `stopping` set to true cancels the running jobs at
/// their next step and every queued one; a streaming job whose events wait unread longer
/// than `write_timeout` is cancelled too. The thread ends when every [`Queue`] is dropped.
pub fn start(
    engine: Engine,
    (parallel, how): (usize, SlotContext),
    capacity: usize,
    write_timeout: Duration,
    metrics: Arc<Metrics>,
    stopping: Arc<AtomicBool>,
) -> (Queue, std::thread::JoinHandle<Engine>) {
    let queue = Queue::new(capacity, Arc::clone(&metrics));
    let rx = Receiver(Arc::clone(&queue.shared));
    // every slot is free before the worker first runs
    let slots = if engine.spec.is_some() {
        1
    } else {
        parallel.max(1)
    };
    rx.set_free(slots);
    let handle = std::thread::Builder::new()
        .name("deltafin-model".into())
        .spawn(move || {
            let w = Watch {
                m: &metrics,
                stopping: &stopping,
                write_timeout,
            };
            match engine.spec {
                Some(_) => run(engine, rx, &w),
                None => run_slots(engine, (parallel, how), rx, &w),
            }
        })
        .expect("spawning the model thread");
    (queue, handle)
}

/// What the worker watches besides its jobs: the metrics, the server stopping, the write
/// timeout.
struct Watch<'a> {
    m: &'a Metrics,
    stopping: &'a AtomicBool,
    write_timeout: Duration,
}

impl Watch<'_> {
    /// Whether `job` is to stop: its client has gone or stopped reading, or the server stops.
    fn cancelled(&self, events: &UnboundedSender<Event>, reading: Option<&Reading>) -> bool {
        events.is_closed()
            || self.stopping.load(Ordering::SeqCst)
            || reading.is_some_and(|r| r.stalled(self.write_timeout))
    }
}

/// Sends `ev` to the job's client, counting it for the write timeout.
fn send(events: &UnboundedSender<Event>, reading: Option<&Reading>, ev: Event) {
    if let Some(r) = reading {
        r.sent();
    }
    let _ = events.send(ev);
}

/// Takes `job` off the queue's count; `None` when it is not to run (its client has gone, or
/// the server is stopping), counted as cancelled.
fn take(job: Job, m: &Metrics, stopping: &AtomicBool) -> Option<Job> {
    m.queued.fetch_sub(1, Ordering::SeqCst);
    if job.events.is_closed() || stopping.load(Ordering::SeqCst) {
        m.cancelled.fetch_add(1, Ordering::Relaxed);
        // a handler still waiting learns that its request was cancelled (a 503 while the
        // server stops)
        let o = Outcome::of(&Finish::Interrupted, Vec::new(), job.prompt.len(), 0);
        job.log.add_choice(o.prompt_tokens, 0);
        let _ = job.events.send(Event::Done(o));
        return None;
    }
    Some(job)
}

/// Counts a generation's outcome (in the metrics and the request's log record) and sends it
/// to the client; a failure is logged at error level with its full reason, and the client
/// gets [`client_error`]'s code and message.
fn finish(events: &UnboundedSender<Event>, log: &Tokens, r: Result<Outcome, String>, m: &Metrics) {
    match r {
        Ok(o) => {
            log.add_choice(o.prompt_tokens, o.completion_tokens);
            m.prompt_tokens
                .fetch_add(o.prompt_tokens as u64, Ordering::Relaxed);
            m.cached_tokens
                .fetch_add(o.cached_tokens as u64, Ordering::Relaxed);
            m.generated_tokens
                .fetch_add(o.completion_tokens as u64, Ordering::Relaxed);
            m.generation(o.ttft_s, o.decode_s);
            if o.finish == crate::engine::FinishReason::Cancelled {
                m.cancelled.fetch_add(1, Ordering::Relaxed);
            }
            let _ = events.send(Event::Done(o));
        }
        Err(e) => {
            // logged, not only answered: a failed pass (e.g. a pack read whose checksum does
            // not match) must be visible to the operator; the client gets no server paths
            let (code, message) = client_error(&e);
            tracing::error!(code, "generation failed: {e}");
            log.fail(code);
            let _ = events.send(Event::Error(code, message));
        }
    }
}

/// The worker over `parallel` slots: admits queued jobs into free slots, then runs one step of
/// every running job; waits for a job only when none runs.
fn run_slots(
    mut engine: Engine,
    (parallel, how): (usize, SlotContext),
    rx: Receiver,
    w: &Watch,
) -> Engine {
    let m = w.m;
    engine.reset();
    let tok = Arc::clone(&engine.tok);
    let mut slots = Slots::new(&mut engine.session, &tok, parallel, how);
    let free = |s: &Slots| parallel.max(1) - s.running();
    loop {
        rx.set_free(free(&slots));
        let mut next = None;
        if slots.running() == 0 {
            match rx.recv() {
                Some(j) => next = Some(j),
                None => break,
            }
        }
        while slots.has_free() {
            let Some(job) = next.take().or_else(|| rx.try_recv()) else {
                break;
            };
            if let Some(job) = take(job, m, w.stopping) {
                slots.admit(request(job, w));
            }
        }
        m.in_flight.store(slots.running() as u64, Ordering::SeqCst);
        rx.set_free(free(&slots));
        slots.step(&mut engine.session);
        record(&engine, m);
        m.in_flight.store(slots.running() as u64, Ordering::SeqCst);
        m.kv_positions.store(slots.held() as u64, Ordering::Relaxed);
    }
    slots.into_cache(&mut engine.session);
    engine
}

/// A slot request for `job`: its events, cancelled as [`Watch::cancelled`] says.
fn request<'a>(job: Job, w: &'a Watch<'a>) -> Request<'a> {
    let (ev, ev2) = (job.events.clone(), job.events.clone());
    let (r, r2) = (job.reading.clone(), job.reading.clone());
    let events = job.events;
    let log = job.log;
    Request {
        prompt: job.prompt,
        params: job.params,
        emit: Box::new(move |c| send(&ev, r.as_deref(), Event::Chunk(c))),
        cancelled: Box::new(move || w.cancelled(&ev2, r2.as_deref())),
        done: Box::new(move |r| finish(&events, &log, r, w.m)),
    }
}

/// The worker one request at a time (speculative decoding).
fn run(mut engine: Engine, rx: Receiver, w: &Watch) -> Engine {
    let m = w.m;
    rx.set_free(1);
    while let Some(job) = rx.recv() {
        rx.set_free(0);
        let Some(job) = take(job, m, w.stopping) else {
            rx.set_free(1);
            continue;
        };
        m.in_flight.store(1, Ordering::SeqCst);
        let reading = job.reading.as_deref();
        let cancelled = || w.cancelled(&job.events, reading);
        let r = engine.generate(
            &job.prompt,
            &job.params,
            &mut |c| send(&job.events, reading, Event::Chunk(c)),
            &cancelled,
        );
        record(&engine, m);
        if let Some(sp) = &engine.spec {
            // the counters of this generation, failed ones included
            m.spec(&sp.stats);
        }
        m.in_flight.store(0, Ordering::SeqCst);
        finish(&job.events, &job.log, r.map_err(|e| format!("{e:#}")), m);
        rx.set_free(1);
    }
    engine
}

/// Copies the store's cumulative I/O counters into the metrics. The store's byte counter
/// already holds the expert store's reads (`ExpertStore` adds them to the shared `IoStats`).
fn record(engine: &Engine, m: &Metrics) {
    let store = &engine.session.store;
    let bytes = store.stats().snapshot().0;
    if let Some(es) = store.experts() {
        let c = es.counters();
        m.expert_hits.store(c.hits, Ordering::Relaxed);
        m.expert_misses.store(c.misses, Ordering::Relaxed);
    }
    m.bytes_read.store(bytes, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(events: UnboundedSender<Event>) -> Job {
        Job {
            prompt: vec![1],
            params: Params {
                sampler: Default::default(),
                max_tokens: 1,
                stop: Vec::new(),
                logprobs: None,
                tools: None,
                steering: Default::default(),
            },
            reading: None,
            events,
            log: Tokens::default(),
        }
    }

    #[test]
    fn a_disconnected_client_frees_its_queue_slot() {
        let m = Arc::new(Metrics::default());
        let q = Queue::new(1, Arc::clone(&m));
        let (tx1, rx1) = tokio::sync::mpsc::unbounded_channel();
        q.submit(job(tx1)).unwrap();
        let (tx2, _rx2) = tokio::sync::mpsc::unbounded_channel();
        assert_eq!(q.submit(job(tx2.clone())), Err(SubmitError::Full));
        drop(rx1); // the first client disconnects while queued
        q.submit(job(tx2)).unwrap();
        assert_eq!(q.len(), 1);
        assert_eq!(m.cancelled.load(Ordering::Relaxed), 1);
        assert_eq!(m.queued.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn the_worker_end_sees_the_queue_close_with_the_last_sender() {
        let m = Arc::new(Metrics::default());
        let q = Queue::new(2, m);
        let rx = Receiver(Arc::clone(&q.shared));
        let (tx, _keep) = tokio::sync::mpsc::unbounded_channel();
        q.submit(job(tx)).unwrap();
        let q2 = q.clone();
        drop(q);
        assert!(rx.recv().is_some(), "queued work is still handed out");
        drop(q2);
        assert!(rx.recv().is_none());
    }

    #[test]
    fn a_client_learns_the_kind_of_failure_but_not_the_server_paths() {
        let (code, m) = client_error(
            "layer 3: checksum mismatch in expert 7 of layer 3 read from \
             /srv/drive0/deltafin-pack-1.bin",
        );
        assert_eq!(code, "integrity_error");
        assert_eq!(
            m,
            "the model's data failed an integrity check on the server (a checksum did not \
             match); the generation was stopped and the server's log has the details"
        );
        let (code, m) = client_error("reading /srv/model/x.bin: Input/output error");
        assert_eq!(
            (code, m.as_str()),
            (
                "generation_failed",
                "the generation failed on the server; the server's log has the details"
            )
        );
        let (code, m) = client_error("the prompt has 256 tokens but the context holds 256");
        assert_eq!(
            (code, m.as_str()),
            (
                "generation_failed",
                "the prompt has 256 tokens but the context holds 256"
            )
        );
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let log = Tokens::default();
        finish(
            &tx,
            &log,
            Err("checksum mismatch in /a/b".into()),
            &Metrics::default(),
        );
        assert_eq!(log.error(), Some("integrity_error"));
        match rx.try_recv().unwrap() {
            Event::Error(c, m) => assert_eq!((c, m.contains("/a/b")), ("integrity_error", false)),
            e => panic!("{e:?}"),
        }
    }
}
