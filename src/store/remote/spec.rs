//! `remote.json`: the mark of a local copy of a pack on object storage (written by
//! [`crate::remote`] beside the copied manifest and spine), read when the pack is
//! opened, so that the expert store fetches the records the local tier lacks.

use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// The mark's file name in the local copy's folder.
pub const MARKER: &str = "remote.json";
/// The expert object's name under a remote pack's prefix (and the mirror's in the local copy).
pub const EXPERTS_OBJECT: &str = "experts.bin";

/// Where the records of a local copy come from.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct RemoteSpec {
    /// The pack's URL, `s3://BUCKET/PREFIX`.
    pub url: String,
    /// The expert object's name under the prefix.
    pub object: String,
    /// SHA-256 (hex) of the remote `manifest.json`: the pack's identity, which the local tier
    /// is kept for.
    pub manifest_sha256: String,
}

impl RemoteSpec {
    /// The mark in `dir`, `None` when there is none (a pack made here).
    ///
    /// Errors: the mark exists but cannot be read or is malformed (the message names it).
    pub fn read(dir: &Path) -> io::Result<Option<Self>> {
        let p = dir.join(MARKER);
        let text = match std::fs::read_to_string(&p) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", p.display()))),
        };
        let s: Self = serde_json::from_str(&text).map_err(|e| {
            io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", p.display()))
        })?;
        if s.identity().is_none() || !super::url::is_s3_url(&s.url) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: malformed", p.display()),
            ));
        }
        Ok(Some(s))
    }

    /// The identity as bytes (`None` when `manifest_sha256` is not 64 hex digits).
    pub fn identity(&self) -> Option<[u8; 32]> {
        let h = &self.manifest_sha256;
        if h.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(h.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(out)
    }
}
