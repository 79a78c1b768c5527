//! The read engine of the expert store: positional reads into caller-owned, 4 KiB-aligned
//! memory, many in flight at once, completed in arrival order. Two backends:
//!
//! - **io_uring** (`io-uring` crate, `IORING_OP_READ`): one ring owned by the calling thread,
//!   at most `depth` reads submitted at a time;
//! - **pread pool**: `depth` threads each doing blocking `pread(2)`, used where io_uring is
//!   unavailable (old kernels, seccomp filters) or when forced (`--io-engine pool`).
//!
//! Both read files opened with `O_DIRECT` where the filesystem allows it ([`DirectFile`]), so
//! expert bytes bypass the page cache. Per-file counters record bytes, reads and busy time
//! (time with at least one read of that file outstanding, as seen by the engine).
//!
//! Files are grouped by the device holding them (a *drive*). io_uring hands queued reads to the
//! kernel round-robin over drives, so a backlog on one drive does not hold back the others.
//!
//! Reads have two priorities. Demand reads ([`IoEngine::submit`]) go to the backend at once.
//! Low-priority reads ([`IoEngine::submit_low`], prefetch) wait in the engine and start only
//! while their drive has fewer than `prefetch_depth` reads in the backend (and the backend has
//! a free slot), so they use idle drives and a later demand read queues behind at most that
//! many of them per drive; a low read that has not started can be cancelled
//! ([`IoEngine::cancel_low`]) or raised to demand ([`IoEngine::promote`]).

use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::direct::DirectFile;

mod pool;
mod uring;
use pool::Pool;
use uring::Uring;

/// Which backend to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EngineChoice {
    /// io_uring when the kernel allows it, else the pread pool.
    #[default]
    Auto,
    /// io_uring or an error.
    Uring,
    /// The pread thread pool.
    Pool,
}

impl std::str::FromStr for EngineChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "uring" | "io_uring" => Ok(Self::Uring),
            "pool" | "pread" => Ok(Self::Pool),
            _ => Err(format!(
                "unknown I/O engine '{s}' (expected auto, uring or pool)"
            )),
        }
    }
}

/// The `file` of a [`Done`] that completes a fetch from object storage
/// ([`IoEngine::submit_remote`]).
pub const REMOTE_FILE: usize = usize::MAX - 1;

/// Default reads in flight. Measured on a drivelab drive (see BENCHMARKS.md).
pub const DEFAULT_DEPTH: usize = 32;
/// Default largest single read request in bytes. Measured (see BENCHMARKS.md).
pub const DEFAULT_REQUEST_BYTES: usize = 1 << 20;
/// Default bound on reads in flight on a drive under which a prefetch read of that drive may
/// start (see BENCHMARKS.md).
pub const DEFAULT_PREFETCH_DEPTH: usize = 2;
/// The largest `depth` (`--io-depth`) and `prefetch_depth` the engine takes: the pool starts
/// one thread per unit of depth, and io_uring rings hold at most 32768 entries (the kernel's
/// `IORING_MAX_ENTRIES`), so this leaves both well inside what a system allows.
pub const MAX_DEPTH: usize = 4096;

/// Options of the read engine.
#[derive(Clone, Debug)]
pub struct IoOptions {
    pub engine: EngineChoice,
    /// Reads in flight at most (io_uring submissions, or pool threads).
    pub depth: usize,
    /// Largest single read in bytes (a multiple of 4 KiB); larger spans are split.
    pub request_bytes: usize,
    /// A low-priority (prefetch) read starts only while fewer reads than this are in flight on
    /// its drive.
    pub prefetch_depth: usize,
}

impl Default for IoOptions {
    fn default() -> Self {
        Self {
            engine: EngineChoice::Auto,
            depth: DEFAULT_DEPTH,
            request_bytes: DEFAULT_REQUEST_BYTES,
            prefetch_depth: DEFAULT_PREFETCH_DEPTH,
        }
    }
}

