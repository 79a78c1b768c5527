//! The local tier of a pack on object storage: a sparse mirror of the pack's expert object
//! (`experts.bin`, the same record layout and checksums as a pack's drive file) holding the
//! records fetched so far, and an index of which records are there.
//!
//! **Index** (`tier.index`, little-endian): a 64-byte header (magic `DFTIER01`, the identity
//! of the remote pack — the SHA-256 of its manifest — the number of records, a use clock and
//! the bytes held) and one `u64` per record: 0 when absent, else the clock at its last use.
//! Every change happens under an exclusive `flock` of the index (and a mutex within the
//! process), so processes sharing the folder agree; the index and mirror survive restarts, and
//! an index of another pack or a damaged one is reset with the mirror emptied.
//!
//! **Policy**: LRU under a byte budget. A record enters after its bytes passed their checksum
//! and were written to the mirror; when the bytes held pass the budget, the least recently
//! used records are evicted by punching holes in the mirror (`fallocate`), so the disk space
//! is freed. A record is never trusted because the index lists it: the expert store checks the
//! bytes it reads from the mirror against the manifest's checksum and calls
//! [`LocalTier::forget`] and fetches the record again when they fail (a crash mid-write, or an
//! eviction by another process between the lookup and the read).
//!
//! **Faults**: a write that fails (a full disk, a quota, a file-size limit, an I/O error) or
//! a file system that cannot punch holes turns the tier off for the rest of the run, with one
//! warning on standard error; records are then fetched from object storage every time.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

const MAGIC: &[u8; 8] = b"DFTIER01";
const HEADER: u64 = 64;

/// Writes `bytes` at `offset` of `f` (replaceable in tests to simulate a full disk).
pub type WriteAt = fn(&File, &[u8], u64) -> io::Result<()>;

fn write_at(f: &File, b: &[u8], off: u64) -> io::Result<()> {
    f.write_all_at(b, off)
}

/// What the tier did since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierCounters {
    /// Lookups that found the record.
    pub hits: u64,
    /// Lookups that did not.
    pub misses: u64,
    /// Records written to the mirror.
    pub inserts: u64,
    /// Records evicted (by this process).
    pub evictions: u64,
    /// Records listed but whose bytes failed their checksum, dropped.
    pub forgotten: u64,
}

/// The local tier (see the module docs).
pub struct LocalTier {
    dir: PathBuf,
    mirror: File,
    index: Mutex<File>,
    /// Per record: offset in the mirror and bytes it takes (4 KiB-aligned).
    records: Vec<(u64, u64)>,
    budget: u64,
    off: AtomicBool,
    write: WriteAt,
    hits: AtomicU64,
    misses: AtomicU64,
    inserts: AtomicU64,
    evictions: AtomicU64,
    forgotten: AtomicU64,
}

/// The header's fields.
#[derive(Clone, Copy, Debug)]
struct Head {
    identity: [u8; 32],
    n: u64,
    clock: u64,
    used: u64,
}

impl Head {
    fn bytes(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        b[..8].copy_from_slice(MAGIC);
        b[8..40].copy_from_slice(&self.identity);
        b[40..48].copy_from_slice(&self.n.to_le_bytes());
        b[48..56].copy_from_slice(&self.clock.to_le_bytes());
        b[56..64].copy_from_slice(&self.used.to_le_bytes());
        b
    }

    fn parse(b: &[u8; 64]) -> Option<Self> {
        if &b[..8] != MAGIC {
            return None;
        }
        let u = |r: std::ops::Range<usize>| u64::from_le_bytes(b[r].try_into().unwrap());
        Some(Self {
            identity: b[8..40].try_into().unwrap(),
            n: u(40..48),
            clock: u(48..56),
            used: u(56..64),
        })
    }
}

