//! AVX-512 VNNI integer tiles of the q8 path (`quant/q8/`, lane width 16): each output
//! equals `ref_tile32::<16>` / `ref_tile_k::<16>` bit for bit.
//!
//! - 32-value types, 4 rows × 4 tokens: a 64-byte chunk holds two blocks (lanes 0–7 and
//!   8–15); `vpdpbusd` multiplies the activations made unsigned (`a + 128`, a xor) by the
//!   signed weights, starting from `−128 · Σw` per lane (a `vpdpbusd` of 128s with the
//!   weights, once per row and chunk), so each lane holds its four products' exact sum; then
//!   `fma(cvt(sum), dw · dx, acc)`. An odd last block is a zero-extended half chunk.
//! - K-quants, 2 rows × 4 tokens: `vpmaddubsw` (unsigned `q` × signed activations) then
//!   `vpdpwssd` with the per-16 scales spread over the i16 lanes, summed over the
//!   superblock's four chunks; per superblock one fma with `d · dx`, and the mins by one
//!   `vpmaddwd` of 16 mins with the 16 activation sums into 8 lanes.

// Register tiles are indexed by row and token: index loops say which is which.
#![allow(clippy::needless_range_loop)]
use crate::quant::q8::acts::{KMeta, Q8Acts, QK};
use crate::quant::q8::quad::{QuadActs, QuadKActs, QuadKRows, QuadRows, QUAD};
use std::arch::x86_64::*;

/// Rows × tokens of the 32-value tile.
pub(crate) const R32: usize = 4;
pub(crate) const T32: usize = 4;
/// Rows × tokens of the K-quant tile.
pub(crate) const RK: usize = 2;
pub(crate) const TK: usize = 4;

/// `fold::<16>` of a register: halves 256 → 128 → 64 → 32 bits.
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx2")]
fn fold16(v: __m512) -> f32 {
    let lo = _mm512_castps512_ps256(v);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    fold8(_mm256_add_ps(lo, hi))
}

/// `fold::<8>` of a register: halves 128 → 64 → 32 bits.
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx2")]
fn fold8(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
    _mm_cvtss_f32(s)
}

/// Two block scales at `p` spread as `[p[0] × 8, p[1] × 8]` (`p[1]` read only when `two`).
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx2")]
unsafe fn scales2(p: *const f32, two: bool) -> __m512 {
    let lo = _mm256_set1_ps(*p);
    let hi = if two {
        _mm256_set1_ps(*p.add(1))
    } else {
        _mm256_setzero_ps()
    };
    _mm512_insertf32x8::<1>(_mm512_castps256_ps512(lo), hi)
}

/// 64 bytes at `p`, or 32 zero-extended when `!two`.
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx2")]
unsafe fn chunk(p: *const i8, two: bool) -> __m512i {
    if two {
        _mm512_loadu_si512(p as *const __m512i)
    } else {
        _mm512_zextsi256_si512(_mm256_loadu_si256(p as *const __m256i))
    }
}

/// The 32-value tile (safe wrapper; only reachable where VNNI was detected).
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
    assert!(
        (1..=R32).contains(&nr) && (1..=T32).contains(&nt),
        "tile shape"
    );
    assert!(w.len() >= nr * cols && d.len() >= nr * nb && out.len() >= nr * nt);
    assert!(a.qs.len() >= (t0 + nt) * cols && a.d.len() >= (t0 + nt) * nb);
    // SAFETY: VNNI detected by the caller's table; every pointer below stays inside the
    // slices checked above (rows and tokens clamped to the last real one).
    unsafe {
        match nt {
            1 => inner::<1>(w, d, nr, a, t0, out),
            2 => inner::<2>(w, d, nr, a, t0, out),
            3 => inner::<3>(w, d, nr, a, t0, out),
            _ => inner::<4>(w, d, nr, a, t0, out),
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")]
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
        let wp: [*const i8; R32] = std::array::from_fn(|r| w.as_ptr().add(r.min(nr - 1) * cols));
        let dp: [*const f32; R32] = std::array::from_fn(|r| d.as_ptr().add(r.min(nr - 1) * nb));
        let tt = |t: usize| t0 + t;
        let ap: [*const i8; NT] = std::array::from_fn(|t| a.qs.as_ptr().add(tt(t) * cols));
        let xp: [*const f32; NT] = std::array::from_fn(|t| a.d.as_ptr().add(tt(t) * nb));
        let bias = _mm512_set1_epi8(-128);
        let z = _mm512_setzero_ps();
        let mut acc = [[z; NT]; R32];
        let mut b = 0;
        while b < nb {
            let two = b + 1 < nb;
            let mut av = [_mm512_setzero_si512(); NT];
            let mut dx = [z; NT];
            for t in 0..NT {
                av[t] = _mm512_xor_si512(chunk(ap[t].add(32 * b), two), bias);
                dx[t] = scales2(xp[t].add(b), two);
            }
            for r in 0..R32 {
                let wv = chunk(wp[r].add(32 * b), two);
                let neg = _mm512_sub_epi32(
                    _mm512_setzero_si512(),
                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, wv),
                );
                let dw = scales2(dp[r].add(b), two);
                for t in 0..NT {
                    let p = _mm512_dpbusd_epi32(neg, av[t], wv);
                    let s = _mm512_mul_ps(dw, dx[t]);
                    acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), s, acc[r][t]);
                }
            }
            b += 2;
        }
        for r in 0..nr {
            for t in 0..NT {
                out[r * NT + t] = fold16(acc[r][t]);
            }
        }
    }
}

