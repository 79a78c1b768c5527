//! Weight units and the streamer that reads them ahead of compute.
//!
//! A *unit* is the set of weights one compute step needs (a transformer layer, a chunk of the
//! LM head, one embedding row): one or more byte ranges that land consecutively in one aligned
//! buffer. A unit is either resident (read once at load) or streamed: read again on every
//! forward pass by a background I/O thread into one of a small ring of reusable buffers, in
//! the order the forward pass will consume them, so that the next unit's read overlaps the
//! current unit's compute.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use super::aligned::{round_up, AlignedBuf, IO_ALIGN};
use super::direct::{AlignedSpan, DirectFile};

/// One contiguous byte range of a model file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadRange {
    /// Index into the file list the [`Streamer`] or [`load_resident`] was given.
    pub file: usize,
    /// Absolute byte offset in the file.
    pub offset: u64,
    /// Length in bytes.
    pub len: usize,
}

/// The ranges of one unit. Ranges land in the unit's buffer one after the other, each at an
/// [`IO_ALIGN`] boundary (see [`Unit::buffer_bytes`]). Piece `i` of a filled unit holds the
/// bytes of `ranges[i]`, unless `pieces` names the pieces explicitly.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unit {
    pub ranges: Vec<ReadRange>,
    /// Explicit pieces as (byte offset in the buffer, length), for a unit whose ranges are
    /// physical reads of something addressed otherwise (a pack record striped over drives:
    /// one piece may span several ranges). `None`: one piece per range.
    pub pieces: Option<Vec<(usize, usize)>>,
}

impl Unit {
    /// A unit with one piece per range.
    pub fn of(ranges: Vec<ReadRange>) -> Self {
        Self {
            ranges,
            pieces: None,
        }
    }

    /// The pieces (buffer offset, length) a buffer filled with this unit's ranges holds.
    pub fn piece_layout(&self) -> Vec<(usize, usize)> {
        if let Some(p) = &self.pieces {
            return p.clone();
        }
        let mut pieces = Vec::with_capacity(self.ranges.len());
        let mut pos = 0usize;
        for r in &self.ranges {
            let span = AlignedSpan::covering(r.offset, r.len);
            pieces.push((pos + span.skip, r.len));
            pos += span.len;
        }
        pieces
    }

    /// Bytes of buffer the unit needs: every range's aligned span, each placed at an
    /// [`IO_ALIGN`] boundary.
    pub fn buffer_bytes(&self) -> usize {
        self.ranges
            .iter()
            .map(|r| AlignedSpan::covering(r.offset, r.len).len)
            .sum()
    }

    /// Payload bytes (the sum of the range lengths).
    pub fn payload_bytes(&self) -> usize {
        self.ranges.iter().map(|r| r.len).sum()
    }
}

/// A unit's bytes in memory: piece `i` is the bytes of range `i`.
pub struct UnitBytes {
    buf: AlignedBuf,
    pieces: Vec<(usize, usize)>,
}

impl UnitBytes {
    /// Bytes of `unit` in `buf`, laid out as [`Unit::buffer_bytes`] describes (each range's
    /// aligned span at an [`IO_ALIGN`] boundary, in order).
    pub(crate) fn laid_out(unit: &Unit, buf: AlignedBuf) -> Self {
        assert!(
            unit.buffer_bytes() <= buf.capacity(),
            "unit larger than its buffer"
        );
        Self {
            buf,
            pieces: unit.piece_layout(),
        }
    }

    /// A unit-less buffer of `bytes` (for tests of the cache).
    #[cfg(test)]
    pub(crate) fn empty(bytes: usize) -> Self {
        Self {
            buf: AlignedBuf::new(bytes),
            pieces: vec![],
        }
    }

    /// Takes the buffer back.
    pub(crate) fn into_buf(self) -> AlignedBuf {
        self.buf
    }

    /// The start of the buffer, for reads landing in it.
    pub(crate) fn buf_ptr(&mut self) -> *mut u8 {
        self.buf.as_mut_slice().as_mut_ptr()
    }

    /// The bytes of range `i` of the unit.
    pub fn piece(&self, i: usize) -> &[u8] {
        let (s, l) = self.pieces[i];
        &self.buf.as_slice()[s..s + l]
    }

    /// A unit's bytes from a filled buffer and its pieces (start, length) in it.
    pub(crate) fn from_parts(buf: AlignedBuf, pieces: Vec<(usize, usize)>) -> Self {
        Self { buf, pieces }
    }

    /// The whole buffer as read: every range's aligned span in order (see
    /// [`Unit::buffer_bytes`]).
    pub(crate) fn raw(&self) -> &[u8] {
        self.buf.as_slice()
    }

    /// The bytes from the start of the first piece to the end of the last (a pack record,
    /// padding between pieces included).
    pub fn record(&self) -> &[u8] {
        let Some(&(s, _)) = self.pieces.first() else {
            return &[];
        };
        let end = self.pieces.iter().map(|&(s, l)| s + l).max().unwrap_or(s);
        &self.buf.as_slice()[s..end]
    }

