//! Kernel throughput: matvec per weight type at Gemma 3 270M shapes, in weight bytes/s, on
//! one thread and on the whole rayon pool, against a plain memory-read bandwidth baseline;
//! batched matmul, and `matmul_t` over an input-major BF16 matrix (GPT-OSS experts).
//!
//! `hot` benches reuse one matrix (it stays in cache); `cold` benches rotate over copies
//! totalling `COLD_BYTES`, more than the last-level cache, as decode does with a model.
//! Run: `cargo bench --bench kernels -- --warm-up-time 1 --measurement-time 3`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use deltafin::backend::cpu::{matmul, matmul_t, matvec, Matrix};
use deltafin::quant::{dot_row, GgmlType};
use rayon::prelude::*;
use std::hint::black_box;

/// Bytes of the rotating weight copies in `cold` benches.
const COLD_BYTES: usize = 1 << 30;

/// Random but valid rows: random bytes with small finite f16 scales, finite floats.
fn weights(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut s = seed;
    let mut next = move || {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let z = (s ^ (s >> 31)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z ^ (z >> 29)
    };
    let bytes = ty.row_bytes(cols).unwrap() * rows;
    let mut v: Vec<u8> = Vec::with_capacity(bytes + 8);
    while v.len() < bytes {
        v.extend_from_slice(&next().to_le_bytes());
    }
    v.truncate(bytes);
    let (bb, scales): (usize, &[usize]) = match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => (0, &[]),
        GgmlType::Q4_K => (144, &[0, 2]),
        GgmlType::Q6_K => (210, &[208]),
        GgmlType::MXFP4 => (17, &[]),
        t => (t.block_bytes(), &[0]),
    };
    let half = half::f16::from_f32(0.01).to_le_bytes();
    match ty {
        GgmlType::F32 => v
            .chunks_exact_mut(4)
            .for_each(|c| c.copy_from_slice(&((c[0] as f32 - 128.0) / 64.0).to_le_bytes())),
        GgmlType::F16 => v.chunks_exact_mut(2).for_each(|c| {
            let f = (c[0] as f32 - 128.0) / 64.0;
            c.copy_from_slice(&half::f16::from_f32(f).to_le_bytes())
        }),
        // Normal values only: subnormal weights would measure the CPU's assist path.
        GgmlType::BF16 => v.chunks_exact_mut(2).for_each(|c| {
            let f = (c[0] as f32 - 128.0) / 64.0;
            c.copy_from_slice(&((f.to_bits() >> 16) as u16).to_le_bytes())
        }),
        // E8M0 scale 2^-7: weights of magnitude <= 12 / 256
        GgmlType::MXFP4 => v.chunks_exact_mut(bb).for_each(|b| b[0] = 120),
        _ => v.chunks_exact_mut(bb).for_each(|b| {
            for &o in scales {
                b[o..o + 2].copy_from_slice(&half);
            }
        }),
    }
    v
}

use deltafin::quant::SLOT_TYPES as TYPES;

/// Gemma 3 270M shapes (rows × cols): FFN up/gate (2048×640) and down (640×2048). K-quants
/// need 256-column multiples, so they use 2048×768 in place of 2048×640.
fn shapes(ty: GgmlType) -> [(usize, usize); 2] {
    if ty.block_elems() == 256 {
        [(2048, 768), (640, 2048)]
    } else {
        [(2048, 640), (640, 2048)]
    }
}

fn one_thread() -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap()
}

fn bench_memory(c: &mut Criterion) {
    let mut g = c.benchmark_group("memory_read");
    for mib in [256usize, 1024] {
        let buf: Vec<u64> = (0..mib << 17).map(|i| i as u64).collect();
        g.throughput(Throughput::Bytes((mib << 20) as u64));
        g.bench_function(BenchmarkId::new("1t", format!("{mib}MiB")), |b| {
            b.iter(|| {
                buf.chunks_exact(8).fold([0u64; 8], |mut a, c| {
                    for k in 0..8 {
                        a[k] = a[k].wrapping_add(c[k]);
                    }
                    a
                })
            })
        });
        g.bench_function(BenchmarkId::new("all", format!("{mib}MiB")), |b| {
            b.iter(|| {
                buf.par_chunks(1 << 16)
                    .map(|ch| ch.iter().fold(0u64, |a, &v| a.wrapping_add(v)))
                    .reduce(|| 0, u64::wrapping_add)
            })
        });
    }
    g.finish();
}

