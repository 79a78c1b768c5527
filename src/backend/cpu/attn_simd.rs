//! Which SIMD path attention's kernels take (`attn.rs`, `attn_decode.rs`): AVX-512 or AVX2
//! where the CPU has it (`quant::SimdLevel::detect`), a portable loop otherwise. Every path
//! gives the same bits (the lanes are independent).

#[cfg_attr(not(target_arch = "x86_64"), allow(unused_imports))]
use crate::quant::SimdLevel;

/// The SIMD path the CPU has.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Simd {
    None,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx2,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx512,
}

/// The best path this CPU supports.
pub(super) fn detect() -> Simd {
    #[cfg(target_arch = "x86_64")]
    match SimdLevel::detect() {
        SimdLevel::Avx512 => return Simd::Avx512,
        SimdLevel::Avx2 => return Simd::Avx2,
        _ => {}
    }
    Simd::None
}
