//! Tests of the low-bit types ([`EXT_TYPES`]): dequantization bit-exact against `gguf`
//! (gguf-py) on random blocks and on blocks covering every scale byte, grid index and sign
//! pattern (`tools/reference/lowbit_fixture.py`), hand-decoded values, and the SIMD levels'
//! dots and dequantization against the scalar reference (also covered for every slot by
//! `tests::every_level_matches_scalar_reference`).

use super::tests::{check_fixture, parse_fixture, random_row, random_x, Rng};
use super::*;
use proptest::prelude::*;

/// 64-bit FNV-1a of the little-endian bytes of `v`.
fn fnv1a(v: &[f32]) -> u64 {
    let mut h = 0xCBF2_9CE4_8422_2325u64;
    for b in v.iter().flat_map(|x| x.to_le_bytes()) {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01B3);
    }
    h
}

#[test]
fn random_blocks_match_gguf_python_exactly() {
    let data = include_bytes!("testdata/lowbit_fixture.bin");
    let recs = parse_fixture(data);
    let types: Vec<GgmlType> = recs.iter().map(|r| r.0).collect();
    assert_eq!(types, EXT_TYPES.to_vec());
    for (ty, bytes, exp) in &recs {
        assert_eq!(exp.len(), 256, "{ty}");
        assert_eq!(bytes.len(), ty.row_bytes(256).unwrap(), "{ty}");
        assert!(exp.iter().all(|v| v.is_finite()), "{ty}");
        assert!(exp.iter().any(|&v| v != 0.0), "{ty}");
    }
    assert_eq!(check_fixture(data), 16);
}

#[test]
fn edge_blocks_match_gguf_python_exactly() {
    let data = include_bytes!("testdata/lowbit_edges.bin");
    let u32_at = |o: usize| u32::from_le_bytes(data[o..o + 4].try_into().unwrap()) as usize;
    assert_eq!(&data[..4], b"DFQE");
    assert_eq!(u32_at(4), EXT_TYPES.len());
    let mut o = 8;
    for &want_ty in &EXT_TYPES {
        let ty = GgmlType::from_u32(u32_at(o) as u32).unwrap();
        assert_eq!(ty, want_ty);
        let (n, nb) = (u32_at(o + 4), u32_at(o + 8));
        let bytes = &data[o + 12..o + 12 + nb];
        let hash = u64::from_le_bytes(data[o + 12 + nb..o + 20 + nb].try_into().unwrap());
        o += 20 + nb;
        assert_eq!(ty.row_bytes(n), Some(nb), "{ty}");
        let x = random_x(n, &mut Rng::new(n as u64));
        for level in SimdLevel::available() {
            let mut got = vec![0f32; n];
            dequantize_row_at(level, ty, bytes, &mut got);
            assert_eq!(fnv1a(&got), hash, "{ty} at {level:?}");
            // the fused dot over every scale byte, grid index and sign pattern equals the
            // level's f32 dot of the dequantized row (what matmul's scratch row gives)
            let dot = dot_row_at(level, ty, bytes, &x);
            let want = dot_f32_at(level, &got, &x);
            assert_eq!(dot.to_bits(), want.to_bits(), "{ty} dot at {level:?}");
            let mag: f64 = got
                .iter()
                .zip(&x)
                .map(|(&a, &b)| (a as f64 * b as f64).abs())
                .sum();
            let exact: f64 = got.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
            assert!(
                (dot as f64 - exact).abs() <= 1e-5 * mag,
                "{ty} at {level:?}"
            );
        }
    }
    assert_eq!(o, data.len());
}

