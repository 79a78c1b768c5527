//! AVX-512 VNNI single-row dots of `--numerics q8` (decode): 16 weight rows at a time, read
//! as stored, against one activation row laid out by `quant::q8::vec::VecActs`.
//!
//! The batched path at this level (the quad tiles, `q8_avx512::quad_tile32` /
//! `quad_tile_k`) computes each (row, token) pair as `ref_pair32` / `ref_pair_k`: per block
//! (per superblock) in order, the exact integer sum, then one fma into a scalar accumulator.
//! These kernels keep that float order with one row per lane: per row, the block's integer
//! products land in the lanes of one register (`vpdpbusd` of the unpacked weights, made or
//! kept unsigned, with the signed activations; the K-quants through `vpmaddubsw` and
//! `vpdpwssd` with the sub-block scales), a transposing reduction of 16 rows' registers gives
//! one vector of 16 rows' block sums (integers: exact in any order), the unsigned offset is
//! taken off (`bias · Σa` per block), and `acc = fma(cvt(s), dw · dx, acc)` runs lane by
//! lane: each lane is its row's `ref_pair*`, bit for bit.
//!
//! Weight scales come by one 4-byte gather per block for the 16 rows (the f16 scale and the
//! bytes after it inside the block, so a gather never leaves the row).

// Register arrays are indexed by row: index loops say which is which.
#![allow(clippy::needless_range_loop)]
use crate::quant::q8::vec::{VecActs, VecLayout, VEC_ROWS};
use std::arch::x86_64::*;

/// Lane indices: the even (`E`) and odd (`O`) 32-bit lanes of two registers.
#[inline]
#[target_feature(enable = "avx512f")]
fn even_odd() -> (__m512i, __m512i) {
    let e: [i32; 16] = std::array::from_fn(|i| 2 * i as i32);
    let o: [i32; 16] = std::array::from_fn(|i| 2 * i as i32 + 1);
    // SAFETY: 64-byte reads of local arrays.
    unsafe {
        (
            _mm512_loadu_si512(e.as_ptr() as *const __m512i),
            _mm512_loadu_si512(o.as_ptr() as *const __m512i),
        )
    }
}

/// `[x's adjacent lane pairs summed (8 lanes), y's (8 lanes)]`.
#[inline]
#[target_feature(enable = "avx512f")]
fn comb(x: __m512i, y: __m512i, e: __m512i, o: __m512i) -> __m512i {
    _mm512_add_epi32(
        _mm512_permutex2var_epi32(x, e, y),
        _mm512_permutex2var_epi32(x, o, y),
    )
}

/// From 16 rows' registers, lanes 0–7 one sum (A), lanes 8–15 another (B): the vectors of
/// the 16 rows' A sums and B sums (integers, so the order of the additions is free).
#[inline]
#[target_feature(enable = "avx512f")]
fn reduce16(v: &[__m512i; VEC_ROWS]) -> (__m512i, __m512i) {
    let (e, o) = even_odd();
    let l1: [__m512i; 8] = std::array::from_fn(|i| comb(v[2 * i], v[2 * i + 1], e, o));
    let l2: [__m512i; 4] = std::array::from_fn(|i| comb(l1[2 * i], l1[2 * i + 1], e, o));
    let l3: [__m512i; 2] = std::array::from_fn(|i| comb(l2[2 * i], l2[2 * i + 1], e, o));
    // l3[h] lane 2j is row 8h + j's A, lane 2j + 1 its B
    (
        _mm512_permutex2var_epi32(l3[0], e, l3[1]),
        _mm512_permutex2var_epi32(l3[0], o, l3[1]),
    )
}

/// The 16 rows' f16 pairs at byte offset `off` of each row (`offs` the rows' offsets from
/// `base`), as 32-bit lanes (low half: the f16 at `off`).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn gather4(base: *const u8, offs: __m512i, off: usize) -> __m512i {
    let o = _mm512_add_epi32(offs, _mm512_set1_epi32(off as i32));
    _mm512_i32gather_epi32::<1>(o, base as *const _)
}

/// The f16 values in the low halves of `v`'s lanes, as f32.
#[inline]
#[target_feature(enable = "avx512f")]
fn f16_lo(v: __m512i) -> __m512 {
    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v))
}

/// The f16 values in the high halves of `v`'s lanes, as f32.
#[inline]
#[target_feature(enable = "avx512f")]
fn f16_hi(v: __m512i) -> __m512 {
    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(v)))
}

