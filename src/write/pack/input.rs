//! [`PackSource`]: a model to pack, whatever its format, as the Hugging Face (`hf.rs`) and GGUF
//! (`gguf.rs`) readers of this module describe it to the planner and writer.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

use crate::models::registry::{ExpertNames, Family, ModelAndStore};
use crate::models::{BudgetTooSmall, LoadOptions, FAMILIES};
use crate::source::gguf::GgufModel;
use crate::source::pack::SourceIdentity;
use crate::source::tensor::TensorInfo;

/// A model to pack, whatever its format: what the manifest records of it, its files and its
/// tensor index.
pub(super) struct PackSource {
    pub identity: SourceIdentity,
    /// What the manifest keeps as `config`.
    pub config: serde_json::Value,
    pub files: Vec<PathBuf>,
    /// Every tensor; stacked experts are listed per expert (`NAME[E]`, [`split_stacked`]).
    pub tensors: Vec<TensorInfo>,
    /// How the family names its routed-expert tensors: which tensors form each record, and
    /// in what order ([`Family::pack_experts`]).
    pub experts: ExpertNames,
    /// GGUF sources: the model whose metadata heads the spine file.
    pub gguf: Option<GgufModel>,
    /// Hugging Face sources: the folder whose small files (config, tokenizer) are copied.
    pub folder: Option<PathBuf>,
}

/// `p` made absolute (as given when it cannot be resolved).
pub(super) fn absolute(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

/// The expert naming of the family whose `key` names (its `model_types` or
/// `gguf_architectures`) include `name`, a source's `model_type` or GGUF architecture (`kind`
/// says which, for the error), when `deltafin pack` packs it; `label` is the source's path.
///
/// Errors: no family packs `name` (the message lists those packed, from the registry).
pub(super) fn pack_experts(
    label: &Path,
    kind: &str,
    name: &str,
    key: impl Fn(&Family) -> &'static [&'static str],
) -> Result<ExpertNames> {
    let family = FAMILIES.iter().find(|f| key(f).contains(&name));
    match family.and_then(Family::pack_experts) {
        Some(x) => Ok(x),
        None => bail!(
            "{}: packing {kind} '{name}' is not supported yet (supported: {})",
            label.display(),
            crate::models::registry::names(FAMILIES, key, |f| f.pack_experts().is_some())
        ),
    }
}

/// Checks, before anything is written, that the family's loader accepts every tensor of the
/// source (names, shapes, types: what `run` would refuse after the pack is made): `load` is
/// the family's loader over the opened source, called with a RAM budget of 0 bytes, so it
/// resolves and checks every tensor and is then stopped by the budget check of
/// `models::budget::place` before it reads a weight byte or opens a store.
///
/// Errors: whatever the loader refuses other than the budget (a missing tensor, a shape or
/// type it does not take), as loading would report it.
pub(super) fn check_loadable(
    load: impl FnOnce(&LoadOptions) -> Result<ModelAndStore>,
) -> Result<()> {
    let opts = LoadOptions {
        ram_budget: Some(0),
        ..LoadOptions::default()
    };
    match load(&opts) {
        Ok(_) => Ok(()),
        Err(e) if e.chain().any(|c| c.is::<BudgetTooSmall>()) => Ok(()),
        Err(e) => Err(e),
    }
}

/// `tensors` with every stacked expert tensor ([`ExpertNames::is_stacked`]: all experts of a
/// layer, experts outermost) replaced by its slices `NAME[E]` ([`TensorInfo::slice_outer`]),
/// so that expert E's slices go to its record; `label` names the source in errors.
///
/// Errors: a stacked tensor holds no experts, or bytes that do not split evenly among them.
pub(super) fn split_stacked(
    tensors: &[TensorInfo],
    experts: &ExpertNames,
    label: &str,
) -> Result<Vec<TensorInfo>> {
    let mut out = Vec::with_capacity(tensors.len());
    for t in tensors {
        if !experts.is_stacked(&t.name) {
            out.push(t.clone());
            continue;
        }
        let n = t.shape.last().copied().unwrap_or(0) as usize;
        if n == 0 || t.n_bytes % n as u64 != 0 {
            bail!("{label}: tensor '{}' holds no experts", t.name);
        }
        out.extend((0..n).map(|e| t.slice_outer(e, n)));
    }
    Ok(out)
}
