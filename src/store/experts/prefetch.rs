//! Prefetch in the expert store: when it runs ([`PrefetchMode`], from where the experts lie,
//! [`expert_layout`]), taking the model's guesses for the MoE layer planned next, starting
//! their reads at low priority, and dropping the guesses a layer did not take. See the parent
//! module's doc for the whole scheme.
//!
//! **Read-ahead** (long batches: a prompt's passes): when a layer's batch uses at least 3/4 of
//! its experts, the store lowers the cache's budget by `ra_slots` expert buffers (at most one
//! layer's experts, and at most what the cache was given) and uses those buffers for two
//! things: the layer's misses are all issued at once (one deep queue rather than `slots`
//! buffers' worth), and [`ExpertStore::read_ahead`] reads every uncached expert of the next
//! MoE layer in file order, at normal priority behind the demand reads already queued, before
//! that layer's router has run. When that layer is planned, what landed is used like a cache
//! hit, reads in flight become demand reads, and experts it does not use are dropped (counted
//! as prefetch waste). The first batch that uses fewer than half of its layer's experts (a
//! decode token) ends read-ahead and gives the cache its budget back. Like prefetch, it
//! changes when bytes arrive, never what is computed.

use std::io;
use std::path::PathBuf;

use super::{ExpertStore, Purpose, Unit};

/// When prefetch runs (`--prefetch auto|on|off`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PrefetchMode {
    /// On when whole experts lie on two drives or more (a `spread` pack, or files on several
    /// drives). Off on one drive, which is busy nearly all the time so wrong guesses cost more
    /// than the idle time right ones fill, and off when every expert is striped over all the
    /// drives, which then read at their full rate without it (measured: BENCHMARKS.md,
    /// "Prefetch").
    #[default]
    Auto,
    On,
    Off,
}

impl PrefetchMode {
    /// Whether prefetch runs for experts laid out as `layout` describes.
    pub fn enabled(self, layout: ExpertLayout) -> bool {
        match self {
            Self::Auto => layout.drives >= 2 && !layout.striped,
            Self::On => true,
            Self::Off => false,
        }
    }
}

/// Where the experts' bytes lie.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertLayout {
    /// Devices (drives) holding expert bytes.
    pub drives: usize,
    /// Whether some expert's bytes lie on more than one drive.
    pub striped: bool,
}

impl std::str::FromStr for PrefetchMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "on" => Ok(Self::On),
            "off" => Ok(Self::Off),
            _ => Err(format!(
                "unknown prefetch mode '{s}' (expected auto, on or off)"
            )),
        }
    }
}

impl std::fmt::Display for PrefetchMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::On => "on",
            Self::Off => "off",
        })
    }
}

/// Where the bytes of `units`, whose ranges index `files`, lie: how many devices (drives)
/// hold them and whether one unit spans several. A file that cannot be examined counts as a
/// drive of its own.
pub fn expert_layout<'a>(
    files: &[PathBuf],
    units: impl IntoIterator<Item = &'a Unit>,
) -> ExpertLayout {
    use std::os::unix::fs::MetadataExt;
    let dev: Vec<u64> = files
        .iter()
        .enumerate()
        .map(|(i, p)| std::fs::metadata(p).map_or(u64::MAX - i as u64, |m| m.dev()))
        .collect();
    let mut used: Vec<u64> = Vec::new();
    let mut striped = false;
    for u in units {
        let mut mine: Vec<u64> = u.ranges.iter().map(|r| dev[r.file]).collect();
        mine.sort_unstable();
        mine.dedup();
        striped |= mine.len() > 1;
        used.extend(mine);
    }
    used.sort_unstable();
    used.dedup();
    ExpertLayout {
        drives: used.len(),
        striped,
    }
}

/// Buffers a layer's read-ahead may hold: one per expert of the widest layer (`n_experts`),
/// at most `cache_bytes / slot_bytes` (the memory the cache was given, which read-ahead
/// borrows); 0 (no read-ahead) when `on` is false or there is room for fewer than 2.
pub(super) fn read_ahead_slots(
    on: bool,
    n_experts: usize,
    cache_bytes: usize,
    slot_bytes: usize,
) -> usize {
    let n = n_experts.min(cache_bytes / slot_bytes.max(1));
    if on && n >= 2 {
        n
    } else {
        0
    }
}

