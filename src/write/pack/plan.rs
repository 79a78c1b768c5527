//! Planning a pack: which tensors are routed experts and in what order a record holds them,
//! where every spine tensor and expert record goes on the drives (`stripe` or `spread`), and
//! the manifest that results, before any byte is written (layout in [`crate::source::pack`]).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use sha2::{Digest, Sha256};

use super::gguf;
use super::input::{absolute, PackSource};
use crate::source::pack::{
    hex, Drive, ExpertRecord, Extent, Manifest, PackTensor, SpineHeader, FORMAT_VERSION, SPINE_FILE,
};
use crate::source::tensor::TensorInfo;
use crate::store::aligned::round_up;
use crate::store::heat::Heat;

/// Alignment of every spine tensor, record and record tensor in a pack.
const ALIGN: u64 = 4096;

/// How expert records are placed on the drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PackPlacement {
    /// Every record cut into equal 4 KiB-multiple chunks, one per drive.
    Stripe,
    /// Whole records, each layer's experts dealt evenly over the drives (hottest first).
    Spread,
}

/// Options of [`write_pack`](super::write_pack).
#[derive(Clone, Debug)]
pub struct PackOptions {
    pub out: PathBuf,
    pub drives: Vec<PathBuf>,
    pub placement: PackPlacement,
    /// Per-(layer, expert) use counts to balance `spread` by (missing file: none).
    pub heat_file: Option<PathBuf>,
    /// Show a progress bar on standard error.
    pub progress: bool,
    /// Replace a finished pack in `out` made with other settings (or from a changed source);
    /// without it such a pack is left untouched and `write_pack` fails.
    pub overwrite: bool,
    /// Stop with an error after writing this many expert records in this run, as an
    /// interruption would (for tests of resuming); `None` in normal use.
    pub stop_after: Option<usize>,
}

/// The data file of drive `d` for the pack `out` (absolute): `deltafin-pack-NAME-HASH-D.bin`,
/// NAME the folder's name and HASH the first 16 hex digits of the SHA-256 of its absolute
/// path, so that packs of the same name in different folders never share a drive file.
pub(super) fn drive_file(drive: &Path, out: &Path, d: usize) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "pack".into());
    let h = hex(&Sha256::digest(out.as_os_str().as_bytes()));
    drive.join(format!("deltafin-pack-{name}-{}-{d}.bin", &h[..16]))
}

/// One record's key (layer, expert), its tensors (index, offset in the record) and its length.
type RecordLayout = ((usize, usize), Vec<(usize, u64)>, u64);

