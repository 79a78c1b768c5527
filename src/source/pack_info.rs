//! [`PackInfo`]: what the model loaders need of an opened pack beyond its tensor index (its
//! folder, the relocation of its logical files, the expert checksums). A leaf that the GGUF
//! and Hugging Face readers can hold while [`super::pack`] opens them. Public as
//! `source::pack::PackInfo`.

use std::path::PathBuf;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::store::checksum::{RecordSum, SpineSums};

use crate::store::relocate::Relocation;
use crate::store::remote::RemoteSpec;
use crate::store::ExpertStore;

/// What the loaders need of a pack beyond its tensor index.
#[derive(Debug)]
pub struct PackInfo {
    /// The pack folder.
    pub dir: PathBuf,
    pub relocation: Relocation,
    /// `checksums[layer][expert]` (empty rows for layers without experts): XXH3-128 when the
    /// manifest records it, else SHA-256.
    pub checksums: Vec<Vec<RecordSum>>,
    /// The spine tensors' checksums (XXH3-128 when the manifest records them, else SHA-256),
    /// checked at every read of the spine unless `--no-verify-experts`
    /// ([`crate::store::checksum::SpineCheck`]).
    pub spine: Arc<SpineSums>,
    /// How errors name each physical file of [`Relocation::files`]: `None` for the spine,
    /// [`Manifest::drive_label`](super::pack::Manifest::drive_label) for a drive file.
    pub labels: Vec<Option<String>>,
    /// The files copied from the source (tokenizer, generation config, ...) whose SHA-256 the
    /// manifest records, as (path, checksum).
    pub copied: Vec<(PathBuf, [u8; 32])>,
    /// For the local copy of a pack on object storage (its folder holds
    /// [`crate::store::remote::spec::MARKER`]): where the records the local tier lacks are
    /// fetched from.
    pub remote: Option<RemoteSpec>,
}

impl PackInfo {
    /// Readies an expert store opened over [`Relocation::files`]: its errors name each drive
    /// file by its drive ([`DirectFile::set_label`](crate::store::DirectFile::set_label)), and
    /// with `verify` every expert read is checked against its checksum. For a pack on object
    /// storage the records are checked whatever `verify` says, and the store fetches what its
    /// local tier lacks ([`ExpertStore::set_remote`]).
    ///
    /// Errors: those of [`ExpertStore::set_remote`].
    pub fn attach(&self, es: &mut ExpertStore, verify: bool) -> std::io::Result<()> {
        for (f, l) in es.engine().files().iter().zip(&self.labels) {
            if let Some(l) = l {
                f.set_label(l.clone());
            }
        }
        if verify || self.remote.is_some() {
            es.set_checksums(self.checksums.clone());
        }
        if let Some(r) = &self.remote {
            es.set_remote(r, &self.dir)?;
        }
        Ok(())
    }

    /// The error message when `record` (expert `expert` of `layer`: its bytes from its first
    /// tensor to the end of its last, as read from the physical files `files` of
    /// [`Relocation::files`]) does not match its checksum; `None` when it matches or the pack
    /// has no such expert.
    pub fn expert_mismatch(
        &self,
        layer: usize,
        expert: usize,
        record: &[u8],
        files: &[usize],
    ) -> Option<String> {
        let want = self.checksums.get(layer)?.get(expert)?;
        if want.matches(record) {
            return None;
        }
        let mut names: Vec<String> = Vec::new();
        for &f in files {
            let n = match self.labels.get(f) {
                Some(Some(l)) => l.clone(),
                _ => self
                    .relocation
                    .files
                    .get(f)
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| format!("file {f}")),
            };
            if !names.contains(&n) {
                names.push(n);
            }
        }
        Some(format!(
            "checksum mismatch in expert {expert} of layer {layer} read from {}",
            names.join("; ")
        ))
    }

    /// What the placement line says of the expert and spine checks (`verify`: they are on).
    pub fn check_note(&self, verify: bool) -> String {
        let algo = self
            .checksums
            .iter()
            .flatten()
            .next()
            .map_or("", RecordSum::algorithm);
        let experts = match (verify, algo) {
            (false, _) => {
                return "; expert records and spine not checked (--no-verify-experts)".into()
            }
            (true, "SHA-256") => "; expert records checked with SHA-256 (the manifest predates \
                 xxh3-128: pack again for the faster check)"
                .into(),
            (true, "") => String::new(),
            (true, a) => format!("; expert records checked with {a}"),
        };
        let spine = match self.spine.algorithm() {
            None => String::new(),
            Some("SHA-256") => "; spine checked with SHA-256 (the manifest predates xxh3-128 \
                 for spine tensors: pack again for the faster check)"
                .into(),
            Some(a) => format!("; spine checked with {a}"),
        };
        experts + &spine
    }

    /// Checks every copied file ([`PackInfo::copied`]) against its checksum (they are small:
    /// `--verify-experts` checks them at load).
    ///
    /// Errors: a file cannot be read or does not match (the message names it).
    pub fn verify_copied(&self) -> anyhow::Result<()> {
        for (p, want) in &self.copied {
            let b = std::fs::read(p)
                .map_err(|e| anyhow::anyhow!("{}: {e} (a file of the pack)", p.display()))?;
            let got: [u8; 32] = Sha256::digest(&b).into();
            if &got != want {
                anyhow::bail!(
                    "{}: checksum mismatch (the file differs from the one packed)",
                    p.display()
                );
            }
        }
        Ok(())
    }
}
