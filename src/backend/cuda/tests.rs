//! Each CUDA op against the CPU backend's result on random inputs. They need a GPU, its
//! driver and NVRTC: where [`Cuda::open`] fails (CI, a machine without a GPU) each test
//! prints why and passes without checking anything; `cargo test --release --lib
//! backend::cuda -- --nocapture` on a GPU machine prints the measured errors (`cuda-err`
//! lines).
//!
//! Bounds: a product's error is measured per output against `Σ|w·x|` (the magnitude a
//! dot's rounding scales with) and must stay ≤ 1e-5; both sides accumulate in f32, in
//! different orders. The decoders and the gather, scatter and add ops must match the CPU bit
//! for bit; the other element-wise ops, attention, latent attention and the KDA scan, which
//! call CUDA's `expf`, `tanhf`, `sin`, `cos`, within 1e-5 of the output's largest magnitude.
//! Ops whose rows are independent (latent attention, the KDA scan's tokens) must also give
//! a prompt's rows bit for bit as one-row calls do. The family ops (MLA's partial norm and
//! RoPE, the other KDA ops, Kimi K3's and GPT-OSS's) are tested in `tests_family.rs`.

use std::sync::OnceLock;

use super::*;
use crate::backend::cpu::{self, Cpu};
use crate::backend::{AttnShape, Backend, Glu, MlaProj, MlaShape};
use crate::quant::tests::{random_fp8_row, random_row, random_x, Rng};

/// The device the tests share, or `None` (with the reason printed once) without one.
fn gpu() -> Option<&'static Cuda> {
    static DEV: OnceLock<Option<Cuda>> = OnceLock::new();
    DEV.get_or_init(|| match Cuda::open(0) {
        Ok(c) => Some(c),
        Err(e) => {
            eprintln!("CUDA tests skipped: {e:#}");
            None
        }
    })
    .as_ref()
}

macro_rules! device_or_skip {
    () => {
        match gpu() {
            Some(d) => d,
            None => {
                eprintln!("skipped: no usable CUDA device");
                return;
            }
        }
    };
}

/// `bytes` for the life of the test process: the `*_host` ops with `keep` require host
/// weights that never move nor change while the device lives ([`Cuda::resident_matrix`]),
/// and the tests share one device, so an allocation freed and reused by a later test would
/// otherwise find the earlier test's device copy.
pub(super) fn kept(bytes: Vec<u8>) -> &'static [u8] {
    Box::leak(bytes.into_boxed_slice())
}

/// A random matrix of `rows × cols` of `ty`, as the CPU reads it.
fn random_matrix(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    (0..rows)
        .flat_map(|_| match ty {
            GgmlType::F8_E4M3_B128 => random_fp8_row(cols, rng),
            _ => random_row(ty, cols / ty.block_elems(), rng),
        })
        .collect()
}

fn download(dev: &Cuda, b: &CudaBuf) -> Vec<f32> {
    let mut v = vec![0f32; b.len()];
    dev.download(b, &mut v).unwrap();
    v
}

/// The worst `|got − want| / Σ|w·x|` over the outputs of `x Wᵀ` (`n` rows).
fn worst_dot_error(w: &Matrix, x: &[f32], n: usize, got: &[f32], want: &[f32]) -> f64 {
    let mut row = vec![0f32; w.cols];
    let mut worst = 0f64;
    for r in 0..w.rows {
        dequantize_row(w.ty, w.row(r), &mut row);
        for t in 0..n {
            let xt = &x[t * w.cols..(t + 1) * w.cols];
            let mag: f64 = row
                .iter()
                .zip(xt)
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum();
            let i = t * w.rows + r;
            let err = (got[i] as f64 - want[i] as f64).abs();
            assert!(got[i].is_finite(), "output {i} is {}", got[i]);
            if mag > 0.0 {
                worst = worst.max(err / mag);
            } else {
                assert_eq!(got[i], 0.0, "output {i}");
            }
        }
    }
    worst
}

