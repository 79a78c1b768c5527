//! Checking a pack's `manifest.json` against itself and the files on disk before anything
//! uses it ([`check`]): opening a pack ([`super::pack::open_pack`]) and `pack --verify` go
//! through the same checks, so a manifest that cannot be run is never reported as verified.
//!
//! A manifest is written by Deltafin but read back as untrusted input: every index is checked
//! against what it indexes, every length and offset against the files, every checksum for its
//! form, and every file name for staying inside the pack folder, before any allocation sized by
//! them. Errors name the manifest, the field with its index and the value
//! (`…/manifest.json: experts[3].extents[0].drive = 9 is outside 0..2`).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Result};

use super::pack_format::{unhex16, unhex32, Manifest, PackTensor, MANIFEST};
use crate::quant::GgmlType;

impl Manifest {
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
        check(&m, dir)?;
        Ok(m)
    }

    /// The checks of [`Manifest::read_checked`] that read nothing but the manifest (a
    /// manifest fetched from object storage, before its files exist here); `dir` names it in
    /// messages.
    ///
    /// Errors: as [`Manifest::read_checked`]'s field checks.
    pub fn check_fields(&self, dir: &Path) -> Result<()> {
        check_fields(self, dir)
    }
}

/// Alignment of chunks, records and their tensors in a pack.
const ALIGN: u64 = 4096;

/// The type of manifest tensor `t`: by its GGUF id, else, for a type GGUF has no id for
/// ([`GgmlType::id`] `u32::MAX`: FP8 E4M3 weights of Hugging Face checkpoints), by its name.
pub(super) fn tensor_type(t: &PackTensor) -> Option<GgmlType> {
    GgmlType::from_u32(t.ggml_type).or_else(|| {
        [GgmlType::F8_E4M3]
            .into_iter()
            .find(|ty| ty.id() == t.ggml_type && ty.name() == t.dtype)
    })
}

/// Bytes a tensor of type `ty` and GGML shape `shape` holds (`None` on overflow or a row
/// that is not a whole number of blocks).
fn tensor_bytes(ty: GgmlType, shape: &[u64]) -> Option<u64> {
    let cols = usize::try_from(shape.first().copied().unwrap_or(1)).ok()?;
    let rows = shape
        .iter()
        .skip(1)
        .try_fold(1u64, |a, &d| a.checked_mul(d))?;
    (ty.row_bytes(cols)? as u64).checked_mul(rows)
}

/// Whether `name` is a plain file name (no folder part, not `.` or `..`).
fn plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0')
}

/// Checks the manifest `m` of the pack in `dir` (see the module docs): its fields against one
/// another, then the spine file, drive folders and drive data files against it.
///
/// Errors: the first inconsistency, naming the manifest, the field and its value; a spine
/// file, drive folder or drive data file missing or shorter than the manifest says (naming the
/// drive, its file and the first expert it cuts off).
pub fn check(m: &Manifest, dir: &Path) -> Result<()> {
    check_fields(m, dir)?;
    check_files(m, dir)
}

