//! [`PackSource`]: a model to pack, whatever its format, as the Hugging Face (`hf.rs`) and GGUF
//! (`gguf.rs`) readers of this module describe it to the planner and writer.

use std::path::{Path, PathBuf};

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
    /// Every tensor; GGUF stacked experts are listed per expert (`NAME[E]`).
    pub tensors: Vec<TensorInfo>,
    /// GGUF sources: the model whose metadata heads the spine file.
    pub gguf: Option<GgufModel>,
    /// Hugging Face sources: the folder whose small files (config, tokenizer) are copied.
    pub folder: Option<PathBuf>,
}

/// `p` made absolute (as given when it cannot be resolved).
pub(super) fn absolute(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}
