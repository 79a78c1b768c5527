//! AVX-512F kernels (with FMA and F16C). Accumulation: element `32k + j` of a row goes to
//! accumulator `j / 16`, lane `j % 16` (fused multiply-add); the reduction is
//! `acc0 + acc1`, then halves 256 → 128 → 64 → 32 bits. Blocks are decoded in registers
//! with the same roundings as the scalar decoders, so dequantization is exact and
//! `dot_f32(dequantized, x)` equals the fused dot bit for bit, for every type (Q8_0, Q4_0 and
//! Q5_0 included: their values `d * q` are decoded and multiplied into the accumulators like
//! the others', so a batch runs them through the f32 tile over dequantized rows).

use super::avx512_q32 as q32;
use super::common::{
    bit_matrix, dot_f32_as_row, dot_kernel, f16v, kernels, load16, mxfp4_values, no_tail,
    q4k_factors, q6k_factors,
};
use super::tile_avx512 as tile;
use crate::quant::scalar::{decode_bf16, decode_f16, decode_f32, e8m0_half};
use crate::quant::{LevelKernels, N_SLOTS};
use std::arch::x86_64::*;

type Acc = [__m512; 2];

/// Where a block decoder's values go when they are not stored: the accumulators of one
/// activation row (`Acc`, the fused dot's), or of several rows ([`Rows`]). `take` adds
/// `w0 · x[0..16]` and `w1 · x[16..32]` into them (one fused multiply-add per accumulator,
/// for each row in turn), so every row accumulates in the fused dot's order.
trait Sink {
    /// Accumulates 32 decoded values against the activations at `x` (of the first row).
    ///
    /// # Safety
    /// AVX-512F and FMA must be available; `x` (and, for [`Rows`], each later row at its
    /// stride) must be valid for 32 reads.
    unsafe fn take(&mut self, w0: __m512, w1: __m512, x: *const f32);
}

impl Sink for Acc {
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn take(&mut self, w0: __m512, w1: __m512, x: *const f32) {
        self[0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x), self[0]);
        self[1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x.add(16)), self[1]);
    }
}

/// The accumulators of `N` activation rows laid out by 32-element chunks (chunk `c` of row
/// `t` at `(c * N + t) * 32`, [`crate::quant::interleave_rows`]): a weight block decoded once is multiplied
/// into all of them. `base` is the block's first chunk (of row 0); the decoders hand `take`
/// `base + e` for the block's element `e` (a multiple of 32), found here at `base + e * N`, so
/// every load of a block is one pointer plus a constant (no index register).
struct Rows<const N: usize> {
    acc: [Acc; N],
    base: *const f32,
}

impl<const N: usize> Sink for Rows<N> {
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn take(&mut self, w0: __m512, w1: __m512, x: *const f32) {
        let e = (x as usize - self.base as usize) / 4;
        let c = self.base.add(e * N);
        for (t, a) in self.acc.iter_mut().enumerate() {
            a.take(w0, w1, c.add(32 * t));
        }
    }
}

/// Either stores the 32 decoded values at `dst` (`STORE`) or accumulates them against `x`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn emit<const STORE: bool>(
    w0: __m512,
    w1: __m512,
    x: *const f32,
    dst: *mut f32,
    acc: &mut impl Sink,
) {
    if STORE {
        _mm512_storeu_ps(dst, w0);
        _mm512_storeu_ps(dst.add(16), w1);
    } else {
        acc.take(w0, w1, x);
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn u8x16_to_i32(v: __m128i) -> __m512i {
    _mm512_cvtepu8_epi32(v)
}

#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn scaled(d: __m512, q: __m512i) -> __m512 {
    _mm512_mul_ps(d, _mm512_cvtepi32_ps(q))
}

#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn blk_f32<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut impl Sink) {
    let w0 = _mm512_loadu_ps(p as *const f32);
    let w1 = _mm512_loadu_ps(p.add(64) as *const f32);
    emit::<S>(w0, w1, x, dst, acc);
}

#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn blk_f16<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut impl Sink) {
    let w0 = _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i));
    let w1 = _mm512_cvtph_ps(_mm256_loadu_si256(p.add(32) as *const __m256i));
    emit::<S>(w0, w1, x, dst, acc);
}

#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn blk_bf16<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut impl Sink) {
    let h0 = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i));
    let h1 = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.add(32) as *const __m256i));
    let w0 = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(h0));
    let w1 = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(h1));
    emit::<S>(w0, w1, x, dst, acc);
}

