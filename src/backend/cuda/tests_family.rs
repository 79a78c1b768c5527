//! The family ops (`family_ops.rs`) against the CPU backend on random inputs, on a GPU
//! (each test skips without one, as the rest of `tests.rs`). Bounds as there: the ops whose
//! kernels do the CPU's f32 operations in its order with no library function (L2 norms, row
//! biases, input-major products of up to 8 rows) bit for bit; the others (expf, logf, sin,
//! cos, or sums in another order) within 1e-5 of the output's largest magnitude; products
//! of more than 8 rows (cuBLAS) within 1e-5 of `Σ|x·w|` per output. `cuda-err` lines print
//! the measured errors with `--nocapture`.

use super::*;

/// The CPU's result and the GPU's on copies of `x` for an in-place op, compared.
fn in_place(
    dev: &Cuda,
    x: &[f32],
    cpu_op: impl FnOnce(&mut Vec<f32>),
    gpu_op: impl FnOnce(&mut CudaBuf),
) -> (Vec<f32>, Vec<f32>) {
    let mut want = x.to_vec();
    cpu_op(&mut want);
    let mut d = dev.upload(x).unwrap();
    gpu_op(&mut d);
    (download(dev, &d), want)
}

#[test]
fn rms_norm_head_matches_the_cpu() {
    let dev = device_or_skip!();
    let cpu = Cpu::default();
    let mut rng = Rng::new(21);
    // DeepSeek's latent rows: RMSNorm of the first 512 of 576 floats, the rotary key untouched
    let (rows, width, d) = (6, 576, 512);
    let x = random_x(rows * width, &mut rng);
    let w = random_x(d, &mut rng);
    let (got, want) = in_place(
        dev,
        &x,
        |c| cpu.rms_norm_head(c, width, &w, 1e-6).unwrap(),
        |g| dev.rms_norm_head(g, width, &w, 1e-6).unwrap(),
    );
    let e = worst_rel(&got, &want);
    assert!(e <= 1e-5, "rms_norm_head {e:e}");
    for r in 0..rows {
        assert_eq!(
            got[r * width + d..(r + 1) * width],
            x[r * width + d..(r + 1) * width]
        );
    }
    eprintln!("cuda-err rms_norm_head {e:.2e}");
}

#[test]
fn rope_tail_matches_the_cpu_in_both_layouts() {
    let dev = device_or_skip!();
    let cpu = Cpu::default();
    let mut rng = Rng::new(22);
    let mut report = Vec::new();
    // queries (heads of 128 + 64) and latent rows (512 + 64), NeoX and interleaved, scaled
    for (rows, width, per_row, interleaved, scale, pos0) in [
        (3, 192, 4, false, 1.0, 0),
        (3, 192, 4, true, 1.0, 17),
        (2, 576, 1, true, 1.3, 4000),
        (1, 576, 1, false, 0.7, 9),
    ] {
        let inv = cpu::ops::rope_inv_freq(64, 10000.0, 1.0);
        let x = random_x(rows * per_row * width, &mut rng);
        let (got, want) = in_place(
            dev,
            &x,
            |c| {
                cpu.rope_tail(c, rows, width, pos0, &inv, interleaved, scale)
                    .unwrap()
            },
            |g| {
                dev.rope_tail(g, rows, width, pos0, &inv, interleaved, scale)
                    .unwrap()
            },
        );
        let e = worst_rel(&got, &want);
        assert!(
            e <= 1e-5,
            "rope_tail {width} interleaved {interleaved}: {e:e}"
        );
        report.push(format!(
            "{width}{} {e:.2e}",
            if interleaved { "i" } else { "" }
        ));
    }
    eprintln!("cuda-err rope_tail {}", report.join(", "));
}

