//! What the x86 kernel files share: unaligned loads and f16 scales, the lane reductions of
//! the AVX2 and AVX-512 levels, the Q4_K / Q6_K / MXFP4 block factors both levels decode
//! with, the GFNI bit matrices, and the macros that turn a block decoder into a row's fused
//! dot and dequantization. A leaf: it imports no kernel file.

use std::arch::x86_64::*;

use crate::quant::scalar::{f16_to_f32, MXFP4_VALUES};
use crate::quant::{DotFn, PrepDotFn, PrepFn, N_SLOTS, ROUND};

/// Software prefetch distance of the AVX-512 dots, in bytes of the encoded row (measured on
/// the 262144 × 640 Q8_0 LM head: 6.3 → 8 GB/s on one thread).
pub(super) const PF: usize = 2048;

/// The IEEE half at `p` as f32 (exact).
#[inline(always)]
pub(super) unsafe fn f16s(p: *const u8) -> f32 {
    f16_to_f32((p as *const u16).read_unaligned().to_le())
}

/// The IEEE half at `p` as f32 in every lane of a 512-bit register, converted by F16C
/// (`vcvtph2ps`): the value of [`f16s`] exactly, subnormals included; a signaling NaN comes
/// back quiet, which its every use here (a product) makes it anyway, so the decoders' values
/// stay bit-identical to the scalar ones. Broadcast and conversion stay in the vector unit,
/// where the scalar path's dozen integer operations per block took issue slots from the
/// multi-row dots' multiply-adds.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) unsafe fn f16v(p: *const u8) -> __m512 {
    _mm512_cvtph_ps(_mm256_set1_epi16((p as *const i16).read_unaligned()))
}

/// The 16 bytes at `p` (unaligned).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn load16(p: *const u8) -> __m128i {
    _mm_loadu_si128(p as *const __m128i)
}

/// The AVX2 level's reduction: `(a0 + a1) + (a2 + a3)`, then halves 128 → 64 → 32 bits.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn finish_avx2(acc: &[__m256; 4]) -> f32 {
    let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
    _mm_cvtss_f32(s)
}

/// The AVX-512 level's reduction: `a0 + a1`, then halves 256 → 128 → 64 → 32 bits.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) fn finish_avx512(acc: &[__m512; 2]) -> f32 {
    let v = _mm512_add_ps(acc[0], acc[1]);
    let lo = _mm512_castps512_ps256(v);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    let s = _mm256_add_ps(lo, hi);
    let s = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
    _mm_cvtss_f32(s)
}

/// The 32 E2M1 values (doubled, as i8) of the MXFP4 nibbles `qs`: low nibbles (elements
/// 0..16) and high nibbles (16..32), through a 16-entry byte table.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn mxfp4_values(qs: __m128i) -> (__m128i, __m128i) {
    let lut = _mm_loadu_si128(MXFP4_VALUES.as_ptr() as *const __m128i);
    let m = _mm_set1_epi8(15);
    (
        _mm_shuffle_epi8(lut, _mm_and_si128(qs, m)),
        _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16::<4>(qs), m)),
    )
}

/// The eight Q4_K sub-block factors `(d * sc[r], dmin * m[r])` of the block at `p`, unpacked
/// as in `scalar::q4k_scales` four bytes at a time and multiplied in f32 (same roundings).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4k_factors(p: *const u8) -> ([f32; 8], [f32; 8]) {
    let d = f16s(p);
    let dmin = f16s(p.add(2));
    let w = |o: usize| (p.add(4 + o) as *const u32).read_unaligned().to_le();
    let (a, b, c) = (w(0), w(4), w(8));
    let sc_lo = a & 0x3F3F_3F3F;
    let m_lo = b & 0x3F3F_3F3F;
    let sc_hi = (c & 0x0F0F_0F0F) | (((a >> 6) & 0x0303_0303) << 4);
    let m_hi = ((c >> 4) & 0x0F0F_0F0F) | (((b >> 6) & 0x0303_0303) << 4);
    let widen = |lo: u32, hi: u32| {
        let v = _mm_cvtsi64_si128((lo as u64 | (hi as u64) << 32) as i64);
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v))
    };
    let mut ds = [0f32; 8];
    let mut ms = [0f32; 8];
    _mm256_storeu_ps(
        ds.as_mut_ptr(),
        _mm256_mul_ps(_mm256_set1_ps(d), widen(sc_lo, sc_hi)),
    );
    _mm256_storeu_ps(
        ms.as_mut_ptr(),
        _mm256_mul_ps(_mm256_set1_ps(dmin), widen(m_lo, m_hi)),
    );
    (ds, ms)
}

