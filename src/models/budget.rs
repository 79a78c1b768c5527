//! Placing a Mixture-of-Experts model's weights under the RAM budget, shared by the families
//! whose routed experts are read on demand (`qwen3` and its relatives, `deepseek_v3`,
//! `gpt_oss`, from either format): the budget split, the LM head and embeddings, and the
//! [`WeightStore`] opened with an [`ExpertStore`] attached.
//!
//! The budget is charged in this order (docs/memory.md): KV cache and activations,
//! two stream buffers the size of the largest streamed unit (plus one repacked FP8 unit when
//! any streamed unit is repacked), one expert I/O buffer per expert a token takes
//! (`num_experts_per_tok`, plus one that a re-encoding keeps for its next output), then
//! resident weights (LM head, embeddings, spine layers in order, greedily); whatever is left
//! is the expert cache. When the budget holds every weight, nothing is streamed and there is no
//! expert store; otherwise routed experts are never resident: every one is read on demand.
//! When everything but the routed experts fits beside the expert I/O buffers, no stream
//! buffers are set aside (nothing else is streamed) and the cache gets their share.

use std::collections::HashMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Result};

use super::embed_head::{head_chunks, whole, Embedding, Head};
use super::loading::{unit_of, CheckpointFiles};
use super::needs::{MemoryNeeds, Reserved};
use super::{LoadOptions, Placement};
use crate::source::pack::PackInfo;
use crate::source::tensor::TensorInfo;
use crate::store::aligned::round_up;
use crate::store::checksum::SpineCheck;
use crate::store::experts::expert_layout;
use crate::store::plan::{choose_resident, Candidate};
use crate::store::{
    repack_fp8, AlignedBuf, ExpertStore, ExpertTransform, Fp8Pack, Unit, UnitBytes, WeightStore,
    IO_ALIGN,
};

/// Stream buffers used when any weight is streamed.
pub(super) const STREAM_SLOTS: usize = 2;

/// A model's weight units before placement: spine units first (`..n_spine`: a layer's
/// attention with its dense MLP or its router and shared experts), then one unit per (layer,
/// routed expert).
pub(super) struct WeightUnits {
    pub units: Vec<Unit>,
    /// FP8 weights to repack, per unit (see [`Fp8Pack`]); empty lists for other units.
    pub packs: Vec<Vec<Fp8Pack>>,
    pub n_spine: usize,
    /// `experts[layer][e]`: index in `units` of routed expert `e` of `layer`; empty for layers
    /// without routed experts.
    pub experts: Vec<Vec<usize>>,
}

impl WeightUnits {
    /// The spine units `spine` followed by the routed experts' units `experts`, none with FP8
    /// packs; `table[layer][e].0`, expert `e`'s index in `experts` on entry, becomes its index
    /// among all units.
    pub fn new<T>(spine: Vec<Unit>, experts: Vec<Unit>, table: &mut [Vec<(usize, T)>]) -> Self {
        let n_spine = spine.len();
        for le in table.iter_mut() {
            le.iter_mut().for_each(|(u, _)| *u += n_spine);
        }
        let mut units = spine;
        units.extend(experts);
        Self {
            packs: vec![Vec::new(); units.len()],
            units,
            n_spine,
            experts: table
                .iter()
                .map(|le| le.iter().map(|(u, _)| *u).collect())
                .collect(),
        }
    }
}

/// The LM head and the token embeddings (`[hidden, vocab]` each) and their units.
pub(super) struct HeadTensors<'a> {
    pub head: &'a TensorInfo,
    pub head_unit: Unit,
    pub embd: &'a TensorInfo,
    pub embd_unit: Unit,
    /// The head is the embeddings' tensor.
    pub tied: bool,
}

impl<'a> HeadTensors<'a> {
    /// The LM head `head` and the embeddings `embd` of a checkpoint read through `files`,
    /// each one unit of its own (relocated into the files' pack); `tied`: `head` is `embd`.
    pub fn new(
        files: &CheckpointFiles,
        head: &'a TensorInfo,
        embd: &'a TensorInfo,
        tied: bool,
    ) -> Self {
        Self {
            head,
            head_unit: files.relocate(&unit_of(&[head]).0),
            embd,
            embd_unit: files.relocate(&unit_of(&[embd]).0),
            tied,
        }
    }
}

