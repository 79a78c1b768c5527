//! The pack format's types (`manifest.json` and its parts), its constants, and reading a
//! manifest; public as [`crate::source::pack`] (whose docs describe the format). Checking a
//! manifest is `pack_check.rs`'s, opening a pack `pack.rs`'s.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::store::direct::{read_bounded, BoundedReadError};

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
    /// XXH3-128 (hex, 32 digits, big-endian) of the same bytes, for spine tensors: what every
    /// read of the tensor checks by default (at load when resident, at each read when
    /// streamed). Absent in packs written before it was recorded (reads check `sha256`
    /// then), on expert tensors and in a plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xxh3: Option<String>,
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
    /// XXH3-128 (hex, 32 digits, big-endian) of the same bytes: what every read checks by
    /// default. Absent in packs written before it was recorded (reads check `sha256` then)
    /// and in a plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xxh3: Option<String>,
}

/// The GGUF header at the start of a GGUF source's spine file (see [`crate::source::pack`]).
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

/// Bytes of a 32-digit hex XXH3-128.
pub fn unhex16(s: &str) -> Option<[u8; 16]> {
    let mut out = [0u8; 16];
    if s.len() != 32 {
        return None;
    }
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
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
        let text = match read_bounded(&p, MAX_MANIFEST_BYTES) {
            Ok(b) => String::from_utf8(b).map_err(|e| {
                anyhow::Error::new(io::Error::new(io::ErrorKind::InvalidData, e))
                    .context(format!("{}", p.display()))
            })?,
            Err(BoundedReadError::Io(e)) => {
                return Err(anyhow::Error::new(e).context(format!("{}", p.display())))
            }
            Err(BoundedReadError::NotRegular) => bail!("{}: not a regular file", p.display()),
            Err(BoundedReadError::TooLarge { len, grew: false }) => bail!(
                "{}: {len} bytes, more than a manifest may hold ({MAX_MANIFEST_BYTES})",
                p.display()
            ),
            Err(BoundedReadError::TooLarge { grew: true, .. }) => bail!(
                "{}: grew past {MAX_MANIFEST_BYTES} bytes while read",
                p.display()
            ),
        };
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
