//! `deltafin pack --verify`: every checksum of a pack read back (layout in
//! [`crate::source::pack`]).

use std::fs::File;
use std::path::Path;

use anyhow::{anyhow, Context, Result};
use sha2::{Digest, Sha256};

use super::records::{read_at, read_record};
use crate::source::pack::{hex, Manifest};

/// A problem [`verify_pack`] found.
pub type Mismatch = String;

/// Checks every spine tensor, the spine's GGUF header (packs of GGUF models) and every expert
/// record of the pack in `dir` against its checksum. Returns the number of items checked and
/// one line per mismatch or unreadable item (naming the drive, file and (layer, expert), or the
/// spine tensor).
///
/// Errors: the manifest cannot be read, a file cannot be opened.
pub fn verify_pack(dir: &Path) -> Result<(usize, Vec<Mismatch>)> {
    let m = Manifest::read(dir)?;
    let spine_path = dir.join(&m.spine_file);
    let spine = File::open(&spine_path).with_context(|| format!("{}", spine_path.display()))?;
    let mut bad = Vec::new();
    let mut n = 0;
    let mut check_spine = |what: String, offset: u64, len: u64, want: Option<&str>| {
        n += 1;
        let mut b = vec![0u8; len as usize];
        match read_at(&spine, offset, &mut b, &|| spine_path.display().to_string()) {
            Ok(()) if want == Some(hex(&Sha256::digest(&b)).as_str()) => {}
            Ok(()) => bad.push(format!(
                "{}: {what}: checksum mismatch",
                spine_path.display()
            )),
            Err(e) => bad.push(format!("{what}: {e:#}")),
        }
    };
    if let Some(h) = &m.spine_header {
        check_spine("the GGUF header".into(), 0, h.len, Some(&h.sha256));
    }
    for t in m.tensors.iter().filter(|t| t.file == 0) {
        let what = format!("spine tensor '{}'", t.name);
        check_spine(what, t.offset, t.n_bytes, t.sha256.as_deref());
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
            Ok(b) if hex(&Sha256::digest(&b)) == r.sha256 => {}
            Ok(_) => bad.push(format!("{}: checksum mismatch", where_())),
            Err(e) => bad.push(format!("{}: {e:#}", where_())),
        }
    }
    Ok((n, bad))
}