/// The K-quant tile (safe wrapper; only reachable where VNNI was detected).
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
    assert!(
        (1..=RK).contains(&nr) && (1..=TK).contains(&nt),
        "tile shape"
    );
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

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")]
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
        let qp: [*const u8; RK] = std::array::from_fn(|r| q.as_ptr().add(r.min(nr - 1) * cols));
        let mp: [*const KMeta; RK] = std::array::from_fn(|r| m.as_ptr().add(r.min(nr - 1) * nsb));
        let tt: [usize; NT] = std::array::from_fn(|t| t0 + t);
        // i16 lane k of chunk c covers elements 64c + 2k, 64c + 2k + 1: sub-block 4c + k / 8
        let idx: [__m512i; 4] = std::array::from_fn(|c| {
            let v: [i16; 32] = std::array::from_fn(|k| (4 * c + k / 8) as i16);
            _mm512_loadu_si512(v.as_ptr() as *const __m512i)
        });
        let z = _mm512_setzero_ps();
        let mut acc = [[z; NT]; RK];
        let mut accm = [[_mm256_setzero_ps(); NT]; RK];
        for sb in 0..nsb {
            let mut s = [[_mm512_setzero_si512(); NT]; RK];
            for c in 0..4 {
                let mut av = [_mm512_setzero_si512(); NT];
                for t in 0..NT {
                    let p = a.qs.as_ptr().add(tt[t] * cols + sb * QK + 64 * c);
                    av[t] = _mm512_loadu_si512(p as *const __m512i);
                }
                for r in 0..RK {
                    let km = &*mp[r].add(sb);
                    let sc16 = _mm256_loadu_si256(km.sc.as_ptr() as *const __m256i);
                    let scv = _mm512_permutexvar_epi16(idx[c], _mm512_castsi256_si512(sc16));
                    let wq = _mm512_loadu_si512(qp[r].add(sb * QK + 64 * c) as *const __m512i);
                    for t in 0..NT {
                        let pr = _mm512_maddubs_epi16(wq, av[t]);
                        s[r][t] = _mm512_dpwssd_epi32(s[r][t], pr, scv);
                    }
                }
            }
            for t in 0..NT {
                let dx = *a.d.as_ptr().add(tt[t] * nsb + sb);
                let bs = _mm256_loadu_si256(
                    a.bsums.as_ptr().add((tt[t] * nsb + sb) * 16) as *const __m256i
                );
                for r in 0..RK {
                    let km = &*mp[r].add(sb);
                    let sd = _mm512_set1_ps(km.d * dx);
                    acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[r][t]), sd, acc[r][t]);
                    let mn = _mm256_loadu_si256(km.mn.as_ptr() as *const __m256i);
                    let mi = _mm256_madd_epi16(mn, bs);
                    let sm = _mm256_set1_ps(km.dmin * dx);
                    accm[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mi), sm, accm[r][t]);
                }
            }
        }
        for r in 0..nr {
            for t in 0..NT {
                out[r * NT + t] = fold16(acc[r][t]) - fold8(accm[r][t]);
            }
        }
    }
}

/// Row quads × token quads of the quad tile.
pub(crate) const QR: usize = 4;
pub(crate) const QT: usize = 2;