#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn blk_q8_0<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut impl Sink) {
    let d = f16v(p);
    let q0 = _mm512_cvtepi8_epi32(load16(p.add(2)));
    let q1 = _mm512_cvtepi8_epi32(load16(p.add(18)));
    emit::<S>(scaled(d, q0), scaled(d, q1), x, dst, acc);
}

#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn blk_q4_0<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut impl Sink) {
    let d = f16v(p);
    let qs = load16(p.add(2));
    let m = _mm_set1_epi8(15);
    let eight = _mm512_set1_epi32(8);
    let lo = _mm512_sub_epi32(u8x16_to_i32(_mm_and_si128(qs, m)), eight);
    let hi = _mm512_sub_epi32(
        u8x16_to_i32(_mm_and_si128(_mm_srli_epi16::<4>(qs), m)),
        eight,
    );
    emit::<S>(scaled(d, lo), scaled(d, hi), x, dst, acc);
}

#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn blk_q5_0<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut impl Sink) {
    let d = f16v(p);
    let qh = (p.add(2) as *const u32).read_unaligned().to_le();
    let qs = load16(p.add(6));
    let m = _mm_set1_epi8(15);
    let b4 = _mm512_set1_epi32(16);
    let lo = u8x16_to_i32(_mm_and_si128(qs, m));
    let hi = u8x16_to_i32(_mm_and_si128(_mm_srli_epi16::<4>(qs), m));
    let lo = _mm512_sub_epi32(_mm512_mask_or_epi32(lo, qh as u16, lo, b4), b4);
    let hi = _mm512_sub_epi32(_mm512_mask_or_epi32(hi, (qh >> 16) as u16, hi, b4), b4);
    emit::<S>(scaled(d, lo), scaled(d, hi), x, dst, acc);
}

/// A Q4_0 / Q5_0 block from its integer values `q` (a GFNI decoder's): `d * q` per
/// element, as `scaled` computes it from the plain decoders' integers.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn emit_q32<const S: bool>(
    q: q32::Q,
    p: *const u8,
    x: *const f32,
    dst: *mut f32,
    acc: &mut impl Sink,
) {
    let d = f16v(p);
    emit::<S>(_mm512_mul_ps(d, q[0]), _mm512_mul_ps(d, q[1]), x, dst, acc);
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c,gfni")]
unsafe fn blk_q4_0_gfni<const S: bool>(
    p: *const u8,
    x: *const f32,
    dst: *mut f32,
    acc: &mut impl Sink,
) {
    emit_q32::<S>(q32::q_q4_0_gfni(p), p, x, dst, acc);
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c,gfni")]
unsafe fn blk_q5_0_gfni<const S: bool>(
    p: *const u8,
    x: *const f32,
    dst: *mut f32,
    acc: &mut impl Sink,
) {
    emit_q32::<S>(q32::q_q5_0_gfni(p), p, x, dst, acc);
}

/// Q4_K: each 32-element sub-block `r` has at most 16 distinct values
/// `d * sc[r] * q - dmin * m[r]` (`q` a nibble); they are computed once into a 16-lane table
/// (same roundings as the scalar decoder) and looked up with `vpermps`, which reads only the
/// low 4 bits of each 32-bit index.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn blk_q4_k<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut impl Sink) {
    let (ds, ms) = q4k_factors(p);
    let iota = _mm512_setr_ps(
        0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
    );
    for g in 0..4 {
        let b0 = u8x16_to_i32(load16(p.add(16 + 32 * g)));
        let b1 = u8x16_to_i32(load16(p.add(32 + 32 * g)));
        for h in 0..2 {
            let r = 2 * g + h;
            let t = _mm512_sub_ps(
                _mm512_mul_ps(_mm512_set1_ps(ds[r]), iota),
                _mm512_set1_ps(ms[r]),
            );
            let (i0, i1) = if h == 0 {
                (b0, b1)
            } else {
                (_mm512_srli_epi32::<4>(b0), _mm512_srli_epi32::<4>(b1))
            };
            let w0 = _mm512_permutexvar_ps(i0, t);
            let w1 = _mm512_permutexvar_ps(i1, t);
            emit::<S>(
                w0,
                w1,
                x.wrapping_add(32 * r),
                dst.wrapping_add(32 * r),
                acc,
            );
        }
    }
}

/// 16 Q6_K values (before the -32 offset) of chunk `c` of a half.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn q6_chunk(ql: *const u8, qh: *const u8, c: usize) -> __m512i {
    let l = u8x16_to_i32(load16(ql.add(16 * (c & 3))));
    let h = u8x16_to_i32(load16(qh.add(16 * (c & 1))));
    let l = _mm512_srl_epi32(l, _mm_cvtsi32_si128(4 * (c >> 2) as i32));
    let h = _mm512_srl_epi32(h, _mm_cvtsi32_si128(2 * (c >> 1) as i32));
    let l = _mm512_and_si512(l, _mm512_set1_epi32(15));
    let h = _mm512_and_si512(h, _mm512_set1_epi32(3));
    _mm512_or_si512(l, _mm512_slli_epi32::<4>(h))
}

