//! x86-64 SIMD kernels: the AVX2 and AVX-512 levels' tables (`avx2`, `avx512`), their
//! AVX2 block-scale dots of the 32-element one-scale types (`avx2_q32`), the AVX-512 GFNI
//! decoders of Q4_0 / Q5_0 (`avx512_q32`), and the
//! FP8 kernels (`fp8`), and the low-bit types' in-register block decoders for both levels
//! (`lowbit_k`: Q4_1, Q5_1, Q2_K, Q3_K, Q5_K, TQ1_0, TQ2_0; `lowbit_iq`: the IQ types),
//! whose shared accumulators and helpers are `lowbit` and whose tables `lowbit_tables` joins,
//! the batch tiles of both
//! levels (`tile_avx2`, `tile_avx512`), and the integer tiles of `--numerics q8` (`q8_avx2`,
//! `q8_avx512`: AVX2 and AVX-512 VNNI; `q8_vec_avx512`: the single-row VNNI dots over stored rows; `q8_multi_avx512`: the
//! multi-row ones, weights transposed once for several activation rows). What all share (loads,
//! reductions, block factors, the row-wrapper macros) is the leaf `common`; no kernel file
//! imports another except a level's table naming its block-scale or low-bit kernels.

mod common;

pub(super) mod avx2;
mod avx2_q32;
pub(super) mod avx512;
pub(super) mod avx512_q32;
pub(super) mod fp8;
mod lowbit;
mod lowbit_iq;
mod lowbit_k;
mod lowbit_tables;
pub(crate) mod q8_avx2;
pub(crate) mod q8_avx512;
pub(crate) mod q8_multi_avx512;
pub(crate) mod q8_vec_avx512;
mod tile_avx2;
mod tile_avx512;
