//! CPU math: matrix × vector and matrix × matrix over encoded weights, multi-threaded by
//! output rows so the thread count never changes a result.

pub mod ops;

use crate::quant::{self, GgmlType};

/// A row-major weight matrix of `rows` × `cols` elements in its stored encoding
/// (GGML order: `cols` is `ne[0]`, the contiguous dimension). `data.len()` is
/// `rows * ty.row_bytes(cols)`.
#[derive(Clone, Copy, Debug)]
pub struct Matrix<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
}

impl<'a> Matrix<'a> {
    /// Checks that `data` holds exactly `rows` encoded rows of `cols` elements.
    pub fn new(ty: GgmlType, rows: usize, cols: usize, data: &'a [u8]) -> Result<Self, String> {
        let rb = ty
            .row_bytes(cols)
            .ok_or_else(|| format!("{cols} columns is not a whole number of {ty} blocks"))?;
        if rows.checked_mul(rb) != Some(data.len()) {
            return Err(format!(
                "{ty} matrix {rows}x{cols} needs {} bytes, got {}",
                rows as u128 * rb as u128,
                data.len()
            ));
        }
        Ok(Self {
            ty,
            rows,
            cols,
            data,
        })
    }

    /// Bytes of one encoded row.
    pub fn row_bytes(&self) -> usize {
        self.data.len() / self.rows.max(1)
    }

    /// The encoded bytes of row `r`.
    pub fn row(&self, r: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }
}

/// `y = W x`: `x` has `w.cols` elements, `y` has `w.rows`. Each `y[r]` equals
/// `quant::dot_row(w.ty, w.row(r), x)` exactly.
pub fn matvec(w: &Matrix, x: &[f32], y: &mut [f32]) {
    let _ = (w, x, y, quant::dot_row);
    todo!("matvec")
}

/// `Y = X Wᵀ` for a batch: `x` is `n × w.cols` (row-major), `y` is `n × w.rows`. Each
/// `y[t * w.rows + r]` equals `quant::dot_row(w.ty, w.row(r), &x[t * w.cols..][..w.cols])` exactly,
/// so a prompt batch gives the same numbers as token-by-token decode.
pub fn matmul(w: &Matrix, x: &[f32], n: usize, y: &mut [f32]) {
    let _ = (w, x, n, y);
    todo!("matmul")
}
