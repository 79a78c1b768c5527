//! How fast this machine multiplies weights, measured with the engine's own kernels: a matrix
//! of random bytes in a model's encoding (64 MiB, more than the CPU's caches, so the weights
//! come from RAM as a decode step's do) times one row (decode) and 64 rows (a prompt batch),
//! on the global thread pool (`--threads`), each for a fixed short time.

use std::time::Instant;

use super::predict::Rates;
use crate::backend::cpu::{matmul, matvec, Matrix};
use crate::quant::GgmlType;

/// Columns of the probe matrix (a multiple of every block size).
const COLS: usize = 4096;

/// Bytes of the probe matrix.
const MATRIX_BYTES: usize = 64 << 20;

/// Rows of the batched product (a prompt batch).
const PREFILL_ROWS: usize = 64;

/// The type whose kernels compute `ty`: FP8 weights are repacked with block scales, MXFP4
/// experts stored as `U8`/`I8` blocks compute as MXFP4; a type without kernels of its own
/// (activation-only Q8_1 and Q8_K) is timed as BF16.
pub fn kernel_type(ty: GgmlType) -> GgmlType {
    match ty {
        GgmlType::F8_E4M3 => GgmlType::F8_E4M3_B128,
        GgmlType::I8 => GgmlType::MXFP4,
        GgmlType::Q8_1 | GgmlType::Q8_K => GgmlType::BF16,
        t => t,
    }
}

/// Weight bytes per second of `ty` times `rows` rows, over about `seconds`.
fn rate(ty: GgmlType, rows: usize, seconds: f64) -> f64 {
    let ty = kernel_type(ty);
    let rb = ty.row_bytes(COLS).unwrap_or(COLS * 2);
    let n_rows = (MATRIX_BYTES / rb).max(1);
    let mut data = vec![0u8; n_rows * rb];
    let mut s = 0x2545_f491_4f6c_dd1du64;
    for b in data.chunks_mut(8) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        // small magnitudes in every float type (bits of exponent kept low)
        let v = (s & 0x3f3f_3f3f_3f3f_3f3f).to_le_bytes();
        b.copy_from_slice(&v[..b.len()]);
    }
    let Ok(m) = Matrix::new(ty, n_rows, COLS, &data) else {
        return f64::NAN;
    };
    let x = vec![0.5f32; COLS * rows];
    let mut y = vec![0f32; n_rows * rows];
    let run = |y: &mut [f32]| match rows {
        1 => matvec(&m, &x, y),
        n => matmul(&m, &x, n, y),
    };
    run(&mut y);
    let start = Instant::now();
    let mut reps = 0u64;
    while reps == 0 || start.elapsed().as_secs_f64() < seconds {
        run(&mut y);
        reps += 1;
    }
    (data.len() * rows) as f64 * reps as f64 / start.elapsed().as_secs_f64()
}

/// The rates of a model whose spine is mostly `spine` and whose routed experts are `expert`,
/// measured for about `seconds` each (three measurements; two when the types are equal).
pub fn measure(spine: GgmlType, expert: GgmlType, seconds: f64) -> Rates {
    let s = rate(spine, 1, seconds);
    let e = match kernel_type(expert) == kernel_type(spine) {
        true => s,
        false => rate(expert, 1, seconds),
    };
    Rates {
        spine: s,
        expert: e,
        prefill: rate(spine, PREFILL_ROWS, seconds),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_positive_for_the_model_types() {
        let r = measure(GgmlType::BF16, GgmlType::MXFP4, 0.01);
        assert!(r.spine > 0.0 && r.expert > 0.0 && r.prefill > 0.0, "{r:?}");
        assert_eq!(kernel_type(GgmlType::F8_E4M3), GgmlType::F8_E4M3_B128);
        assert_eq!(kernel_type(GgmlType::Q4_K), GgmlType::Q4_K);
    }
}
