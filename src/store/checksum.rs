//! Pack checksums checked on read: XXH3-128, which packs record beside the SHA-256 for every
//! expert record and spine tensor and every read checks by default (fast enough to be always
//! on), or SHA-256 for packs written before XXH3-128 was recorded. [`RecordSum`] is one
//! checksum; [`SpineSums`] checks the spine tensors inside a unit's reads ([`SpineCheck`]).

use std::io;
use std::sync::{Arc, Mutex};

use super::direct::AlignedSpan;
use super::streamer::{Unit, UnitBytes};

/// One expert record's checksum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordSum {
    /// XXH3-128 of the record's bytes (big-endian, as the manifest's hex reads).
    Xxh3([u8; 16]),
    /// SHA-256 of the record's bytes.
    Sha256([u8; 32]),
}

impl RecordSum {
    /// Whether `bytes` have this checksum.
    pub fn matches(&self, bytes: &[u8]) -> bool {
        match self {
            RecordSum::Xxh3(want) => &xxh3_128(bytes) == want,
            RecordSum::Sha256(want) => {
                use sha2::Digest;
                let got: [u8; 32] = sha2::Sha256::digest(bytes).into();
                &got == want
            }
        }
    }

    /// Hex of this checksum (as the manifest writes it).
    pub fn hex(&self) -> String {
        match self {
            RecordSum::Xxh3(b) => hex(b),
            RecordSum::Sha256(b) => hex(b),
        }
    }

    /// Hex of the checksum of `bytes` with this checksum's algorithm.
    pub fn hex_of(&self, bytes: &[u8]) -> String {
        let mut h = Hasher::of(self);
        h.update(bytes);
        h.finish()
    }

    /// The algorithm's name (`xxh3-128`, `SHA-256`).
    pub fn algorithm(&self) -> &'static str {
        match self {
            RecordSum::Xxh3(_) => "xxh3-128",
            RecordSum::Sha256(_) => "SHA-256",
        }
    }
}

/// XXH3-128 of `bytes`, big-endian.
pub fn xxh3_128(bytes: &[u8]) -> [u8; 16] {
    xxhash_rust::xxh3::xxh3_128(bytes).to_be_bytes()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// An incremental checksum of [`RecordSum`]'s algorithm.
enum Hasher {
    Xxh3(Box<xxhash_rust::xxh3::Xxh3>),
    Sha256(sha2::Sha256),
}

impl Hasher {
    fn of(s: &RecordSum) -> Self {
        match s {
            RecordSum::Xxh3(_) => Hasher::Xxh3(Box::default()),
            RecordSum::Sha256(_) => Hasher::Sha256(Default::default()),
        }
    }

    fn update(&mut self, b: &[u8]) {
        match self {
            Hasher::Xxh3(h) => h.update(b),
            Hasher::Sha256(h) => sha2::Digest::update(h, b),
        }
    }

    /// Hex of the checksum (big-endian, as [`RecordSum::hex`]).
    fn finish(self) -> String {
        match self {
            Hasher::Xxh3(h) => hex(&h.digest128().to_be_bytes()),
            Hasher::Sha256(h) => hex(&sha2::Digest::finalize(h)),
        }
    }
}

/// One spine tensor's place in the spine file and its checksum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpineTensor {
    /// The tensor's name (for messages).
    pub name: String,
    /// Byte offset in the spine file.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
    /// The checksum of those bytes (XXH3-128 when the manifest records it, else SHA-256).
    pub sum: RecordSum,
}

/// The checksums of a pack's spine tensors, by place in the spine file: what checks every
/// read of the spine ([`SpineCheck`]).
#[derive(Debug)]
pub struct SpineSums {
    /// The spine's index in the physical files the stores read ([`Unit`] ranges name it).
    pub file: usize,
    /// The spine file's path (for messages).
    pub path: String,
    /// Sorted by offset, not overlapping.
    tensors: Vec<SpineTensor>,
}

impl SpineSums {
    /// The checksums `tensors` of spine file `path` (index `file` of the physical files).
    pub fn new(file: usize, path: String, mut tensors: Vec<SpineTensor>) -> Self {
        tensors.sort_by_key(|t| t.offset);
        Self {
            file,
            path,
            tensors,
        }
    }