fn bench_matvec(c: &mut Criterion) {
    let pool1 = one_thread();
    let mut g = c.benchmark_group("matvec");
    for ty in TYPES {
        for (rows, cols) in shapes(ty) {
            let data = weights(ty, rows, cols, 1);
            let w = Matrix::new(ty, rows, cols, &data).unwrap();
            let x: Vec<f32> = (0..cols).map(|i| (i % 7) as f32 * 0.1).collect();
            let mut y = vec![0f32; rows];
            g.throughput(Throughput::Bytes(data.len() as u64));
            let id = format!("{ty}/{rows}x{cols}");
            g.bench_function(BenchmarkId::new("hot_1t", &id), |b| {
                pool1.install(|| b.iter(|| matvec(&w, black_box(&x), &mut y)))
            });
            g.bench_function(BenchmarkId::new("hot_all", &id), |b| {
                b.iter(|| matvec(&w, black_box(&x), &mut y))
            });
        }
        // Cold: rotate over copies of the first shape totalling COLD_BYTES.
        let (rows, cols) = shapes(ty)[0];
        let rb = ty.row_bytes(cols).unwrap() * rows;
        let copies = COLD_BYTES / rb;
        let data = weights(ty, rows * copies, cols, 2);
        let mats: Vec<Matrix> = data
            .chunks_exact(rb)
            .map(|d| Matrix::new(ty, rows, cols, d).unwrap())
            .collect();
        let x: Vec<f32> = (0..cols).map(|i| (i % 7) as f32 * 0.1).collect();
        let mut y = vec![0f32; rows];
        g.throughput(Throughput::Bytes(rb as u64));
        let id = format!("{ty}/{rows}x{cols}");
        let mut k = 0;
        g.bench_function(BenchmarkId::new("cold_1t", &id), |b| {
            pool1.install(|| {
                b.iter(|| {
                    k = (k + 1) % mats.len();
                    matvec(&mats[k], black_box(&x), &mut y)
                })
            })
        });
        g.bench_function(BenchmarkId::new("cold_all", &id), |b| {
            b.iter(|| {
                k = (k + 1) % mats.len();
                matvec(&mats[k], black_box(&x), &mut y)
            })
        });
    }
    // The Q8_0 LM head of Gemma 3 270M (tied embeddings): 262144 × 640.
    let (rows, cols) = (262_144, 640);
    let data = weights(GgmlType::Q8_0, rows, cols, 3);
    let w = Matrix::new(GgmlType::Q8_0, rows, cols, &data).unwrap();
    let x: Vec<f32> = (0..cols).map(|i| (i % 7) as f32 * 0.1).collect();
    let mut y = vec![0f32; rows];
    g.throughput(Throughput::Bytes(data.len() as u64));
    g.bench_function(BenchmarkId::new("lm_head_1t", "Q8_0/262144x640"), |b| {
        pool1.install(|| b.iter(|| matvec(&w, black_box(&x), &mut y)))
    });
    g.bench_function(BenchmarkId::new("lm_head_all", "Q8_0/262144x640"), |b| {
        b.iter(|| matvec(&w, black_box(&x), &mut y))
    });
    g.finish();
}

/// Prompt batches: 64 tokens through one 2048×640 (or ×768) matrix, all threads.
fn bench_matmul(c: &mut Criterion) {
    let mut g = c.benchmark_group("matmul64");
    let n = 64;
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::MXFP4,
    ] {
        let (rows, cols) = shapes(ty)[0];
        let data = weights(ty, rows, cols, 4);
        let w = Matrix::new(ty, rows, cols, &data).unwrap();
        let x: Vec<f32> = (0..n * cols).map(|i| (i % 7) as f32 * 0.1).collect();
        let mut y = vec![0f32; n * rows];
        g.throughput(Throughput::Elements((n * rows * cols) as u64));
        g.bench_function(
            BenchmarkId::new("all", format!("{ty}/{rows}x{cols}")),
            |b| b.iter(|| matmul(&w, black_box(&x), n, &mut y)),
        );
    }
    // BF16 stored input-major (GPT-OSS experts), the same 2048 outputs × 640 inputs
    let (rows, cols) = (640, 2048);
    let data = weights(GgmlType::BF16, rows, cols, 6);
    let w = Matrix::new(GgmlType::BF16, rows, cols, &data).unwrap();
    for n in [1, 64] {
        let x: Vec<f32> = (0..n * rows).map(|i| (i % 7) as f32 * 0.1).collect();
        let mut y = vec![0f32; n * cols];
        g.throughput(Throughput::Elements((n * rows * cols) as u64));
        g.bench_function(
            BenchmarkId::new(format!("matmul_t_n{n}"), format!("BF16/{rows}x{cols}")),
            |b| b.iter(|| matmul_t(&w, black_box(&x), n, &mut y)),
        );
    }
    g.finish();
}

/// One row in L1 (`cols` = 2048 elements) per type: the kernel's compute speed.
fn bench_dot_row(c: &mut Criterion) {
    let mut g = c.benchmark_group("dot_row_l1");
    for ty in TYPES {
        let cols = 2048;
        let data = weights(ty, 1, cols, 5);
        let x: Vec<f32> = (0..cols).map(|i| (i % 7) as f32 * 0.1).collect();
        g.throughput(Throughput::Bytes(data.len() as u64));
        g.bench_function(BenchmarkId::new("1t", format!("{ty}/{cols}")), |b| {
            b.iter(|| dot_row(ty, black_box(&data), black_box(&x)))
        });
    }
    g.finish();
}