/// The bit patterns of `v` (to compare results bit for bit, NaNs included).
fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The worst `|got − want|` relative to the largest `|want|`.
fn worst_rel(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
    let err = got
        .iter()
        .zip(want)
        .fold(0f64, |m, (a, b)| m.max((*a as f64 - *b as f64).abs()));
    assert!(got.iter().all(|v| v.is_finite()));
    if scale == 0.0 {
        err
    } else {
        err / scale
    }
}

/// Columns for a type's test matrix: whole blocks, and for the float and FP8 types a length
/// that leaves a partial last unit of 32.
fn cols_for(ty: GgmlType) -> usize {
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1000,
        GgmlType::F8_E4M3_B128 => 700,
        t if t.block_elems() == 256 => 4096,
        _ => 2048,
    }
}

#[test]
fn open_names_a_missing_driver_or_gpu() {
    let err = Cuda::open(99).unwrap_err().to_string();
    match device_count() {
        Err(e) => assert_eq!(err, format!("cuda:99: {e}")),
        Ok(n) => assert_eq!(err, format!("cuda:99: no GPU 99 (this machine has {n})")),
    }
    if driver_missing().is_some() {
        assert_eq!(err, "cuda:99: no CUDA driver found (libcuda.so)");
        assert!(Cuda::devices().is_empty());
    }
}

#[test]
fn products_of_every_device_type_match_the_cpu() {
    let dev = device_or_skip!();
    let mut rng = Rng::new(7);
    let mut report = Vec::new();
    for ty in DEVICE_TYPES
        .into_iter()
        .chain([GgmlType::Q2_K, GgmlType::Q5_K])
    {
        let (rows, cols) = (300, cols_for(ty));
        let bytes = random_matrix(ty, rows, cols, &mut rng);
        let w = Matrix::new(ty, rows, cols, &bytes).unwrap();
        let dw = dev.upload_matrix(&w).unwrap();
        assert_eq!(
            dw.dequantized_from.is_some(),
            !DEVICE_TYPES.contains(&ty),
            "{ty}"
        );
        let mut worst = 0f64;
        for n in [1, 2, 3, 5, 8, 13, 40] {
            let x = random_x(n * cols, &mut rng);
            let mut want = vec![0f32; n * rows];
            cpu::matmul(&w, &x, n, &mut want);
            let dx = dev.upload(&x).unwrap();
            let mut dy = dev.zeros(n * rows).unwrap();
            dev.matmul(&dw, &dx, n, &mut dy).unwrap();
            let got = download(dev, &dy);
            let e = worst_dot_error(&w, &x, n, &got, &want);
            assert!(e <= 1e-5, "{ty} with {n} rows: error {e:e}");
            worst = worst.max(e);
            if n > matmul::DIRECT_MAX_ROWS {
                // the direct kernels on the same rows (the path without cuBLAS)
                let mut dy = dev.zeros(n * rows).unwrap();
                dev.matmul_direct(&dw, &dx, n, &mut dy).unwrap();
                let e = worst_dot_error(&w, &x, n, &download(dev, &dy), &want);
                assert!(e <= 1e-5, "{ty} direct with {n} rows: error {e:e}");
                worst = worst.max(e);
            }
        }
        report.push(format!("{ty} {worst:.2e}"));
    }
    eprintln!(
        "cuda-err matmul (|gpu-cpu| / sum|w*x|, worst over 1..40 rows): {}",
        report.join(", ")
    );
}

#[test]
fn embedding_rows_decode_bit_for_bit() {
    let dev = device_or_skip!();
    let mut rng = Rng::new(11);
    for ty in DEVICE_TYPES {
        let (rows, cols) = (64, cols_for(ty));
        let bytes = random_matrix(ty, rows, cols, &mut rng);
        let w = Matrix::new(ty, rows, cols, &bytes).unwrap();
        let dw = dev.upload_matrix(&w).unwrap();
        let ids = [5u32, 0, 63, 5, 17];
        let mut want = vec![0f32; ids.len() * cols];
        Cpu::default().embed_rows(w, &ids, &mut want).unwrap();
        let mut out = dev.zeros(ids.len() * cols).unwrap();
        dev.embed_rows(&dw, &ids, &mut out).unwrap();
        let got = download(dev, &out);
        for (i, (g, e)) in got.iter().zip(&want).enumerate() {
            assert!(
                g.to_bits() == e.to_bits() || (g.is_nan() && e.is_nan()),
                "{ty} element {i}: {g} vs {e}"
            );
        }
        let err = dev
            .embed_rows(&dw, &[64], &mut dev.zeros(cols).unwrap())
            .unwrap_err();
        assert_eq!(err.to_string(), "embed_rows: token 64 of 64");
    }
    eprintln!(
        "cuda-err embed_rows: bit-exact for {} types",
        DEVICE_TYPES.len()
    );
}

