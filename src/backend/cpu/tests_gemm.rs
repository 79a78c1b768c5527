//! The tiled matmul (`gemm.rs`) against the single-row dots: every output of `matmul_at`
//! equals `quant::dot_row_at` of its row and token bit for bit, for every weight type, batch
//! size, thread count and SIMD level, with rows spanning several panels, tasks and tiles.

use super::*;
use crate::quant::tests::{random_fp8_row, random_row, Rng};
use crate::quant::SLOT_TYPES;

/// Batch sizes: every tile remainder of the levels' tiles (3 and 4 tokens, AVX-512's 12
/// tokens in register groups of 4, or 10 where the rows are longer), and larger.
const BATCHES: [usize; 14] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 17, 25, 64];

/// Columns per type: an odd block count, and for floats a tail after whole rounds.
fn cols_for(ty: GgmlType) -> usize {
    match ty.block_elems() {
        1 => 643,
        32 => 23 * 32,
        128 => 643, // FP8 rows: a short last block
        _ => 3 * 256,
    }
}

#[test]
fn matmul_equals_dot_row_for_every_type_batch_thread_count_and_level() {
    // 131 rows: several panels of the f32 types, a partial panel, a partial last tile at
    // every level (tiles of 2 and 3 rows), several tasks with 2 and 3 threads
    let rows = 131;
    let pools: Vec<rayon::ThreadPool> = [1, 2, 3]
        .iter()
        .map(|&t| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build()
                .unwrap()
        })
        .collect();
    let types = SLOT_TYPES.iter().copied().chain([GgmlType::F8_E4M3_B128]);
    for (i, ty) in types.enumerate() {
        let cols = cols_for(ty);
        let mut rng = Rng::new(1000 + i as u64);
        let mut data = Vec::new();
        for _ in 0..rows {
            if ty == GgmlType::F8_E4M3_B128 {
                data.extend(random_fp8_row(cols, &mut rng));
            } else {
                data.extend(random_row(ty, cols / ty.block_elems(), &mut rng));
            }
        }
        let w = Matrix::new(ty, rows, cols, &data).unwrap();
        let nmax = *BATCHES.iter().max().unwrap();
        let x: Vec<f32> = (0..nmax * cols).map(|_| rng.unit()).collect();
        for level in SimdLevel::available() {
            let want: Vec<f32> = (0..nmax)
                .flat_map(|t| {
                    let xt = &x[t * cols..(t + 1) * cols];
                    (0..rows).map(move |r| quant::dot_row_at(level, ty, w.row(r), xt))
                })
                .collect();
            assert!(want.iter().any(|v| *v != 0.0), "{ty}: all-zero dots");
            for &n in &BATCHES {
                for (p, pool) in pools.iter().enumerate() {
                    let mut y = vec![f32::NAN; n * rows];
                    pool.install(|| matmul_at(level, &w, &x[..n * cols], n, &mut y));
                    for (k, (a, b)) in y.iter().zip(&want[..n * rows]).enumerate() {
                        assert_eq!(
                            a.to_bits(),
                            b.to_bits(),
                            "{ty} {level:?} n={n} threads={} row {} token {}",
                            p + 1,
                            k % rows,
                            k / rows
                        );
                    }
                }
            }
        }
    }
}

/// The tiles reproduce the single dot also on values that make the order visible: rows of
/// alternating huge and tiny values, where any other summation order gives another result.
#[test]
fn matmul_keeps_the_single_dot_order_where_it_matters() {
    let (rows, cols, n) = (5, 97, 6);
    let mut rng = Rng::new(5);
    let wf: Vec<f32> = (0..rows * cols)
        .map(|i| {
            if i % 3 == 0 {
                1e8 * rng.unit()
            } else {
                rng.unit()
            }
        })
        .collect();
    let data: Vec<u8> = wf.iter().flat_map(|v| v.to_le_bytes()).collect();
    let w = Matrix::new(GgmlType::F32, rows, cols, &data).unwrap();
    let x: Vec<f32> = (0..n * cols).map(|_| rng.unit()).collect();
    for level in SimdLevel::available() {
        let mut y = vec![0f32; n * rows];
        matmul_at(level, &w, &x, n, &mut y);
        let mut differs = false;
        for t in 0..n {
            for r in 0..rows {
                let (wr, xt) = (&wf[r * cols..(r + 1) * cols], &x[t * cols..(t + 1) * cols]);
                let want = quant::dot_f32_at(level, wr, xt);
                assert_eq!(
                    y[t * rows + r].to_bits(),
                    want.to_bits(),
                    "{level:?} r{r} t{t}"
                );
                let seq = wr.iter().zip(xt).fold(0f32, |s, (a, b)| s + a * b);
                differs |= seq.to_bits() != want.to_bits();
            }
        }
        // the data does tell summation orders apart (the assertion above is not vacuous)
        assert!(
            differs,
            "{level:?}: level order equals the sequential sum everywhere"
        );
    }
}
