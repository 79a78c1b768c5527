//! Tests of the quant kernels: the `gguf`-generated fixture (exact), every SIMD level against
//! the scalar reference (proptest), and the batch plans' bit-exactness contract.

use super::*;
use proptest::prelude::*;

/// Deterministic test data (splitmix64).
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub(crate) fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// A random row of `ty` with `blocks` blocks: random bytes, finite f16 scales (including
/// tiny ones), finite float elements.
pub(crate) fn random_row(ty: GgmlType, blocks: usize, rng: &mut Rng) -> Vec<u8> {
    let bb = ty.block_bytes();
    let mut v: Vec<u8> = (0..blocks * bb).map(|_| rng.next_u64() as u8).collect();
    let f16 = |rng: &mut Rng| {
        let mag = [1e-6f32, 1e-3, 0.01, 0.5, 3.0][(rng.next_u64() % 5) as usize];
        half::f16::from_f32(rng.unit() * mag).to_le_bytes()
    };
    let scales: &[usize] = match ty {
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 => &[0],
        GgmlType::Q4_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::TQ1_0 => &[52],
        GgmlType::TQ2_0 => &[64],
        GgmlType::IQ1_S | GgmlType::IQ2_XXS | GgmlType::IQ2_XS | GgmlType::IQ2_S => &[0],
        GgmlType::IQ3_XXS | GgmlType::IQ3_S | GgmlType::IQ4_NL | GgmlType::IQ4_XS => &[0],
        _ => &[],
    };
    for b in 0..blocks {
        let blk = &mut v[b * bb..(b + 1) * bb];
        match ty {
            GgmlType::F32 => blk.copy_from_slice(&(rng.unit() * 4.0).to_le_bytes()),
            GgmlType::F16 => blk.copy_from_slice(&f16(rng)),
            GgmlType::BF16 => {
                let bits = (rng.unit() * 4.0).to_bits() >> 16;
                blk.copy_from_slice(&(bits as u16).to_le_bytes());
            }
            // E8M0 scales 2^-28 ..= 2^3 (finite products, subnormal-free sums)
            GgmlType::MXFP4 => blk[0] = 99 + (rng.next_u64() % 32) as u8,
            // the f16 scale is the top nibbles of the last four u16s: clear its top two
            // exponent bits (byte 55 bits 5, 6), so it is finite and below 2^-7
            GgmlType::IQ1_M => blk[55] &= 0x9F,
            _ => {
                for &o in scales {
                    blk[o..o + 2].copy_from_slice(&f16(rng));
                }
            }
        }
    }
    v
}

/// `n` activations uniform in [-2, 2).
pub(crate) fn random_x(n: usize, rng: &mut Rng) -> Vec<f32> {
    (0..n).map(|_| rng.unit() * 2.0).collect()
}

/// Parses `tools/reference/quant_fixture.py` output: (type, bytes, expected values).
pub(crate) fn parse_fixture(data: &[u8]) -> Vec<(GgmlType, Vec<u8>, Vec<f32>)> {
    let u32_at = |o: usize| u32::from_le_bytes(data[o..o + 4].try_into().unwrap()) as usize;
    assert_eq!(&data[..4], b"DFQF");
    let count = u32_at(4);
    let mut o = 8;
    let mut out = Vec::new();
    for _ in 0..count {
        let ty = GgmlType::from_u32(u32_at(o) as u32).expect("known type");
        let (n, nb) = (u32_at(o + 4), u32_at(o + 8));
        o += 12;
        let bytes = data[o..o + nb].to_vec();
        o += nb;
        let exp = data[o..o + 4 * n]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        o += 4 * n;
        out.push((ty, bytes, exp));
    }
    assert_eq!(o, data.len(), "trailing bytes in fixture");
    out
}

