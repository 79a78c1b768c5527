//! The matvec/matmul contract: every output equals `dot_row` of its row, bit for bit, at
//! every SIMD level and for every thread count.

use super::*;
use crate::quant::tests::{random_fp8_row, random_row, random_x, Rng};
use crate::quant::SLOT_TYPES;
use proptest::prelude::*;

/// Columns per type: odd block counts, and a tail after whole 32-element rounds for floats.
fn cols_for(ty: GgmlType) -> usize {
    match ty.block_elems() {
        1 => 515,
        32 => 17 * 32,
        _ => 3 * 256,
    }
}

fn case(ty: GgmlType, rows: usize, n: usize, seed: u64) -> (Vec<u8>, usize, Vec<f32>) {
    let cols = cols_for(ty);
    let mut rng = Rng::new(seed);
    let mut data = Vec::new();
    for _ in 0..rows {
        data.extend(random_row(ty, cols / ty.block_elems(), &mut rng));
    }
    let x = (0..n * cols).map(|_| rng.unit()).collect();
    (data, cols, x)
}

/// `v` copied to `skew` floats past a 64-byte boundary.
fn skewed(v: &[f32], skew: usize) -> (Vec<f32>, usize) {
    let mut buf = vec![0f32; v.len() + 32];
    let off = buf.as_ptr().align_offset(64) + skew;
    buf[off..off + v.len()].copy_from_slice(v);
    (buf, off)
}

