//! The q8 decode contract: under `--numerics q8` a single-token product (`matvec_q8.rs`'s
//! single-row kernels, or the batched tiles with one token) gives each row the value of
//! the same activation row in a batch (`gemm_q8.rs`), bit for bit, at every SIMD level and
//! thread count; and that value stays near the exact dot.

use super::*;
use crate::quant::q8::{multi_kernel, vec_kernel};
use crate::quant::tests::{random_row, random_x, Rng};
use crate::quant::tests_q8::INT_TYPES;

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
}

/// One matrix of `rows` random rows of `blocks` blocks; `n` random activation rows.
fn check(ty: GgmlType, rows: usize, blocks: usize, seed: u64) {
    let mut rng = Rng::new(seed);
    let cols = blocks * ty.block_elems();
    let data: Vec<u8> = (0..rows)
        .flat_map(|_| random_row(ty, blocks, &mut rng))
        .collect();
    let w = Matrix::new(ty, rows, cols, &data).unwrap();
    // 2 to 32 rows: the few-rows path (`matmul_q8_small`: the multi-row kernels 8 activation
    // rows at a time, so 9 and 17 rows end with a partial chunk; the single-row kernel per
    // row elsewhere, up to 7); 33: the prepared-panel tiles
    for n in [2, 3, 4, 5, 6, 7, 8, 9, 17, 33] {
        check_n(ty, &w, rows, cols, n, &mut rng);
    }
}

fn check_n(ty: GgmlType, w: &Matrix, rows: usize, cols: usize, n: usize, rng: &mut Rng) {
    let x = random_x(n * cols, rng);
    for level in SimdLevel::available() {
        let mut batch = vec![0f32; n * rows];
        matmul_q8_at(level, w, &x, n, &mut batch);
        for threads in [1, 3] {
            for t in 0..n {
                let xt = &x[t * cols..][..cols];
                let mut one = vec![0f32; rows];
                pool(threads).install(|| matmul_q8_at(level, w, xt, 1, &mut one));
                for r in 0..rows {
                    let (b, o) = (batch[t * rows + r], one[r]);
                    assert_eq!(
                        o.to_bits(),
                        b.to_bits(),
                        "{ty} {level:?} {threads} threads, {cols} cols, row {r} token {t}: \
                         single {o} vs batch {b}"
                    );
                }
                // near the exact dot: q8 rounding of the activations only
                let mut exact = vec![0f32; rows];
                matvec_at(level, w, xt, &mut exact);
                let scale = exact.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
                for r in 0..rows {
                    assert!(
                        (one[r] - exact[r]).abs() <= 0.05 * scale,
                        "{ty} {level:?} row {r}: q8 {} vs exact {}",
                        one[r],
                        exact[r]
                    );
                }
            }
        }
    }
}

#[test]
fn q8_single_token_rows_equal_batch_rows_bit_for_bit() {
    for (i, ty) in INT_TYPES.into_iter().enumerate() {
        let blocks: &[usize] = match ty.block_elems() {
            32 => &[1, 3, 20, 21],
            _ => &[1, 3],
        };
        for (j, &b) in blocks.iter().enumerate() {
            // 37 rows: two groups of 16 and a partial one
            check(ty, 37, b, (10 * i + j) as u64);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn q8_single_row_kernels_cover_the_demo_model_types_at_vnni() {
    if !(SimdLevel::Avx512.is_available() && is_x86_feature_detected!("avx512vnni")) {
        return;
    }
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ] {
        assert!(vec_kernel(SimdLevel::Avx512, ty).is_some(), "{ty}");
    }
    assert!(vec_kernel(SimdLevel::Avx512, GgmlType::Q5_K).is_none());
    if is_x86_feature_detected!("avx512bitalg") {
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q5_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
        ] {
            assert!(multi_kernel(SimdLevel::Avx512, ty).is_some(), "{ty}");
        }
    }
    assert!(multi_kernel(SimdLevel::Avx512, GgmlType::Q5_K).is_none());
    assert!(multi_kernel(SimdLevel::Avx2, GgmlType::Q8_0).is_none());
    assert!(vec_kernel(SimdLevel::Avx2, GgmlType::Q8_0).is_none());
}