/// One read: `len` bytes at `offset` of file `file` into `dst`; at least `need` bytes must
/// arrive (less than `len` where the aligned span passes the end of the file).
#[derive(Clone, Copy, Debug)]
pub struct Req {
    pub file: usize,
    pub offset: u64,
    pub len: usize,
    pub need: usize,
    pub dst: *mut u8,
    /// The caller's tag, returned with the completion.
    pub tag: usize,
}

// SAFETY: `dst` points into a buffer the caller keeps alive, untouched, until the request's
// completion has been returned (the engine drains every request before it is dropped).
unsafe impl Send for Req {}

/// A finished read: the request's tag and file, the bytes read, or the error (naming file and
/// range).
#[derive(Debug)]
pub struct Done {
    pub tag: usize,
    pub file: usize,
    pub result: io::Result<u64>,
}

/// Counters of one file.
#[derive(Clone, Debug, Default)]
pub struct FileCounters {
    /// Bytes read from the device.
    pub bytes: u64,
    /// Read requests completed.
    pub reads: u64,
    /// Nanoseconds with at least one read of this file outstanding.
    pub busy_ns: u64,
    inflight: usize,
    since: Option<Instant>,
}

/// Per-file counters shared with the pool threads.
type Counters = Arc<Mutex<Vec<FileCounters>>>;

fn begin(c: &Counters, file: usize) {
    let mut v = c.lock().unwrap();
    let f = &mut v[file];
    if f.inflight == 0 {
        f.since = Some(Instant::now());
    }
    f.inflight += 1;
}

fn end(c: &Counters, file: usize, bytes: u64) {
    let mut v = c.lock().unwrap();
    let f = &mut v[file];
    f.inflight -= 1;
    f.bytes += bytes;
    f.reads += 1;
    if f.inflight == 0 {
        if let Some(s) = f.since.take() {
            f.busy_ns += s.elapsed().as_nanos() as u64;
        }
    }
}

/// A failed read of `r`, naming the file by its label ([`DirectFile::label`]: a pack's drive
/// and file) and the range.
fn read_error(files: &[DirectFile], r: &Req, e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!(
        "{}: read of {} bytes at offset {} failed: {e}",
        files[r.file].label(),
        r.len,
        r.offset
    ))
}

/// A read of `r` that ended after `got` bytes, naming the file by its label and its length now
/// (it may have shrunk since it was opened).
fn short_read(files: &[DirectFile], r: &Req, got: usize) -> io::Error {
    let f = &files[r.file];
    let len = f.file().metadata().map_or(f.len(), |m| m.len());
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!(
            "{}: short read at offset {} ({got} of {} bytes; the file is {len} bytes)",
            f.label(),
            r.offset,
            r.need,
        ),
    )
}

enum Backend {
    Uring(Box<Uring>),
    Pool(Pool),
}

/// The read engine over a set of open files.
pub struct IoEngine {
    backend: Backend,
    files: Arc<Vec<DirectFile>>,
    counters: Counters,
    /// Reads submitted and not yet returned by `wait`, low-priority ones included.
    outstanding: usize,
    depth: usize,
    /// Low-priority reads not yet handed to the backend, oldest first.
    low: VecDeque<Req>,
    prefetch_depth: usize,
    /// The drive of each file (files on one device share a drive).
    drive_of: Arc<Vec<usize>>,
    /// Reads handed to the backend and not yet returned, per drive.
    busy: Vec<usize>,
    /// Fetches from object storage (a pack on S3), completing through the pool's channel.
    fetcher: Option<crate::store::remote::Fetcher>,
}

/// Numbers the devices holding `files` in order of first appearance: the drive of each file.
fn drives_of(files: &[DirectFile]) -> Vec<usize> {
    use std::os::unix::fs::MetadataExt;
    let mut devs: Vec<u64> = Vec::new();
    files
        .iter()
        .map(|f| {
            let dev = f.file().metadata().map_or(u64::MAX, |m| m.dev());
            devs.iter().position(|&d| d == dev).unwrap_or_else(|| {
                devs.push(dev);
                devs.len() - 1
            })
        })
        .collect()
}

