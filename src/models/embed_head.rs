//! Token embeddings and the LM head, resident or streamed, shared by the architectures that
//! read them through a [`WeightStore`]: a streamed embedding is read row by row (one ad-hoc read
//! per token), a streamed head in chunks of rows that fit a stream buffer.

use std::io;

use super::layers::{mm, rms_norm_rows};
use super::loading::{mat, MatRef};
use super::Logits;
use crate::backend::cpu::{matmul, matvec};
use crate::quant::dequantize_row;
use crate::source::tensor::TensorInfo;
use crate::store::{ReadRange, Unit, WeightStore, IO_ALIGN};

/// How the LM head (`vocab × hidden` matrix) is held.
pub enum Head {
    /// One resident unit holding the whole matrix.
    Resident { unit: usize, mat: MatRef },
    /// Streamed in chunks of rows: (unit, first row, matrix of the chunk).
    Chunks(Vec<(usize, usize, MatRef)>),
}

/// How embedding rows are found.
pub enum Embedding {
    /// In a resident unit.
    Resident { unit: usize, mat: MatRef },
    /// Read row by row from the file when needed.
    Streamed(TensorInfo),
}

/// Units reading the head tensor `t` (`[hidden, vocab]` in GGML order) in chunks of whole rows
/// whose aligned span fits `slot` bytes; each with its first row and matrix view.
pub fn head_chunks(t: &TensorInfo, slot: usize) -> Vec<(Unit, usize, MatRef)> {
    let (d, vocab) = (t.shape[0] as usize, t.shape[1] as usize);
    let row_bytes = t.ty.row_bytes(d).expect("validated row size");
    let rows_per = (slot.saturating_sub(IO_ALIGN * 2) / row_bytes).max(1);
    let mut out = Vec::new();
    let mut r0 = 0;
    while r0 < vocab {
        let rows = rows_per.min(vocab - r0);
        out.push((
            Unit {
                pieces: None,
                ranges: vec![ReadRange {
                    file: t.file,
                    offset: t.offset + (r0 * row_bytes) as u64,
                    len: rows * row_bytes,
                }],
            },
            r0,
            MatRef {
                piece: 0,
                offset: 0,
                ty: t.ty,
                rows,
                cols: d,
                bytes: rows * row_bytes,
            },
        ));
        r0 += rows;
    }
    out
}

/// A resident head or embedding over a unit holding tensor `t` alone.
pub fn whole(t: &TensorInfo) -> MatRef {
    mat(t, (0, 0))
}

impl Head {
    /// Queues the streamed chunks (nothing when resident).
    pub fn plan(&self, store: &mut WeightStore) {
        store.plan(self.units());
    }

    /// The head's matrices with their units and first rows: one for a resident head, one per
    /// chunk for a streamed one.
    pub fn parts(&self) -> Vec<(usize, usize, MatRef)> {
        match self {
            Head::Resident { unit, mat } => vec![(*unit, 0, *mat)],
            Head::Chunks(ch) => ch.clone(),
        }
    }

    /// The units a pass reads the head from when it is streamed (its chunks, in order); none
    /// when it is resident.
    pub fn units(&self) -> Vec<usize> {
        match self {
            Head::Chunks(ch) => ch.iter().map(|(u, _, _)| *u).collect(),
            Head::Resident { .. } => Vec::new(),
        }
    }

    /// The final RMSNorm (weight `norm`, `hidden` wide) and the LM head over the last row of
    /// `x` (`n × hidden`) or every row ([`Logits`]): `vocab` or `n × vocab` logits.
    ///
    /// Errors: a streamed chunk could not be read.
    pub fn final_logits(
        &self,
        store: &mut WeightStore,
        x: &[f32],
        norm: &[f32],
        eps: f32,
        which: Logits,
        vocab: usize,
    ) -> io::Result<Vec<f32>> {
        let d = norm.len();
        let n = x.len() / d;
        let rows = match which {
            Logits::Last => n - 1..n,
            Logits::All => 0..n,
        };
        let m = rows.len();
        let mut h = vec![0f32; m * d];
        rms_norm_rows(&x[rows.start * d..rows.end * d], norm, eps, &mut h);
        let mut out = vec![0f32; m * vocab];
        self.logits(store, &h, m, vocab, &mut out)?;
        Ok(out)
    }

    /// Logits of `m` normed rows `h` (`m × hidden`) into `out` (`m × vocab`).
    ///
    /// Errors: a streamed chunk could not be read.
    pub fn logits(
        &self,
        store: &mut WeightStore,
        h: &[f32],
        m: usize,
        vocab: usize,
        out: &mut [f32],
    ) -> io::Result<()> {
        match self {
            Head::Resident { unit, mat } => store.with_unit(*unit, |u| mm(&mat.view(u), h, m, out)),
            Head::Chunks(chunks) => {
                let mut tmp = Vec::new();
                for (unit, r0, mr) in chunks {
                    store.with_unit(*unit, |u| {
                        let w = mr.view(u);
                        if m == 1 {
                            matvec(&w, h, &mut out[*r0..*r0 + mr.rows]);
                        } else {
                            tmp.resize(m * mr.rows, 0.0);
                            matmul(&w, h, m, &mut tmp);
                            for i in 0..m {
                                out[i * vocab + r0..i * vocab + r0 + mr.rows]
                                    .copy_from_slice(&tmp[i * mr.rows..(i + 1) * mr.rows]);
                            }
                        }
                    })?;
                }
                Ok(())
            }
        }
    }
}

impl Embedding {
    /// Queues one row read per token when streamed (nothing when resident).
    pub fn plan(&self, store: &mut WeightStore, tokens: &[u32], d: usize) {
        if let Embedding::Streamed(t) = self {
            let rb = t.ty.row_bytes(d).expect("validated row size");
            for &tok in tokens {
                store.plan_adhoc(Unit {
                    pieces: None,
                    ranges: vec![ReadRange {
                        file: t.file,
                        offset: t.offset + (tok as usize * rb) as u64,
                        len: rb,
                    }],
                });
            }
        }
    }

    /// Writes the embedding rows of `tokens` into `x` (`n × d`), unscaled.
    ///
    /// Errors: a streamed row could not be read.
    pub fn rows(
        &self,
        store: &mut WeightStore,
        tokens: &[u32],
        d: usize,
        x: &mut [f32],
    ) -> io::Result<()> {
        for (t, &tok) in tokens.iter().enumerate() {
            let row = &mut x[t * d..(t + 1) * d];
            match self {
                Embedding::Resident { unit, mat } => store.with_unit(*unit, |u| {
                    dequantize_row(mat.ty, mat.view(u).row(tok as usize), row)
                })?,
                Embedding::Streamed(t) => {
                    store.with_adhoc(|u| dequantize_row(t.ty, u.piece(0), row))?
                }
            }
        }
        Ok(())
    }
}
