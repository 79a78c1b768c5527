//! AVX2 + FMA and AVX-512 kernels of [`crate::quant::GgmlType::F8_E4M3_B128`] (layout in
//! [`crate::quant::fp8`]).
//!
//! E4M3 → f32 in registers, in integer arithmetic for normal values (exponent rebased from
//! bias 7 to 127, mantissa moved up) and as `m · 2^-9` for subnormals (no subnormal f32
//! arithmetic, which costs microcode assists); `S.1111.111` becomes the quiet NaN and the sign
//! bit is OR-ed in, as the scalar table does. Then one multiplication by the block scale. The fused dot uses the
//! AVX2 level's accumulation order (element `32k + j` to accumulator `j / 8`, lane `j % 8`, fma;
//! the last `n % 32` elements summed in order after the lane reduction), so it equals the AVX2
//! f32 dot of the decoded row bit for bit.

use std::arch::x86_64::*;

use super::common::{finish_avx2, finish_avx512};
use crate::quant::fp8::format::{e4m3_to_f32, row_bytes, BLOCK};
use crate::quant::ROUND;

/// 8 E4M3 bytes at `p` decoded and multiplied by `s`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dec8(p: *const u8, s: __m256) -> __m256 {
    let b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i));
    let mag7 = _mm256_and_si256(b, _mm256_set1_epi32(0x7f));
    // normal: exponent + (127 − 7), mantissa to the top of the f32 mantissa
    let normal = _mm256_add_epi32(_mm256_slli_epi32::<20>(mag7), _mm256_set1_epi32(120 << 23));
    // subnormal (exponent 0, zero included): m · 2^-9, exact
    let m = _mm256_and_si256(b, _mm256_set1_epi32(7));
    let sub = _mm256_mul_ps(_mm256_cvtepi32_ps(m), _mm256_set1_ps(1.0 / 512.0));
    let is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(8), mag7);
    let v = _mm256_blendv_epi8(normal, _mm256_castps_si256(sub), is_sub);
    let nan = _mm256_cmpeq_epi32(mag7, _mm256_set1_epi32(0x7f));
    let v = _mm256_blendv_epi8(v, _mm256_set1_epi32(0x7FC0_0000), nan);
    let sign = _mm256_slli_epi32::<24>(_mm256_and_si256(b, _mm256_set1_epi32(0x80)));
    _mm256_mul_ps(_mm256_castsi256_ps(_mm256_or_si256(v, sign)), s)
}

/// Iterates the blocks of a packed row of `n` elements: (byte offset of the block's scale,
/// first element, elements in the block).
fn blocks(n: usize) -> impl Iterator<Item = (usize, usize, usize)> {
    (0..n.div_ceil(BLOCK)).map(move |b| (b * (BLOCK + 4), b * BLOCK, BLOCK.min(n - b * BLOCK)))
}

/// Dequantizes one packed row (safe wrapper; only reachable after AVX2 detection).
pub(in crate::quant) fn decode(src: &[u8], dst: &mut [f32]) {
    #[target_feature(enable = "avx2,fma")]
    unsafe fn inner(src: &[u8], dst: &mut [f32]) {
        for (o, e0, len) in blocks(dst.len()) {
            let sf = f32::from_le_bytes([src[o], src[o + 1], src[o + 2], src[o + 3]]);
            let s = _mm256_set1_ps(sf);
            let q = src.as_ptr().add(o + 4);
            let full = len / 8 * 8;
            for k in (0..full).step_by(8) {
                _mm256_storeu_ps(dst.as_mut_ptr().add(e0 + k), dec8(q.add(k), s));
            }
            for k in full..len {
                dst[e0 + k] = e4m3_to_f32(src[o + 4 + k]) * sf;
            }
        }
    }
    assert_eq!(Some(src.len()), row_bytes(dst.len()), "row length mismatch");
    // SAFETY: the kernel table holding this function is handed out only after runtime
    // detection of avx2/fma; every access stays inside `src`/`dst` (lengths checked above:
    // each block's bytes follow its 4-byte scale, and `full <= len`).
    unsafe { inner(src, dst) }
}

