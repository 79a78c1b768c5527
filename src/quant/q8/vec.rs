//! One token's quantized activations laid out for the single-row q8 dots (`--numerics q8`
//! matvec): the weight rows are read as stored (no preparation per call), so the activation
//! bytes are permuted once per matvec into the order in which a level's kernel unpacks a
//! weight block's values, and the per-block sums that undo the kernels' unsigned offsets are
//! taken once.
//!
//! The values, scales and integer sums are those of [`Q8Acts`] (the same quantization as
//! the batched path), so each row's dot can follow the batched path's float order exactly
//! (see `quant::x86::q8_vec_avx512`).

use super::acts::{ActFormat, Q8Acts, QK};

/// How a weight type's kernel reads the activation bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum VecLayout {
    /// Q8_0 blocks, in pairs: `[a_b[0..32], a_{b+1}[0..32]]` (64 bytes per pair of blocks; a
    /// missing last block is zeros): Q8_0, Q4_0, Q5_0.
    Natural32,
    /// Q8_K superblocks in element order (Q6_K).
    NaturalK,
    /// Q8_K superblocks as Q4_K's 64-byte loads unpack them: per half `h` of 128 values,
    /// `[a[0..32], a[64..96], a[32..64], a[96..128]]` (offsets within the half).
    NibbleK,
}

impl VecLayout {
    /// Values per activation block of the layout (32 or 256).
    pub(crate) fn format_block(self) -> usize {
        match self.format() {
            ActFormat::Q8_0 => 32,
            ActFormat::Q8K => QK,
        }
    }

    /// The activation format of the layout.
    pub(crate) fn format(self) -> ActFormat {
        match self {
            VecLayout::Natural32 => ActFormat::Q8_0,
            VecLayout::NaturalK | VecLayout::NibbleK => ActFormat::Q8K,
        }
    }
}

/// One activation row for the single-row kernels: `q` (permuted by the layout; 32-value
/// layouts padded to whole pairs of blocks), the scales `d` (one per block or superblock),
/// for the 32-value layouts the sum of each block's `q` (`sum`), for the K layouts the sums
/// of each 16 (`bs16`, 16 per superblock) and of each 32 (`bs32`, 8 per superblock) in
/// element order.
#[derive(Default)]
pub(crate) struct VecActs {
    pub cols: usize,
    pub layout: Option<VecLayout>,
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    pub sum: Vec<i32>,
    pub bs16: Vec<i16>,
    pub bs32: Vec<i16>,
    base: Q8Acts,
}

impl VecActs {
    /// Quantizes `x` (one row; its length a multiple of the format's block) as the batched
    /// path does and lays it out for `layout`, reusing the buffers.
    pub(crate) fn build(&mut self, layout: VecLayout, x: &[f32]) {
        let cols = x.len();
        self.base.quantize(layout.format(), x, cols);
        self.cols = cols;
        self.layout = Some(layout);
        let base = &self.base;
        self.d.clear();
        self.d.extend_from_slice(&base.d);
        match layout {
            VecLayout::Natural32 => {
                let nb = cols / 32;
                self.q.clear();
                self.q.resize(nb.div_ceil(2) * 64, 0);
                self.sum.clear();
                for (b, src) in base.qs.chunks_exact(32).enumerate() {
                    let (p, o) = (b / 2, b % 2);
                    self.q[64 * p + 32 * o..][..32].copy_from_slice(src);
                    self.sum.push(src.iter().map(|&v| v as i32).sum());
                }
            }
            VecLayout::NaturalK | VecLayout::NibbleK => {
                self.q.clear();
                if layout == VecLayout::NaturalK {
                    self.q.extend_from_slice(&base.qs);
                } else {
                    for half in base.qs.chunks_exact(128) {
                        for o in [0, 64, 32, 96] {
                            self.q.extend_from_slice(&half[o..o + 32]);
                        }
                    }
                }
                self.bs16.clear();
                self.bs16.extend_from_slice(&base.bsums);
                self.bs32.clear();
                self.bs32
                    .extend(base.bsums.chunks_exact(2).map(|p| p[0] + p[1]));
            }
        }
        debug_assert!(layout.format() != ActFormat::Q8K || cols.is_multiple_of(QK));
    }
}

/// A single-row kernel: `out[i]` = the q8 dot of row `r0 + i` (`i < nr`, `1 <= nr <= 16`) of
/// the matrix `data` (rows of `rb` bytes) with `a`, equal bit for bit to the level's batched
/// path for the same activation row.
pub(crate) type VecRowsFn =
    fn(data: &[u8], rb: usize, r0: usize, nr: usize, a: &VecActs, out: &mut [f32]);

/// Rows per call of a [`VecRowsFn`].
pub(crate) const VEC_ROWS: usize = 16;

/// A multi-row kernel: `out[16 t + i]` = the q8 dot of row `r0 + i` (`i < nr`,
/// `1 <= nr <= 16`) of the matrix `data` (rows of `rb` bytes) with `acts[t]`
/// (`1 <= acts.len() <=` [`MULTI_ACTS`]), equal bit for bit to the single-row kernel's value
/// ([`VecRowsFn`]) for that activation row alone.
pub(crate) type MultiRowsFn =
    fn(data: &[u8], rb: usize, r0: usize, nr: usize, acts: &[VecActs], out: &mut [f32]);

/// Most activation rows one call of a [`MultiRowsFn`] takes (one f32 accumulator register
/// each at AVX-512).
pub(crate) const MULTI_ACTS: usize = 8;
