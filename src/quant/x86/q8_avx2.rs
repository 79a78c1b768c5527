//! AVX2 integer tiles of the q8 path (`quant/q8/`, lane width 8): each output equals
//! `ref_tile32::<8>` / `ref_tile_k::<8>` bit for bit.
//!
//! - 32-value types, 2 rows × 4 tokens: one block per 32-byte register; `vpmaddubsw` of
//!   `|w|` with the activations carrying `w`'s sign (`vpsignb`; at most 2 · 128 · 127, no
//!   saturation), `vpmaddwd` with ones into 8 lanes of four products each, then
//!   `fma(cvt(sum), dw · dx, acc)`.
//! - K-quants, 2 rows × 4 tokens: `vpmaddubsw` (unsigned `q` × signed activations), then
//!   `vpmaddwd` with the chunk's two per-16 scales, summed over the superblock's eight
//!   chunks; per superblock one fma with `d · dx`, and the mins by one `vpmaddwd` of 16 mins
//!   with the 16 activation sums into 8 lanes.

// Register tiles are indexed by row and token: index loops say which is which.
#![allow(clippy::needless_range_loop)]
use crate::quant::q8::acts::{KMeta, Q8Acts, QK};
use std::arch::x86_64::*;

/// Rows × tokens of both tiles.
pub(crate) const R: usize = 2;
pub(crate) const T: usize = 4;

/// `fold::<8>` of a register: halves 128 → 64 → 32 bits.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn fold8(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
    _mm_cvtss_f32(s)
}

/// The 32-value tile (safe wrapper; only reachable where AVX2 was detected).
pub(crate) fn tile32(
    w: &[i8],
    d: &[f32],
    nr: usize,
    a: &Q8Acts,
    t0: usize,
    nt: usize,
    out: &mut [f32],
) {
    let cols = a.cols;
    let nb = cols / 32;
    assert!((1..=R).contains(&nr) && (1..=T).contains(&nt), "tile shape");
    assert!(w.len() >= nr * cols && d.len() >= nr * nb && out.len() >= nr * nt);
    assert!(a.qs.len() >= (t0 + nt) * cols && a.d.len() >= (t0 + nt) * nb);
    // SAFETY: AVX2 detected by the caller's table; pointers stay inside the checked slices.
    unsafe {
        match nt {
            1 => inner::<1>(w, d, nr, a, t0, out),
            2 => inner::<2>(w, d, nr, a, t0, out),
            3 => inner::<3>(w, d, nr, a, t0, out),
            _ => inner::<4>(w, d, nr, a, t0, out),
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn inner<const NT: usize>(
        w: &[i8],
        d: &[f32],
        nr: usize,
        a: &Q8Acts,
        t0: usize,
        out: &mut [f32],
    ) {
        let cols = a.cols;
        let nb = cols / 32;
        let wp: [*const i8; R] = std::array::from_fn(|r| w.as_ptr().add(r.min(nr - 1) * cols));
        let dp: [*const f32; R] = std::array::from_fn(|r| d.as_ptr().add(r.min(nr - 1) * nb));
        let tt = |t: usize| t0 + t;
        let ap: [*const i8; NT] = std::array::from_fn(|t| a.qs.as_ptr().add(tt(t) * cols));
        let xp: [*const f32; NT] = std::array::from_fn(|t| a.d.as_ptr().add(tt(t) * nb));
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); NT]; R];
        for b in 0..nb {
            let mut av = [_mm256_setzero_si256(); NT];
            for t in 0..NT {
                av[t] = _mm256_loadu_si256(ap[t].add(32 * b) as *const __m256i);
            }
            for r in 0..R {
                let wv = _mm256_loadu_si256(wp[r].add(32 * b) as *const __m256i);
                let aw = _mm256_sign_epi8(wv, wv);
                let dw = *dp[r].add(b);
                for t in 0..NT {
                    let sa = _mm256_sign_epi8(av[t], wv);
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sa), ones);
                    let s = _mm256_set1_ps(dw * *xp[t].add(b));
                    acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc[r][t]);
                }
            }
        }
        for r in 0..nr {
            for t in 0..NT {
                out[r * NT + t] = fold8(acc[r][t]);
            }
        }
    }
}