#[test]
fn kda_conv_matches_the_cpu_and_carries_its_state() {
    let dev = device_or_skip!();
    let cpu = Cpu::default();
    let mut rng = Rng::new(23);
    let (dim, conv) = (256, 4);
    let taps = random_x(3 * dim * conv, &mut rng);
    // the state slot: conv inputs first, then (unused here) the scan's state
    let state0: Vec<f32> = random_x((conv - 1) * 3 * dim + 100, &mut rng);
    let (mut cs, mut gs) = (state0.clone(), dev.upload(&state0).unwrap());
    let mut worst = 0f64;
    for rows in [5, 1, 2] {
        let q = random_x(rows * dim, &mut rng);
        let k = random_x(rows * dim, &mut rng);
        let v = random_x(rows * dim, &mut rng);
        let (mut cq, mut ck, mut cv) = (q.clone(), k.clone(), v.clone());
        cpu.kda_conv([&mut cq, &mut ck, &mut cv], rows, &taps, conv, &mut cs)
            .unwrap();
        let mut g = [&q, &k, &v].map(|h| dev.upload(h).unwrap());
        let [gq, gk, gv] = &mut g;
        dev.kda_conv([gq, gk, gv], rows, &taps, conv, &mut gs)
            .unwrap();
        for (d, c) in g.iter().zip([&cq, &ck, &cv]) {
            worst = worst.max(worst_rel(&download(dev, d), c));
        }
        // the state holds copies of inputs: equal bit for bit, the rest untouched
        assert_eq!(download(dev, &gs), cs, "state after {rows} rows");
    }
    assert!(worst <= 1e-5, "kda_conv {worst:e}");

    // a prompt's rows in one call equal the same rows one by one
    let rows = 4;
    let q = random_x(rows * dim, &mut rng);
    let run = |per: usize| {
        let mut st = dev.upload(&state0).unwrap();
        let mut out = Vec::new();
        for r in (0..rows).step_by(per) {
            let part = &q[r * dim..(r + per) * dim];
            let mut g = [part, part, part].map(|h| dev.upload(h).unwrap());
            let [a, b, c] = &mut g;
            dev.kda_conv([a, b, c], per, &taps, conv, &mut st).unwrap();
            out.extend(download(dev, &g[1]));
        }
        (out, download(dev, &st))
    };
    assert!(run(rows) == run(1), "a prompt against token by token");
    eprintln!("cuda-err kda_conv {worst:.2e}");
}

#[test]
fn l2norm_heads_match_the_cpu_bit_for_bit() {
    let dev = device_or_skip!();
    let cpu = Cpu::default();
    let mut rng = Rng::new(24);
    let x = random_x(5 * 32 * 128, &mut rng);
    for scale in [1.0, 1.0 / 128f32.sqrt()] {
        let (got, want) = in_place(
            dev,
            &x,
            |c| cpu.l2norm_heads(c, 128, 1e-6, scale).unwrap(),
            |g| dev.l2norm_heads(g, 128, 1e-6, scale).unwrap(),
        );
        assert!(bits(&got) == bits(&want), "l2norm_heads scale {scale}");
    }
}

#[test]
fn kda_decay_matches_the_cpu_with_and_without_a_lower_bound() {
    let dev = device_or_skip!();
    let cpu = Cpu::default();
    let mut rng = Rng::new(25);
    let (heads, dk, rows) = (8, 64, 3);
    // gate values on both sides of softplus's threshold (20)
    let g: Vec<f32> = random_x(rows * heads * dk, &mut rng)
        .iter()
        .map(|v| v * 30.0)
        .collect();
    let a_log = random_x(heads, &mut rng);
    let dt = random_x(heads * dk, &mut rng);
    let mut report = Vec::new();
    for lb in [None, Some(-5.0)] {
        let (got, want) = in_place(
            dev,
            &g,
            |c| cpu.kda_decay(c, &a_log, &dt, lb).unwrap(),
            |d| dev.kda_decay(d, &a_log, &dt, lb).unwrap(),
        );
        let e = worst_rel(&got, &want);
        assert!(e <= 1e-5, "kda_decay {lb:?}: {e:e}");
        report.push(format!("{lb:?} {e:.2e}"));
    }
    eprintln!("cuda-err kda_decay {}", report.join(", "));
}

