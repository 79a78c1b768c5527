//! AVX-512 batch tiles (see `quant/tile.rs`): the level's single dots run for several weight
//! rows and tokens at once, each output with exactly its single dot's operations.
//!
//! - f32 tile, 3 rows × up to 12 tokens: element `32k + j` goes to accumulator `j / 16`, lane
//!   `j % 16` (fma), as `dot_f32row`; the tokens go in register groups of 4 (24
//!   accumulators; each round loads 3 weight and 4 activation vectors per half for 12 fmas),
//!   one group after another over the same 3 rows, which the first group has brought into
//!   L1; `finish_avx512`, then the tail.
//!
//! Every type's dot at this level is `dot_f32` over its dequantized row, so this is the
//! level's only tile.

// Register tiles are indexed by row, token and accumulator: index loops say which is which.
#![allow(clippy::needless_range_loop)]
use super::common::finish_avx512;
use crate::quant::tile::{tail_dot, tile_len, TileFn, TileKernel};
use crate::quant::ROUND;
use std::arch::x86_64::*;

const FR: usize = 3;
/// Tokens of one register group.
const FT: usize = 4;
/// Register groups per call.
const FG: usize = 3;

/// The f32 tile (safe wrapper; only reachable through the detected-level table).
fn f32_tile(w: &[f32], nr: usize, x: &[f32], nt: usize, out: &mut [f32]) {
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn group(
        wp: &[*const f32; FR],
        xp: &[*const f32; FT],
        rounds: usize,
    ) -> [[f32; FT]; FR] {
        let z = _mm512_setzero_ps();
        let mut acc = [[[z; 2]; FT]; FR];
        for i in 0..rounds {
            let o = i * ROUND;
            for g in 0..2 {
                let mut wv = [z; FR];
                for r in 0..FR {
                    wv[r] = _mm512_loadu_ps(wp[r].add(o + 16 * g));
                }
                for t in 0..FT {
                    let xv = _mm512_loadu_ps(xp[t].add(o + 16 * g));
                    for r in 0..FR {
                        acc[r][t][g] = _mm512_fmadd_ps(wv[r], xv, acc[r][t][g]);
                    }
                }
            }
        }
        let mut s = [[0f32; FT]; FR];
        for r in 0..FR {
            for t in 0..FT {
                s[r][t] = finish_avx512(&acc[r][t]);
            }
        }
        s
    }
    let len = tile_len(w.len(), nr, x, nt, out);
    assert!(nr <= FR && nt <= FT * FG, "tile too large");
    let full = len / ROUND * ROUND;
    let wp: [*const f32; FR] = std::array::from_fn(|r| w[r.min(nr - 1) * len..].as_ptr());
    for g0 in (0..nt).step_by(FT) {
        let gt = FT.min(nt - g0);
        let xp: [*const f32; FT] =
            std::array::from_fn(|t| x[(g0 + t.min(gt - 1)) * len..].as_ptr());
        // SAFETY: the table holding this function is handed out only after runtime detection
        // of the target features; every pointer starts a row of `len >= full` elements
        // (lengths checked by `tile_len`; padding rows and tokens repeat the last valid one).
        let s = unsafe { group(&wp, &xp, full / ROUND) };
        for r in 0..nr {
            for t in 0..gt {
                out[r * nt + g0 + t] = if full == len {
                    s[r][t]
                } else {
                    s[r][t]
                        + tail_dot(
                            &w[r * len + full..(r + 1) * len],
                            &x[(g0 + t) * len + full..(g0 + t + 1) * len],
                        )
                };
            }
        }
    }
}

/// The level's f32 tile.
pub(crate) const F32_TILE: Option<TileKernel> = Some(TileKernel {
    f: TileFn::F32(f32_tile),
    rows: FR,
    tokens: FT * FG,
});
