//! The lossy `--numerics q8` path: activations quantized to 8 bits per block and integer dot
//! products, as llama.cpp's CPU backend computes (ggml-cpu `quantize_row_q8_0` /
//! `quantize_row_q8_K` and the `vec_dot_*_q8_*` kernels; our own implementation).
//!
//! - **Activations** ([`Q8Acts`]): a 32-value block type's activations become Q8_0 blocks
//!   (`d = amax / 127` rounded to f16 as ggml stores it, `q = round(x · 127 / amax)` with
//!   ties to even, as ggml's x86 quantizer); a K-quant's become Q8_K blocks of 256
//!   (`iscale = −127 / x_max` for the value `x_max` of largest magnitude, `q = min(127,
//!   round(iscale · x))`, `d = 1 / iscale` in f32, and the sums of each 16 `q`).
//! - **Weights** are *prepared* once per matrix panel into one byte per element: the
//!   32-value types as signed integers `w` with one f32 scale per block (`value = d · w`,
//!   [`Prep32`]); the K-quants as unsigned integers `q` with, per 256, f32 `d`, `dmin` and
//!   i16 scales and mins per 16 values (`value = d · sc · q − dmin · mn`, [`KMeta`]).
//! - **Dots** sum integer products exactly; the float order is fixed per lane width `W`
//!   (8 for AVX2 and the scalar level, 16 for AVX-512 VNNI) and written out by the scalar
//!   references [`ref_tile32`] / [`ref_tile_k`], which every SIMD tile equals bit for bit.
//!
//! Float order of one (row, token) dot at lane width `W`, chunks of `4W` elements:
//! - 32-value types: lane `j` of chunk `c` takes block `b = c · W/8 + j / 8`; its integer sum
//!   `s` over the chunk's elements `4j..4j+4` enters as `acc[j] = fma(s, dw[b] · dx[b],
//!   acc[j])` (a block past the row's end enters as `fma(0, 0, acc[j])`); the result is
//!   [`fold`]`(acc)`.
//! - K-quants: per superblock, lane `j` sums `sc · q · a` over elements `4j..4j+4` of every
//!   chunk in integers (`S[j]`), then `acc[j] = fma(S[j], d · dx, acc[j])`; the mins enter
//!   as 8 lanes `M[j] = mn[2j] · bsum[2j] + mn[2j+1] · bsum[2j+1]`, `accm[j] = fma(M[j],
//!   dmin · dx, accm[j])`; the result is `fold(acc) − fold(accm)`.

use super::scalar::{f16_at, q4k_scales};
use super::GgmlType;

/// Prepares one encoded row of a 32-value block type: signed integers (`w`, one per element)
/// and block scales (`d`, one per 32).
pub(crate) type Prep32 = fn(src: &[u8], w: &mut [i8], d: &mut [f32]);
/// Prepares one encoded K-quant row: unsigned integers (`q`, one per element) and one
/// [`KMeta`] per 256.
pub(crate) type PrepK = fn(src: &[u8], q: &mut [u8], m: &mut [KMeta]);

/// How a weight type enters the q8 path.
#[derive(Clone, Copy)]
pub(crate) enum IntPlan {
    B32(Prep32),
    K(PrepK),
}

impl IntPlan {
    /// The activation format the plan's dots take.
    pub(crate) fn act_format(self) -> ActFormat {
        match self {
            IntPlan::B32(_) => ActFormat::Q8_0,
            IntPlan::K(_) => ActFormat::Q8K,
        }
    }
}

/// The q8 plan of `ty`, or `None` when the type keeps the exact path (float types and the
/// types without integer preparation).
pub(crate) fn int_plan(ty: GgmlType) -> Option<IntPlan> {
    Some(match ty {
        GgmlType::Q8_0 => IntPlan::B32(prep_q8_0),
        GgmlType::Q4_0 => IntPlan::B32(prep_q4_0),
        GgmlType::Q5_0 => IntPlan::B32(prep_q5_0),
        GgmlType::MXFP4 => IntPlan::B32(prep_mxfp4),
        GgmlType::Q4_K => IntPlan::K(prep_q4_k),
        GgmlType::Q5_K => IntPlan::K(prep_q5_k),
        GgmlType::Q6_K => IntPlan::K(prep_q6_k),
        _ => return None,
    })
}

