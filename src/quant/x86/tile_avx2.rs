//! AVX2 batch tiles (see `quant/tile.rs`): the level's single dots run for several weight
//! rows and tokens at once, each output with exactly its single dot's operations. With 16
//! registers, the independent accumulator chains of one dot are run one after another
//! instead of side by side:
//!
//! - f32 tile, 2 rows × 4 tokens: element `32k + j` goes to accumulator `j / 8`, lane
//!   `j % 8` (fma), as `dot_f32row`; one pass per accumulator (8 registers), then
//!   `finish_avx2` over the four and the tail.
//! - prepared tile, 2 rows × 3 tokens: the block-scale scheme of `avx2_q32` (per block
//!   `s = q0 * x0`, `s = fma(qk, xk, s)` for `k = 1, 2, 3`, `acc[b % 2] = fma(d, s, acc[b % 2])`);
//!   one pass over the even blocks, one over the odd, then the level's reduction of
//!   `[acc0, acc1, 0, 0]`.

// Register tiles are indexed by row, token and accumulator: index loops say which is which.
#![allow(clippy::needless_range_loop)]
use super::common::finish_avx2;
use crate::quant::tile::{tail_dot, tile_len, TileFn, TileKernel};
use crate::quant::ROUND;
use std::arch::x86_64::*;

const FR: usize = 2;
const FT: usize = 4;
const PR: usize = 2;
const PT: usize = 3;

/// The f32 tile (safe wrapper; only reachable through the detected-level table).
fn f32_tile(w: &[f32], nr: usize, x: &[f32], nt: usize, out: &mut [f32]) {
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn inner(wp: [*const f32; FR], xp: [*const f32; FT], rounds: usize) -> [[f32; FT]; FR] {
        let z = _mm256_setzero_ps();
        let mut all = [[[z; 4]; FT]; FR];
        for g in 0..4 {
            let mut acc = [[z; FT]; FR];
            for i in 0..rounds {
                let o = i * ROUND + 8 * g;
                let mut wv = [z; FR];
                for r in 0..FR {
                    wv[r] = _mm256_loadu_ps(wp[r].add(o));
                }
                for t in 0..FT {
                    let xv = _mm256_loadu_ps(xp[t].add(o));
                    for r in 0..FR {
                        acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
                    }
                }
            }
            for r in 0..FR {
                for t in 0..FT {
                    all[r][t][g] = acc[r][t];
                }
            }
        }
        let mut s = [[0f32; FT]; FR];
        for r in 0..FR {
            for t in 0..FT {
                s[r][t] = finish_avx2(&all[r][t]);
            }
        }
        s
    }
    let len = tile_len(w.len(), nr, x, nt, out);
    let full = len / ROUND * ROUND;
    let wp: [*const f32; FR] = std::array::from_fn(|r| w[r.min(nr - 1) * len..].as_ptr());
    let xp: [*const f32; FT] = std::array::from_fn(|t| x[t.min(nt - 1) * len..].as_ptr());
    // SAFETY: the table holding this function is handed out only after runtime detection of
    // the target features; every pointer starts a row of `len >= full` elements (lengths
    // checked by `tile_len`; padding rows and tokens repeat the last valid one).
    let s = unsafe { inner(wp, xp, full / ROUND) };
    for r in 0..nr {
        for t in 0..nt {
            let tail = tail_dot(
                &w[r * len + full..(r + 1) * len],
                &x[t * len + full..(t + 1) * len],
            );
            out[r * nt + t] = s[r][t] + tail;
        }
    }
}

/// The prepared (block-scale) tile (safe wrapper; only reachable through the detected-level
/// table).
fn prep_tile(q: &[f32], d: &[f32], nr: usize, x: &[f32], nt: usize, out: &mut [f32]) {
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pass(
        qp: &[*const f32; PR],
        dp: &[*const f32; PR],
        xp: &[*const f32; PT],
        first: usize,
        nb: usize,
    ) -> [[__m256; PT]; PR] {
        let z = _mm256_setzero_ps();
        let mut acc = [[z; PT]; PR];
        let mut b = first;
        while b < nb {
            let o = 32 * b;
            let mut s = [[z; PT]; PR];
            for k in 0..4 {
                let mut qv = [z; PR];
                for r in 0..PR {
                    qv[r] = _mm256_loadu_ps(qp[r].add(o + 8 * k));
                }
                for t in 0..PT {
                    let xv = _mm256_loadu_ps(xp[t].add(o + 8 * k));
                    for r in 0..PR {
                        s[r][t] = if k == 0 {
                            _mm256_mul_ps(qv[r], xv)
                        } else {
                            _mm256_fmadd_ps(qv[r], xv, s[r][t])
                        };
                    }
                }
            }
            for r in 0..PR {
                let dv = _mm256_set1_ps(*dp[r].add(b));
                for t in 0..PT {
                    acc[r][t] = _mm256_fmadd_ps(dv, s[r][t], acc[r][t]);
                }
            }
            b += 2;
        }
        acc
    }
    let len = tile_len(q.len(), nr, x, nt, out);
    let nb = len / 32;
    assert!(
        len == nb * 32 && d.len() == nr * nb,
        "prepared tile length mismatch"
    );
    let qp: [*const f32; PR] = std::array::from_fn(|r| q[r.min(nr - 1) * len..].as_ptr());
    let dp: [*const f32; PR] = std::array::from_fn(|r| d[r.min(nr - 1) * nb..].as_ptr());
    let xp: [*const f32; PT] = std::array::from_fn(|t| x[t.min(nt - 1) * len..].as_ptr());
    // SAFETY: as for `f32_tile`; `q` and `x` rows hold `32 * nb` values, `d` rows `nb`.
    let (a0, a1) = unsafe { (pass(&qp, &dp, &xp, 0, nb), pass(&qp, &dp, &xp, 1, nb)) };
    for r in 0..nr {
        for t in 0..nt {
            // SAFETY: the features were detected (see above).
            out[r * nt + t] = unsafe { finish2(a0[r][t], a1[r][t]) };
        }
    }
}

/// The level's reduction over `[acc0, acc1, 0, 0]` (as `avx2_q32`'s).
#[target_feature(enable = "avx2,fma,f16c")]
fn finish2(a0: __m256, a1: __m256) -> f32 {
    let z = _mm256_setzero_ps();
    finish_avx2(&[a0, a1, z, z])
}

/// The level's f32 tile.
pub(crate) const F32_TILE: Option<TileKernel> = Some(TileKernel {
    f: TileFn::F32(f32_tile),
    rows: FR,
    tokens: FT,
});

/// The level's prepared tile (Q8_0, Q4_0, Q5_0).
pub(crate) const PREP_TILE: Option<TileKernel> = Some(TileKernel {
    f: TileFn::Prepared(prep_tile),
    rows: PR,
    tokens: PT,
});
