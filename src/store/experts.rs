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
//!
//! **Prefetch** ([`ExpertStore::prefetch`]): the model guesses the next MoE layer's experts
//! (that layer's router applied to this layer's hidden state) and the store reads the guesses
//! that are not cached at low priority ([`IoEngine::submit_low`]): into up to `slots` buffers
//! of their own, only when no demand read waits for a buffer, and only into idle queue slots.
//! When that layer is planned, a guess that landed is used like a cache hit, one in flight
//! becomes a demand read, and the others are dropped: reads not started are cancelled, the bytes
//! of started ones count as wasted. Prefetch changes when bytes arrive, never which experts are
//! computed or the order they are reduced in.

use super::checksum::RecordSum;
use std::collections::{HashMap, VecDeque};
use std::io;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::aligned::AlignedBuf;
pub use super::counters::{ExpertCounters, LayerCounters};
use super::direct::{AlignedSpan, DirectFile};
use super::expert_cache::{CachePolicy, ExpertCache};
use super::heat::Heat;
use super::io_engine::{FileCounters, IoEngine, IoOptions, Req};
use super::streamer::{IoStats, Unit, UnitBytes};

mod prefetch;
mod remote;
mod speculative;
pub use prefetch::{expert_layout, ExpertLayout, PrefetchMode};

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
    /// Whether the next MoE layer's guessed experts are read at low priority (`--prefetch`).
    pub prefetch: PrefetchMode,
    /// Whether long batches (a prompt's passes) read the next MoE layer's experts ahead of its
    /// routing, in file order (`--read-ahead`; see `experts/prefetch.rs`). Default: false (the
    /// CLI's default is on).
    pub read_ahead: bool,
    /// GETs of a pack on object storage (`--s3-concurrency`, `--s3-timeout`, `--s3-retries`).
    pub remote: crate::store::remote::FetchOptions,
    /// Bytes the local tier of a pack on object storage may hold (`--local-cache-size`);
    /// `None`: no local tier (`--local-cache` not given).
    pub local_cache: Option<u64>,
}

/// A re-encoding applied to each miss once its bytes land (see [`ExpertStore::set_transform`]):
/// `(layer, expert, bytes as read) → bytes compute reads`.
pub type ExpertTransform = Box<dyn FnMut(usize, usize, UnitBytes) -> UnitBytes + Send>;

/// Why an expert is being read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Purpose {
    /// The layer being computed needs it.
    Demand,
    /// A guess for the MoE layer planned next.
    Prefetch,
    /// A guess that turned out wrong; its bytes are dropped when they land.
    Discard,
}

/// A read in flight: its (layer, expert), bytes, requests still outstanding, bytes landed so
/// far, the first error, and why it is read.
struct Landing {
    layer: usize,
    expert: usize,
    bytes: UnitBytes,
    left: usize,
    got: u64,
    err: Option<io::Error>,
    purpose: Purpose,
    /// Read from the local tier's mirror of a pack on object storage.
    from_mirror: bool,
}