impl IoEngine {
    /// Starts the engine over `files` with `opts`; `Auto` falls back to the pool when io_uring
    /// cannot be set up or its first read fails.
    ///
    /// Errors (each naming `--io-depth` or `--io-engine uring`): a depth over [`MAX_DEPTH`];
    /// `EngineChoice::Uring` and io_uring cannot be set up at that depth; a pread thread that
    /// cannot be started.
    pub fn new(files: Vec<DirectFile>, opts: &IoOptions) -> io::Result<Self> {
        let depth = opts.depth.max(1);
        if depth > MAX_DEPTH {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("--io-depth {depth} is more than the largest depth, {MAX_DEPTH}"),
            ));
        }
        let drive_of = Arc::new(drives_of(&files));
        let n_drives = drive_of.iter().max().map_or(1, |m| m + 1);
        let files = Arc::new(files);
        let counters: Counters = Arc::new(Mutex::new(vec![FileCounters::default(); files.len()]));
        let pool = |files: &Arc<Vec<DirectFile>>, c: &Counters| {
            Pool::new(files.clone(), c.clone(), depth).map(Backend::Pool)
        };
        let backend = match opts.engine {
            EngineChoice::Pool => pool(&files, &counters)?,
            EngineChoice::Uring => {
                Backend::Uring(Box::new(Uring::new(depth, drive_of.clone()).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("--io-engine uring: cannot set up io_uring with --io-depth {depth}: {e}"),
                    )
                })?))
            }
            EngineChoice::Auto => match Uring::new(depth, drive_of.clone()) {
                Ok(u) => Backend::Uring(Box::new(u)),
                Err(_) => pool(&files, &counters)?,
            },
        };
        let mut e = Self {
            backend,
            files,
            counters,
            outstanding: 0,
            depth,
            low: VecDeque::new(),
            prefetch_depth: opts.prefetch_depth.clamp(1, depth),
            drive_of,
            busy: vec![0; n_drives],
            fetcher: None,
        };
        if opts.engine == EngineChoice::Auto && matches!(e.backend, Backend::Uring(_)) && !e.probe()
        {
            e.backend = pool(&e.files, &e.counters)?;
        }
        // the probe's read is not part of the run
        for c in e.counters.lock().unwrap().iter_mut() {
            *c = FileCounters::default();
        }
        Ok(e)
    }

    /// Starts fetching from object storage: `start` is given the sender of the completions
    /// and returns the fetcher ([`IoEngine::submit_remote`]). The engine moves to the pread
    /// pool first (its completions and the fetcher's share one channel).
    ///
    /// Errors: the pool's threads cannot be started.
    pub fn attach_fetcher(
        &mut self,
        start: impl FnOnce(std::sync::mpsc::Sender<Done>) -> crate::store::remote::Fetcher,
    ) -> io::Result<()> {
        self.drain();
        if !matches!(self.backend, Backend::Pool(_)) {
            self.backend = Backend::Pool(Pool::new(
                self.files.clone(),
                self.counters.clone(),
                self.depth,
            )?);
        }
        let Backend::Pool(p) = &self.backend else {
            unreachable!("the pool was just started")
        };
        self.fetcher = Some(start(p.done_tx.clone()));
        Ok(())
    }

    /// The fetcher, when one is attached.
    pub fn fetcher(&self) -> Option<&crate::store::remote::Fetcher> {
        self.fetcher.as_ref()
    }

    /// Queues a fetch from object storage; it completes as a [`Done`] of file
    /// [`REMOTE_FILE`]. Panics without a fetcher.
    pub fn submit_remote(&mut self, j: crate::store::remote::FetchJob) {
        self.outstanding += 1;
        self.fetcher.as_ref().expect("a fetcher").submit(j);
    }

    /// Reads the first 4 KiB of the first non-empty file; false when that fails.
    fn probe(&mut self) -> bool {
        let Some(i) = self.files.iter().position(|f| !f.is_empty()) else {
            return true;
        };
        let mut b = super::aligned::AlignedBuf::new(4096);
        let need = (self.files[i].len() as usize).min(4096);
        self.submit(Req {
            file: i,
            offset: 0,
            len: 4096,
            need,
            dst: b.as_mut_slice().as_mut_ptr(),
            tag: 0,
        });
        self.wait().result.is_ok()
    }

    /// What runs, e.g. `io_uring (depth 32), O_DIRECT`.
    pub fn describe(&self) -> String {
        let direct = self.files.iter().filter(|f| f.is_direct()).count();
        let mode = if direct == self.files.len() {
            "O_DIRECT".to_string()
        } else if direct == 0 {
            "buffered (O_DIRECT refused)".to_string()
        } else {
            format!("O_DIRECT on {direct} of {} files", self.files.len())
        };
        let remote = match &self.fetcher {
            Some(f) => format!(
                "; records fetched from {} ({} GETs in flight)",
                f.client().url,
                f.client().opts.concurrency
            ),
            None => String::new(),
        };
        format!(
            "{} (depth {}), {mode}{remote}",
            self.backend_name(),
            self.depth
        )
    }

    /// `"io_uring"` or `"pread-pool"`.
    pub fn backend_name(&self) -> &'static str {
        match self.backend {
            Backend::Uring(_) => "io_uring",
            Backend::Pool(_) => "pread-pool",
        }
    }

    /// Whether every file bypasses the page cache.
    pub fn all_direct(&self) -> bool {
        self.files.iter().all(|f| f.is_direct())
    }

    /// The open files.
    pub fn files(&self) -> &[DirectFile] {
        &self.files
    }

    /// Reads queued or in flight.
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// Queues `r`; it starts as soon as fewer than `depth` reads are in flight.
    pub fn submit(&mut self, r: Req) {
        self.outstanding += 1;
        self.hand_over(r);
    }

    /// Hands `r` to the backend (already counted in `outstanding`).
    fn hand_over(&mut self, r: Req) {
        self.busy[self.drive_of[r.file]] += 1;
        match &mut self.backend {
            Backend::Uring(u) => {
                u.queued.push_back((r, 0));
                if let Err(e) = u.fill(&self.files, &self.counters) {
                    // the request stays queued; the next wait reports through a completion
                    tracing::warn!("io_uring submit failed: {e}");
                }
            }
            Backend::Pool(p) => {
                let _ = p.jobs.as_ref().expect("pool running").send(r);
            }
        }
    }

    /// Queues `r` at low priority: it starts only while fewer than `prefetch_depth` reads are
    /// in the backend (see the module doc).
    pub fn submit_low(&mut self, r: Req) {
        self.outstanding += 1;
        self.low.push_back(r);
        self.pump();
    }

    /// Moves low-priority reads, oldest first, to the backend while it has a free slot and
    /// their drive has fewer than `prefetch_depth` reads in it.
    fn pump(&mut self) {
        let mut i = 0;
        while i < self.low.len() && self.outstanding - self.low.len() < self.depth {
            if self.busy[self.drive_of[self.low[i].file]] < self.prefetch_depth {
                let r = self.low.remove(i).expect("index in range");
                self.hand_over(r);
            } else {
                i += 1;
            }
        }
    }

    /// Drops the low-priority reads tagged `tag` that have not started; returns how many.
    /// Their completions will never be returned.
    pub fn cancel_low(&mut self, tag: usize) -> usize {
        let before = self.low.len();
        self.low.retain(|r| r.tag != tag);
        let n = before - self.low.len() + self.fetcher.as_ref().map_or(0, |f| f.cancel_low(tag));
        self.outstanding -= n;
        n
    }

    /// Raises the low-priority reads tagged `tag` that have not started to demand reads.
    pub fn promote(&mut self, tag: usize) {
        let (mine, rest): (VecDeque<Req>, VecDeque<Req>) =
            self.low.drain(..).partition(|r| r.tag == tag);
        self.low = rest;
        for r in mine {
            self.hand_over(r);
        }
        if let Some(f) = &self.fetcher {
            f.promote(tag);
        }
    }

    /// Waits for the next completed read (any order). Panics when nothing is outstanding.
    pub fn wait(&mut self) -> Done {
        assert!(self.outstanding > 0, "wait() with no read outstanding");
        self.pump();
        let d = match &mut self.backend {
            Backend::Uring(u) => {
                // refill the kernel's queue before every wait, so it never runs dry while
                // reads are queued
                if let Err(e) = u.fill(&self.files, &self.counters) {
                    if u.in_kernel() == 0 {
                        let (r, _) = u.queued.pop_front().expect("queued request");
                        self.outstanding -= 1;
                        self.busy[self.drive_of[r.file]] -= 1;
                        return Done {
                            tag: r.tag,
                            file: r.file,
                            result: Err(e),
                        };
                    }
                }
                u.wait(&self.files, &self.counters)
            }
            Backend::Pool(p) => p.done.recv().unwrap_or_else(|_| Done {
                tag: usize::MAX,
                file: usize::MAX,
                result: Err(io::Error::other("the pread pool stopped")),
            }),
        };
        self.outstanding -= 1;
        if let Some(&dr) = self.drive_of.get(d.file) {
            self.busy[dr] -= 1;
        }
        self.pump();
        d
    }

    /// Waits for every outstanding read (after an error), discarding results.
    pub fn drain(&mut self) {
        while self.outstanding > 0 {
            let _ = self.wait();
        }
    }

    /// A copy of the per-file counters (busy time includes reads still running).
    pub fn counters(&self) -> Vec<FileCounters> {
        let v = self.counters.lock().unwrap();
        v.iter()
            .map(|c| {
                let mut c = c.clone();
                if let Some(s) = c.since {
                    c.busy_ns += s.elapsed().as_nanos() as u64;
                }
                c
            })
            .collect()
    }
}