/// Q8_0 weights: `w = q`, `d` the block's f16.
fn prep_q8_0(src: &[u8], w: &mut [i8], d: &mut [f32]) {
    for ((b, wb), db) in src.chunks_exact(34).zip(w.chunks_exact_mut(32)).zip(d) {
        *db = f16_at(b);
        for (o, &q) in wb.iter_mut().zip(&b[2..34]) {
            *o = q as i8;
        }
    }
}

/// Q4_0 weights: `w = q − 8` (low nibbles elements 0..16, high 16..32).
fn prep_q4_0(src: &[u8], w: &mut [i8], d: &mut [f32]) {
    for ((b, wb), db) in src.chunks_exact(18).zip(w.chunks_exact_mut(32)).zip(d) {
        *db = f16_at(b);
        let (lo, hi) = wb.split_at_mut(16);
        for ((l, h), &q) in lo.iter_mut().zip(hi).zip(&b[2..18]) {
            *l = (q & 15) as i8 - 8;
            *h = (q >> 4) as i8 - 8;
        }
    }
}

/// Q5_0 weights: `w = q − 16`, the fifth bit of element `j` in bit `j` of `qh`.
fn prep_q5_0(src: &[u8], w: &mut [i8], d: &mut [f32]) {
    for ((b, wb), db) in src.chunks_exact(22).zip(w.chunks_exact_mut(32)).zip(d) {
        *db = f16_at(b);
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        let (lo, hi) = wb.split_at_mut(16);
        for (j, ((l, h), &q)) in lo.iter_mut().zip(hi).zip(&b[6..22]).enumerate() {
            *l = ((q & 15) | ((((qh >> j) & 1) as u8) << 4)) as i8 - 16;
            *h = ((q >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4)) as i8 - 16;
        }
    }
}

/// MXFP4 weights: the doubled E2M1 values, `d` the halved E8M0 scale.
fn prep_mxfp4(src: &[u8], w: &mut [i8], d: &mut [f32]) {
    use super::scalar::{e8m0_half, MXFP4_VALUES};
    for ((b, wb), db) in src.chunks_exact(17).zip(w.chunks_exact_mut(32)).zip(d) {
        *db = e8m0_half(b[0]);
        let (lo, hi) = wb.split_at_mut(16);
        for ((l, h), &q) in lo.iter_mut().zip(hi).zip(&b[1..17]) {
            *l = MXFP4_VALUES[(q & 15) as usize];
            *h = MXFP4_VALUES[(q >> 4) as usize];
        }
    }
}

/// Q4_K weights: nibbles, each 32-value sub-block's 6-bit scale and min on both its 16s.
fn prep_q4_k(src: &[u8], q: &mut [u8], m: &mut [KMeta]) {
    for ((b, qb), mb) in src.chunks_exact(144).zip(q.chunks_exact_mut(QK)).zip(m) {
        let (sc, mn) = q4k_scales(&b[4..16]);
        *mb = k_meta(f16_at(b), f16_at(&b[2..]), &sc, &mn);
        for r in 0..8 {
            let qs = &b[16 + 32 * (r / 2)..][..32];
            let shift = 4 * (r & 1);
            for (o, &v) in qb[32 * r..32 * r + 32].iter_mut().zip(qs) {
                *o = (v >> shift) & 15;
            }
        }
    }
}

/// Q5_K weights: as Q4_K with the fifth bit `(qh[l] >> r) & 1`.
fn prep_q5_k(src: &[u8], q: &mut [u8], m: &mut [KMeta]) {
    for ((b, qb), mb) in src.chunks_exact(176).zip(q.chunks_exact_mut(QK)).zip(m) {
        let (sc, mn) = q4k_scales(&b[4..16]);
        *mb = k_meta(f16_at(b), f16_at(&b[2..]), &sc, &mn);
        let qh = &b[16..48];
        for r in 0..8 {
            let qs = &b[48 + 32 * (r / 2)..][..32];
            let shift = 4 * (r & 1);
            for ((o, &v), &h) in qb[32 * r..32 * r + 32].iter_mut().zip(qs).zip(qh) {
                *o = ((v >> shift) & 15) | (((h >> r) & 1) << 4);
            }
        }
    }
}

