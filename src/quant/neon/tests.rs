//! Tests of the NEON level's in-register decoders against the scalar-decode path: every
//! slot's dot equals `dot_decoded::<Neon8>` over the scalar decoders (the level's order)
//! bit for bit, and its dequantization equals the scalar decoders bit for bit, on random
//! rows and on the low-bit edge blocks (every scale byte, grid index and sign pattern,
//! `testdata/lowbit_edges.bin`). `quant::tests` and `quant::tests_lowbit` check the same
//! level against gguf-py's values and the exact dot.

use super::{Neon8, KERNELS};
use crate::quant::scalar::dot_decoded;
use crate::quant::tests::{random_row, random_x, Rng};
use crate::quant::{slot, GgmlType, EXT_TYPES, N_SLOTS, SCALAR_DECODE, SLOT_TYPES};

/// The scalar-decode dot of slot `s` in the NEON order.
fn generic_dot(s: usize, row: &[u8], x: &[f32]) -> f32 {
    let ty = SLOT_TYPES[s];
    dot_decoded::<Neon8>(row, x, ty.block_bytes(), ty.block_elems(), SCALAR_DECODE[s])
}

/// Asserts the NEON kernels of slot `s` on `row` against the scalar decoders and the
/// scalar-decode dot; returns the dot.
fn check(s: usize, row: &[u8], x: &[f32]) -> f32 {
    let ty = SLOT_TYPES[s];
    let n = x.len();
    let mut want = vec![0f32; n];
    SCALAR_DECODE[s](row, &mut want);
    let mut got = vec![f32::NAN; n];
    (KERNELS.deq[s])(row, &mut got);
    for i in 0..n {
        assert_eq!(got[i].to_bits(), want[i].to_bits(), "{ty} element {i}");
    }
    let dot = (KERNELS.dot[s])(row, x);
    assert_eq!(dot.to_bits(), generic_dot(s, row, x).to_bits(), "{ty} dot");
    dot
}

#[test]
fn every_slot_equals_scalar_decode_path_on_random_rows() {
    let mut rng = Rng::new(0x4E45_4F4E);
    for s in 0..N_SLOTS {
        let ty = SLOT_TYPES[s];
        for blocks in [1usize, 2, 3, 8] {
            // float rows: whole rounds plus a tail
            let blocks = if ty.block_elems() == 1 {
                32 * blocks + 5
            } else {
                blocks
            };
            for _ in 0..4 {
                let row = random_row(ty, blocks, &mut rng);
                let x = random_x(blocks * ty.block_elems(), &mut rng);
                let dot = check(s, &row, &x);
                assert!(dot.is_finite(), "{ty}");
            }
        }
    }
}

#[test]
fn low_bit_edge_blocks_equal_scalar_decode_path() {
    let data = include_bytes!("../testdata/lowbit_edges.bin");
    let u32_at = |o: usize| u32::from_le_bytes(data[o..o + 4].try_into().unwrap()) as usize;
    assert_eq!(&data[..4], b"DFQE");
    let mut o = 8;
    let mut seen = Vec::new();
    for _ in 0..u32_at(4) {
        let ty = GgmlType::from_u32(u32_at(o) as u32).unwrap();
        let (n, nb) = (u32_at(o + 4), u32_at(o + 8));
        let row = &data[o + 12..o + 12 + nb];
        o += 20 + nb;
        let x = random_x(n, &mut Rng::new(n as u64 ^ 0xE));
        check(slot(ty).unwrap(), row, &x);
        seen.push(ty);
    }
    assert_eq!(o, data.len());
    assert_eq!(seen, EXT_TYPES.to_vec());
}

/// Known values through the in-register decoders: Q4_1 `d = 0.5, m = 1`, byte 0xA3 gives
/// 2.5 (low nibble 3) and 6 (high nibble 10); TQ1_0 byte 0 is digits 0 → all −1 times d.
#[test]
fn known_values_in_registers() {
    let half_ = half::f16::from_f32(0.5).to_le_bytes();
    let one = half::f16::from_f32(1.0).to_le_bytes();
    let mut b = [half_, one].concat();
    b.extend([0xA3u8; 16]);
    let mut y = [0f32; 32];
    (KERNELS.deq[slot(GgmlType::Q4_1).unwrap()])(&b, &mut y);
    assert_eq!((y[0], y[15], y[16], y[31]), (2.5, 2.5, 6.0, 6.0));
    let x: Vec<f32> = (0..32).map(|i| i as f32).collect();
    // 2.5 * (0 + .. + 15) + 6 * (16 + .. + 31) = 300 + 2256
    assert_eq!((KERNELS.dot[slot(GgmlType::Q4_1).unwrap()])(&b, &x), 2556.0);
    let mut b = vec![0u8; 52];
    b.extend(half_);
    let mut y = [0f32; 256];
    (KERNELS.deq[slot(GgmlType::TQ1_0).unwrap()])(&b, &mut y);
    assert!(y.iter().all(|&v| v == -0.5));
}

#[test]
#[should_panic(expected = "row length mismatch")]
fn in_register_length_mismatch_panics() {
    let mut y = [0f32; 256];
    (KERNELS.deq[slot(GgmlType::Q2_K).unwrap()])(&[0u8; 83], &mut y);
}
