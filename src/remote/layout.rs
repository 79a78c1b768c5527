//! The layout of a pack on object storage: the pack's expert records, whatever their
//! placement on local drives, become one object (`experts.bin`), each record whole at a
//! 4 KiB-aligned offset in manifest order, so that a record is one ranged GET; the manifest
//! says so (placement `spread` over one drive named by the URL), every checksum and the
//! records' inner layout unchanged.

use std::collections::HashMap;

use anyhow::{bail, Result};

use crate::source::pack::{Drive, Extent, Manifest};
use crate::store::remote::spec::EXPERTS_OBJECT;
use crate::store::remote::S3Url;

/// Alignment of records in the expert object.
const ALIGN: u64 = 4096;

/// The offset of each record of `m` in the expert object, and the object's length.
pub fn record_offsets(m: &Manifest) -> (Vec<u64>, u64) {
    let mut at = 0u64;
    let offs = m
        .experts
        .iter()
        .map(|r| {
            let o = at;
            at += r.len.div_ceil(ALIGN) * ALIGN;
            o
        })
        .collect();
    (offs, at)
}

/// The logical offset where record `ri` of `m` starts, in the logical file holding it.
fn record_base(m: &Manifest, ri: usize) -> (usize, u64) {
    match (m.stripe_chunk, m.virtual_file()) {
        (Some(c), Some(v)) => (v, ri as u64 * c * m.drives.len() as u64),
        _ => {
            let x = &m.experts[ri].extents[0];
            (x.drive + 1, x.offset)
        }
    }
}

/// The manifest of the pack `m` (a checked local manifest) laid out for object storage at
/// `url` (see the module docs).
///
/// Errors: an expert tensor lies in no record (a manifest that its checks should have
/// refused; named).
pub fn remote_manifest(m: &Manifest, url: &S3Url) -> Result<Manifest> {
    let (offs, len) = record_offsets(m);
    // (logical file, record start) → record, and each file's record starts sorted
    let mut starts: HashMap<usize, Vec<(u64, u64, usize)>> = HashMap::new();
    for (ri, r) in m.experts.iter().enumerate() {
        let (f, base) = record_base(m, ri);
        starts.entry(f).or_default().push((base, r.len, ri));
    }
    starts.values_mut().for_each(|v| v.sort());
    let mut out = m.clone();
    out.placement = "spread".into();
    out.stripe_chunk = None;
    out.drives = vec![Drive {
        path: url.to_string(),
        file: url.object(EXPERTS_OBJECT),
        len,
    }];
    for (ri, r) in out.experts.iter_mut().enumerate() {
        r.extents = vec![Extent {
            drive: 0,
            offset: offs[ri],
            len: r.len,
            record_offset: 0,
        }];
    }
    for t in out.tensors.iter_mut().filter(|t| t.file != 0) {
        let v = starts.get(&t.file).map(Vec::as_slice).unwrap_or(&[]);
        let i = v.partition_point(|&(b, _, _)| b <= t.offset);
        let Some(&(base, rlen, ri)) = i.checked_sub(1).and_then(|i| v.get(i)) else {
            bail!("tensor '{}' lies in no expert record", t.name);
        };
        if t.offset + t.n_bytes > base + rlen {
            bail!("tensor '{}' lies in no expert record", t.name);
        }
        t.file = 1;
        t.offset = offs[ri] + (t.offset - base);
    }
    Ok(out)
}