impl Drop for IoEngine {
    fn drop(&mut self) {
        // the kernel or a pool thread may still write into the caller's buffers
        self.drain();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::aligned::AlignedBuf;
    use std::io::Write;

    fn engines(p: &std::path::Path) -> Vec<IoEngine> {
        [EngineChoice::Auto, EngineChoice::Pool]
            .iter()
            .map(|&engine| {
                IoEngine::new(
                    vec![DirectFile::open(p, true).unwrap()],
                    &IoOptions {
                        engine,
                        depth: 3,
                        request_bytes: 4096,
                        prefetch_depth: 2,
                    },
                )
                .unwrap()
            })
            .collect()
    }

    #[test]
    fn many_reads_complete_with_the_right_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.bin");
        let data: Vec<u8> = (0..40_000u32).map(|i| (i * 13 % 251) as u8).collect();
        std::fs::File::create(&p).unwrap().write_all(&data).unwrap();
        for mut e in engines(&p) {
            let mut b = AlignedBuf::new(40960);
            let base = b.as_mut_slice().as_mut_ptr();
            for i in 0..10 {
                let len = 4096;
                let need = (data.len() - i * 4096).min(len);
                e.submit(Req {
                    file: 0,
                    offset: (i * 4096) as u64,
                    len,
                    need,
                    dst: unsafe { base.add(i * 4096) },
                    tag: i,
                });
            }
            let mut tags: Vec<usize> = (0..10).map(|_| e.wait().tag).collect();
            tags.sort();
            assert_eq!(tags, (0..10).collect::<Vec<_>>());
            assert_eq!(&b.as_slice()[..40_000], &data[..]);
            let c = e.counters();
            assert_eq!(c[0].reads, 10, "{}", e.describe());
            assert_eq!(c[0].bytes, 40_000);
        }
    }

