//! Tests of the q8 path (`q8/`): activation quantization against its definition, prepared
//! rows against dequantization, and every level's integer tiles against the scalar
//! reference of their lane width, bit for bit, on random rows, odd block counts and partial
//! tiles.

use super::q8::*;
use super::tests::{random_row, random_x, Rng};
use super::*;

/// The types with an integer path under `--numerics q8` (`q8::int_plan`).
pub(crate) const INT_TYPES: [GgmlType; 7] = [
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q5_0,
    GgmlType::MXFP4,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Prepared rows of `ty`: (signed values, block scales) or (unsigned values, K factors).
enum Prepared {
    B32(Vec<i8>, Vec<f32>),
    K(Vec<u8>, Vec<KMeta>),
}

fn prepare(ty: GgmlType, rows: &[Vec<u8>], cols: usize) -> Prepared {
    match int_plan(ty).unwrap() {
        IntPlan::B32(f) => {
            let (mut w, mut d) = (
                vec![0i8; rows.len() * cols],
                vec![0f32; rows.len() * cols / 32],
            );
            for (i, r) in rows.iter().enumerate() {
                f(
                    r,
                    &mut w[i * cols..][..cols],
                    &mut d[i * cols / 32..][..cols / 32],
                );
            }
            Prepared::B32(w, d)
        }
        IntPlan::K(f) => {
            let n = cols / QK;
            let (mut q, mut m) = (
                vec![0u8; rows.len() * cols],
                vec![KMeta::default(); rows.len() * n],
            );
            for (i, r) in rows.iter().enumerate() {
                f(r, &mut q[i * cols..][..cols], &mut m[i * n..][..n]);
            }
            Prepared::K(q, m)
        }
    }
}

#[test]
fn f16_rounding_matches_the_half_crate() {
    let mut rng = Rng::new(7);
    for i in 0..200_000 {
        let mag = [1e-8f32, 1e-5, 6e-5, 1e-2, 1.0, 300.0, 70000.0][i % 7];
        let v = rng.unit() * mag;
        assert_eq!(
            q8::round_to_f16(v).to_bits(),
            half::f16::from_f32(v).to_f32().to_bits(),
            "{v}"
        );
    }
}

#[test]
fn q8_0_activations_follow_the_definition() {
    let mut rng = Rng::new(1);
    let x = random_x(96, &mut rng);
    let mut a = Q8Acts::default();
    a.quantize(ActFormat::Q8_0, &x, 96);
    for b in 0..3 {
        let xb = &x[32 * b..][..32];
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(a.d[b], half::f16::from_f32(amax / 127.0).to_f32());
        for (j, &v) in xb.iter().enumerate() {
            let want = (v * (127.0 / amax)).round_ties_even() as i8;
            assert_eq!(a.qs[32 * b + j], want);
        }
        // the element of largest magnitude maps to ±127
        assert_eq!(
            a.qs[32 * b..][..32].iter().map(|q| q.unsigned_abs()).max(),
            Some(127)
        );
    }
    // an all-zero block: scale 0, values 0
    a.quantize(ActFormat::Q8_0, &[0.0; 32], 32);
    assert_eq!((a.d[0], a.qs.iter().all(|&q| q == 0)), (0.0, true));
}

#[test]
fn q8_k_activations_follow_the_definition() {
    let mut rng = Rng::new(2);
    let mut x = random_x(512, &mut rng);
    x[300] = -5.0; // the largest magnitude: iscale = -127 / -5, so q[300] = -127 and d > 0
    let mut a = Q8Acts::default();
    a.quantize(ActFormat::Q8K, &x, 512);
    assert_eq!(a.d[1], 1.0 / (-127.0 / -5.0));
    assert_eq!(a.qs[300], -127);
    for s in 0..32 {
        let sum: i16 = a.qs[16 * s..][..16].iter().map(|&q| q as i16).sum();
        assert_eq!(a.bsums[s], sum);
    }
    let dq: Vec<f32> =
        a.qs.iter()
            .enumerate()
            .map(|(i, &q)| a.d[i / QK] * q as f32)
            .collect();
    for (v, w) in x.iter().zip(&dq) {
        assert!(
            (v - w).abs() <= a.d[0].abs().max(a.d[1].abs()) * 0.5 + 1e-6,
            "{v} vs {w}"
        );
    }
}

#[test]
fn prepared_rows_hold_the_dequantized_values() {
    let mut rng = Rng::new(3);
    for ty in INT_TYPES {
        let cols = 512;
        let row = random_row(ty, cols / ty.block_elems(), &mut rng);
        let mut want = vec![0f32; cols];
        scalar_dequant(ty, &row, &mut want);
        let got: Vec<f32> = match prepare(ty, &[row], cols) {
            Prepared::B32(w, d) => w
                .iter()
                .enumerate()
                .map(|(i, &v)| d[i / 32] * v as f32)
                .collect(),
            Prepared::K(q, m) => q
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    let k = &m[i / QK];
                    let s = (i % QK) / 16;
                    (k.d * k.sc[s] as f32) * v as f32 - k.dmin * k.mn[s] as f32
                })
                .collect(),
        };
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let tol = if ty == GgmlType::Q6_K {
                w.abs() * 1e-6 + 1e-30
            } else {
                0.0
            };
            assert!((g - w).abs() <= tol, "{ty} element {i}: {g} vs {w}");
        }
    }
}

