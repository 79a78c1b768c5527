//! The FP8 E4M3 format and the `F8_E4M3_B128` row layout (described in [`super`]): block
//! size, row sizes and the exact E4M3 → f32 decoding, shared by the FP8 dispatch and the SIMD
//! kernels. A leaf: it imports no kernel.

/// Weights per block (and per scale along a row).
pub const BLOCK: usize = 128;

/// Bytes of a row of `n` elements in
/// [`GgmlType::F8_E4M3_B128`](crate::quant::GgmlType::F8_E4M3_B128): `n + 4 · ceil(n / 128)`.
pub fn row_bytes(n: usize) -> Option<usize> {
    n.div_ceil(BLOCK).checked_mul(4)?.checked_add(n)
}

/// The f32 bit pattern of every E4M3 byte (NaN as the quiet NaN with the byte's sign).
const fn e4m3_bits(b: u8) -> u32 {
    let sign = ((b & 0x80) as u32) << 24;
    let exp = ((b >> 3) & 15) as u32;
    let man = (b & 7) as u32;
    if exp == 15 && man == 7 {
        return sign | 0x7FC0_0000;
    }
    if exp == 0 {
        if man == 0 {
            return sign;
        }
        // m · 2^-9 = 1.xx · 2^(-9 + p) with p the position of the leading bit
        let p = 31 - man.leading_zeros(); // 0..=2
        let frac = (man << (23 - p)) & 0x7F_FFFF;
        return sign | ((127 - 9 + p) << 23) | frac;
    }
    sign | ((exp + 120) << 23) | (man << 20)
}

const fn lut() -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = e4m3_bits(i as u8);
        i += 1;
    }
    t
}

static LUT: [u32; 256] = lut();

/// One E4M3 byte as f32 (exact; `0x7f` / `0xff` are NaN).
#[inline(always)]
pub fn e4m3_to_f32(b: u8) -> f32 {
    f32::from_bits(LUT[b as usize])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_decodes_every_class_exactly() {
        assert_eq!(e4m3_to_f32(0x00), 0.0);
        assert_eq!(e4m3_to_f32(0x80).to_bits(), (-0.0f32).to_bits());
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9)); // smallest subnormal
        assert_eq!(e4m3_to_f32(0x07), 7.0 * 2f32.powi(-9)); // largest subnormal
        assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6)); // smallest normal
        assert_eq!(e4m3_to_f32(0x38), 1.0);
        assert_eq!(e4m3_to_f32(0x3c), 1.5);
        assert_eq!(e4m3_to_f32(0xbc), -1.5);
        assert_eq!(e4m3_to_f32(0x7e), 448.0); // largest finite
        assert_eq!(e4m3_to_f32(0xfe), -448.0);
        assert!(e4m3_to_f32(0x7f).is_nan() && e4m3_to_f32(0xff).is_nan());
        assert!(e4m3_to_f32(0x78).is_finite()); // 256: E4M3FN has no infinity
        assert_eq!(e4m3_to_f32(0x78), 256.0);
        // every byte: the formula in f64
        for b in 0..=255u8 {
            let (s, e, m) = (b >> 7, (b >> 3) & 15, b & 7);
            if e == 15 && m == 7 {
                continue;
            }
            let mag = if e == 0 {
                m as f64 * 2f64.powi(-9)
            } else {
                (1.0 + m as f64 / 8.0) * 2f64.powi(e as i32 - 7)
            };
            let v = if s == 1 { -mag } else { mag };
            assert_eq!(e4m3_to_f32(b) as f64, v, "byte {b:#x}");
        }
    }
}
