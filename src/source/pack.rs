//! Deltafin packs: a model re-laid out for one read per expert (format version 1).
//!
//! A pack is a folder holding `manifest.json`, `spine.bin` (every tensor that is not a routed
//! expert, each at a 4 KiB boundary), the source's `config.json` and tokenizer files, plus one
//! expert data file per drive (`DRIVE/deltafin-pack-NAME-HASH-D.bin`, HASH from the
//! pack folder's absolute path). Each routed expert is one
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
//! The files copied from a Hugging Face source (config, tokenizer, generation config) have a
//! SHA-256 each in the manifest (`file_sha256`), checked by `pack --verify` and at load with
//! `--verify-experts`.
//!
//! A pack is complete only once `manifest.json` exists; it is written last, by rename. A folder
//! with `pack.journal` and no manifest is a pack being written and is refused. A writer holds
//! `pack.lock` (`flock`) in the folder while it writes. The manifest is read back as untrusted
//! input: [`Manifest::read_checked`] checks every field before anything uses it
//! (`pack_check.rs`).
//!
//! This module defines the format and opens packs; writing, resuming and verifying them is
//! `write::pack`'s.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::gguf::GgufModel;
use super::hf::HfModel;
use super::pack_check::tensor_type;
pub use super::pack_info::PackInfo;
use super::tensor::TensorInfo;
use crate::store::relocate::{Relocation, Stripe};

/// The pack format this code writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// The manifest's file name inside the pack folder.
pub const MANIFEST: &str = "manifest.json";
/// The largest `manifest.json` read (256 MiB; the manifest of a pack of Kimi K2, 23,040
/// records and about 70,000 tensors, is near 30 MB).
pub const MAX_MANIFEST_BYTES: u64 = 256 << 20;
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
    /// SHA-256 (hex) of each copied file, by name (empty in packs written before Deltafin
    /// recorded them: `pack --verify` reports each such file as unchecked).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub file_sha256: BTreeMap<String, String>,
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
    /// Errors: the folder holds an unfinished pack, the manifest is missing, not a regular
    /// file, larger than [`MAX_MANIFEST_BYTES`], unreadable, malformed or of another format
    /// version (the message names the file).
    pub fn read(dir: &Path) -> Result<Manifest> {
        if is_incomplete_pack(dir) {
            bail!(
                "{}: the pack was not finished (no {MANIFEST}; run `deltafin pack` again to resume it)",
                dir.display()
            );
        }
        let p = dir.join(MANIFEST);
        // not a FIFO or device (no hang, no endless read), and of a bounded size
        let meta = std::fs::metadata(&p).with_context(|| format!("{}", p.display()))?;
        if !meta.is_file() {
            bail!("{}: not a regular file", p.display());
        }
        if meta.len() > MAX_MANIFEST_BYTES {
            bail!(
                "{}: {} bytes, more than a manifest may hold ({MAX_MANIFEST_BYTES})",
                p.display(),
                meta.len()
            );
        }
        let mut text = String::new();
        std::fs::File::open(&p)
            .and_then(|f| f.take(MAX_MANIFEST_BYTES + 1).read_to_string(&mut text))
            .with_context(|| format!("{}", p.display()))?;
        if text.len() as u64 > MAX_MANIFEST_BYTES {
            bail!(
                "{}: grew past {MAX_MANIFEST_BYTES} bytes while read",
                p.display()
            );
        }
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

    /// Reads `dir/manifest.json` ([`Manifest::read`]) and checks it against itself and the
    /// pack's files before anything uses it (see `source/pack_check.rs`): what opening a pack
    /// and `pack --verify` both start with.
    ///
    /// Errors: as [`Manifest::read`]; a field inconsistent with the others (the message names
    /// the manifest, the field with its index and its value, e.g. `…/manifest.json:
    /// experts[3].extents[0].drive = 9 is outside 0..2`); the spine file, a drive folder or a
    /// drive data file missing or shorter than the manifest says (naming the drive, its file
    /// and the first expert it cuts off).
    pub fn read_checked(dir: &Path) -> Result<Manifest> {
        let m = Self::read(dir)?;
        super::pack_check::check(&m, dir)?;
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

/// A pack's tensor index in its logical files, checked against the files on disk.
struct Layout {
    m: Manifest,
    files: Vec<PathBuf>,
    tensors: Vec<TensorInfo>,
    info: Arc<PackInfo>,
}

/// Reads and checks the manifest of the pack in `dir` ([`Manifest::read_checked`]) and builds
/// the tensor index in logical files (see the module docs).
///
/// Errors: as [`Manifest::read_checked`].
fn open_layout(dir: &Path) -> Result<Layout> {
    let m = Manifest::read_checked(dir)?;
    let spine = dir.join(&m.spine_file);
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
    // every field was checked (`pack_check.rs`): types known, files in range, ids dense
    let tensors = m
        .tensors
        .iter()
        .map(|t| TensorInfo {
            name: t.name.clone(),
            ty: tensor_type(t).expect("checked"),
            shape: t.shape.clone(),
            file: t.file,
            offset: t.offset,
            n_bytes: t.n_bytes,
        })
        .collect();
    let n_layers = m.experts.iter().map(|r| r.layer + 1).max().unwrap_or(0);
    let mut checksums: Vec<Vec<[u8; 32]>> = vec![Vec::new(); n_layers];
    for r in &m.experts {
        checksums[r.layer].push(unhex32(&r.sha256).expect("checked"));
    }
    let copied = m
        .file_sha256
        .iter()
        .map(|(f, h)| (dir.join(f), unhex32(h).expect("checked")))
        .collect();
    let info = Arc::new(PackInfo {
        dir: dir.to_path_buf(),
        relocation: Relocation {
            files: phys,
            stripe,
        },
        checksums,
        labels,
        copied,
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
/// Errors: those of [`Manifest::read_checked`] (the manifest cannot be read or is
/// inconsistent, naming the field; a drive folder or data file missing or short, naming the
/// drive, the file and the first expert it cuts off); the pack is of a GGUF model.
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