impl ExpertStore {
    /// Buffers prefetch may hold now: a layer's read-ahead while batches are long, else the
    /// prefetch slots.
    pub(super) fn pf_cap(&self) -> usize {
        if self.ra_active {
            self.ra_slots.max(self.prefetch_slots)
        } else {
            self.prefetch_slots
        }
    }

    /// Buffers a layer's read-ahead may hold (0: read-ahead never runs).
    pub fn read_ahead_slots(&self) -> usize {
        self.ra_slots
    }

    /// Routed experts in the store, all layers.
    pub fn experts_total(&self) -> usize {
        self.units.iter().map(|r| r.len()).sum()
    }

    /// Whether read-ahead is on (the batches now planned are long; see the module doc).
    pub fn read_ahead_active(&self) -> bool {
        self.ra_active
    }

    /// Starts or ends read-ahead from the size of the batch a layer plans: `used` of its
    /// `n` experts (on at ≥ 3/4, off below 1/2). Call before the layer's cache lookups.
    pub(super) fn switch_read_ahead(&mut self, used: usize, n: usize) {
        if self.ra_slots == 0 || n == 0 {
            return;
        }
        if !self.ra_active && used * 4 >= n * 3 {
            self.ra_active = true;
            let b = self
                .cache_given
                .saturating_sub(self.ra_slots * self.slot_bytes);
            for u in self.cache.set_budget(b) {
                let buf = u.into_buf();
                if buf.capacity() >= self.slot_bytes {
                    self.free.push(buf);
                }
            }
        } else if self.ra_active && used * 2 < n {
            self.ra_active = false;
            self.cache.set_budget(self.cache_given);
        }
    }

    /// Drops free buffers beyond those prefetch and demand reads may hold now (after
    /// read-ahead ended).
    pub(super) fn trim_free(&mut self) {
        let held = self.landing.len() + self.staged.len() + self.ready.len();
        let want = (self.slots + self.pf_cap()).saturating_sub(held);
        self.free.truncate(want);
    }

    /// Reads ahead every expert of `layer` (the MoE layer planned next) that the cache does
    /// not hold, in file order, while read-ahead is on (see the module doc); replaces earlier
    /// guesses. No effect otherwise.
    pub fn read_ahead(&mut self, layer: usize) {
        if !self.ra_active || layer >= self.units.len() {
            return;
        }
        self.drop_guesses();
        let units = &self.units[layer];
        let mut ids: Vec<usize> = (0..units.len())
            .filter(|&e| !self.cache.contains((layer as u32, e as u32)))
            .collect();
        ids.sort_by_key(|&e| units[e].ranges.first().map(|r| (r.file, r.offset)));
        let n = self.ra_slots;
        self.guesses
            .extend(ids.into_iter().take(n).map(|e| (layer, e)));
        self.issue_prefetch();
    }

    /// Guesses the experts `ids` (best first; at most `slots` are taken) of `layer`, the MoE
    /// layer planned next, and starts reading the ones not cached at low priority (see the
    /// module doc). Replaces earlier guesses. No effect with prefetch off.
    pub fn prefetch(&mut self, layer: usize, ids: &[usize]) {
        if self.prefetch_slots == 0 || layer >= self.units.len() {
            return;
        }
        self.drop_guesses();
        for &e in ids.iter().take(self.prefetch_slots) {
            if e < self.units[layer].len() && !self.cache.contains((layer as u32, e as u32)) {
                self.guesses.push_back((layer, e));
            }
        }
        self.issue_prefetch();
    }

