//! The leaf of the q8 path: the activation formats and their quantization (Q8_0 per 32,
//! Q8_K per 256, see the parent module's header), and the K-quants' prepared factors, which
//! the level tiles (`quant::x86::q8_*`) and the parent module's tables both import.

use super::super::scalar::f16_to_f32;

/// Elements of a Q8_K superblock.
pub(crate) const QK: usize = 256;

/// The activation blocks a weight type's integer dot takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ActFormat {
    /// Q8_0: 32 values, f16-rounded scale.
    Q8_0,
    /// Q8_K: 256 values, f32 scale, sums per 16.
    Q8K,
}

/// Per-superblock factors of a prepared K-quant row: `value = d · sc[s] · q − dmin ·
/// mn[s]` for the element's 16-value sub-block `s`.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub(crate) struct KMeta {
    pub sc: [i16; 16],
    pub mn: [i16; 16],
    pub d: f32,
    pub dmin: f32,
}

/// `n` activation rows of `cols` values, quantized: `qs` (`n × cols`), scales `d` (one per
/// block: 32 values for Q8_0, 256 for Q8_K), and for Q8_K the sums of each 16 `qs`
/// (`bsums`, `n × cols / 16`).
#[derive(Default)]
pub(crate) struct Q8Acts {
    pub cols: usize,
    pub qs: Vec<i8>,
    pub d: Vec<f32>,
    pub bsums: Vec<i16>,
}

impl Q8Acts {
    /// Quantizes the `x.len() / cols` rows of `x` in `fmt`, reusing the buffers. `cols` is a
    /// multiple of the format's block.
    pub(crate) fn quantize(&mut self, fmt: ActFormat, x: &[f32], cols: usize) {
        let n = x.len() / cols;
        let be = match fmt {
            ActFormat::Q8_0 => 32,
            ActFormat::Q8K => QK,
        };
        assert!(cols.is_multiple_of(be) && x.len() == n * cols, "q8 shape");
        self.cols = cols;
        self.qs.resize(n * cols, 0);
        self.d.resize(n * cols / be, 0.0);
        self.bsums.resize(
            if fmt == ActFormat::Q8K {
                n * cols / 16
            } else {
                0
            },
            0,
        );
        quantize_rows(fmt, x, &mut self.qs, &mut self.d, &mut self.bsums);
    }
}

/// Quantizes whole blocks of `x` in `fmt` into `qs` (`x.len()`), `d` (one per block) and,
/// for Q8_K, `bsums` (one per 16 values; empty for Q8_0). The same IEEE operations at every
/// level (compiled with AVX2 where the CPU has it, so rounding is one instruction).
pub(crate) fn quantize_rows(
    fmt: ActFormat,
    x: &[f32],
    qs: &mut [i8],
    d: &mut [f32],
    bsums: &mut [i16],
) {
    #[cfg(target_arch = "x86_64")]
    if super::super::SimdLevel::detect() >= super::super::SimdLevel::Avx2 {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2(fmt: ActFormat, x: &[f32], qs: &mut [i8], d: &mut [f32], b: &mut [i16]) {
            quantize_portable(fmt, x, qs, d, b)
        }
        // SAFETY: AVX2 and FMA detected.
        return unsafe { avx2(fmt, x, qs, d, bsums) };
    }
    quantize_portable(fmt, x, qs, d, bsums)
}

#[inline(always)]
fn quantize_portable(fmt: ActFormat, x: &[f32], qs: &mut [i8], d: &mut [f32], bsums: &mut [i16]) {
    match fmt {
        ActFormat::Q8_0 => {
            for ((xb, qb), d) in x.chunks_exact(32).zip(qs.chunks_exact_mut(32)).zip(d) {
                *d = quantize_q8_0_block(xb, qb);
            }
        }
        ActFormat::Q8K => {
            for (((xb, qb), d), s) in x
                .chunks_exact(QK)
                .zip(qs.chunks_exact_mut(QK))
                .zip(d)
                .zip(bsums.chunks_exact_mut(16))
            {
                *d = quantize_q8_k_block(xb, qb, s);
            }
        }
    }
}

/// Rounds an f32 to the nearest f16 value (ties to even), returned as f32.
#[inline(always)]
pub(crate) fn round_to_f16(v: f32) -> f32 {
    f16_to_f32(f32_to_f16(v))
}

/// IEEE binary32 → binary16, round to nearest even (overflow to infinity).
#[inline(always)]
fn f32_to_f16(v: f32) -> u16 {
    let b = v.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let a = f32::from_bits(b & 0x7FFF_FFFF);
    if a.is_nan() {
        return sign | 0x7E00;
    }
    if a >= 65520.0 {
        return sign | 0x7C00;
    }
    if a < 6.103_515_6e-5 {
        // subnormal half: multiples of 2^-24, rounded to even by the float addition
        let q = (a * 16_777_216.0).round_ties_even() as u16;
        return sign | q;
    }
    let e = ((a.to_bits() >> 23) as i32) - 127;
    let man = a.to_bits() & 0x7F_FFFF;
    let mut h = (((e + 15) as u32) << 10) | (man >> 13);
    let rest = man & 0x1FFF;
    if rest > 0x1000 || (rest == 0x1000 && (h & 1) == 1) {
        h += 1;
    }
    sign | h as u16
}

/// One Q8_0 activation block: `q` from `x` (32 values), returns the f16-rounded scale.
#[inline(always)]
pub(crate) fn quantize_q8_0_block(x: &[f32], q: &mut [i8]) -> f32 {
    let amax = abs_max(x);
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    for (qv, &v) in q.iter_mut().zip(x) {
        *qv = (v * id).round_ties_even() as i8;
    }
    round_to_f16(d)
}

/// The largest `|v|` of `x` (0 for none; NaNs ignored), in 8 lanes so that the compiler
/// vectorizes it (a single chain of `max` is bound by its latency); `max` is exact, so the
/// grouping does not change the value.
#[inline(always)]
pub(crate) fn abs_max(x: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for (m, v) in lanes.iter_mut().zip(c) {
            *m = m.max(v.abs());
        }
    }
    let m = lanes.iter().fold(0f32, |a, &b| a.max(b));
    chunks.remainder().iter().fold(m, |a, v| a.max(v.abs()))
}

/// One Q8_K activation block: `q` from `x` (256 values) and the sums of each 16; returns the
/// scale (0 with all-zero `q` when `x` is all zero).
#[inline(always)]
pub(crate) fn quantize_q8_k_block(x: &[f32], q: &mut [i8], bsums: &mut [i16]) -> f32 {
    // the first value of the largest magnitude (what a scan keeping the first strictly
    // larger one gives)
    let amax = abs_max(x);
    let max = x.iter().copied().find(|v| v.abs() == amax).unwrap_or(0.0);
    if amax == 0.0 {
        q.fill(0);
        bsums.fill(0);
        return 0.0;
    }
    let iscale = -127.0 / max;
    for (qv, &v) in q.iter_mut().zip(x) {
        *qv = ((iscale * v).round_ties_even() as i32).min(127) as i8;
    }
    for (s, qb) in bsums.iter_mut().zip(q.chunks_exact(16)) {
        *s = qb.iter().map(|&v| v as i16).sum();
    }
    1.0 / iscale
}
