//! The tiled matmul (`gemm.rs`) against the single-row dots: every output of `matmul_at`
//! equals `quant::dot_row_at` of its row and token bit for bit, for every weight type, batch
//! size, thread count and SIMD level, with rows spanning several panels, tasks and tiles.

use super::tests::{fused_matrices, fused_views, FUSED_COLS};
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

/// `matmul_small_many` (several matrices over the same few rows in one parallel region, a
/// decode step's q, k, v or gate and up) equals separate `matmul_at` calls bit for bit for 2
/// to 8 rows, 1 and 3 threads, at every level with a multi-row dot, with matrices of
/// different types and sizes (one below a task's minimum, several split); a type without a
/// multi-row dot or a batch past its maximum is refused, computing nothing.
#[test]
fn matmul_small_many_equals_one_product_per_matrix() {
    let cols = FUSED_COLS;
    let mut rng = Rng::new(77);
    let datas = fused_matrices(&mut rng);
    let ws = fused_views(&datas);
    let wr: Vec<&Matrix> = ws.iter().collect();
    let x: Vec<f32> = (0..8 * cols).map(|_| rng.unit()).collect();
    let mut ran = 0;
    for level in SimdLevel::available() {
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            for n in 2..=8 {
                let x = &x[..n * cols];
                let mut ys: Vec<Vec<f32>> = ws.iter().map(|w| vec![f32::NAN; n * w.rows]).collect();
                let done = pool.install(|| {
                    let mut outs: Vec<&mut [f32]> =
                        ys.iter_mut().map(|y| y.as_mut_slice()).collect();
                    small_batch::matmul_small_many(level, &wr, x, n, &mut outs)
                });
                let has = ws
                    .iter()
                    .all(|w| quant::rows_kernel(level, w.ty).is_some_and(|k| n <= k.1));
                assert_eq!(done, has, "{level:?} n={n}");
                if !done {
                    assert!(ys.iter().flatten().all(|v| v.is_nan()), "nothing computed");
                    continue;
                }
                ran += 1;
                for (w, y) in ws.iter().zip(&ys) {
                    let mut want = vec![0f32; n * w.rows];
                    matmul_at(level, w, x, n, &mut want);
                    assert!(
                        y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{} {level:?} t{threads} n={n}",
                        w.ty
                    );
                }
            }
        }
    }
    // this machine's level has the multi-row dots (AVX-512 in CI), else the test is empty
    if quant::rows_kernel(SimdLevel::detect(), GgmlType::Q4_0).is_some_and(|k| k.1 >= 2) {
        assert!(ran > 0);
    }
}