/// The checks shared by the wrappers (`bb` bytes per block of `be` values).
fn check(data: &[u8], rb: usize, r0: usize, nr: usize, a: &VecActs, bb: usize, be: usize) {
    assert!((1..=VEC_ROWS).contains(&nr), "row count");
    assert!(
        a.cols.is_multiple_of(be) && rb == a.cols / be * bb,
        "row bytes"
    );
    assert!(data.len() >= (r0 + nr) * rb, "rows inside the matrix");
    assert!(
        VEC_ROWS * rb <= i32::MAX as usize,
        "rows addressable by a gather"
    );
}

/// A 32-value type's wrapper (kernel `TY` 0: Q8_0, 1: Q4_0, 2: Q5_0).
macro_rules! wrapper32 {
    ($name:ident, $ty:literal, $bb:literal, $layout:expr) => {
        /// The single-row kernel of this type (safe wrapper; only reachable where VNNI was
        /// detected): see the module header.
        pub(crate) fn $name(
            data: &[u8],
            rb: usize,
            r0: usize,
            nr: usize,
            a: &VecActs,
            out: &mut [f32],
        ) {
            check(data, rb, r0, nr, a, $bb, 32);
            assert_eq!(a.layout, Some($layout), "activation layout");
            let nb = a.cols / 32;
            assert!(a.q.len() >= nb.div_ceil(2) * 64 && a.d.len() >= nb && a.sum.len() >= nb);
            assert!(out.len() >= nr);
            // SAFETY: VNNI detected by the caller's table; rows `r0..r0 + nr` are inside
            // `data` and every read stays inside its row (checked above).
            unsafe { inner32::<$ty, $bb>(data.as_ptr().add(r0 * rb), rb, nr, a, out) }
        }
    };
}

wrapper32!(rows_q8_0, 0, 34, VecLayout::Natural32);
wrapper32!(rows_q4_0, 1, 18, VecLayout::Natural32);
wrapper32!(rows_q5_0, 2, 22, VecLayout::Natural32);

/// Asks for the `len` bytes at `blk`'s offset in the next 16-row group (read by the next
/// call on this thread, rows `r0 + 16..`) to be brought into L1 while this group computes:
/// 16 rows read side by side defeat the hardware prefetcher (measured on the demo model's
/// Q8_0 LM head: 24 → 29 tok/s at 1 thread). A hint: it never faults, so the address may
/// lie past the matrix.
#[inline(always)]
unsafe fn prefetch_next_group(blk: *const u8, rb: usize, len: usize) {
    let next = blk.wrapping_add(VEC_ROWS * rb);
    let mut o = 0;
    while o < len {
        _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(o) as *const i8);
        o += 64;
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn inner32<const TY: u8, const BB: usize>(
    base: *const u8,
    rb: usize,
    nr: usize,
    a: &VecActs,
    out: &mut [f32],
) {
    let nb = a.cols / 32;
    let rows: [*const u8; VEC_ROWS] = std::array::from_fn(|r| base.add(r.min(nr - 1) * rb));
    let offs_a: [i32; VEC_ROWS] = std::array::from_fn(|r| (r.min(nr - 1) * rb) as i32);
    let offs = _mm512_loadu_si512(offs_a.as_ptr() as *const __m512i);
    let low4 = _mm512_set1_epi8(0x0F);
    // 16-bit shift counts: 0 in 128-bit lanes 0 and 2, 4 in lanes 1 and 3
    let f = 0x0004_0004_0004_0004;
    let nib_shift = _mm512_set_epi64(f, f, 0, 0, f, f, 0, 0);
    let sign = _mm512_set1_epi8(-128);
    let sixteen = _mm512_set1_epi8(0x10);
    // the unsigned offset of the stored values: w = u − bias
    let bias = [128, 8, 16][TY as usize];
    let mut acc = _mm512_setzero_ps();
    for p in 0..nb.div_ceil(2) {
        let (b0, two) = (2 * p, 2 * p + 1 < nb);
        let av = _mm512_loadu_si512(a.q.as_ptr().add(64 * p) as *const __m512i);
        let mut v = [_mm512_setzero_si512(); VEC_ROWS];
        for r in 0..VEC_ROWS {
            let blk = rows[r].add(BB * b0);
            // the next 16-row group's bytes at the same offset, read by the next call
            // (a hint: never faults, so the address may lie past the matrix)
            prefetch_next_group(blk, rb, 2 * BB);
            let u = if TY == 0 {
                let lo = _mm256_loadu_si256(blk.add(2) as *const __m256i);
                let hi = match two {
                    true => _mm256_loadu_si256(blk.add(BB + 2) as *const __m256i),
                    false => _mm256_setzero_si256(),
                };
                let w = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
                _mm512_xor_si512(w, sign)
            } else {
                let qo = if TY == 1 { 2 } else { 6 };
                // [qs_b, qs_b, qs_b1, qs_b1], low nibbles in lanes 0 and 2, high in 1 and 3:
                // each block's 32 values in element order
                let x0 = _mm256_broadcastsi128_si256(_mm_loadu_si128(blk.add(qo) as *const _));
                let x1 = match two {
                    true => _mm256_broadcastsi128_si256(_mm_loadu_si128(
                        blk.add(BB + qo) as *const __m128i
                    )),
                    false => _mm256_setzero_si256(),
                };
                let x = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(x0), x1);
                let u = _mm512_and_si512(_mm512_srlv_epi16(x, nib_shift), low4);
                if TY == 1 {
                    u
                } else {
                    // the fifth bits: element j of block b in bit j of its qh
                    let h0 = std::ptr::read_unaligned(blk.add(2) as *const u32) as u64;
                    let h1 = match two {
                        true => std::ptr::read_unaligned(blk.add(BB + 2) as *const u32) as u64,
                        false => 0,
                    };
                    _mm512_mask_add_epi8(u, h0 | (h1 << 32), u, sixteen)
                }
            };
            v[r] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, av);
        }
        let (sa, sb) = reduce16(&v);
        for (k, s) in [(0, sa), (1, sb)] {
            let b = b0 + k;
            if b >= nb {
                break;
            }
            let s = _mm512_sub_epi32(s, _mm512_set1_epi32(bias * *a.sum.get_unchecked(b)));
            let dw = f16_lo(gather4(base, offs, BB * b));
            let sc = _mm512_mul_ps(dw, _mm512_set1_ps(*a.d.get_unchecked(b)));
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), sc, acc);
        }
    }
    let mut o = [0f32; VEC_ROWS];
    _mm512_storeu_ps(o.as_mut_ptr(), acc);
    out[..nr].copy_from_slice(&o[..nr]);
}