/// Fused dot of one packed row with `x` (safe wrapper; only reachable after AVX2 detection).
pub(in crate::quant) fn dot(row: &[u8], x: &[f32]) -> f32 {
    #[target_feature(enable = "avx2,fma")]
    unsafe fn inner(row: &[u8], x: &[f32]) -> f32 {
        let mut acc = [_mm256_setzero_ps(); 4];
        let n = x.len();
        let rounds = n / ROUND * ROUND;
        let mut tail = 0f32;
        for (o, e0, len) in blocks(n) {
            let sf = f32::from_le_bytes([row[o], row[o + 1], row[o + 2], row[o + 3]]);
            let s = _mm256_set1_ps(sf);
            let q = row.as_ptr().add(o + 4);
            let mut k = 0;
            while k + ROUND <= len && e0 + k < rounds {
                for (a, acc_k) in acc.iter_mut().enumerate() {
                    let w = dec8(q.add(k + 8 * a), s);
                    let xv = _mm256_loadu_ps(x.as_ptr().add(e0 + k + 8 * a));
                    *acc_k = _mm256_fmadd_ps(w, xv, *acc_k);
                }
                k += ROUND;
            }
            for j in k..len {
                tail += e4m3_to_f32(row[o + 4 + j]) * sf * x[e0 + j];
            }
        }
        finish_avx2(&acc) + tail
    }
    assert_eq!(Some(row.len()), row_bytes(x.len()), "row length mismatch");
    // SAFETY: as for `decode`.
    unsafe { inner(row, x) }
}

/// 16 E4M3 bytes at `p` decoded and multiplied by `s` (AVX-512; the same values as [`dec8`]).
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn dec16(p: *const u8, s: __m512) -> __m512 {
    let b = _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i));
    let mag7 = _mm512_and_si512(b, _mm512_set1_epi32(0x7f));
    let normal = _mm512_add_epi32(_mm512_slli_epi32::<20>(mag7), _mm512_set1_epi32(120 << 23));
    let m = _mm512_and_si512(b, _mm512_set1_epi32(7));
    let sub = _mm512_mul_ps(_mm512_cvtepi32_ps(m), _mm512_set1_ps(1.0 / 512.0));
    let is_sub = _mm512_cmplt_epi32_mask(mag7, _mm512_set1_epi32(8));
    let v = _mm512_mask_blend_epi32(is_sub, normal, _mm512_castps_si512(sub));
    let nan = _mm512_cmpeq_epi32_mask(mag7, _mm512_set1_epi32(0x7f));
    let v = _mm512_mask_blend_epi32(nan, v, _mm512_set1_epi32(0x7FC0_0000));
    let sign = _mm512_slli_epi32::<24>(_mm512_and_si512(b, _mm512_set1_epi32(0x80)));
    _mm512_mul_ps(_mm512_castsi512_ps(_mm512_or_si512(v, sign)), s)
}

/// Fused dot of one packed row with `x` in the AVX-512 level's accumulation order (element
/// `32k + j` to accumulator `j / 16`, lane `j % 16`, fma; the last `n % 32` elements summed in
/// order after the reduction), equal to the AVX-512 f32 dot of the decoded row bit for bit.
/// Safe wrapper; only reachable after AVX-512 detection.
pub(in crate::quant) fn dot512(row: &[u8], x: &[f32]) -> f32 {
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn inner(row: &[u8], x: &[f32]) -> f32 {
        let mut acc = [_mm512_setzero_ps(); 2];
        let n = x.len();
        let rounds = n / ROUND * ROUND;
        let mut tail = 0f32;
        for (o, e0, len) in blocks(n) {
            let sf = f32::from_le_bytes([row[o], row[o + 1], row[o + 2], row[o + 3]]);
            let s = _mm512_set1_ps(sf);
            let q = row.as_ptr().add(o + 4);
            let xp = x.as_ptr().add(e0);
            let mut k = 0;
            while k + ROUND <= len && e0 + k < rounds {
                acc[0] = _mm512_fmadd_ps(dec16(q.add(k), s), _mm512_loadu_ps(xp.add(k)), acc[0]);
                acc[1] = _mm512_fmadd_ps(
                    dec16(q.add(k + 16), s),
                    _mm512_loadu_ps(xp.add(k + 16)),
                    acc[1],
                );
                k += ROUND;
            }
            for j in k..len {
                tail += e4m3_to_f32(row[o + 4 + j]) * sf * x[e0 + j];
            }
        }
        finish_avx512(&acc) + tail
    }
    assert_eq!(Some(row.len()), row_bytes(x.len()), "row length mismatch");
    // SAFETY: the kernel table holding this function is handed out only after runtime
    // detection of avx512f/avx2/fma/f16c; accesses stay inside `row` and `x` as in `dot`.
    unsafe { inner(row, x) }
}
