//! AVX-512 VNNI multi-row dots of `--numerics q8` (a few sequences decoded together): 16
//! weight rows, read as stored, against 1 to [`MULTI_ACTS`] activation rows laid out by
//! `quant::q8::vec::VecActs` (`Natural32`), for the 32-value types Q8_0, Q4_0 and Q5_0.
//!
//! The single-row kernels (`q8_vec_avx512`) put one weight row's block in a register's lanes
//! and pay a transposing reduction of 16 rows' registers per block and per activation row;
//! with several activation rows that reduction is most of the work. Here the transposition is
//! done once on the weights instead and shared by every activation row: each block of the 16
//! rows is loaded, made unsigned (`w + bias`) and transposed into 8 registers `W_k` whose lane
//! `r` holds row `r`'s values `4k .. 4k + 4` (four bytes). For activation row `t`, block `b`,
//! `vpdpbusd(W_k, broadcast(a_t[32b + 4k ..][..4]))` over `k` leaves each row's exact integer
//! block sum in its own lane (integers: any order gives the same sum), the unsigned offset is
//! taken off (`bias · Σa`), and `acc_t = fma(cvt(s), dw · dx, acc_t)` runs lane by lane per
//! block in order: the float order of `ref_pair32`, as the single-row kernels and the quad
//! tiles keep it, so every output equals theirs bit for bit.
//!
//! Weight scales (and Q5_0's fifth bits) come by one 4-byte gather per block for the 16 rows,
//! as in the single-row kernels.

// Register arrays are indexed by row or activation: index loops say which is which.
#![allow(clippy::needless_range_loop)]
use crate::quant::q8::vec::{VecActs, VecLayout, MULTI_ACTS, VEC_ROWS};
use std::arch::x86_64::*;

/// The 16 rows' 4 bytes at byte offset `off` of each row (`offs`: the rows' offsets from
/// `base`), one row per 32-bit lane.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn gather4(base: *const u8, offs: __m512i, off: usize) -> __m512i {
    let o = _mm512_add_epi32(offs, _mm512_set1_epi32(off as i32));
    _mm512_i32gather_epi32::<1>(o, base as *const _)
}

/// Asks for the `len` bytes at offset `off` of the next 16-row group's rows (read by the next
/// call on this thread) to be brought into L1 while this group computes: 16 rows read side
/// by side defeat the hardware prefetcher (as in `q8_vec_avx512`). A hint: it never faults,
/// so the addresses may lie past the matrix.
#[inline(always)]
unsafe fn prefetch_next_group(rows: &[*const u8; VEC_ROWS], rb: usize, off: usize, len: usize) {
    for r in rows {
        let next = r.wrapping_add(VEC_ROWS * rb + off);
        let mut o = 0;
        while o < len {
            _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(o) as *const i8);
            o += 64;
        }
    }
}

/// `z[i]` = `[row i's 8 dwords, row i + 8's 8 dwords]` → `W_k` (lane `r`: row `r`'s dword
/// `k`), by 4×4 transposes inside the 128-bit lanes and one two-source permute per output.
#[inline]
#[target_feature(enable = "avx512f")]
fn transpose_16x8(z: &[__m512i; 8]) -> [__m512i; 8] {
    // u[g][j], 128-bit lane q: rows (4g .. 4g + 4) of [z's lane q]'s dword j
    let t4 = |a: &[__m512i]| -> [__m512i; 4] {
        let t0 = _mm512_unpacklo_epi32(a[0], a[1]);
        let t1 = _mm512_unpackhi_epi32(a[0], a[1]);
        let t2 = _mm512_unpacklo_epi32(a[2], a[3]);
        let t3 = _mm512_unpackhi_epi32(a[2], a[3]);
        [
            _mm512_unpacklo_epi64(t0, t2),
            _mm512_unpackhi_epi64(t0, t2),
            _mm512_unpacklo_epi64(t1, t3),
            _mm512_unpackhi_epi64(t1, t3),
        ]
    };
    let (u, v) = (t4(&z[..4]), t4(&z[4..]));
    // lanes of u[j]: [rows 0-3 dword j, rows 0-3 dword 4 + j, rows 8-11 dword j, rows 8-11
    // dword 4 + j]; v[j] likewise for rows 4-7 and 12-15
    let lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    let hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    std::array::from_fn(|k| {
        let (a, b) = (u[k % 4], v[k % 4]);
        _mm512_permutex2var_epi64(a, if k < 4 { lo } else { hi }, b)
    })
}

