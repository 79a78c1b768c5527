//! Random weight encoders of synthetic checkpoints: each fills a buffer with random values in
//! one stored encoding, sized so that a matrix with fan-in `n` has values of about `±1/√n`
//! (activations then stay in range through the layers), and never writes a code that decodes
//! to NaN or infinity.
//!
//! All draw from [`Rng`] (xorshift64*, Vigna 2016, "An experimental exploration of Marsaglia's
//! xorshift generators, scrambled"), one 64-bit draw per 8 output bytes or 4 BF16 values.

use crate::quant::GgmlType;

/// A fast pseudo-random generator (xorshift64*).
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    /// The generator for a user seed (any value, 0 included).
    pub(crate) fn seeded(seed: u64) -> Rng {
        Rng(seed.max(1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Fills `out` with random bytes.
pub(crate) fn bytes(rng: &mut Rng, out: &mut [u8]) {
    for c in out.chunks_mut(8) {
        let r = rng.next().to_le_bytes();
        c.copy_from_slice(&r[..c.len()]);
    }
}

/// BF16 values uniform in `±scale`: 4096 evenly spaced levels, looked up 4 per draw.
pub(crate) struct Bf16Uniform {
    pub scale: f32,
    table: Vec<[u8; 2]>,
}

impl Bf16Uniform {
    pub(crate) fn new(scale: f32) -> Self {
        let table = (0..4096)
            .map(|i| {
                let v = ((i as f32 + 0.5) / 2048.0 - 1.0) * scale;
                half::bf16::from_f32(v).to_le_bytes()
            })
            .collect();
        Bf16Uniform { scale, table }
    }

    /// Fills `out` (little-endian BF16 bytes).
    pub(crate) fn fill(&self, rng: &mut Rng, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            let r = rng.next();
            for (j, b) in chunk.chunks_mut(2).enumerate() {
                b.copy_from_slice(&self.table[((r >> (16 * j)) & 4095) as usize][..b.len()]);
            }
        }
    }
}

/// F32 values uniform in `±scale` (24 random bits each).
pub(crate) fn f32_uniform(rng: &mut Rng, scale: f32, out: &mut [u8]) {
    for c in out.chunks_mut(4) {
        let r = (rng.next() >> 40) as f32 / (1u64 << 24) as f32;
        c.copy_from_slice(&((2.0 * r - 1.0) * scale).to_le_bytes());
    }
}

/// Fills `out` with copies of `pattern` (one element's bytes).
pub(crate) fn repeat(pattern: &[u8], out: &mut [u8]) {
    for c in out.chunks_mut(pattern.len()) {
        c.copy_from_slice(&pattern[..c.len()]);
    }
}

/// Random FP8 E4M3 codes: uniform over the 254 finite codes, the NaN codes `S.1111.111`
/// (`0x7f`, `0xff`) replaced by `±448` (`0x7e`, `0xfe`). Eight bytes per draw: a byte's low
/// seven bits are `0x7f` exactly when adding 1 to them carries into bit 7, which then flips
/// its bit 0.
pub(crate) fn fp8_e4m3(rng: &mut Rng, out: &mut [u8]) {
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    for c in out.chunks_mut(8) {
        let r = rng.next();
        let nan = ((r & LOW7) + ONES) & HIGH;
        let v = (r ^ (nan >> 7)).to_le_bytes();
        c.copy_from_slice(&v[..c.len()]);
    }
}

/// Root mean square of the values [`fp8_e4m3`] draws (about 107; the largest is 448): a block
/// scale of `target / fp8_e4m3_rms()` gives weights of RMS `target`.
pub(crate) fn fp8_e4m3_rms() -> f32 {
    let sum: f64 = (0u8..=0x7e)
        .map(|b| (crate::quant::fp8::e4m3_to_f32(b) as f64).powi(2))
        .sum::<f64>()
        + 448f64.powi(2); // 0x7f drawn as 0x7e
    (sum / 128.0).sqrt() as f32
}

/// Root mean square of the 16 FP4 E2M1 values (0, ±0.5, ±1, ±1.5, ±2, ±3, ±4, ±6), uniform:
/// `√(68.5 / 8)`.
pub(crate) const E2M1_RMS: f64 = 2.926_174_9;

/// The lowest of the four E8M0 exponents [`e8m0`] draws for MXFP4 weights of fan-in `n`. With
/// exponents `e ∈ lo..=lo+3` uniform and random E2M1 nibbles the weights' RMS is
/// `E2M1_RMS · 2^(lo − 127) · √(Σ_{k<4} 4^k / 4)`; `lo` is the floor of the solution of
/// RMS = `1/√n`, so the RMS lies between half of `1/√n` and `1/√n` (never above: activations
/// shrink rather than grow). Near 2^0 for small `n` (120..=123 for `n = 64`, 117..=120 for
/// `n = 2880`).
pub(crate) fn e8m0_low(n: usize) -> u8 {
    let spread = (85.0f64 / 4.0).sqrt();
    let lo = 127.0 - ((n as f64).sqrt() * E2M1_RMS * spread).log2();
    (lo.floor() as i64).clamp(1, 251) as u8
}

/// E8M0 scale bytes uniform in `lo..=lo+3`.
pub(crate) fn e8m0(rng: &mut Rng, lo: u8, out: &mut [u8]) {
    for c in out.chunks_mut(32) {
        let mut r = rng.next();
        for b in c {
            *b = lo + (r & 3) as u8;
            r >>= 2;
        }
    }
}

/// Random GGML blocks of `ty` (Q4_0, Q5_0, Q8_0 or Q4_K; ggml `ggml-common.h` layouts) whose
/// values span about `±scale`: random quants, and block scales chosen per type:
///
/// - Q4_0 (18 bytes: f16 `d`, 16 bytes of nibbles, `(q − 8)·d`): `d = scale/8`;
/// - Q5_0 (22 bytes: f16 `d`, 4 bytes of fifth bits, 16 bytes of nibbles, `(q − 16)·d`):
///   `d = scale/16`;
/// - Q8_0 (34 bytes: f16 `d`, 32 × i8, `q·d`): `d = scale/127`;
/// - Q4_K (144 bytes: f16 `d`, f16 `dmin`, 12 bytes of 6-bit sub-block scales `sc` and mins
///   `m`, 128 bytes of nibbles; `d·sc·q − dmin·m`): `d = 2·scale/945`, `dmin = scale/63`, so a
///   sub-block spans `scale·(2·sc·q/945 − m/63)`, zero on average over random `sc`, `q`, `m`.
///
/// Each block's scales get a random sign, so rows share no common bias (Q4_0's levels −8..7
/// average −½·d, which with one sign would make every token route alike). Panics on another
/// type.
pub(crate) fn ggml_blocks(rng: &mut Rng, ty: GgmlType, scale: f32, out: &mut [u8]) {
    let f16 = |v: f32| half::f16::from_f32(v).to_le_bytes();
    // per sign: the block's leading scale bytes
    let head: [Vec<u8>; 2] = match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => {
            let q = match ty {
                GgmlType::Q4_0 => 8.0,
                GgmlType::Q5_0 => 16.0,
                _ => 127.0,
            };
            [f16(scale / q).to_vec(), f16(-scale / q).to_vec()]
        }
        GgmlType::Q4_K => {
            let (d, dmin) = (2.0 * scale / 945.0, scale / 63.0);
            [[f16(d), f16(dmin)].concat(), [f16(-d), f16(-dmin)].concat()]
        }
        _ => unreachable!("synthetic GGUF blocks are Q4_0, Q5_0, Q8_0 or Q4_K, not {ty}"),
    };
    let h = head[0].len();
    let mut signs = 0u64;
    for (i, b) in out.chunks_mut(ty.block_bytes()).enumerate() {
        if i % 64 == 0 {
            signs = rng.next();
        }
        b[..h].copy_from_slice(&head[((signs >> (i % 64)) & 1) as usize]);
        bytes(rng, &mut b[h..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::fp8::e4m3_to_f32;

    #[test]
    fn fp8_codes_are_finite_and_cover_the_range() {
        let mut rng = Rng::seeded(5);
        let mut b = vec![0u8; 1 << 16];
        fp8_e4m3(&mut rng, &mut b);
        assert!(b.iter().all(|&x| x & 0x7f != 0x7f));
        assert!(b.iter().all(|&x| e4m3_to_f32(x).is_finite()));
        let max = b.iter().map(|&x| e4m3_to_f32(x).abs()).fold(0f32, f32::max);
        assert_eq!(max, 448.0);
        let rms = fp8_e4m3_rms();
        assert!((107.0..107.5).contains(&rms), "{rms}");
        let got = (b
            .iter()
            .map(|&x| (e4m3_to_f32(x) as f64).powi(2))
            .sum::<f64>()
            / b.len() as f64)
            .sqrt();
        assert!((got / rms as f64 - 1.0).abs() < 0.02, "{got} vs {rms}");
    }

    #[test]
    fn e8m0_exponents_follow_the_fan_in() {
        assert_eq!((e8m0_low(64), e8m0_low(2880)), (120, 117));
        let mut rng = Rng::seeded(9);
        let mut b = vec![0u8; 4096];
        e8m0(&mut rng, 118, &mut b);
        for e in 118..=121u8 {
            let n = b.iter().filter(|&&x| x == e).count();
            assert!((900..1150).contains(&n), "{e}: {n}");
        }
        assert_eq!(b.iter().filter(|&&x| !(118..=121).contains(&x)).count(), 0);
        // MXFP4 weights of fan-in 2880 (blocks of a scale byte and 16 nibble bytes): RMS
        // 2^-½ of 1/√2880 (117.5 floored to 117)
        let n = 2880 * 32;
        let mut blocks = vec![0u8; n / 32 * 17];
        for blk in blocks.chunks_mut(17) {
            e8m0(&mut rng, e8m0_low(2880), &mut blk[..1]);
            bytes(&mut rng, &mut blk[1..]);
        }
        let mut y = vec![0f32; n];
        crate::quant::dequantize_row(GgmlType::MXFP4, &blocks, &mut y);
        let rms = (y.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / n as f64).sqrt();
        let want = 1.0 / 2880f64.sqrt();
        assert!(rms / want > 0.68 && rms / want < 0.74, "{rms} vs {want}");
    }

    #[test]
    fn ggml_blocks_decode_to_values_of_the_requested_span() {
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q5_0,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
        ] {
            let n = 256 * 64;
            let mut b = vec![0u8; ty.row_bytes(n).unwrap()];
            ggml_blocks(&mut Rng::seeded(1), ty, 0.5, &mut b);
            let mut y = vec![0f32; n];
            crate::quant::dequantize_row(ty, &b, &mut y);
            let max = y.iter().fold(0f32, |m, v| m.max(v.abs()));
            let mean = y.iter().sum::<f32>() / n as f32;
            assert!(y.iter().all(|v| v.is_finite()), "{ty}");
            assert!((0.4..=1.01).contains(&max), "{ty}: max {max}");
            assert!(mean.abs() < 0.02, "{ty}: mean {mean}");
        }
    }
}
