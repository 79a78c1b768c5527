//! Draft rows in the expert store: while speculative decoding verifies drafted tokens
//! ([`ExpertStore::begin_drafts`]), the experts that only draft rows use are read and computed
//! like any other, but they neither displace cached experts nor count as uses until the
//! verification says which drafts were accepted ([`ExpertStore::end_drafts`]).
//!
//! Why: a verification of `k` drafts routes `k + 1` rows, so it reads experts that plain
//! decoding, one token at a time, would only read for the tokens actually kept. Admitted to
//! the cache as plain uses, the rejected drafts' experts would evict the experts the next
//! tokens reuse, and that cost lands on the plain passes that follow, where the speculation
//! policy cannot see it (measured: with the LFU-DA cache a streamed MoE decoded 8-22% more
//! bytes per token with `--lookup` than without, when drafts were rarely accepted;
//! BENCHMARKS.md, "`--lookup` on the streamed 16-layer synth after the doubling rule"). So:
//! - an expert whose first row is a draft row (*tentative*) is looked up without recording a
//!   use; a miss is read, computed and then admitted only into room the cache has spare (it
//!   evicts nothing);
//! - its use is recorded (the cache's use count, the heat file's count) when the verification
//!   ends, for the rows it kept (the accepted drafts), as if plain decoding had used it.
//!
//! The cache then holds what plain decoding would hold, save the accepted drafts' misses
//! that found no room, and a verification's cost in bytes is its own.

use super::ExpertStore;

/// The state of a verification pass in the store (see the module doc).
#[derive(Debug, Default)]
pub(super) struct DraftRows {
    /// Batch rows at or past this index are drafts; `None` outside a verification.
    pub from: Option<usize>,
    /// Tentative uses of the pass so far: (layer, expert, first batch row using it).
    pub uses: Vec<(usize, usize, usize)>,
    /// The tentative experts of the layer planned now.
    pub now: Vec<usize>,
}

impl DraftRows {
    /// Whether an expert whose first user is batch row `row` is tentative.
    pub fn tentative(&self, row: usize) -> bool {
        self.from.is_some_and(|f| row >= f)
    }
}

impl ExpertStore {
    /// Starts a verification pass: batch rows `first_draft..` of the passes until
    /// [`ExpertStore::end_drafts`] are drafted tokens (see the module doc). Ends one left open.
    pub fn begin_drafts(&mut self, first_draft: usize) {
        self.end_drafts(0);
        self.drafts.from = Some(first_draft);
    }