/// The 32 bytes at `off` of the 16 rows, transposed: register `k`, lane `r`, holds row `r`'s
/// bytes `4k .. 4k + 4`.
#[inline]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn load_t32(rows: &[*const u8; VEC_ROWS], off: usize) -> [__m512i; 8] {
    let z: [__m512i; 8] = std::array::from_fn(|i| {
        let lo = _mm256_loadu_si256(rows[i].add(off) as *const __m256i);
        let hi = _mm256_loadu_si256(rows[i + 8].add(off) as *const __m256i);
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
    });
    transpose_16x8(&z)
}

/// `z[i]` = `[row i's 4 dwords, row i + 4's, row i + 8's, row i + 12's]` → `W_j` (lane `r`:
/// row `r`'s dword `j`), by 4×4 transposes inside the 128-bit lanes.
#[inline]
#[target_feature(enable = "avx512f")]
fn transpose_16x4(z: &[__m512i; 4]) -> [__m512i; 4] {
    let t0 = _mm512_unpacklo_epi32(z[0], z[1]);
    let t1 = _mm512_unpackhi_epi32(z[0], z[1]);
    let t2 = _mm512_unpacklo_epi32(z[2], z[3]);
    let t3 = _mm512_unpackhi_epi32(z[2], z[3]);
    [
        _mm512_unpacklo_epi64(t0, t2),
        _mm512_unpackhi_epi64(t0, t2),
        _mm512_unpacklo_epi64(t1, t3),
        _mm512_unpackhi_epi64(t1, t3),
    ]
}

/// A 32-value type's wrapper (kernel `TY` 0: Q8_0, 1: Q4_0, 2: Q5_0).
macro_rules! wrapper32 {
    ($name:ident, $ty:literal, $bb:literal) => {
        /// The multi-row kernel of this type (safe wrapper; only reachable where VNNI was
        /// detected): see the module header.
        pub(crate) fn $name(
            data: &[u8],
            rb: usize,
            r0: usize,
            nr: usize,
            acts: &[VecActs],
            out: &mut [f32],
        ) {
            assert!((1..=VEC_ROWS).contains(&nr), "row count");
            assert!((1..=MULTI_ACTS).contains(&acts.len()), "activation rows");
            let cols = acts[0].cols;
            assert!(
                cols.is_multiple_of(32) && rb == cols / 32 * $bb,
                "row bytes"
            );
            assert!(data.len() >= (r0 + nr) * rb, "rows inside the matrix");
            assert!(
                VEC_ROWS * rb <= i32::MAX as usize,
                "rows addressable by a gather"
            );
            let nb = cols / 32;
            for a in acts {
                assert_eq!(a.layout, Some(VecLayout::Natural32), "activation layout");
                assert!(a.cols == cols && a.q.len() >= 32 * nb);
                assert!(a.d.len() >= nb && a.sum.len() >= nb);
            }
            assert!(out.len() >= VEC_ROWS * acts.len());
            let base = data[r0 * rb..].as_ptr();
            // SAFETY: VNNI detected by the caller's table; rows `r0..r0 + nr` are inside
            // `data` and every read stays inside its row (checked above); the activations
            // hold `nb` blocks.
            unsafe {
                match acts.len() {
                    1 => inner32::<$ty, $bb, 1>(base, rb, nr, acts, out),
                    2 => inner32::<$ty, $bb, 2>(base, rb, nr, acts, out),
                    3 => inner32::<$ty, $bb, 3>(base, rb, nr, acts, out),
                    4 => inner32::<$ty, $bb, 4>(base, rb, nr, acts, out),
                    5 => inner32::<$ty, $bb, 5>(base, rb, nr, acts, out),
                    6 => inner32::<$ty, $bb, 6>(base, rb, nr, acts, out),
                    7 => inner32::<$ty, $bb, 7>(base, rb, nr, acts, out),
                    _ => inner32::<$ty, $bb, 8>(base, rb, nr, acts, out),
                }
            }
        }
    };
}