#[test]
fn norms_rope_and_activations_match_the_cpu() {
    let dev = device_or_skip!();
    let cpu = Cpu::default();
    let mut rng = Rng::new(3);
    let (rows, d) = (7, 1152);
    let x = random_x(rows * d, &mut rng);
    let y = random_x(rows * d, &mut rng);
    let w = random_x(d, &mut rng);
    let (dx, dy) = (dev.upload(&x).unwrap(), dev.upload(&y).unwrap());
    let mut report = Vec::new();

    let mut want = vec![0f32; rows * d];
    cpu.rms_norm_rows(&x, &w, 1e-6, &mut want).unwrap();
    let mut out = dev.zeros(rows * d).unwrap();
    dev.rms_norm_rows(&dx, &w, 1e-6, &mut out).unwrap();
    let e = worst_rel(&download(dev, &out), &want);
    assert!(e <= 1e-5, "rms_norm {e:e}");
    report.push(format!("rms_norm {e:.2e}"));

    for (interleaved, scale, hd) in [(false, 1.0, 128), (true, 0.125, 64), (false, 0.5, 256)] {
        let inv = cpu::ops::rope_inv_freq(hd, 10000.0, 1.0);
        // whole heads of each row (256-wide heads leave part of a 1152-wide row out)
        let width = d / hd * hd;
        let xs: Vec<f32> = x.chunks(d).flat_map(|r| r[..width].to_vec()).collect();
        let mut want = xs.clone();
        cpu.rope(&mut want, rows, hd, 4000, &inv, interleaved, scale)
            .unwrap();
        let mut dxs = dev.upload(&xs).unwrap();
        dev.rope(&mut dxs, rows, hd, 4000, &inv, interleaved, scale)
            .unwrap();
        let e = worst_rel(&download(dev, &dxs), &want);
        assert!(
            e <= 1e-5,
            "rope (interleaved {interleaved}, head {hd}) {e:e}"
        );
        report.push(format!(
            "rope/{hd}{} {e:.2e}",
            if interleaved { "i" } else { "" }
        ));
    }

    let acts = [
        ("swiglu", Glu::Swiglu),
        ("geglu", Glu::GegluTanh),
        (
            "situ",
            Glu::Situ {
                beta: 3.0,
                linear_beta: 10.0,
            },
        ),
        (
            "situ0",
            Glu::Situ {
                beta: 2.0,
                linear_beta: 0.0,
            },
        ),
    ];
    for (name, act) in acts {
        // a wide range of gate values: both tails of each activation
        let g: Vec<f32> = x.iter().map(|v| v * 12.0).collect();
        let mut want = g.clone();
        cpu.glu(act, &mut want, &y).unwrap();
        let mut dg = dev.upload(&g).unwrap();
        dev.glu(act, &mut dg, &dy).unwrap();
        let e = worst_rel(&download(dev, &dg), &want);
        assert!(e <= 1e-5, "{name} {e:e}");
        report.push(format!("{name} {e:.2e}"));
    }

    let mut want: Vec<f32> = x.iter().map(|v| v * 80.0).collect();
    let mut dsc = dev.upload(&want).unwrap();
    cpu.softcap(&mut want, 30.0).unwrap();
    dev.softcap(&mut dsc, 30.0).unwrap();
    let e = worst_rel(&download(dev, &dsc), &want);
    assert!(e <= 1e-5, "softcap {e:e}");
    report.push(format!("softcap {e:.2e}"));

    let mut want = x.clone();
    cpu.add(&mut want, &y).unwrap();
    let mut dsum = dev.upload(&x).unwrap();
    dev.add(&mut dsum, &dy).unwrap();
    assert_eq!(download(dev, &dsum), want, "add");
    eprintln!(
        "cuda-err elementwise (|gpu-cpu| / max|cpu|): {}; add exact",
        report.join(", ")
    );
}