pub(crate) fn check_fixture(data: &[u8]) -> usize {
    let recs = parse_fixture(data);
    for level in SimdLevel::available() {
        for (ty, bytes, exp) in &recs {
            let mut got = vec![0f32; exp.len()];
            dequantize_row_at(level, *ty, bytes, &mut got);
            for (i, (g, e)) in got.iter().zip(exp).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    e.to_bits(),
                    "{ty} {level:?} element {i}: {g} vs {e}"
                );
            }
        }
    }
    recs.len()
}

#[test]
fn fixture_matches_gguf_python_exactly() {
    let data = include_bytes!("testdata/quant_fixture.bin");
    let recs = parse_fixture(data);
    let count = |ty| recs.iter().filter(|r| r.0 == ty).count();
    // 1 random record per type, plus 2 real-tensor records for the types in gemma.gguf.
    for ty in SLOT_TYPES[..N_BASE]
        .iter()
        .copied()
        .filter(|&t| t != GgmlType::MXFP4)
    {
        let real = matches!(
            ty,
            GgmlType::F32 | GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::Q4_K | GgmlType::Q6_K
        );
        assert_eq!(count(ty), 1 + 2 * real as usize, "{ty}");
    }
    // A spot value decoded by hand: Q8_0 element 5 is d * q[5].
    let q8 = recs.iter().find(|r| r.0 == GgmlType::Q8_0).unwrap();
    let d = half::f16::from_le_bytes([q8.1[0], q8.1[1]]).to_f32();
    assert_eq!(q8.2[5], d * (q8.1[7] as i8 as f32));
    assert_eq!(check_fixture(data), 18);
}

/// Whole real tensors: run `tools/reference/quant_fixture.py --full GGUF FILE` and then
/// `DELTAFIN_QUANT_FULL=FILE cargo test --lib quant -- --ignored`.
#[test]
#[ignore = "needs DELTAFIN_QUANT_FULL from tools/reference/quant_fixture.py --full"]
fn full_tensors_match_gguf_python_exactly() {
    let path = std::env::var("DELTAFIN_QUANT_FULL").expect("DELTAFIN_QUANT_FULL");
    let data = std::fs::read(path).unwrap();
    assert!(check_fixture(&data) >= 4);
}

/// Exact f64 dot of the scalar dequantization, and `sum |w_i x_i|`.
fn reference(ty: GgmlType, row: &[u8], x: &[f32]) -> (f64, f64) {
    let mut w = vec![0f32; x.len()];
    dequantize_row_at(SimdLevel::Scalar, ty, row, &mut w);
    let dot = w.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum();
    let mag = w
        .iter()
        .zip(x)
        .map(|(&a, &b)| (a as f64 * b as f64).abs())
        .sum();
    (dot, mag)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn every_level_matches_scalar_reference(slot in 0usize..N_SLOTS, blocks in 1usize..6, seed: u64) {
        let ty = SLOT_TYPES[slot];
        let mut rng = Rng::new(seed);
        // Odd block counts; float rows get lengths that leave a tail after whole rounds.
        let blocks = if ty.block_elems() == 1 { 32 * blocks + 2 * blocks + 1 } else { 2 * blocks - 1 };
        let n = blocks * ty.block_elems();
        let row = random_row(ty, blocks, &mut rng);
        let x = random_x(n, &mut rng);
        let (exact, mag) = reference(ty, &row, &x);
        let mut scalar_w = vec![0f32; n];
        dequantize_row_at(SimdLevel::Scalar, ty, &row, &mut scalar_w);
        for level in SimdLevel::available() {
            let got = dot_row_at(level, ty, &row, &x) as f64;
            prop_assert!((got - exact).abs() <= 1e-5 * mag + 1e-30,
                "{ty} {level:?}: {got} vs {exact} (sum |wx| {mag})");
            let mut w = vec![0f32; n];
            dequantize_row_at(level, ty, &row, &mut w);
            for i in 0..n {
                prop_assert_eq!(w[i].to_bits(), scalar_w[i].to_bits(), "{} {:?} element {}", ty, level, i);
            }
            // The batch plan (f32 dot over the dequantized row, or the prepared block-scale
            // dot) is the fused dot, bit for bit.
            let again = match row_plan(level, ty) {
                RowPlan::Dequant(_, _) => dot_f32_at(level, &w, &x),
                RowPlan::Prepared(prep, dot) => {
                    let mut d = vec![0f32; blocks];
                    prep(&row, &mut w, &mut d);
                    dot(&w, &d, &x)
                }
            };
            prop_assert_eq!(again.to_bits(), (got as f32).to_bits());
        }
    }
}