/// How routed experts are read when the budget cannot hold every weight.
pub(super) struct OnDemand {
    /// Experts one token takes (`num_experts_per_tok`): the number of expert I/O buffers.
    pub per_tok: usize,
    /// A re-encoding of each expert after its read ([`ExpertStore::set_transform`]) and the
    /// bytes of the largest re-encoded expert, besides FP8 repacking (which [`place`] sets up
    /// itself from [`WeightUnits::packs`]).
    pub transform: Option<(ExpertTransform, usize)>,
    /// The pack the files belong to: names its drive files in errors, and with
    /// `--verify-experts` checks each expert read against its checksum
    /// ([`PackInfo::attach`]).
    pub pack: Option<Arc<PackInfo>>,
}

/// Text the placement summary adds: after "N/M experts resident" (e.g. the expert encoding)
/// and at the end (e.g. ignored layers).
#[derive(Default)]
pub(super) struct Notes<'a> {
    pub experts: &'a str,
    pub tail: &'a str,
}

/// What [`place`] returns.
pub(super) struct Placed {
    pub store: WeightStore,
    pub head: Head,
    pub embedding: Embedding,
    pub placement: Placement,
}

/// The budget's split (see the module header).
#[derive(Debug, PartialEq, Eq)]
struct Split {
    /// Residency of each candidate: head candidates, then every weight unit (experts `false`
    /// when read on demand).
    flags: Vec<bool>,
    /// Bytes of each stream buffer (0: nothing streamed).
    stream_slot: usize,
    /// Whether routed experts go to an expert store.
    on_demand: bool,
    /// Expert I/O buffers and their bytes in all.
    io_slots: usize,
    io_bytes: usize,
    cache_bytes: usize,
}

/// Splits `budget` (`None`: everything resident): `heads` are the LM head and embeddings
/// candidates, `sizes[i]` the RAM unit `i` holds when resident (repacked), `bufs[i]` its read
/// buffer, `packed[i]` whether it is repacked after a streamed read; `out_bytes` the largest
/// re-encoded expert when experts are re-encoded; with `prefetch`, as many I/O buffers again
/// hold prefetched experts.
///
/// Errors: the budget cannot hold the KV cache, activations, stream and expert I/O buffers
/// (the message gives each in MiB).
#[allow(clippy::too_many_arguments)]
fn split(
    budget: Option<u64>,
    r: &Reserved,
    heads: Vec<Candidate>,
    sizes: &[usize],
    bufs: &[usize],
    packed: &[bool],
    n_spine: usize,
    per_tok: usize,
    out_bytes: Option<usize>,
    prefetch: bool,
) -> Result<Split> {
    let n_units = sizes.len();
    let n_heads = heads.len();
    let fixed = r.kv_bytes + r.scratch_bytes;
    let total: usize = heads.iter().map(|c| c.bytes).sum::<usize>() + sizes.iter().sum::<usize>();
    let Some(b) = budget.map(|b| b as usize).filter(|&b| fixed + total > b) else {
        return Ok(Split {
            flags: vec![true; n_heads + n_units],
            stream_slot: 0,
            on_demand: false,
            io_slots: 0,
            io_bytes: 0,
            cache_bytes: 0,
        });
    };
    let on_demand = n_units > n_spine;
    let n_cands = if on_demand { n_spine } else { n_units };
    let stream_slot = bufs[..n_cands]
        .iter()
        .copied()
        .max()
        .unwrap_or(0)
        .max(IO_ALIGN * 4);
    let pack_max = (0..n_cands)
        .filter(|&i| packed[i])
        .map(|i| sizes[i])
        .max()
        .unwrap_or(0);
    let stream_buf = STREAM_SLOTS * stream_slot + pack_max;
    let (io_slots, io_bytes) = if on_demand {
        let expert_buf = bufs[n_spine..].iter().copied().max().unwrap_or(0);
        let slot = expert_buf.max(round_up(out_bytes.unwrap_or(0), IO_ALIGN));
        let slots = per_tok.max(1);
        let buffers = slots * (1 + prefetch as usize) + out_bytes.is_some() as usize;
        (slots, buffers * slot)
    } else {
        (0, 0)
    };
    let mut cands = heads;
    cands.extend(
        sizes[..n_cands]
            .iter()
            .enumerate()
            .map(|(i, &bytes)| Candidate {
                name: format!("unit {i}"),
                bytes,
            }),
    );
    let spine: usize = cands.iter().map(|c| c.bytes).sum();
    if on_demand && fixed + io_bytes + spine <= b {
        // everything but the experts fits beside their I/O buffers: nothing is streamed
        let mut flags = vec![true; cands.len()];
        flags.resize(n_heads + n_units, false);
        return Ok(Split {
            flags,
            stream_slot: 0,
            on_demand,
            io_slots,
            io_bytes,
            cache_bytes: b - fixed - io_bytes - spine,
        });
    }
    let need = fixed + stream_buf + io_bytes;
    if need > b {
        let mib = |x: usize| crate::store::plan::size_text(x as u64);
        return Err(super::BudgetTooSmall {
            budget: b as u64,
            need: need as u64,
            parts: format!(
                "the KV cache for {} tokens ({}), activations ({}), stream buffers ({}) and expert I/O buffers ({})",
                r.n_ctx,
                mib(r.kv_bytes),
                mib(r.scratch_bytes),
                mib(stream_buf),
                mib(io_bytes),
            ),
        }
        .into());
    }
    let (mut flags, used) = choose_resident(&cands, b - need);
    flags.resize(n_heads + n_units, false);
    Ok(Split {
        flags,
        stream_slot,
        on_demand,
        io_slots,
        io_bytes,
        cache_bytes: b - need - used,
    })
}