/// `download_spans` gives each span's floats exactly, through the page-locked staging
/// buffer (`STAGED` floats, again after it grew and at a smaller length) and
/// without it (a small buffer); spans that do not tile a prefix are refused by name.
#[test]
fn download_spans_gives_each_spans_floats() {
    let dev = device_or_skip!();
    let mut rng = Rng::new(11);
    let vocab = 262_144;
    for (m, last) in [(3usize, false), (8, false), (2, true), (1, false)] {
        let x = random_x(m * vocab, &mut rng);
        let spans: Vec<_> = (0..m).map(|i| i * vocab..(i + 1) * vocab).collect();
        let len = if last { m * vocab + 5 } else { m * vocab };
        let mut host = x.clone();
        host.resize(len, 1.0);
        let got = dev
            .download_spans(dev.upload(&host).unwrap(), len, &spans)
            .unwrap();
        assert_eq!(got.len(), m);
        for (g, r) in got.iter().zip(&spans) {
            assert_eq!(bits(g), bits(&x[r.clone()]), "{m} spans");
        }
    }
    let small = [1.0f32, 2.0, 3.0];
    let got = dev
        .download_spans(dev.upload(&small).unwrap(), 3, &[0..1, 1..3])
        .unwrap();
    assert_eq!(got, [vec![1.0], vec![2.0, 3.0]]);
    let err = dev
        .download_spans(dev.upload(&small).unwrap(), 3, &[1..3, 3..3])
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "download_spans: span 1..3 after 0 of 3 floats"
    );
}

#[test]
fn gather_and_scatter_rows_match_the_cpu_exactly() {
    let dev = device_or_skip!();
    let cpu = Cpu::default();
    let mut rng = Rng::new(5);
    let width = 640;
    let x = random_x(9 * width, &mut rng);
    let rows = [4usize, 0, 8, 4];
    let mut want = vec![0f32; rows.len() * width];
    cpu.gather_rows(&x, width, &rows, &mut want).unwrap();
    let dx = dev.upload(&x).unwrap();
    let mut g = dev.zeros(rows.len() * width).unwrap();
    dev.gather_rows(&dx, width, &rows, &mut g).unwrap();
    assert_eq!(download(dev, &g), want);

    let weights = [0.25f32, -1.5, 0.75, 2.0];
    let mut out_cpu = random_x(9 * width, &mut rng);
    let mut out = dev.upload(&out_cpu).unwrap();
    cpu.scatter_add_rows(&want, width, &rows, &weights, &mut out_cpu)
        .unwrap();
    dev.scatter_add_rows(&g, width, &rows, &weights, &mut out)
        .unwrap();
    assert_eq!(download(dev, &out), out_cpu);
    let err = dev
        .gather_rows(&dx, width, &[9], &mut dev.zeros(width).unwrap())
        .unwrap_err();
    assert_eq!(err.to_string(), "gather_rows: row 9 of 9");
}