/// A random packed FP8 row of `n` elements: random E4M3 bytes (NaN bytes replaced by ±448),
/// block scales of assorted magnitudes.
pub(crate) fn random_fp8_row(n: usize, rng: &mut Rng) -> Vec<u8> {
    let mut row = Vec::new();
    for b in 0..n.div_ceil(fp8::BLOCK) {
        let mag = [1e-6f32, 1e-3, 0.01, 0.5, 3.0][(rng.next_u64() % 5) as usize];
        row.extend_from_slice(&(rng.unit() * mag).to_le_bytes());
        for _ in 0..fp8::BLOCK.min(n - b * fp8::BLOCK) {
            let q = rng.next_u64() as u8;
            row.push(if q & 0x7f == 0x7f { q - 1 } else { q });
        }
    }
    row
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// FP8 rows of any length (partial last blocks, tails after whole rounds): every level's
    /// decode equals the scalar one bit for bit, its dot is close to the exact dot, and equals
    /// the level's f32 dot of the decoded row (what matmul computes) bit for bit (matvec and
    /// matmul against dot_row: `kernels::tests::fp8_matvec_and_matmul_equal_dot_row`).
    #[test]
    fn fp8_every_level_matches_scalar_reference(n in 1usize..700, seed: u64) {
        let ty = GgmlType::F8_E4M3_B128;
        let mut rng = Rng::new(seed);
        let row = random_fp8_row(n, &mut rng);
        prop_assert_eq!(Some(row.len()), ty.row_bytes(n));
        let x = random_x(n, &mut rng);
        let (exact, mag) = reference(ty, &row, &x);
        let mut scalar_w = vec![0f32; n];
        dequantize_row_at(SimdLevel::Scalar, ty, &row, &mut scalar_w);
        for level in SimdLevel::available() {
            let got = dot_row_at(level, ty, &row, &x);
            prop_assert!((got as f64 - exact).abs() <= 1e-5 * mag + 1e-30,
                "{level:?}: {got} vs {exact} (sum |wx| {mag})");
            let mut w = vec![0f32; n];
            dequantize_row_at(level, ty, &row, &mut w);
            for i in 0..n {
                prop_assert_eq!(w[i].to_bits(), scalar_w[i].to_bits(), "{:?} element {}", level, i);
            }
            prop_assert_eq!(dot_f32_at(level, &w, &x).to_bits(), got.to_bits());
        }
    }
}

#[test]
fn fp8_nan_bytes_decode_to_nan_at_every_level() {
    // one block of 40: a NaN of each sign among finite values
    let mut row = 2.0f32.to_le_bytes().to_vec();
    row.extend((0..40u8).map(|i| match i {
        3 => 0x7f,
        17 => 0xff,
        _ => i,
    }));
    for level in SimdLevel::available() {
        let mut w = vec![0f32; 40];
        dequantize_row_at(level, GgmlType::F8_E4M3_B128, &row, &mut w);
        assert!(w[3].is_nan() && w[17].is_nan(), "{level:?}");
        assert_eq!(w[8], 2.0 * fp8::e4m3_to_f32(8), "{level:?}");
        assert!(w
            .iter()
            .enumerate()
            .all(|(i, v)| i == 3 || i == 17 || v.is_finite()));
    }
}

