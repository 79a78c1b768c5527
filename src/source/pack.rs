//! Deltafin packs: a model re-laid out for one read per expert (format version 1).
//!
//! A pack is a folder holding `manifest.json`, `spine.bin` (every tensor that is not a routed
//! expert, each at a 4 KiB boundary), the source's `config.json` and tokenizer files, plus one
//! expert data file per drive (`DRIVE/deltafin-pack-NAME-D.bin`). Each routed expert is one
//! *record*: its gate, up and down tensors (and any scales), each at a 4 KiB boundary inside the
//! record, with zeros between them; a record starts at a 4 KiB boundary, so an expert is one
//! read (`spread`: the whole record on one drive) or one read per drive (`stripe`: the record
//! cut into equal 4 KiB-multiple chunks, chunk `d` on drive `d`).
//!
//! The manifest keeps the source's tensor index (name, GGML type, shape) with each tensor's
//! place in the pack's *logical* files: 0 is `spine.bin`, `1..=D` the drive files and, for
//! `stripe`, `D + 1` a virtual file striped over the drives (see [`crate::store::relocate`]).
//! Model loaders build units from that index exactly as for the source; the stores map them to
//! physical reads, and name a drive file in their errors as `drive D (PATH), file FILE`.
//! Checksums are SHA-256 (already a dependency, hardware-accelerated on x86 with SHA-NI at over
//! 1 GB/s, and strong enough that a corrupt record can never pass): one per expert record over
//! its bytes up to the end of its last tensor, one per spine tensor.
//!
//! Sources: Hugging Face folders (`format: "hf"`, opened with [`open_pack`]) and GGUF files
//! (`format: "gguf"`, opened with [`open_gguf_pack`]). Stacked experts (GGUF
//! `blk.L.ffn_{gate,up,down}_exps.*`, Hugging Face GPT-OSS `mlp.experts.gate_up_proj…`) are
//! listed per expert (`NAME[E]`, expert E's slices its record). For GGUF the spine file is
//! itself a GGUF file: the source's metadata
//! (tokenizer included, `split.*` keys dropped) and a tensor table of the spine tensors,
//! whose header the manifest checksums too (`write/pack/gguf.rs`).
//!
//! A pack is complete only once `manifest.json` exists; it is written last, by rename. A folder
//! with `pack.journal` and no manifest is a pack being written and is refused.
//!
//! This module defines the format and opens packs; writing, resuming and verifying them is
//! `write::pack`'s.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::gguf::GgufModel;
use super::hf::HfModel;
pub use super::pack_info::PackInfo;
use super::tensor::TensorInfo;
use crate::quant::GgmlType;
use crate::store::relocate::{Relocation, Stripe};

/// The pack format this code writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// The manifest's file name inside the pack folder.
pub const MANIFEST: &str = "manifest.json";
/// The journal of a pack being written (records done, with their checksums).
pub const JOURNAL: &str = "pack.journal";
/// The spine file's name inside the pack folder.
pub const SPINE_FILE: &str = "spine.bin";

/// Where the source model came from.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct SourceIdentity {
    /// The source path as given to `pack`, made absolute.
    pub path: String,
    /// `hf` (a Hugging Face safetensors folder) or `gguf` (a GGUF file, or split set).
    pub format: String,
    /// `config.json`'s `model_type`, or the GGUF `general.architecture`.
    pub architecture: String,
    /// SHA-256 (hex) over `config.json` and every safetensors file's header, in file order;
    /// for GGUF, over every file's bytes before its first tensor's data (header, metadata,
    /// tensor infos).
    pub headers_sha256: String,
}

/// One drive of the pack and its data file.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Drive {
    /// The drive path as given to `--drives`, made absolute.
    pub path: String,
    /// The data file on it (absolute).
    pub file: String,
    /// The data file's length in bytes.
    pub len: u64,
}

/// A tensor of the source and its place in the pack's logical files.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PackTensor {
    pub name: String,
    /// GGML type name (e.g. `BF16`), and its GGUF id (`u32::MAX` for a type without one,
    /// e.g. `F8_E4M3`, read back by its name).
    pub dtype: String,
    pub ggml_type: u32,
    /// Dimensions in GGML order.
    pub shape: Vec<u64>,
    /// Logical file: 0 spine, `1..=D` drive `file - 1`, `D + 1` the striped virtual file.
    pub file: usize,
    pub offset: u64,
    pub n_bytes: u64,
    /// SHA-256 (hex) of the tensor's bytes, for spine tensors (experts have record checksums).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// One physical piece of an expert record: `len` bytes at `offset` of drive `drive`'s file,
/// holding the record's bytes from `record_offset` on.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Extent {
    pub drive: usize,
    pub offset: u64,
    pub len: u64,
    pub record_offset: u64,
}

/// One routed expert's record.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExpertRecord {
    pub layer: usize,
    pub expert: usize,
    /// Bytes of the record up to the end of its last tensor (what the checksum covers).
    pub len: u64,
    pub extents: Vec<Extent>,
    /// SHA-256 (hex) of the record's `len` bytes; empty in a plan not yet written.
    pub sha256: String,
}