/// An [`ExpertTransform`] from `f(layer, expert, bytes as read, out)`, which re-encodes into
/// the buffer `out`: each read's buffer is kept as the next output, so re-encoding allocates
/// one buffer in all (the first output, the size of a read buffer).
pub(super) fn recycling_transform(
    mut f: impl FnMut(usize, usize, &UnitBytes, AlignedBuf) -> UnitBytes + Send + 'static,
) -> ExpertTransform {
    let mut spare: Option<AlignedBuf> = None;
    Box::new(move |layer, expert, raw| {
        let out = spare
            .take()
            .unwrap_or_else(|| AlignedBuf::new(raw.buffer_bytes()));
        let t = f(layer, expert, &raw, out);
        spare = Some(raw.into_buf());
        t
    })
}

/// The re-encoding of routed experts holding FP8 weights (`packs[unit]`, repacked as
/// [`repack_fp8`] does for resident units) and the bytes of the largest repacked expert;
/// `None` when no expert holds any.
fn fp8_transform(
    units: &[Unit],
    packs: &[Vec<Fp8Pack>],
    experts: &[Vec<usize>],
) -> Option<(ExpertTransform, usize)> {
    let out = experts
        .iter()
        .flatten()
        .filter(|&&u| !packs[u].is_empty())
        .map(|&u| WeightStore::resident_size(&units[u], &packs[u]))
        .max()?;
    let table: Vec<Vec<(Unit, Vec<Fp8Pack>)>> = experts
        .iter()
        .map(|le| {
            le.iter()
                .map(|&u| (units[u].clone(), packs[u].clone()))
                .collect()
        })
        .collect();
    let t = recycling_transform(move |layer, e, raw, buf| {
        let (u, p) = &table[layer][e];
        repack_fp8(raw, u, p, buf)
    });
    Some((t, out))
}

/// Payload bytes of the units that are not resident (`resident[i]` false for `units[i]`),
/// but for those whose index is in `skip`.
pub(super) fn streamed_payload(units: &[Unit], resident: &[bool], skip: Range<usize>) -> usize {
    units
        .iter()
        .zip(resident)
        .enumerate()
        .filter(|(i, (_, r))| !**r && !skip.contains(i))
        .map(|(_, (u, _))| u.payload_bytes())
        .sum()
}

