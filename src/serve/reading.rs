//! The write timeout (`--write-timeout`): a streaming client that stops reading stops its
//! generation. The stream's body is polled only as the socket takes bytes, so when the client
//! stops reading, the events the worker sends pile up unread; [`Reading`] counts the events
//! sent and taken and when one was last taken, and the worker cancels the job once events have
//! waited unread longer than the limit (else it would generate to `max_tokens` into a buffer
//! nobody reads, holding a slot).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How far a stream's client has read (module header). Shared by the worker (which counts
/// what it sends) and the response stream (which counts what it takes).
#[derive(Debug)]
pub struct Reading {
    start: Instant,
    sent: AtomicU64,
    taken: AtomicU64,
    /// Milliseconds after `start` of the last take (or of the start).
    last_ms: AtomicU64,
    /// Set when the worker cut the generation for it.
    cut: AtomicBool,
}

impl Default for Reading {
    fn default() -> Self {
        Self {
            start: Instant::now(),
            sent: AtomicU64::new(0),
            taken: AtomicU64::new(0),
            last_ms: AtomicU64::new(0),
            cut: AtomicBool::new(false),
        }
    }
}

impl Reading {
    /// An event was sent towards the client.
    pub fn sent(&self) {
        self.sent.fetch_add(1, Ordering::SeqCst);
    }

    /// The stream took an event the worker counted with [`Reading::sent`] (to write it to
    /// the client).
    pub fn took(&self) {
        self.last_ms
            .store(self.start.elapsed().as_millis() as u64, Ordering::SeqCst);
        self.taken.fetch_add(1, Ordering::SeqCst);
    }

    /// Whether an event sent has waited unread, with nothing taken for longer than `limit`
    /// (at `now`).
    pub fn stalled_at(&self, limit: Duration, now: Instant) -> bool {
        if self.taken.load(Ordering::SeqCst) >= self.sent.load(Ordering::SeqCst) {
            return false;
        }
        let last = self.start + Duration::from_millis(self.last_ms.load(Ordering::SeqCst));
        now.saturating_duration_since(last) >= limit
    }

    /// [`Reading::stalled_at`] now; a stall is remembered ([`Reading::was_cut`]).
    pub fn stalled(&self, limit: Duration) -> bool {
        let s = self.stalled_at(limit, Instant::now());
        if s {
            self.cut.store(true, Ordering::SeqCst);
        }
        s
    }

    /// Whether [`Reading::stalled`] ever said so (the generation was cut for it).
    pub fn was_cut(&self) -> bool {
        self.cut.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_unread_past_the_limit_stall() {
        let r = Reading::default();
        let t = r.start;
        let s = Duration::from_secs(1);
        assert!(!r.stalled_at(s, t + Duration::from_secs(5)), "nothing sent");
        r.sent();
        assert!(!r.stalled_at(s, t + Duration::from_millis(999)));
        assert!(r.stalled_at(s, t + Duration::from_millis(1000)));
        r.took();
        assert!(!r.stalled_at(s, t + Duration::from_secs(5)), "all taken");
        r.sent();
        r.sent();
        r.took();
        let last = r.start + Duration::from_millis(r.last_ms.load(Ordering::SeqCst));
        assert!(!r.stalled_at(s, last + Duration::from_millis(999)));
        assert!(r.stalled_at(s, last + Duration::from_secs(1)));
    }
}
