//! The weight store of a model: which units are resident, which are streamed, and ordered
//! access to their bytes during a forward pass.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;

use super::direct::DirectFile;
use super::experts::ExpertStore;
use super::streamer::{load_resident, IoStats, Streamer, Unit, UnitBytes};

/// Where a unit's bytes come from.
pub enum Residency {
    /// Read once at load, kept in RAM.
    Resident(UnitBytes),
    /// Read on every use through the streamer.
    Streamed,
    /// Held by the [`ExpertStore`] (a routed expert), never read through the streamer.
    Elsewhere,
}

/// The units of one model and their residency. Streamed units must be announced with
/// [`WeightStore::plan`] in the exact order the forward pass will use them, so reads run ahead
/// of compute.
pub struct WeightStore {
    units: Vec<Arc<Unit>>,
    residency: Vec<Residency>,
    streamer: Option<Streamer>,
    expected: VecDeque<usize>,
    stats: Arc<IoStats>,
    resident_bytes: usize,
    experts: Option<ExpertStore>,
}

impl WeightStore {
    /// Opens `files`, reads the units marked resident in `resident` (same length as `units`)
    /// and, when any unit is streamed, starts a streamer with `slots` buffers sized for the
    /// largest streamed unit or `extra_slot_bytes`, whichever is larger.
    ///
    /// Errors: a file cannot be opened or a resident read fails (the message names the file).
    pub fn open(
        files: &[std::path::PathBuf],
        units: Vec<Unit>,
        resident: &[bool],
        slots: usize,
        extra_slot_bytes: usize,
        direct: bool,
    ) -> io::Result<Self> {
        let elsewhere = vec![false; units.len()];
        Self::open_with_elsewhere(
            files,
            units,
            resident,
            &elsewhere,
            slots,
            extra_slot_bytes,
            direct,
        )
    }

    /// [`WeightStore::open`] where units flagged in `elsewhere` belong to an [`ExpertStore`]
    /// (attach it with [`WeightStore::attach_experts`]): they are neither read nor streamed here
    /// and do not size the stream buffers.
    ///
    /// Errors: as [`WeightStore::open`].
    pub fn open_with_elsewhere(
        files: &[std::path::PathBuf],
        units: Vec<Unit>,
        resident: &[bool],
        elsewhere: &[bool],
        slots: usize,
        extra_slot_bytes: usize,
        direct: bool,
    ) -> io::Result<Self> {
        assert_eq!(units.len(), resident.len());
        assert_eq!(units.len(), elsewhere.len());
        let open = |d: bool| -> io::Result<Vec<DirectFile>> {
            files
                .iter()
                .map(|p| {
                    DirectFile::open(p, d)
                        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", p.display())))
                })
                .collect()
        };
        let dfiles = open(direct)?;
        let stats = Arc::new(IoStats::default());
        let mut residency = Vec::with_capacity(units.len());
        let mut resident_bytes = 0;
        let mut slot = extra_slot_bytes;
        for ((u, &r), &x) in units.iter().zip(resident).zip(elsewhere) {
            if x {
                residency.push(Residency::Elsewhere);
            } else if r {
                let b = load_resident(&dfiles, u, &stats)?;
                resident_bytes += b.buffer_bytes();
                residency.push(Residency::Resident(b));
            } else {
                slot = slot.max(u.buffer_bytes());
                residency.push(Residency::Streamed);
            }
        }
        let any_streamed =
            resident.iter().zip(elsewhere).any(|(r, x)| !r && !x) || extra_slot_bytes > 0;
        let streamer = any_streamed.then(|| Streamer::new(dfiles, slots, slot, stats.clone()));
        Ok(Self {
            units: units.into_iter().map(Arc::new).collect(),
            residency,
            streamer,
            expected: VecDeque::new(),
            stats,
            resident_bytes,
            experts: None,
        })
    }

    /// Number of units.
    pub fn len(&self) -> usize {
        self.units.len()
    }