/// The [`KMeta`] of a 32-value-sub-block type: each sub-block's scale and min on both of
/// its 16s.
fn k_meta(d: f32, dmin: f32, sc: &[u8; 8], mn: &[u8; 8]) -> KMeta {
    KMeta {
        sc: std::array::from_fn(|s| sc[s / 2] as i16),
        mn: std::array::from_fn(|s| mn[s / 2] as i16),
        d,
        dmin,
    }
}

/// Q6_K weights: `q` in 0..64, `value = d · sc · (q − 32)`, so `mn = 32 · sc` and `dmin = d`.
fn prep_q6_k(src: &[u8], q: &mut [u8], m: &mut [KMeta]) {
    for ((b, qb), mb) in src.chunks_exact(210).zip(q.chunks_exact_mut(QK)).zip(m) {
        let d = f16_at(&b[208..]);
        // sub-block s = 8h + c covers elements 128h + 16c.. (see scalar::decode_q6_k)
        let sc: [i16; 16] = std::array::from_fn(|s| b[192 + s] as i8 as i16);
        *mb = KMeta {
            sc,
            mn: std::array::from_fn(|s| 32 * sc[s]),
            d,
            dmin: d,
        };
        for h in 0..2 {
            let ql = &b[64 * h..];
            let qh = &b[128 + 32 * h..];
            for c in 0..8 {
                let lo = &ql[16 * (c & 3)..][..16];
                let hi = &qh[16 * (c & 1)..][..16];
                let (ns, hs) = (4 * (c >> 2), 2 * (c >> 1));
                let out = &mut qb[128 * h + 16 * c..][..16];
                for k in 0..16 {
                    out[k] = ((lo[k] >> ns) & 15) | (((hi[k] >> hs) & 3) << 4);
                }
            }
        }
    }
}

/// The fixed reduction of `W` lanes: halves added lane by lane (`a[i] += a[i + h]` for
/// `h = W/2, W/4, …, 1`), as the SIMD reductions extract and add.
pub(crate) fn fold<const W: usize>(mut a: [f32; W]) -> f32 {
    let mut h = W / 2;
    while h >= 1 {
        for i in 0..h {
            a[i] += a[i + h];
        }
        h /= 2;
    }
    a[0]
}

/// The scalar reference of the 32-value tile at lane width `W` (see the module header):
/// `out[r * nt + t]` for prepared rows `w`/`d` (`nr` rows) and activation rows `t0..t0+nt`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn ref_tile32<const W: usize>(
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
    let bpc = W / 8;
    for r in 0..nr {
        let (wr, dr) = (&w[r * cols..][..cols], &d[r * nb..][..nb]);
        for t in 0..nt {
            let qa = &a.qs[(t0 + t) * cols..][..cols];
            let da = &a.d[(t0 + t) * nb..][..nb];
            let mut acc = [0f32; W];
            for c in 0..nb.div_ceil(bpc) {
                for (j, av) in acc.iter_mut().enumerate() {
                    let b = c * bpc + j / 8;
                    if b >= nb {
                        *av = 0f32.mul_add(0.0, *av);
                        continue;
                    }
                    let e = b * 32 + 4 * (j % 8);
                    let s: i32 = (0..4).map(|i| wr[e + i] as i32 * qa[e + i] as i32).sum();
                    *av = (s as f32).mul_add(dr[b] * da[b], *av);
                }
            }
            out[r * nt + t] = fold(acc);
        }
    }
}