/// The GFNI nibble decoders give the same dots as the plain AVX-512 ones, and the level's
/// Q8_0 / Q4_0 / Q5_0 dots are `dot_f32` over the dequantized row (no prepared rows).
#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_gfni_equals_plain() {
    use super::x86::avx512;
    if !SimdLevel::Avx512.is_available() || !is_x86_feature_detected!("gfni") {
        return;
    }
    let (plain, gfni) = (&avx512::KERNELS, &avx512::KERNELS_GFNI);
    let mut rng = Rng::new(5);
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q6_K,
    ] {
        let s = slot(ty).unwrap();
        let blocks = 37;
        let row = random_row(ty, blocks, &mut rng);
        let x = random_x(ty.block_elems() * blocks, &mut rng);
        let (a, b) = ((plain.dot[s])(&row, &x), (gfni.dot[s])(&row, &x));
        assert_eq!(a.to_bits(), b.to_bits(), "{ty}");
        let mut w = vec![0f32; x.len()];
        (plain.deq[s])(&row, &mut w);
        assert_eq!(a.to_bits(), (plain.dot_f32)(&w, &x).to_bits(), "{ty}");
        assert!(plain.prep[s].is_none() && gfni.prep[s].is_none(), "{ty}");
        assert!(
            w.iter().any(|&v| v < 0.0) && w.iter().any(|&v| v > 0.0),
            "{ty}"
        );
    }
}

#[test]
fn length_mismatch_panics_with_message() {
    let r = std::panic::catch_unwind(|| dot_row(GgmlType::Q8_0, &[0u8; 34], &[0f32; 64]));
    let msg = *r.unwrap_err().downcast::<String>().unwrap();
    assert_eq!(msg, "row length mismatch: 34 bytes for 64 elements");
}

#[test]
fn known_q4_0_dot() {
    // d = 0.5, nibbles: byte j = (j % 16) | (15 - j % 16) << 4.
    let mut row = half::f16::from_f32(0.5).to_le_bytes().to_vec();
    row.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let x: Vec<f32> = (0..32).map(|i| i as f32).collect();
    // w[j] = 0.5 (j - 8), w[j + 16] = 0.5 (7 - j), j < 16.
    let want: f32 = (0..16)
        .map(|j| 0.5 * (j as f32 - 8.0) * j as f32 + 0.5 * (7.0 - j as f32) * (j + 16) as f32)
        .sum();
    assert_eq!(want, -124.0);
    for level in SimdLevel::available() {
        assert_eq!(
            dot_row_at(level, GgmlType::Q4_0, &row, &x),
            -124.0,
            "{level:?}"
        );
    }
}

#[test]
fn f16_conversion_is_exact_for_every_bit_pattern() {
    let mut nans = 0;
    for h in 0..=u16::MAX {
        let got = scalar::f16_to_f32(h);
        let want = half::f16::from_bits(h).to_f32();
        if want.is_nan() {
            assert!(got.is_nan(), "{h:#06x}");
            nans += 1;
        } else {
            assert_eq!(got.to_bits(), want.to_bits(), "{h:#06x}");
        }
    }
    assert_eq!(nans, 2 * 1023);
}

/// The 32-value block types with every f16 scale bit pattern (subnormals, infinities, quiet
/// and signaling NaNs): every level decodes them as the scalar decoder, bit for bit (the
/// AVX-512 decoders convert the scale in the vector unit, `x86::common::f16v`).
#[test]
fn every_f16_scale_decodes_as_scalar_at_every_level() {
    let mut rng = Rng::new(5);
    for ty in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q5_0] {
        let blocks = 1024;
        let mut row = random_row(ty, blocks, &mut rng);
        let bb = ty.block_bytes();
        let mut want = vec![0f32; 32 * blocks];
        let mut got = vec![0f32; 32 * blocks];
        for chunk in 0..64u16 {
            for b in 0..blocks {
                let h = chunk * 1024 + b as u16;
                row[b * bb..b * bb + 2].copy_from_slice(&h.to_le_bytes());
            }
            dequantize_row_at(SimdLevel::Scalar, ty, &row, &mut want);
            for level in SimdLevel::available() {
                dequantize_row_at(level, ty, &row, &mut got);
                for i in 0..want.len() {
                    assert_eq!(
                        got[i].to_bits(),
                        want[i].to_bits(),
                        "{ty} {level:?} scale {:#06x} element {}",
                        chunk * 1024 + (i / 32) as u16,
                        i % 32
                    );
                }
            }
        }
    }
}