/// The sixteen Q6_K factors `d * sc[i]` of the block at `p` (f32 products, as scalar).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q6k_factors(p: *const u8) -> [f32; 16] {
    let d = _mm256_set1_ps(f16s(p.add(208)));
    let sc = load16(p.add(192));
    let mut out = [0f32; 16];
    let lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc));
    let hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(sc)));
    _mm256_storeu_ps(out.as_mut_ptr(), _mm256_mul_ps(d, lo));
    _mm256_storeu_ps(out.as_mut_ptr().add(8), _mm256_mul_ps(d, hi));
    out
}

/// GF(2) affine matrix (`vgf2p8affineqb`: output bit `i` is the parity of the input bits
/// selected by byte `7 - i`) whose output bit `i` is input bit `src[i]` (0 for `src[i] >= 8`).
pub(super) const fn bit_matrix(src: [u32; 8]) -> i64 {
    let mut a = 0u64;
    let mut i = 0;
    while i < 8 {
        if src[i] < 8 {
            a |= (1u64 << src[i]) << (8 * (7 - i));
        }
        i += 1;
    }
    a as i64
}

/// The tail decoder of block types: their rows are whole blocks, so there is never a tail.
pub(super) fn no_tail(_: &[u8], _: &mut [f32]) {
    unreachable!("quant rows have no tail")
}

/// f32 · f32 at a level whose F32 row dot is `dot_f32row` (the same computation over the
/// bytes of `w`). Panics on a length mismatch.
#[inline]
pub(super) fn dot_f32_as_row(dot_f32row: DotFn, w: &[f32], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len(), "vector length mismatch");
    // SAFETY: reinterpreting initialized f32s as bytes.
    let bytes = unsafe { std::slice::from_raw_parts(w.as_ptr() as *const u8, w.len() * 4) };
    dot_f32row(bytes, x)
}

/// Software prefetch of the `bb` bytes at `p` (a block some distance ahead of the one being
/// decoded), one hint per 64-byte line. Hints never fault, so `p` may run past the row.
#[inline(always)]
pub(super) fn prefetch_block(p: *const u8, bb: usize) {
    let mut o = 0;
    while o < bb {
        // SAFETY: a prefetch hint reads nothing and never faults, whatever the address
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(o) as *const i8) };
        o += 64;
    }
}

/// Bytes and elements of one step of a row walk: a block of `bb` bytes and `be` elements, or
/// for float rows (`be == 1`) a round of `ROUND` elements of `esz` bytes each.
pub(super) const fn walk_step(bb: usize, be: usize, esz: usize) -> (usize, usize) {
    if be == 1 {
        (esz * ROUND, ROUND)
    } else {
        (bb, be)
    }
}

/// The `prep` column of a level table whose Q8_0, Q4_0 and Q5_0 dots (slots 3, 4 and 5) are
/// block-scale dots: those types' row preparations with the prepared dot, `None` elsewhere.
pub(super) const fn q32_prep(
    q8_0: PrepFn,
    q4_0: PrepFn,
    q5_0: PrepFn,
    dot: PrepDotFn,
) -> [Option<(PrepFn, PrepDotFn)>; N_SLOTS] {
    let mut out = [None; N_SLOTS];
    out[3] = Some((q8_0, dot));
    out[4] = Some((q4_0, dot));
    out[5] = Some((q5_0, dot));
    out
}