/// FP8 E4M3 with 128-element block scales (`F8_E4M3_B128`, DeepSeek V3 weights repacked) at a
/// DeepSeek-V3 expert's shapes: gate/up 2048×7168 and down 7168×2048, matvec on one thread and
/// on the pool, plus one L1 row.
fn bench_fp8(c: &mut Criterion) {
    let ty = GgmlType::F8_E4M3_B128;
    let pool1 = one_thread();
    let mut g = c.benchmark_group("fp8");
    let packed = |rows: usize, cols: usize| {
        let mut s = 7u64;
        let w: Vec<u8> = (0..rows * cols)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                // no NaN bytes (0x7f, 0xff)
                ((s >> 33) as u8) & 0xfe | 0x02
            })
            .collect();
        let nb = rows.div_ceil(128) * cols.div_ceil(128);
        let sc: Vec<u8> = (0..nb).flat_map(|_| 0.01f32.to_le_bytes()).collect();
        let mut out = vec![0u8; rows * ty.row_bytes(cols).unwrap()];
        deltafin::quant::fp8::pack_rows(&w, &sc, GgmlType::F32, rows, cols, &mut out);
        out
    };
    for (rows, cols) in [(2048, 7168), (7168, 2048)] {
        let data = packed(rows, cols);
        let w = Matrix::new(ty, rows, cols, &data).unwrap();
        let x: Vec<f32> = (0..cols).map(|i| (i % 7) as f32 * 0.1).collect();
        let mut y = vec![0f32; rows];
        g.throughput(Throughput::Bytes(data.len() as u64));
        let id = format!("{rows}x{cols}");
        g.bench_function(BenchmarkId::new("matvec_1t", &id), |b| {
            pool1.install(|| b.iter(|| matvec(&w, black_box(&x), &mut y)))
        });
        g.bench_function(BenchmarkId::new("matvec_all", &id), |b| {
            b.iter(|| matvec(&w, black_box(&x), &mut y))
        });
    }
    let data = packed(1, 2048);
    let x: Vec<f32> = (0..2048).map(|i| (i % 7) as f32 * 0.1).collect();
    g.throughput(Throughput::Bytes(data.len() as u64));
    g.bench_function(BenchmarkId::new("dot_row_l1", "2048"), |b| {
        b.iter(|| dot_row(ty, black_box(&data), black_box(&x)))
    });
    g.finish();
}

/// Prompt prefill at the demo model's shapes: 400 tokens through each of Gemma 3 270M's
/// matrices (rows × cols, its own encodings: Q5_0 gate/up 2048×640 and q 1024×640, Q8_0 v
/// 256×640, Q4_K attn_output 640×1024, Q6_K down 640×2048; plus F32 2048×640 for the plain
/// f32 tile), on one thread and on the pool. Throughput in elements is `2 · n · rows · cols`,
/// so criterion's elem/s are FLOP/s (one multiply-add = 2).
/// Run: `cargo bench --bench kernels -- prefill400 --warm-up-time 1 --measurement-time 3`.
fn bench_prefill(c: &mut Criterion) {
    let pool1 = one_thread();
    let mut g = c.benchmark_group("prefill400");
    let n = 400;
    for (ty, rows, cols) in [
        (GgmlType::Q5_0, 2048, 640),
        (GgmlType::Q5_0, 1024, 640),
        (GgmlType::Q8_0, 256, 640),
        (GgmlType::Q4_K, 640, 1024),
        (GgmlType::Q6_K, 640, 2048),
        (GgmlType::F32, 2048, 640),
    ] {
        let data = weights(ty, rows, cols, 8);
        let w = Matrix::new(ty, rows, cols, &data).unwrap();
        let x: Vec<f32> = (0..n * cols).map(|i| (i % 7) as f32 * 0.1).collect();
        let mut y = vec![0f32; n * rows];
        g.throughput(Throughput::Elements((2 * n * rows * cols) as u64));
        let id = format!("{ty}/{rows}x{cols}");
        g.bench_function(BenchmarkId::new("1t", &id), |b| {
            pool1.install(|| b.iter(|| matmul(&w, black_box(&x), n, &mut y)))
        });
        g.bench_function(BenchmarkId::new("all", &id), |b| {
            b.iter(|| matmul(&w, black_box(&x), n, &mut y))
        });
    }
    g.finish();
}

criterion_group!(
    benches,
    bench_prefill,
    bench_memory,
    bench_dot_row,
    bench_matvec,
    bench_matmul,
    bench_fp8
);
criterion_main!(benches);