#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn blk_q6_k<const S: bool>(p: *const u8, x: *const f32, dst: *mut f32, acc: &mut impl Sink) {
    let f = q6k_factors(p);
    let off = _mm512_set1_epi32(32);
    for h in 0..2 {
        let ql = p.add(64 * h);
        let qh = p.add(128 + 32 * h);
        for c in (0..8).step_by(2) {
            let q0 = _mm512_sub_epi32(q6_chunk(ql, qh, c), off);
            let q1 = _mm512_sub_epi32(q6_chunk(ql, qh, c + 1), off);
            let w0 = scaled(_mm512_set1_ps(f[8 * h + c]), q0);
            let w1 = scaled(_mm512_set1_ps(f[8 * h + c + 1]), q1);
            let e = 128 * h + 16 * c;
            emit::<S>(w0, w1, x.wrapping_add(e), dst.wrapping_add(e), acc);
        }
    }
}

/// GF(2) affine matrices (see `common::bit_matrix`) for Q6_K: a nibble alone, and
/// the two high bits at `2 k, 2 k + 1` moved to bit 4 and bits 5..8 (with constant 0xE0,
/// `16 b0 + 32 (b1 - 1)` as i8), so `nibble | high` is `q - 32`.
const Q6_NIB: [i64; 2] = [
    bit_matrix([0, 1, 2, 3, 8, 8, 8, 8]),
    bit_matrix([4, 5, 6, 7, 8, 8, 8, 8]),
];
const Q6_HIGH: [i64; 4] = [
    bit_matrix([8, 8, 8, 8, 0, 1, 1, 1]),
    bit_matrix([8, 8, 8, 8, 2, 3, 3, 3]),
    bit_matrix([8, 8, 8, 8, 4, 5, 5, 5]),
    bit_matrix([8, 8, 8, 8, 6, 7, 7, 7]),
];

/// 16 Q6_K values `q - 32` of chunk `c` of a half, decoded by GF(2) affine maps.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c,gfni")]
unsafe fn q6_chunk_gfni(ql: *const u8, qh: *const u8, c: usize) -> __m512i {
    let l = load16(ql.add(16 * (c & 3)));
    let h = load16(qh.add(16 * (c & 1)));
    let l = _mm_gf2p8affine_epi64_epi8::<0>(l, _mm_set1_epi64x(Q6_NIB[c >> 2]));
    let h = _mm_gf2p8affine_epi64_epi8::<0xE0>(h, _mm_set1_epi64x(Q6_HIGH[c >> 1]));
    _mm512_cvtepi8_epi32(_mm_or_si128(l, h))
}