    /// Drops every guess the layer just planned did not take: cancels reads not started,
    /// marks reads in flight to be discarded when they land, frees landed ones.
    pub(super) fn drop_guesses(&mut self) {
        self.counters.prefetch_cancelled += self.guesses.len() as u64;
        self.guesses.clear();
        let mut gone = Vec::new();
        for (&tag, l) in self.landing.iter_mut() {
            if l.purpose != Purpose::Prefetch {
                continue;
            }
            l.purpose = Purpose::Discard;
            l.left -= self.engine.cancel_low(tag);
            if l.left == 0 {
                gone.push(tag);
            }
        }
        for tag in gone {
            let l = self.landing.remove(&tag).expect("landing present");
            if l.got == 0 {
                // none of its reads had started
                self.counters.prefetch_reads -= 1;
                self.counters.prefetch_cancelled += 1;
            } else {
                self.counters.prefetch_wasted += 1;
                self.counters.prefetch_wasted_bytes += l.got;
            }
            self.free.push(l.bytes.into_buf());
        }
        for (_, (b, got)) in std::mem::take(&mut self.staged) {
            self.counters.prefetch_wasted += 1;
            self.counters.prefetch_wasted_bytes += got;
            self.free.push(b.into_buf());
        }
    }

    /// Buffers held by prefetch: guesses in flight or landed.
    fn prefetch_held(&self) -> usize {
        self.staged.len()
            + self
                .landing
                .values()
                .filter(|l| l.purpose != Purpose::Demand)
                .count()
    }

    /// Starts reads of guesses while no demand read waits for a buffer, a buffer is free and
    /// prefetch holds fewer than it may ([`ExpertStore::pf_cap`]).
    pub(super) fn issue_prefetch(&mut self) {
        while self.pending.is_empty()
            && !self.free.is_empty()
            && self.prefetch_held() < self.pf_cap()
        {
            let Some((layer, e)) = self.guesses.pop_front() else {
                return;
            };
            self.counters.prefetch_reads += 1;
            self.start(layer, e, Purpose::Prefetch);
        }
    }

    /// Guesses whose reads started and that no layer has taken yet (in flight or landed).
    pub fn prefetch_outstanding(&self) -> usize {
        self.prefetch_held()
    }

    /// Drops every guess and waits for the reads of those in flight, counting them as wasted,
    /// so nothing is left in flight (the end of a generation). Call between layers.
    ///
    /// Errors: a completion that matches no read.
    pub fn settle(&mut self) -> io::Result<()> {
        assert!(self.planned.is_none(), "settle() with a layer planned");
        self.drop_guesses();
        while !self.landing.is_empty() {
            if let Some(l) = self.land_one()? {
                self.waste(l);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_prefetch_needs_whole_experts_on_two_drives() {
        let l = |drives, striped| ExpertLayout { drives, striped };
        assert!(!PrefetchMode::Auto.enabled(l(1, false)));
        assert!(PrefetchMode::Auto.enabled(l(2, false)));
        assert!(!PrefetchMode::Auto.enabled(l(4, true)));
        assert!(PrefetchMode::On.enabled(l(1, false)));
        assert!(!PrefetchMode::Off.enabled(l(4, false)));
        assert_eq!("auto".parse::<PrefetchMode>(), Ok(PrefetchMode::Auto));
        assert_eq!(
            "sometimes".parse::<PrefetchMode>().unwrap_err(),
            "unknown prefetch mode 'sometimes' (expected auto, on or off)"
        );
    }

    #[test]
    fn the_layout_counts_drives_over_the_files_experts_use() {
        let dir = tempfile::tempdir().unwrap();
        let files: Vec<PathBuf> = ["a", "b"].iter().map(|n| dir.path().join(n)).collect();
        for f in &files {
            std::fs::write(f, [0u8; 8]).unwrap();
        }
        let r = |file| crate::store::ReadRange {
            file,
            offset: 0,
            len: 8,
        };
        let unit = |file| Unit::of(vec![r(file)]);
        let l = |drives, striped| ExpertLayout { drives, striped };
        // two files on one device are one drive; a file that cannot be examined counts alone
        assert_eq!(expert_layout(&files, &[unit(0), unit(1)]), l(1, false));
        let mut more = files.clone();
        more.push(dir.path().join("missing"));
        assert_eq!(expert_layout(&more, &[unit(0), unit(2)]), l(2, false));
        assert_eq!(expert_layout(&more, &[unit(1)]), l(1, false));
        // one expert over two drives is striped
        let both = Unit::of(vec![r(0), r(2)]);
        assert_eq!(expert_layout(&more, &[both, unit(1)]), l(2, true));
    }
}