#[test]
fn sigmoids_match_the_cpu() {
    let dev = device_or_skip!();
    let cpu = Cpu::default();
    let mut rng = Rng::new(26);
    let x: Vec<f32> = random_x(5000, &mut rng).iter().map(|v| v * 20.0).collect();
    let g: Vec<f32> = random_x(5000, &mut rng).iter().map(|v| v * 20.0).collect();
    let (got, want) = in_place(
        dev,
        &x,
        |c| cpu.sigmoid(c).unwrap(),
        |d| dev.sigmoid(d).unwrap(),
    );
    let e1 = worst_rel(&got, &want);
    let dg = dev.upload(&g).unwrap();
    let (got, want) = in_place(
        dev,
        &x,
        |c| cpu.mul_sigmoid(c, &g).unwrap(),
        |d| dev.mul_sigmoid(d, &dg).unwrap(),
    );
    let e2 = worst_rel(&got, &want);
    assert!(
        e1 <= 1e-5 && e2 <= 1e-5,
        "sigmoid {e1:e}, mul_sigmoid {e2:e}"
    );
    eprintln!("cuda-err sigmoid {e1:.2e}, mul_sigmoid {e2:.2e}");
}

#[test]
fn gated_head_norm_matches_the_cpu() {
    let dev = device_or_skip!();
    let cpu = Cpu::default();
    let mut rng = Rng::new(27);
    let (rows, heads, hd) = (3, 16, 128);
    let o = random_x(rows * heads * hd, &mut rng);
    let gate: Vec<f32> = random_x(rows * heads * hd, &mut rng)
        .iter()
        .map(|v| v * 8.0)
        .collect();
    let w = random_x(hd, &mut rng);
    let dg = dev.upload(&gate).unwrap();
    let (got, want) = in_place(
        dev,
        &o,
        |c| cpu.gated_head_norm(c, &gate, &w, 1e-5).unwrap(),
        |d| dev.gated_head_norm(d, &dg, &w, 1e-5).unwrap(),
    );
    let e = worst_rel(&got, &want);
    assert!(e <= 1e-5, "gated_head_norm {e:e}");
    eprintln!("cuda-err gated_head_norm {e:.2e}");
}

#[test]
fn res_mix_matches_the_cpu_for_any_bank() {
    let dev = device_or_skip!();
    let cpu = Cpu::default();
    let mut rng = Rng::new(28);
    let (rows, d) = (3, 2048);
    let w: Vec<f32> = random_x(d, &mut rng).iter().map(|v| v * 0.05).collect();
    let cur = random_x(rows * d, &mut rng);
    let dcur = dev.upload(&cur).unwrap();
    let mut report = Vec::new();
    for nb in [0, 1, 4] {
        let bank: Vec<Vec<f32>> = (0..nb).map(|_| random_x(rows * d, &mut rng)).collect();
        let dbank: Vec<CudaBuf> = bank.iter().map(|b| dev.upload(b).unwrap()).collect();
        let mut want = vec![0f32; rows * d];
        let refs: Vec<&Vec<f32>> = bank.iter().collect();
        cpu.res_mix(&refs, &cur, &w, 1e-6, &mut want).unwrap();
        let mut out = dev.zeros(rows * d).unwrap();
        let drefs: Vec<&CudaBuf> = dbank.iter().collect();
        dev.res_mix(&drefs, &dcur, &w, 1e-6, &mut out).unwrap();
        let got = download(dev, &out);
        let e = worst_rel(&got, &want);
        assert!(e <= 1e-5, "res_mix {nb} checkpoints: {e:e}");
        if nb == 0 {
            assert!(bits(&got) == bits(&cur), "an empty bank gives cur");
        }
        report.push(format!("{nb} {e:.2e}"));
    }
    eprintln!("cuda-err res_mix {}", report.join(", "));
}