#[test]
fn attention_matches_the_cpu_over_a_kv_cache() {
    let dev = device_or_skip!();
    let cpu = Cpu::default();
    let mut rng = Rng::new(9);
    let mut worst = 0f64;
    let cases = [
        // (heads, kv heads, head dim, pos0, rows, window, softcap, sinks)
        (8, 2, 64, 0, 1, None, None, false),
        (8, 2, 128, 300, 1, None, None, false),
        (16, 4, 256, 1000, 1, Some(128), Some(50.0), false),
        (8, 8, 64, 37, 5, None, None, true),
        (4, 1, 80, 2047, 3, Some(512), None, true),
        (12, 4, 512, 90, 2, None, Some(30.0), false),
    ];
    for (nh, nkv, hd, pos0, n, window, softcap, sinks) in cases {
        let s = AttnShape {
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: hd,
            window,
            softcap,
        };
        let scale = 1.0 / (hd as f32).sqrt();
        let q: Vec<f32> = random_x(n * nh * hd, &mut rng)
            .iter()
            .map(|v| v * 2.0 * scale)
            .collect();
        let k = random_x((pos0 + n) * nkv * hd, &mut rng);
        let v = random_x((pos0 + n) * nkv * hd, &mut rng);
        let sk: Option<Vec<f32>> = sinks.then(|| random_x(nh, &mut rng));
        let mut want = vec![0f32; q.len()];
        cpu.attention(&s, &q, &k, &v, pos0, sk.as_deref(), &mut want)
            .unwrap();
        let (dq, dk, dv) = (
            dev.upload(&q).unwrap(),
            dev.upload(&k).unwrap(),
            dev.upload(&v).unwrap(),
        );
        let mut out = dev.zeros(q.len()).unwrap();
        dev.attention(&s, &dq, &dk, &dv, pos0, sk.as_deref(), &mut out)
            .unwrap();
        let e = worst_rel(&download(dev, &out), &want);
        assert!(
            e <= 1e-5,
            "attention {nh}/{nkv}x{hd} at {pos0} ({n} rows): {e:e}"
        );
        worst = worst.max(e);
    }
    eprintln!("cuda-err attention (|gpu-cpu| / max|cpu|, 6 shapes): {worst:.2e}");
}

/// A random `rows × cols` matrix of `ty` on the host and the device, and the RMS of its
/// values.
fn random_weights(
    dev: &Cuda,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    rng: &mut Rng,
) -> (Vec<u8>, CudaMatrix, f64) {
    let bytes = random_matrix(ty, rows, cols, rng);
    let m = Matrix::new(ty, rows, cols, &bytes).unwrap();
    let mut row = vec![0f32; cols];
    let mut ss = 0f64;
    for r in 0..rows {
        dequantize_row(ty, m.row(r), &mut row);
        ss += row.iter().map(|v| (*v as f64).powi(2)).sum::<f64>();
    }
    let dm = dev.upload_matrix(&m).unwrap();
    (bytes, dm, (ss / (rows * cols) as f64).sqrt())
}