wrapper32!(multi_q8_0, 0, 34);
wrapper32!(multi_q4_0, 1, 18);
wrapper32!(multi_q5_0, 2, 22);

/// The 16 rows' block at byte `blk_off` as 8 registers `W_k` of unsigned values `w + bias`
/// (lane `r`: row `r`'s values `4k .. 4k + 4`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512bitalg,avx2")]
unsafe fn block_regs<const TY: u8>(
    rows: &[*const u8; VEC_ROWS],
    blk_off: usize,
    qh: __m512i,
) -> [__m512i; 8] {
    if TY == 0 {
        let sign = _mm512_set1_epi8(-128);
        return load_t32(rows, blk_off + 2).map(|w| _mm512_xor_si512(w, sign));
    }
    let qo = if TY == 1 { 2 } else { 6 };
    let z: [__m512i; 4] = std::array::from_fn(|i| {
        let l = |g: usize| _mm_loadu_si128(rows[i + 4 * g].add(blk_off + qo) as *const __m128i);
        let v = _mm512_castsi128_si512(l(0));
        let v = _mm512_inserti32x4::<1>(v, l(1));
        let v = _mm512_inserti32x4::<2>(v, l(2));
        _mm512_inserti32x4::<3>(v, l(3))
    });
    // q[j], lane r: row r's bytes qs[4j .. 4j + 4]: elements 4j.. (low nibbles) and
    // 16 + 4j.. (high nibbles)
    let q = transpose_16x4(&z);
    let low4 = _mm512_set1_epi8(0x0F);
    let mut w: [__m512i; 8] = std::array::from_fn(|k| {
        let s = q[k % 4];
        if k < 4 {
            _mm512_and_si512(s, low4)
        } else {
            _mm512_and_si512(_mm512_srli_epi16::<4>(s), low4)
        }
    });
    if TY == 2 {
        // the fifth bits: element e of row r is bit e of lane r of `qh`; byte i of lane r
        // in W_k is element 4k + i (bit 4k + i, or 32 + 4k + i of the lane pair's qword)
        let sixteen = _mm512_set1_epi8(0x10);
        for k in 0..8 {
            let ctl: [u8; 64] = std::array::from_fn(|j| {
                let (lane, i) = (j / 4, j % 4);
                (32 * (lane % 2) + 4 * k + i) as u8
            });
            let ctl = _mm512_loadu_si512(ctl.as_ptr() as *const __m512i);
            let m = _mm512_bitshuffle_epi64_mask(qh, ctl);
            w[k] = _mm512_mask_add_epi8(w[k], m, w[k], sixteen);
        }
    }
    w
}

#[target_feature(
    enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bitalg,avx2,fma,f16c"
)]
unsafe fn inner32<const TY: u8, const BB: usize, const N: usize>(
    base: *const u8,
    rb: usize,
    nr: usize,
    acts: &[VecActs],
    out: &mut [f32],
) {
    let nb = acts[0].cols / 32;
    let rows: [*const u8; VEC_ROWS] = std::array::from_fn(|r| base.add(r.min(nr - 1) * rb));
    let offs_a: [i32; VEC_ROWS] = std::array::from_fn(|r| (r.min(nr - 1) * rb) as i32);
    let offs = _mm512_loadu_si512(offs_a.as_ptr() as *const __m512i);
    // the unsigned offset of the values in the registers: w = u − bias
    let bias = [128, 8, 16][TY as usize];
    let mut acc = [_mm512_setzero_ps(); N];
    // the activations' arrays, read straight (no bounds or struct loads in the loop)
    let aq: [*const u8; N] = std::array::from_fn(|t| acts[t].q.as_ptr() as *const u8);
    let asum: [*const i32; N] = std::array::from_fn(|t| acts[t].sum.as_ptr());
    let ad: [*const f32; N] = std::array::from_fn(|t| acts[t].d.as_ptr());
    for b in 0..nb {
        // one line per row at every block (Q8_0: 34 bytes) or every other (Q4_0, Q5_0: two
        // blocks are at most 44 bytes), so every line of the next group's rows is asked for
        if BB > 32 || b % 2 == 0 {
            prefetch_next_group(&rows, rb, BB * b, 1);
        }
        let g = gather4(base, offs, BB * b);
        let qh = if TY == 2 {
            gather4(base, offs, BB * b + 2)
        } else {
            _mm512_setzero_si512()
        };
        let w = block_regs::<TY>(&rows, BB * b, qh);
        let dw = f16_lo(g);
        for t in 0..N {
            let ap = aq[t].add(32 * b) as *const i32;
            let x = |k: usize| _mm512_set1_epi32(ap.add(k).read_unaligned());
            // two chains of four (integers: the order is free)
            let mut s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], x(0));
            let mut s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], x(1));
            for k in (2..8).step_by(2) {
                s0 = _mm512_dpbusd_epi32(s0, w[k], x(k));
                s1 = _mm512_dpbusd_epi32(s1, w[k + 1], x(k + 1));
            }
            let s = _mm512_sub_epi32(
                _mm512_add_epi32(s0, s1),
                _mm512_set1_epi32(bias * *asum[t].add(b)),
            );
            let sc = _mm512_mul_ps(dw, _mm512_set1_ps(*ad[t].add(b)));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), sc, acc[t]);
        }
    }
    for t in 0..N {
        _mm512_storeu_ps(out.as_mut_ptr().add(VEC_ROWS * t), acc[t]);
    }
}