/// Q6_K with GFNI decoding: same values and order as `blk_q6_k`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c,gfni")]
unsafe fn blk_q6_k_gfni<const S: bool>(
    p: *const u8,
    x: *const f32,
    dst: *mut f32,
    acc: &mut impl Sink,
) {
    let f = q6k_factors(p);
    for h in 0..2 {
        let ql = p.add(64 * h);
        let qh = p.add(128 + 32 * h);
        for c in (0..8).step_by(2) {
            let w0 = scaled(_mm512_set1_ps(f[8 * h + c]), q6_chunk_gfni(ql, qh, c));
            let w1 = scaled(
                _mm512_set1_ps(f[8 * h + c + 1]),
                q6_chunk_gfni(ql, qh, c + 1),
            );
            let e = 128 * h + 16 * c;
            emit::<S>(w0, w1, x.wrapping_add(e), dst.wrapping_add(e), acc);
        }
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn blk_mxfp4<const S: bool>(
    p: *const u8,
    x: *const f32,
    dst: *mut f32,
    acc: &mut impl Sink,
) {
    let d = _mm512_set1_ps(e8m0_half(*p));
    let (lo, hi) = mxfp4_values(load16(p.add(1)));
    let w0 = scaled(d, _mm512_cvtepi8_epi32(lo));
    let w1 = scaled(d, _mm512_cvtepi8_epi32(hi));
    emit::<S>(w0, w1, x, dst, acc);
}

kernels!(avx512; dot_f32row, deq_f32, blk_f32, 4, 1, 4, decode_f32);
kernels!(avx512; dot_f16, deq_f16, blk_f16, 2, 1, 2, decode_f16);
kernels!(avx512; dot_bf16, deq_bf16, blk_bf16, 2, 1, 2, decode_bf16);
dot_kernel!(avx512 "avx512f,avx2,fma,f16c,gfni";
    dot_q6_k_gfni, blk_q6_k_gfni, 210, 256, 0, no_tail);
kernels!(avx512; dot_q8_0, deq_q8_0, blk_q8_0, 34, 32, 0, no_tail);
kernels!(avx512; dot_q4_0, deq_q4_0, blk_q4_0, 18, 32, 0, no_tail);
kernels!(avx512; dot_q5_0, deq_q5_0, blk_q5_0, 22, 32, 0, no_tail);
dot_kernel!(avx512 "avx512f,avx512bw,avx512vl,avx2,fma,f16c,gfni";
    dot_q4_0_gfni, blk_q4_0_gfni, 18, 32, 0, no_tail);
dot_kernel!(avx512 "avx512f,avx512bw,avx512vl,avx2,fma,f16c,gfni";
    dot_q5_0_gfni, blk_q5_0_gfni, 22, 32, 0, no_tail);
kernels!(avx512; dot_q4_k, deq_q4_k, blk_q4_k, 144, 256, 0, no_tail);
kernels!(avx512; dot_q6_k, deq_q6_k, blk_q6_k, 210, 256, 0, no_tail);
kernels!(avx512; dot_mxfp4, deq_mxfp4, blk_mxfp4, 17, 32, 0, no_tail);

/// The reductions of `N` activation rows' accumulator pairs, each `finish_avx512`'s tree
/// (`acc0 + acc1`, then halves 256 → 128 → 64 → 32 bits, the same additions in the same
/// order), so each value equals the fused dot's bit for bit. From 4 rows on they run
/// transposed: 8 rows' vectors (zeros past `N`) are halved together, two rows per register
/// at the first level and four at the second, 16 additions and 16 shuffles for all 8 rows
/// instead of 8 of each per row.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn finish_rows<const N: usize>(acc: &[Acc; N]) -> [f32; N] {
    if N < 4 {
        return std::array::from_fn(|t| super::common::finish_avx512(&acc[t]));
    }
    let v: [__m512; 8] = std::array::from_fn(|t| {
        if t < N {
            _mm512_add_ps(acc[t][0], acc[t][1])
        } else {
            _mm512_setzero_ps()
        }
    });
    // lanes i + (i + 8): rows 2k and 2k + 1 in the low and high 256 bits
    let half = |a: __m512, b: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b),
        )
    };
    let (w01, w23, w45, w67) = (
        half(v[0], v[1]),
        half(v[2], v[3]),
        half(v[4], v[5]),
        half(v[6], v[7]),
    );
    // i + (i + 4): 128-bit lane k holds row k (of rows 0..4, or 4..8)
    let quarter = |a: __m512, b: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
        )
    };
    let (u0, u4) = (quarter(w01, w23), quarter(w45, w67));
    // i + (i + 2) within each 128-bit lane k: [row k: 0, 1 | row k + 4: 0, 1]
    let z = _mm512_add_ps(
        _mm512_shuffle_ps::<0b01_00_01_00>(u0, u4),
        _mm512_shuffle_ps::<0b11_10_11_10>(u0, u4),
    );
    // 0 + 1: lane 4k holds row k, lane 4k + 1 row k + 4
    let r = _mm512_add_ps(
        _mm512_shuffle_ps::<0b10_00_10_00>(z, z),
        _mm512_shuffle_ps::<0b11_01_11_01>(z, z),
    );
    let mut o = [0f32; 16];
    _mm512_storeu_ps(o.as_mut_ptr(), r);
    std::array::from_fn(|t| o[4 * (t % 4) + t / 4])
}