/// MXFP4 blocks with every E8M0 scale byte (subnormal, normal and 255) decode exactly as
/// `gguf.quants.dequantize` (`tools/reference/quant_fixture.py --mxfp4`).
#[test]
fn mxfp4_fixture_matches_gguf_python_exactly() {
    let data = include_bytes!("testdata/mxfp4_fixture.bin");
    let recs = parse_fixture(data);
    assert_eq!(recs.len(), 1);
    let (ty, bytes, exp) = &recs[0];
    assert_eq!((*ty, exp.len()), (GgmlType::MXFP4, 256 * 32));
    let scales: std::collections::BTreeSet<u8> = bytes.chunks_exact(17).map(|b| b[0]).collect();
    assert_eq!(scales.len(), 256, "every scale byte appears");
    assert_eq!(check_fixture(data), 1);
}

#[test]
fn known_mxfp4_values() {
    // scale byte 127 (2^0): nibble j of byte j in the low half, 15 - j in the high half
    let mut row = vec![127u8];
    row.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let e2m1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let want: Vec<f32> = (0..32)
        .map(|i| {
            let q = if i < 16 { i } else { 31 - i };
            let m = e2m1[q & 7];
            if q >= 8 {
                -m
            } else {
                m
            }
        })
        .collect();
    let x: Vec<f32> = (0..32).map(|i| i as f32).collect();
    let dot: f32 = want.iter().zip(&x).map(|(a, b)| a * b).sum();
    for level in SimdLevel::available() {
        let mut got = vec![0f32; 32];
        dequantize_row_at(level, GgmlType::MXFP4, &row, &mut got);
        assert_eq!(got, want, "{level:?}");
        assert_eq!(
            dot_row_at(level, GgmlType::MXFP4, &row, &x),
            dot,
            "{level:?}"
        );
    }
    // scale byte 0 is 2^-127: value 6 (nibble 7) becomes 6 * 2^-127, a normal f32;
    // scale byte 1: 0.5 (nibble 1) * 2^-126 = 2^-127, subnormal
    for (e, nib, want) in [(0u8, 7u8, 6.0 * 2f32.powi(-127)), (1, 1, 2f32.powi(-127))] {
        let mut row = vec![e];
        row.extend([nib; 16]);
        let mut got = vec![0f32; 32];
        dequantize_row(GgmlType::MXFP4, &row, &mut got);
        assert_eq!(got[0].to_bits(), want.to_bits(), "e = {e}");
    }
}

/// Level names round-trip; an unknown name is refused with the list; the detected level is
/// one this CPU runs, and no higher than `DELTAFIN_SIMD` when the suite runs under a cap.
#[test]
fn simd_level_names_and_cap() {
    for l in [
        SimdLevel::Scalar,
        SimdLevel::Neon,
        SimdLevel::Avx2,
        SimdLevel::Avx512,
    ] {
        assert_eq!(SimdLevel::parse(l.name()), Ok(l));
    }
    assert_eq!(
        SimdLevel::parse("sse4"),
        Err("unknown SIMD level 'sse4' (expected scalar, neon, avx2 or avx512)".to_string())
    );
    let level = SimdLevel::detect();
    assert!(level.is_available());
    if let Ok(cap) = std::env::var(SIMD_CAP_VAR) {
        assert!(
            level <= SimdLevel::parse(&cap).unwrap(),
            "{level:?} above {cap}"
        );
    }
}
