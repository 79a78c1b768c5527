//! Weight bandwidth of the CUDA products: `cargo run --release --example cuda_matvec [GiB]`
//! on a machine with an NVIDIA GPU (prints why and exits otherwise). For each weight type a
//! matrix of about `GiB` gibibytes (default 1) of stored bytes, 8192 columns wide, is
//! multiplied by 1 and by 8 activation rows (the `mv_*` kernels: the weights read once per
//! call) and by 512 rows (dequantized panels through cuBLAS); prints the median of 15 timed
//! calls after 3 warm-ups, as ms and GB/s of stored weight bytes read (or TFLOP/s for 512).
use std::time::Instant;

use deltafin::backend::cpu::Matrix;
use deltafin::backend::cuda::Cuda;
use deltafin::backend::Backend;
use deltafin::quant::GgmlType;

/// Stored bytes with sane block scales (random-looking quants, scales about 1/64).
fn data(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let rb = ty.row_bytes(cols).unwrap();
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    let mut v: Vec<u8> = (0..rows * rb)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect();
    let half = 0x2400u16.to_le_bytes(); // 1/64 as f16
    match ty {
        GgmlType::F16 | GgmlType::BF16 => {
            for e in v.chunks_exact_mut(2) {
                e[1] &= 0x3f; // finite, below 2
            }
        }
        _ => {
            for b in v.chunks_exact_mut(ty.block_bytes()) {
                match ty {
                    GgmlType::Q8_0 | GgmlType::Q4_0 => b[..2].copy_from_slice(&half),
                    GgmlType::Q4_K => {
                        b[..2].copy_from_slice(&half);
                        b[2..4].copy_from_slice(&half);
                    }
                    GgmlType::Q6_K => b[208..210].copy_from_slice(&half),
                    GgmlType::MXFP4 => b[0] = 120,
                    _ => {}
                }
            }
        }
    }
    v
}

fn median_ms(dev: &Cuda, mut call: impl FnMut()) -> f64 {
    for _ in 0..3 {
        call();
    }
    dev.synchronize().unwrap();
    let mut t: Vec<f64> = (0..15)
        .map(|_| {
            let s = Instant::now();
            call();
            dev.synchronize().unwrap();
            s.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(|a, b| a.partial_cmp(b).unwrap());
    t[t.len() / 2]
}

fn main() {
    let gib: f64 = std::env::args()
        .nth(1)
        .map_or(1.0, |s| s.parse().expect("GiB"));
    let dev = match Cuda::open(0) {
        Ok(d) => d,
        Err(e) => {
            println!("no CUDA device: {e:#}");
            return;
        }
    };
    let t = Instant::now();
    dev.warm_up().unwrap();
    println!(
        "{}; kernels compiled and loaded in {:.1} s",
        dev.name(),
        t.elapsed().as_secs_f64()
    );
    let cols = 8192;
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q8_0,
        GgmlType::MXFP4,
        GgmlType::BF16,
    ] {
        let rb = ty.row_bytes(cols).unwrap();
        let rows = ((gib * (1u64 << 30) as f64) as usize / rb) / 256 * 256;
        let bytes = data(ty, rows, cols);
        let w = Matrix::new(ty, rows, cols, &bytes).unwrap();
        let dw = dev.upload_matrix(&w).unwrap();
        let mut line = format!(
            "{ty:>5} {rows}x{cols} ({:.2} GB):",
            bytes.len() as f64 / 1e9
        );
        for n in [1usize, 8] {
            let x = dev.upload(&vec![0.01f32; n * cols]).unwrap();
            let mut y = dev.zeros(n * rows).unwrap();
            let ms = median_ms(&dev, || dev.matmul(&dw, &x, n, &mut y).unwrap());
            let gbs = bytes.len() as f64 / (ms * 1e-3) / 1e9;
            line += &format!("  {n} row(s) {ms:.3} ms = {gbs:.0} GB/s;");
        }
        let n = 512;
        let x = dev.upload(&vec![0.01f32; n * cols]).unwrap();
        let mut y = dev.zeros(n * rows).unwrap();
        let ms = median_ms(&dev, || dev.matmul(&dw, &x, n, &mut y).unwrap());
        let tflops = 2.0 * (rows * cols * n) as f64 / (ms * 1e-3) / 1e12;
        line += &format!("  {n} rows {ms:.2} ms = {tflops:.1} TFLOP/s");
        println!("{line}");
    }
}