/// The GGUF header at the start of a GGUF source's spine file (see the module docs).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct SpineHeader {
    /// Bytes of the header (magic, metadata, tensor infos), before any padding.
    pub len: u64,
    /// SHA-256 (hex) of those bytes.
    pub sha256: String,
}

/// `manifest.json`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    pub format_version: u32,
    pub source: SourceIdentity,
    /// `stripe` or `spread`.
    pub placement: String,
    /// Chunk bytes of the `stripe` placement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stripe_chunk: Option<u64>,
    /// The source's `config.json`; for GGUF, its metadata without the arrays (vocabulary,
    /// merges), which stay in the spine file's header.
    pub config: serde_json::Value,
    /// Files copied from the source folder (tokenizer, generation config, ...).
    pub copied_files: Vec<String>,
    pub spine_file: String,
    pub spine_len: u64,
    /// GGUF sources: the header at the start of the spine file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spine_header: Option<SpineHeader>,
    pub drives: Vec<Drive>,
    pub tensors: Vec<PackTensor>,
    /// Experts in (layer, expert) order.
    pub experts: Vec<ExpertRecord>,
}

/// Whether `dir` holds a complete pack (a `manifest.json`).
pub fn is_pack(dir: &Path) -> bool {
    dir.join(MANIFEST).is_file()
}

/// Whether `dir` holds a pack that was started but never finished.
pub fn is_incomplete_pack(dir: &Path) -> bool {
    !is_pack(dir) && dir.join(JOURNAL).is_file()
}

/// Hex of `b`.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Bytes of a 64-digit hex SHA-256.
pub fn unhex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

impl Manifest {
    /// Reads `dir/manifest.json`.
    ///
    /// Errors: the folder holds an unfinished pack, the manifest is missing, unreadable,
    /// malformed or of another format version (the message names the file).
    pub fn read(dir: &Path) -> Result<Manifest> {
        if is_incomplete_pack(dir) {
            bail!(
                "{}: the pack was not finished (no {MANIFEST}; run `deltafin pack` again to resume it)",
                dir.display()
            );
        }
        let p = dir.join(MANIFEST);
        let text = std::fs::read_to_string(&p).with_context(|| format!("{}", p.display()))?;
        let m: Manifest =
            serde_json::from_str(&text).with_context(|| format!("{}: malformed", p.display()))?;
        if m.format_version != FORMAT_VERSION {
            bail!(
                "{}: pack format version {} (this Deltafin reads version {FORMAT_VERSION})",
                p.display(),
                m.format_version
            );
        }
        Ok(m)
    }

    /// The logical file of the striped virtual file (`stripe` only).
    pub fn virtual_file(&self) -> Option<usize> {
        self.stripe_chunk.map(|_| self.drives.len() + 1)
    }

    /// Names drive `d` and its file for error messages.
    pub fn drive_label(&self, d: usize) -> String {
        match self.drives.get(d) {
            Some(x) => format!("drive {d} ({}), file {}", x.path, x.file),
            None => format!("drive {d} (not in the manifest)"),
        }
    }
}

/// The type of manifest tensor `t`: by its GGUF id, else, for a type GGUF has no id for
/// ([`GgmlType::id`] `u32::MAX`: FP8 E4M3 weights of Hugging Face checkpoints), by its name.
fn tensor_type(t: &PackTensor) -> Option<GgmlType> {
    GgmlType::from_u32(t.ggml_type).or_else(|| {
        [GgmlType::F8_E4M3]
            .into_iter()
            .find(|ty| ty.id() == t.ggml_type && ty.name() == t.dtype)
    })
}

/// A pack's tensor index in its logical files, checked against the files on disk.
struct Layout {
    m: Manifest,
    files: Vec<PathBuf>,
    tensors: Vec<TensorInfo>,
    info: Arc<PackInfo>,
}

