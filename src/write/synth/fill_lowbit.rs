//! Random blocks of the low-bit GGML types (`quant::EXT_TYPES`) for synthetic GGUF files:
//! random quants, sub-block scales and grid indices, and f16 block scales chosen so values
//! span about `±scale` (ggml `ggml-common.h` layouts; the formulas are those of
//! `quant::scalar_k` / `quant::scalar_iq`).

use super::fill::{bytes, Rng};
use crate::quant::GgmlType;

/// Where a block's f16 scales sit and their values per unit of `scale`: `(offset, factor)`,
/// the value written being `±scale · factor` (one random sign per block). The factor makes
/// the largest decodable magnitude about `scale`; a second field (a minimum) is chosen so
/// the block's values average zero over random quants:
///
/// - Q4_1 / Q5_1 (`d·q + m`, q < 16 / 32): `d = scale/7.5`, `m = −7.5·d` (resp. 15.5);
/// - Q2_K (`d·sc·q − dmin·m`, sc, m < 16, q < 4): `d = scale/45`, `dmin = 1.5·d`;
/// - Q3_K (`d·(sc − 32)·q`, q in −4..4): `d = scale/128`;
/// - Q5_K (`d·sc·q − dmin·m`, sc, m < 64, q < 32): `d = scale/1953`, `dmin = 15.5·d`;
/// - IQ1_S / IQ1_M (`d·(2s + 1)·(g ± 1/8)`, s < 8, |g| ≤ 1): `d = scale/16.875`;
/// - IQ2_XXS / IQ2_XS / IQ2_S (`d·(s + ½)/4·g`, s < 16, g ≤ 43): `d = scale/166.625`;
/// - IQ3_XXS (`d·(s + ½)/2·g`, g ≤ 62): `d = scale/480.5`; IQ3_S (`d·(2s + 1)·g`, g ≤ 15):
///   `d = scale/465`;
/// - IQ4_NL (`d·v`, |v| ≤ 127): `d = scale/127`; IQ4_XS (`d·(ls − 32)·v`): `d = scale/4064`;
/// - TQ1_0 (`d·t`, t in −1..=1): `d = scale`; TQ2_0 (`d·(q − 1)`, q < 4): `d = scale/2`.
fn scale_fields(ty: GgmlType) -> &'static [(usize, f32)] {
    match ty {
        GgmlType::Q4_1 => &[(0, 1.0 / 7.5), (2, -1.0)],
        GgmlType::Q5_1 => &[(0, 1.0 / 15.5), (2, -1.0)],
        GgmlType::Q2_K => &[(80, 1.0 / 45.0), (82, 1.5 / 45.0)],
        GgmlType::Q3_K => &[(108, 1.0 / 128.0)],
        GgmlType::Q5_K => &[(0, 1.0 / 1953.0), (2, 15.5 / 1953.0)],
        GgmlType::IQ1_S | GgmlType::IQ1_M => &[(0, 1.0 / 16.875)],
        GgmlType::IQ2_XXS | GgmlType::IQ2_XS | GgmlType::IQ2_S => &[(0, 1.0 / 166.625)],
        GgmlType::IQ3_XXS => &[(0, 1.0 / 480.5)],
        GgmlType::IQ3_S => &[(0, 1.0 / 465.0)],
        GgmlType::IQ4_NL => &[(0, 1.0 / 127.0)],
        GgmlType::IQ4_XS => &[(0, 1.0 / 4064.0)],
        GgmlType::TQ1_0 => &[(52, 1.0)],
        GgmlType::TQ2_0 => &[(64, 0.5)],
        _ => unreachable!("not a low-bit type: {ty}"),
    }
}

/// Fills `out` (whole blocks of `ty`, one of `quant::EXT_TYPES`) with random blocks whose
/// values span about `±scale`, each block's scales with a random sign ([`scale_fields`]).
/// IQ1_M's f16 scale is stored in the top nibbles of its last four u16s. Panics on another
/// type.
pub(crate) fn lowbit_blocks(rng: &mut Rng, ty: GgmlType, scale: f32, out: &mut [u8]) {
    let fields = scale_fields(ty);
    bytes(rng, out);
    let mut signs = 0u64;
    for (i, b) in out.chunks_mut(ty.block_bytes()).enumerate() {
        if i % 64 == 0 {
            signs = rng.next();
        }
        let sign = if (signs >> (i % 64)) & 1 == 1 {
            -1.0
        } else {
            1.0
        };
        let d = sign * scale * fields[0].1;
        for &(o, f) in fields {
            // a negative factor is a minimum of `f · (q range / 2) · d` (Q4_1, Q5_1)
            let v = match (ty, f < 0.0) {
                (GgmlType::Q4_1, true) => -7.5 * d,
                (GgmlType::Q5_1, true) => -15.5 * d,
                _ => sign * scale * f,
            };
            if ty == GgmlType::IQ1_M {
                let h = half::f16::from_f32(v).to_bits();
                for k in 0..4 {
                    let w = &mut b[48 + 2 * k..50 + 2 * k];
                    let u = u16::from_le_bytes([w[0], w[1]]) & 0x0FFF;
                    w.copy_from_slice(&(u | ((h >> (4 * k)) & 15) << 12).to_le_bytes());
                }
            } else {
                b[o..o + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::EXT_TYPES;

    #[test]
    fn lowbit_blocks_decode_to_values_of_the_requested_span() {
        for ty in EXT_TYPES {
            let n = 256 * 64;
            let mut b = vec![0u8; ty.row_bytes(n).unwrap()];
            lowbit_blocks(&mut Rng::seeded(1), ty, 0.5, &mut b);
            let mut y = vec![0f32; n];
            crate::quant::dequantize_row(ty, &b, &mut y);
            let max = y.iter().fold(0f32, |m, v| m.max(v.abs()));
            let mean = y.iter().sum::<f32>() / n as f32;
            assert!(y.iter().all(|v| v.is_finite()), "{ty}");
            assert!((0.2..=1.01).contains(&max), "{ty}: max {max}");
            assert!(mean.abs() < 0.02, "{ty}: mean {mean}");
        }
    }
}
