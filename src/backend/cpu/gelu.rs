//! GeGLU with the tanh GELU, vectorized: `g[i] = gelu_tanh(g[i]) * up[i]` (Gemma's
//! feed-forward gate).
//!
//! `0.5 x (1 + tanh(y))` equals `x · sigmoid(2y) = x / (1 + exp(-2y))` with
//! `y = √(2/π) (x + 0.044715 x³)` (Hendrycks & Gimpel 2016), which is computed here: no
//! cancellation for negative `x` (where `1 + tanh(y)` loses bits) and one `exp` instead of
//! libm's `tanhf`. `exp(z)` is Cody–Waite range reduction (`z = n ln 2 + r`, `|r| ≤ ln 2 / 2`,
//! `ln 2` split in two parts), a degree-7 Taylor polynomial of `e^r` (truncation below 6e-9
//! relative), and `2^n` put into the exponent; `z` is clamped to `[-86, 88]` first, where
//! `1 + e^z` is already `1` below and the result below 1e-37 in magnitude above. Every step is
//! an IEEE single operation or fma, and the final division is exact-rounded, so the result
//! is within a few ulp of the true GELU (tested against f64 below).
//!
//! Every element of a row takes the same vector operations (the last partial vector is
//! padded), so a value never depends on its position, the row length or the thread split:
//! prompt and decode agree bit for bit. Levels without vectors run the same steps in scalar
//! code (`fma` as `mul_add`).

#[cfg(target_arch = "x86_64")]
use crate::quant::SimdLevel;
use rayon::prelude::*;