    /// The algorithm of the checksums (`xxh3-128`, or `SHA-256` for a pack written before
    /// XXH3-128 was recorded for spine tensors); `None` without tensors.
    pub fn algorithm(&self) -> Option<&'static str> {
        self.tensors.first().map(|t| t.sum.algorithm())
    }

    fn mismatch(&self, t: &SpineTensor, got: String) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{}: spine tensor '{}' (bytes {}..{}): checksum mismatch: {} {got} read, {} in the manifest (the file differs from the one packed)",
                self.path,
                t.name,
                t.offset,
                t.offset + t.len,
                t.sum.algorithm(),
                t.sum.hex()
            ),
        )
    }
}

/// A running checksum of a spine tensor read in consecutive pieces (an LM head streamed in
/// chunks): tensor index in [`SpineSums`], the offset the next piece must start at.
struct Running {
    tensor: usize,
    next: u64,
    hasher: Hasher,
}

/// Checks the spine bytes a store reads against [`SpineSums`]: every tensor a read covers
/// whole is checked at once; a tensor read in consecutive pieces from its first byte (the LM
/// head's chunks, in pass order) is checked when its last piece lands. Bytes of a tensor read
/// otherwise (single rows of a streamed embedding) are not checked.
pub struct SpineCheck {
    sums: Arc<SpineSums>,
    running: Mutex<Option<Running>>,
}

impl SpineCheck {
    /// A check against `sums`, with no piece read yet.
    pub fn new(sums: Arc<SpineSums>) -> Self {
        Self {
            sums,
            running: Mutex::new(None),
        }
    }

    /// Forgets a tensor read in pieces so far (after a pass's error).
    pub fn reset(&self) {
        *self.running.lock().unwrap() = None;
    }

    /// Checks `bytes`, read from the spine at `offset`.
    ///
    /// Errors: a tensor's bytes do not match its checksum (`InvalidData`; the message names
    /// the spine file, the tensor, its byte range and both checksums).
    pub fn check_range(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let s = &self.sums;
        let end = offset + bytes.len() as u64;
        // the first tensor ending after `offset`
        let first = s.tensors.partition_point(|t| t.offset + t.len <= offset);
        let mut running = self.running.lock().unwrap();
        for (i, t) in s.tensors.iter().enumerate().skip(first) {
            if t.offset >= end {
                break;
            }
            let t_end = t.offset + t.len;
            let (a, b) = (t.offset.max(offset), t_end.min(end));
            let part = &bytes[(a - offset) as usize..(b - offset) as usize];
            if a == t.offset && b == t_end {
                if !t.sum.matches(part) {
                    return Err(s.mismatch(t, t.sum.hex_of(part)));
                }
                continue;
            }
            let go_on = matches!(&*running, Some(r) if r.tensor == i && r.next == a);
            if a == t.offset {
                let mut h = Hasher::of(&t.sum);
                h.update(part);
                *running = Some(Running {
                    tensor: i,
                    next: b,
                    hasher: h,
                });
            } else if go_on {
                let r = running.as_mut().expect("running");
                r.hasher.update(part);
                r.next = b;
                if b == t_end {
                    let got = running.take().expect("running").hasher.finish();
                    if got != t.sum.hex() {
                        return Err(s.mismatch(t, got));
                    }
                }
            } else if running.as_ref().is_some_and(|r| r.tensor == i) {
                *running = None;
            }
        }
        Ok(())
    }