/// Multi-head latent attention against the CPU's (`cpu::mla::mla_attention`), both forms of
/// the up-projections (Hugging Face's joint `kv_b_proj`, llama.cpp's split `k_b` / `v_b`),
/// F32 weights (read in place) and stored types (decoded per call), over one sequence: a
/// prompt of 5 rows at position 0, a decode row at 5, 3 rows at 6 and a decode row at 300,
/// over a latent cache of 310 positions (more than each call reads). The softmax scale puts
/// the scores a few units apart. A prompt's rows also equal the same rows one call each, bit
/// for bit (every output depends on its own row and the cache only).
#[test]
fn latent_attention_matches_the_cpu_in_both_kv_b_forms() {
    let dev = device_or_skip!();
    let cpu = Cpu::default();
    let mut rng = Rng::new(13);
    let mut report = Vec::new();
    let cases = [
        // (heads, nope, rope, v, rank, joint, key type, value type)
        (4, 128, 64, 128, 512, true, GgmlType::BF16, GgmlType::BF16),
        (4, 128, 64, 128, 512, false, GgmlType::Q8_0, GgmlType::Q4_K),
        (3, 24, 8, 20, 40, true, GgmlType::F32, GgmlType::F32),
        (3, 24, 8, 20, 40, false, GgmlType::F32, GgmlType::F16),
        (2, 64, 32, 48, 256, true, GgmlType::Q4_K, GgmlType::Q4_K),
    ];
    for (nh, nope, rope, vd, rank, joint, kty, vty) in cases {
        let (k_rows, k_cols) = match joint {
            true => (nh * (nope + vd), rank),
            false => (nh * rank, nope),
        };
        let (kb, dk, rms_k) = random_weights(dev, kty, k_rows, k_cols, &mut rng);
        let kb = kept(kb);
        let (vb, dv) = match joint {
            true => (&[][..], None),
            false => {
                let (b, m, _) = random_weights(dev, vty, nh * vd, rank, &mut rng);
                (kept(b), Some(m))
            }
        };
        let k_host = Matrix::new(kty, k_rows, k_cols, kb).unwrap();
        let v_host = (!joint).then(|| Matrix::new(vty, nh * vd, rank, vb).unwrap());
        // q and the latent uniform in [-2, 2) (variance 4/3): a score's std is about
        // 4/3 · rms_k · √(nope · rank) · scale, here 4/3
        let s = MlaShape {
            n_heads: nh,
            nope,
            rope,
            v: vd,
            rank,
            scale: (1.0 / (rms_k * ((nope * rank) as f64).sqrt())) as f32,
        };
        let qh = nope + rope;
        let positions = 310;
        let latent = random_x(positions * (rank + rope), &mut rng);
        let dlat = dev.upload(&latent).unwrap();
        let mut worst = 0f64;
        let mut prompt = (Vec::new(), Vec::new());
        for (pos0, n) in [(0, 5), (5, 1), (6, 3), (300, 1)] {
            let q = random_x(n * nh * qh, &mut rng);
            let mut want = vec![0f32; n * nh * vd];
            let proj = MlaProj {
                k: &k_host,
                v: v_host.as_ref(),
            };
            cpu.mla_attention(&s, &q, proj, true, &latent, pos0, &mut want)
                .unwrap();
            let dq = dev.upload(&q).unwrap();
            let mut out = dev.zeros(n * nh * vd).unwrap();
            let proj = MlaProj {
                k: &dk,
                v: dv.as_ref(),
            };
            dev.mla_attention_dev(&s, &dq, proj, &dlat, pos0, &mut out)
                .unwrap();
            let got = download(dev, &out);
            let e = worst_rel(&got, &want);
            assert!(
                e <= 1e-5,
                "mla {nh}x{nope}+{rope}, v {vd}, rank {rank}, joint {joint}, {kty}/{vty}, \
                 {n} rows at {pos0}: {e:e}"
            );
            worst = worst.max(e);
            if pos0 == 0 {
                prompt = (q, got);
            }
        }
        // the prompt's rows one call each
        let (q, got) = &prompt;
        for t in 0..5 {
            let dq = dev.upload(&q[t * nh * qh..(t + 1) * nh * qh]).unwrap();
            let mut out = dev.zeros(nh * vd).unwrap();
            let proj = MlaProj {
                k: &dk,
                v: dv.as_ref(),
            };
            dev.mla_attention_dev(&s, &dq, proj, &dlat, t, &mut out)
                .unwrap();
            assert_eq!(
                download(dev, &out),
                got[t * nh * vd..(t + 1) * nh * vd],
                "row {t} alone (joint {joint}, {kty})"
            );
        }
        report.push(format!(
            "{}/{kty}{} {worst:.2e}",
            if joint { "joint" } else { "split" },
            if joint {
                String::new()
            } else {
                format!("+{vty}")
            }
        ));
    }
    eprintln!(
        "cuda-err mla_attention (|gpu-cpu| / max|cpu|, 4 calls per case): {}",
        report.join(", ")
    );
}

/// L2-normalises each `d`-wide slice of `x` (the CPU's `l2norm`), then times `scale`.
fn l2_rows(x: &mut [f32], d: usize, scale: f32) {
    for r in x.chunks_mut(d) {
        cpu::kda::l2norm(r);
        r.iter_mut().for_each(|v| *v *= scale);
    }
}