/// A K-quant's wrapper (kernel `TY` 0: Q4_K, 1: Q6_K).
macro_rules! wrapper_k {
    ($name:ident, $ty:literal, $bb:literal) => {
        /// The multi-row kernel of this type (safe wrapper; only reachable where VNNI was
        /// detected): see [`inner_k`].
        pub(crate) fn $name(
            data: &[u8],
            rb: usize,
            r0: usize,
            nr: usize,
            acts: &[VecActs],
            out: &mut [f32],
        ) {
            assert!((1..=VEC_ROWS).contains(&nr), "row count");
            assert!((1..=MULTI_ACTS).contains(&acts.len()), "activation rows");
            let cols = acts[0].cols;
            assert!(
                cols.is_multiple_of(256) && rb == cols / 256 * $bb,
                "row bytes"
            );
            assert!(data.len() >= (r0 + nr) * rb, "rows inside the matrix");
            assert!(
                VEC_ROWS * rb <= i32::MAX as usize,
                "rows addressable by a gather"
            );
            let nsb = cols / 256;
            for a in acts {
                assert_eq!(a.layout, Some(VecLayout::NaturalK), "activation layout");
                assert!(a.cols == cols && a.q.len() >= cols && a.d.len() >= nsb);
                assert!(a.bs16.len() >= 16 * nsb && a.bs32.len() >= 8 * nsb);
            }
            assert!(out.len() >= VEC_ROWS * acts.len());
            let base = data[r0 * rb..].as_ptr();
            // SAFETY: as in the 32-value kernels.
            unsafe {
                match acts.len() {
                    1 => inner_k::<$ty, $bb, 1>(base, rb, nr, acts, out),
                    2 => inner_k::<$ty, $bb, 2>(base, rb, nr, acts, out),
                    3 => inner_k::<$ty, $bb, 3>(base, rb, nr, acts, out),
                    4 => inner_k::<$ty, $bb, 4>(base, rb, nr, acts, out),
                    5 => inner_k::<$ty, $bb, 5>(base, rb, nr, acts, out),
                    6 => inner_k::<$ty, $bb, 6>(base, rb, nr, acts, out),
                    7 => inner_k::<$ty, $bb, 7>(base, rb, nr, acts, out),
                    _ => inner_k::<$ty, $bb, 8>(base, rb, nr, acts, out),
                }
            }
        }
    };
}

wrapper_k!(multi_q4_k, 0, 144);
wrapper_k!(multi_q6_k, 1, 210);

