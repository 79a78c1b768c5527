//! Server metrics in the Prometheus text exposition format (version 0.0.4): requests by
//! endpoint and status, prompt / cached / generated tokens, time-to-first-token and decode
//! time histograms, cancellations, bytes read, expert cache hits and misses, queue length,
//! requests in flight, and speculative decoding's drafted / accepted tokens and passes.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Upper bounds (seconds) of the histogram buckets.
const BUCKETS: [f64; 12] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// A cumulative histogram of seconds.
#[derive(Debug, Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    sum: f64,
    n: u64,
}

impl Histogram {
    fn observe(&mut self, v: f64) {
        for (c, &b) in self.counts.iter_mut().zip(&BUCKETS) {
            if v <= b {
                *c += 1;
            }
        }
        self.sum += v;
        self.n += 1;
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (c, b) in self.counts.iter().zip(BUCKETS) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.n);
        let _ = writeln!(out, "{name}_sum {}\n{name}_count {}", self.sum, self.n);
    }
}

/// Every metric of one server; shared by the handlers and the worker.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    ttft: Mutex<Histogram>,
    decode: Mutex<Histogram>,
    /// Prompt tokens of finished generations.
    pub prompt_tokens: AtomicU64,
    /// Prompt tokens whose KV cache was reused.
    pub cached_tokens: AtomicU64,
    /// Generated tokens.
    pub generated_tokens: AtomicU64,
    /// Generations cancelled (client gone, or shutdown), running or still queued.
    pub cancelled: AtomicU64,
    /// Bytes read from disk by the model so far (weights streamed and experts).
    pub bytes_read: AtomicU64,
    /// Expert uses served from the expert cache.
    pub expert_hits: AtomicU64,
    /// Expert uses read from disk.
    pub expert_misses: AtomicU64,
    /// Jobs waiting in the queue.
    pub queued: AtomicU64,
    /// Jobs the worker is running (at most its slots).
    pub in_flight: AtomicU64,
    /// KV cache positions the slots hold (running requests and idle slots' cached
    /// conversations), set after every step.
    pub kv_positions: AtomicU64,
    /// Speculative decoding: tokens drafted and sent to verification.
    pub spec_drafted: AtomicU64,
    /// Speculative decoding: drafted tokens the target accepted.
    pub spec_accepted: AtomicU64,
    /// Speculative decoding: verification passes of the target.
    pub spec_verify_passes: AtomicU64,
    /// Speculative decoding: plain (one-token) passes of the target.
    pub spec_plain_passes: AtomicU64,
    /// Speculative decoding: switches to plain passes because speculation cost more per token.
    pub spec_fallbacks: AtomicU64,
}

impl Metrics {
    /// Counts one answered request.
    pub fn request(&self, endpoint: &str, status: u16) {
        if let Ok(mut m) = self.requests.lock() {
            *m.entry((endpoint.to_string(), status)).or_insert(0) += 1;
        }
    }

    /// Records a finished generation's timings.
    pub fn generation(&self, ttft_s: f64, decode_s: f64) {
        if let Ok(mut h) = self.ttft.lock() {
            h.observe(ttft_s);
        }
        if let Ok(mut h) = self.decode.lock() {
            h.observe(decode_s);
        }
    }

    /// Adds one generation's speculative decoding counters.
    pub fn spec(&self, st: &crate::engine::SpecStats) {
        for (c, v) in [
            (&self.spec_drafted, st.drafted),
            (&self.spec_accepted, st.accepted),
            (&self.spec_verify_passes, st.verify_passes),
            (&self.spec_plain_passes, st.plain_passes),
            (&self.spec_fallbacks, st.fallbacks),
        ] {
            c.fetch_add(v, Ordering::Relaxed);
        }
    }