/// The 32-value quad tile (see `q8::QuadTileFn`; safe wrapper, only reachable where VNNI
/// was detected): per block, each (row quad, token quad) register starts from the rows'
/// `−128 · Σw`, takes one `vpdpbusd` per 4-value group (weights broadcast to the four
/// 128-bit lanes, each token's group spread over its lane's four rows), then
/// `fma(cvt(sum), dw · dx, acc)`: each lane is one pair's `ref_pair32`.
pub(crate) fn quad_tile32(
    w: &QuadRows,
    rq0: usize,
    nrq: usize,
    a: &QuadActs,
    tq0: usize,
    ntq: usize,
    out: &mut [f32],
) {
    let cols = a.cols;
    let nb = cols / 32;
    assert!(
        (1..=QR).contains(&nrq) && (1..=QT).contains(&ntq),
        "tile shape"
    );
    assert!(w.w.len() >= (rq0 + nrq) * cols * 4 && w.dw.len() >= (rq0 + nrq) * nb * QUAD);
    assert!(w.init.len() >= (rq0 + nrq) * nb * QUAD && out.len() >= nrq * ntq * 16);
    assert!(a.a.len() >= (tq0 + ntq) * cols * 4 && a.dx.len() >= (tq0 + ntq) * nb * QUAD);
    // SAFETY: VNNI detected by the caller's table; every access is inside the checked
    // slices.
    unsafe {
        match (nrq, ntq) {
            (4, 2) => inner::<4, 2>(w, rq0, a, tq0, out),
            (4, _) => inner::<4, 1>(w, rq0, a, tq0, out),
            (3, 2) => inner::<3, 2>(w, rq0, a, tq0, out),
            (3, _) => inner::<3, 1>(w, rq0, a, tq0, out),
            (2, 2) => inner::<2, 2>(w, rq0, a, tq0, out),
            (2, _) => inner::<2, 1>(w, rq0, a, tq0, out),
            (_, 2) => inner::<1, 2>(w, rq0, a, tq0, out),
            _ => inner::<1, 1>(w, rq0, a, tq0, out),
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")]
    unsafe fn inner<const NR: usize, const NT: usize>(
        w: &QuadRows,
        rq0: usize,
        a: &QuadActs,
        tq0: usize,
        out: &mut [f32],
    ) {
        let cols = a.cols;
        let nb = cols / 32;
        // lane 4q + p takes element q: token q's group (or scale) for every row p
        let rep = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
        let z = _mm512_setzero_ps();
        let mut acc = [[z; NT]; NR];
        let wq: [*const i8; NR] = std::array::from_fn(|i| w.w.as_ptr().add((rq0 + i) * cols * 4));
        let aq: [*const u8; NT] = std::array::from_fn(|j| a.a.as_ptr().add((tq0 + j) * cols * 4));
        for b in 0..nb {
            let mut dx = [z; NT];
            for j in 0..NT {
                let p = a.dx.as_ptr().add(((tq0 + j) * nb + b) * QUAD);
                dx[j] = _mm512_permutexvar_ps(rep, _mm512_castps128_ps512(_mm_loadu_ps(p)));
            }
            let mut s = [[_mm512_setzero_si512(); NT]; NR];
            let mut dw = [z; NR];
            for i in 0..NR {
                let o = ((rq0 + i) * nb + b) * QUAD;
                dw[i] = _mm512_broadcast_f32x4(_mm_loadu_ps(w.dw.as_ptr().add(o)));
                let init = _mm512_broadcast_i32x4(_mm_loadu_si128(
                    w.init.as_ptr().add(o) as *const __m128i
                ));
                s[i] = [init; NT];
            }
            for g in 0..8 {
                let off = (8 * b + g) * 16;
                let mut av = [_mm512_setzero_si512(); NT];
                for j in 0..NT {
                    let v = _mm_loadu_si128(aq[j].add(off) as *const __m128i);
                    av[j] = _mm512_permutexvar_epi32(rep, _mm512_castsi128_si512(v));
                }
                for i in 0..NR {
                    let wv =
                        _mm512_broadcast_i32x4(_mm_loadu_si128(wq[i].add(off) as *const __m128i));
                    for j in 0..NT {
                        s[i][j] = _mm512_dpbusd_epi32(s[i][j], av[j], wv);
                    }
                }
            }
            for i in 0..NR {
                for j in 0..NT {
                    let sc = _mm512_mul_ps(dw[i], dx[j]);
                    acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[i][j]), sc, acc[i][j]);
                }
            }
        }
        for i in 0..NR {
            for j in 0..NT {
                _mm512_storeu_ps(out.as_mut_ptr().add((i * NT + j) * 16), acc[i][j]);
            }
        }
    }
}

/// Row quads × token quads of the K quad tile.
pub(crate) const QRK: usize = 2;
pub(crate) const QTK: usize = 2;