#[test]
fn add_rows_matches_the_cpu_bit_for_bit() {
    let dev = device_or_skip!();
    let cpu = Cpu::default();
    let mut rng = Rng::new(29);
    let x = random_x(7 * 2880, &mut rng);
    let b = random_x(2880, &mut rng);
    let (got, want) = in_place(
        dev,
        &x,
        |c| cpu.add_rows(c, &b).unwrap(),
        |d| dev.add_rows(d, &b).unwrap(),
    );
    assert!(bits(&got) == bits(&want), "add_rows");
}

#[test]
fn swiglu_oai_matches_the_cpu_in_both_forms() {
    let dev = device_or_skip!();
    let cpu = Cpu::default();
    let mut rng = Rng::new(30);
    // values past the clamp (limit 7) on both sides
    let gu: Vec<f32> = random_x(2 * 3000, &mut rng)
        .iter()
        .map(|v| v * 12.0)
        .collect();
    let up: Vec<f32> = random_x(2 * 3000, &mut rng)
        .iter()
        .map(|v| v * 12.0)
        .collect();
    let (dgu, dup) = (dev.upload(&gu).unwrap(), dev.upload(&up).unwrap());
    let mut want = vec![0f32; 3000];
    cpu.swiglu_oai(&gu, None, 1.702, 7.0, &mut want).unwrap();
    let mut out = dev.zeros(3000).unwrap();
    dev.swiglu_oai(&dgu, None, 1.702, 7.0, &mut out).unwrap();
    let e1 = worst_rel(&download(dev, &out), &want);
    let mut want = vec![0f32; 6000];
    cpu.swiglu_oai(&gu, Some(&up), 1.702, 7.0, &mut want)
        .unwrap();
    let mut out = dev.zeros(6000).unwrap();
    dev.swiglu_oai(&dgu, Some(&dup), 1.702, 7.0, &mut out)
        .unwrap();
    let e2 = worst_rel(&download(dev, &out), &want);
    assert!(
        e1 <= 1e-5 && e2 <= 1e-5,
        "swiglu_oai pairs {e1:e}, two inputs {e2:e}"
    );
    eprintln!("cuda-err swiglu_oai pairs {e1:.2e}, two inputs {e2:.2e}");
}

/// The worst `|got − want| / Σ|x·w|` over the outputs of `x W` for an input-major `w`.
fn worst_t_error(w: &Matrix, x: &[f32], n: usize, got: &[f32], want: &[f32]) -> f64 {
    let (k, m) = (w.rows, w.cols);
    let mut f = vec![0f32; k * m];
    for (i, row) in f.chunks_exact_mut(m).enumerate() {
        dequantize_row(w.ty, w.row(i), row);
    }
    let mut worst = 0f64;
    for t in 0..n {
        for j in 0..m {
            let mag: f64 = (0..k)
                .map(|i| (x[t * k + i] as f64 * f[i * m + j] as f64).abs())
                .sum();
            let o = t * m + j;
            assert!(got[o].is_finite(), "output {o}");
            worst = worst.max((got[o] as f64 - want[o] as f64).abs() / mag.max(1e-30));
        }
    }
    worst
}

#[test]
fn input_major_products_match_the_cpu() {
    let dev = device_or_skip!();
    let cpu = Cpu::default();
    let mut rng = Rng::new(31);
    let mut report = Vec::new();
    // F32 in place, the device types through their decoders, Q5_K dequantized on upload
    for ty in [
        GgmlType::F32,
        GgmlType::BF16,
        GgmlType::F16,
        GgmlType::Q8_0,
        GgmlType::MXFP4,
        GgmlType::Q5_K,
    ] {
        let (k, m) = (
            96,
            cols_for(ty).min(1024) / ty.block_elems() * ty.block_elems(),
        );
        let bytes = kept(random_matrix(ty, k, m, &mut rng));
        let w = Matrix::new(ty, k, m, bytes).unwrap();
        for (rows, keep) in [(1, true), (5, false), (8, true), (20, false)] {
            let x = random_x(rows * k, &mut rng);
            let mut want = vec![0f32; rows * m];
            cpu.matmul_host_t(&w, keep, &x, rows, &mut want).unwrap();
            let dx = dev.upload(&x).unwrap();
            let mut y = dev.zeros(rows * m).unwrap();
            dev.matmul_host_t(&w, keep, &dx, rows, &mut y).unwrap();
            let got = download(dev, &y);
            if rows <= 8 || !dev.has_cublas() {
                assert!(bits(&got) == bits(&want), "{ty} {rows} rows");
            } else {
                let e = worst_t_error(&w, &x, rows, &got, &want);
                assert!(e <= 1e-5, "{ty} {rows} rows: {e:e}");
                report.push(format!("{ty} {e:.2e}"));
            }
        }
    }
    eprintln!(
        "cuda-err matmul_host_t: 1 to 8 rows bit for bit; 20 rows (cuBLAS): {}",
        report.join(", ")
    );
}

