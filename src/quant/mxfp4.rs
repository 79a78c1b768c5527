//! MXFP4 as Hugging Face stores GPT-OSS experts, repacked into the GGML block layout.
//!
//! Hugging Face (`transformers/integrations/mxfp4.py`, OCP Microscaling Formats v1.0): a
//! matrix of `R` rows × `32 G` columns is two tensors, `*_blocks` (`[R, G, 16]` bytes) and
//! `*_scales` (`[R, G]` E8M0 bytes); element `32 g + 2 j` of a row is the low nibble of byte
//! `j` of group `g`, element `32 g + 2 j + 1` the high nibble. GGML `MXFP4` (type 39) keeps
//! the scale and the 16 nibble bytes of a block together (17 bytes) with element `j < 16` in
//! the low nibble of byte `j` and element `j + 16` in its high nibble. Both decode a nibble
//! through the same E2M1 table and scale by `2^(e − 127)`, so the repacked block decodes to
//! the same values ([`super::dequantize_row`]), with one difference: nibble 8 (−0) decodes
//! to +0 in GGML.

/// Repacks `n` Hugging Face MXFP4 groups, `blocks` (`16 n` bytes) and `scales` (`n` bytes),
/// into `n` GGML MXFP4 blocks in `out` (`17 n` bytes), in the same (row, group) order.
/// Panics on a length mismatch.
pub fn repack_hf_mxfp4(blocks: &[u8], scales: &[u8], out: &mut [u8]) {
    let n = scales.len();
    assert!(
        blocks.len() == 16 * n && out.len() == 17 * n,
        "MXFP4 repack: {} block bytes, {n} scales, {} output bytes",
        blocks.len(),
        out.len()
    );
    // a routed expert of a large model is millions of groups: split them over the threads
    const PER_TASK: usize = 1 << 16;
    if n > PER_TASK {
        use rayon::prelude::*;
        blocks
            .par_chunks(16 * PER_TASK)
            .zip(scales.par_chunks(PER_TASK))
            .zip(out.par_chunks_mut(17 * PER_TASK))
            .for_each(|((b, e), o)| repack_groups(b, e, o));
    } else {
        repack_groups(blocks, scales, out);
    }
}

/// [`repack_hf_mxfp4`] on one thread: SSE2 (the x86-64 baseline), else [`repack_groups_scalar`].
fn repack_groups(blocks: &[u8], scales: &[u8], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        repack_groups_sse2(blocks, scales, out)
    }
    #[cfg(not(target_arch = "x86_64"))]
    repack_groups_scalar(blocks, scales, out)
}

/// [`repack_groups_scalar`] sixteen bytes at a time: the "even" and "odd" bytes below as two
/// vectors, interleaved by `unpacklo`.
#[cfg(target_arch = "x86_64")]
fn repack_groups_sse2(blocks: &[u8], scales: &[u8], out: &mut [u8]) {
    use std::arch::x86_64::*;
    for ((b, &e), o) in blocks
        .chunks_exact(16)
        .zip(scales)
        .zip(out.chunks_exact_mut(17))
    {
        o[0] = e;
        // SAFETY: SSE2 is part of the x86-64 baseline; the load reads the 16 bytes of `b`
        // and the store writes `o[1..17]`, both unaligned accesses inside their slices.
        unsafe {
            let v = _mm_loadu_si128(b.as_ptr() as *const __m128i);
            let hi = _mm_srli_si128::<8>(v);
            let m = _mm_set1_epi8(0x0F);
            let even = _mm_or_si128(
                _mm_and_si128(v, m),
                _mm_slli_epi16::<4>(_mm_and_si128(hi, m)),
            );
            let odd = _mm_or_si128(
                _mm_and_si128(_mm_srli_epi16::<4>(v), m),
                _mm_andnot_si128(m, hi),
            );
            _mm_storeu_si128(
                o[1..].as_mut_ptr() as *mut __m128i,
                _mm_unpacklo_epi8(even, odd),
            );
        }
    }
}