/// Defines `fn $dot(row: &[u8], x: &[f32]) -> f32`, the fused dot of a row whose blocks
/// `$blk::<false>` decodes and accumulates, at a level:
///
/// - `avx2`: 4 × 8-lane accumulators, `finish_avx2`, no prefetch;
/// - `avx512`: 2 × 16-lane accumulators, `finish_avx512`, a prefetch `PF` bytes ahead;
///   `avx512 "features"` runs it with other target features (e.g. `+gfni`).
///
/// `$bb` / `$be`: bytes / elements per block. Float rows (`$be == 1`) run in rounds of
/// `ROUND` elements of `$esz` bytes; their last `len % ROUND` elements are decoded by the
/// scalar `$tail` and summed in order after the lane reduction.
macro_rules! dot_kernel {
    (avx2; $($k:tt)*) => {
        $crate::quant::x86::common::dot_kernel!(@ "avx2,fma,f16c", [_mm256_setzero_ps(); 4],
            $crate::quant::x86::common::finish_avx2, None::<usize>; $($k)*);
    };
    (avx512; $($k:tt)*) => {
        $crate::quant::x86::common::dot_kernel!(avx512 "avx512f,avx2,fma,f16c"; $($k)*);
    };
    (avx512 $feat:literal; $($k:tt)*) => {
        $crate::quant::x86::common::dot_kernel!(@ $feat, [_mm512_setzero_ps(); 2],
            $crate::quant::x86::common::finish_avx512, Some($crate::quant::x86::common::PF);
            $($k)*);
    };
    (@ $feat:literal, $acc:expr, $finish:path, $pf:expr;
     $dot:ident, $blk:ident, $bb:expr, $be:expr, $esz:expr, $tail:expr) => {
        /// Fused dot (safe wrapper; only reachable through the detected-level table).
        fn $dot(row: &[u8], x: &[f32]) -> f32 {
            #[target_feature(enable = $feat)]
            unsafe fn inner(row: &[u8], x: &[f32]) -> f32 {
                use std::arch::x86_64::*;
                use $crate::quant::ROUND;
                let mut acc = $acc;
                const STEP: (usize, usize) = $crate::quant::x86::common::walk_step($bb, $be, $esz);
                let (bb, be) = STEP;
                let nb = x.len() / be;
                let (p, xp) = (row.as_ptr(), x.as_ptr());
                for b in 0..nb {
                    if let Some(pf) = $pf {
                        $crate::quant::x86::common::prefetch_block(p.wrapping_add(b * bb + pf), bb);
                    }
                    $blk::<false>(
                        p.add(b * bb),
                        xp.add(b * be),
                        std::ptr::null_mut(),
                        &mut acc,
                    );
                }
                let mut tail = 0f32;
                let mut w = [0f32; ROUND];
                let done = nb * be;
                if done < x.len() {
                    let t: fn(&[u8], &mut [f32]) = $tail;
                    t(&row[done * $esz..], &mut w[..x.len() - done]);
                    for (k, &xv) in x[done..].iter().enumerate() {
                        tail += w[k] * xv;
                    }
                }
                $finish(&acc) + tail
            }
            $crate::quant::check_len(row.len(), x.len(), $bb, $be);
            // SAFETY: the table holding this function is handed out only after runtime
            // detection of the target features above; all reads stay inside `row` and `x`
            // (lengths checked above).
            unsafe { inner(row, x) }
        }
    };
}
pub(super) use dot_kernel;