    #[test]
    fn a_read_past_the_end_is_a_short_read_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("g.bin");
        std::fs::File::create(&p)
            .unwrap()
            .write_all(&[7u8; 5000])
            .unwrap();
        for mut e in engines(&p) {
            let mut b = AlignedBuf::new(8192);
            e.submit(Req {
                file: 0,
                offset: 8192,
                len: 4096,
                need: 4096,
                dst: b.as_mut_slice().as_mut_ptr(),
                tag: 5,
            });
            let d = e.wait();
            assert_eq!(d.tag, 5);
            let m = d.result.unwrap_err().to_string();
            assert!(
                m.contains(
                    "g.bin: short read at offset 8192 (0 of 4096 bytes; the file is 5000 bytes)"
                ),
                "{m}"
            );
        }
    }

    #[test]
    fn low_priority_reads_wait_for_idle_slots_and_can_be_cancelled_or_promoted() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("h.bin");
        let data: Vec<u8> = (0..8 * 4096u32).map(|i| (i % 199 + 1) as u8).collect();
        std::fs::File::create(&p).unwrap().write_all(&data).unwrap();
        for mut e in engines(&p) {
            let mut b = AlignedBuf::new(data.len());
            let base = b.as_mut_slice().as_mut_ptr();
            let req = |i: usize| Req {
                file: 0,
                offset: (i * 4096) as u64,
                len: 4096,
                need: 4096,
                dst: unsafe { base.add(i * 4096) },
                tag: i,
            };
            e.submit(req(0));
            e.submit(req(1));
            // two demand reads fill the prefetch depth (2) of the file's drive: the low ones
            // wait in the engine
            e.submit_low(req(2));
            e.submit_low(req(3));
            e.submit_low(req(4));
            assert_eq!(e.outstanding(), 5);
            assert_eq!(
                e.cancel_low(3),
                1,
                "{}: read 3 had not started",
                e.describe()
            );
            assert_eq!(e.cancel_low(3), 0);
            e.promote(4);
            assert_eq!(e.outstanding(), 4);
            let mut tags: Vec<usize> = (0..4).map(|_| e.wait().tag).collect();
            tags.sort();
            assert_eq!(tags, vec![0, 1, 2, 4]);
            assert_eq!(e.outstanding(), 0);
            let got = b.as_slice();
            for i in [0, 1, 2, 4] {
                assert_eq!(
                    &got[i * 4096..(i + 1) * 4096],
                    &data[i * 4096..(i + 1) * 4096]
                );
            }
            assert!(
                got[3 * 4096..4 * 4096].iter().all(|&x| x == 0),
                "read 3 never ran"
            );
            assert_eq!(e.counters()[0].reads, 4);
        }
    }

    #[test]
    fn queued_reads_go_to_the_kernel_round_robin_over_drives() {
        // files 0 and 2 on drive 0, file 1 on drive 1
        let mut q = super::uring::DriveQueues::new(Arc::new(vec![0, 1, 0]));
        let r = |file: usize, tag: usize| Req {
            file,
            offset: 0,
            len: 4096,
            need: 4096,
            dst: std::ptr::null_mut(),
            tag,
        };
        for (file, tag) in [(0, 0), (2, 1), (0, 2), (1, 3), (1, 4)] {
            q.push_back((r(file, tag), 0));
        }
        q.push_front((r(1, 5), 4096));
        let order: Vec<usize> = std::iter::from_fn(|| q.pop_front().map(|(r, _)| r.tag)).collect();
        assert_eq!(order, vec![0, 5, 1, 3, 2, 4]);
    }

    #[test]
    fn a_depth_beyond_the_limit_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.bin");
        std::fs::write(&p, [0u8; 4096]).unwrap();
        for (engine, depth) in [
            (EngineChoice::Pool, 40_000),
            (EngineChoice::Uring, 100_000),
            (EngineChoice::Auto, MAX_DEPTH + 1),
        ] {
            let opts = IoOptions {
                engine,
                depth,
                ..IoOptions::default()
            };
            let e = IoEngine::new(vec![DirectFile::open(&p, true).unwrap()], &opts)
                .err()
                .unwrap();
            assert_eq!(
                e.to_string(),
                format!("--io-depth {depth} is more than the largest depth, 4096")
            );
        }
    }
}