    /// Whether the store has no units.
    pub fn is_empty(&self) -> bool {
        self.units.is_empty()
    }

    /// Whether unit `id` is resident.
    pub fn is_resident(&self, id: usize) -> bool {
        matches!(self.residency[id], Residency::Resident(_))
    }

    /// Bytes of RAM held by resident units.
    pub fn resident_bytes(&self) -> usize {
        self.resident_bytes
    }

    /// Bytes of RAM held by the stream buffers.
    pub fn stream_buffer_bytes(&self) -> usize {
        self.streamer
            .as_ref()
            .map_or(0, |s| s.slot_bytes() * s.slots())
    }

    /// The shared I/O counters.
    pub fn stats(&self) -> &Arc<IoStats> {
        &self.stats
    }

    /// The unit table.
    pub fn unit(&self, id: usize) -> &Unit {
        &self.units[id]
    }

    /// Announces the units the next steps will use, in order; streamed ones are queued for
    /// reading at once. Resident ones are skipped.
    pub fn plan(&mut self, ids: impl IntoIterator<Item = usize>) {
        for id in ids {
            assert!(
                !matches!(self.residency[id], Residency::Elsewhere),
                "unit {id} belongs to the expert store"
            );
            if !self.is_resident(id) {
                self.expected.push_back(id);
                let u = self.units[id].clone();
                self.streamer
                    .as_mut()
                    .expect("streamed unit without a streamer")
                    .submit(u);
            }
        }
    }

    /// Queues an ad-hoc unit (not in the table), e.g. one embedding row of a streamed
    /// embedding; take it with [`WeightStore::with_adhoc`] in order.
    pub fn plan_adhoc(&mut self, unit: Unit) {
        self.expected.push_back(usize::MAX);
        self.streamer
            .as_mut()
            .expect("ad-hoc unit without a streamer")
            .submit(Arc::new(unit));
    }

    /// Runs `f` on the bytes of unit `id`: at once when resident, else after its read lands.
    /// Streamed units must be taken in the order they were planned.
    ///
    /// Errors: the unit's read failed (the message names the file and range).
    pub fn with_unit<R>(&mut self, id: usize, f: impl FnOnce(&UnitBytes) -> R) -> io::Result<R> {
        if let Residency::Resident(b) = &self.residency[id] {
            return Ok(f(b));
        }
        self.take_streamed(id, f)
    }

    /// Runs `f` on the next ad-hoc unit's bytes.
    pub fn with_adhoc<R>(&mut self, f: impl FnOnce(&UnitBytes) -> R) -> io::Result<R> {
        self.take_streamed(usize::MAX, f)
    }

    fn take_streamed<R>(&mut self, id: usize, f: impl FnOnce(&UnitBytes) -> R) -> io::Result<R> {
        let want = self.expected.pop_front();
        assert_eq!(want, Some(id), "streamed units taken out of planned order");
        let s = self.streamer.as_mut().expect("streamer");
        let b = match s.next_unit() {
            Ok(b) => b,
            Err(e) => {
                self.expected.clear();
                s.drain();
                return Err(e);
            }
        };
        let r = f(&b);
        s.recycle(b);
        Ok(r)
    }

    /// Hands the routed experts to an [`ExpertStore`]; units it covers must not be resident
    /// or planned through [`WeightStore::plan`].
    pub fn attach_experts(&mut self, experts: ExpertStore) {
        self.experts = Some(experts);
    }

    /// The expert store, when the model's experts are read on demand.
    pub fn experts(&self) -> Option<&ExpertStore> {
        self.experts.as_ref()
    }

    /// The expert store, mutably.
    pub fn experts_mut(&mut self) -> Option<&mut ExpertStore> {
        self.experts.as_mut()
    }

    /// Drops every queued read (after an error mid-pass) so the next pass starts clean.
    pub fn reset(&mut self) {
        if let Some(e) = self.experts.as_mut() {
            e.reset();
        }
        self.expected.clear();
        if let Some(s) = self.streamer.as_mut() {
            s.drain();
        }
    }
}
