//! Alternated timing of the small-batch kernel against the tiled path (and n single-row
//! matvecs) for 1 (the matvec alone) to 8 rows over Q8_0 / Q4_K / Q5_0 matrices of LM-head and projection sizes:
//! `cargo run --release --example small_batch_probe`. Prints ms per call (median of 9).
use deltafin::backend::cpu::{matmul_tiled_at, matvec_at, small_batch::matmul_small, Matrix};
use deltafin::quant::{GgmlType, SimdLevel};

fn data(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let rb = ty.row_bytes(cols).unwrap();
    let bb = ty.block_bytes();
    let mut v: Vec<u8> = (0..rows * rb)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    // sane f16 scales (1/64) at each block's scale fields
    for b in v.chunks_exact_mut(bb) {
        match ty {
            GgmlType::Q8_0 => b[..2].copy_from_slice(&0x2400u16.to_le_bytes()),
            GgmlType::Q4_K => {
                b[..2].copy_from_slice(&0x2400u16.to_le_bytes());
                b[2..4].copy_from_slice(&0x2400u16.to_le_bytes());
            }
            _ => {}
        }
    }
    v
}

fn median(mut t: Vec<f64>) -> f64 {
    t.sort_by(|a, b| a.partial_cmp(b).unwrap());
    t[t.len() / 2]
}

fn main() {
    let lv = SimdLevel::detect();
    for (ty, rows, cols) in [
        (GgmlType::Q8_0, 262144, 640),
        (GgmlType::Q4_K, 262144, 768),
        (GgmlType::Q8_0, 2048, 640),
        (GgmlType::Q4_K, 4096, 1536),
        (GgmlType::Q5_0, 2048, 640),
    ] {
        let d = data(ty, rows, cols);
        let w = Matrix {
            ty,
            rows,
            cols,
            data: &d,
        };
        let n1 = {
            let x: Vec<f32> = (0..cols).map(|i| ((i % 97) as f32 - 48.0) / 50.0).collect();
            let mut y = vec![0f32; rows];
            let reps = if rows > 100000 { 3 } else { 600 };
            let mut t1 = vec![];
            for _ in 0..9 {
                let t = std::time::Instant::now();
                for _ in 0..reps {
                    matvec_at(lv, &w, &x, &mut y);
                }
                t1.push(t.elapsed().as_secs_f64() / reps as f64);
            }
            median(t1)
        };
        println!("{ty:?} {rows}x{cols} n=1: matvec {:.3} ms", n1 * 1e3);
        for n in [2, 3, 4, 6, 8] {
            let x: Vec<f32> = (0..n * cols)
                .map(|i| ((i % 97) as f32 - 48.0) / 50.0)
                .collect();
            let mut y = vec![0f32; n * rows];
            let mut y2 = vec![0f32; n * rows];
            let (mut ts, mut tt, mut tv) = (vec![], vec![], vec![]);
            let reps = if rows > 100000 { 1 } else { 200 };
            for _ in 0..9 {
                let t = std::time::Instant::now();
                for _ in 0..reps {
                    matmul_small(lv, &w, &x, n, &mut y);
                }
                ts.push(t.elapsed().as_secs_f64() / reps as f64);
                let t = std::time::Instant::now();
                for _ in 0..reps {
                    matmul_tiled_at(lv, &w, &x, n, &mut y2);
                }
                tt.push(t.elapsed().as_secs_f64() / reps as f64);
                let t = std::time::Instant::now();
                for _ in 0..reps {
                    for r in 0..n {
                        matvec_at(
                            lv,
                            &w,
                            &x[r * cols..(r + 1) * cols],
                            &mut y2[r * rows..(r + 1) * rows],
                        );
                    }
                }
                tv.push(t.elapsed().as_secs_f64() / reps as f64);
            }
            assert!(
                y.iter().zip(&y2).all(|(a, b)| a.to_bits() == b.to_bits()),
                "bit-identical"
            );
            let (s, t, v) = (median(ts), median(tt), median(tv));
            println!("{ty:?} {rows}x{cols} n={n}: small {:.3} ms, tiled {:.3} ms, {n} matvecs {:.3} ms; small/tiled {:.2}, small/matvec {:.2}", s * 1e3, t * 1e3, v * 1e3, s / t, s / n1);
        }
    }
}