/// Plans the pack of `src` under `o`: the manifest without checksums, and for a GGUF source
/// the GGUF header that starts the spine file.
pub(super) fn plan(src: &PackSource, o: &PackOptions) -> Result<(Manifest, Option<Vec<u8>>)> {
    let nd = o.drives.len();
    if nd == 0 {
        bail!("--drives needs at least one path");
    }
    let mut spine_tensors = Vec::new();
    let mut records: BTreeMap<(usize, usize), Vec<usize>> = BTreeMap::new();
    for (i, t) in src.tensors.iter().enumerate() {
        match src.experts.key(&t.name) {
            Some(k) => records.entry(k).or_default().push(i),
            None => spine_tensors.push(i),
        }
    }
    let mut tensors: Vec<Option<PackTensor>> = vec![None; src.tensors.len()];
    let entry = |i: usize, file: usize, offset: u64| {
        let t = &src.tensors[i];
        PackTensor {
            name: t.name.clone(),
            dtype: t.ty.name().to_string(),
            ggml_type: t.ty.id(),
            shape: t.shape.clone(),
            file,
            offset,
            n_bytes: t.n_bytes,
            sha256: None,
            xxh3: None,
        }
    };
    // a GGUF source's spine file starts with its GGUF header
    let (mut spine_len, spine_align) = match &src.gguf {
        Some(g) => {
            let a = ALIGN.max(g.alignment);
            let list: Vec<&TensorInfo> = spine_tensors.iter().map(|&i| &src.tensors[i]).collect();
            (gguf::header_len(g, &list).next_multiple_of(a), a)
        }
        None => (0, ALIGN),
    };
    for &i in &spine_tensors {
        tensors[i] = Some(entry(i, 0, spine_len));
        spine_len = (spine_len + src.tensors[i].n_bytes).next_multiple_of(spine_align);
    }
    // each record's tensors (role order) and their offsets inside it
    let mut layout: Vec<RecordLayout> = Vec::new();
    for (k, mut ids) in records {
        let name = |i: usize| &src.tensors[i].name;
        ids.sort_by_key(|&i| (src.experts.role(name(i)), name(i).clone()));
        let mut off = 0u64;
        let mut end = 0u64;
        let mut placed = Vec::new();
        for i in ids {
            placed.push((i, off));
            end = off + src.tensors[i].n_bytes;
            off = round_up(end as usize, ALIGN as usize) as u64;
        }
        layout.push((k, placed, end));
    }
    let max_len = layout.iter().map(|r| r.2).max().unwrap_or(0);
    let mut drive_len = vec![0u64; nd];
    let mut experts = Vec::with_capacity(layout.len());
    let stripe_chunk = match o.placement {
        PackPlacement::Stripe => {
            let chunk =
                round_up(max_len.div_ceil(nd as u64).max(1) as usize, ALIGN as usize) as u64;
            for (r, (k, placed, len)) in layout.iter().enumerate() {
                let base = r as u64 * chunk * nd as u64;
                for &(i, off) in placed {
                    tensors[i] = Some(entry(i, nd + 1, base + off));
                }
                let mut extents = Vec::new();
                for (d, dl) in drive_len.iter_mut().enumerate() {
                    let from = d as u64 * chunk;
                    if from >= *len {
                        break;
                    }
                    let n = chunk.min(len - from);
                    extents.push(Extent {
                        drive: d,
                        offset: r as u64 * chunk,
                        len: n,
                        record_offset: from,
                    });
                    *dl = (*dl).max(r as u64 * chunk + n);
                }
                experts.push(ExpertRecord {
                    layer: k.0,
                    expert: k.1,
                    len: *len,
                    extents,
                    sha256: String::new(),
                    xxh3: None,
                });
            }
            Some(chunk)
        }
        PackPlacement::Spread => {
            let n_layers = layout.iter().map(|r| r.0 .0 + 1).max().unwrap_or(0);
            let n_exp = layout.iter().map(|r| r.0 .1 + 1).max().unwrap_or(0);
            let heat = o
                .heat_file
                .as_ref()
                .map(|p| Heat::load(p, n_layers, n_exp))
                .unwrap_or_else(|| Heat::zeros(n_layers, n_exp));
            // per layer: experts hottest first (ties by id), dealt in snake order 0..D, D..0
            let mut drive_of: HashMap<(usize, usize), usize> = HashMap::new();
            for l in 0..n_layers {
                let mut es: Vec<usize> = layout
                    .iter()
                    .filter(|r| r.0 .0 == l)
                    .map(|r| r.0 .1)
                    .collect();
                es.sort_by_key(|&e| (std::cmp::Reverse(heat.counts[l][e]), e));
                for (j, e) in es.into_iter().enumerate() {
                    let (round, pos) = (j / nd, j % nd);
                    let d = if round % 2 == 0 { pos } else { nd - 1 - pos };
                    drive_of.insert((l, e), d);
                }
            }
            for (k, placed, len) in &layout {
                let d = drive_of[k];
                let base = drive_len[d];
                for &(i, off) in placed {
                    tensors[i] = Some(entry(i, 1 + d, base + off));
                }
                drive_len[d] = base + round_up(*len as usize, ALIGN as usize) as u64;
                experts.push(ExpertRecord {
                    layer: k.0,
                    expert: k.1,
                    len: *len,
                    extents: vec![Extent {
                        drive: d,
                        offset: base,
                        len: *len,
                        record_offset: 0,
                    }],
                    sha256: String::new(),
                    xxh3: None,
                });
            }
            None
        }
    };
    let out = absolute(&o.out);
    let drives = o
        .drives
        .iter()
        .zip(&drive_len)
        .enumerate()
        .map(|(d, (p, &len))| {
            let p = absolute(p);
            Drive {
                file: drive_file(&p, &out, d).display().to_string(),
                path: p.display().to_string(),
                len,
            }
        })
        .collect();
    let tensors: Vec<PackTensor> = tensors
        .into_iter()
        .map(|t| t.expect("every tensor placed"))
        .collect();
    let header = src
        .gguf
        .as_ref()
        .map(|g| gguf::spine_header(g, &tensors))
        .transpose()?;
    let spine_header = header.as_ref().map(|h| SpineHeader {
        len: h.len() as u64,
        sha256: hex(&Sha256::digest(h)),
    });
    let m = Manifest {
        format_version: FORMAT_VERSION,
        source: src.identity.clone(),
        placement: match o.placement {
            PackPlacement::Stripe => "stripe",
            PackPlacement::Spread => "spread",
        }
        .into(),
        stripe_chunk,
        config: src.config.clone(),
        copied_files: Vec::new(),
        file_sha256: Default::default(),
        spine_file: SPINE_FILE.into(),
        spine_len,
        spine_header,
        drives,
        tensors,
        experts,
    };
    Ok((m, header))
}