/// Values decoded by hand from the format definitions (ggml `ggml-common.h`).
#[test]
fn known_values() {
    let one = half::f16::from_f32(1.0).to_le_bytes();
    let half_ = half::f16::from_f32(0.5).to_le_bytes();
    let dec = |ty: GgmlType, b: &[u8]| {
        let mut y = vec![0f32; ty.block_elems()];
        dequantize_row(ty, b, &mut y);
        y
    };
    // Q4_1: d = 0.5, m = 1: element 0 = low nibble 3 -> 2.5, element 16 = high nibble 10 -> 6
    let mut b = [half_, one].concat();
    b.extend([0xA3u8; 16]);
    let y = dec(GgmlType::Q4_1, &b);
    assert_eq!((y[0], y[16]), (2.5, 6.0));
    // Q2_K: scale byte 0x21 (sc 1, m 2), d = 1, dmin = 0.5; q = 3 -> 1*3 - 0.5*2 = 2
    let mut b = vec![0x21u8; 16];
    b.extend([0xFFu8; 64]);
    b.extend([one, half_].concat());
    let y = dec(GgmlType::Q2_K, &b);
    assert_eq!(y[0], 2.0);
    // Q3_K: all scale bits zero -> sc = -32; q = 3 - 4 (hmask bit clear) = -1 -> 32
    let mut b = vec![0u8; 32];
    b.extend([0xFFu8; 64]);
    b.extend([0u8; 12]);
    b.extend(one);
    assert!(dec(GgmlType::Q3_K, &b).iter().all(|&v| v == 32.0));
    // IQ4_NL: d = 1, nibbles 0 and 15 -> -127 and 113
    let mut b = one.to_vec();
    b.extend([0xF0u8; 16]);
    let y = dec(GgmlType::IQ4_NL, &b);
    assert_eq!((y[0], y[16]), (-127.0, 113.0));
    // TQ2_0: bytes 0b11_10_01_00, d = 1 -> element 0 = -1, 32 = 0, 64 = 1, 96 = 2
    let mut b = vec![0b1110_0100u8; 64];
    b.extend(one);
    let y = dec(GgmlType::TQ2_0, &b);
    assert_eq!((y[0], y[32], y[64], y[96]), (-1.0, 0.0, 1.0, 2.0));
    // IQ2_XXS: grid point 0 is all 8s; scale nibble 0: db = 1 * 0.5 * 0.25 = 0.125;
    // sign index 1 is 0b1000_0001 (elements 0 and 7 negative)
    let mut b = one.to_vec();
    for _ in 0..8 {
        b.extend(0u32.to_le_bytes());
        b.extend(1u32.to_le_bytes());
    }
    let y = dec(GgmlType::IQ2_XXS, &b);
    assert_eq!(&y[..8], &[-1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, -1.0]);
    // IQ1_S: grid point 0 is all -1; qh = 0 -> dl = d, delta = +0.125 -> -0.875
    let mut b = one.to_vec();
    b.extend([0u8; 48]);
    assert!(dec(GgmlType::IQ1_S, &b).iter().all(|&v| v == -0.875));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Every level's dot of a low-bit row equals its f32 dot of the dequantized row bit for
    /// bit (what matvec / matmul compute) and is close to the exact dot; every level's
    /// dequantization equals the scalar one.
    #[test]
    fn lowbit_levels_match_scalar(i in 0usize..N_EXT, blocks in 1usize..5, seed: u64) {
        let ty = EXT_TYPES[i];
        let mut rng = Rng::new(seed);
        let n = blocks * ty.block_elems();
        let row = random_row(ty, blocks, &mut rng);
        let x = random_x(n, &mut rng);
        let mut w0 = vec![0f32; n];
        dequantize_row_at(SimdLevel::Scalar, ty, &row, &mut w0);
        let exact: f64 = w0.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
        let mag: f64 = w0.iter().zip(&x).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
        for level in SimdLevel::available() {
            let mut w = vec![0f32; n];
            dequantize_row_at(level, ty, &row, &mut w);
            prop_assert!(w.iter().zip(&w0).all(|(a, b)| a.to_bits() == b.to_bits()), "{} {:?}", ty, level);
            let got = dot_row_at(level, ty, &row, &x);
            prop_assert_eq!(got.to_bits(), dot_f32_at(level, &w, &x).to_bits(), "{} {:?}", ty, level);
            prop_assert!((got as f64 - exact).abs() <= 1e-5 * mag + 1e-30, "{} {:?}: {} vs {}", ty, level, got, exact);
        }
    }
}
