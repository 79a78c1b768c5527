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
    for ((b, &e), o) in blocks
        .chunks_exact(16)
        .zip(scales)
        .zip(out.chunks_exact_mut(17))
    {
        o[0] = e;
        // element i of the group is nibble (i & 1) of byte i / 2
        let nib = |i: usize| (b[i >> 1] >> ((i & 1) * 4)) & 15;
        for j in 0..16 {
            o[1 + j] = nib(j) | (nib(j + 16) << 4);
        }
    }
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
}
