//! The model's one worker thread and its bounded FIFO queue. Handlers submit [`Job`]s with
//! [`Queue::submit`] (refused at once when the queue is full); the worker runs them one at a
//! time, sending [`Event`]s back. A queued job whose client has gone (its event receiver
//! dropped) gives up its slot at the next submit and is never run; a running one stops
//! before its next decode step.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use tokio::sync::mpsc::UnboundedSender;

use super::metrics::Metrics;
use crate::engine::{Chunk, Engine, Outcome, Params};

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
        if st.jobs.len() >= self.shared.capacity {
            return Err(SubmitError::Full);
        }
        st.jobs.push_back(job);
        self.metrics.queued.fetch_add(1, Ordering::SeqCst);
        self.shared.ready.notify_one();
        Ok(())
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
    let queue = Queue::new(capacity, Arc::clone(&metrics));
    let rx = Receiver(Arc::clone(&queue.shared));
    let handle = std::thread::Builder::new()
        .name("deltafin-model".into())
        .spawn(move || run(engine, rx, &metrics, &stopping))
        .expect("spawning the model thread");
    (queue, handle)
}

fn run(mut engine: Engine, rx: Receiver, m: &Metrics, stopping: &AtomicBool) -> Engine {
    while let Some(job) = rx.recv() {
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
        if let Some(sp) = &engine.spec {
            // the counters of this generation, failed ones included
            m.spec(&sp.stats);
        }
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
                if o.finish == crate::engine::FinishReason::Cancelled {
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
            events,
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
}