/// Batches of 2 to 8 rows take the small-batch path (the multi-row dots at AVX-512), 9 the
/// tiled one; all equal `dot_row`, with the activations at a 64-byte boundary or past one
/// (copied to one by the batched paths where the row length keeps rows aligned).
#[test]
fn matvec_and_matmul_equal_dot_row_bit_for_bit() {
    let rows = 301;
    for (level, n, skew) in SimdLevel::available()
        .into_iter()
        .flat_map(|l| (1..=9).flat_map(move |n| [0, 1, 4].map(|s| (l, n, s))))
    {
        for (i, &ty) in SLOT_TYPES.iter().enumerate() {
            let (data, cols, x) = case(ty, rows, n, 7 + i as u64 + 100 * skew as u64);
            let (xbuf, off) = skewed(&x, skew);
            let xs = &xbuf[off..off + x.len()];
            let w = Matrix::new(ty, rows, cols, &data).unwrap();
            let mut yv = vec![0f32; rows];
            matvec_at(level, &w, &xs[..cols], &mut yv);
            let mut ym = vec![0f32; n * rows];
            matmul_at(level, &w, xs, n, &mut ym);
            for r in 0..rows {
                for t in 0..n {
                    let want = quant::dot_row_at(level, ty, w.row(r), &x[t * cols..][..cols]);
                    assert_eq!(
                        ym[t * rows + r].to_bits(),
                        want.to_bits(),
                        "{ty} {level:?} n{n} skew {skew} r{r} t{t}"
                    );
                    if t == 0 {
                        assert_eq!(yv[r].to_bits(), want.to_bits(), "{ty} {level:?} r{r}");
                    }
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// FP8 rows of any length (partial last blocks, tails after whole rounds): at every level,
    /// matvec and matmul (three rows, two tokens) equal dot_row bit for bit.
    #[test]
    fn fp8_matvec_and_matmul_equal_dot_row(n in 1usize..700, seed: u64) {
        let ty = GgmlType::F8_E4M3_B128;
        let mut rng = Rng::new(seed);
        let row = random_fp8_row(n, &mut rng);
        prop_assert_eq!(Some(row.len()), ty.row_bytes(n));
        let x = random_x(n, &mut rng);
        for level in SimdLevel::available() {
            // three rows through matvec and matmul (2 tokens)
            let rows: Vec<u8> = [row.clone(), random_fp8_row(n, &mut rng), random_fp8_row(n, &mut rng)].concat();
            let m = Matrix::new(ty, 3, n, &rows).unwrap();
            let x2: Vec<f32> = [x.clone(), random_x(n, &mut rng)].concat();
            let mut y = vec![0f32; 3];
            matvec_at(level, &m, &x, &mut y);
            let mut y2 = vec![0f32; 6];
            matmul_at(level, &m, &x2, 2, &mut y2);
            for r in 0..3 {
                let d0 = quant::dot_row_at(level, ty, m.row(r), &x);
                let d1 = quant::dot_row_at(level, ty, m.row(r), &x2[n..]);
                prop_assert_eq!(y[r].to_bits(), d0.to_bits());
                prop_assert_eq!(y2[r].to_bits(), d0.to_bits());
                prop_assert_eq!(y2[3 + r].to_bits(), d1.to_bits());
            }
        }
    }
}

#[test]
fn results_do_not_depend_on_thread_count() {
    let ty = GgmlType::Q4_K;
    let (rows, n) = (1001, 3);
    let (data, cols, x) = case(ty, rows, n, 99);
    let w = Matrix::new(ty, rows, cols, &data).unwrap();
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let mut yv = vec![0f32; rows];
            matvec(&w, &x[..cols], &mut yv);
            let mut ym = vec![0f32; n * rows];
            matmul(&w, &x, n, &mut ym);
            (yv, ym)
        })
    };
    let (v1, m1) = run(1);
    let (v3, m3) = run(3);
    assert!(v1.iter().zip(&v3).all(|(a, b)| a.to_bits() == b.to_bits()));
    assert!(m1.iter().zip(&m3).all(|(a, b)| a.to_bits() == b.to_bits()));
    // Token 0 of the batch is the single-token matvec.
    assert!(v1
        .iter()
        .zip(&m1[..rows])
        .all(|(a, b)| a.to_bits() == b.to_bits()));
    assert!(v1.iter().any(|&v| v != 0.0));
}

#[test]
fn shape_mismatch_panics_with_message() {
    let data = vec![0u8; 2 * 34];
    let w = Matrix::new(GgmlType::Q8_0, 2, 32, &data).unwrap();
    let r = std::panic::catch_unwind(|| matvec(&w, &[0.0; 31], &mut [0.0; 2]));
    let msg = *r.unwrap_err().downcast::<String>().unwrap();
    assert_eq!(
        msg,
        "assertion `left == right` failed: x has 31 elements, want 1x32\n  left: 31\n right: 32"
    );
}

/// `matmul_t` (input-major weights) equals the plain ordered sum `Σ_i x[i] w[i][j]` for every
/// batch size and thread count, bit for bit.
#[test]
fn matmul_t_is_the_ordered_sum_at_any_batch_and_thread_count() {
    let mut rng = Rng::new(11);
    let (k, m) = (37, 600); // several column tasks
    for ty in [GgmlType::BF16, GgmlType::F32, GgmlType::F16] {
        let data = random_row(ty, k * m, &mut rng);
        let w = Matrix::new(ty, k, m, &data).unwrap();
        let mut wf = vec![0f32; k * m];
        crate::quant::dequantize_row(ty, &data, &mut wf);
        for n in [1, 3] {
            let x: Vec<f32> = (0..n * k).map(|_| rng.unit()).collect();
            let mut want = vec![0f32; n * m];
            for t in 0..n {
                for i in 0..k {
                    for j in 0..m {
                        want[t * m + j] += x[t * k + i] * wf[i * m + j];
                    }
                }
            }
            for threads in [1, 3] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let mut y = vec![0f32; n * m];
                pool.install(|| matmul_t(&w, &x, n, &mut y));
                assert!(y == want, "{ty} n={n} threads={threads}");
            }
        }
    }
}

/// Columns of [`fused_matrices`].
pub(super) const FUSED_COLS: usize = 17 * 32;

/// Types and rows of [`fused_matrices`]: one matrix below a task's minimum of work, others
/// split into several tasks.
const FUSED_SPECS: [(GgmlType, usize); 3] = [
    (GgmlType::Q4_0, 700),
    (GgmlType::Q8_0, 3),
    (GgmlType::F32, 90),
];

/// The matrices of [`fused_matrices`]' bytes (`FUSED_SPECS`' types and rows, `FUSED_COLS`
/// wide).
pub(super) fn fused_views(datas: &[Vec<u8>]) -> Vec<Matrix<'_>> {
    FUSED_SPECS
        .iter()
        .zip(datas)
        .map(|(&(ty, rows), d)| Matrix::new(ty, rows, FUSED_COLS, d).unwrap())
        .collect()
}