/// One superblock of the 16 rows (byte `blk` of each) staged for every activation row:
/// `buf[g]`, lane `r`, holds row `r`'s values `4g .. 4g + 4` (element order, unsigned: Q4_K's
/// nibbles, Q6_K's `q` before its −32); `sc[j]` the sub-blocks' scales (Q4_K: 8 of 32
/// values, 6 bits; Q6_K: 16 of 16 values, signed), one i32 per lane; `mp[i]` the pairs of
/// sub-blocks `2i, 2i + 1` as two i16 per lane that multiply the activations' sums of those
/// sub-blocks (Q4_K: the mins; Q6_K: `32 · sc`, its offset); and the superblock's `d` and
/// `dmin` (Q6_K: `d` twice).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c")]
unsafe fn stage_k<const TY: u8>(
    base: *const u8,
    offs: __m512i,
    rows: &[*const u8; VEC_ROWS],
    blk: usize,
    buf: &mut [__m512i; 64],
    sc: &mut [__m512i; 16],
    mp: &mut [__m512i; 8],
) -> (__m512, __m512) {
    let low4 = _mm512_set1_epi8(0x0F);
    let byte = _mm512_set1_epi32(0xFF);
    if TY == 0 {
        for g in 0..4 {
            let q = load_t32(rows, blk + 16 + 32 * g);
            for k in 0..8 {
                buf[16 * g + k] = _mm512_and_si512(q[k], low4);
                buf[16 * g + 8 + k] = _mm512_and_si512(_mm512_srli_epi16::<4>(q[k]), low4);
            }
        }
        let g0 = gather4(base, offs, blk + 4);
        let g1 = gather4(base, offs, blk + 8);
        let g2 = gather4(base, offs, blk + 12);
        let m6 = _mm512_set1_epi32(0x3F3F_3F3F);
        let m4 = _mm512_set1_epi32(0x0F0F_0F0F);
        let m45 = _mm512_set1_epi32(0x3030_3030);
        let sc_lo = _mm512_and_si512(g0, m6);
        let sc_hi = _mm512_or_si512(
            _mm512_and_si512(g2, m4),
            _mm512_and_si512(_mm512_srli_epi32::<2>(g0), m45),
        );
        let mn_lo = _mm512_and_si512(g1, m6);
        let mn_hi = _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi32::<4>(g2), m4),
            _mm512_and_si512(_mm512_srli_epi32::<2>(g1), m45),
        );
        for j in 0..8 {
            let src = if j < 4 { sc_lo } else { sc_hi };
            let sh = _mm_cvtsi32_si128(8 * (j % 4) as i32);
            sc[j] = _mm512_and_si512(_mm512_srl_epi32(src, sh), byte);
        }
        for i in 0..4 {
            let src = if i < 2 { mn_lo } else { mn_hi };
            let x = _mm512_srl_epi32(src, _mm_cvtsi32_si128(16 * (i % 2) as i32));
            mp[i] = _mm512_or_si512(
                _mm512_and_si512(x, byte),
                _mm512_and_si512(_mm512_slli_epi32::<8>(x), _mm512_set1_epi32(0xFF_0000)),
            );
        }
        let g = gather4(base, offs, blk);
        (f16_lo(g), f16_hi(g))
    } else {
        let m2 = _mm512_set1_epi8(0x30);
        for h in 0..2 {
            let ta = load_t32(rows, blk + 64 * h);
            let tb = load_t32(rows, blk + 64 * h + 32);
            let tc = load_t32(rows, blk + 128 + 32 * h);
            for k in 0..8 {
                let (a, b, c) = (ta[k], tb[k], tc[k]);
                let lo = |v: __m512i| _mm512_and_si512(v, low4);
                let hi = |v: __m512i| _mm512_and_si512(_mm512_srli_epi16::<4>(v), low4);
                let e = 32 * h + k;
                buf[e] = _mm512_or_si512(lo(a), _mm512_and_si512(_mm512_slli_epi16::<4>(c), m2));
                buf[e + 8] =
                    _mm512_or_si512(lo(b), _mm512_and_si512(_mm512_slli_epi16::<2>(c), m2));
                buf[e + 16] = _mm512_or_si512(hi(a), _mm512_and_si512(c, m2));
                buf[e + 24] =
                    _mm512_or_si512(hi(b), _mm512_and_si512(_mm512_srli_epi16::<2>(c), m2));
            }
        }
        for i in 0..4 {
            let g = gather4(base, offs, blk + 192 + 4 * i);
            for b in 0..4 {
                let up = _mm_cvtsi32_si128(24 - 8 * b as i32);
                sc[4 * i + b] = _mm512_srai_epi32::<24>(_mm512_sll_epi32(g, up));
            }
        }
        for i in 0..8 {
            mp[i] = _mm512_or_si512(
                _mm512_and_si512(_mm512_slli_epi32::<5>(sc[2 * i]), _mm512_set1_epi32(0xFFFF)),
                _mm512_slli_epi32::<21>(sc[2 * i + 1]),
            );
        }
        let d = f16_hi(gather4(base, offs, blk + 206));
        (d, d)
    }
}