/// `-2 √(2/π)` and `-2 √(2/π) · 0.044715`: `z = x (A + B x²) = -2y`.
const A: f32 = -1.595_769_2;
const B: f32 = -0.071_354_814;
const LOG2E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` in two parts: `LN2_HI` has 8 trailing zero bits, so `n · LN2_HI` is exact for
/// `|n| ≤ 128`.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// `1/k!` for `k = 7 … 2` (Horner from the highest degree).
const C: [f32; 6] = [
    1.0 / 5040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
];
const Z_MIN: f32 = -86.0;
const Z_MAX: f32 = 88.0;

/// One element in scalar code: the same steps as the vector kernels.
#[inline]
fn gelu_scalar(x: f32) -> f32 {
    let z = (x * B.mul_add(x * x, A)).clamp(Z_MIN, Z_MAX);
    let n = (z * LOG2E).round_ties_even();
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, z));
    let mut p = C[0];
    for &c in &C[1..] {
        p = p.mul_add(r, c);
    }
    let p = p.mul_add(r, 1.0).mul_add(r, 1.0);
    let e = f32::from_bits(p.to_bits().wrapping_add(((n as i32) << 23) as u32));
    x / (1.0 + e)
}

/// `g[i] = gelu_tanh(g[i]) * up[i]` for every `i` (see the module doc for the formula and
/// its accuracy). `g` and `up` have the same length; panics otherwise.
pub fn geglu_tanh(g: &mut [f32], up: &[f32]) {
    assert_eq!(g.len(), up.len(), "gate and up lengths differ");
    #[cfg(target_arch = "x86_64")]
    {
        let level = SimdLevel::detect();
        if level == SimdLevel::Avx512 {
            // SAFETY: AVX-512F (with FMA) was detected at run time.
            return unsafe { x86::geglu_avx512(g, up) };
        }
        if level == SimdLevel::Avx2 {
            // SAFETY: AVX2 and FMA were detected at run time.
            return unsafe { x86::geglu_avx2(g, up) };
        }
    }
    for (a, &b) in g.iter_mut().zip(up) {
        *a = gelu_scalar(*a) * b;
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{A, B, C, LN2_HI, LN2_LO, LOG2E, Z_MAX, Z_MIN};
    use std::arch::x86_64::*;

    /// 16 lanes of the GELU.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    fn gelu16(x: __m512) -> __m512 {
        let s = _mm512_set1_ps;
        let z = _mm512_mul_ps(x, _mm512_fmadd_ps(s(B), _mm512_mul_ps(x, x), s(A)));
        let z = _mm512_min_ps(_mm512_max_ps(z, s(Z_MIN)), s(Z_MAX));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(z, s(LOG2E)),
        );
        let r = _mm512_fnmadd_ps(n, s(LN2_HI), z);
        let r = _mm512_fnmadd_ps(n, s(LN2_LO), r);
        let mut p = s(C[0]);
        for &c in &C[1..] {
            p = _mm512_fmadd_ps(p, r, s(c));
        }
        let p = _mm512_fmadd_ps(_mm512_fmadd_ps(p, r, s(1.0)), r, s(1.0));
        let e = _mm512_castsi512_ps(_mm512_add_epi32(
            _mm512_castps_si512(p),
            _mm512_slli_epi32::<23>(_mm512_cvtps_epi32(n)),
        ));
        _mm512_div_ps(x, _mm512_add_ps(s(1.0), e))
    }

    /// 8 lanes of the GELU (the same steps as `gelu16`).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn gelu8(x: __m256) -> __m256 {
        let s = _mm256_set1_ps;
        let z = _mm256_mul_ps(x, _mm256_fmadd_ps(s(B), _mm256_mul_ps(x, x), s(A)));
        let z = _mm256_min_ps(_mm256_max_ps(z, s(Z_MIN)), s(Z_MAX));
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(z, s(LOG2E)),
        );
        let r = _mm256_fnmadd_ps(n, s(LN2_HI), z);
        let r = _mm256_fnmadd_ps(n, s(LN2_LO), r);
        let mut p = s(C[0]);
        for &c in &C[1..] {
            p = _mm256_fmadd_ps(p, r, s(c));
        }
        let p = _mm256_fmadd_ps(_mm256_fmadd_ps(p, r, s(1.0)), r, s(1.0));
        let e = _mm256_castsi256_ps(_mm256_add_epi32(
            _mm256_castps_si256(p),
            _mm256_slli_epi32::<23>(_mm256_cvtps_epi32(n)),
        ));
        _mm256_div_ps(x, _mm256_add_ps(s(1.0), e))
    }

    /// `g = gelu(g) * up`, 16 lanes at a time; the last partial vector through a padded copy.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn geglu_avx512(g: &mut [f32], up: &[f32]) {
        let full = g.len() / 16 * 16;
        let (gp, up_p) = (g.as_mut_ptr(), up.as_ptr());
        let mut i = 0;
        while i < full {
            let v = _mm512_mul_ps(
                gelu16(_mm512_loadu_ps(gp.add(i))),
                _mm512_loadu_ps(up_p.add(i)),
            );
            _mm512_storeu_ps(gp.add(i), v);
            i += 16;
        }
        if full < g.len() {
            let (mut a, mut b) = ([0f32; 16], [0f32; 16]);
            let rest = g.len() - full;
            a[..rest].copy_from_slice(&g[full..]);
            b[..rest].copy_from_slice(&up[full..]);
            let v = _mm512_mul_ps(
                gelu16(_mm512_loadu_ps(a.as_ptr())),
                _mm512_loadu_ps(b.as_ptr()),
            );
            _mm512_storeu_ps(a.as_mut_ptr(), v);
            g[full..].copy_from_slice(&a[..rest]);
        }
    }

    /// `g = gelu(g) * up`, 8 lanes at a time; the last partial vector through a padded copy.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn geglu_avx2(g: &mut [f32], up: &[f32]) {
        let full = g.len() / 8 * 8;
        let (gp, up_p) = (g.as_mut_ptr(), up.as_ptr());
        let mut i = 0;
        while i < full {
            let v = _mm256_mul_ps(
                gelu8(_mm256_loadu_ps(gp.add(i))),
                _mm256_loadu_ps(up_p.add(i)),
            );
            _mm256_storeu_ps(gp.add(i), v);
            i += 8;
        }
        if full < g.len() {
            let (mut a, mut b) = ([0f32; 8], [0f32; 8]);
            let rest = g.len() - full;
            a[..rest].copy_from_slice(&g[full..]);
            b[..rest].copy_from_slice(&up[full..]);
            let v = _mm256_mul_ps(
                gelu8(_mm256_loadu_ps(a.as_ptr())),
                _mm256_loadu_ps(b.as_ptr()),
            );
            _mm256_storeu_ps(a.as_mut_ptr(), v);
            g[full..].copy_from_slice(&a[..rest]);
        }
    }
}

/// Elements per parallel task of [`geglu_rows`] (a decode token's 2048-wide row stays on one
/// thread).
const GELU_CHUNK: usize = 8192;

/// GeGLU with the tanh GELU in place over `g` (`g ← gelu_tanh(g) · up`, element-wise, any
/// number of rows), on the calling thread up to [`super::ops::SERIAL_FLOATS`] elements, else
/// split over threads in chunks of 8192 elements: each element's value does not depend on
/// the split.
pub fn geglu_rows(g: &mut [f32], up: &[f32]) {
    assert_eq!(g.len(), up.len(), "geglu_rows: gate and up lengths");
    if g.len() <= super::ops::SERIAL_FLOATS {
        return geglu_tanh(g, up);
    }
    g.par_chunks_mut(GELU_CHUNK)
        .zip(up.par_chunks(GELU_CHUNK))
        .for_each(|(gc, uc)| geglu_tanh(gc, uc));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The f64 GELU-tanh, as `x · sigmoid(2y)` (the tanh form's `1 + tanh(y)` cancels to 0 in
    /// f64 too below x ≈ -9.5); checked against the tanh form where that one is accurate.
    fn gelu64(x: f64) -> f64 {
        let c = (2.0 / std::f64::consts::PI).sqrt();
        let y = c * (x + 0.044715 * x * x * x);
        let v = x / (1.0 + (-2.0 * y).exp());
        if x.abs() < 5.0 {
            let t = 0.5 * x * (1.0 + y.tanh());
            assert!((t - v).abs() <= 1e-12 * v.abs() + 1e-15, "{x}: {t} vs {v}");
        }
        v
    }

    /// Inputs over the range activations take, both tails, zero and the clamp edges.
    fn inputs() -> Vec<f32> {
        let mut v: Vec<f32> = (-4000..=4000).map(|i| i as f32 * 0.005).collect();
        v.extend([
            0.0, -0.0, 1e-30, -1e-30, 40.0, -40.0, 1e4, -1e4, 9.7, -9.7, 12.0, -12.0,
        ]);
        v
    }

    /// Within `4 + 2|z|` ulp (relative) of the f64 GELU wherever the result is above
    /// 1e-35, `z = 2y` the exponent (`e^z` amplifies the rounding of `z` by `|z|`, as it does
    /// for any f32 evaluation of `tanh(y)`), within `1e-37 · max(1, |x|)` absolutely elsewhere
    /// (the clamp of `z` at 88); exactly 0 at 0 and `x` for large `x`.
    #[test]
    fn geglu_matches_f64_gelu() {
        let x = inputs();
        let mut g = x.clone();
        geglu_tanh(&mut g, &vec![1.0; x.len()]);
        let c = (2.0 / std::f64::consts::PI).sqrt();
        let ulps = |xi: f32, gi: f32| {
            let (xd, want) = (xi as f64, gelu64(xi as f64));
            let z = 2.0 * c * (xd + 0.044715 * xd * xd * xd);
            let err = (gi as f64 - want).abs();
            if want.abs() > 1e-35 {
                let u = err / (want.abs() * f32::EPSILON as f64);
                assert!(
                    u <= 4.0 + 2.0 * z.abs(),
                    "gelu({xi}) = {gi}, want {want}: {u} ulp"
                );
                u
            } else {
                let tol = 1e-37 * xd.abs().max(1.0);
                assert!(err < tol, "gelu({xi}) = {gi}, want {want}");
                0.0
            }
        };
        // in the range where |z| < 1 (|x| < 0.6) that is within 6 ulp
        let worst = x
            .iter()
            .zip(&g)
            .filter(|(xi, _)| xi.abs() < 0.6)
            .map(|(&xi, &gi)| ulps(xi, gi))
            .fold(0.0, f64::max);
        assert!(worst <= 6.0, "{worst} ulp");
        for (&xi, &gi) in x.iter().zip(&g) {
            ulps(xi, gi);
            // the scalar steps meet the same bound
            ulps(xi, gelu_scalar(xi));
        }
        assert_eq!(g[x.len() - 12], 0.0);
        assert_eq!(g[x.len() - 6], 1e4);
    }

    /// The gate is multiplied by `up`; a value does not depend on its position or the
    /// slice length (the padded tail equals the full vectors).
    #[test]
    fn geglu_is_position_independent() {
        let x = inputs();
        let up: Vec<f32> = (0..x.len()).map(|i| 0.5 + (i % 5) as f32).collect();
        let mut all = x.clone();
        geglu_tanh(&mut all, &up);
        for start in [0, 1, 3, 7, 15] {
            for len in [1, 5, 16, 17, 33] {
                let mut part = x[start..start + len].to_vec();
                geglu_tanh(&mut part, &up[start..start + len]);
                assert_eq!(part, all[start..start + len], "start {start} len {len}");
            }
        }
        let mut g = [1.0f32, -3.0];
        geglu_tanh(&mut g, &[2.0, 10.0]);
        assert!((g[0] - 2.0 * 0.841_192).abs() < 1e-5, "{g:?}");
        assert!((g[1] + 10.0 * 0.003_637_4).abs() < 1e-6, "{g:?}");
    }
}
