//! What the expert store did during a generation: per token and per run, bytes and reads per
//! file and drive, busy time, cache hit rate, I/O wait against compute, and the fraction of the
//! physical decode limit reached (computed in [`crate::engine::report::physical_limit`] from
//! the bytes actually read per token: `L · k · (1 − h) · S` is what the expert reads of it
//! should come to, not a bound to divide by).

use std::os::unix::fs::MetadataExt;
use std::time::Instant;

pub use super::counters::delta;
use super::counters::{ExpertCounters, LayerCounters};
use super::experts::ExpertStore;
use super::io_engine::FileCounters;

/// A point-in-time copy of the store's counters.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub counters: ExpertCounters,
    pub files: Vec<FileCounters>,
    /// Per decoder layer ([`ExpertStore::layer_counters`]).
    pub layers: Vec<LayerCounters>,
    pub at: Instant,
}

impl Snapshot {
    /// The counters of `es` now.
    pub fn of(es: &ExpertStore) -> Self {
        Self {
            counters: es.counters(),
            files: es.file_counters(),
            layers: es.layer_counters().to_vec(),
            at: Instant::now(),
        }
    }
}

/// One layer's share of a phase (the JSON of [`LayerCounters`] differences).
#[derive(Clone, Debug, serde::Serialize)]
pub struct LayerIo {
    pub layer: usize,
    /// Expert uses and misses.
    pub uses: u64,
    pub misses: u64,
    /// Distinct experts used for the first time in the phase.
    pub experts_touched: u64,
    /// Bytes of those experts' reads (each once, its aligned buffer).
    pub touched_bytes: u64,
    /// Bytes read for the layer's experts.
    pub bytes: u64,
    /// `bytes` over the bytes of the experts touched for the first time in the phase (each
    /// read once): 1.0 when every byte read was needed once; more when an expert was read
    /// again (cache evictions, several prompt batches) or read ahead and not used; 0 without
    /// touches.
    pub read_amplification: f64,
    /// Seconds waiting for expert reads, computing experts, and in the spine.
    pub io_wait_s: f64,
    pub compute_s: f64,
    pub spine_s: f64,
}

impl LayerIo {
    /// Per layer, the differences `b − a` (layers of `a` missing count as zero); layers with
    /// neither expert uses nor spine time are left out.
    pub fn between(a: &[LayerCounters], b: &[LayerCounters]) -> Vec<Self> {
        let zero = LayerCounters::default();
        b.iter()
            .enumerate()
            .map(|(l, y)| {
                let x = a.get(l).unwrap_or(&zero);
                let (bytes, tb) = (y.bytes - x.bytes, y.touched_bytes - x.touched_bytes);
                LayerIo {
                    layer: l,
                    uses: y.uses - x.uses,
                    misses: y.misses - x.misses,
                    experts_touched: y.touched - x.touched,
                    touched_bytes: tb,
                    bytes,
                    read_amplification: if tb > 0 {
                        bytes as f64 / tb as f64
                    } else {
                        0.0
                    },
                    io_wait_s: (y.wait_ns - x.wait_ns) as f64 / 1e9,
                    compute_s: (y.compute_ns - x.compute_ns) as f64 / 1e9,
                    spine_s: (y.spine_ns - x.spine_ns) as f64 / 1e9,
                }
            })
            .filter(|r| r.uses > 0 || r.spine_s > 0.0)
            .collect()
    }
}

/// One forward pass (the prompt's passes, or one decode token).
#[derive(Clone, Debug, serde::Serialize)]
pub struct TokenIo {
    /// `"prefill"` or `"decode"`.
    pub phase: &'static str,
    pub seconds: f64,
    pub bytes: u64,
    pub reads: u64,
    pub hits: u64,
    pub misses: u64,
    pub io_wait_s: f64,
    pub compute_s: f64,
    /// Misses served by a prefetch already started.
    pub prefetch_hits: u64,
}

impl TokenIo {
    /// The pass between two snapshots.
    pub fn between(phase: &'static str, a: &Snapshot, b: &Snapshot) -> Self {
        let d = delta(&a.counters, &b.counters);
        Self {
            phase,
            seconds: (b.at - a.at).as_secs_f64(),
            bytes: d.bytes,
            reads: d.reads,
            hits: d.hits,
            misses: d.misses,
            io_wait_s: d.wait_ns as f64 / 1e9,
            compute_s: d.compute_ns as f64 / 1e9,
            prefetch_hits: d.prefetch_hits,
        }
    }
}

/// One file's share of a phase.
#[derive(Clone, Debug, serde::Serialize)]
pub struct FileIo {
    pub path: String,
    /// The device holding the file, `major:minor`.
    pub drive: String,
    pub bytes: u64,
    pub reads: u64,
    pub busy_s: f64,
}