/// The scalar reference of the K-quant tile at lane width `W` (see the module header).
#[allow(clippy::too_many_arguments)]
pub(crate) fn ref_tile_k<const W: usize>(
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
    for r in 0..nr {
        let (qr, mr) = (&q[r * cols..][..cols], &m[r * nsb..][..nsb]);
        for t in 0..nt {
            let qa = &a.qs[(t0 + t) * cols..][..cols];
            let mut acc = [0f32; W];
            let mut accm = [0f32; 8];
            for (sb, km) in mr.iter().enumerate() {
                let dx = a.d[(t0 + t) * nsb + sb];
                let bs = &a.bsums[((t0 + t) * nsb + sb) * 16..][..16];
                let mut s = [0i32; W];
                for c in 0..QK / (4 * W) {
                    for (j, sv) in s.iter_mut().enumerate() {
                        let e = sb * QK + c * 4 * W + 4 * j;
                        let sub = (e % QK) / 16;
                        let p: i32 = (0..4).map(|i| qr[e + i] as i32 * qa[e + i] as i32).sum();
                        *sv += km.sc[sub] as i32 * p;
                    }
                }
                for (av, &sv) in acc.iter_mut().zip(&s) {
                    *av = (sv as f32).mul_add(km.d * dx, *av);
                }
                for (j, av) in accm.iter_mut().enumerate() {
                    let mj = km.mn[2 * j] as i32 * bs[2 * j] as i32
                        + km.mn[2 * j + 1] as i32 * bs[2 * j + 1] as i32;
                    *av = (mj as f32).mul_add(km.dmin * dx, *av);
                }
            }
            out[r * nt + t] = fold(acc) - fold(accm);
        }
    }
}

/// A 32-value tile: `out[r * nt + t]` = the dot of prepared row `r` (`w`, `d`) with
/// activation row `t0 + t` of `a`; `1 <= nr <= rows`, `1 <= nt <= tokens` of its shape.
pub(crate) type Tile32Fn =
    fn(w: &[i8], d: &[f32], nr: usize, a: &Q8Acts, t0: usize, nt: usize, out: &mut [f32]);
/// A K-quant tile, as [`Tile32Fn`] over prepared K rows (`q`, `m`).
pub(crate) type TileKFn =
    fn(q: &[u8], m: &[KMeta], nr: usize, a: &Q8Acts, t0: usize, nt: usize, out: &mut [f32]);

/// One level's integer tiles and their largest shapes (rows, tokens).
#[derive(Clone, Copy)]
pub(crate) struct IntKernels {
    /// Lane width of the level's float order (8 or 16).
    #[cfg_attr(not(test), allow(dead_code))]
    pub lanes: usize,
    pub tile32: Tile32Fn,
    pub shape32: (usize, usize),
    pub tile_k: TileKFn,
    pub shape_k: (usize, usize),
    /// The quad tile of the 32-value types and its shape (row quads, token quads), where
    /// the level has one: it replaces `tile32` (float order [`ref_pair32`]).
    pub quad32: Option<(QuadTileFn, (usize, usize))>,
    /// The quad tile of the K-quants and its shape, where the level has one: it replaces
    /// `tile_k` (float order [`ref_pair_k`]).
    pub quad_k: Option<(QuadKTileFn, (usize, usize))>,
}

/// The integer tiles at `level`: AVX-512 with VNNI (`avx512vnni`) runs lane width 16, AVX2
/// (and AVX-512 without VNNI) lane width 8, every other level the scalar references at lane
/// width 8 (NEON has no integer tiles yet). Panics if `level` is unavailable.
pub(crate) fn int_kernels(level: super::SimdLevel) -> IntKernels {
    use super::SimdLevel;
    assert!(
        level.is_available(),
        "SIMD level {level:?} is not available"
    );
    #[cfg(target_arch = "x86_64")]
    {
        use super::x86::{q8_avx2, q8_avx512};
        if level == SimdLevel::Avx512 && is_x86_feature_detected!("avx512vnni") {
            return IntKernels {
                lanes: 16,
                tile32: q8_avx512::tile32,
                shape32: (q8_avx512::R32, q8_avx512::T32),
                tile_k: q8_avx512::tile_k,
                shape_k: (q8_avx512::RK, q8_avx512::TK),
                quad32: Some((q8_avx512::quad_tile32, (q8_avx512::QR, q8_avx512::QT))),
                quad_k: Some((q8_avx512::quad_tile_k, (q8_avx512::QRK, q8_avx512::QTK))),
            };
        }
        if level >= SimdLevel::Avx2 {
            return IntKernels {
                lanes: 8,
                tile32: q8_avx2::tile32,
                shape32: (q8_avx2::R, q8_avx2::T),
                tile_k: q8_avx2::tile_k,
                shape_k: (q8_avx2::R, q8_avx2::T),
                quad32: None,
                quad_k: None,
            };
        }
    }
    let _ = level;
    IntKernels {
        lanes: 8,
        tile32: ref_tile32::<8>,
        shape32: (2, 4),
        tile_k: ref_tile_k::<8>,
        shape_k: (2, 4),
        quad32: None,
        quad_k: None,
    }
}