/// Random bytes of the matrices [`FUSED_SPECS`] gives, [`FUSED_COLS`] wide: the set the
/// tests of several products in one region use.
pub(super) fn fused_matrices(rng: &mut Rng) -> Vec<Vec<u8>> {
    FUSED_SPECS
        .iter()
        .map(|&(ty, rows)| {
            (0..rows)
                .flat_map(|_| random_row(ty, FUSED_COLS / ty.block_elems(), rng))
                .collect()
        })
        .collect()
}

/// `matvec_many` (several matrices of one input in one parallel region) equals `dot_row` of
/// every row of every matrix bit for bit, at every level and for 1 and 3 threads, with
/// matrices of different types and sizes (one below a task's minimum, several split).
#[test]
fn matvec_many_equals_dot_row_per_matrix_at_any_thread_count() {
    let cols = FUSED_COLS;
    let mut rng = Rng::new(5);
    let datas = fused_matrices(&mut rng);
    let ws = fused_views(&datas);
    let wr: Vec<&Matrix> = ws.iter().collect();
    let x: Vec<f32> = (0..cols).map(|_| rng.unit()).collect();
    for level in SimdLevel::available() {
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut ys: Vec<Vec<f32>> = ws.iter().map(|w| vec![f32::NAN; w.rows]).collect();
            pool.install(|| {
                let mut outs: Vec<&mut [f32]> = ys.iter_mut().map(|y| y.as_mut_slice()).collect();
                matvec_many_at(level, &wr, &x, &mut outs)
            });
            for (w, y) in ws.iter().zip(&ys) {
                for (r, v) in y.iter().enumerate() {
                    let want = quant::dot_row_at(level, w.ty, w.row(r), &x);
                    assert_eq!(
                        v.to_bits(),
                        want.to_bits(),
                        "{} {level:?} t{threads} r{r}",
                        w.ty
                    );
                }
            }
        }
    }
    // each matrix with its own input (`matvec_each`), inside a pass and outside one
    let xs: Vec<Vec<f32>> = ws
        .iter()
        .map(|_| (0..cols).map(|_| rng.unit()).collect())
        .collect();
    let xr: Vec<&[f32]> = xs.iter().map(|x| x.as_slice()).collect();
    for in_pass in [false, true] {
        let mut ys: Vec<Vec<f32>> = ws.iter().map(|w| vec![f32::NAN; w.rows]).collect();
        let mut outs: Vec<&mut [f32]> = ys.iter_mut().map(|y| y.as_mut_slice()).collect();
        match in_pass {
            true => on_pool(|| matvec_each(&wr, &xr, &mut outs)),
            false => matvec_each(&wr, &xr, &mut outs),
        }
        for ((w, y), x) in ws.iter().zip(&ys).zip(&xs) {
            for (r, v) in y.iter().enumerate() {
                let want = quant::dot_row(w.ty, w.row(r), x);
                assert_eq!(v.to_bits(), want.to_bits(), "{} each r{r}", w.ty);
            }
        }
    }
    // under q8 numerics it is the per-matrix q8 matvec
    let mut ys: Vec<Vec<f32>> = ws.iter().map(|w| vec![f32::NAN; w.rows]).collect();
    with_numerics(Numerics::Q8, || {
        let mut outs: Vec<&mut [f32]> = ys.iter_mut().map(|y| y.as_mut_slice()).collect();
        matvec_many(&wr, &x, &mut outs);
        for (w, y) in ws.iter().zip(&ys) {
            let mut want = vec![0f32; w.rows];
            matvec(w, &x, &mut want);
            assert!(
                y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{} under q8",
                w.ty
            );
        }
    });
    // and q8 is not exact here (Q4_0 and Q8_0 take the integer path), so the check above
    // compares the q8 products, not two exact ones
    let mut exact = vec![0f32; ws[0].rows];
    matvec(&ws[0], &x, &mut exact);
    assert!(ys[0]
        .iter()
        .zip(&exact)
        .any(|(a, b)| a.to_bits() != b.to_bits()));
}
