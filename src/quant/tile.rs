//! Register-blocked tiles for batched matmul: the dots of a few prepared weight rows with a
//! few activation rows at once, each weight vector loaded once and used for every token of
//! the tile (and each activation vector for every row).
//!
//! Every output of a tile is computed by exactly the operations of the level's single dot
//! (`dot_f32` over a dequantized row, or the block-scale `prep_dot`): the same lanes, the
//! same accumulator each element goes to, the same fused or unfused multiply-adds in the same
//! order, the same lane reduction, the same tail. Only the interleaving of independent
//! accumulator chains differs, which cannot change a value, so a tile equals the single dots
//! bit for bit whatever its shape, its padding or the rows and tokens around it.
//!
//! The scalar level's tile is here; the x86 levels' are in `x86/tile_avx2.rs` and
//! `x86/tile_avx512.rs`. NEON has none (the batch falls back to one dot per pair).

use super::scalar::{Accum, Scalar8};
use super::{level_kernels, slot, GgmlType, SimdLevel, ROUND};

/// Dots of `nr` f32 rows (`w`: `nr` rows of `len` elements, back to back) with `nt`
/// activation rows (`x`: `nt` rows of `len`): `out[r * nt + t]` equals the level's
/// `dot_f32(w_r, x_t)` bit for bit. `1 <= nr <= rows`, `1 <= nt <= tokens` of its
/// [`TileKernel`]; panics on a length mismatch.
pub(crate) type F32TileFn = fn(w: &[f32], nr: usize, x: &[f32], nt: usize, out: &mut [f32]);

/// Dots of `nr` prepared rows (`q`: `nr` rows of `len` integer values, `d`: `nr` rows of
/// `len / 32` block scales) with `nt` activation rows: `out[r * nt + t]` equals the level's
/// `prep_dot(q_r, d_r, x_t)` bit for bit. Limits as for [`F32TileFn`].
pub(crate) type PrepTileFn =
    fn(q: &[f32], d: &[f32], nr: usize, x: &[f32], nt: usize, out: &mut [f32]);

/// Which tile a batch plan uses.
#[derive(Clone, Copy)]
pub(crate) enum TileFn {
    /// Over dequantized rows (`RowPlan::Dequant`).
    F32(F32TileFn),
    /// Over prepared rows (`RowPlan::Prepared`; only x86-64 levels have such tiles).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Prepared(PrepTileFn),
}

/// A level's tile for one plan and its largest shape (weight rows × tokens).
#[derive(Clone, Copy)]
pub(crate) struct TileKernel {
    pub f: TileFn,
    pub rows: usize,
    pub tokens: usize,
}

/// The tile matching `row_plan(level, ty)`, or `None` where the level has none (NEON: the
/// caller then runs the plan's single dot per pair). Panics as `row_plan` does.
pub(crate) fn tile_kernel(level: SimdLevel, ty: GgmlType) -> Option<TileKernel> {
    let k = level_kernels(level);
    let prepared = ty != GgmlType::F8_E4M3_B128
        && k.prep[slot(ty).unwrap_or_else(|| panic!("no kernels for {ty}"))].is_some();
    if prepared {
        k.prep_tile
    } else {
        k.f32_tile
    }
}

/// The tail of a float row after its whole rounds, as every level sums it: `t += w * x` in
/// order from zero (two roundings each).
#[inline]
pub(crate) fn tail_dot(w: &[f32], x: &[f32]) -> f32 {
    let mut t = 0f32;
    for (a, b) in w.iter().zip(x) {
        t += a * b;
    }
    t
}

/// Checks a tile's lengths; returns the row length.
#[inline]
pub(crate) fn tile_len(wlen: usize, nr: usize, x: &[f32], nt: usize, out: &[f32]) -> usize {
    assert!(nr >= 1 && nt >= 1, "empty tile");
    let len = x.len() / nt;
    assert!(
        x.len() == nt * len && wlen == nr * len && out.len() >= nr * nt,
        "tile length mismatch"
    );
    len
}

/// Rows × tokens of the scalar tile.
const SR: usize = 2;
const ST: usize = 4;

/// The scalar level's f32 tile ([`Scalar8`]: element `i` to accumulator `i % 8`,
/// `acc += w * x` unfused, its reduction, then the tail).
pub(crate) fn scalar_f32_tile(w: &[f32], nr: usize, x: &[f32], nt: usize, out: &mut [f32]) {
    let len = tile_len(w.len(), nr, x, nt, out);
    let full = len / ROUND * ROUND;
    let wr: [&[f32]; SR] = std::array::from_fn(|r| &w[r.min(nr - 1) * len..][..len]);
    let xt: [&[f32]; ST] = std::array::from_fn(|t| &x[t.min(nt - 1) * len..][..len]);
    let mut acc = [[[0f32; 8]; ST]; SR];
    let mut c = 0;
    while c < full {
        for r in 0..SR {
            let wc = &wr[r][c..c + 8];
            for t in 0..ST {
                let xc = &xt[t][c..c + 8];
                let a = &mut acc[r][t];
                for j in 0..8 {
                    a[j] += wc[j] * xc[j];
                }
            }
        }
        c += 8;
    }
    for r in 0..nr {
        for t in 0..nt {
            let s = Scalar8::from_lanes(acc[r][t]).finish();
            out[r * nt + t] = s + tail_dot(&wr[r][full..], &xt[t][full..]);
        }
    }
}

/// The scalar level's tile table entry.
pub(crate) const SCALAR_F32_TILE: Option<TileKernel> = Some(TileKernel {
    f: TileFn::F32(scalar_f32_tile),
    rows: SR,
    tokens: ST,
});
