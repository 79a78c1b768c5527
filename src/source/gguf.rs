//! GGUF reader (versions 2 and 3), following the GGUF specification in the ggml repository
//! (`docs/gguf.md`). Every size and offset read from a file is checked before use.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::quant::GgmlType;

/// One metadata value. Arrays may nest.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

/// Where one tensor lives and how it is encoded.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    pub ty: GgmlType,
    /// Dimensions in GGML order: `shape[0]` (`ne[0]`) is the contiguous row length.
    pub shape: Vec<u64>,
    /// Index into [`GgufModel::files`].
    pub file: usize,
    /// Absolute byte offset of the tensor's data in its file.
    pub offset: u64,
    /// Byte length of the tensor's data.
    pub n_bytes: u64,
}

/// A GGUF model: one file or all parts of a split (`-00001-of-0000N.gguf`).
#[derive(Clone, Debug)]
pub struct GgufModel {
    pub files: Vec<PathBuf>,
    pub version: u32,
    /// `general.alignment` (default 32).
    pub alignment: u64,
    /// Metadata of the first file (split bookkeeping keys included).
    pub metadata: BTreeMap<String, Value>,
    /// Every tensor of every part, in file order.
    pub tensors: Vec<TensorInfo>,
}
