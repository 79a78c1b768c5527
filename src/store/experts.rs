//! The expert store: routed experts addressed by (layer, expert id), read on demand for the
//! union of a batch's experts, kept in a byte-budgeted cache, and handed to compute in the order
//! their bytes land.
//!
//! A layer's fetch goes: [`ExpertStore::plan`] looks every expert up in the cache (a use for the
//! policy and the heat counts) and issues the misses' reads at once, each into one of
//! `slots` reusable 4 KiB-aligned buffers, split into requests of at most `request_bytes`
//! through the [`IoEngine`]; [`ExpertStore::for_each_landed`] then runs compute on the cache
//! hits first (while the reads fly) and on each miss as its last request completes, issuing the
//! next misses as buffers come free. A miss just computed is offered to the cache; what the cache
//! takes is replaced by an evicted buffer or a new one, so the number of I/O buffers stays fixed.
//!
//! Errors end the fetch after every outstanding read has completed (the kernel or a pool thread
//! may still be writing into a buffer), naming the file and the (layer, expert).

use std::collections::{HashMap, VecDeque};
use std::io;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::aligned::AlignedBuf;
use super::direct::{AlignedSpan, DirectFile};
use super::expert_cache::{CachePolicy, ExpertCache};
use super::heat::Heat;
use super::io_engine::{FileCounters, IoEngine, IoOptions, Req};
use super::streamer::{IoStats, Unit, UnitBytes};

/// Options of the expert store (CLI: `--cache`, `--heat-file`, `--io-engine`, `--io-depth`,
/// `--io-request-size`).
#[derive(Clone, Debug, Default)]
pub struct ExpertStoreOptions {
    pub cache: CachePolicy,
    pub io: IoOptions,
    /// Where per-(layer, expert) use counts are read at start and merged at the end;
    /// `None`: no heat file.
    pub heat_file: Option<PathBuf>,
    /// Check each expert read from a pack against its manifest checksum as it lands
    /// (`--verify-experts`); ignored for models that are not packs.
    pub verify: bool,
}

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
}

/// A re-encoding applied to each miss once its bytes land (see [`ExpertStore::set_transform`]):
/// `(layer, expert, bytes as read) → bytes compute reads`.
pub type ExpertTransform = Box<dyn FnMut(usize, usize, UnitBytes) -> UnitBytes + Send>;

/// A miss being read: its expert, bytes, requests still outstanding, the first error.
struct Landing {
    expert: usize,
    bytes: UnitBytes,
    left: usize,
    err: Option<io::Error>,
}

/// Routed experts read on demand through an I/O engine into a budgeted cache.
pub struct ExpertStore {
    // declared first: dropping it waits for every read, before the buffers below go
    engine: IoEngine,
    /// `units[layer][expert]`; layers without experts are empty.
    units: Vec<Vec<Arc<Unit>>>,
    cache: ExpertCache,
    free: Vec<AlignedBuf>,
    slots: usize,
    slot_bytes: usize,
    request_bytes: usize,
    landing: HashMap<usize, Landing>,
    next_tag: usize,
    pending: VecDeque<usize>,
    planned: Option<(usize, Vec<usize>)>,
    hits_now: Vec<usize>,
    counters: ExpertCounters,
    io_stats: Arc<IoStats>,
    heat: Heat,
    heat_file: Option<PathBuf>,
    /// `checksums[layer][expert]`: SHA-256 of the bytes from the unit's first piece to the end
    /// of its last (a pack record), checked as each miss lands; `None`: not checked.
    checksums: Option<Vec<Vec<[u8; 32]>>>,
    /// Applied to each miss after it lands and before compute and the cache see it.
    transform: Option<ExpertTransform>,
}

/// The aligned reads of `unit` with byte-adjacent ranges of one file merged (a pack record's
/// tensors, or its chunk on one drive, become one read): `(file, aligned start, aligned
/// length, position in the unit's buffer, end of the payload in the file)`.
fn coalesced_spans(unit: &Unit) -> Vec<(usize, u64, usize, usize, u64)> {
    let mut out: Vec<(usize, u64, usize, usize, u64)> = Vec::new();
    let mut pos = 0usize;
    for r in &unit.ranges {
        let span = AlignedSpan::covering(r.offset, r.len);
        let end = r.offset + r.len as u64;
        match out.last_mut() {
            Some(last) if last.0 == r.file && last.1 + last.2 as u64 == span.start => {
                last.2 += span.len;
                last.4 = end;
            }
            _ => out.push((r.file, span.start, span.len, pos, end)),
        }
        pos += span.len;
    }
    out
}