    /// Ends the verification pass begun with [`ExpertStore::begin_drafts`], keeping batch rows
    /// `..kept` (the rows before the drafts, then the accepted drafts): the tentative uses of
    /// those rows are recorded now, in the cache's use counts and the heat counts; the others
    /// are forgotten. Nothing happens outside a verification.
    pub fn end_drafts(&mut self, kept: usize) {
        self.drafts.from = None;
        self.drafts.now.clear();
        for (layer, e, row) in std::mem::take(&mut self.drafts.uses) {
            if row < kept {
                self.heat.counts[layer][e] += 1;
                self.cache.hit((layer as u32, e as u32));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::{ExpertStore, ExpertStoreOptions, Unit};
    use crate::store::expert_cache::CachePolicy;
    use crate::store::streamer::{IoStats, ReadRange};

    /// A store over 1 layer of 4 experts of 4 KiB each in one file, with a cache of 2 experts.
    fn store(dir: &std::path::Path) -> ExpertStore {
        let path = dir.join("experts.bin");
        let bytes: Vec<u8> = (0..4 * 4096).map(|i| (i / 4096) as u8).collect();
        std::fs::write(&path, bytes).unwrap();
        let units = vec![(0..4)
            .map(|e| {
                Arc::new(Unit {
                    ranges: vec![ReadRange {
                        file: 0,
                        offset: e * 4096,
                        len: 4096,
                    }],
                    pieces: None,
                })
            })
            .collect()];
        let opts = ExpertStoreOptions {
            cache: CachePolicy::LfuDa,
            ..Default::default()
        };
        ExpertStore::new(
            &[path],
            false,
            units,
            1,
            2 * 4096,
            &opts,
            Arc::new(IoStats::default()),
        )
        .unwrap()
    }

    /// Plans `ids` of layer 0 with their first rows and computes them, returning the bytes
    /// read.
    fn pass(s: &mut ExpertStore, ids: &[usize], rows: &[usize]) -> u64 {
        let b0 = s.counters().bytes;
        s.plan(0, ids, rows);
        let mut got = Vec::new();
        s.for_each_landed(0, &mut |e, b| got.push((e, b.record()[0])))
            .unwrap();
        got.sort();
        let want: Vec<(usize, u8)> = ids.iter().map(|&e| (e, e as u8)).collect();
        assert_eq!(got, want, "every expert computed once, with its own bytes");
        s.counters().bytes - b0
    }

    #[test]
    fn rejected_draft_rows_leave_the_cache_as_plain_decoding_would() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = store(dir.path());
        // plain passes fill the cache with experts 0 and 1
        assert_eq!(pass(&mut s, &[0, 1], &[0, 0]), 2 * 4096);
        assert_eq!(pass(&mut s, &[0, 1], &[0, 0]), 0, "both cached");
        // a verification: row 0 uses 0 and 1, the draft rows 2 and 3; the drafts are read
        // but evict nothing, and are rejected
        s.begin_drafts(1);
        assert_eq!(pass(&mut s, &[0, 1, 2, 3], &[0, 0, 1, 2]), 2 * 4096);
        s.end_drafts(1);
        assert!(s.cache().contains((0, 0)) && s.cache().contains((0, 1)));
        assert!(!s.cache().contains((0, 2)) && !s.cache().contains((0, 3)));
        assert_eq!(
            s.heat.counts[0],
            [3, 3, 0, 0],
            "rejected drafts are no uses"
        );
        assert_eq!(
            pass(&mut s, &[0, 1], &[0, 0]),
            0,
            "plain decoding's cache kept"
        );
        // the same verification as plain rows (no begin_drafts) evicts what they displace
        assert_eq!(pass(&mut s, &[0, 1, 2, 3], &[0, 0, 1, 2]), 2 * 4096);
        assert_eq!(s.heat.counts[0], [5, 5, 1, 1]);
        assert!(s.cache().contains((0, 2)) && s.cache().contains((0, 3)));
    }

    #[test]
    fn accepted_draft_rows_count_as_uses_when_the_verification_ends() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = store(dir.path());
        // an empty cache has room: a tentative miss is admitted into it
        s.begin_drafts(1);
        assert_eq!(pass(&mut s, &[0, 2], &[0, 1]), 2 * 4096);
        assert_eq!(s.heat.counts[0], [1, 0, 0, 0], "not counted before the end");
        // row 1 (the first draft) accepted: its expert's use counts now
        s.end_drafts(2);
        assert_eq!(s.heat.counts[0], [1, 0, 1, 0]);
        assert!(s.cache().contains((0, 2)), "admitted into spare room");
        // a full cache: the tentative expert 3 is read again each time and never admitted
        s.begin_drafts(1);
        assert_eq!(pass(&mut s, &[0, 3], &[0, 2]), 4096);
        s.end_drafts(3);
        assert!(!s.cache().contains((0, 3)));
        assert_eq!(s.heat.counts[0], [2, 0, 1, 1]);
        // an expert a kept row and a draft row share is a plain use (its first row decides)
        s.begin_drafts(1);
        assert_eq!(pass(&mut s, &[2], &[0]), 0);
        s.end_drafts(1);
        assert_eq!(s.heat.counts[0], [2, 0, 2, 1]);
    }
}