#[test]
fn family_op_shape_mismatches_are_errors() {
    let dev = device_or_skip!();
    let mut x = dev.zeros(10).unwrap();
    let e = |r: Result<()>| r.unwrap_err().to_string();
    assert_eq!(
        e(dev.rms_norm_head(&mut x, 4, &[1.0; 3], 1e-6)),
        "rms_norm_head: 10 floats in rows of 4, 3 weights"
    );
    assert_eq!(
        e(dev.rope_tail(&mut x, 2, 5, 0, &[1.0; 3], false, 1.0)),
        "rope_tail: 10 floats, 2 rows, slices of 5, 3 frequencies (at most 256)"
    );
    assert_eq!(
        e(dev.l2norm_heads(&mut x, 4, 1e-6, 1.0)),
        "l2norm_heads: 10 floats in heads of 4"
    );
    assert_eq!(
        e(dev.kda_decay(&mut x, &[0.0; 3], &[0.0; 5], None)),
        "kda_decay: 10 floats in rows of 5 (3 heads)"
    );
    let g = dev.zeros(9).unwrap();
    assert_eq!(
        e(dev.mul_sigmoid(&mut x, &g)),
        "mul_sigmoid gate: 9 floats, 10 expected"
    );
    assert_eq!(
        e(dev.gated_head_norm(&mut x, &g, &[1.0; 5], 1e-6)),
        "gated_head_norm gate: 9 floats, 10 expected"
    );
    assert_eq!(
        e(dev.add_rows(&mut x, &[0.0; 3])),
        "add_rows: 10 floats in rows of 3"
    );
    let mut out = dev.zeros(4).unwrap();
    assert_eq!(
        e(dev.swiglu_oai(&x, None, 1.0, 7.0, &mut out)),
        "swiglu_oai output: 4 floats, 5 expected"
    );
    assert_eq!(
        e(dev.res_mix(&[&g], &x, &[1.0; 5], 1e-6, &mut out)),
        "res_mix output: 4 floats, 10 expected"
    );
    // the convolution: 2 rows of 5, 4 taps; the state needs 3 × 15 floats
    let (mut q, mut k, mut v) = (
        dev.zeros(10).unwrap(),
        dev.zeros(10).unwrap(),
        dev.zeros(10).unwrap(),
    );
    let taps = [0.0; 60];
    assert_eq!(
        e(dev.kda_conv([&mut q, &mut k, &mut v], 2, &taps, 4, &mut out)),
        "kda_conv: state of 4 floats, 45 needed"
    );
    assert_eq!(
        e(dev.kda_conv([&mut q, &mut k, &mut v], 2, &taps, 9, &mut out)),
        "kda_conv: 10 query floats in 2 rows, 9 taps (at most 8)"
    );
    let bytes = vec![0u8; 4 * 8 * 4];
    let w = Matrix::new(GgmlType::F32, 4, 8, &bytes).unwrap();
    let mut y = dev.zeros(8).unwrap();
    assert_eq!(
        e(dev.matmul_host_t(&w, false, &x, 2, &mut y)),
        "matmul_host_t: F32 matrix 4x8 (input-major) with x of 10 and y of 8 floats for 2 rows"
    );
}