/// The KDA delta rule against the CPU's (`cpu::kda::delta_rule`) from a non-zero state: a
/// prompt of several tokens then a decode token, outputs and the updated state, with key and
/// value widths that leave partial blocks of state columns. The state lives in the second
/// of two slots of one buffer (the first stays untouched); a prompt in one call equals its
/// tokens one call each on the GPU bit for bit.
#[test]
fn kda_scan_matches_the_cpu_from_a_nonzero_state() {
    let dev = device_or_skip!();
    let cpu = Cpu::default();
    let mut rng = Rng::new(17);
    let mut worst = 0f64;
    // (heads, dk, dv, prompt tokens)
    for (heads, dk, dv, n0) in [(4, 128, 128, 7), (3, 40, 72, 5), (2, 256, 64, 3)] {
        let per = heads * dk * dv;
        let s0: Vec<f32> = random_x(per, &mut rng).iter().map(|v| v * 0.5).collect();
        let mut slots = random_x(per, &mut rng);
        slots.extend_from_slice(&s0);
        let mut dstate = dev.upload(&slots).unwrap();
        let mut dstate1 = dev.upload(&slots).unwrap();
        let mut cstate = s0.clone();
        let mut prompt_out = Vec::new();
        for (step, n) in [n0, 1].into_iter().enumerate() {
            let mut q = random_x(n * heads * dk, &mut rng);
            let mut k = random_x(n * heads * dk, &mut rng);
            l2_rows(&mut q, dk, 1.0 / (dk as f32).sqrt());
            l2_rows(&mut k, dk, 1.0);
            let v = random_x(n * heads * dv, &mut rng);
            // log decays in [-0.6, 0]; betas in (0.12, 0.88)
            let g: Vec<f32> = random_x(n * heads * dk, &mut rng)
                .iter()
                .map(|x| -0.15 * (x + 2.0))
                .collect();
            let beta: Vec<f32> = random_x(n * heads, &mut rng)
                .iter()
                .map(|&x| cpu::kda::sigmoid(x))
                .collect();
            let mut want = vec![0f32; n * heads * dv];
            cpu.kda_scan(
                heads,
                dk,
                dv,
                [&q, &k, &v, &g],
                &beta,
                &mut cstate,
                0,
                &mut want,
            )
            .unwrap();
            let up = |x: &[f32]| dev.upload(x).unwrap();
            let (dq, dk_, dv_, dg, db) = (up(&q), up(&k), up(&v), up(&g), up(&beta));
            let mut out = dev.zeros(n * heads * dv).unwrap();
            dev.kda_scan_dev(
                heads,
                dk,
                dv,
                [&dq, &dk_, &dv_, &dg],
                &db,
                &mut dstate,
                per,
                &mut out,
            )
            .unwrap();
            let got = download(dev, &out);
            let e = worst_rel(&got, &want);
            let st = download(dev, &dstate);
            assert_eq!(st[..per], slots[..per], "the other slot");
            let es = worst_rel(&st[per..], &cstate);
            assert!(
                e <= 1e-5 && es <= 1e-5,
                "kda {heads}x{dk}x{dv}, step {step} ({n} tokens): output {e:e}, state {es:e}"
            );
            worst = worst.max(e).max(es);
            if step == 0 {
                // the same tokens one call each, on a copy of the starting state
                for t in 0..n {
                    let a = |x: &[f32], w: usize| up(&x[t * heads * w..(t + 1) * heads * w]);
                    let mut o1 = dev.zeros(heads * dv).unwrap();
                    dev.kda_scan_dev(
                        heads,
                        dk,
                        dv,
                        [&a(&q, dk), &a(&k, dk), &a(&v, dv), &a(&g, dk)],
                        &a(&beta, 1),
                        &mut dstate1,
                        per,
                        &mut o1,
                    )
                    .unwrap();
                    prompt_out.extend(download(dev, &o1));
                }
                assert_eq!(prompt_out, got, "a prompt in one call and token by token");
                assert_eq!(download(dev, &dstate1), st, "the state either way");
            }
        }
    }
    eprintln!(
        "cuda-err kda_scan (|gpu-cpu| / max|cpu|, outputs and states, 3 shapes): {worst:.2e}"
    );
}