    /// Checks the spine ranges of `unit` in `bytes` (its bytes as read, laid out as
    /// [`Unit::buffer_bytes`] says), as [`SpineCheck::check_range`].
    ///
    /// Errors: as [`SpineCheck::check_range`].
    pub fn check_unit(&self, unit: &Unit, bytes: &UnitBytes) -> io::Result<()> {
        let raw = bytes.raw();
        let mut pos = 0usize;
        for r in &unit.ranges {
            let span = AlignedSpan::covering(r.offset, r.len);
            if r.file == self.sums.file {
                let at = pos + span.skip;
                self.check_range(r.offset, &raw[at..at + r.len])?;
            }
            pos += span.len;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xxh3_128_of_known_inputs() {
        // the reference implementation's XXH3_128bits of "" (seed 0), in canonical form
        assert_eq!(
            xxh3_128(b"")
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>(),
            "99aa06d3014798d86001c324468d497f"
        );
        let s = RecordSum::Xxh3(xxh3_128(b"record"));
        assert!(s.matches(b"record") && !s.matches(b"recorD"));
    }

    /// A spine of two tensors: `a` (bytes 0..8) and `b` (bytes 8..20).
    fn spine() -> (Vec<u8>, SpineCheck) {
        let bytes: Vec<u8> = (0..20u8).collect();
        let t = |name: &str, r: std::ops::Range<usize>| SpineTensor {
            name: name.into(),
            offset: r.start as u64,
            len: r.len() as u64,
            sum: RecordSum::Xxh3(xxh3_128(&bytes[r])),
        };
        let sums = SpineSums::new(0, "s.bin".into(), vec![t("b", 8..20), t("a", 0..8)]);
        (bytes, SpineCheck::new(Arc::new(sums)))
    }

    #[test]
    fn spine_tensors_are_checked_whole_in_any_read_that_covers_them() {
        let (mut bytes, c) = spine();
        c.check_range(0, &bytes).unwrap();
        c.check_range(8, &bytes[8..]).unwrap();
        bytes[9] ^= 0x40;
        c.check_range(0, &bytes[..8]).unwrap();
        let e = c.check_range(0, &bytes).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert_eq!(
            e.to_string(),
            format!(
                "s.bin: spine tensor 'b' (bytes 8..20): checksum mismatch: xxh3-128 {} read, {} \
                 in the manifest (the file differs from the one packed)",
                hex(&xxh3_128(&bytes[8..])),
                hex(&xxh3_128(&(8..20u8).collect::<Vec<u8>>()))
            )
        );
    }

    #[test]
    fn a_spine_tensor_read_in_consecutive_pieces_is_checked_when_the_last_lands() {
        let (mut bytes, c) = spine();
        // b in three chunks (an LM head streamed), twice
        for _ in 0..2 {
            c.check_range(8, &bytes[8..12]).unwrap();
            c.check_range(12, &bytes[12..16]).unwrap();
            c.check_range(16, &bytes[16..20]).unwrap();
        }
        bytes[13] ^= 1;
        c.check_range(8, &bytes[8..12]).unwrap();
        c.check_range(12, &bytes[12..16]).unwrap();
        let e = c.check_range(16, &bytes[16..20]).unwrap_err();
        assert!(e
            .to_string()
            .starts_with("s.bin: spine tensor 'b' (bytes 8..20): checksum mismatch: xxh3-128 "));
        // pieces out of order are not checked (single rows of a streamed embedding); a reset
        // forgets the pieces so far
        c.check_range(12, &bytes[12..16]).unwrap();
        c.check_range(8, &bytes[8..12]).unwrap();
        c.check_range(16, &bytes[16..20]).unwrap();
        c.check_range(8, &bytes[8..12]).unwrap();
        c.reset();
        c.check_range(12, &bytes[12..16]).unwrap();
        c.check_range(16, &bytes[16..20]).unwrap();
        // the SHA-256 of an older manifest checks the same way
        let sha = |b: &[u8]| -> [u8; 32] { <sha2::Sha256 as sha2::Digest>::digest(b).into() };
        let good: Vec<u8> = (0..20u8).collect();
        let c = SpineCheck::new(Arc::new(SpineSums::new(
            0,
            "s.bin".into(),
            vec![SpineTensor {
                name: "b".into(),
                offset: 8,
                len: 12,
                sum: RecordSum::Sha256(sha(&good[8..])),
            }],
        )));
        c.check_range(8, &good[8..14]).unwrap();
        c.check_range(14, &good[14..]).unwrap();
        c.check_range(8, &bytes[8..14]).unwrap();
        let e = c.check_range(14, &bytes[14..]).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "s.bin: spine tensor 'b' (bytes 8..20): checksum mismatch: SHA-256 {} read, {} \
                 in the manifest (the file differs from the one packed)",
                hex(&sha(&bytes[8..])),
                hex(&sha(&good[8..]))
            )
        );
    }
}