impl ExpertStore {
    /// A store over `files` (the model's files, opened here with `O_DIRECT` when `direct`) for
    /// `units[layer][expert]`, with `slots` I/O buffers (at least one) sized for the largest
    /// expert, a cache of `cache_bytes`, and `opts`. Expert reads are also added to `io_stats`.
    ///
    /// Errors: a file cannot be opened, or is shorter than an expert's byte range (the message
    /// names the file and the (layer, expert)), or `--io-engine uring` and io_uring is
    /// unavailable.
    pub fn new(
        files: &[PathBuf],
        direct: bool,
        units: Vec<Vec<Arc<Unit>>>,
        slots: usize,
        cache_bytes: usize,
        opts: &ExpertStoreOptions,
        io_stats: Arc<IoStats>,
    ) -> io::Result<Self> {
        let dfiles = files
            .iter()
            .map(|p| {
                DirectFile::open(p, direct)
                    .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", p.display())))
            })
            .collect::<io::Result<Vec<_>>>()?;
        for (l, row) in units.iter().enumerate() {
            for (e, u) in row.iter().enumerate() {
                for r in &u.ranges {
                    let f = &dfiles[r.file];
                    let end = r.offset + r.len as u64;
                    if end > f.len() {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!(
                                "{}: the file is {} bytes but expert {e} of layer {l} needs bytes {}..{end} (the file is shorter than its tensor table says)",
                                f.path().display(),
                                f.len(),
                                r.offset
                            ),
                        ));
                    }
                }
            }
        }
        let slot_bytes = units
            .iter()
            .flatten()
            .map(|u| u.buffer_bytes())
            .max()
            .unwrap_or(0);
        let n_layers = units.len();
        let n_experts = units.iter().map(|r| r.len()).max().unwrap_or(0);
        let heat_seed = opts
            .heat_file
            .as_ref()
            .map(|p| Heat::load(p, n_layers, n_experts).seed())
            .unwrap_or_default();
        let engine = IoEngine::new(dfiles, &opts.io)?;
        let slots = slots.max(1);
        Ok(Self {
            engine,
            units,
            cache: ExpertCache::new(opts.cache, cache_bytes, heat_seed),
            free: (0..slots).map(|_| AlignedBuf::new(slot_bytes)).collect(),
            slots,
            slot_bytes,
            request_bytes: super::aligned::round_up(opts.io.request_bytes.max(4096), 4096),
            landing: HashMap::new(),
            next_tag: 0,
            pending: VecDeque::new(),
            planned: None,
            hits_now: Vec::new(),
            counters: ExpertCounters::default(),
            io_stats,
            heat: Heat::zeros(n_layers, n_experts),
            heat_file: opts.heat_file.clone(),
            checksums: None,
            transform: None,
        })
    }

    /// Checks every expert read from now on against `sums[layer][expert]` (SHA-256 of the
    /// bytes from its unit's first piece to the end of its last, as a pack's manifest records
    /// them); a mismatch ends the fetch with an error naming the file(s) and the expert.
    pub fn set_checksums(&mut self, sums: Vec<Vec<[u8; 32]>>) {
        self.checksums = Some(sums);
    }

    /// Re-encodes every miss right after its bytes land (and pass their checksum), before
    /// compute and before the cache takes them: `t(layer, expert, bytes as read)` returns the
    /// bytes compute reads (e.g. FP8 repacked into `F8_E4M3_B128` rows), so the cache holds
    /// that encoding and a hit re-encodes nothing. `out_bytes` is the largest re-encoded
    /// expert's buffer: the I/O buffers grow to it, so that every buffer (read, re-encoded,
    /// cached or evicted) can take any of those roles and the cache is charged the re-encoded
    /// size. `t` may keep the buffer it is given for its next output; buffers it returns
    /// smaller than the I/O buffers are dropped when the cache lets them go. Call before the
    /// first [`ExpertStore::plan`].
    pub fn set_transform(&mut self, t: ExpertTransform, out_bytes: usize) {
        assert!(
            self.landing.is_empty(),
            "transform set while reads are in flight"
        );
        if out_bytes > self.slot_bytes {
            self.slot_bytes = super::aligned::round_up(out_bytes, super::aligned::IO_ALIGN);
            self.free = (0..self.slots)
                .map(|_| AlignedBuf::new(self.slot_bytes))
                .collect();
        }
        self.transform = Some(t);
    }

    /// Bytes of the I/O buffers (`slots` × the largest expert's buffer).
    pub fn io_buffer_bytes(&self) -> usize {
        self.slots * self.slot_bytes
    }

    /// The cache.
    pub fn cache(&self) -> &ExpertCache {
        &self.cache
    }

    /// The engine (backend name, files, per-file counters).
    pub fn engine(&self) -> &IoEngine {
        &self.engine
    }

    /// Cumulative counters.
    pub fn counters(&self) -> ExpertCounters {
        self.counters.clone()
    }

    /// Per-file counters of the engine.
    pub fn file_counters(&self) -> Vec<FileCounters> {
        self.engine.counters()
    }

    /// This run's use counts per (layer, expert).
    pub fn heat(&self) -> &Heat {
        &self.heat
    }

    /// Bytes of the largest expert's read, `S` of the physical limit (payload bytes aligned to
    /// 4 KiB per range; a re-encoded expert's buffer may be larger, see
    /// [`ExpertStore::set_transform`]).
    pub fn expert_bytes(&self) -> usize {
        self.units
            .iter()
            .flatten()
            .map(|u| u.buffer_bytes())
            .max()
            .unwrap_or(0)
    }

    /// Looks up the experts `ids` of `layer` (ascending, each once) and starts reading the ones
    /// the cache does not hold. Take them with [`ExpertStore::for_each_landed`].
    pub fn plan(&mut self, layer: usize, ids: &[usize]) {
        assert!(self.planned.is_none(), "a layer planned twice");
        self.hits_now.clear();
        for &e in ids {
            self.heat.counts[layer][e] += 1;
            if self.cache.hit((layer as u32, e as u32)).is_some() {
                self.hits_now.push(e);
            } else {
                self.pending.push_back(e);
            }
        }
        self.counters.hits += self.hits_now.len() as u64;
        self.counters.misses += self.pending.len() as u64;
        self.planned = Some((layer, ids.to_vec()));
        self.issue(layer);
    }

    /// Starts reads for pending misses while I/O buffers are free.
    fn issue(&mut self, layer: usize) {
        while !self.free.is_empty() {
            let Some(e) = self.pending.pop_front() else {
                return;
            };
            let unit = self.units[layer][e].clone();
            let mut bytes = UnitBytes::laid_out(&unit, self.free.pop().unwrap());
            let base = bytes.buf_ptr();
            let tag = self.next_tag;
            self.next_tag += 1;
            let mut n = 0;
            for (file, start, len, pos, end) in coalesced_spans(&unit) {
                let mut c = 0usize;
                while c < len {
                    let rl = self.request_bytes.min(len - c);
                    let c0 = start + c as u64;
                    let need = (end.saturating_sub(c0) as usize).min(rl);
                    self.engine.submit(Req {
                        file,
                        offset: c0,
                        len: rl,
                        need,
                        // SAFETY: pos + c + rl ≤ the unit's buffer_bytes ≤ the buffer's size.
                        dst: unsafe { base.add(pos + c) },
                        tag,
                    });
                    n += 1;
                    c += rl;
                }
            }
            self.landing.insert(
                tag,
                Landing {
                    expert: e,
                    bytes,
                    left: n,
                    err: None,
                },
            );
        }
    }

    /// Runs `f(expert id, bytes)` on every expert planned for `layer`: cache hits first, then
    /// misses in the order their reads complete. Each expert is passed exactly once.
    ///
    /// Errors: a read failed or came up short; every outstanding read is waited for, the rest
    /// of the layer is dropped, and the message names the file and the (layer, expert).
    pub fn for_each_landed(
        &mut self,
        layer: usize,
        f: &mut dyn FnMut(usize, &UnitBytes),
    ) -> io::Result<()> {
        let (pl, _) = self.planned.take().expect("for_each_landed without plan");
        assert_eq!(pl, layer, "experts taken for another layer than planned");
        let span = tracing::debug_span!(
            "experts",
            layer,
            hits = self.hits_now.len(),
            misses = self.landing.len() + self.pending.len()
        )
        .entered();
        let c0 = self.counters.clone();
        for i in 0..self.hits_now.len() {
            let e = self.hits_now[i];
            let b = self
                .cache
                .get((layer as u32, e as u32))
                .expect("a hit stays cached until the layer is done");
            let t = Instant::now();
            f(e, b);
            self.counters.compute_ns += t.elapsed().as_nanos() as u64;
        }
        while !self.landing.is_empty() {
            let t = Instant::now();
            let d = self.engine.wait();
            let waited = t.elapsed().as_nanos() as u64;
            self.counters.wait_ns += waited;
            self.io_stats.wait_ns.fetch_add(waited, Ordering::Relaxed);
            let Some(l) = self.landing.get_mut(&d.tag) else {
                let e = d
                    .result
                    .err()
                    .unwrap_or_else(|| io::Error::other("completion of an unknown read"));
                return Err(self.fail(e));
            };
            l.left -= 1;
            match d.result {
                Ok(n) => {
                    self.counters.bytes += n;
                    self.counters.reads += 1;
                    self.io_stats.bytes_read.fetch_add(n, Ordering::Relaxed);
                    self.io_stats.reads.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    l.err.get_or_insert(e);
                }
            }
            if l.left > 0 {
                continue;
            }
            let l = self.landing.remove(&d.tag).expect("landing present");
            if let Some(e) = l.err {
                let msg = format!("{e} (expert {} of layer {layer})", l.expert);
                self.free.push(l.bytes.into_buf());
                return Err(self.fail(io::Error::new(e.kind(), msg)));
            }
            if let Some(sums) = &self.checksums {
                if let Some(msg) = self.check_sum(sums, layer, l.expert, &l.bytes) {
                    self.free.push(l.bytes.into_buf());
                    return Err(self.fail(io::Error::new(io::ErrorKind::InvalidData, msg)));
                }
            }
            let t = Instant::now();
            let bytes = match self.transform.as_mut() {
                Some(tr) => tr(layer, l.expert, l.bytes),
                None => l.bytes,
            };
            f(l.expert, &bytes);
            self.counters.compute_ns += t.elapsed().as_nanos() as u64;
            let out = self.cache.admit((layer as u32, l.expert as u32), bytes);
            self.refill(out);
            self.issue(layer);
        }
        let c1 = &self.counters;
        tracing::debug!(
            parent: &span,
            bytes = c1.bytes - c0.bytes,
            wait_ns = c1.wait_ns - c0.wait_ns,
            compute_ns = c1.compute_ns - c0.compute_ns,
            "layer experts done"
        );
        Ok(())
    }

    /// The error message when expert `e` of `layer` in `b` does not match its checksum.
    fn check_sum(
        &self,
        sums: &[Vec<[u8; 32]>],
        layer: usize,
        e: usize,
        b: &UnitBytes,
    ) -> Option<String> {
        use sha2::Digest;
        let want = sums.get(layer).and_then(|r| r.get(e))?;
        let got: [u8; 32] = sha2::Sha256::digest(b.record()).into();
        if &got == want {
            return None;
        }
        let files: Vec<String> = self.units[layer][e]
            .ranges
            .iter()
            .map(|r| format!("{}", self.engine.files()[r.file].path().display()))
            .collect();
        Some(format!(
            "checksum mismatch in expert {e} of layer {layer} read from {}",
            files.join(", ")
        ))
    }

    /// Brings the free I/O buffers back to `slots` after a miss left the engine: from the
    /// buffers the cache gave back, else new ones.
    fn refill(&mut self, back: Vec<UnitBytes>) {
        let want = self.slots - self.landing.len();
        for b in back {
            let buf = b.into_buf();
            if self.free.len() < want && buf.capacity() >= self.slot_bytes {
                self.free.push(buf);
            }
        }
        while self.free.len() < want {
            self.free.push(AlignedBuf::new(self.slot_bytes));
        }
    }

    /// Ends the current fetch after an error: waits for every read, frees every buffer.
    fn fail(&mut self, e: io::Error) -> io::Error {
        self.reset();
        e
    }

    /// Drops whatever is planned or in flight (after an error elsewhere in the pass).
    pub fn reset(&mut self) {
        self.engine.drain();
        self.pending.clear();
        self.planned = None;
        self.hits_now.clear();
        let bufs: Vec<AlignedBuf> = self
            .landing
            .drain()
            .map(|(_, l)| l.bytes.into_buf())
            .collect();
        self.free.extend(bufs);
    }

    /// Merges this run's use counts into the heat file (when one is set) and clears them.
    ///
    /// Errors: the file cannot be written (the message names it).
    pub fn save_heat(&mut self) -> io::Result<()> {
        let Some(p) = &self.heat_file else {
            return Ok(());
        };
        Heat::merge_into_file(&self.heat, p)?;
        let (l, e) = (
            self.heat.counts.len(),
            self.heat.counts.first().map_or(0, |r| r.len()),
        );
        self.heat = Heat::zeros(l, e);
        Ok(())
    }
}

impl Drop for ExpertStore {
    fn drop(&mut self) {
        self.engine.drain();
        if let Err(e) = self.save_heat() {
            tracing::warn!("could not save the expert heat file: {e}");
        }
    }
}