/// Defines `fn $deq(src: &[u8], dst: &mut [f32])`, the dequantization of a row whose blocks
/// `$blk::<true>` decodes and stores, at a level (`avx2` or `avx512`, see `dot_kernel!`;
/// the arguments are the same).
macro_rules! deq_kernel {
    (avx2; $($k:tt)*) => {
        $crate::quant::x86::common::deq_kernel!(@ "avx2,fma,f16c",
            [_mm256_setzero_ps(); 4]; $($k)*);
    };
    (avx512; $($k:tt)*) => {
        $crate::quant::x86::common::deq_kernel!(@ "avx512f,avx2,fma,f16c",
            [_mm512_setzero_ps(); 2]; $($k)*);
    };
    (@ $feat:literal, $acc:expr;
     $deq:ident, $blk:ident, $bb:expr, $be:expr, $esz:expr, $tail:expr) => {
        /// Dequantization (safe wrapper; only reachable through the detected-level table).
        fn $deq(src: &[u8], dst: &mut [f32]) {
            #[target_feature(enable = $feat)]
            unsafe fn inner(src: &[u8], dst: &mut [f32]) {
                use std::arch::x86_64::*;
                let mut acc = $acc;
                const STEP: (usize, usize) = $crate::quant::x86::common::walk_step($bb, $be, $esz);
                let (bb, be) = STEP;
                let nb = dst.len() / be;
                let (p, dp) = (src.as_ptr(), dst.as_mut_ptr());
                for b in 0..nb {
                    $blk::<true>(p.add(b * bb), std::ptr::null(), dp.add(b * be), &mut acc);
                }
                let done = nb * be;
                if done < dst.len() {
                    let t: fn(&[u8], &mut [f32]) = $tail;
                    t(&src[done * $esz..], &mut dst[done..]);
                }
            }
            $crate::quant::check_len(src.len(), dst.len(), $bb, $be);
            // SAFETY: as for the dots (`dot_kernel!`).
            unsafe { inner(src, dst) }
        }
    };
}
pub(super) use deq_kernel;

/// Defines a fused dot `$dot` and a dequantization `$deq` of the same block decoder at a
/// level: `dot_kernel!` and `deq_kernel!` with the same arguments.
macro_rules! kernels {
    ($lvl:ident; $dot:ident, $deq:ident, $blk:ident, $bb:expr, $be:expr, $esz:expr, $tail:expr) => {
        $crate::quant::x86::common::dot_kernel!($lvl; $dot, $blk, $bb, $be, $esz, $tail);
        $crate::quant::x86::common::deq_kernel!($lvl; $deq, $blk, $bb, $be, $esz, $tail);
    };
}
pub(super) use kernels;