/// The K-quant tile (safe wrapper; only reachable where AVX2 was detected).
pub(crate) fn tile_k(
    q: &[u8],
    m: &[KMeta],
    nr: usize,
    a: &Q8Acts,
    t0: usize,
    nt: usize,
    out: &mut [f32],
) {
    let cols = a.cols;
    let nsb = cols / QK;
    assert!((1..=R).contains(&nr) && (1..=T).contains(&nt), "tile shape");
    assert!(q.len() >= nr * cols && m.len() >= nr * nsb && out.len() >= nr * nt);
    assert!(
        a.qs.len() >= (t0 + nt) * cols
            && a.d.len() >= (t0 + nt) * nsb
            && a.bsums.len() >= (t0 + nt) * nsb * 16
    );
    // SAFETY: as in `tile32`.
    unsafe {
        match nt {
            1 => inner::<1>(q, m, nr, a, t0, out),
            2 => inner::<2>(q, m, nr, a, t0, out),
            3 => inner::<3>(q, m, nr, a, t0, out),
            _ => inner::<4>(q, m, nr, a, t0, out),
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn inner<const NT: usize>(
        q: &[u8],
        m: &[KMeta],
        nr: usize,
        a: &Q8Acts,
        t0: usize,
        out: &mut [f32],
    ) {
        let cols = a.cols;
        let nsb = cols / QK;
        let qp: [*const u8; R] = std::array::from_fn(|r| q.as_ptr().add(r.min(nr - 1) * cols));
        let mp: [*const KMeta; R] = std::array::from_fn(|r| m.as_ptr().add(r.min(nr - 1) * nsb));
        let tt: [usize; NT] = std::array::from_fn(|t| t0 + t);
        let mut acc = [[_mm256_setzero_ps(); NT]; R];
        let mut accm = [[_mm256_setzero_ps(); NT]; R];
        for sb in 0..nsb {
            let mut s = [[_mm256_setzero_si256(); NT]; R];
            for c in 0..8 {
                let mut av = [_mm256_setzero_si256(); NT];
                for t in 0..NT {
                    let p = a.qs.as_ptr().add(tt[t] * cols + sb * QK + 32 * c);
                    av[t] = _mm256_loadu_si256(p as *const __m256i);
                }
                for r in 0..R {
                    let km = &*mp[r].add(sb);
                    // i16 lane k covers elements 32c + 2k, +1: sub-block 2c + k / 8
                    let scv = _mm256_set_m128i(
                        _mm_set1_epi16(km.sc[2 * c + 1]),
                        _mm_set1_epi16(km.sc[2 * c]),
                    );
                    let wq = _mm256_loadu_si256(qp[r].add(sb * QK + 32 * c) as *const __m256i);
                    for t in 0..NT {
                        let pr = _mm256_maddubs_epi16(wq, av[t]);
                        s[r][t] = _mm256_add_epi32(s[r][t], _mm256_madd_epi16(pr, scv));
                    }
                }
            }
            for t in 0..NT {
                let dx = *a.d.as_ptr().add(tt[t] * nsb + sb);
                let bs = _mm256_loadu_si256(
                    a.bsums.as_ptr().add((tt[t] * nsb + sb) * 16) as *const __m256i
                );
                for r in 0..R {
                    let km = &*mp[r].add(sb);
                    let sd = _mm256_set1_ps(km.d * dx);
                    acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[r][t]), sd, acc[r][t]);
                    let mn = _mm256_loadu_si256(km.mn.as_ptr() as *const __m256i);
                    let mi = _mm256_madd_epi16(mn, bs);
                    let sm = _mm256_set1_ps(km.dmin * dx);
                    accm[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mi), sm, accm[r][t]);
                }
            }
        }
        for r in 0..nr {
            for t in 0..NT {
                out[r * NT + t] = fold8(acc[r][t]) - fold8(accm[r][t]);
            }
        }
    }
}