/// The K-quant quad tile (see `q8::QuadKTileFn`; safe wrapper, only reachable where VNNI
/// was detected): per 16-value sub-block, four `vpdpbusd` (unsigned `q` broadcast, each
/// token's signed group spread over its lane's rows) then `vpmulld` by the rows' scales
/// into the superblock's sum; the mins by one `vpdpwssd` per pair of sub-blocks; per
/// superblock two fmas: each lane is one pair's `ref_pair_k`.
pub(crate) fn quad_tile_k(
    w: &QuadKRows,
    rq0: usize,
    nrq: usize,
    a: &QuadKActs,
    tq0: usize,
    ntq: usize,
    out: &mut [f32],
) {
    let cols = a.cols;
    let nsb = cols / QK;
    assert!(
        (1..=QRK).contains(&nrq) && (1..=QTK).contains(&ntq),
        "tile shape"
    );
    assert!(w.q.len() >= (rq0 + nrq) * cols * 4 && w.d.len() >= (rq0 + nrq) * nsb * QUAD);
    assert!(w.sc.len() >= (rq0 + nrq) * nsb * 64 && w.mn.len() >= (rq0 + nrq) * nsb * 32);
    assert!(a.a.len() >= (tq0 + ntq) * cols * 4 && a.dx.len() >= (tq0 + ntq) * nsb * QUAD);
    assert!(a.bs.len() >= (tq0 + ntq) * nsb * 32 && out.len() >= nrq * ntq * 16);
    // SAFETY: as in `quad_tile32`.
    unsafe {
        match (nrq, ntq) {
            (2, 2) => inner::<2, 2>(w, rq0, a, tq0, out),
            (2, _) => inner::<2, 1>(w, rq0, a, tq0, out),
            (_, 2) => inner::<1, 2>(w, rq0, a, tq0, out),
            _ => inner::<1, 1>(w, rq0, a, tq0, out),
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")]
    unsafe fn inner<const NR: usize, const NT: usize>(
        w: &QuadKRows,
        rq0: usize,
        a: &QuadKActs,
        tq0: usize,
        out: &mut [f32],
    ) {
        let cols = a.cols;
        let nsb = cols / QK;
        let rep = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
        let zi = _mm512_setzero_si512();
        let z = _mm512_setzero_ps();
        let mut acc = [[z; NT]; NR];
        let mut accm = [[z; NT]; NR];
        let b4 = |p: *const i32| _mm512_broadcast_i32x4(_mm_loadu_si128(p as *const __m128i));
        let spread = |p: *const i32| {
            _mm512_permutexvar_epi32(
                rep,
                _mm512_castsi128_si512(_mm_loadu_si128(p as *const __m128i)),
            )
        };
        for sb in 0..nsb {
            let mut s = [[zi; NT]; NR];
            for j16 in 0..16 {
                let mut t = [[zi; NT]; NR];
                for g in 0..4 {
                    let off = (sb * 64 + j16 * 4 + g) * 16;
                    let mut av = [zi; NT];
                    for j in 0..NT {
                        av[j] = spread(a.a.as_ptr().add((tq0 + j) * cols * 4 + off) as *const i32);
                    }
                    for i in 0..NR {
                        let wv = b4(w.q.as_ptr().add((rq0 + i) * cols * 4 + off) as *const i32);
                        for j in 0..NT {
                            t[i][j] = _mm512_dpbusd_epi32(t[i][j], wv, av[j]);
                        }
                    }
                }
                for i in 0..NR {
                    let scv = b4(w
                        .sc
                        .as_ptr()
                        .add((((rq0 + i) * nsb + sb) * 16 + j16) * QUAD));
                    for j in 0..NT {
                        s[i][j] = _mm512_add_epi32(s[i][j], _mm512_mullo_epi32(t[i][j], scv));
                    }
                }
            }
            let mut mi = [[zi; NT]; NR];
            for jj in 0..8 {
                let mut bv = [zi; NT];
                for j in 0..NT {
                    bv[j] = spread(a.bs.as_ptr().add((((tq0 + j) * nsb + sb) * 8 + jj) * QUAD));
                }
                for i in 0..NR {
                    let mv = b4(w.mn.as_ptr().add((((rq0 + i) * nsb + sb) * 8 + jj) * QUAD));
                    for j in 0..NT {
                        mi[i][j] = _mm512_dpwssd_epi32(mi[i][j], mv, bv[j]);
                    }
                }
            }
            let mut dx = [z; NT];
            for j in 0..NT {
                let p = a.dx.as_ptr().add(((tq0 + j) * nsb + sb) * QUAD);
                dx[j] = _mm512_permutexvar_ps(rep, _mm512_castps128_ps512(_mm_loadu_ps(p)));
            }
            for i in 0..NR {
                let o = ((rq0 + i) * nsb + sb) * QUAD;
                let d = _mm512_broadcast_f32x4(_mm_loadu_ps(w.d.as_ptr().add(o)));
                let dm = _mm512_broadcast_f32x4(_mm_loadu_ps(w.dmin.as_ptr().add(o)));
                for j in 0..NT {
                    let sd = _mm512_mul_ps(d, dx[j]);
                    acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[i][j]), sd, acc[i][j]);
                    let sm = _mm512_mul_ps(dm, dx[j]);
                    accm[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mi[i][j]), sm, accm[i][j]);
                }
            }
        }
        for i in 0..NR {
            for j in 0..NT {
                let v = _mm512_sub_ps(acc[i][j], accm[i][j]);
                _mm512_storeu_ps(out.as_mut_ptr().add((i * NT + j) * 16), v);
            }
        }
    }
}
