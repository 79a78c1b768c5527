//! Draft rows in the expert store: while speculative decoding verifies drafted tokens
//! ([`ExpertStore::begin_drafts`]), the experts that only draft rows use are read, computed
//! and admitted to the cache like any other, but they count as uses only when the
//! verification says which drafts were accepted ([`ExpertStore::end_drafts`]), and the
//! rejected drafts' misses leave the cache then.
//!
//! Why: a verification of `k` drafts routes `k + 1` rows, so it reads experts that plain
//! decoding, one token at a time, would only read for the tokens actually kept. Admitted and
//! counted as plain uses, the rejected drafts' experts would stay and evict the experts the
//! next tokens reuse (measured: with the LFU-DA cache a streamed MoE decoded 8-22% more bytes
//! per token with `--lookup` than without, when drafts were rarely accepted; BENCHMARKS.md,
//! "`--lookup` on the streamed 16-layer synth after the doubling rule"). Admitted only into
//! spare room (session 11), the accepted drafts' experts were not kept once the cache was
//! full, and the tokens after them, which reuse them, read them again (+22% at 96 tokens;
//! BENCHMARKS.md, "Speculation, session 12"). So:
//! - an expert whose first row is a draft row (*tentative*) is looked up without recording a
//!   use; a miss is read, computed and admitted as plain decoding would admit it;
//! - when the verification ends, its use is recorded (the cache's use count, the heat file's
//!   count) if a kept row (an accepted draft) used it, as if plain decoding had; if only
//!   rejected rows used it and this pass read it, it is taken out of the cache again.
//!
//! What a rejected draft still costs: its reads, and the entries its misses evicted.

use super::ExpertStore;

/// The state of a verification pass in the store (see the module doc).
#[derive(Debug, Default)]
pub(super) struct DraftRows {
    /// Batch rows at or past this index are drafts; `None` outside a verification.
    pub from: Option<usize>,
    /// Tentative uses of the pass so far: (layer, expert, first batch row using it, bytes
    /// this pass read for it: 0 when it was cached).
    pub uses: Vec<(usize, usize, usize, u64)>,
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
    /// are forgotten, and those this pass read leave the cache. Returns the bytes read for
    /// experts only rejected rows used (what the rejected drafts cost in reads; buffer bytes).
    /// Nothing happens outside a verification (0).
    pub fn end_drafts(&mut self, kept: usize) -> u64 {
        self.drafts.from = None;
        self.drafts.now.clear();
        let mut back = Vec::new();
        let mut wasted = 0;
        for (layer, e, row, read) in std::mem::take(&mut self.drafts.uses) {
            let key = (layer as u32, e as u32);
            if row < kept {
                self.heat.counts[layer][e] += 1;
                self.cache.hit(key);
            } else if read > 0 {
                wasted += read;
                back.extend(self.cache.remove(key));
            }
        }
        if !back.is_empty() {
            self.refill(back);
        }
        wasted
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
    fn rejected_draft_rows_leave_the_cache_and_count_no_uses() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = store(dir.path());
        // plain passes fill the cache with experts 0 and 1
        assert_eq!(pass(&mut s, &[0, 1], &[0, 0]), 2 * 4096);
        assert_eq!(pass(&mut s, &[0, 1], &[0, 0]), 0, "both cached");
        // a verification: row 0 uses 0, the draft row 1 uses 2; the draft's miss is read and
        // admitted (evicting 1, the entry plain decoding would evict), then rejected
        s.begin_drafts(1);
        assert_eq!(pass(&mut s, &[0, 2], &[0, 1]), 4096);
        assert!(s.cache().contains((0, 2)), "admitted while the pass runs");
        assert_eq!(s.end_drafts(1), 4096, "the rejected draft's read");
        assert!(s.cache().contains((0, 0)));
        assert!(
            !s.cache().contains((0, 2)),
            "a rejected draft's miss leaves"
        );
        assert_eq!(
            s.heat.counts[0],
            [3, 2, 0, 0],
            "rejected drafts are no uses"
        );
        assert_eq!(s.cache().len(), 1);
        // an expert a rejected draft found cached stays
        assert_eq!(pass(&mut s, &[1], &[0]), 4096);
        s.begin_drafts(1);
        assert_eq!(pass(&mut s, &[0, 1], &[0, 1]), 0);
        assert_eq!(s.end_drafts(1), 0, "nothing read");
        assert!(s.cache().contains((0, 0)) && s.cache().contains((0, 1)));
        assert_eq!(s.heat.counts[0], [4, 3, 0, 0]);
        // the same rows as plain rows (no begin_drafts): every use counts, 3 stays cached
        assert_eq!(pass(&mut s, &[0, 3], &[0, 1]), 4096);
        assert_eq!(s.heat.counts[0], [5, 3, 0, 1]);
        assert!(s.cache().contains((0, 3)));
    }

    #[test]
    fn accepted_draft_rows_count_as_uses_and_stay_cached() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = store(dir.path());
        s.begin_drafts(1);
        assert_eq!(pass(&mut s, &[0, 2], &[0, 1]), 2 * 4096);
        assert_eq!(s.heat.counts[0], [1, 0, 0, 0], "not counted before the end");
        // row 1 (the first draft) accepted: its expert's use counts now, and it stays
        s.end_drafts(2);
        assert_eq!(s.heat.counts[0], [1, 0, 1, 0]);
        assert!(s.cache().contains((0, 0)) && s.cache().contains((0, 2)));
        // a full cache: the accepted draft's expert 3 is admitted as a plain miss would be
        s.begin_drafts(1);
        assert_eq!(pass(&mut s, &[0, 3], &[0, 2]), 4096);
        assert_eq!(s.end_drafts(3), 0, "accepted: no waste");
        assert!(
            s.cache().contains((0, 3)),
            "kept for the tokens that reuse it"
        );
        assert_eq!(s.heat.counts[0], [2, 0, 1, 1]);
        assert_eq!(pass(&mut s, &[3], &[0]), 0, "the next token's use is a hit");
        // an expert a kept row and a draft row share is a plain use (its first row decides)
        s.begin_drafts(1);
        assert_eq!(pass(&mut s, &[3], &[0]), 0);
        s.end_drafts(1);
        assert_eq!(s.heat.counts[0], [2, 0, 1, 3]);
    }
}
