//! The write timeout (`--write-timeout`): a streaming client that stops reading stops its
//! generation. The stream's body is polled only as the socket takes bytes, so when the client
//! stops reading, the events the worker sends pile up unread; [`Reading`] counts the events
//! sent and taken, and since when some have waited unread, and the worker cancels the job once
//! an event has waited unread longer than the limit (else it would generate to `max_tokens`
//! into a buffer nobody reads, holding a slot). Time in the queue, in a prefill or between
//! tokens never counts: the clock runs only while something sent is not yet taken, and restarts
//! whenever the client takes an event.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How far a stream's client has read (module header). Shared by the worker (which counts
/// the text events it sends) and the response stream (which counts those it takes).
#[derive(Debug, Default)]
pub struct Reading {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    sent: u64,
    taken: u64,
    /// While `taken < sent`: when the oldest event still unread was sent, or when the client
    /// last took one, whichever is later.
    since: Option<Instant>,
    /// The worker cut the generation for it.
    cut: bool,
}

impl Reading {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An event was sent towards the client (at `now`).
    pub fn sent_at(&self, now: Instant) {
        let mut s = self.state();
        if s.taken >= s.sent {
            s.since = Some(now);
        }
        s.sent += 1;
    }

    /// [`Reading::sent_at`] now.
    pub fn sent(&self) {
        self.sent_at(Instant::now())
    }

    /// The stream took an event the worker counted with [`Reading::sent`] (to write it to
    /// the client), at `now`.
    pub fn took_at(&self, now: Instant) {
        let mut s = self.state();
        s.taken += 1;
        s.since = (s.taken < s.sent).then_some(now);
    }

    /// [`Reading::took_at`] now.
    pub fn took(&self) {
        self.took_at(Instant::now())
    }

    /// Whether an event has waited unread longer than `limit` at `now` (module header); a
    /// stall is remembered ([`Reading::was_cut`]).
    pub fn stalled_at(&self, limit: Duration, now: Instant) -> bool {
        let mut s = self.state();
        let stalled = s.taken < s.sent
            && s.since
                .is_some_and(|t| now.saturating_duration_since(t) >= limit);
        s.cut |= stalled;
        stalled
    }

    /// [`Reading::stalled_at`] now.
    pub fn stalled(&self, limit: Duration) -> bool {
        self.stalled_at(limit, Instant::now())
    }

    /// Whether [`Reading::stalled`] ever said so (the generation was cut for it).
    pub fn was_cut(&self) -> bool {
        self.state().cut
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_time_with_an_event_unread_counts() {
        let r = Reading::default();
        let t = Instant::now();
        let s = Duration::from_secs(1);
        let at = |ms| t + Duration::from_millis(ms);
        // a long wait before the first event (queue, prefill) is not a stall
        assert!(!r.stalled_at(s, at(5000)), "nothing sent");
        r.sent_at(at(5000));
        assert!(!r.stalled_at(s, at(5999)));
        r.took_at(at(6100));
        // a long gap between events, all taken, is not a stall either
        assert!(!r.stalled_at(s, at(20_000)));
        r.sent_at(at(20_000));
        r.sent_at(at(20_500));
        r.took_at(at(20_600));
        assert!(
            !r.stalled_at(s, at(21_599)),
            "the client took one 999 ms ago"
        );
        assert!(!r.was_cut());
        assert!(r.stalled_at(s, at(21_600)));
        assert!(r.was_cut());
        r.took_at(at(21_700));
        assert!(!r.stalled_at(s, at(30_000)), "all taken");
    }
}