pub(crate) mod acts;
pub(crate) mod quad;
pub(crate) mod vec;
pub(crate) use acts::*;
pub(crate) use quad::*;

/// The single-row kernel of `ty` at `level` and the activation layout it reads, where the
/// level has one whose outputs equal its batched path's ([`matmul_q8`](crate::backend::cpu)
/// for 2 or more tokens) bit for bit: AVX-512 with VNNI, Q8_0 / Q4_0 / Q5_0 / Q4_K / Q6_K
/// (the quad tiles' order, [`ref_pair32`] / [`ref_pair_k`]). `None` elsewhere: those
/// single-token products run the batched path's tiles with one token.
pub(crate) fn vec_kernel(
    level: super::SimdLevel,
    ty: GgmlType,
) -> Option<(vec::VecLayout, vec::VecRowsFn)> {
    #[cfg(target_arch = "x86_64")]
    {
        use super::x86::q8_vec_avx512 as v;
        use vec::VecLayout as L;
        if level == super::SimdLevel::Avx512 && is_x86_feature_detected!("avx512vnni") {
            return Some(match ty {
                GgmlType::Q8_0 => (L::Natural32, v::rows_q8_0),
                GgmlType::Q4_0 => (L::Natural32, v::rows_q4_0),
                GgmlType::Q5_0 => (L::Natural32, v::rows_q5_0),
                GgmlType::Q4_K => (L::NibbleK, v::rows_q4_k),
                GgmlType::Q6_K => (L::NaturalK, v::rows_q6_k),
                _ => return None,
            });
        }
    }
    let _ = (level, ty);
    None
}

/// The multi-row kernel of `ty` at `level` (16 weight rows against 1 to [`vec::MULTI_ACTS`]
/// activation rows) and the activation layout it reads, where the level has one: AVX-512
/// with VNNI and BITALG, Q8_0 / Q4_0 / Q5_0 ([`vec::VecLayout::Natural32`]) and Q4_K / Q6_K
/// ([`vec::VecLayout::NaturalK`]) (`quant::x86::q8_multi_avx512`). Each output equals
/// [`vec_kernel`]'s for its activation row alone, bit for bit. `None` elsewhere.
pub(crate) fn multi_kernel(
    level: super::SimdLevel,
    ty: GgmlType,
) -> Option<(vec::VecLayout, vec::MultiRowsFn)> {
    #[cfg(target_arch = "x86_64")]
    {
        use super::x86::q8_multi_avx512 as m;
        use vec::VecLayout as L;
        if level == super::SimdLevel::Avx512
            && is_x86_feature_detected!("avx512vnni")
            && is_x86_feature_detected!("avx512bitalg")
        {
            return match ty {
                GgmlType::Q8_0 => Some((L::Natural32, m::multi_q8_0)),
                GgmlType::Q4_0 => Some((L::Natural32, m::multi_q4_0)),
                GgmlType::Q5_0 => Some((L::Natural32, m::multi_q5_0)),
                GgmlType::Q4_K => Some((L::NaturalK, m::multi_q4_k)),
                GgmlType::Q6_K => Some((L::NaturalK, m::multi_q6_k)),
                _ => None,
            };
        }
    }
    let _ = (level, ty);
    None
}
