//! The expert store's raw cumulative counters, whole-store ([`ExpertCounters`]) and per
//! decoder layer ([`LayerCounters`]), and their differences. A leaf module: the store
//! (`experts.rs`) counts into them, `telemetry.rs` snapshots and reports them.

/// Cumulative counters of the expert store.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExpertCounters {
    /// Expert uses served from the cache.
    pub hits: u64,
    /// Expert uses read from disk.
    pub misses: u64,
    /// Bytes read from disk for experts.
    pub bytes: u64,
    /// Read requests completed.
    pub reads: u64,
    /// Nanoseconds compute waited for expert reads.
    pub wait_ns: u64,
    /// Nanoseconds spent computing experts.
    pub compute_ns: u64,
    /// Guessed experts whose reads prefetch started.
    pub prefetch_reads: u64,
    /// Expert uses (counted in `misses`) served by a prefetch that had landed or was in flight.
    pub prefetch_hits: u64,
    /// Prefetched experts dropped unused after their reads started.
    pub prefetch_wasted: u64,
    /// Bytes read for prefetched experts that were dropped unused (counted in `bytes`).
    pub prefetch_wasted_bytes: u64,
    /// Guesses dropped before any of their reads started (no bytes read).
    pub prefetch_cancelled: u64,
    /// Bytes fetched from object storage (a pack on S3; counted in `bytes` too).
    pub fetched_bytes: u64,
    /// GETs that completed (each record's, once however often it was retried).
    pub fetches: u64,
    /// GETs tried again after a failure, a timeout, a short answer or a checksum mismatch.
    pub fetch_retries: u64,
    /// Misses read from the local tier of a pack on object storage (no GET).
    pub tier_hits: u64,
}

impl ExpertCounters {
    /// Prefetch recall: the share of expert uses not served by the cache whose reads a
    /// prefetch had already started (`prefetch_hits / misses`; 0 without misses).
    pub fn prefetch_recall(&self) -> f64 {
        if self.misses == 0 {
            0.0
        } else {
            self.prefetch_hits as f64 / self.misses as f64
        }
    }
}

/// Counter differences `b − a`.
pub fn delta(a: &ExpertCounters, b: &ExpertCounters) -> ExpertCounters {
    ExpertCounters {
        hits: b.hits - a.hits,
        misses: b.misses - a.misses,
        bytes: b.bytes - a.bytes,
        reads: b.reads - a.reads,
        wait_ns: b.wait_ns - a.wait_ns,
        compute_ns: b.compute_ns - a.compute_ns,
        prefetch_reads: b.prefetch_reads - a.prefetch_reads,
        prefetch_hits: b.prefetch_hits - a.prefetch_hits,
        prefetch_wasted: b.prefetch_wasted - a.prefetch_wasted,
        prefetch_wasted_bytes: b.prefetch_wasted_bytes - a.prefetch_wasted_bytes,
        prefetch_cancelled: b.prefetch_cancelled - a.prefetch_cancelled,
        fetched_bytes: b.fetched_bytes - a.fetched_bytes,
        fetches: b.fetches - a.fetches,
        fetch_retries: b.fetch_retries - a.fetch_retries,
        tier_hits: b.tier_hits - a.tier_hits,
    }
}

/// Cumulative counters of one decoder layer in the expert store, since it was made.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LayerCounters {
    /// Expert uses (hits and misses) of the layer.
    pub uses: u64,
    /// Expert uses not served by the cache.
    pub misses: u64,
    /// Bytes read for the layer's experts, demand, prefetch and read-ahead alike.
    pub bytes: u64,
    /// Nanoseconds compute waited for expert reads while the layer's experts ran.
    pub wait_ns: u64,
    /// Nanoseconds computing the layer's experts.
    pub compute_ns: u64,
    /// Nanoseconds of the layer's spine (attention, norms, router, shared experts; a
    /// streamed spine unit's wait included), as the decoder reports it
    /// (`ExpertStore::add_spine_ns`).
    pub spine_ns: u64,
    /// Distinct experts of the layer used at least once.
    pub touched: u64,
    /// Bytes of those experts' reads (each expert once, its aligned buffer).
    pub touched_bytes: u64,
}
