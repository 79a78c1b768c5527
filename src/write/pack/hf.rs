//! Packs of Hugging Face folders: the source's tensors (stacked experts, as GPT-OSS stores
//! them, split per expert) and its identity (layout in [`crate::source::pack`]); the
//! `model_type`s packed are the registry's ([`crate::models::Family::pack_experts`]).

use std::fs::File;
use std::io::Read;
use std::path::Path;

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

use super::input::{absolute, check_loadable, pack_experts, split_stacked, PackSource};
use crate::models::registry::by_model_type;
use crate::models::FAMILIES;
use crate::source::hf::HfModel;
use crate::source::pack::{hex, SourceIdentity};

/// The Hugging Face folder `src` as a [`PackSource`].
///
/// Errors: the folder cannot be opened ([`HfModel::open`]), its `model_type` cannot be packed,
/// its `config.json` is refused by the family's loader ([`crate::models::Family::check_hf`]),
/// or a tensor is ([`check_loadable`]).
pub(super) fn hf_source(src: &Path) -> Result<PackSource> {
    let hf = HfModel::open(src)?;
    let mt = hf.model_type()?;
    let experts = pack_experts(src, "model_type", mt, |f| f.model_types)?;
    // the config as loading reads it, before anything is written
    let family = by_model_type(FAMILIES, mt);
    if let Some(check) = family.and_then(|f| f.check_hf) {
        check(&hf)?;
    }
    // and every tensor as the family's loader resolves it
    if let Some(load) = family.and_then(|f| f.load_hf) {
        check_loadable(|o| load(&hf, o))?;
    }
    let tensors = split_stacked(&hf.tensors, &experts, &src.display().to_string())?;
    Ok(PackSource {
        identity: SourceIdentity {
            path: absolute(src).display().to_string(),
            format: "hf".into(),
            architecture: mt.to_string(),
            headers_sha256: source_hash(&hf)?,
        },
        config: hf.config.clone(),
        files: hf.files.clone(),
        tensors,
        experts,
        gguf: None,
        folder: Some(src.to_path_buf()),
    })
}

/// SHA-256 over `config.json` and every safetensors header (8-byte length and JSON).
fn source_hash(hf: &HfModel) -> Result<String> {
    let mut h = Sha256::new();
    h.update(std::fs::read(hf.config_path())?);
    for p in &hf.files {
        let mut f = File::open(p).with_context(|| format!("{}", p.display()))?;
        let mut n = [0u8; 8];
        f.read_exact(&mut n)
            .with_context(|| format!("{}", p.display()))?;
        let len = u64::from_le_bytes(n).min(100 << 20);
        let mut head = vec![0u8; len as usize];
        f.read_exact(&mut head)
            .with_context(|| format!("{}", p.display()))?;
        h.update(n);
        h.update(&head);
    }
    Ok(hex(&h.finalize()))
}
