//! [`PackInfo`]: what the model loaders need of an opened pack beyond its tensor index (its
//! folder, the relocation of its logical files, the expert checksums). A leaf that the GGUF
//! and Hugging Face readers can hold while [`super::pack`] opens them. Public as
//! `source::pack::PackInfo`.

use std::path::PathBuf;

use crate::store::relocate::Relocation;
use crate::store::ExpertStore;

/// What the loaders need of a pack beyond its tensor index.
#[derive(Debug)]
pub struct PackInfo {
    /// The pack folder.
    pub dir: PathBuf,
    pub relocation: Relocation,
    /// `checksums[layer][expert]` (empty rows for layers without experts).
    pub checksums: Vec<Vec<[u8; 32]>>,
    /// How errors name each physical file of [`Relocation::files`]: `None` for the spine,
    /// [`Manifest::drive_label`](super::pack::Manifest::drive_label) for a drive file.
    pub labels: Vec<Option<String>>,
}

impl PackInfo {
    /// Readies an expert store opened over [`Relocation::files`]: its errors name each drive
    /// file by its drive ([`DirectFile::set_label`](crate::store::DirectFile::set_label)), and
    /// with `verify` every expert read is checked against its checksum.
    pub fn attach(&self, es: &mut ExpertStore, verify: bool) {
        for (f, l) in es.engine().files().iter().zip(&self.labels) {
            if let Some(l) = l {
                f.set_label(l.clone());
            }
        }
        if verify {
            es.set_checksums(self.checksums.clone());
        }
    }
}