/// Defines the block-scale dot `$dot` and the row preparation `$prep` (for the level's
/// `prep_dot`) of a 32-element, one-scale block type of `$bb` bytes whose 32 integer values
/// `$q(p)` decodes, at a level: `avx2`, or `avx512` (a prefetch `PF` bytes ahead of every
/// block pair), `avx512 "features"` to run it with other target features (e.g. `+gfni`).
///
/// The invoking file defines its level's scheme: `CHUNK` (blocks whose scales `scales`
/// converts together; even, so block parity is `k % 2`), `step` (one block into one of the
/// two accumulators), `store_q` (a block's values to memory) and `finish2` (the reduction of
/// the two accumulators).
macro_rules! q32_kernels {
    (avx2; $($k:tt)*) => {
        $crate::quant::x86::common::q32_kernels!(@ "avx2,fma,f16c", _mm256_setzero_ps(),
            None::<usize>; $($k)*);
    };
    (avx512; $($k:tt)*) => {
        $crate::quant::x86::common::q32_kernels!(avx512
            "avx512f,avx512bw,avx512vl,avx2,fma,f16c"; $($k)*);
    };
    (avx512 $feat:literal; $($k:tt)*) => {
        $crate::quant::x86::common::q32_kernels!(@ $feat, _mm512_setzero_ps(),
            Some($crate::quant::x86::common::PF); $($k)*);
    };
    (@ $feat:literal, $zero:expr, $pf:expr; $dot:ident, $prep:ident, $q:ident, $bb:expr) => {
        /// Fused dot in the block-scale scheme (safe wrapper; only reachable through the
        /// detected-level table).
        pub(in crate::quant) fn $dot(row: &[u8], x: &[f32]) -> f32 {
            #[target_feature(enable = $feat)]
            unsafe fn inner(row: &[u8], x: &[f32]) -> f32 {
                use std::arch::x86_64::*;
                let nb = x.len() / 32;
                let (p, xp) = (row.as_ptr(), x.as_ptr());
                let mut a0 = $zero;
                let mut a1 = $zero;
                let mut ds = [0f32; CHUNK];
                let mut b = 0;
                while b < nb {
                    let m = CHUNK.min(nb - b);
                    scales(p.add(b * $bb), $bb, m, &mut ds);
                    let mut k = 0;
                    while k + 1 < m {
                        if let Some(pf) = $pf {
                            _mm_prefetch::<_MM_HINT_T0>(
                                p.wrapping_add((b + k) * $bb + pf) as *const i8
                            );
                        }
                        let c = b + k;
                        step($q(p.add(c * $bb)), ds[k], xp.add(32 * c), &mut a0);
                        let c = b + k + 1;
                        step($q(p.add(c * $bb)), ds[k + 1], xp.add(32 * c), &mut a1);
                        k += 2;
                    }
                    if k < m {
                        let c = b + k;
                        step($q(p.add(c * $bb)), ds[k], xp.add(32 * c), &mut a0);
                    }
                    b += m;
                }
                finish2(a0, a1)
            }
            $crate::quant::check_len(row.len(), x.len(), $bb, 32);
            // SAFETY: the table holding this function is handed out only after runtime
            // detection of the target features above; all reads stay inside `row` and `x`
            // (lengths checked above).
            unsafe { inner(row, x) }
        }

        /// Row preparation for `prep_dot`: `q` gets the integer values, `d` the scales.
        pub(in crate::quant) fn $prep(row: &[u8], q: &mut [f32], d: &mut [f32]) {
            #[target_feature(enable = $feat)]
            unsafe fn inner(row: &[u8], q: &mut [f32], d: &mut [f32]) {
                let p = row.as_ptr();
                for (b, (qb, db)) in q.chunks_exact_mut(32).zip(d.iter_mut()).enumerate() {
                    store_q($q(p.add(b * $bb)), qb.as_mut_ptr());
                    *db = $crate::quant::scalar::f16_at(&row[b * $bb..]);
                }
            }
            $crate::quant::check_len(row.len(), q.len(), $bb, 32);
            assert_eq!(d.len(), q.len() / 32, "one scale per block");
            // SAFETY: as for the dot above.
            unsafe { inner(row, q, d) }
        }
    };
}
pub(super) use q32_kernels;

/// The kernel table of a level file (a `LevelKernels`): its kernels named by type
/// (`dot_f32row`, `dot_f16`, ..., `deq_mxfp4`), its low-bit tables `EXT_DOT` / `EXT_DEQ`
/// (in `EXT_TYPES` order) and `dot_f32`, with the block-scale dots and
/// row preparations of its `q32` module for Q8_0, Q4_0 and Q5_0 (in `slot` order), and the
/// batch tiles of its `tile` module.
macro_rules! level_table {
    () => {
        $crate::quant::LevelKernels {
            dot: $crate::quant::join(
                [
                    dot_f32row,
                    dot_f16,
                    dot_bf16,
                    q32::dot_q8_0,
                    q32::dot_q4_0,
                    q32::dot_q5_0,
                    dot_q4_k,
                    dot_q6_k,
                    dot_mxfp4,
                ],
                EXT_DOT,
            ),
            deq: $crate::quant::join(
                [
                    deq_f32, deq_f16, deq_bf16, deq_q8_0, deq_q4_0, deq_q5_0, deq_q4_k, deq_q6_k,
                    deq_mxfp4,
                ],
                EXT_DEQ,
            ),
            dot_f32,
            prep: $crate::quant::x86::common::q32_prep(
                q32::prep_q8_0,
                q32::prep_q4_0,
                q32::prep_q5_0,
                q32::prep_dot,
            ),
            f32_tile: tile::F32_TILE,
            prep_tile: tile::PREP_TILE,
            dot_rows: [None; $crate::quant::N_SLOTS],
        }
    };
}
pub(super) use level_table;