fn scalar_dequant(ty: GgmlType, row: &[u8], out: &mut [f32]) {
    dequantize_row_at(SimdLevel::Scalar, ty, row, out)
}

/// Every level's tiles equal the reference of their lane width, for `nr × nt` partial
/// tiles too, and the dot lands near the exact f32 dot.
fn check_tiles(ty: GgmlType, blocks: usize, seed: u64) {
    let mut rng = Rng::new(seed);
    let cols = blocks * ty.block_elems();
    let rows: Vec<Vec<u8>> = (0..4).map(|_| random_row(ty, blocks, &mut rng)).collect();
    let n = 5;
    let x = random_x(n * cols, &mut rng);
    let plan = int_plan(ty).unwrap();
    let mut a = Q8Acts::default();
    a.quantize(plan.act_format(), &x, cols);
    let prep = prepare(ty, &rows, cols);
    for level in SimdLevel::available() {
        let k = int_kernels(level);
        let (tr, tt) = match prep {
            Prepared::B32(..) => k.shape32,
            Prepared::K(..) => k.shape_k,
        };
        for nr in 1..=tr.min(4) {
            for nt in 1..=tt.min(n) {
                for t0 in [0, n - nt] {
                    let mut got = vec![0f32; nr * nt];
                    let mut want = vec![0f32; nr * nt];
                    match &prep {
                        Prepared::B32(w, d) => {
                            (k.tile32)(w, d, nr, &a, t0, nt, &mut got);
                            match k.lanes {
                                16 => ref_tile32::<16>(w, d, nr, &a, t0, nt, &mut want),
                                _ => ref_tile32::<8>(w, d, nr, &a, t0, nt, &mut want),
                            }
                        }
                        Prepared::K(q, m) => {
                            (k.tile_k)(q, m, nr, &a, t0, nt, &mut got);
                            match k.lanes {
                                16 => ref_tile_k::<16>(q, m, nr, &a, t0, nt, &mut want),
                                _ => ref_tile_k::<8>(q, m, nr, &a, t0, nt, &mut want),
                            }
                        }
                    }
                    let gb: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
                    let wb: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
                    assert_eq!(
                        gb, wb,
                        "{ty} {level:?} blocks {blocks} {nr}x{nt} at {t0}: {got:?} vs {want:?}"
                    );
                }
            }
        }
        // near the exact dot: the error of 8-bit activations, well under 2% of the scale
        let mut one = vec![0f32; 1];
        for t in 0..n {
            let xt = &x[t * cols..][..cols];
            let exact = dot_row_at(SimdLevel::Scalar, ty, &rows[0], xt);
            let mut w = vec![0f32; cols];
            scalar_dequant(ty, &rows[0], &mut w);
            let scale: f32 = w.iter().zip(xt).map(|(a, b)| (a * b).abs()).sum();
            match &prep {
                Prepared::B32(w, d) => (k.tile32)(w, d, 1, &a, t, 1, &mut one),
                Prepared::K(q, m) => (k.tile_k)(q, m, 1, &a, t, 1, &mut one),
            }
            assert!(
                (one[0] - exact).abs() <= 0.02 * scale + 1e-20,
                "{ty} {level:?}: q8 {} vs exact {exact} (scale {scale})",
                one[0]
            );
        }
    }
}