/// Routed experts read on demand through an I/O engine into a budgeted cache.
pub struct ExpertStore {
    // declared first: dropping it waits for every read, before the buffers below go
    engine: IoEngine,
    /// `units[layer][expert]`; layers without experts are empty.
    units: Vec<Vec<Arc<Unit>>>,
    cache: ExpertCache,
    free: Vec<AlignedBuf>,
    /// Buffers for demand reads; `prefetch_slots` more may hold prefetched experts.
    slots: usize,
    prefetch_slots: usize,
    slot_bytes: usize,
    request_bytes: usize,
    landing: HashMap<usize, Landing>,
    next_tag: usize,
    pending: VecDeque<usize>,
    planned: Option<(usize, Vec<usize>)>,
    hits_now: Vec<usize>,
    /// Landed prefetches the layer now planned takes, computed right after the cache hits.
    ready: VecDeque<(usize, UnitBytes)>,
    /// Guesses not yet started: (layer, expert), best first.
    guesses: VecDeque<(usize, usize)>,
    /// Prefetches that landed, with their bytes read, waiting for their layer to be planned.
    staged: HashMap<(usize, usize), (UnitBytes, u64)>,
    counters: ExpertCounters,
    io_stats: Arc<IoStats>,
    heat: Heat,
    heat_file: Option<PathBuf>,
    /// `checksums[layer][expert]`: of the bytes from the unit's first piece to the end of its
    /// last (a pack record), checked as each miss lands; `None`: not checked.
    checksums: Option<Vec<Vec<RecordSum>>>,
    /// Applied to each miss after it lands and before compute and the cache see it.
    transform: Option<ExpertTransform>,
    /// Per decoder layer: cumulative uses, bytes, wait, compute and spine time.
    layers: Vec<LayerCounters>,
    /// `seen[layer][expert]`: used at least once (for [`LayerCounters::touched`]).
    seen: Vec<Vec<bool>>,
    /// Buffers a layer's read-ahead may hold (0: no read-ahead); see `prefetch.rs`.
    ra_slots: usize,
    /// Whether the batches now planned are long (read-ahead on, the cache's budget lowered by
    /// `ra_slots` buffers).
    ra_active: bool,
    /// The cache's budget as given, restored when read-ahead ends.
    cache_given: usize,
    /// Draft rows of a verification pass (see `experts/speculative.rs`).
    drafts: speculative::DraftRows,
    /// A pack on object storage (see `experts/remote.rs`).
    remote: Option<remote::RemoteState>,
    remote_opts: crate::store::remote::FetchOptions,
    local_cache: Option<u64>,
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
    /// expert, a cache of `cache_bytes`, and `opts`. With prefetch on (`opts.prefetch` for the
    /// number of drives holding the experts), `slots` more buffers may hold prefetched experts. Expert reads are also added to `io_stats`.
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
        let layout = expert_layout(files, units.iter().flatten().map(|u| &**u));
        let prefetch_slots = if opts.prefetch.enabled(layout) {
            slots
        } else {
            0
        };
        let ra_slots =
            prefetch::read_ahead_slots(opts.read_ahead, n_experts, cache_bytes, slot_bytes);
        let seen: Vec<Vec<bool>> = units.iter().map(|r| vec![false; r.len()]).collect();
        Ok(Self {
            engine,
            units,
            cache: ExpertCache::new(opts.cache, cache_bytes, heat_seed),
            free: (0..slots + prefetch_slots)
                .map(|_| AlignedBuf::new(slot_bytes))
                .collect(),
            slots,
            prefetch_slots,
            slot_bytes,
            request_bytes: super::aligned::round_up(opts.io.request_bytes.max(4096), 4096),
            landing: HashMap::new(),
            next_tag: 0,
            pending: VecDeque::new(),
            planned: None,
            hits_now: Vec::new(),
            ready: VecDeque::new(),
            guesses: VecDeque::new(),
            staged: HashMap::new(),
            counters: ExpertCounters::default(),
            io_stats,
            heat: Heat::zeros(n_layers, n_experts),
            heat_file: opts.heat_file.clone(),
            checksums: None,
            transform: None,
            layers: vec![LayerCounters::default(); n_layers],
            seen,
            ra_slots,
            ra_active: false,
            cache_given: cache_bytes,
            drafts: Default::default(),
            remote: None,
            remote_opts: opts.remote.clone(),
            local_cache: opts.local_cache,
        })
    }

    /// Checks every expert read from now on against `sums[layer][expert]` (of the bytes from
    /// its unit's first piece to the end of its last, as a pack's manifest records them); a
    /// mismatch ends the fetch with an error naming the file(s) and the expert.
    pub fn set_checksums(&mut self, sums: Vec<Vec<RecordSum>>) {
        self.checksums = Some(sums);
    }

    /// Re-encodes every miss right after its bytes land (and pass their checksum), before
    /// compute and before the cache takes them: `t(layer, expert, bytes as read)` returns the
    /// bytes compute reads (e.g. FP8 repacked into `F8_E4M3_B128` rows), so the cache holds
    /// that encoding and a hit re-encodes nothing (a landed prefetch is re-encoded when its
    /// layer takes it). `out_bytes` is the largest re-encoded expert's buffer: the I/O buffers
    /// grow to it, so that every buffer (read, re-encoded, cached or evicted) can take any of
    /// those roles and the cache is charged the re-encoded size. `t` may keep the buffer it is
    /// given for its next output; buffers it returns smaller than the I/O buffers are dropped
    /// when the cache lets them go. Call before the first [`ExpertStore::plan`].
    pub fn set_transform(&mut self, t: ExpertTransform, out_bytes: usize) {
        assert!(
            self.landing.is_empty(),
            "transform set while reads are in flight"
        );
        if out_bytes > self.slot_bytes {
            self.slot_bytes = super::aligned::round_up(out_bytes, super::aligned::IO_ALIGN);
            self.ra_slots = match self.cache_given / self.slot_bytes {
                n if n < 2 => 0,
                n => self.ra_slots.min(n),
            };
            self.free = (0..self.slots + self.prefetch_slots)
                .map(|_| AlignedBuf::new(self.slot_bytes))
                .collect();
        }
        self.transform = Some(t);
    }

    /// Bytes of the I/O buffers (demand and prefetch slots × the largest expert's buffer).
    pub fn io_buffer_bytes(&self) -> usize {
        (self.slots + self.prefetch_slots) * self.slot_bytes
    }

    /// Whether prefetch is on.
    pub fn prefetch_enabled(&self) -> bool {
        self.prefetch_slots > 0
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
        let mut c = self.counters.clone();
        if let Some(f) = self.engine.fetcher() {
            c.fetch_retries = f.client().retries();
        }
        c
    }

    /// Per-file counters of the engine.
    pub fn file_counters(&self) -> Vec<FileCounters> {
        self.engine.counters()
    }

    /// Per decoder layer: cumulative expert uses, bytes read, wait, compute and spine time.
    pub fn layer_counters(&self) -> &[LayerCounters] {
        &self.layers
    }

    /// Adds `ns` nanoseconds of layer `layer`'s spine to its counters (the decoder times each
    /// spine; [`LayerCounters::spine_ns`]).
    pub fn add_spine_ns(&mut self, layer: usize, ns: u64) {
        if let Some(l) = self.layers.get_mut(layer) {
            l.spine_ns += ns;
        }
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
    /// the cache does not hold; `first_rows[i]` is the first batch row that uses `ids[i]`
    /// (within a verification pass, [`ExpertStore::begin_drafts`], an expert first used by a
    /// draft row is tentative: see `experts/speculative.rs`). Take them with
    /// [`ExpertStore::for_each_landed`].
    pub fn plan(&mut self, layer: usize, ids: &[usize], first_rows: &[usize]) {
        assert!(self.planned.is_none(), "a layer planned twice");
        self.hits_now.clear();
        self.drafts.now.clear();
        self.switch_read_ahead(ids.len(), self.units[layer].len());
        let mut misses = 0;
        for (i, &e) in ids.iter().enumerate() {
            let row = first_rows[i];
            let tentative = self.drafts.tentative(row);
            let key = (layer as u32, e as u32);
            if tentative {
                let read = if self.cache.contains(key) {
                    0
                } else {
                    self.units[layer][e].buffer_bytes() as u64
                };
                self.drafts.uses.push((layer, e, row, read));
                self.drafts.now.push(e);
            } else {
                self.heat.counts[layer][e] += 1;
            }
            if !self.seen[layer][e] {
                self.seen[layer][e] = true;
                self.layers[layer].touched += 1;
                self.layers[layer].touched_bytes += self.units[layer][e].buffer_bytes() as u64;
            }
            let held = if tentative {
                self.cache.contains(key)
            } else {
                self.cache.hit(key).is_some()
            };
            if held {
                self.hits_now.push(e);
                continue;
            }
            misses += 1;
            if let Some((b, _)) = self.staged.remove(&(layer, e)) {
                self.counters.prefetch_hits += 1;
                self.ready.push_back((e, b));
                continue;
            }
            let guessed = self
                .landing
                .iter_mut()
                .find(|(_, l)| l.purpose == Purpose::Prefetch && (l.layer, l.expert) == (layer, e));
            if let Some((&tag, l)) = guessed {
                self.counters.prefetch_hits += 1;
                l.purpose = Purpose::Demand;
                self.engine.promote(tag);
            } else {
                self.pending.push_back(e);
            }
        }
        self.drop_guesses();
        self.trim_free();
        self.counters.hits += self.hits_now.len() as u64;
        self.counters.misses += misses;
        self.layers[layer].uses += ids.len() as u64;
        self.layers[layer].misses += misses;
        self.planned = Some((layer, ids.to_vec()));
        self.issue(layer);
    }

    /// Starts reads for pending misses while I/O buffers are free.
    fn issue(&mut self, layer: usize) {
        while !self.free.is_empty() {
            let Some(e) = self.pending.pop_front() else {
                return;
            };
            self.start(layer, e, Purpose::Demand);
        }
    }

    /// Starts the reads of expert `e` of `layer` into a free buffer, at low priority for a
    /// prefetch.
    fn start(&mut self, layer: usize, e: usize, purpose: Purpose) {
        {
            let unit = self.units[layer][e].clone();
            let mut bytes = UnitBytes::laid_out(&unit, self.free.pop().unwrap());
            let base = bytes.buf_ptr();
            let tag = self.next_tag;
            self.next_tag += 1;
            let mut n = 0;
            let low = purpose != Purpose::Demand && !self.ra_active;
            let fetch = self.must_fetch(layer, e);
            if fetch {
                n = self.fetch(layer, e, base, tag, low);
            }
            let spans = match fetch {
                true => Vec::new(),
                false => coalesced_spans(&unit),
            };
            for (file, start, len, pos, end) in spans {
                let mut c = 0usize;
                while c < len {
                    let rl = self.request_bytes.min(len - c);
                    let c0 = start + c as u64;
                    let need = (end.saturating_sub(c0) as usize).min(rl);
                    let r = Req {
                        file,
                        offset: c0,
                        len: rl,
                        need,
                        // SAFETY: pos + c + rl ≤ the unit's buffer_bytes ≤ the buffer's size.
                        dst: unsafe { base.add(pos + c) },
                        tag,
                    };
                    // read-ahead is sure enough to queue behind demand reads at full depth
                    match purpose {
                        Purpose::Demand => self.engine.submit(r),
                        _ if self.ra_active => self.engine.submit(r),
                        _ => self.engine.submit_low(r),
                    }
                    n += 1;
                    c += rl;
                }
            }
            self.landing.insert(
                tag,
                Landing {
                    layer,
                    expert: e,
                    bytes,
                    left: n,
                    got: 0,
                    err: None,
                    purpose,
                    from_mirror: !fetch && self.remote.is_some(),
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
            misses = self.landing.len() + self.pending.len() + self.ready.len()
        )
        .entered();
        let c0 = self.counters.clone();
        let (w0, k0) = (self.counters.wait_ns, self.counters.compute_ns);
        let r = self.land_all(layer, f);
        let lc = &mut self.layers[layer];
        lc.wait_ns += self.counters.wait_ns - w0;
        lc.compute_ns += self.counters.compute_ns - k0;
        r?;
        let c1 = &self.counters;
        tracing::debug!(
            parent: &span,
            bytes = c1.bytes - c0.bytes,
            wait_ns = c1.wait_ns - c0.wait_ns,
            compute_ns = c1.compute_ns - c0.compute_ns,
            prefetch_hits = c1.prefetch_hits - c0.prefetch_hits,
            "layer experts done"
        );
        Ok(())
    }

    /// [`ExpertStore::for_each_landed`] after its bookkeeping: hits, landed prefetches, then
    /// misses as they land.
    fn land_all(&mut self, layer: usize, f: &mut dyn FnMut(usize, &UnitBytes)) -> io::Result<()> {
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
        while let Some((e, b)) = self.ready.pop_front() {
            self.compute_miss(layer, e, b, f);
            // the buffer it gave back starts a miss still waiting for one, else a guess or
            // read-ahead of the next layer, so the drive stays busy while landed ones compute
            self.issue(layer);
            self.issue_prefetch();
        }
        while self.demand_open() {
            let Some(l) = self.land_one()? else {
                continue;
            };
            let mismatch = match (&l.err, l.purpose) {
                (None, Purpose::Demand | Purpose::Prefetch) => {
                    self.check_sum(l.layer, l.expert, &l.bytes)
                }
                _ => None,
            };
            let bad = l.err.is_some() || mismatch.is_some();
            if bad && self.drop_mirror_copy(l.layer, l.expert, l.from_mirror) {
                // the tier's copy failed: never used; a demand read fetches it again
                if l.purpose == Purpose::Demand {
                    self.pending.push_front(l.expert);
                    self.free.push(l.bytes.into_buf());
                } else {
                    self.waste(l);
                }
                self.issue(layer);
                continue;
            }
            match l.purpose {
                Purpose::Demand => {
                    if let Some(e) = l.err {
                        let msg = format!("{e} (expert {} of layer {})", l.expert, l.layer);
                        self.free.push(l.bytes.into_buf());
                        return Err(self.fail(io::Error::new(e.kind(), msg)));
                    }
                    if let Some(msg) = mismatch {
                        self.free.push(l.bytes.into_buf());
                        return Err(self.fail(io::Error::new(io::ErrorKind::InvalidData, msg)));
                    }
                    self.compute_miss(layer, l.expert, l.bytes, f);
                }
                // a guess that failed or does not match its checksum is dropped; the demand
                // read that follows reports the error
                Purpose::Prefetch if !bad => {
                    self.staged.insert((l.layer, l.expert), (l.bytes, l.got));
                }
                Purpose::Prefetch | Purpose::Discard => self.waste(l),
            }
            self.issue(layer);
            self.issue_prefetch();
        }
        self.issue_prefetch();
        Ok(())
    }

    /// Waits for the next completed read and books it; returns its expert's landing when that
    /// was the expert's last outstanding read.
    ///
    /// Errors: a completion that matches no read (the store's state is reset).
    fn land_one(&mut self) -> io::Result<Option<Landing>> {
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
                if d.file == super::io_engine::REMOTE_FILE {
                    self.counters.fetched_bytes += n;
                    self.counters.fetches += 1;
                }
                l.got += n;
                self.layers[l.layer].bytes += n;
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
            return Ok(None);
        }
        Ok(self.landing.remove(&d.tag))
    }

    /// Frees the buffer of a guess dropped after its reads started, counting it as wasted.
    fn waste(&mut self, l: Landing) {
        self.counters.prefetch_wasted += 1;
        self.counters.prefetch_wasted_bytes += l.got;
        self.free.push(l.bytes.into_buf());
        self.trim_free();
    }

    /// Whether a demand read of the layer being computed is waiting or in flight.
    fn demand_open(&self) -> bool {
        !self.pending.is_empty() || self.landing.values().any(|l| l.purpose == Purpose::Demand)
    }

    /// Computes a miss of `layer` whose bytes `b` landed, then offers them to the cache.
    fn compute_miss(
        &mut self,
        layer: usize,
        e: usize,
        b: UnitBytes,
        f: &mut dyn FnMut(usize, &UnitBytes),
    ) {
        let t = Instant::now();
        let b = match self.transform.as_mut() {
            Some(tr) => tr(layer, e, b),
            None => b,
        };
        f(e, &b);
        self.counters.compute_ns += t.elapsed().as_nanos() as u64;
        let key = (layer as u32, e as u32);
        // a tentative expert is admitted as plain decoding would admit it: the verdict
        // takes it out again if only rejected rows used it (`end_drafts`)
        let out = self.cache.admit(key, b);
        self.refill(out);
    }

    /// The error message when expert `e` of `layer` in `b` does not match its checksum.
    fn check_sum(&self, layer: usize, e: usize, b: &UnitBytes) -> Option<String> {
        let want = self.checksums.as_ref()?.get(layer).and_then(|r| r.get(e))?;
        if want.matches(b.record()) {
            return None;
        }
        let mut files: Vec<String> = Vec::new();
        for r in &self.units[layer][e].ranges {
            let f = self.engine.files()[r.file].label();
            if !files.contains(&f) {
                files.push(f);
            }
        }
        Some(format!(
            "checksum mismatch in expert {e} of layer {layer} read from {}",
            files.join("; ")
        ))
    }

    /// Brings the free I/O buffers back to all those not held by reads in flight, landed
    /// prefetches or ready experts, after a miss went to the cache: from the buffers the cache
    /// gave back, else new ones.
    fn refill(&mut self, back: Vec<UnitBytes>) {
        let want = (self.slots + self.pf_cap())
            .saturating_sub(self.landing.len() + self.staged.len() + self.ready.len());
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
        self.guesses.clear();
        self.planned = None;
        self.hits_now.clear();
        self.end_drafts(0);
        let mut bufs: Vec<AlignedBuf> = self
            .landing
            .drain()
            .map(|(_, l)| l.bytes.into_buf())
            .collect();
        bufs.extend(self.staged.drain().map(|(_, (b, _))| b.into_buf()));
        bufs.extend(self.ready.drain(..).map(|(_, b)| b.into_buf()));
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