    /// Size of the backing buffer in bytes (what the unit costs in RAM).
    pub fn buffer_bytes(&self) -> usize {
        self.buf.capacity()
    }

    /// Bytes holding `bytes` as their only piece (piece 0), in an aligned buffer of their own
    /// (for weights re-encoded after their read, e.g. repacked MXFP4 experts).
    pub fn from_bytes(bytes: &[u8]) -> Self {
        let mut buf = AlignedBuf::new(bytes.len());
        buf.as_mut_slice()[..bytes.len()].copy_from_slice(bytes);
        Self {
            buf,
            pieces: vec![(0, bytes.len())],
        }
    }
}

/// Counters shared by the reads of one model (all units, resident and streamed).
#[derive(Debug, Default)]
pub struct IoStats {
    /// Bytes read from the device (aligned spans).
    pub bytes_read: AtomicU64,
    /// Read requests issued (one per range).
    pub reads: AtomicU64,
    /// Nanoseconds the I/O thread spent inside reads.
    pub busy_ns: AtomicU64,
    /// Nanoseconds compute spent waiting for a streamed unit.
    pub wait_ns: AtomicU64,
}

impl IoStats {
    /// A snapshot `(bytes_read, reads, busy_ns, wait_ns)`.
    pub fn snapshot(&self) -> (u64, u64, u64, u64) {
        (
            self.bytes_read.load(Ordering::Relaxed),
            self.reads.load(Ordering::Relaxed),
            self.busy_ns.load(Ordering::Relaxed),
            self.wait_ns.load(Ordering::Relaxed),
        )
    }
}

/// Reads every range of `unit` into `buf`; on failure the buffer comes back with the error so
/// a ring buffer is never lost.
fn read_unit(
    files: &[DirectFile],
    unit: &Unit,
    mut buf: AlignedBuf,
    stats: &IoStats,
) -> Result<UnitBytes, (io::Error, AlignedBuf)> {
    assert!(
        buf.capacity() >= unit.buffer_bytes(),
        "unit larger than its buffer"
    );
    let mut pos = 0usize;
    let t = Instant::now();
    for r in &unit.ranges {
        let Some(f) = files.get(r.file) else {
            let e = io::Error::new(
                io::ErrorKind::NotFound,
                format!("no file with index {}", r.file),
            );
            return Err((e, buf));
        };
        let (skip, n) = match f.read_into(r.offset, r.len, &mut buf.as_mut_slice()[pos..]) {
            Ok(v) => v,
            Err(e) => return Err((e, buf)),
        };
        stats.bytes_read.fetch_add(n, Ordering::Relaxed);
        stats.reads.fetch_add(1, Ordering::Relaxed);
        pos += round_up(skip + r.len, IO_ALIGN);
    }
    stats
        .busy_ns
        .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    Ok(UnitBytes {
        buf,
        pieces: unit.piece_layout(),
    })
}

/// Bytes of resident units that [`WeightStore::open_full`](super::WeightStore::open_full) is
/// about to read, and has read ([`load_resident`]), summed over every load of this process:
/// what a progress display of a load watches (the difference of two readings).
static LOAD_METER: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// The load meter: `(planned, read)` bytes of resident units over every load of this process
/// so far.
pub fn load_meter() -> (u64, u64) {
    (
        LOAD_METER[0].load(Ordering::Relaxed),
        LOAD_METER[1].load(Ordering::Relaxed),
    )
}

/// Adds `bytes` of resident units about to be read to the load meter.
pub(super) fn plan_resident_bytes(bytes: u64) {
    LOAD_METER[0].fetch_add(bytes, Ordering::Relaxed);
}

/// Reads `unit` once into a buffer of its own (for resident weights).
///
/// Errors: a read fails or a range lies past its file's end (the message names the file).
pub fn load_resident(files: &[DirectFile], unit: &Unit, stats: &IoStats) -> io::Result<UnitBytes> {
    let b =
        read_unit(files, unit, AlignedBuf::new(unit.buffer_bytes()), stats).map_err(|(e, _)| e)?;
    LOAD_METER[1].fetch_add(unit.buffer_bytes() as u64, Ordering::Relaxed);
    Ok(b)
}

/// Reads units on a background thread into a fixed ring of `slots` buffers of `slot_bytes`
/// each, in submission order. Memory: `slots × slot_bytes`, allocated once.
pub struct Streamer {
    jobs: Option<Sender<Arc<Unit>>>,
    filled: Receiver<io::Result<UnitBytes>>,
    free: SyncSender<AlignedBuf>,
    pending: usize,
    slots: usize,
    stats: Arc<IoStats>,
    slot_bytes: usize,
    thread: Option<JoinHandle<()>>,
}

