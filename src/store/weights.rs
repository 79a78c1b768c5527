//! The weight store of a model: which units are resident, which are streamed, and ordered
//! access to their bytes during a forward pass.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;

use super::aligned::{round_up, AlignedBuf, IO_ALIGN};
use super::checksum::SpineCheck;
use super::direct::DirectFile;
use super::experts::ExpertStore;
use super::streamer::{load_resident, IoStats, Streamer, Unit, UnitBytes};
use crate::quant::{fp8, GgmlType};

/// An FP8 weight of a unit to repack after every read: the E4M3 bytes (`rows × cols`) are
/// piece `weight_piece`, their 128×128 block scales (`ceil(rows/128) × ceil(cols/128)` of
/// `scale_ty`, F32 or BF16) piece `scale_piece` ([`Unit::piece_layout`]). In the repacked
/// unit both pieces are empty and the k-th pack's [`GgmlType::F8_E4M3_B128`] matrix is piece
/// `n + k`, `n` the number of pieces as read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fp8Pack {
    pub weight_piece: usize,
    pub scale_piece: usize,
    pub scale_ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
}

/// Alignment of the pieces inside a repacked unit.
const PIECE_ALIGN: usize = 64;

/// Piece sizes of the repacked unit: every raw piece (0 for FP8 weights and scales), then the
/// packed matrices.
fn packed_lens(unit: &Unit, packs: &[Fp8Pack]) -> Vec<usize> {
    let mut lens: Vec<usize> = unit.piece_layout().iter().map(|p| p.1).collect();
    for p in packs {
        lens[p.weight_piece] = 0;
        lens[p.scale_piece] = 0;
    }
    lens.extend(
        packs
            .iter()
            .map(|p| p.rows * fp8::row_bytes(p.cols).expect("row size")),
    );
    lens
}

/// Repacks the raw bytes `raw` of `unit` (as read: FP8 weights and their block scales) into
/// `buf` (at least [`WeightStore::resident_size`] bytes): raw pieces copied, each pack's
/// weight and scale pieces left empty and its [`GgmlType::F8_E4M3_B128`] rows appended as
/// piece `n + k`, `n` the number of pieces as read (see [`Fp8Pack`]).
pub fn repack_fp8(
    raw: &UnitBytes,
    unit: &Unit,
    packs: &[Fp8Pack],
    mut buf: AlignedBuf,
) -> UnitBytes {
    let lens = packed_lens(unit, packs);
    let mut pieces = Vec::with_capacity(lens.len());
    let mut pos = 0;
    for &l in &lens {
        pieces.push((pos, l));
        pos += round_up(l, PIECE_ALIGN);
    }
    let n = lens.len() - packs.len();
    let out = buf.as_mut_slice();
    for (i, &(start, l)) in pieces[..n].iter().enumerate() {
        if l > 0 {
            out[start..start + l].copy_from_slice(raw.piece(i));
        }
    }
    for (k, p) in packs.iter().enumerate() {
        let (start, l) = pieces[n + k];
        fp8::pack_rows(
            raw.piece(p.weight_piece),
            raw.piece(p.scale_piece),
            p.scale_ty,
            p.rows,
            p.cols,
            &mut out[start..start + l],
        );
    }
    UnitBytes::from_parts(buf, pieces)
}