#[test]
fn integer_tiles_equal_their_scalar_reference() {
    for (i, ty) in INT_TYPES.into_iter().enumerate() {
        let counts: &[usize] = if ty.block_elems() == 32 {
            &[1, 2, 3, 7, 20]
        } else {
            &[1, 2, 3]
        };
        for &b in counts {
            for s in 0..3 {
                check_tiles(ty, b, 1000 * i as u64 + 10 * b as u64 + s);
            }
        }
    }
}

#[test]
fn fold_adds_halves() {
    let a: [f32; 8] = std::array::from_fn(|i| (1u32 << i) as f32);
    assert_eq!(fold(a), 255.0);
    // the order is fixed: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))
    let b = [1e8f32, 1.0, -1e8, 1.0, 1.0, 0.0, 0.0, 0.0];
    assert_eq!(fold(b), ((1e8f32 + 1.0) + -1e8) + (1.0 + 1.0));
}

/// The quad tile (AVX-512 VNNI) equals `ref_pair32` for every pair, for row and token
/// counts that are not whole quads and for partial tiles.
#[test]
fn quad_tiles_equal_their_scalar_reference() {
    let Some((tile, (tr, tt))) = int_kernels(SimdLevel::detect()).quad32 else {
        return; // no VNNI on this CPU: nothing runs the quad tile
    };
    for (i, ty) in [
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::MXFP4,
    ]
    .into_iter()
    .enumerate()
    {
        for (blocks, nrows, n) in [(1, 1, 1), (3, 7, 5), (20, 18, 9), (2, 16, 8)] {
            let mut rng = Rng::new(77 + i as u64 * 100 + blocks as u64);
            let cols = blocks * 32;
            let rows: Vec<Vec<u8>> = (0..nrows)
                .map(|_| random_row(ty, blocks, &mut rng))
                .collect();
            let x = random_x(n * cols, &mut rng);
            let mut a = Q8Acts::default();
            a.quantize(ActFormat::Q8_0, &x, cols);
            let mut qa = QuadActs::default();
            qa.build(&a, n);
            let Prepared::B32(w, d) = prepare(ty, &rows, cols) else {
                unreachable!()
            };
            let mut qr = QuadRows::default();
            qr.build(&w, &d, nrows, cols);
            let (rq_all, tq_all) = (nrows.div_ceil(QUAD), n.div_ceil(QUAD));
            let mut out = vec![0f32; tr * tt * 16];
            for rq0 in 0..rq_all {
                for tq0 in 0..tq_all {
                    let (nrq, ntq) = (tr.min(rq_all - rq0), tt.min(tq_all - tq0));
                    tile(&qr, rq0, nrq, &qa, tq0, ntq, &mut out);
                    for ii in 0..nrq {
                        for j in 0..ntq {
                            for q in 0..QUAD {
                                for p in 0..QUAD {
                                    let (r, t) = ((rq0 + ii) * QUAD + p, (tq0 + j) * QUAD + q);
                                    if r >= nrows || t >= n {
                                        continue;
                                    }
                                    let want = ref_pair32(
                                        &w[r * cols..][..cols],
                                        &d[r * blocks..][..blocks],
                                        &a.qs[t * cols..][..cols],
                                        &a.d[t * blocks..][..blocks],
                                    );
                                    let got = out[(ii * ntq + j) * 16 + 4 * q + p];
                                    assert_eq!(
                                        got.to_bits(),
                                        want.to_bits(),
                                        "{ty} r{r} t{t}: {got} vs {want}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The K quad tile (AVX-512 VNNI) equals `ref_pair_k` for every pair, for row and token
/// counts that are not whole quads and for partial tiles.
#[test]
fn k_quad_tiles_equal_their_scalar_reference() {
    let Some((tile, (tr, tt))) = int_kernels(SimdLevel::detect()).quad_k else {
        return; // no VNNI on this CPU: nothing runs the K quad tile
    };
    for (i, ty) in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K]
        .into_iter()
        .enumerate()
    {
        for (nsb, nrows, n) in [(1, 1, 1), (3, 7, 5), (2, 9, 10)] {
            let mut rng = Rng::new(500 + i as u64 * 100 + nsb as u64);
            let cols = nsb * QK;
            let rows: Vec<Vec<u8>> = (0..nrows).map(|_| random_row(ty, nsb, &mut rng)).collect();
            let x = random_x(n * cols, &mut rng);
            let mut a = Q8Acts::default();
            a.quantize(ActFormat::Q8K, &x, cols);
            let mut qa = QuadKActs::default();
            qa.build(&a, n);
            let Prepared::K(q, m) = prepare(ty, &rows, cols) else {
                unreachable!()
            };
            let mut qr = QuadKRows::default();
            qr.build(&q, &m, nrows, cols);
            let (rq_all, tq_all) = (nrows.div_ceil(QUAD), n.div_ceil(QUAD));
            let mut out = vec![0f32; tr * tt * 16];
            for rq0 in 0..rq_all {
                for tq0 in 0..tq_all {
                    let (nrq, ntq) = (tr.min(rq_all - rq0), tt.min(tq_all - tq0));
                    tile(&qr, rq0, nrq, &qa, tq0, ntq, &mut out);
                    for ii in 0..nrq {
                        for j in 0..ntq {
                            for qq in 0..QUAD {
                                for p in 0..QUAD {
                                    let (r, t) = ((rq0 + ii) * QUAD + p, (tq0 + j) * QUAD + qq);
                                    if r >= nrows || t >= n {
                                        continue;
                                    }
                                    let want = ref_pair_k(
                                        &q[r * cols..][..cols],
                                        &m[r * nsb..][..nsb],
                                        &a.qs[t * cols..][..cols],
                                        &a.d[t * nsb..][..nsb],
                                        &a.bsums[t * nsb * 16..][..nsb * 16],
                                    );
                                    let got = out[(ii * ntq + j) * 16 + 4 * qq + p];
                                    assert_eq!(
                                        got.to_bits(),
                                        want.to_bits(),
                                        "{ty} r{r} t{t}: {got} vs {want}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn activation_abs_max_equals_the_scans_it_replaced() {
    use crate::quant::q8::acts::{abs_max, quantize_q8_k_block};
    let mut rng = Rng::new(91);
    let mut rows: Vec<Vec<f32>> = vec![
        vec![],
        vec![0.0; 256],
        vec![-0.0; 256],
        (0..256)
            .map(|i| if i % 3 == 0 { f32::NAN } else { 0.0 })
            .collect(),
    ];
    for n in [1, 7, 8, 9, 31, 32, 256] {
        // small integers: many ties in magnitude, both signs
        let mut v: Vec<f32> = (0..n).map(|_| (rng.next_u64() % 9) as f32 - 4.0).collect();
        rows.push(v.clone());
        v[n / 2] = f32::NAN;
        rows.push(v);
    }
    for x in &rows {
        let fold = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(abs_max(x).to_bits(), fold.to_bits(), "{x:?}");
        if x.len() == 256 {
            // Q8_K's scale follows the first value of the largest magnitude (its sign)
            let (mut amax, mut max) = (0f32, 0f32);
            for &v in x {
                if v.abs() > amax {
                    amax = v.abs();
                    max = v;
                }
            }
            let (mut q, mut s) = (vec![0i8; 256], vec![0i16; 16]);
            let d = quantize_q8_k_block(x, &mut q, &mut s);
            let want = if amax == 0.0 {
                0.0
            } else {
                1.0 / (-127.0 / max)
            };
            assert_eq!(d.to_bits(), want.to_bits(), "{:?}", &x[..8]);
        }
    }
}