/// Frees `len` bytes at `offset` of `f` keeping its size.
fn punch(f: &File, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: a plain syscall on an open descriptor.
    let r = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    match r {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Holds the exclusive `flock` of `f` until dropped.
struct Flock<'a>(&'a File);

impl<'a> Flock<'a> {
    fn new(f: &'a File) -> io::Result<Self> {
        loop {
            // SAFETY: a plain syscall on an open descriptor.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(Self(f));
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

impl Drop for Flock<'_> {
    fn drop(&mut self) {
        // SAFETY: a plain syscall on an open descriptor.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// Names `p` in an I/O error.
fn named(p: &Path) -> impl Fn(io::Error) -> io::Error + '_ {
    move |e| io::Error::new(e.kind(), format!("{}: {e}", p.display()))
}

fn read_u64(f: &File, at: u64) -> io::Result<u64> {
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, at)?;
    Ok(u64::from_le_bytes(b))
}

fn slot(rec: usize) -> u64 {
    HEADER + 8 * rec as u64
}

impl LocalTier {
    /// Opens (or makes) the tier in `dir`: the mirror `dir/experts.bin`, sized to hold every
    /// record (sparse), and the index `dir/tier.index`, for the remote pack of `identity`
    /// whose records lie at `records` (offset, 4 KiB-aligned bytes) of its expert object,
    /// holding at most `budget` bytes. An index of another pack, another record count or a
    /// damaged one is reset and the mirror emptied; records past a smaller budget are evicted.
    ///
    /// Errors: the folder or its files cannot be made, opened or locked (the message names
    /// the file).
    pub fn open(
        dir: &Path,
        identity: [u8; 32],
        records: Vec<(u64, u64)>,
        budget: u64,
    ) -> io::Result<Self> {
        std::fs::create_dir_all(dir).map_err(named(dir))?;
        let open = |p: &Path| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(p)
                .map_err(named(p))
        };
        let ip = dir.join("tier.index");
        let mp = dir.join("experts.bin");
        let index = open(&ip)?;
        let mirror = open(&mp)?;
        let total = records.iter().map(|&(o, l)| o + l).max().unwrap_or(0);
        let t = Self {
            dir: dir.to_path_buf(),
            mirror,
            index: Mutex::new(index),
            records,
            budget,
            off: AtomicBool::new(false),
            write: write_at,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            inserts: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            forgotten: AtomicU64::new(0),
        };
        {
            let idx = t.index.lock().unwrap();
            let _l = Flock::new(&idx).map_err(named(&ip))?;
            let mut hb = [0u8; 64];
            let head = idx
                .read_exact_at(&mut hb, 0)
                .ok()
                .and_then(|()| Head::parse(&hb))
                .filter(|h| h.identity == identity && h.n == t.records.len() as u64);
            let n = t.records.len() as u64;
            let mut stamps = vec![0u64; t.records.len()];
            let ok = head.is_some()
                && idx.metadata().map_err(named(&ip))?.len() == HEADER + 8 * n
                && t.read_stamps(&idx, &mut stamps).is_ok();
            let mut head = match (head, ok) {
                (Some(h), true) => h,
                _ => {
                    stamps.iter_mut().for_each(|s| *s = 0);
                    t.mirror.set_len(0).map_err(named(&mp))?;
                    idx.set_len(HEADER + 8 * n).map_err(named(&ip))?;
                    Head {
                        identity,
                        n,
                        clock: 0,
                        used: 0,
                    }
                }
            };
            if t.mirror.metadata().map_err(named(&mp))?.len() != total {
                t.mirror.set_len(total).map_err(named(&mp))?;
            }
            head.used = t.held(&stamps);
            t.evict(&idx, &mut stamps, &mut head, None)?;
            t.write_stamps(&idx, &stamps)?;
            idx.write_all_at(&head.bytes(), 0).map_err(named(&ip))?;
        }
        Ok(t)
    }

    /// Replaces the function writing record bytes to the mirror (tests simulate a full disk).
    pub fn set_write(&mut self, w: WriteAt) {
        self.write = w;
    }

    /// The tier's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The byte budget.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Whether the tier was turned off after a fault.
    pub fn is_off(&self) -> bool {
        self.off.load(Ordering::Relaxed)
    }

    /// What the tier did so far.
    pub fn counters(&self) -> TierCounters {
        TierCounters {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            inserts: self.inserts.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            forgotten: self.forgotten.load(Ordering::Relaxed),
        }
    }

    /// Bytes the index lists as held now (all processes'); 0 once the tier is off.
    pub fn used(&self) -> u64 {
        if self.is_off() {
            return 0;
        }
        let idx = self.index.lock().unwrap();
        let _l = Flock::new(&idx).ok();
        let mut hb = [0u8; 64];
        match idx
            .read_exact_at(&mut hb, 0)
            .ok()
            .and_then(|()| Head::parse(&hb))
        {
            Some(h) => h.used,
            None => 0,
        }
    }

    fn read_stamps(&self, idx: &File, out: &mut [u64]) -> io::Result<()> {
        let mut b = vec![0u8; out.len() * 8];
        idx.read_exact_at(&mut b, HEADER)?;
        for (o, c) in out.iter_mut().zip(b.chunks_exact(8)) {
            *o = u64::from_le_bytes(c.try_into().unwrap());
        }
        Ok(())
    }

    fn write_stamps(&self, idx: &File, s: &[u64]) -> io::Result<()> {
        let b: Vec<u8> = s.iter().flat_map(|x| x.to_le_bytes()).collect();
        idx.write_all_at(&b, HEADER).map_err(|e| self.named(e))
    }

    fn named(&self, e: io::Error) -> io::Error {
        io::Error::new(
            e.kind(),
            format!("{}: {e}", self.dir.join("tier.index").display()),
        )
    }

    /// Bytes of the records `stamps` lists as present.
    fn held(&self, stamps: &[u64]) -> u64 {
        stamps
            .iter()
            .zip(&self.records)
            .filter(|(s, _)| **s != 0)
            .map(|(_, r)| r.1)
            .sum()
    }

    /// Evicts least recently used records (never `keep`) until the bytes held fit the budget.
    fn evict(
        &self,
        idx: &File,
        stamps: &mut [u64],
        head: &mut Head,
        keep: Option<usize>,
    ) -> io::Result<()> {
        let _ = idx;
        while head.used > self.budget {
            let victim = stamps
                .iter()
                .enumerate()
                .filter(|&(i, &s)| s != 0 && Some(i) != keep)
                .min_by_key(|&(_, &s)| s)
                .map(|(i, _)| i);
            let Some(v) = victim else { break };
            let (o, l) = self.records[v];
            if let Err(e) = punch(&self.mirror, o, l) {
                self.turn_off(&format!("cannot free space in its mirror ({e})"));
                return Ok(());
            }
            stamps[v] = 0;
            head.used -= l;
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Turns the tier off with one warning naming `why`.
    fn turn_off(&self, why: &str) {
        if !self.off.swap(true, Ordering::Relaxed) {
            eprintln!(
                "warning: local cache {}: {why}; continuing without the local cache (records are fetched from object storage)",
                self.dir.display()
            );
        }
    }

    /// Whether record `rec` is in the mirror by the index (then its use is recorded for LRU).
    /// Always false once the tier is off or when the index cannot be read.
    pub fn lookup(&self, rec: usize) -> bool {
        if self.is_off() || rec >= self.records.len() {
            return false;
        }
        let idx = self.index.lock().unwrap();
        let found = (|| -> io::Result<bool> {
            let _l = Flock::new(&idx)?;
            if read_u64(&idx, slot(rec))? == 0 {
                return Ok(false);
            }
            let clock = read_u64(&idx, 48)? + 1;
            idx.write_all_at(&clock.to_le_bytes(), 48)?;
            idx.write_all_at(&clock.to_le_bytes(), slot(rec))?;
            Ok(true)
        })()
        .unwrap_or(false);
        match found {
            true => self.hits.fetch_add(1, Ordering::Relaxed),
            false => self.misses.fetch_add(1, Ordering::Relaxed),
        };
        found
    }

    /// Writes record `rec`'s `bytes` (already checked against its checksum) to the mirror and
    /// lists it, evicting least recently used records past the budget. A record larger than
    /// the budget is not kept. A failed write turns the tier off (one warning).
    pub fn insert(&self, rec: usize, bytes: &[u8]) {
        let Some(&(off, len)) = self.records.get(rec) else {
            return;
        };
        if self.is_off() || len > self.budget || bytes.len() as u64 > len {
            return;
        }
        if let Err(e) = (self.write)(&self.mirror, bytes, off) {
            let _ = punch(&self.mirror, off, len);
            self.turn_off(&e.to_string());
            return;
        }
        let idx = self.index.lock().unwrap();
        let r = (|| -> io::Result<()> {
            let _l = Flock::new(&idx)?;
            let mut hb = [0u8; 64];
            idx.read_exact_at(&mut hb, 0)?;
            let mut head = Head::parse(&hb)
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "damaged header"))?;
            head.clock += 1;
            let present = read_u64(&idx, slot(rec))? != 0;
            if present || head.used + len <= self.budget {
                if !present {
                    head.used += len;
                    self.inserts.fetch_add(1, Ordering::Relaxed);
                }
                idx.write_all_at(&head.clock.to_le_bytes(), slot(rec))?;
                return idx.write_all_at(&head.bytes(), 0);
            }
            let mut stamps = vec![0u64; self.records.len()];
            self.read_stamps(&idx, &mut stamps)?;
            stamps[rec] = head.clock;
            head.used = self.held(&stamps);
            self.inserts.fetch_add(1, Ordering::Relaxed);
            self.evict(&idx, &mut stamps, &mut head, Some(rec))?;
            self.write_stamps(&idx, &stamps)?;
            idx.write_all_at(&head.bytes(), 0)
        })();
        if let Err(e) = r {
            drop(idx);
            self.turn_off(&format!("its index: {e}"));
        }
    }

    /// Drops record `rec` from the index and frees its bytes (they failed their checksum).
    pub fn forget(&self, rec: usize) {
        let Some(&(off, len)) = self.records.get(rec) else {
            return;
        };
        if self.is_off() {
            return;
        }
        self.forgotten.fetch_add(1, Ordering::Relaxed);
        let idx = self.index.lock().unwrap();
        let _ = (|| -> io::Result<()> {
            let _l = Flock::new(&idx)?;
            if read_u64(&idx, slot(rec))? == 0 {
                return Ok(());
            }
            let mut hb = [0u8; 64];
            idx.read_exact_at(&mut hb, 0)?;
            let mut head = Head::parse(&hb)
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "damaged header"))?;
            head.used = head.used.saturating_sub(len);
            idx.write_all_at(&0u64.to_le_bytes(), slot(rec))?;
            idx.write_all_at(&head.bytes(), 0)?;
            punch(&self.mirror, off, len)
        })();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: u64 = 4096;

    fn records(n: u64) -> Vec<(u64, u64)> {
        (0..n).map(|i| (i * 2 * K, 2 * K)).collect()
    }

    fn allocated(p: &Path) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(p).unwrap().blocks() * 512
    }

    #[test]
    fn records_are_kept_evicted_lru_and_survive_a_reopen() {
        let d = tempfile::tempdir().unwrap();
        let id = [7u8; 32];
        let t = LocalTier::open(d.path(), id, records(4), 4 * K).unwrap();
        assert!(!t.lookup(0));
        t.insert(0, &[1u8; 8000]);
        t.insert(1, &[2u8; 8192]);
        assert_eq!(t.used(), 4 * K);
        assert!(t.lookup(0)); // 0 is now more recent than 1
        t.insert(2, &[3u8; 100]); // evicts 1
        assert_eq!((t.lookup(0), t.lookup(1), t.lookup(2)), (true, false, true));
        assert_eq!(t.used(), 4 * K);
        let c = t.counters();
        assert_eq!((c.inserts, c.evictions), (3, 1));
        let m = d.path().join("experts.bin");
        assert_eq!(
            std::fs::metadata(&m).unwrap().len(),
            8 * K,
            "sparse, every record's room"
        );
        // record 0's 8000 bytes take 2 blocks, record 2's 100 bytes 1: record 1's 2 were freed
        assert_eq!(allocated(&m), 3 * K, "record 1's hole was punched");
        let mut b = vec![0u8; 8192];
        t.mirror.read_exact_at(&mut b, 0).unwrap();
        assert!(b[..8000].iter().all(|&x| x == 1));
        drop(t);
        // a restart keeps them; a smaller budget evicts the least recently used
        let t = LocalTier::open(d.path(), id, records(4), 2 * K).unwrap();
        assert_eq!(t.used(), 2 * K);
        assert_eq!((t.lookup(0), t.lookup(2)), (false, true));
        t.forget(2);
        assert_eq!((t.lookup(2), t.used()), (false, 0));
        assert_eq!(allocated(&m), 0);
        drop(t);
        // another pack's identity empties it
        let t = LocalTier::open(d.path(), id, records(4), 4 * K).unwrap();
        t.insert(3, &[9u8; 10]);
        drop(t);
        let t = LocalTier::open(d.path(), [8u8; 32], records(4), 4 * K).unwrap();
        assert_eq!((t.lookup(3), t.used(), allocated(&m)), (false, 0, 0));
    }

    #[test]
    fn a_failed_write_turns_the_tier_off_and_frees_the_record() {
        let d = tempfile::tempdir().unwrap();
        let mut t = LocalTier::open(d.path(), [1u8; 32], records(2), 4 * K).unwrap();
        t.insert(0, &[1u8; 10]);
        t.set_write(|_, _, _| Err(io::Error::from_raw_os_error(libc::ENOSPC)));
        t.insert(1, &[2u8; 10]);
        assert!(t.is_off());
        assert_eq!((t.lookup(0), t.lookup(1), t.used()), (false, false, 0));
    }

    #[test]
    fn two_handles_share_one_index() {
        let d = tempfile::tempdir().unwrap();
        let a = LocalTier::open(d.path(), [1u8; 32], records(3), 4 * K).unwrap();
        let b = LocalTier::open(d.path(), [1u8; 32], records(3), 4 * K).unwrap();
        a.insert(0, &[1u8; 10]);
        assert!(b.lookup(0));
        b.insert(1, &[2u8; 10]);
        a.insert(2, &[3u8; 10]); // evicts 0 (the oldest use), whoever inserted it
        assert_eq!((b.lookup(0), b.lookup(1), a.lookup(2)), (false, true, true));
        assert_eq!(a.used(), 4 * K);
    }
}