/// The K-quants' multi-row kernel. Per superblock the 16 rows are staged once ([`stage_k`]);
/// then per activation row, each sub-block's exact integer sum `p_j` (lane by lane, as in
/// the 32-value kernels) times its scale, summed over the superblock (`ss`, an exact
/// integer), and the offsets' exact sum `mm` (`Σ m_j · Σa_j`; Q6_K: `Σ 32 sc_j · Σa_j`), then
/// `acc = fma(cvt(ss), d · dx, acc)` and `accm = fma(cvt(mm), dmin · dx, accm)` per
/// superblock in order, `acc − accm` at the end: the single-row kernel's float order
/// (`q8_vec_avx512::inner_k`, `ref_pair_k`), so every output equals its value bit for bit.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn inner_k<const TY: u8, const BB: usize, const N: usize>(
    base: *const u8,
    rb: usize,
    nr: usize,
    acts: &[VecActs],
    out: &mut [f32],
) {
    let nsb = acts[0].cols / 256;
    let rows: [*const u8; VEC_ROWS] = std::array::from_fn(|r| base.add(r.min(nr - 1) * rb));
    let offs_a: [i32; VEC_ROWS] = std::array::from_fn(|r| (r.min(nr - 1) * rb) as i32);
    let offs = _mm512_loadu_si512(offs_a.as_ptr() as *const __m512i);
    // sub-blocks per superblock and groups of four values per sub-block
    let (nsub, per) = if TY == 0 { (8, 8) } else { (16, 4) };
    let mut acc = [_mm512_setzero_ps(); N];
    let mut accm = [_mm512_setzero_ps(); N];
    let mut buf = [_mm512_setzero_si512(); 64];
    let mut sc = [_mm512_setzero_si512(); 16];
    let mut mp = [_mm512_setzero_si512(); 8];
    for sb in 0..nsb {
        prefetch_next_group(&rows, rb, BB * sb, BB);
        let (d, dmin) = stage_k::<TY>(base, offs, &rows, BB * sb, &mut buf, &mut sc, &mut mp);
        for t in 0..N {
            let a = &acts[t];
            let aq = a.q.as_ptr().add(256 * sb) as *const i32;
            let x = |g: usize| _mm512_set1_epi32(aq.add(g).read_unaligned());
            let mut ss = _mm512_setzero_si512();
            for j in 0..nsub {
                let g0 = per * j;
                let mut p0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), buf[g0], x(g0));
                let mut p1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), buf[g0 + 1], x(g0 + 1));
                for k in (2..per).step_by(2) {
                    p0 = _mm512_dpbusd_epi32(p0, buf[g0 + k], x(g0 + k));
                    p1 = _mm512_dpbusd_epi32(p1, buf[g0 + k + 1], x(g0 + k + 1));
                }
                ss = _mm512_add_epi32(ss, _mm512_mullo_epi32(_mm512_add_epi32(p0, p1), sc[j]));
            }
            let bs = if TY == 0 {
                a.bs32.as_ptr().add(8 * sb)
            } else {
                a.bs16.as_ptr().add(16 * sb)
            } as *const i32;
            let mut mm = _mm512_setzero_si512();
            for i in 0..nsub / 2 {
                let pair = _mm512_set1_epi32(bs.add(i).read_unaligned());
                mm = _mm512_dpwssd_epi32(mm, mp[i], pair);
            }
            let dx = _mm512_set1_ps(*a.d.get_unchecked(sb));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ss), _mm512_mul_ps(d, dx), acc[t]);
            accm[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mm), _mm512_mul_ps(dmin, dx), accm[t]);
        }
    }
    for t in 0..N {
        _mm512_storeu_ps(
            out.as_mut_ptr().add(VEC_ROWS * t),
            _mm512_sub_ps(acc[t], accm[t]),
        );
    }
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
