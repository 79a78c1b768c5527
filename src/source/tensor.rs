//! The tensor index: where one tensor of a model lives (file, byte range) and how it is
//! encoded (GGML type, shape). GGUF files, Hugging Face folders and packs all describe their
//! tensors this way, and the model loaders read nothing else.

use crate::quant::GgmlType;

/// Where one tensor lives and how it is encoded.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    pub ty: GgmlType,
    /// Dimensions in GGML order: `shape[0]` (`ne[0]`) is the contiguous row length.
    pub shape: Vec<u64>,
    /// Index into the model's files ([`GgufModel::files`](crate::source::gguf::GgufModel::files),
    /// [`HfModel::files`](crate::source::hf::HfModel::files)).
    pub file: usize,
    /// Absolute byte offset of the tensor's data in its file.
    pub offset: u64,
    /// Byte length of the tensor's data.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Number of elements (product of `shape`; 1 for a 0-dimensional tensor). Saturates
    /// instead of overflowing for hand-made infos; infos from a file never overflow.
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().fold(1u64, |a, &d| a.saturating_mul(d))
    }

    /// Row length in elements: `shape[0]` (`ne[0]`), 1 for a 0-dimensional tensor.
    pub fn cols(&self) -> u64 {
        self.shape.first().copied().unwrap_or(1)
    }

    /// Number of rows: the product of `shape[1..]` (1 for 1-dimensional tensors).
    pub fn rows(&self) -> u64 {
        self.shape
            .iter()
            .skip(1)
            .fold(1u64, |a, &d| a.saturating_mul(d))
    }

    /// Slice `i` of `n` along the outermost dimension (e.g. one expert of a GGUF stacked
    /// `ffn_*_exps` tensor, GGML shape `[cols, rows, n]`): named `NAME[i]`, with the remaining
    /// shape and its byte range. The byte size must be a multiple of `n` (a checked shape
    /// guarantees it).
    pub fn slice_outer(&self, i: usize, n: usize) -> TensorInfo {
        let each = self.n_bytes / n as u64;
        let mut shape = self.shape[..self.shape.len() - 1].to_vec();
        if shape.is_empty() {
            shape.push(1);
        }
        TensorInfo {
            name: format!("{}[{i}]", self.name),
            ty: self.ty,
            shape,
            file: self.file,
            offset: self.offset + i as u64 * each,
            n_bytes: each,
        }
    }
}