#[test]
fn shape_mismatches_are_errors() {
    let dev = device_or_skip!();
    let bytes = vec![0u8; 4 * 64 * 4];
    let w = Matrix::new(GgmlType::F32, 4, 64, &bytes).unwrap();
    let dw = dev.upload_matrix(&w).unwrap();
    let x = dev.zeros(63).unwrap();
    let mut y = dev.zeros(4).unwrap();
    assert_eq!(
        dev.matmul(&dw, &x, 1, &mut y).unwrap_err().to_string(),
        "matmul: F32 matrix 4x64 with x of 63 and y of 4 floats for 1 rows"
    );
    let mut a = dev.zeros(3).unwrap();
    let err = dev.add(&mut a, &x).unwrap_err().to_string();
    assert_eq!(err, "add: 3 and 63 floats");
    let err = dev
        .kda_scan(1, 1, 1, [&x, &x, &x, &x], &x, &mut a, 0, &mut y)
        .unwrap_err()
        .to_string();
    assert_eq!(err, "kda_scan output: 4 floats, 63 expected");
    let mut y63 = dev.zeros(63).unwrap();
    let err = dev
        .kda_scan(1, 1, 1, [&x, &x, &x, &x], &x, &mut a, 3, &mut y63)
        .unwrap_err()
        .to_string();
    assert_eq!(err, "kda_scan: state of 3 floats, 1 needed from 3");
    // MLA: 2 heads of 2 + 1 (rope), values 2, rank 4; 7 query floats are not whole rows
    let s = MlaShape {
        n_heads: 2,
        nope: 2,
        rope: 1,
        v: 2,
        rank: 4,
        scale: 1.0,
    };
    let kv_b = dev
        .upload_matrix(&Matrix::new(GgmlType::F32, 8, 4, &[0u8; 8 * 4 * 4]).unwrap())
        .unwrap();
    let (q, lat) = (dev.zeros(6).unwrap(), dev.zeros(5).unwrap());
    let mut o = dev.zeros(4).unwrap();
    let err = dev
        .mla_attention_dev(&s, &q, MlaProj { k: &dw, v: None }, &lat, 0, &mut o)
        .unwrap_err()
        .to_string();
    assert_eq!(err, "mla_attention: kv_b 4x64 for 2 heads of 2 + 2, rank 4");
    let err = dev
        .mla_attention_dev(&s, &q, MlaProj { k: &kv_b, v: None }, &lat, 1, &mut o)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "mla_attention: latent of 5 floats, 10 needed for 2 positions of 5"
    );
    let err = dev
        .mla_attention_dev(&s, &x, MlaProj { k: &kv_b, v: None }, &lat, 0, &mut o)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("mla_attention: 63 query floats, 2 heads of 2 + 1"),
        "{err}"
    );
}

/// `copy` moves exactly the floats asked for; `matmul_host` uploads a kept matrix once
/// (the same device copy at the second call, its bytes counted as resident) and a
/// transient one per call (counted as such), both giving the product of `matmul`.
#[test]
fn copies_and_host_weights() {
    let dev = device_or_skip!();
    let src = dev.upload(&[1.0, 2.0, 3.0, 4.0, 5.0]).unwrap();
    let mut dst = dev.zeros(6).unwrap();
    dev.copy(&src, 1, &mut dst, 2, 3).unwrap();
    assert_eq!(download(dev, &dst), [0.0, 0.0, 2.0, 3.0, 4.0, 0.0]);
    let e = dev.copy(&src, 3, &mut dst, 0, 3).unwrap_err();
    assert_eq!(e.to_string(), "copy: 3 floats from 3 of 5 to 0 of 6");

    let mut rng = Rng::new(7);
    let (rows, cols) = (24, 256);
    let bytes = kept(random_matrix(GgmlType::Q4_K, rows, cols, &mut rng));
    let m = Matrix::new(GgmlType::Q4_K, rows, cols, bytes).unwrap();
    let x = random_x(cols * 2, &mut rng);
    let xd = dev.upload(&x).unwrap();
    let want = {
        let w = dev.upload_matrix(&m).unwrap();
        let mut y = dev.zeros(2 * rows).unwrap();
        dev.matmul(&w, &xd, 2, &mut y).unwrap();
        download(dev, &y)
    };
    let (res0, tr0) = dev.weight_bytes();
    for keep in [true, true, false, false] {
        let mut y = dev.zeros(2 * rows).unwrap();
        dev.matmul_host(&m, keep, &xd, 2, &mut y).unwrap();
        assert_eq!(download(dev, &y), want, "keep {keep}");
    }
    let (res1, tr1) = dev.weight_bytes();
    assert_eq!(res1 - res0, bytes.len(), "one resident copy");
    assert_eq!(tr1 - tr0, 2 * bytes.len() as u64, "two transient copies");
}

// after the helpers and the macro above, which they use
#[path = "tests_family.rs"]
mod family;
#[path = "tests_seqs.rs"]
mod seqs;