/// Places the weights of `w` (read from `files`) and the head under `opts.ram_budget` (see
/// the module header) beside the RAM `needs` reserves for `opts` ([`MemoryNeeds::reserve`]),
/// reads the resident units (repacking FP8 ones) and opens the stores: the streamer when
/// anything is streamed, the expert store (with `od`'s re-encoding and checksums) when routed
/// experts are read on demand.
///
/// Errors: a budget too small for KV cache, activations, stream and expert I/O buffers; a
/// file that cannot be opened, is shorter than an expert's bytes (named with the (layer,
/// expert)) or fails a resident read; `--io-engine uring` without io_uring.
pub(super) fn place(
    opts: &LoadOptions,
    files: &[PathBuf],
    w: WeightUnits,
    h: HeadTensors,
    needs: MemoryNeeds,
    od: OnDemand,
    notes: Notes,
) -> Result<Placed> {
    let r = needs.reserve(opts);
    let WeightUnits {
        mut units,
        mut packs,
        n_spine,
        experts,
    } = w;
    let n_weight = units.len();
    let sizes: Vec<usize> = units
        .iter()
        .zip(&packs)
        .map(|(u, p)| WeightStore::resident_size(u, p))
        .collect();
    let bufs: Vec<usize> = units.iter().map(|u| u.buffer_bytes()).collect();
    let packed: Vec<bool> = packs.iter().map(|p| !p.is_empty()).collect();
    let mut heads = vec![Candidate {
        name: "LM head".into(),
        bytes: h.head_unit.buffer_bytes(),
    }];
    if !h.tied {
        heads.push(Candidate {
            name: "embeddings".into(),
            bytes: h.embd_unit.buffer_bytes(),
        });
    }
    let n_heads = heads.len();
    assert!(
        od.transform.is_none() || packs[n_spine..].iter().all(|p| p.is_empty()),
        "two re-encodings of the same experts"
    );
    let transform = od
        .transform
        .or_else(|| fp8_transform(&units, &packs, &experts));
    let out_bytes = transform.as_ref().map(|t| t.1);
    let prefetch = opts
        .experts
        .prefetch
        .enabled(expert_layout(files, &units[n_spine..]));
    let s = split(
        opts.ram_budget,
        &r,
        heads,
        &sizes,
        &bufs,
        &packed,
        n_spine,
        od.per_tok,
        out_bytes,
        prefetch,
    )?;
    let head_resident = s.flags[0];
    let embd_resident = if h.tied { head_resident } else { s.flags[1] };
    let mut resident: Vec<bool> = s.flags[n_heads..].to_vec();
    let head = if head_resident {
        units.push(h.head_unit);
        packs.push(Vec::new());
        resident.push(true);
        Head::Resident {
            unit: units.len() - 1,
            mat: whole(h.head),
        }
    } else {
        let mut chunks = Vec::new();
        for (u, r0, m) in head_chunks(h.head, s.stream_slot) {
            units.push(u);
            packs.push(Vec::new());
            resident.push(false);
            chunks.push((units.len() - 1, r0, m));
        }
        Head::Chunks(chunks)
    };
    let embedding = match (&head, embd_resident, h.tied) {
        (Head::Resident { unit, mat }, true, true) => Embedding::Resident {
            unit: *unit,
            mat: *mat,
        },
        (_, true, _) => {
            units.push(h.embd_unit);
            packs.push(Vec::new());
            resident.push(true);
            Embedding::Resident {
                unit: units.len() - 1,
                mat: whole(h.embd),
            }
        }
        (_, false, _) => Embedding::Streamed(h.embd.clone()),
    };
    let streamed_bytes = streamed_payload(&units, &resident, 0..0);
    let spine_streamed_bytes = streamed_payload(&units, &resident, n_spine..n_weight);
    let count = |r: &[bool]| r.iter().filter(|r| **r).count();
    let (res_spine, res_experts) = (
        count(&resident[..n_spine]),
        count(&resident[n_spine..n_weight]),
    );
    let elsewhere: Vec<bool> = (0..units.len())
        .map(|i| s.on_demand && (n_spine..n_weight).contains(&i))
        .collect();
    let table: Vec<Vec<Arc<Unit>>> = match s.on_demand {
        true => experts
            .iter()
            .map(|le| le.iter().map(|&u| Arc::new(units[u].clone())).collect())
            .collect(),
        false => Vec::new(),
    };
    // verification (on by default for a pack, off with --no-verify-experts): resident
    // experts are checked as they are read (the expert store checks the others as they
    // land), and the pack's copied files now
    let verify = match (&od.pack, opts.experts.verify) {
        (Some(p), true) => {
            p.verify_copied()?;
            Some(p.clone())
        }
        (None, true) if experts.iter().any(|l| !l.is_empty()) => bail!(
            "--verify-experts: {} is not part of a pack (only packs carry checksums to verify)",
            files
                .first()
                .map(|f| f.display().to_string())
                .unwrap_or_default()
        ),
        _ => None,
    };
    let mut owner: HashMap<usize, (usize, usize, Vec<usize>)> = HashMap::new();
    if verify.is_some() {
        for (l, le) in experts.iter().enumerate() {
            for (e, &u) in le.iter().enumerate() {
                let files = units[u].ranges.iter().map(|r| r.file).collect();
                owner.insert(u, (l, e, files));
            }
        }
    }
    // and every spine read (resident units here, streamed ones as they land)
    let spine_units = verify.as_ref().map(|_| units.clone());
    let spine_check = verify.as_ref().map(|p| SpineCheck::new(p.spine.clone()));
    let check = |u: usize, b: &UnitBytes| -> std::io::Result<()> {
        if let (Some(c), Some(us)) = (&spine_check, &spine_units) {
            c.check_unit(&us[u], b)?;
        }
        let (Some(p), Some((l, e, f))) = (&verify, owner.get(&u)) else {
            return Ok(());
        };
        match p.expert_mismatch(*l, *e, b.record(), f) {
            Some(msg) => Err(std::io::Error::new(std::io::ErrorKind::InvalidData, msg)),
            None => Ok(()),
        }
    };
    let mut store = WeightStore::open_full(
        files,
        units,
        packs,
        &resident,
        &elsewhere,
        STREAM_SLOTS,
        s.stream_slot,
        opts.direct_io,
        Some(&check),
    )?;
    drop(spine_units);
    if let Some(p) = &verify {
        store.set_spine_check(SpineCheck::new(p.spine.clone()));
    }
    let mut expert_note = String::new();
    if s.on_demand {
        let mut es = ExpertStore::new(
            files,
            opts.direct_io,
            table,
            s.io_slots,
            s.cache_bytes,
            &opts.experts,
            store.stats().clone(),
        )?;
        if let Some(p) = &od.pack {
            p.attach(&mut es, opts.experts.verify)?;
        }
        if let Some((t, out)) = transform {
            es.set_transform(t, out);
        }
        expert_note = format!(
            "; experts read on demand through {}, cache {} of {:.1} MiB",
            es.engine().describe(),
            es.cache().policy(),
            es.cache().budget() as f64 / 1048576.0
        );
        store.attach_experts(es);
    }
    if let Some(p) = &od.pack {
        expert_note.push_str(&p.check_note(opts.experts.verify));
    }
    let placement = Placement {
        resident_bytes: store.resident_bytes(),
        streamed_bytes,
        spine_streamed_bytes,
        stream_buffer_bytes: store.stream_buffer_bytes() + s.io_bytes,
        kv_bytes: r.kv_bytes,
        scratch_bytes: r.scratch_bytes,
        summary: format!(
            "{res_spine}/{n_spine} layers and {res_experts}/{} experts resident{}, LM head {}{}{}{expert_note}",
            n_weight - n_spine,
            notes.experts,
            if head_resident { "resident" } else { "streamed" },
            if h.tied { " (tied to embeddings)" } else { "" },
            notes.tail,
        ),
        numerics: Default::default(),
        kv_on_device: false,
        device_bytes: 0,
    };
    Ok(Placed {
        store,
        head,
        embedding,
        placement,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: usize = 4096;

    fn heads() -> Vec<Candidate> {
        vec![Candidate {
            name: "LM head".into(),
            bytes: 40_000,
        }]
    }

    const R: Reserved = Reserved {
        kv_bytes: 100_000,
        scratch_bytes: 20_000,
        n_ctx: 64,
    };

    /// 3 spine units of 32 KiB, 4 experts of 16 KiB (the second and third repacked to 20 KiB):
    /// resident sizes, read buffers, repacked.
    fn units() -> (Vec<usize>, Vec<usize>, Vec<bool>) {
        let bufs = vec![8 * K, 8 * K, 8 * K, 4 * K, 4 * K, 4 * K, 4 * K];
        let mut sizes = bufs.clone();
        sizes[4] = 5 * K;
        sizes[5] = 5 * K;
        let packed = sizes.iter().zip(&bufs).map(|(s, b)| s != b).collect();
        (sizes, bufs, packed)
    }

    /// [`split`] of [`units`] with 3 spine units and top-2 experts, without prefetch.
    fn split3(b: usize, out: Option<usize>) -> Result<Split> {
        split_p(b, out, false)
    }

    /// [`split3`] with or without prefetch.
    fn split_p(b: usize, out: Option<usize>, prefetch: bool) -> Result<Split> {
        let (sizes, bufs, packed) = units();
        let (s, p) = (&sizes, &packed);
        split(
            Some(b as u64),
            &R,
            heads(),
            s,
            &bufs,
            p,
            3,
            2,
            out,
            prefetch,
        )
    }

    #[test]
    fn a_budget_holding_everything_streams_nothing() {
        let (sizes, bufs, packed) = units();
        let all = 120_000 + 40_000 + sizes.iter().sum::<usize>();
        for b in [None, Some(all as u64)] {
            let s = split(b, &R, heads(), &sizes, &bufs, &packed, 3, 2, None, false).unwrap();
            assert_eq!(s.flags, vec![true; 8]);
            assert!(!s.on_demand && s.stream_slot == 0 && s.cache_bytes == 0);
        }
        assert!(split3(all - 1, None).unwrap().on_demand);
    }

    #[test]
    fn a_smaller_budget_reads_experts_on_demand_and_caches_the_rest() {
        // stream buffers 2 × 32 KiB, 2 I/O buffers of 16 KiB; the head resident, 1000 left
        let need = 120_000 + 2 * 8 * K + 2 * 4 * K;
        let b = need + 40_000 + 1000;
        let s = split3(b, None).unwrap();
        assert_eq!(
            s.flags,
            [true, false, false, false, false, false, false, false]
        );
        assert_eq!((s.stream_slot, s.io_slots, s.io_bytes), (8 * K, 2, 8 * K));
        assert_eq!(s.cache_bytes, 1000);
        // experts re-encoded into up to 20 KiB + 1: I/O buffers of 24 KiB, plus the one the
        // re-encoding keeps; 40 KiB more, so the head no longer fits
        let s = split3(b, Some(20 * 1024 + 1)).unwrap();
        assert_eq!((s.io_slots, s.io_bytes), (2, 3 * 6 * K));
        assert_eq!(s.flags, vec![false; 8]);
        assert_eq!(s.cache_bytes, 40_000 + 1000 - 10 * K);
        // prefetch: as many I/O buffers again (2 × 16 KiB more), so the head no longer fits
        let s = split_p(b, None, true).unwrap();
        assert_eq!((s.io_slots, s.io_bytes), (2, 4 * 4 * K));
        assert_eq!(s.flags, vec![false; 8]);
        assert_eq!(s.cache_bytes, 40_000 + 1000 - 8 * K);
        let e = split3(need - 1, None).unwrap_err().to_string();
        // one byte short: the sizes round to the same text, so the bytes are given
        assert_eq!(
            e,
            format!("--ram-budget {} bytes is too small: the KV cache for 64 tokens (97.7 KiB), activations (19.5 KiB), stream buffers (64.0 KiB) and expert I/O buffers (32.0 KiB) need at least {need} bytes", need - 1)
        );
    }

    #[test]
    fn a_spine_that_fits_needs_no_stream_buffers() {
        // head 40000 + spine 96 KiB beside 2 I/O buffers of 16 KiB, with 5 bytes to spare;
        // with 64 KiB of stream buffers only the head would have fitted
        let s = split3(120_000 + 8 * K + 40_000 + 24 * K + 5, None).unwrap();
        assert_eq!(
            s.flags,
            [true, true, true, true, false, false, false, false]
        );
        assert!(s.on_demand);
        assert_eq!((s.stream_slot, s.io_bytes, s.cache_bytes), (0, 8 * K, 5));
    }

    #[test]
    fn a_streamed_repacked_unit_needs_a_buffer_of_its_own() {
        let (sizes, bufs, packed) = units();
        // the spine alone, unpacked: 2 stream buffers of 32 KiB, nothing on demand
        let (s3, b3, p3) = (&sizes[..3], &bufs[..3], &packed[..3]);
        let s = split(Some(200_000), &R, heads(), s3, b3, p3, 3, 2, None, false).unwrap();
        assert!(!s.on_demand && s.io_bytes == 0);
        assert_eq!(s.stream_slot, 8 * K);
        // every unit streamed through the streamer (none routed): 2 × 32 KiB plus the largest
        // repacked unit, 20 KiB
        let e = split(
            Some(190_000),
            &R,
            heads(),
            &sizes,
            &bufs,
            &packed,
            7,
            2,
            None,
            false,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("stream buffers (84.0 KiB)"), "{e}");
        assert!(
            e.starts_with("--ram-budget 185.5 KiB is too small: "),
            "{e}"
        );
        assert!(e.ends_with("need at least 201.2 KiB"), "{e}");
    }
}