    /// The text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP deltafin_requests_total Requests answered, by endpoint and HTTP status.\n# TYPE deltafin_requests_total counter"
        );
        if let Ok(m) = self.requests.lock() {
            for ((e, s), n) in m.iter() {
                let _ = writeln!(
                    out,
                    "deltafin_requests_total{{endpoint=\"{e}\",status=\"{s}\"}} {n}"
                );
            }
        }
        let counters: [(&str, &str, &AtomicU64, &str); 15] = [
            (
                "deltafin_prompt_tokens_total",
                "Prompt tokens of generations.",
                &self.prompt_tokens,
                "counter",
            ),
            (
                "deltafin_cached_prompt_tokens_total",
                "Prompt tokens whose KV cache was reused from the previous request.",
                &self.cached_tokens,
                "counter",
            ),
            (
                "deltafin_generated_tokens_total",
                "Tokens generated.",
                &self.generated_tokens,
                "counter",
            ),
            (
                "deltafin_cancelled_total",
                "Generations cancelled because the client disconnected or the server is stopping.",
                &self.cancelled,
                "counter",
            ),
            (
                "deltafin_bytes_read_total",
                "Bytes of weights read from disk.",
                &self.bytes_read,
                "counter",
            ),
            (
                "deltafin_expert_cache_hits_total",
                "Expert uses served from the expert cache.",
                &self.expert_hits,
                "counter",
            ),
            (
                "deltafin_expert_cache_misses_total",
                "Expert uses read from disk.",
                &self.expert_misses,
                "counter",
            ),
            (
                "deltafin_queue_length",
                "Requests waiting for the model.",
                &self.queued,
                "gauge",
            ),
            (
                "deltafin_in_flight",
                "Requests being generated.",
                &self.in_flight,
                "gauge",
            ),
            (
                "deltafin_kv_cache_tokens",
                "KV cache positions the slots hold (running requests and cached conversations).",
                &self.kv_positions,
                "gauge",
            ),
            (
                "deltafin_spec_drafted_tokens_total",
                "Speculative decoding: tokens drafted and verified by the model.",
                &self.spec_drafted,
                "counter",
            ),
            (
                "deltafin_spec_accepted_tokens_total",
                "Speculative decoding: drafted tokens the model accepted.",
                &self.spec_accepted,
                "counter",
            ),
            (
                "deltafin_spec_verify_passes_total",
                "Speculative decoding: verification passes (the last token plus the drafts in one batch).",
                &self.spec_verify_passes,
                "counter",
            ),
            (
                "deltafin_spec_plain_passes_total",
                "Speculative decoding: plain one-token passes (no draft, or fallback).",
                &self.spec_plain_passes,
                "counter",
            ),
            (
                "deltafin_spec_fallbacks_total",
                "Speculative decoding: switches to plain passes because verification cost more per token.",
                &self.spec_fallbacks,
                "counter",
            ),
        ];
        for (name, help, v, kind) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {}",
                v.load(Ordering::Relaxed)
            );
        }
        let (h, m) = (
            self.expert_hits.load(Ordering::Relaxed),
            self.expert_misses.load(Ordering::Relaxed),
        );
        let rate = if h + m == 0 {
            0.0
        } else {
            h as f64 / (h + m) as f64
        };
        let _ = writeln!(
            out,
            "# HELP deltafin_expert_cache_hit_rate Share of expert uses served from the cache.\n# TYPE deltafin_expert_cache_hit_rate gauge\ndeltafin_expert_cache_hit_rate {rate}"
        );
        if let Ok(t) = self.ttft.lock() {
            t.write(
                &mut out,
                "deltafin_ttft_seconds",
                "Time from the start of a generation to its first token.",
            );
        }
        if let Ok(t) = self.decode.lock() {
            t.write(
                &mut out,
                "deltafin_decode_seconds",
                "Time a generation spent after its first token.",
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_histograms() {
        let m = Metrics::default();
        m.request("/v1/chat/completions", 200);
        m.request("/v1/chat/completions", 200);
        m.generation(0.03, 1.0);
        m.cancelled.fetch_add(1, Ordering::Relaxed);
        let t = m.render();
        assert!(t.contains(
            "deltafin_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 2\n"
        ));
        assert!(t.contains("deltafin_cancelled_total 1\n"));
        assert!(t.contains("deltafin_ttft_seconds_bucket{le=\"0.025\"} 0\n"));
        assert!(t.contains("deltafin_ttft_seconds_bucket{le=\"0.05\"} 1\n"));
        assert!(t.contains("deltafin_ttft_seconds_count 1\n"));
        m.spec(&crate::engine::SpecStats {
            drafted: 7,
            accepted: 5,
            verify_passes: 2,
            plain_passes: 3,
            fallbacks: 1,
            ..Default::default()
        });
        let t = m.render();
        for line in [
            "# TYPE deltafin_spec_drafted_tokens_total counter\ndeltafin_spec_drafted_tokens_total 7\n",
            "deltafin_spec_accepted_tokens_total 5\n",
            "deltafin_spec_verify_passes_total 2\n",
            "deltafin_spec_plain_passes_total 3\n",
            "deltafin_spec_fallbacks_total 1\n",
        ] {
            assert!(t.contains(line), "{line} in {t}");
        }
    }
}
