//! Reading back what a pack holds, for resuming ([`super::write_pack`]) and verifying
//! ([`super::verify_pack`]): positioned reads and whole expert records.

use std::fs::File;
use std::os::unix::fs::FileExt;

use anyhow::{Context, Result};

use crate::source::pack::{ExpertRecord, Manifest};

/// Reads `len` bytes at `offset` of `f` into `out` (error names `label`).
pub(super) fn read_at(
    f: &File,
    offset: u64,
    out: &mut [u8],
    label: &dyn Fn() -> String,
) -> Result<()> {
    f.read_exact_at(out, offset).with_context(|| {
        format!(
            "{}: reading {} bytes at offset {offset}",
            label(),
            out.len()
        )
    })
}

/// The record of expert `r` as stored in the pack (its `len` bytes).
pub(super) fn read_record(m: &Manifest, files: &[File], r: &ExpertRecord) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; r.len as usize];
    for x in &r.extents {
        let dst = &mut buf[x.record_offset as usize..(x.record_offset + x.len) as usize];
        read_at(&files[x.drive], x.offset, dst, &|| m.drive_label(x.drive))?;
    }
    Ok(buf)
}