/// Defines `$name(w, x, xi, n, y, ys)`, a [`crate::quant::DotRowsFn`]: for each stored row `i`
/// of `w` and each of the `n` (1 to [`MAX_ROWS`]) activation rows `t` of `x`,
/// `y[t * ys + i]` = the fused dot (`dot_kernel!` over the same block decoder `$blk`) bit for
/// bit. Each block is decoded once and multiplied into every activation row's accumulators
/// ([`Rows`]), each row's accumulation, tail and reduction being the fused dot's (the
/// reductions of all rows together, [`finish_rows`]); the rows of `w` are walked in one loop,
/// with the fused dot's prefetch running on across them.
macro_rules! rows_kernel {
    ($feat:literal; $name:ident, $blk:ident, $bb:expr, $be:expr, $esz:expr, $tail:expr) => {
        unsafe fn $name(w: &[u8], x: &[f32], xi: &[f32], n: usize, y: *mut f32, ys: usize) {
            #[target_feature(enable = $feat)]
            unsafe fn inner<const N: usize>(
                w: &[u8],
                x: &[f32],
                xi: &[f32],
                rb: usize,
                y: *mut f32,
                ys: usize,
            ) {
                use crate::quant::ROUND;
                let cols = x.len() / N;
                const STEP: (usize, usize) = super::common::walk_step($bb, $be, $esz);
                let (bb, be) = STEP;
                let nb = cols / be;
                let done = nb * be;
                let xp = xi.as_ptr();
                for (i, row) in w.chunks_exact(rb).enumerate() {
                    let mut acc = Rows::<N> {
                        acc: [[_mm512_setzero_ps(); 2]; N],
                        base: xp,
                    };
                    let p = row.as_ptr();
                    for b in 0..nb {
                        // the fused dot's prefetch (see `dot_kernel!`)
                        super::common::prefetch_block(
                            p.wrapping_add(b * bb + super::common::PF),
                            bb,
                        );
                        acc.base = xp.add(b * be * N);
                        $blk::<false>(p.add(b * bb), acc.base, std::ptr::null_mut(), &mut acc);
                    }
                    let mut tw = [0f32; ROUND];
                    if done < cols {
                        let t: fn(&[u8], &mut [f32]) = $tail;
                        t(&row[done * $esz..], &mut tw[..cols - done]);
                    }
                    let f = finish_rows(&acc.acc);
                    for (t, &f) in f.iter().enumerate() {
                        let mut tail = 0f32;
                        for (k, &xv) in x[t * cols + done..(t + 1) * cols].iter().enumerate() {
                            tail += tw[k] * xv;
                        }
                        *y.add(t * ys + i) = f + tail;
                    }
                }
            }
            assert!((1..=MAX_ROWS).contains(&n) && x.len() % n == 0, "{n} rows");
            let cols = x.len() / n;
            let rb = if $be == 1 {
                cols * $esz
            } else {
                cols / $be * $bb
            };
            crate::quant::check_len(rb, cols, $bb, $be);
            assert!(
                rb > 0 && w.len() % rb == 0,
                "{} bytes of {rb}-byte rows",
                w.len()
            );
            assert!(xi.len() >= n * (cols / 32) * 32, "interleaved rows");
            // SAFETY: as for the fused dots (`dot_kernel!`): the table holding this function
            // is handed out only after detection of the features; reads stay inside `w`
            // (whole rows of the checked length), `x` (`n` rows of the checked length) and
            // `xi` (their whole chunks, checked);
            // the writes are the caller's promise (`DotRowsFn`).
            unsafe {
                match n {
                    1 => inner::<1>(w, x, xi, rb, y, ys),
                    2 => inner::<2>(w, x, xi, rb, y, ys),
                    3 => inner::<3>(w, x, xi, rb, y, ys),
                    4 => inner::<4>(w, x, xi, rb, y, ys),
                    5 => inner::<5>(w, x, xi, rb, y, ys),
                    6 => inner::<6>(w, x, xi, rb, y, ys),
                    7 => inner::<7>(w, x, xi, rb, y, ys),
                    _ => inner::<8>(w, x, xi, rb, y, ys),
                }
            }
        }
    };
}

/// Most activation rows a multi-row dot ([`crate::quant::DotRowsFn`]) takes: 8 rows × 2
/// accumulators leave 16 of the 32 vector registers to the block decoders.
pub(crate) const MAX_ROWS: usize = 8;

