//! Packs of GGUF models (every `general.architecture` the registry packs:
//! [`crate::models::Family::pack_experts`]): what differs from packing a Hugging Face folder
//! (layout in [`crate::source::pack`]).
//!
//! - The stacked experts `blk.L.ffn_{gate,up,down}_exps.*` (weights of GGML shape
//!   `[cols, rows, n_experts]`, one quantized slice per expert, and GPT-OSS's biases
//!   `[rows, n_experts]`) are split per expert into `NAME[E]` ([`TensorInfo::slice_outer`],
//!   `input.rs`), and expert E's slices become its record, so the manifest lists slices, not
//!   stacked tensors; the GGUF loaders take them where they would cut the stacked tensor
//!   (`models::loading::Tensors::stacked`).
//! - The spine file is itself a GGUF file (GGUF spec, ggml `docs/gguf.md`): the source's
//!   version and metadata (architecture, hyperparameters, tokenizer vocabulary and merges, chat
//!   template; the `split.*` keys of a split source dropped), a tensor table of the spine
//!   tensors only, and their data, each at a 4 KiB boundary of the file (or the source's
//!   `general.alignment` when larger). [`crate::source::pack::open_gguf_pack`] reads the metadata from
//!   it and the tensor index from the manifest. The manifest's `config` keeps the metadata
//!   without its arrays, and `spine_header` the header's length and SHA-256.

use std::io::Read;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use sha2::{Digest, Sha256};

use super::input::{absolute, check_loadable, pack_experts, split_stacked, PackSource};
use crate::models::registry::by_gguf_architecture;
use crate::models::FAMILIES;
use crate::quant::GgmlType;
use crate::source::gguf::{GgufModel, Value};
use crate::source::pack::{hex, PackTensor, SourceIdentity};
use crate::source::tensor::TensorInfo;
use crate::write::gguf_writer::header_at;

/// The GGUF model at `src` (a file, the first part of a split set, or a folder holding one
/// model) as a [`PackSource`]: stacked experts split per expert.
///
/// Errors: the model cannot be opened ([`GgufModel::open_model_path`]), its architecture
/// cannot be packed or its metadata is refused by the family's loader
/// ([`crate::models::Family::check_gguf`]), or a tensor by its loader ([`check_loadable`]), a
/// stacked expert tensor holds no experts, a header
/// cannot be read.
pub(super) fn gguf_source(src: &Path) -> Result<PackSource> {
    let g = GgufModel::open_model_path(src)?;
    let arch = g.architecture()?.to_string();
    let experts = pack_experts(src, "GGUF architecture", &arch, |f| f.gguf_architectures)?;
    // the metadata as loading reads it, before anything is written
    let family = by_gguf_architecture(FAMILIES, &arch);
    if let Some(check) = family.and_then(|f| f.check_gguf) {
        check(&g)?;
    }
    // and every tensor as the family's loader resolves it
    if let Some(load) = family.and_then(|f| f.load_gguf) {
        check_loadable(|o| load(&g, o))?;
    }
    let tensors = split_stacked(&g.tensors, &experts, &g.file_name())?;
    Ok(PackSource {
        identity: SourceIdentity {
            path: absolute(&g.files[0]).display().to_string(),
            format: "gguf".into(),
            architecture: arch,
            headers_sha256: headers_hash(&g)?,
        },
        config: metadata_json(&g),
        files: g.files.clone(),
        tensors,
        experts,
        gguf: Some(g),
        folder: None,
    })
}

/// SHA-256 over every file's bytes before its first tensor's data (the header, metadata and
/// tensor infos, and the padding after them), in file order.
fn headers_hash(g: &GgufModel) -> Result<String> {
    let mut h = Sha256::new();
    for (i, p) in g.files.iter().enumerate() {
        let f = std::fs::File::open(p).with_context(|| format!("{}", p.display()))?;
        let first = g.tensors.iter().filter(|t| t.file == i).map(|t| t.offset);
        let end = first.min().unwrap_or(f.metadata()?.len());
        let mut head = Vec::new();
        f.take(end)
            .read_to_end(&mut head)
            .with_context(|| format!("{}", p.display()))?;
        h.update(&head);
    }
    Ok(hex(&h.finalize()))
}

/// The metadata of `g` without its arrays, as a JSON object (floats that are not finite become
/// `null`).
fn metadata_json(g: &GgufModel) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for (k, v) in &g.metadata {
        let j = match v {
            Value::Array(_) => continue,
            Value::String(s) => serde_json::json!(s),
            Value::Bool(b) => serde_json::json!(b),
            Value::F32(_) | Value::F64(_) => serde_json::json!(v.as_f64()),
            v => match v.as_i64() {
                Some(i) => serde_json::json!(i),
                None => serde_json::json!(v.as_u64()),
            },
        };
        out.insert(k.clone(), j);
    }
    serde_json::Value::Object(out)
}

/// The metadata pairs written into the spine file: all of `g`'s but `split.*`.
fn spine_metadata(g: &GgufModel) -> Vec<(String, Value)> {
    g.metadata
        .iter()
        .filter(|(k, _)| !k.starts_with("split."))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Bytes of the GGUF header of a spine file holding `spine` (in that order).
pub(super) fn header_len(g: &GgufModel, spine: &[&TensorInfo]) -> u64 {
    let infos: Vec<(&str, GgmlType, &[u64], u64)> = spine
        .iter()
        .map(|t| (t.name.as_str(), t.ty, t.shape.as_slice(), 0))
        .collect();
    header_at(g.version, &spine_metadata(g), &infos).len() as u64
}

/// The GGUF header of the spine file whose tensors are the entries of `tensors` in file 0 (the
/// spine), at their offsets.
///
/// Errors: an unknown type id, or a tensor before the end of the header or off the alignment
/// (a plan not made by `plan.rs`).
pub(super) fn spine_header(g: &GgufModel, tensors: &[PackTensor]) -> Result<Vec<u8>> {
    let spine: Vec<&PackTensor> = tensors.iter().filter(|t| t.file == 0).collect();
    let mut infos = Vec::with_capacity(spine.len());
    for t in &spine {
        let ty = GgmlType::from_u32(t.ggml_type)
            .ok_or_else(|| anyhow!("tensor '{}': unknown type id {}", t.name, t.ggml_type))?;
        infos.push((t.name.as_str(), ty, t.shape.as_slice(), 0u64));
    }
    let meta = spine_metadata(g);
    let data_start =
        (header_at(g.version, &meta, &infos).len() as u64).next_multiple_of(g.alignment);
    for (info, t) in infos.iter_mut().zip(&spine) {
        match t.offset.checked_sub(data_start) {
            Some(rel) if rel % g.alignment == 0 => info.3 = rel,
            _ => bail!(
                "tensor '{}' at byte {} of the spine file is not after its GGUF header ({data_start} bytes) at a multiple of {}",
                t.name,
                t.offset,
                g.alignment
            ),
        }
    }
    Ok(header_at(g.version, &meta, &infos))
}
