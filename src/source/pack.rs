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
//! its bytes up to the end of its last tensor, one per spine tensor. Each record also has an
//! XXH3-128 (`xxh3`, many times faster), which reads check by default
//! ([`crate::store::checksum`]); packs written before it was recorded are checked with the
//! SHA-256.
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
//! SHA-256 each in the manifest (`file_sha256`), checked by `pack --verify` and at load (unless
//! `--no-verify-experts`).
//!
//! A pack is complete only once `manifest.json` exists; it is written last, by rename. A folder
//! with `pack.journal` and no manifest is a pack being written and is refused. A writer holds
//! `pack.lock` (`flock`) in the folder while it writes. The manifest is read back as untrusted
//! input: [`Manifest::read_checked`] checks every field before anything uses it
//! (`pack_check.rs`).
//!
//! This module defines the format and opens packs; writing, resuming and verifying them is
//! `write::pack`'s.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Result};

use super::gguf::GgufModel;
use super::hf::HfModel;
use super::pack_check::tensor_type;
pub use super::pack_format::{
    hex, is_incomplete_pack, is_pack, unhex16, unhex32, Drive, ExpertRecord, Extent, Manifest,
    PackTensor, SourceIdentity, SpineHeader, FORMAT_VERSION, JOURNAL, MANIFEST, MAX_MANIFEST_BYTES,
    SPINE_FILE,
};
pub use super::pack_info::PackInfo;
use super::tensor::TensorInfo;
use crate::store::checksum::{RecordSum, SpineSums, SpineTensor};
use crate::store::relocate::{Relocation, Stripe};
use crate::store::remote::RemoteSpec;

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
    let mut checksums: Vec<Vec<RecordSum>> = vec![Vec::new(); n_layers];
    for r in &m.experts {
        checksums[r.layer].push(match r.xxh3.as_deref().and_then(unhex16) {
            Some(x) => RecordSum::Xxh3(x),
            None => RecordSum::Sha256(unhex32(&r.sha256).expect("checked")),
        });
    }
    let copied = m
        .file_sha256
        .iter()
        .map(|(f, h)| (dir.join(f), unhex32(h).expect("checked")))
        .collect();
    // every spine tensor has a SHA-256 (checked); the XXH3-128 when the manifest records it
    let spine_sums = m
        .tensors
        .iter()
        .filter(|t| t.file == 0)
        .filter_map(|t| {
            let sum = match (t.xxh3.as_deref().and_then(unhex16), t.sha256.as_deref()) {
                (Some(x), _) => RecordSum::Xxh3(x),
                (None, Some(h)) => RecordSum::Sha256(unhex32(h)?),
                (None, None) => return None,
            };
            Some(SpineTensor {
                name: t.name.clone(),
                offset: t.offset,
                len: t.n_bytes,
                sum,
            })
        })
        .collect();
    let info = Arc::new(PackInfo {
        spine: Arc::new(SpineSums::new(0, spine.display().to_string(), spine_sums)),
        dir: dir.to_path_buf(),
        relocation: Relocation {
            files: phys,
            stripe,
        },
        checksums,
        labels,
        copied,
        remote: RemoteSpec::read(dir)?,
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