impl Streamer {
    /// Starts the I/O thread over `files` with `slots` (≥ 1) buffers of `slot_bytes` each;
    /// every unit submitted later must fit one buffer ([`Unit::buffer_bytes`]).
    pub fn new(
        files: Vec<DirectFile>,
        slots: usize,
        slot_bytes: usize,
        stats: Arc<IoStats>,
    ) -> Self {
        let slots = slots.max(1);
        let (job_tx, job_rx) = channel::<Arc<Unit>>();
        let (free_tx, free_rx) = sync_channel::<AlignedBuf>(slots);
        let (filled_tx, filled_rx) = channel::<io::Result<UnitBytes>>();
        for _ in 0..slots {
            free_tx
                .send(AlignedBuf::new(slot_bytes))
                .expect("fresh channel");
        }
        let st = stats.clone();
        let give_back = free_tx.clone();
        let thread = std::thread::Builder::new()
            .name("deltafin-io".into())
            .spawn(move || {
                while let Ok(unit) = job_rx.recv() {
                    let Ok(buf) = free_rx.recv() else { return };
                    let r = read_unit(&files, &unit, buf, &st).map_err(|(e, buf)| {
                        // the buffer goes back to the ring; only the error travels on
                        let _ = give_back.try_send(buf);
                        e
                    });
                    if filled_tx.send(r).is_err() {
                        return;
                    }
                }
            })
            .expect("spawn I/O thread");
        Self {
            jobs: Some(job_tx),
            filled: filled_rx,
            free: free_tx,
            pending: 0,
            slots,
            stats,
            slot_bytes,
            thread: Some(thread),
        }
    }

    /// Bytes of each ring buffer.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Number of ring buffers.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Queues `unit` to be read after the units already queued.
    pub fn submit(&mut self, unit: Arc<Unit>) {
        assert!(
            unit.buffer_bytes() <= self.slot_bytes,
            "unit larger than a stream buffer"
        );
        self.pending += 1;
        self.jobs
            .as_ref()
            .expect("streamer running")
            .send(unit)
            .expect("I/O thread alive");
    }

    /// Waits for the oldest queued unit and returns its bytes; give them back with
    /// [`Streamer::recycle`] when done. The time spent waiting is added to `wait_ns`.
    ///
    /// Errors: the unit's read failed (the message names the file and range).
    pub fn next_unit(&mut self) -> io::Result<UnitBytes> {
        assert!(self.pending > 0, "next() without a submitted unit");
        let t = Instant::now();
        let r = self
            .filled
            .recv()
            .map_err(|_| io::Error::other("the I/O thread stopped"))?;
        self.pending -= 1;
        self.stats
            .wait_ns
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r
    }

    /// Returns a unit's buffer to the ring.
    pub fn recycle(&mut self, bytes: UnitBytes) {
        let _ = self.free.try_send(bytes.buf);
    }

    /// Drains every queued unit (after an error mid-pass), returning their buffers.
    pub fn drain(&mut self) {
        while self.pending > 0 {
            if let Ok(b) = self.next_unit() {
                self.recycle(b);
            }
        }
    }
}

impl Drop for Streamer {
    fn drop(&mut self) {
        self.jobs.take();
        // unblock a thread waiting for a free buffer
        while self.pending > 0 {
            if self.filled.recv().is_err() {
                break;
            }
            self.pending -= 1;
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_with(data: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w.bin");
        std::fs::File::create(&p).unwrap().write_all(data).unwrap();
        (dir, p)
    }

    #[test]
    fn streams_units_in_order_through_a_small_ring() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
        let (_d, p) = file_with(&data);
        let units: Vec<Arc<Unit>> = (0..10)
            .map(|i| {
                Arc::new(Unit {
                    pieces: None,
                    ranges: vec![
                        ReadRange {
                            file: 0,
                            offset: i * 9000 + 3,
                            len: 5000,
                        },
                        ReadRange {
                            file: 0,
                            offset: i * 777,
                            len: 100,
                        },
                    ],
                })
            })
            .collect();
        let slot = units.iter().map(|u| u.buffer_bytes()).max().unwrap();
        let stats = Arc::new(IoStats::default());
        let mut s = Streamer::new(
            vec![DirectFile::open(&p, true).unwrap()],
            2,
            slot,
            stats.clone(),
        );
        for _round in 0..2 {
            for u in &units {
                s.submit(u.clone());
            }
            for u in &units {
                let b = s.next_unit().unwrap();
                for (i, r) in u.ranges.iter().enumerate() {
                    assert_eq!(
                        b.piece(i),
                        &data[r.offset as usize..r.offset as usize + r.len]
                    );
                }
                s.recycle(b);
            }
        }
        assert_eq!(stats.snapshot().1, 40);
    }

    #[test]
    fn read_error_names_the_file() {
        let (_d, p) = file_with(&[1u8; 1000]);
        let stats = Arc::new(IoStats::default());
        let mut s = Streamer::new(vec![DirectFile::open(&p, true).unwrap()], 2, 8192, stats);
        s.submit(Arc::new(Unit {
            pieces: None,
            ranges: vec![ReadRange {
                file: 0,
                offset: 900,
                len: 200,
            }],
        }));
        let e = s.next_unit().err().unwrap().to_string();
        assert!(
            e.contains("w.bin: read of 200 bytes at offset 900 goes past the end"),
            "{e}"
        );
    }
}