/// [`repack_hf_mxfp4`] on one thread, portable.
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn repack_groups_scalar(blocks: &[u8], scales: &[u8], out: &mut [u8]) {
    const LO: u64 = 0x0F0F_0F0F_0F0F_0F0F;
    for ((b, &e), o) in blocks
        .chunks_exact(16)
        .zip(scales)
        .zip(out.chunks_exact_mut(17))
    {
        o[0] = e;
        // byte i of the group holds elements 2i (low nibble) and 2i + 1 (high); GGML byte j
        // holds element j (low) and j + 16 (high): GGML byte 2i = lo(b[i]) | lo(b[8 + i]) << 4
        // ("even"), byte 2i + 1 = hi(b[i]) | hi(b[8 + i]) << 4 ("odd"), eight bytes at a time
        let lo = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
        let hi = u64::from_le_bytes(b[8..].try_into().expect("8 bytes"));
        let even = (lo & LO) | ((hi & LO) << 4);
        let odd = ((lo >> 4) & LO) | (hi & !LO);
        let v = spread_bytes(even) | (spread_bytes(odd) << 8);
        o[1..].copy_from_slice(&v.to_le_bytes());
    }
}

/// Byte `i` of `x` moved to byte `2i` of the result (the odd bytes zero).
fn spread_bytes(x: u64) -> u128 {
    let mut v = x as u128;
    v = (v | (v << 32)) & 0x0000_0000_FFFF_FFFF_0000_0000_FFFF_FFFF;
    v = (v | (v << 16)) & 0x0000_FFFF_0000_FFFF_0000_FFFF_0000_FFFF;
    (v | (v << 8)) & 0x00FF_00FF_00FF_00FF_00FF_00FF_00FF_00FF
}

#[cfg(test)]
mod tests {
    use super::super::tests::Rng;
    use super::super::{dequantize_row, GgmlType};
    use super::*;

    /// The Hugging Face formula (`tools/reference/hf_fixtures.py`, `mxfp4_dequantize`).
    fn hf_value(blocks: &[u8], scales: &[u8], g: usize, i: usize) -> f32 {
        const E2M1: [f32; 16] = [
            0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
        ];
        let byte = blocks[16 * g + i / 2];
        let n = if i.is_multiple_of(2) {
            byte & 15
        } else {
            byte >> 4
        };
        E2M1[n as usize] * 2f32.powi(scales[g] as i32 - 127)
    }

    #[test]
    fn repacked_blocks_decode_to_the_hf_values() {
        let mut rng = Rng::new(7);
        let n = 64;
        let blocks: Vec<u8> = (0..16 * n).map(|_| rng.next_u64() as u8).collect();
        let scales: Vec<u8> = (0..n).map(|_| 100 + (rng.next_u64() % 50) as u8).collect();
        let mut packed = vec![0u8; 17 * n];
        repack_hf_mxfp4(&blocks, &scales, &mut packed);
        let mut got = vec![0f32; 32 * n];
        dequantize_row(GgmlType::MXFP4, &packed, &mut got);
        for g in 0..n {
            for i in 0..32 {
                let want = hf_value(&blocks, &scales, g, i);
                // -0 (nibble 8) decodes as +0 in GGML; equal as numbers
                assert_eq!(got[32 * g + i], want, "group {g} element {i}");
            }
        }
    }

    #[test]
    fn split_repack_of_many_groups_equals_the_nibble_definition() {
        // more groups than one task takes, not a multiple of it: the threaded path
        let mut rng = Rng::new(11);
        let n = 3 * (1 << 16) + 5;
        let blocks: Vec<u8> = (0..16 * n).map(|_| rng.next_u64() as u8).collect();
        let scales: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
        let mut got = vec![0u8; 17 * n];
        repack_hf_mxfp4(&blocks, &scales, &mut got);
        let mut portable = vec![0u8; 17 * n];
        repack_groups_scalar(&blocks, &scales, &mut portable);
        assert!(portable == got, "the portable repack differs");
        for g in 0..n {
            let b = &blocks[16 * g..16 * g + 16];
            let nib = |i: usize| (b[i >> 1] >> ((i & 1) * 4)) & 15;
            let o = &got[17 * g..17 * g + 17];
            assert_eq!(o[0], scales[g], "group {g} scale");
            for j in 0..16 {
                assert_eq!(o[1 + j], nib(j) | (nib(j + 16) << 4), "group {g} byte {j}");
            }
        }
    }
}
