//! The fetcher: expert records of a pack on object storage read by ranged GETs, many in
//! flight (`--s3-concurrency` workers on the client's runtime), demand reads before
//! low-priority ones (prefetch guesses), each GET retried by the client's policy and checked
//! against its record's checksum before its bytes are used or kept; a checked record also goes
//! to the local tier. Completions come back to the read engine like a drive read's
//! ([`Done`] with the file [`REMOTE_FILE`]), so the expert store lands them as it lands its
//! other reads.

use std::collections::VecDeque;
use std::io;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use super::client::{Remote, RemoteClient};
use super::tier::LocalTier;
use crate::store::checksum::RecordSum;
use crate::store::io_engine::{Done, REMOTE_FILE};

/// One record (or piece of one) to fetch: `len` bytes at `offset` of the expert object into
/// `dst`.
#[derive(Clone, Copy, Debug)]
pub struct FetchJob {
    /// The caller's tag, returned with the completion.
    pub tag: usize,
    pub offset: u64,
    pub len: usize,
    pub dst: *mut u8,
    /// The record's checksum when the job is a whole record: checked (and the GET retried on
    /// a mismatch) before the bytes land; `None`: the caller checks.
    pub sum: Option<RecordSum>,
    /// The record's slot in the local tier, filled once the checksum passed.
    pub record: Option<usize>,
    /// A prefetch guess: waits behind every demand job.
    pub low: bool,
}

// SAFETY: `dst` points into a buffer the caller keeps alive, untouched, until the job's
// completion has been returned (the read engine drains every job before it is dropped).
unsafe impl Send for FetchJob {}

#[derive(Default)]
struct Queue {
    demand: VecDeque<FetchJob>,
    low: VecDeque<FetchJob>,
}

struct Shared {
    q: Mutex<Queue>,
    wake: tokio::sync::Notify,
}

/// The running fetcher of one expert object.
pub struct Fetcher {
    shared: Arc<Shared>,
    client: Arc<RemoteClient>,
    tier: Option<Arc<LocalTier>>,
    // last: dropping the runtime stops the (idle) workers
    _remote: Remote,
}

impl Fetcher {
    /// Starts `remote`'s `concurrency` workers fetching from the object `object` (a name
    /// under the pack's prefix), sending completions to `done`, filling `tier` when given.
    pub fn start(
        remote: Remote,
        object: String,
        tier: Option<Arc<LocalTier>>,
        done: Sender<Done>,
    ) -> Self {
        let shared = Arc::new(Shared {
            q: Mutex::new(Queue::default()),
            wake: tokio::sync::Notify::new(),
        });
        let client = remote.client.clone();
        let object: Arc<str> = object.into();
        for _ in 0..client.opts.concurrency.max(1) {
            let (sh, c, o, t, d) = (
                shared.clone(),
                client.clone(),
                object.clone(),
                tier.clone(),
                done.clone(),
            );
            remote.handle().spawn(worker(sh, c, o, t, d));
        }
        Self {
            shared,
            client,
            tier,
            _remote: remote,
        }
    }

    /// Queues `j` (see [`FetchJob::low`]).
    pub fn submit(&self, j: FetchJob) {
        let mut q = self.shared.q.lock().unwrap();
        match j.low {
            true => q.low.push_back(j),
            false => q.demand.push_back(j),
        }
        drop(q);
        self.shared.wake.notify_one();
    }

    /// Drops the low-priority jobs tagged `tag` not yet started; returns how many.
    pub fn cancel_low(&self, tag: usize) -> usize {
        let mut q = self.shared.q.lock().unwrap();
        let before = q.low.len();
        q.low.retain(|j| j.tag != tag);
        before - q.low.len()
    }

    /// Moves the low-priority jobs tagged `tag` not yet started to the demand queue.
    pub fn promote(&self, tag: usize) {
        let mut q = self.shared.q.lock().unwrap();
        let (mine, rest): (VecDeque<FetchJob>, VecDeque<FetchJob>) =
            q.low.drain(..).partition(|j| j.tag == tag);
        q.low = rest;
        q.demand.extend(mine);
    }

    /// The client (its URL and retry counter).
    pub fn client(&self) -> &RemoteClient {
        &self.client
    }

    /// The local tier, when one is kept.
    pub fn tier(&self) -> Option<&Arc<LocalTier>> {
        self.tier.as_ref()
    }
}

/// One worker: takes jobs (demand first), fetches, checks, copies, keeps, completes.
async fn worker(
    sh: Arc<Shared>,
    client: Arc<RemoteClient>,
    object: Arc<str>,
    tier: Option<Arc<LocalTier>>,
    done: Sender<Done>,
) {
    loop {
        let j = loop {
            let woken = sh.wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let job = {
                let mut q = sh.q.lock().unwrap();
                q.demand.pop_front().or_else(|| q.low.pop_front())
            };
            match job {
                Some(j) => break j,
                None => woken.await,
            }
        };
        let range = j.offset..j.offset + j.len as u64;
        let sum = j.sum;
        let check = move |b: &[u8]| sum.is_none_or(|s| s.matches(b));
        let got = client.get_range(&object, range, Some(&check)).await;
        let result: io::Result<u64> = match got {
            Ok(b) => {
                // SAFETY: the caller keeps `dst` valid for `len` bytes until the completion,
                // and `b` holds exactly `len` bytes (the client refuses any other length).
                unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), j.dst, b.len()) };
                if let (Some(t), Some(rec), Some(_)) = (&tier, j.record, j.sum) {
                    let t = t.clone();
                    let _ = tokio::task::spawn_blocking(move || t.insert(rec, &b)).await;
                }
                Ok(j.len as u64)
            }
            Err(e) => Err(e),
        };
        if done
            .send(Done {
                tag: j.tag,
                file: REMOTE_FILE,
                result,
            })
            .is_err()
        {
            return;
        }
    }
}