/// Reads the manifest of the pack in `dir`, checks that every drive folder and data file is
/// there and long enough, and builds the tensor index in logical files (see the module docs).
///
/// Errors: as [`Manifest::read`]; a drive folder or data file missing, or a data file shorter
/// than the manifest says (the message names the drive, the file and the first expert it cuts
/// off); a tensor of an unknown type or outside its file.
fn open_layout(dir: &Path) -> Result<Layout> {
    let m = Manifest::read(dir)?;
    let spine = dir.join(&m.spine_file);
    let spine_len = std::fs::metadata(&spine)
        .with_context(|| format!("{}: the pack's spine file", spine.display()))?
        .len();
    if spine_len < m.spine_len {
        bail!(
            "{}: the spine file is {spine_len} bytes, the manifest says {}",
            spine.display(),
            m.spine_len
        );
    }
    for (d, drv) in m.drives.iter().enumerate() {
        if !Path::new(&drv.path).is_dir() {
            bail!(
                "{}: the drive's folder is missing (is the drive mounted?)",
                m.drive_label(d)
            );
        }
        let len = match std::fs::metadata(&drv.file) {
            Ok(x) => x.len(),
            Err(e) => bail!(
                "{}: {e} (the drive's data file is missing)",
                m.drive_label(d)
            ),
        };
        if len < drv.len {
            let cut = m
                .experts
                .iter()
                .find(|r| {
                    r.extents
                        .iter()
                        .any(|x| x.drive == d && x.offset + x.len > len)
                })
                .map(|r| format!("expert {} of layer {}", r.expert, r.layer))
                .unwrap_or_else(|| "no expert".into());
            bail!(
                "{}: the file is {len} bytes but the manifest says {} ({cut} lies past its end)",
                m.drive_label(d),
                drv.len
            );
        }
    }
    let mut files = vec![spine.clone()];
    files.extend(m.drives.iter().map(|d| PathBuf::from(&d.file)));
    let phys = files.clone();
    let mut labels = vec![None];
    labels.extend((0..m.drives.len()).map(|d| Some(m.drive_label(d))));
    let stripe = m.stripe_chunk.map(|chunk| Stripe {
        virtual_file: m.drives.len() + 1,
        first_file: 1,
        drives: m.drives.len(),
        chunk,
    });
    if stripe.is_some() {
        // the virtual file has no path of its own; its reads go to the drive files
        files.push(dir.join(MANIFEST));
    }
    let n_logical = files.len();
    let tensors = m
        .tensors
        .iter()
        .map(|t| {
            let ty = tensor_type(t).ok_or_else(|| {
                anyhow!(
                    "{}: tensor '{}': unknown type id {}",
                    dir.display(),
                    t.name,
                    t.ggml_type
                )
            })?;
            if t.file >= n_logical {
                bail!(
                    "{}: tensor '{}' is in file {} of {n_logical}",
                    dir.display(),
                    t.name,
                    t.file
                );
            }
            Ok(TensorInfo {
                name: t.name.clone(),
                ty,
                shape: t.shape.clone(),
                file: t.file,
                offset: t.offset,
                n_bytes: t.n_bytes,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let n_layers = m.experts.iter().map(|r| r.layer + 1).max().unwrap_or(0);
    let mut checksums: Vec<Vec<[u8; 32]>> = vec![Vec::new(); n_layers];
    for r in &m.experts {
        let row = &mut checksums[r.layer];
        if row.len() <= r.expert {
            row.resize(r.expert + 1, [0; 32]);
        }
        row[r.expert] = unhex32(&r.sha256).ok_or_else(|| {
            anyhow!(
                "{}: expert {} of layer {} has a malformed checksum",
                dir.display(),
                r.expert,
                r.layer
            )
        })?;
    }
    let info = Arc::new(PackInfo {
        dir: dir.to_path_buf(),
        relocation: Relocation {
            files: phys,
            stripe,
        },
        checksums,
        labels,
    });
    Ok(Layout {
        m,
        files,
        tensors,
        info,
    })
}

/// Checks that the pack in `dir` (manifest `m`) was made from a source of `format`.
fn expect_format(dir: &Path, m: &Manifest, format: &str) -> Result<()> {
    if m.source.format != format {
        bail!(
            "{}: a pack of a '{}' model, not of a '{format}' one",
            dir.display(),
            m.source.format
        );
    }
    Ok(())
}

/// Opens the pack in `dir` of a Hugging Face model as a Hugging Face model whose files are the
/// pack's logical files (see the module docs), checking that every drive file is there and long
/// enough.
///
/// Errors: those of `open_layout` (the manifest cannot be read; a drive folder or data file
/// missing or short, naming the drive, the file and the first expert it cuts off; a tensor of
/// an unknown type or outside its file); the pack is of a GGUF model.
pub fn open_pack(dir: &Path) -> Result<HfModel> {
    let l = open_layout(dir)?;
    expect_format(dir, &l.m, "hf")?;
    Ok(HfModel {
        dir: dir.to_path_buf(),
        config: l.m.config.clone(),
        files: l.files,
        tensors: l.tensors,
        pack: Some(l.info),
    })
}

/// Opens the pack in `dir` of a GGUF model as a GGUF model: metadata (architecture,
/// hyperparameters, tokenizer) from the GGUF header of its spine file, tensors from the
/// manifest (stacked experts listed per expert, `NAME[E]`), files the pack's logical files.
///
/// Errors: as [`open_pack`]; the pack is of a Hugging Face model; the spine file is not a
/// GGUF file or its tensor table disagrees with the manifest.
pub fn open_gguf_pack(dir: &Path) -> Result<GgufModel> {
    let l = open_layout(dir)?;
    expect_format(dir, &l.m, "gguf")?;
    let mut g = GgufModel::open(&l.files[0])?;
    let spine: Vec<(&str, u64, u64)> = l
        .tensors
        .iter()
        .filter(|t| t.file == 0)
        .map(|t| (t.name.as_str(), t.offset, t.n_bytes))
        .collect();
    let table: Vec<(&str, u64, u64)> = g
        .tensors
        .iter()
        .map(|t| (t.name.as_str(), t.offset, t.n_bytes))
        .collect();
    if spine != table {
        bail!(
            "{}: the spine file's GGUF tensor table disagrees with {MANIFEST}",
            l.files[0].display()
        );
    }
    g.files = l.files;
    g.tensors = l.tensors;
    g.pack = Some(l.info);
    Ok(g)
}