/// A K-quant's wrapper (kernel `TY` 0: Q4_K, 1: Q6_K).
macro_rules! wrapper_k {
    ($name:ident, $ty:literal, $bb:literal, $layout:expr) => {
        /// The single-row kernel of this type (safe wrapper; only reachable where VNNI was
        /// detected): see the module header.
        pub(crate) fn $name(
            data: &[u8],
            rb: usize,
            r0: usize,
            nr: usize,
            a: &VecActs,
            out: &mut [f32],
        ) {
            check(data, rb, r0, nr, a, $bb, 256);
            assert_eq!(a.layout, Some($layout), "activation layout");
            let nsb = a.cols / 256;
            assert!(a.q.len() >= a.cols && a.d.len() >= nsb);
            assert!(a.bs16.len() >= nsb * 16 && a.bs32.len() >= nsb * 8 && out.len() >= nr);
            // SAFETY: as in the 32-value kernels.
            unsafe { inner_k::<$ty, $bb>(data.as_ptr().add(r0 * rb), rb, nr, a, out) }
        }
    };
}

wrapper_k!(rows_q4_k, 0, 144, VecLayout::NibbleK);
wrapper_k!(rows_q6_k, 1, 210, VecLayout::NaturalK);

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn inner_k<const TY: u8, const BB: usize>(
    base: *const u8,
    rb: usize,
    nr: usize,
    a: &VecActs,
    out: &mut [f32],
) {
    let nsb = a.cols / 256;
    let rows: [*const u8; VEC_ROWS] = std::array::from_fn(|r| base.add(r.min(nr - 1) * rb));
    let offs_a: [i32; VEC_ROWS] = std::array::from_fn(|r| (r.min(nr - 1) * rb) as i32);
    let offs = _mm512_loadu_si512(offs_a.as_ptr() as *const __m512i);
    let low4 = _mm512_set1_epi8(0x0F);
    let low2 = _mm512_set1_epi8(0x03);
    let bit45 = _mm512_set1_epi8(0x30);
    // i16 lane k of register c: the scale index of its two values
    let idx: [__m512i; 4] = std::array::from_fn(|c| {
        let v: [i16; 32] = std::array::from_fn(|k| match TY {
            // Q4_K: register c = 2h + (0 low nibbles, 1 high) holds 32-value sub-blocks
            // 4h + nib and 4h + 2 + nib
            0 => (4 * (c / 2) + c % 2 + 2 * (k / 16)) as i16,
            // Q6_K: register c holds elements 64c.., 16-value sub-blocks 4c + k / 8
            _ => (4 * c + k / 8) as i16,
        });
        _mm512_loadu_si512(v.as_ptr() as *const __m512i)
    });
    let mut acc = _mm512_setzero_ps();
    let mut accm = _mm512_setzero_ps();
    for sb in 0..nsb {
        let aq = a.q.as_ptr().add(256 * sb);
        let av: [__m512i; 4] =
            std::array::from_fn(|c| _mm512_loadu_si512(aq.add(64 * c) as *const __m512i));
        let mut v = [_mm512_setzero_si512(); VEC_ROWS];
        for r in 0..VEC_ROWS {
            let blk = rows[r].add(BB * sb);
            prefetch_next_group(blk, rb, BB);
            let mut s = _mm512_setzero_si512();
            let m = if TY == 0 {
                let w0 = std::ptr::read_unaligned(blk.add(4) as *const u32);
                let w1 = std::ptr::read_unaligned(blk.add(8) as *const u32);
                let w2 = std::ptr::read_unaligned(blk.add(12) as *const u32);
                let sc_hi = (w2 & 0x0F0F_0F0F) | ((w0 >> 2) & 0x3030_3030);
                let mn_hi = ((w2 >> 4) & 0x0F0F_0F0F) | ((w1 >> 2) & 0x3030_3030);
                let sc =
                    _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, sc_hi as i32, w0 as i32 & 0x3F3F_3F3F));
                let mn =
                    _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, mn_hi as i32, w1 as i32 & 0x3F3F_3F3F));
                let scz = _mm512_castsi128_si512(sc);
                for h in 0..2 {
                    let x = _mm512_loadu_si512(blk.add(16 + 64 * h) as *const __m512i);
                    let lo = _mm512_and_si512(x, low4);
                    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(x), low4);
                    let (c0, c1) = (2 * h, 2 * h + 1);
                    let p0 = _mm512_maddubs_epi16(lo, av[c0]);
                    s = _mm512_dpwssd_epi32(s, p0, _mm512_permutexvar_epi16(idx[c0], scz));
                    let p1 = _mm512_maddubs_epi16(hi, av[c1]);
                    s = _mm512_dpwssd_epi32(s, p1, _mm512_permutexvar_epi16(idx[c1], scz));
                }
                let bs = _mm_loadu_si128(a.bs32.as_ptr().add(8 * sb) as *const __m128i);
                _mm256_zextsi128_si256(_mm_madd_epi16(mn, bs))
            } else {
                let sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(blk.add(192) as *const __m128i));
                let scz = _mm512_castsi256_si512(sc);
                for h in 0..2 {
                    let ql = _mm512_loadu_si512(blk.add(64 * h) as *const __m512i);
                    let qh = _mm256_loadu_si256(blk.add(128 + 32 * h) as *const __m256i);
                    let hh = _mm512_inserti64x4::<1>(
                        _mm512_castsi256_si512(qh),
                        _mm256_srli_epi16::<2>(qh),
                    );
                    let z0 = _mm512_or_si512(
                        _mm512_and_si512(ql, low4),
                        _mm512_slli_epi16::<4>(_mm512_and_si512(hh, low2)),
                    );
                    let z1 = _mm512_or_si512(
                        _mm512_and_si512(_mm512_srli_epi16::<4>(ql), low4),
                        _mm512_and_si512(hh, bit45),
                    );
                    let (c0, c1) = (2 * h, 2 * h + 1);
                    let p0 = _mm512_maddubs_epi16(z0, av[c0]);
                    s = _mm512_dpwssd_epi32(s, p0, _mm512_permutexvar_epi16(idx[c0], scz));
                    let p1 = _mm512_maddubs_epi16(z1, av[c1]);
                    s = _mm512_dpwssd_epi32(s, p1, _mm512_permutexvar_epi16(idx[c1], scz));
                }
                // mins: 32 · sc per 16 values against the activations' sums of 16
                let bs = _mm256_loadu_si256(a.bs16.as_ptr().add(16 * sb) as *const __m256i);
                _mm256_madd_epi16(_mm256_slli_epi16::<5>(sc), bs)
            };
            let s8 = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64::<1>(s));
            v[r] = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(s8), m);
        }
        let (ss, mm) = reduce16(&v);
        let dx = _mm512_set1_ps(*a.d.get_unchecked(sb));
        let (d, dmin) = if TY == 0 {
            let g = gather4(base, offs, BB * sb);
            (f16_lo(g), f16_hi(g))
        } else {
            let d = f16_hi(gather4(base, offs, BB * sb + 206));
            (d, d)
        };
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ss), _mm512_mul_ps(d, dx), acc);
        accm = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mm), _mm512_mul_ps(dmin, dx), accm);
    }
    let mut o = [0f32; VEC_ROWS];
    _mm512_storeu_ps(o.as_mut_ptr(), _mm512_sub_ps(acc, accm));
    out[..nr].copy_from_slice(&o[..nr]);
}
