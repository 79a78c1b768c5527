//! The model's one worker thread and its bounded FIFO queue. Handlers submit [`Job`]s with
//! [`Queue::submit`] (refused at once when the queue is full); the worker runs them one at a
//! time, sending [`Event`]s back. A job whose client has gone (its event receiver dropped) is
//! skipped when it reaches the front, and a running one stops before its next decode step.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;

use tokio::sync::mpsc::UnboundedSender;

use super::generate::{Chunk, Engine, Outcome, Params};
use super::metrics::Metrics;

/// What the worker reports about one job.
#[derive(Debug)]
pub enum Event {
    /// Final text (and logprobs).
    Chunk(Chunk),
    /// The generation ended.
    Done(Outcome),
    /// The generation failed (message for the client).
    Error(String),
}

/// One request for the model.
pub struct Job {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Sampling, stops, logprobs, tools.
    pub params: Params,
    /// Where events go; dropped by the handler when its client disconnects.
    pub events: UnboundedSender<Event>,
}

/// The sending side of the queue.
#[derive(Clone)]
pub struct Queue {
    tx: SyncSender<Job>,
    metrics: Arc<Metrics>,
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
    /// Queues `job`, or says why not at once.
    pub fn submit(&self, job: Job) -> Result<(), SubmitError> {
        self.metrics.queued.fetch_add(1, Ordering::SeqCst);
        let r = self.tx.try_send(job);
        if r.is_err() {
            self.metrics.queued.fetch_sub(1, Ordering::SeqCst);
        }
        match r {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(SubmitError::Full),
            Err(TrySendError::Disconnected(_)) => Err(SubmitError::Stopped),
        }
    }
}

/// Starts the worker thread over `engine` with a queue of `capacity` waiting jobs (at least
/// 1). `stopping` set to true cancels the running job at its next step and every queued one.
/// The thread ends when every [`Queue`] is dropped.
pub fn start(
    engine: Engine,
    capacity: usize,
    metrics: Arc<Metrics>,
    stopping: Arc<AtomicBool>,
) -> (Queue, std::thread::JoinHandle<Engine>) {
    let (tx, rx) = sync_channel(capacity.max(1));
    let m = Arc::clone(&metrics);
    let handle = std::thread::Builder::new()
        .name("deltafin-model".into())
        .spawn(move || run(engine, rx, &m, &stopping))
        .expect("spawning the model thread");
    (Queue { tx, metrics }, handle)
}

fn run(mut engine: Engine, rx: Receiver<Job>, m: &Metrics, stopping: &AtomicBool) -> Engine {
    while let Ok(job) = rx.recv() {
        m.queued.fetch_sub(1, Ordering::SeqCst);
        if job.events.is_closed() || stopping.load(Ordering::SeqCst) {
            m.cancelled.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        m.in_flight.store(1, Ordering::SeqCst);
        let events = job.events.clone();
        let cancelled = || events.is_closed() || stopping.load(Ordering::SeqCst);
        let r = engine.generate(
            &job.prompt,
            &job.params,
            &mut |c| {
                let _ = job.events.send(Event::Chunk(c));
            },
            &cancelled,
        );
        record(&engine, m);
        m.in_flight.store(0, Ordering::SeqCst);
        match r {
            Ok(o) => {
                m.prompt_tokens
                    .fetch_add(o.prompt_tokens as u64, Ordering::Relaxed);
                m.cached_tokens
                    .fetch_add(o.cached_tokens as u64, Ordering::Relaxed);
                m.generated_tokens
                    .fetch_add(o.completion_tokens as u64, Ordering::Relaxed);
                m.generation(o.ttft_s, o.decode_s);
                if o.finish == super::generate::FinishReason::Cancelled {
                    m.cancelled.fetch_add(1, Ordering::Relaxed);
                }
                let _ = job.events.send(Event::Done(o));
            }
            Err(e) => {
                let _ = job.events.send(Event::Error(format!("{e:#}")));
            }
        }
    }
    engine
}

/// Copies the store's cumulative I/O counters into the metrics.
fn record(engine: &Engine, m: &Metrics) {
    let store = &engine.session.store;
    let mut bytes = store.stats().snapshot().0;
    if let Some(es) = store.experts() {
        let c = es.counters();
        bytes += c.bytes;
        m.expert_hits.store(c.hits, Ordering::Relaxed);
        m.expert_misses.store(c.misses, Ordering::Relaxed);
    }
    m.bytes_read.store(bytes, Ordering::Relaxed);
}