/// A check of a resident unit's bytes as read, before any repacking: `(unit index, bytes)`;
/// an error ends the load (e.g. a pack expert whose checksum does not match).
pub type ResidentCheck<'a> = dyn Fn(usize, &UnitBytes) -> io::Result<()> + 'a;

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
    /// FP8 weights to repack, per unit (empty for most).
    packs: Vec<Vec<Fp8Pack>>,
    /// Reusable buffer for repacking streamed units.
    pack_buf: Option<AlignedBuf>,
    expected: VecDeque<usize>,
    stats: Arc<IoStats>,
    resident_bytes: usize,
    experts: Option<ExpertStore>,
    /// Checks every streamed read of a pack's spine ([`WeightStore::set_spine_check`]).
    spine: Option<SpineCheck>,
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
        let packs = vec![Vec::new(); units.len()];
        let elsewhere = vec![false; units.len()];
        Self::open_full(
            files,
            units,
            packs,
            resident,
            &elsewhere,
            slots,
            extra_slot_bytes,
            direct,
            None,
        )
    }

    /// Bytes of RAM unit `unit` holds when resident: its aligned read spans, or, with FP8
    /// `packs`, its repacked pieces (FP8 weights as [`GgmlType::F8_E4M3_B128`], 3.1% over
    /// the stored bytes).
    pub fn resident_size(unit: &Unit, packs: &[Fp8Pack]) -> usize {
        if packs.is_empty() {
            return unit.buffer_bytes();
        }
        let total: usize = packed_lens(unit, packs)
            .iter()
            .map(|&l| round_up(l, PIECE_ALIGN))
            .sum();
        round_up(total.max(1), IO_ALIGN)
    }

    /// The general form of [`WeightStore::open`]:
    /// - FP8 weights to repack (`packs[i]` for unit `i`): resident units are repacked once at
    ///   load (the raw bytes are dropped), streamed ones after each read into one reusable
    ///   buffer the size of the largest repacked streamed unit;
    /// - units flagged in `elsewhere` belong to an [`ExpertStore`] (attach it with
    ///   [`WeightStore::attach_experts`]): they are neither read nor streamed here and size no
    ///   stream or repack buffer (the expert store repacks them itself, see
    ///   [`ExpertStore::set_transform`]);
    /// - `check` sees each resident unit's bytes as read, before repacking.
    ///
    /// Errors: as [`WeightStore::open`]; `check` refuses a resident unit.
    #[allow(clippy::too_many_arguments)]
    pub fn open_full(
        files: &[std::path::PathBuf],
        units: Vec<Unit>,
        packs: Vec<Vec<Fp8Pack>>,
        resident: &[bool],
        elsewhere: &[bool],
        slots: usize,
        extra_slot_bytes: usize,
        direct: bool,
        check: Option<&ResidentCheck>,
    ) -> io::Result<Self> {
        assert_eq!(units.len(), resident.len());
        assert_eq!(units.len(), packs.len());
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
        let planned = units.iter().zip(resident).zip(elsewhere);
        super::streamer::plan_resident_bytes(
            planned
                .filter(|((_, &r), &x)| r && !x)
                .map(|((u, _), _)| u.buffer_bytes() as u64)
                .sum(),
        );
        for ((u, &r), &x) in units.iter().zip(resident).zip(elsewhere) {
            if x {
                residency.push(Residency::Elsewhere);
            } else if r {
                let mut b = load_resident(&dfiles, u, &stats)?;
                if let Some(c) = check {
                    c(residency.len(), &b)?;
                }
                if !packs[residency.len()].is_empty() {
                    let p = &packs[residency.len()];
                    let buf = AlignedBuf::new(Self::resident_size(u, p));
                    b = repack_fp8(&b, u, p, buf);
                }
                resident_bytes += b.buffer_bytes();
                residency.push(Residency::Resident(b));
            } else {
                slot = slot.max(u.buffer_bytes());
                residency.push(Residency::Streamed);
            }
        }
        let pack_max = (0..units.len())
            .filter(|&i| !packs[i].is_empty() && !resident[i] && !elsewhere[i])
            .map(|i| Self::resident_size(&units[i], &packs[i]))
            .max();
        let any_streamed =
            resident.iter().zip(elsewhere).any(|(r, x)| !r && !x) || extra_slot_bytes > 0;
        let streamer = any_streamed.then(|| Streamer::new(dfiles, slots, slot, stats.clone()));
        Ok(Self {
            units: units.into_iter().map(Arc::new).collect(),
            residency,
            streamer,
            packs,
            pack_buf: pack_max.map(AlignedBuf::new),
            expected: VecDeque::new(),
            stats,
            resident_bytes,
            experts: None,
            spine: None,
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
            + self.pack_buf.as_ref().map_or(0, |b| b.capacity())
    }

    /// Replaces the bytes of resident unit `id` by `f(bytes)` (a re-encoding done once at load,
    /// e.g. Hugging Face MXFP4 repacked into the GGML block layout); the resident byte total
    /// follows. Panics if the unit is streamed.
    pub fn transform_resident(&mut self, id: usize, f: impl FnOnce(&UnitBytes) -> UnitBytes) {
        let Residency::Resident(b) = &self.residency[id] else {
            panic!("unit {id} is not resident");
        };
        let nb = f(b);
        self.resident_bytes = self.resident_bytes - b.buffer_bytes() + nb.buffer_bytes();
        self.residency[id] = Residency::Resident(nb);
    }

    /// The shared I/O counters.
    pub fn stats(&self) -> &Arc<IoStats> {
        &self.stats
    }

    /// The unit table.
    pub fn unit(&self, id: usize) -> &Unit {
        &self.units[id]
    }

    /// Queues what a pass reads after a MoE layer's experts ([`NextReads`]): its units in
    /// order, then the expert store's prefetch of guessed experts or read-ahead of a whole
    /// layer. The step of a layer's plan that follows its experts
    /// (`models::moe::plan_in_store`), so the experts' reads go first.
    pub fn plan_next(&mut self, next: &NextReads) {
        self.plan(next.units.iter().copied());
        let Some(es) = self.experts_mut() else {
            return;
        };
        match &next.experts {
            NextExperts::None => {}
            NextExperts::ReadAhead { layer } => es.read_ahead(*layer),
            NextExperts::Prefetch { layer, guesses } => es.prefetch(*layer, guesses),
        }
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

    /// The bytes of unit `id` when it is resident (`None` when streamed or held elsewhere).
    pub fn resident(&self, id: usize) -> Option<&UnitBytes> {
        match &self.residency[id] {
            Residency::Resident(b) => Some(b),
            _ => None,
        }
    }

    /// Runs `f` on the bytes of unit `id`: at once when resident, else after its read lands.
    /// Streamed units must be taken in the order they were planned.
    ///
    /// Errors: the unit's read failed (the message names the file and range); with a spine
    /// check ([`WeightStore::set_spine_check`]), its spine bytes do not match the pack's
    /// checksums (`InvalidData`, naming the spine file, the tensor and both checksums).
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
        let checked = s.next_unit().and_then(|b| {
            // ad-hoc units (single embedding rows) are not checked: see `SpineCheck`
            match (&self.spine, id) {
                (Some(c), id) if id != usize::MAX => match c.check_unit(&self.units[id], &b) {
                    Ok(()) => Ok(b),
                    Err(e) => {
                        s.recycle(b);
                        Err(e)
                    }
                },
                _ => Ok(b),
            }
        });
        let b = match checked {
            Ok(b) => b,
            Err(e) => {
                self.expected.clear();
                s.drain();
                if let Some(c) = &self.spine {
                    c.reset();
                }
                return Err(e);
            }
        };
        if id != usize::MAX && !self.packs[id].is_empty() {
            let buf = self.pack_buf.take().expect("repack buffer");
            let p = repack_fp8(&b, &self.units[id], &self.packs[id], buf);
            s.recycle(b);
            let r = f(&p);
            self.pack_buf = Some(p.into_buf());
            return Ok(r);
        }
        let r = f(&b);
        s.recycle(b);
        Ok(r)
    }

    /// Checks every streamed unit's spine ranges as it lands, before use (a pack's spine
    /// tensors against the manifest's checksums): a mismatch fails the pass that reads it
    /// ([`WeightStore::with_unit`]'s error names the spine file, the tensor and both
    /// checksums). Resident units are checked at load by [`WeightStore::open_full`]'s `check`.
    pub fn set_spine_check(&mut self, check: SpineCheck) {
        self.spine = Some(check);
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
        if let Some(c) = &self.spine {
            c.reset();
        }
    }
}

/// What a pass reads next after a MoE layer's routed experts, decided before they are planned
/// and queued right after them by [`WeightStore::plan_next`]: the units that come next (the
/// layer's tail, the next layer's spine unit or the LM head's chunks), then at most one step
/// for the expert store.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NextReads {
    /// Weight units, in the order the pass uses them.
    pub units: Vec<usize>,
    /// The expert store's step after them.
    pub experts: NextExperts,
}

/// The expert store's step after a MoE layer's experts ([`NextReads`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub enum NextExperts {
    /// Nothing (no expert store, prefetch off, or no guess).
    #[default]
    None,
    /// Start reading the guessed experts `guesses` (best first) of MoE layer `layer`
    /// ([`crate::store::ExpertStore::prefetch`]).
    Prefetch { layer: usize, guesses: Vec<usize> },
    /// Read MoE layer `layer` ahead whole, in file order (a long batch:
    /// [`crate::store::ExpertStore::read_ahead`]).
    ReadAhead { layer: usize },
}
