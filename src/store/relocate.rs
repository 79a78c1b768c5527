//! Mapping units from a pack's logical coordinates to its physical files.
//!
//! A pack (see `source::pack`) describes its tensors in logical files: the spine file and one
//! expert file per drive are real; with the `stripe` placement all expert records live in one
//! *virtual* file, striped RAID-0 style over the drive files: the virtual file is a sequence of
//! rows of `drives × chunk` bytes, and chunk `d` of row `r` is stored on drive `d` at byte
//! `r × chunk`. Each expert record is one row, so an expert read touches every drive once.
//! [`Relocation::apply`] turns a unit addressed in logical files into physical reads that land
//! in the same buffer layout, so the model sees the same pieces.

use std::path::PathBuf;

use super::direct::AlignedSpan;
use super::streamer::{ReadRange, Unit};
use super::IO_ALIGN;

/// A RAID-0 virtual file over `drives` physical files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stripe {
    /// The logical file index of the virtual file.
    pub virtual_file: usize,
    /// Physical file index of drive 0's file; drive `d` is `first_file + d`.
    pub first_file: usize,
    /// Number of drives.
    pub drives: usize,
    /// Bytes of one chunk (a multiple of [`IO_ALIGN`]).
    pub chunk: u64,
}

impl Stripe {
    /// The physical (file, offset) of virtual byte `v` and the bytes left in its chunk.
    pub fn locate(&self, v: u64) -> (usize, u64, u64) {
        let row_bytes = self.chunk * self.drives as u64;
        let (row, within) = (v / row_bytes, v % row_bytes);
        let d = (within / self.chunk) as usize;
        let in_chunk = within % self.chunk;
        (
            self.first_file + d,
            row * self.chunk + in_chunk,
            self.chunk - in_chunk,
        )
    }
}

/// How a pack's logical files map to physical ones.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Relocation {
    /// The physical files, opened by the stores (logical files other than the virtual one
    /// have the same index here).
    pub files: Vec<PathBuf>,
    /// The striped virtual file, if any.
    pub stripe: Option<Stripe>,
}

impl Relocation {
    /// `unit` (ranges in logical files) as physical reads: ranges of the virtual file are cut
    /// at chunk boundaries and mapped to their drives; the pieces stay where the logical
    /// layout puts them ([`Unit::piece_layout`]).
    pub fn apply(&self, unit: &Unit) -> Unit {
        let Some(st) = &self.stripe else {
            return unit.clone();
        };
        if !unit.ranges.iter().any(|r| r.file == st.virtual_file) {
            return unit.clone();
        }
        let pieces = unit.piece_layout();
        let mut ranges = Vec::new();
        for r in &unit.ranges {
            if r.file != st.virtual_file {
                ranges.push(*r);
                continue;
            }
            // cut the aligned span at chunk boundaries; each cut lands at an aligned position
            let span = AlignedSpan::covering(r.offset, r.len);
            let end = r.offset + r.len as u64;
            let mut v = span.start;
            let span_end = span.start + span.len as u64;
            while v < span_end {
                let (file, off, left) = st.locate(v);
                let n = left.min(span_end - v);
                let from = v.max(r.offset);
                let to = (v + n).min(end);
                if to > from {
                    ranges.push(ReadRange {
                        file,
                        offset: off + (from - v),
                        len: (to - from) as usize,
                    });
                }
                v += n;
            }
        }
        debug_assert!(st.chunk % IO_ALIGN as u64 == 0);
        Unit {
            ranges,
            pieces: Some(pieces),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_striped_record_becomes_one_range_per_drive_in_logical_order() {
        let rel = Relocation {
            files: vec![],
            stripe: Some(Stripe {
                virtual_file: 4,
                first_file: 1,
                drives: 3,
                chunk: 8192,
            }),
        };
        // record 2 (row 2) of 20000 payload bytes: drives get 8192, 8192, 3616
        let u = Unit::of(vec![ReadRange {
            file: 4,
            offset: 2 * 3 * 8192,
            len: 20000,
        }]);
        let p = rel.apply(&u);
        let got: Vec<(usize, u64, usize)> =
            p.ranges.iter().map(|r| (r.file, r.offset, r.len)).collect();
        assert_eq!(
            got,
            vec![(1, 16384, 8192), (2, 16384, 8192), (3, 16384, 3616)]
        );
        assert_eq!(p.piece_layout(), vec![(0, 20000)]);
        assert_eq!(p.buffer_bytes(), 8192 + 8192 + 4096);
    }
}
