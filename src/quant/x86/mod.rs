//! x86-64 SIMD kernels: the AVX2 and AVX-512 levels' tables (`avx2`, `avx512`), their
//! block-scale dots of the 32-element one-scale types (`avx2_q32`, `avx512_q32`), and the
//! FP8 kernels (`fp8`), the low-bit types' decode-then-accumulate dots (`lowbit`)
//! the AVX2 in-register decoders of Q2_K, Q3_K, Q5_K, IQ2_XXS and IQ4_XS (`avx2_lowbit`),
//! and the batch tiles of both levels (`tile_avx2`, `tile_avx512`). What they share (loads, reductions, block factors, the row-wrapper
//! macros) is the leaf `common`; no kernel file imports another except a level's table
//! naming its block-scale dots.

mod common;

pub(super) mod avx2;
mod avx2_lowbit;
mod avx2_q32;
pub(super) mod avx512;
pub(super) mod avx512_q32;
pub(super) mod fp8;
mod lowbit;
mod tile_avx2;
mod tile_avx512;