rows_kernel!("avx512f,avx2,fma,f16c"; rows_f32, blk_f32, 4, 1, 4, decode_f32);
rows_kernel!("avx512f,avx2,fma,f16c"; rows_f16, blk_f16, 2, 1, 2, decode_f16);
rows_kernel!("avx512f,avx2,fma,f16c"; rows_bf16, blk_bf16, 2, 1, 2, decode_bf16);
rows_kernel!("avx512f,avx2,fma,f16c"; rows_q8_0, blk_q8_0, 34, 32, 0, no_tail);
rows_kernel!("avx512f,avx2,fma,f16c"; rows_q4_0, blk_q4_0, 18, 32, 0, no_tail);
rows_kernel!("avx512f,avx2,fma,f16c"; rows_q5_0, blk_q5_0, 22, 32, 0, no_tail);
rows_kernel!("avx512f,avx512bw,avx512vl,avx2,fma,f16c,gfni";
    rows_q4_0_gfni, blk_q4_0_gfni, 18, 32, 0, no_tail);
rows_kernel!("avx512f,avx512bw,avx512vl,avx2,fma,f16c,gfni";
    rows_q5_0_gfni, blk_q5_0_gfni, 22, 32, 0, no_tail);
rows_kernel!("avx512f,avx2,fma,f16c"; rows_q4_k, blk_q4_k, 144, 256, 0, no_tail);
rows_kernel!("avx512f,avx2,fma,f16c"; rows_q6_k, blk_q6_k, 210, 256, 0, no_tail);
rows_kernel!("avx512f,avx2,fma,f16c,gfni"; rows_q6_k_gfni, blk_q6_k_gfni, 210, 256, 0, no_tail);
rows_kernel!("avx512f,avx2,fma,f16c"; rows_mxfp4, blk_mxfp4, 17, 32, 0, no_tail);

// The low-bit types' dots and dequantization (`EXT_TYPES` order): the AVX2 level's
// in-register block decoders (256-bit registers), accumulated in this level's 16 lanes.
use super::lowbit_tables::{AVX512_DEQ as EXT_DEQ, AVX512_DOT as EXT_DOT};

/// f32 · f32 in this level's order (F32 rows are the same computation).
fn dot_f32(w: &[f32], x: &[f32]) -> f32 {
    dot_f32_as_row(dot_f32row, w, x)
}

/// The AVX-512 table without GFNI (e.g. Skylake-SP). Only returned by `level_kernels`
/// after detection.
pub(crate) static KERNELS: LevelKernels = BASE;

/// The AVX-512 table with GFNI decoding for Q4_0, Q5_0 and Q6_K: the same values and
/// accumulation order as [`KERNELS`], so results are identical bit for bit.
pub(crate) static KERNELS_GFNI: LevelKernels = LevelKernels {
    dot: crate::quant::join(
        [
            dot_f32row,
            dot_f16,
            dot_bf16,
            dot_q8_0,
            dot_q4_0_gfni,
            dot_q5_0_gfni,
            dot_q4_k,
            dot_q6_k_gfni,
            dot_mxfp4,
        ],
        EXT_DOT,
    ),
    dot_rows: crate::quant::join(
        [
            Some(rows_f32),
            Some(rows_f16),
            Some(rows_bf16),
            Some(rows_q8_0),
            Some(rows_q4_0_gfni),
            Some(rows_q5_0_gfni),
            Some(rows_q4_k),
            Some(rows_q6_k_gfni),
            Some(rows_mxfp4),
        ],
        [None; crate::quant::N_EXT],
    ),
    ..BASE
};

/// The plain AVX-512 kernels: every type's dot is `dot_f32` over its dequantized row, so
/// there are no prepared rows and batches run the f32 tile.
const BASE: LevelKernels = LevelKernels {
    dot: crate::quant::join(
        [
            dot_f32row, dot_f16, dot_bf16, dot_q8_0, dot_q4_0, dot_q5_0, dot_q4_k, dot_q6_k,
            dot_mxfp4,
        ],
        EXT_DOT,
    ),
    deq: crate::quant::join(
        [
            deq_f32, deq_f16, deq_bf16, deq_q8_0, deq_q4_0, deq_q5_0, deq_q4_k, deq_q6_k, deq_mxfp4,
        ],
        EXT_DEQ,
    ),
    dot_f32,
    prep: [None; N_SLOTS],
    f32_tile: tile::F32_TILE,
    prep_tile: None,
    dot_rows: crate::quant::join(
        [
            Some(rows_f32),
            Some(rows_f16),
            Some(rows_bf16),
            Some(rows_q8_0),
            Some(rows_q4_0),
            Some(rows_q5_0),
            Some(rows_q4_k),
            Some(rows_q6_k),
            Some(rows_mxfp4),
        ],
        [None; crate::quant::N_EXT],
    ),
};