/// The checks of [`check`] that read nothing but the manifest.
fn check_fields(m: &Manifest, dir: &Path) -> Result<()> {
    let p = dir.join(MANIFEST);
    let p = p.display();
    if !["hf", "gguf"].contains(&m.source.format.as_str()) {
        bail!(
            "{p}: source.format = {:?} is neither \"hf\" nor \"gguf\"",
            m.source.format
        );
    }
    let nd = m.drives.len();
    let chunk = match (m.placement.as_str(), m.stripe_chunk) {
        ("stripe", Some(c)) if c > 0 && c % ALIGN == 0 => Some(c),
        ("stripe", Some(c)) => {
            bail!("{p}: stripe_chunk = {c} is not a positive multiple of {ALIGN}")
        }
        ("stripe", None) => bail!("{p}: placement = \"stripe\" but there is no stripe_chunk"),
        ("spread", None) => None,
        ("spread", Some(c)) => bail!("{p}: stripe_chunk = {c} but placement = \"spread\""),
        (x, _) => bail!("{p}: placement = {x:?} is neither \"stripe\" nor \"spread\""),
    };
    if nd == 0 {
        bail!("{p}: drives is empty");
    }
    if !plain_name(&m.spine_file) {
        bail!(
            "{p}: spine_file = {:?} is not a file name inside the pack folder",
            m.spine_file
        );
    }
    for (i, f) in m.copied_files.iter().enumerate() {
        if !plain_name(f) {
            bail!("{p}: copied_files[{i}] = {f:?} is not a file name inside the pack folder");
        }
    }
    for (f, h) in &m.file_sha256 {
        if !m.copied_files.contains(f) {
            bail!("{p}: file_sha256 names {f:?}, which is not in copied_files");
        }
        if unhex32(h).is_none() {
            bail!("{p}: file_sha256[{f:?}] = {h:?} is not a SHA-256 (64 hex digits)");
        }
    }
    match (&m.spine_header, m.source.format.as_str()) {
        (None, "gguf") => bail!("{p}: a pack of a GGUF model needs a spine_header"),
        (Some(_), "hf") => bail!("{p}: spine_header is set in a pack of a Hugging Face model"),
        (Some(h), _) if h.len > m.spine_len => bail!(
            "{p}: spine_header.len = {} is past spine_len = {}",
            h.len,
            m.spine_len
        ),
        (Some(h), _) if unhex32(&h.sha256).is_none() => {
            bail!("{p}: spine_header.sha256 is not a SHA-256 (64 hex digits)")
        }
        _ => {}
    }
    for (d, x) in m.drives.iter().enumerate() {
        if x.path.is_empty() || x.file.is_empty() {
            bail!("{p}: drives[{d}] has an empty path or file");
        }
        if m.drives[..d].iter().any(|y| y.file == x.file) {
            bail!(
                "{p}: drives[{d}].file = {:?} is another drive's file too",
                x.file
            );
        }
    }
    // records: in (layer, expert) order, each expert of a layer once, ids dense per layer
    let mut per_layer: BTreeMap<usize, usize> = BTreeMap::new();
    for r in &m.experts {
        *per_layer.entry(r.layer).or_default() += 1;
    }
    let n_records = m.experts.len() as u64;
    let virtual_len = match chunk {
        Some(c) => Some(
            c.checked_mul(nd as u64)
                .and_then(|row| row.checked_mul(n_records))
                .ok_or_else(|| {
                    anyhow::anyhow!("{p}: stripe_chunk = {c} overflows the striped file")
                })?,
        ),
        None => None,
    };
    for (i, r) in m.experts.iter().enumerate() {
        let f = format!("{p}: experts[{i}]");
        if r.layer >= m.tensors.len() {
            bail!(
                "{f}.layer = {} is outside 0..{} (the manifest lists {} tensors)",
                r.layer,
                m.tensors.len(),
                m.tensors.len()
            );
        }
        let n = per_layer[&r.layer];
        if r.expert >= n {
            bail!(
                "{f}.expert = {} is outside 0..{n} (layer {} has {n} records)",
                r.expert,
                r.layer
            );
        }
        if i > 0 {
            let q = &m.experts[i - 1];
            if (q.layer, q.expert) >= (r.layer, r.expert) {
                bail!(
                    "{f} (expert {} of layer {}) is not after experts[{}] (expert {} of layer {})",
                    r.expert,
                    r.layer,
                    i - 1,
                    q.expert,
                    q.layer
                );
            }
        }
        if unhex32(&r.sha256).is_none() {
            bail!(
                "{f}.sha256 = {:?} is not a SHA-256 (64 hex digits)",
                r.sha256
            );
        }
        if let Some(h) = r.xxh3.as_deref().filter(|h| unhex16(h).is_none()) {
            bail!("{f}.xxh3 = {h:?} is not an XXH3-128 (32 hex digits)");
        }
        if r.extents.is_empty() {
            bail!("{f}.extents is empty");
        }
        let mut at = 0u64;
        for (j, x) in r.extents.iter().enumerate() {
            let f = format!("{f}.extents[{j}]");
            if x.drive >= nd {
                bail!("{f}.drive = {} is outside 0..{nd}", x.drive);
            }
            if x.len == 0 {
                bail!("{f}.len = 0");
            }
            if x.record_offset != at {
                bail!(
                    "{f}.record_offset = {} leaves a gap or overlap (the extents before it end at {at})",
                    x.record_offset
                );
            }
            at = at.saturating_add(x.len);
            let end = x.offset.checked_add(x.len);
            let dl = m.drives[x.drive].len;
            if end.is_none_or(|e| e > dl) {
                bail!(
                    "{f}: offset {} + len {} is past drives[{}].len = {dl}",
                    x.offset,
                    x.len,
                    x.drive
                );
            }
            if let Some(c) = chunk {
                let want = (
                    j,
                    i as u64 * c,
                    j as u64 * c,
                    c.min(r.len.saturating_sub(j as u64 * c)),
                );
                if (x.drive, x.offset, x.record_offset, x.len) != want {
                    bail!(
                        "{f} = (drive {}, offset {}, len {}) is not chunk {j} of row {i} of the stripe (drive {}, offset {}, len {})",
                        x.drive,
                        x.offset,
                        x.len,
                        want.0,
                        want.1,
                        want.3
                    );
                }
            }
        }
        if at != r.len {
            bail!("{f}.len = {} but its extents hold {at} bytes", r.len);
        }
    }
    // tensors: a known type, bytes matching the shape, inside their logical file
    let n_logical = 1 + nd + chunk.is_some() as usize;
    for (i, t) in m.tensors.iter().enumerate() {
        let f = format!("{p}: tensors[{i}] ('{}')", t.name);
        let Some(ty) = tensor_type(t) else {
            bail!("{f}.ggml_type = {} is not a known type", t.ggml_type);
        };
        match tensor_bytes(ty, &t.shape) {
            Some(b) if b == t.n_bytes => {}
            _ => bail!(
                "{f}.n_bytes = {} does not match its shape {:?} of {}",
                t.n_bytes,
                t.shape,
                ty.name()
            ),
        }
        let file_len = match t.file {
            0 => m.spine_len,
            d if d <= nd => m.drives[d - 1].len,
            d if d < n_logical => virtual_len.unwrap_or(0),
            d => bail!("{f}.file = {d} is outside 0..{n_logical}"),
        };
        if t.offset.checked_add(t.n_bytes).is_none_or(|e| e > file_len) {
            bail!(
                "{f}: offset {} + n_bytes {} is past the end of its file {} ({file_len} bytes)",
                t.offset,
                t.n_bytes,
                t.file
            );
        }
        match (&t.sha256, t.file) {
            (Some(h), 0) if unhex32(h).is_some() => {}
            (None, f0) if f0 != 0 => {}
            (Some(h), 0) => bail!("{f}.sha256 = {h:?} is not a SHA-256 (64 hex digits)"),
            (None, _) => bail!("{f}: a spine tensor without a sha256"),
            (Some(_), _) => bail!("{f}.sha256 is set on an expert tensor (records have checksums)"),
        }
        match (&t.xxh3, t.file) {
            (None, _) => {}
            (Some(h), 0) if unhex16(h).is_some() => {}
            (Some(h), 0) => bail!("{f}.xxh3 = {h:?} is not an XXH3-128 (32 hex digits)"),
            (Some(_), _) => bail!("{f}.xxh3 is set on an expert tensor (records have checksums)"),
        }
    }
    Ok(())
}

/// The checks of [`check`] against the files: the spine file, every drive folder and data
/// file there and long enough.
fn check_files(m: &Manifest, dir: &Path) -> Result<()> {
    let spine = dir.join(&m.spine_file);
    let spine_len = std::fs::metadata(&spine)
        .map_err(|e| anyhow::anyhow!("{}: the pack's spine file: {e}", spine.display()))?
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
    Ok(())
}