/// The expert store's part of a generation's statistics.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ExpertRunStats {
    /// The engine, e.g. `io_uring (depth 32), O_DIRECT`.
    pub engine: String,
    /// `"io_uring"` or `"pread-pool"`.
    pub backend: String,
    pub direct_io: bool,
    pub cache_policy: String,
    pub cache_budget_bytes: usize,
    pub cache_used_bytes: usize,
    /// Whether prefetch was on.
    pub prefetch: bool,
    /// Whether long batches read the next layer's experts ahead (prefetch counters include
    /// those reads).
    pub read_ahead: bool,
    /// Routed experts in the store (all layers).
    pub experts_total: usize,
    /// `S`: bytes of one expert read (its aligned buffer).
    pub expert_bytes: usize,
    pub prefill: ExpertCountersJson,
    pub decode: ExpertCountersJson,
    /// Per layer, prefill only (the prompt's passes).
    pub prefill_layers: Vec<LayerIo>,
    /// Per file, decode only.
    pub decode_files: Vec<FileIo>,
    pub per_token: Vec<TokenIo>,
}

/// [`ExpertCounters`] with derived rates.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ExpertCountersJson {
    pub hits: u64,
    pub misses: u64,
    pub hit_rate: f64,
    pub bytes: u64,
    pub reads: u64,
    pub io_wait_s: f64,
    pub compute_s: f64,
    /// Guessed experts whose reads started.
    pub prefetch_reads: u64,
    /// Misses served by a prefetch already started.
    pub prefetch_hits: u64,
    /// `prefetch_hits / misses`.
    pub prefetch_recall: f64,
    /// Prefetched experts dropped unused, and their bytes (included in `bytes`).
    pub prefetch_wasted: u64,
    pub prefetch_wasted_bytes: u64,
    /// Guesses dropped before their reads started.
    pub prefetch_cancelled: u64,
    /// A pack on object storage: bytes fetched (in `bytes` too), records fetched (one GET
    /// each), GETs retried, and misses served by the local tier.
    pub fetched_bytes: u64,
    pub fetches: u64,
    pub fetch_retries: u64,
    pub tier_hits: u64,
}

impl From<&ExpertCounters> for ExpertCountersJson {
    fn from(c: &ExpertCounters) -> Self {
        let uses = c.hits + c.misses;
        Self {
            hits: c.hits,
            misses: c.misses,
            hit_rate: if uses > 0 {
                c.hits as f64 / uses as f64
            } else {
                0.0
            },
            bytes: c.bytes,
            reads: c.reads,
            io_wait_s: c.wait_ns as f64 / 1e9,
            compute_s: c.compute_ns as f64 / 1e9,
            prefetch_reads: c.prefetch_reads,
            prefetch_hits: c.prefetch_hits,
            prefetch_recall: c.prefetch_recall(),
            prefetch_wasted: c.prefetch_wasted,
            prefetch_wasted_bytes: c.prefetch_wasted_bytes,
            prefetch_cancelled: c.prefetch_cancelled,
            fetched_bytes: c.fetched_bytes,
            fetches: c.fetches,
            fetch_retries: c.fetch_retries,
            tier_hits: c.tier_hits,
        }
    }
}

impl ExpertRunStats {
    /// The statistics of a generation from snapshots at its start, first token and end.
    pub fn new(
        es: &ExpertStore,
        start: &Snapshot,
        first: &Snapshot,
        end: &Snapshot,
        per_token: Vec<TokenIo>,
    ) -> Self {
        let e = es.engine();
        let decode_files = e
            .files()
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let (a, b) = (&first.files[i], &end.files[i]);
                FileIo {
                    path: f.path().display().to_string(),
                    drive: std::fs::metadata(f.path())
                        .map(|m| format!("{}:{}", libc::major(m.dev()), libc::minor(m.dev())))
                        .unwrap_or_else(|_| "?".into()),
                    bytes: b.bytes - a.bytes,
                    reads: b.reads - a.reads,
                    busy_s: (b.busy_ns - a.busy_ns) as f64 / 1e9,
                }
            })
            .collect();
        Self {
            engine: e.describe(),
            backend: e.backend_name().into(),
            direct_io: e.all_direct(),
            cache_policy: es.cache().policy().to_string(),
            cache_budget_bytes: es.cache().budget(),
            cache_used_bytes: es.cache().used(),
            prefetch: es.prefetch_enabled(),
            read_ahead: es.read_ahead_slots() > 0,
            experts_total: es.experts_total(),
            expert_bytes: es.expert_bytes(),
            prefill: (&delta(&start.counters, &first.counters)).into(),
            decode: (&delta(&first.counters, &end.counters)).into(),
            prefill_layers: LayerIo::between(&start.layers, &first.layers),
            decode_files,
            per_token,
        }
    }

    /// Per-drive decode bytes, reads and busy seconds (sum over the drive's files), and the
    /// drive's bandwidth while busy (bytes/s).
    pub fn drives(&self) -> Vec<(String, u64, u64, f64, f64)> {
        let mut m: std::collections::BTreeMap<String, (u64, u64, f64)> = Default::default();
        for f in &self.decode_files {
            let e = m.entry(f.drive.clone()).or_default();
            e.0 += f.bytes;
            e.1 += f.reads;
            e.2 += f.busy_s;
        }
        m.into_iter()
            .map(|(d, (b, r, s))| (d, b, r, s, if s > 0.0 { b as f64 / s } else { 0.0 }))
            .collect()
    }
}
