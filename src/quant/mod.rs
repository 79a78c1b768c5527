//! Weight encodings: block layouts, dequantization and dot products against f32 activations.
//!
//! Block formats follow the GGML/GGUF definitions (ggml `ggml-common.h` documents the layouts);
//! every kernel here is our own implementation, checked against the scalar reference in tests.

/// A GGML tensor type id as stored in GGUF tensor infos (`ggml_type` numbering).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    BF16,
}

impl GgmlType {
    /// Maps a GGUF `ggml_type` id to a type; `None` for ids we do not know.
    pub fn from_u32(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            9 => Self::Q8_1,
            10 => Self::Q2_K,
            11 => Self::Q3_K,
            12 => Self::Q4_K,
            13 => Self::Q5_K,
            14 => Self::Q6_K,
            15 => Self::Q8_K,
            30 => Self::BF16,
            _ => return None,
        })
    }

    /// The GGUF `ggml_type` id.
    pub fn id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q5_0 => 6,
            Self::Q5_1 => 7,
            Self::Q8_0 => 8,
            Self::Q8_1 => 9,
            Self::Q2_K => 10,
            Self::Q3_K => 11,
            Self::Q4_K => 12,
            Self::Q5_K => 13,
            Self::Q6_K => 14,
            Self::Q8_K => 15,
            Self::BF16 => 30,
        }
    }

    /// Elements per block (1 for plain float types, 32 for legacy quants, 256 for k-quants).
    pub fn block_elems(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q4_0 | Self::Q4_1 | Self::Q5_0 | Self::Q5_1 | Self::Q8_0 | Self::Q8_1 => 32,
            Self::Q2_K | Self::Q3_K | Self::Q4_K | Self::Q5_K | Self::Q6_K | Self::Q8_K => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::Q8_0 => 34,
            Self::Q8_1 => 36,
            Self::Q2_K => 84,
            Self::Q3_K => 110,
            Self::Q4_K => 144,
            Self::Q5_K => 176,
            Self::Q6_K => 210,
            Self::Q8_K => 292,
        }
    }

    /// Bytes of a row of `n` elements; `None` when `n` is not a whole number of blocks
    /// or the size overflows.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        if n % self.block_elems() != 0 {
            return None;
        }
        (n / self.block_elems()).checked_mul(self.block_bytes())
    }

    /// Whether this crate has dequantization and dot-product kernels for the type.
    pub fn has_kernels(self) -> bool {
        matches!(
            self,
            Self::F32
                | Self::F16
                | Self::BF16
                | Self::Q4_0
                | Self::Q5_0
                | Self::Q8_0
                | Self::Q4_K
                | Self::Q6_K
        )
    }

    /// The GGML name (`"Q4_K"`, `"F32"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q8_1 => "Q8_1",
            Self::Q2_K => "Q2_K",
            Self::Q3_K => "Q3_K",
            Self::Q4_K => "Q4_K",
            Self::Q5_K => "Q5_K",
            Self::Q6_K => "Q6_K",
            Self::Q8_K => "Q8_K",
            Self::BF16 => "BF16",
        }
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Dequantizes one row: `src` holds `dst.len()` elements encoded as `ty`
/// (`src.len() == ty.row_bytes(dst.len())`). Panics on a length mismatch or a type without
/// kernels (`has_kernels`); loaders validate both before any compute.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    let _ = (ty, src, dst);
    todo!("quant kernels")
}

/// Dot product of one encoded row (`row`, `x.len()` elements of `ty`) with f32 activations `x`.
/// Panics on a length mismatch or a type without kernels. The result depends only on the
/// inputs, never on the thread that runs it.
pub fn dot_row(ty: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    let _ = (ty, row, x);
    todo!("quant kernels")
}
