//! `deltafin pack --verify`: every checksum of a pack read back (layout in
//! [`crate::source::pack`]).

use crate::store::checksum::xxh3_128;
use std::fs::File;
use std::path::Path;

use anyhow::{anyhow, Context, Result};
use sha2::{Digest, Sha256};

use super::records::{read_at, read_record};
use crate::source::pack::{hex, Manifest, MANIFEST};

/// A problem [`verify_pack`] found.
pub type Mismatch = String;

/// Checks the manifest of the pack in `dir` as opening the pack does
/// ([`Manifest::read_checked`]), then every spine tensor, the spine's GGUF header (packs of
/// GGUF models), every expert record and every copied file (tokenizer, generation config, ...)
/// against its checksum (both the SHA-256 and the XXH3-128 where the manifest has both). Returns the number of items checked and one line per mismatch or
/// unreadable item (naming the drive, file and (layer, expert), the spine tensor or the
/// copied file; a copied file the manifest has no checksum for, in a pack written before they
/// were recorded, is one such line).
///
/// Errors: the manifest cannot be read or fails its checks (as when the pack is opened), a
/// file cannot be opened.
pub fn verify_pack(dir: &Path) -> Result<(usize, Vec<Mismatch>)> {
    let m = Manifest::read_checked(dir)?;
    let spine_path = dir.join(&m.spine_file);
    let spine = File::open(&spine_path).with_context(|| format!("{}", spine_path.display()))?;
    let mut bad = Vec::new();
    let mut n = 0;
    let mut check_spine =
        |what: String, offset: u64, len: u64, want: Option<&str>, x: Option<&str>| {
            n += 1;
            let mut b = vec![0u8; len as usize];
            match read_at(&spine, offset, &mut b, &|| spine_path.display().to_string()) {
                Ok(())
                    if want == Some(hex(&Sha256::digest(&b)).as_str())
                        && x.is_none_or(|x| x == hex(&xxh3_128(&b))) => {}
                Ok(()) => bad.push(format!(
                    "{}: {what}: checksum mismatch",
                    spine_path.display()
                )),
                Err(e) => bad.push(format!("{what}: {e:#}")),
            }
        };
    if let Some(h) = &m.spine_header {
        check_spine("the GGUF header".into(), 0, h.len, Some(&h.sha256), None);
    }
    for t in m.tensors.iter().filter(|t| t.file == 0) {
        let what = format!("spine tensor '{}'", t.name);
        check_spine(
            what,
            t.offset,
            t.n_bytes,
            t.sha256.as_deref(),
            t.xxh3.as_deref(),
        );
    }
    let files: Vec<File> = m
        .drives
        .iter()
        .enumerate()
        .map(|(d, x)| File::open(&x.file).map_err(|e| anyhow!("{}: {e}", m.drive_label(d))))
        .collect::<Result<_>>()?;
    for r in &m.experts {
        n += 1;
        let where_ = || {
            let ds: Vec<String> = r.extents.iter().map(|x| m.drive_label(x.drive)).collect();
            format!(
                "expert {} of layer {} on {}",
                r.expert,
                r.layer,
                ds.join("; ")
            )
        };
        match read_record(&m, &files, r) {
            Ok(b)
                if hex(&Sha256::digest(&b)) == r.sha256
                    && r.xxh3.as_ref().is_none_or(|x| *x == hex(&xxh3_128(&b))) => {}
            Ok(_) => bad.push(format!("{}: checksum mismatch", where_())),
            Err(e) => bad.push(format!("{}: {e:#}", where_())),
        }
    }
    for f in &m.copied_files {
        n += 1;
        let p = dir.join(f);
        match (std::fs::read(&p), m.file_sha256.get(f)) {
            (Err(e), _) => bad.push(format!("{}: {e}", p.display())),
            (Ok(_), None) => bad.push(format!(
                "{}: no checksum in {MANIFEST} (a pack written before they were recorded: run `deltafin pack` again to record them)",
                p.display()
            )),
            (Ok(b), Some(h)) if &hex(&Sha256::digest(&b)) == h => {}
            (Ok(_), Some(_)) => bad.push(format!("{}: checksum mismatch", p.display())),
        }
    }
    Ok((n, bad))
}
