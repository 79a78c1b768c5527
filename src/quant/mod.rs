//! Weight encodings: block layouts, dequantization and dot products against f32 activations.
//!
//! Block formats follow the GGML/GGUF definitions (ggml `ggml-common.h` documents the layouts);
//! every kernel here is our own implementation, checked against the scalar reference in tests.

/// A GGML tensor type id as stored in GGUF tensor infos (`ggml_type` numbering).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    /// ggml `GGML_TYPE_IQ2_XXS` (id 16): 256-element blocks of 66 bytes, 2.06 bits per weight.
    IQ2_XXS,
    /// ggml `GGML_TYPE_IQ2_XS` (id 17): 256-element blocks of 74 bytes.
    IQ2_XS,
    /// ggml `GGML_TYPE_IQ3_XXS` (id 18): 256-element blocks of 98 bytes.
    IQ3_XXS,
    /// ggml `GGML_TYPE_IQ1_S` (id 19): 256-element blocks of 50 bytes, 1.56 bits per weight.
    IQ1_S,
    /// ggml `GGML_TYPE_IQ4_NL` (id 20): 32-element blocks of 18 bytes.
    IQ4_NL,
    /// ggml `GGML_TYPE_IQ3_S` (id 21): 256-element blocks of 110 bytes.
    IQ3_S,
    /// ggml `GGML_TYPE_IQ2_S` (id 22): 256-element blocks of 82 bytes.
    IQ2_S,
    /// ggml `GGML_TYPE_IQ4_XS` (id 23): 256-element blocks of 136 bytes.
    IQ4_XS,
    /// ggml `GGML_TYPE_IQ1_M` (id 29): 256-element blocks of 56 bytes, 1.75 bits per weight.
    IQ1_M,
    /// ggml `GGML_TYPE_TQ1_0` (id 34): ternary, 256-element blocks of 54 bytes.
    TQ1_0,
    /// ggml `GGML_TYPE_TQ2_0` (id 35): ternary, 256-element blocks of 66 bytes.
    TQ2_0,
    BF16,
    /// OCP microscaling FP4 (ggml `GGML_TYPE_MXFP4`, GGUF id 39): blocks of 32 elements, one
    /// E8M0 scale byte then 16 bytes of E2M1 nibbles (see `scalar::decode_mxfp4`).
    MXFP4,
    /// 8-bit integers (ggml `GGML_TYPE_I8`, GGUF id 24). Safetensors `U8` tensors (MXFP4
    /// `*_blocks` / `*_scales`) are indexed with this type too: only their bytes are used,
    /// never their values as numbers, and no kernel computes with it.
    I8,
    /// Stored FP8 E4M3 values without scales (a safetensors `F8_E4M3` tensor, one byte per
    /// element); no kernels: computed only after repacking into [`GgmlType::F8_E4M3_B128`].
    /// Internal, no GGUF id.
    F8_E4M3,
    /// FP8 E4M3 rows in blocks of 128 elements, each block an f32 scale followed by its 128
    /// bytes (the last block of a row may be shorter); see [`fp8`]. Internal, no GGUF id.
    F8_E4M3_B128,
}

impl GgmlType {
    /// Maps a GGUF `ggml_type` id to a type; `None` for ids we do not know.
    pub fn from_u32(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            9 => Self::Q8_1,
            10 => Self::Q2_K,
            11 => Self::Q3_K,
            12 => Self::Q4_K,
            13 => Self::Q5_K,
            14 => Self::Q6_K,
            15 => Self::Q8_K,
            16 => Self::IQ2_XXS,
            17 => Self::IQ2_XS,
            18 => Self::IQ3_XXS,
            19 => Self::IQ1_S,
            20 => Self::IQ4_NL,
            21 => Self::IQ3_S,
            22 => Self::IQ2_S,
            23 => Self::IQ4_XS,
            29 => Self::IQ1_M,
            34 => Self::TQ1_0,
            35 => Self::TQ2_0,
            30 => Self::BF16,
            39 => Self::MXFP4,
            24 => Self::I8,
            _ => return None,
        })
    }

    /// The GGUF `ggml_type` id; `u32::MAX` (never mapped by `from_u32`) for the internal
    /// types without one.
    pub fn id(self) -> u32 {
        match self {
            Self::F8_E4M3 | Self::F8_E4M3_B128 => u32::MAX,
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q5_0 => 6,
            Self::Q5_1 => 7,
            Self::Q8_0 => 8,
            Self::Q8_1 => 9,
            Self::Q2_K => 10,
            Self::Q3_K => 11,
            Self::Q4_K => 12,
            Self::Q5_K => 13,
            Self::Q6_K => 14,
            Self::Q8_K => 15,
            Self::IQ2_XXS => 16,
            Self::IQ2_XS => 17,
            Self::IQ3_XXS => 18,
            Self::IQ1_S => 19,
            Self::IQ4_NL => 20,
            Self::IQ3_S => 21,
            Self::IQ2_S => 22,
            Self::IQ4_XS => 23,
            Self::IQ1_M => 29,
            Self::TQ1_0 => 34,
            Self::TQ2_0 => 35,
            Self::BF16 => 30,
            Self::MXFP4 => 39,
            Self::I8 => 24,
        }
    }

    /// Elements per block (1 for plain float types, 32 for legacy quants, 256 for k-quants).
    pub fn block_elems(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 | Self::I8 | Self::F8_E4M3 => 1,
            Self::F8_E4M3_B128 => fp8::BLOCK,
            Self::Q4_0 | Self::Q4_1 | Self::Q5_0 | Self::Q5_1 | Self::Q8_0 | Self::Q8_1 => 32,
            Self::MXFP4 | Self::IQ4_NL => 32,
            Self::Q2_K | Self::Q3_K | Self::Q4_K | Self::Q5_K | Self::Q6_K | Self::Q8_K => 256,
            Self::IQ2_XXS | Self::IQ2_XS | Self::IQ2_S | Self::IQ3_XXS | Self::IQ3_S => 256,
            Self::IQ1_S | Self::IQ1_M | Self::IQ4_XS | Self::TQ1_0 | Self::TQ2_0 => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::F8_E4M3 => 1,
            Self::F8_E4M3_B128 => fp8::BLOCK + 4,
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::Q8_0 => 34,
            Self::Q8_1 => 36,
            Self::Q2_K => 84,
            Self::Q3_K => 110,
            Self::Q4_K => 144,
            Self::Q5_K => 176,
            Self::Q6_K => 210,
            Self::Q8_K => 292,
            Self::IQ2_XXS => 66,
            Self::IQ2_XS => 74,
            Self::IQ3_XXS => 98,
            Self::IQ1_S => 50,
            Self::IQ4_NL => 18,
            Self::IQ3_S => 110,
            Self::IQ2_S => 82,
            Self::IQ4_XS => 136,
            Self::IQ1_M => 56,
            Self::TQ1_0 => 54,
            Self::TQ2_0 => 66,
            Self::MXFP4 => 17,
            Self::I8 => 1,
        }
    }

    /// Bytes of a row of `n` elements; `None` when `n` is not a whole number of blocks
    /// or the size overflows.
    /// `F8_E4M3_B128` rows take any `n`: the last block may be partial ([`fp8::row_bytes`]).
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        if self == Self::F8_E4M3_B128 {
            return fp8::row_bytes(n);
        }
        if !n.is_multiple_of(self.block_elems()) {
            return None;
        }
        (n / self.block_elems()).checked_mul(self.block_bytes())
    }

    /// Whether this crate has dequantization and dot-product kernels for the type.
    pub fn has_kernels(self) -> bool {
        SLOT_TYPES.contains(&self) || self == Self::F8_E4M3_B128
    }

    /// The GGML name (`"Q4_K"`, `"F32"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q8_1 => "Q8_1",
            Self::Q2_K => "Q2_K",
            Self::Q3_K => "Q3_K",
            Self::Q4_K => "Q4_K",
            Self::Q5_K => "Q5_K",
            Self::Q6_K => "Q6_K",
            Self::Q8_K => "Q8_K",
            Self::IQ2_XXS => "IQ2_XXS",
            Self::IQ2_XS => "IQ2_XS",
            Self::IQ3_XXS => "IQ3_XXS",
            Self::IQ1_S => "IQ1_S",
            Self::IQ4_NL => "IQ4_NL",
            Self::IQ3_S => "IQ3_S",
            Self::IQ2_S => "IQ2_S",
            Self::IQ4_XS => "IQ4_XS",
            Self::IQ1_M => "IQ1_M",
            Self::TQ1_0 => "TQ1_0",
            Self::TQ2_0 => "TQ2_0",
            Self::BF16 => "BF16",
            Self::MXFP4 => "MXFP4",
            Self::I8 => "I8",
            Self::F8_E4M3 => "F8_E4M3",
            Self::F8_E4M3_B128 => "F8_E4M3_B128",
        }
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

pub mod fp8;
mod iq1_grid;
mod iq_grids;
pub mod mxfp4;
pub(crate) mod q8;
mod scalar;
mod scalar_iq;
mod scalar_k;
#[cfg(test)]
pub(crate) mod tests;
#[cfg(test)]
mod tests_lowbit;
#[cfg(test)]
pub(crate) mod tests_q8;
pub(crate) mod tile;

#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::sync::OnceLock;

/// Elements per accumulation round. Every level accumulates whole rounds into fixed lanes
/// (so each quant block, 32 or 256 elements, starts at lane 0) and sums the last
/// `len % ROUND` elements of a float row in order, after the lane reduction.
pub(crate) const ROUND: usize = 32;

/// The environment variable that caps [`SimdLevel::detect`]: `scalar`, `neon`, `avx2` or
/// `avx512` (a level this CPU lacks falls to the best one below it).
pub const SIMD_CAP_VAR: &str = "DELTAFIN_SIMD";

/// A CPU instruction-set level for the kernels. Each level fixes its own accumulation order,
/// so results may differ between levels in the last bits, never between calls or threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SimdLevel {
    /// Portable Rust: 8 accumulators, no fused multiply-add.
    Scalar,
    /// aarch64 NEON: 8 × 4-lane fma accumulators (blocks decoded in registers, `neon/`).
    Neon,
    /// x86-64 AVX2 + FMA + F16C: 4 × 8-lane fma accumulators.
    Avx2,
    /// x86-64 AVX-512F + BW + VL (+ AVX2, FMA, F16C): 2 × 16-lane fma accumulators over
    /// every type's dequantized values (Q8_0, Q4_0 and Q5_0 included).
    Avx512,
}

impl SimdLevel {
    /// The level the kernels use: the best this CPU supports, detected once and cached,
    /// capped by the environment variable [`SIMD_CAP_VAR`] when it is set (a developer's
    /// knob, like rayon's `RAYON_NUM_THREADS`: the test suite runs once per level with it,
    /// `docs/correctness.md`). Panics when the variable names no level ([`Self::parse`]).
    pub fn detect() -> SimdLevel {
        static BEST: OnceLock<SimdLevel> = OnceLock::new();
        *BEST.get_or_init(|| {
            let best = Self::available()
                .into_iter()
                .max()
                .unwrap_or(SimdLevel::Scalar);
            match std::env::var(SIMD_CAP_VAR) {
                Ok(v) if !v.is_empty() => {
                    let cap = Self::parse(&v).unwrap_or_else(|e| panic!("{SIMD_CAP_VAR}: {e}"));
                    Self::available()
                        .into_iter()
                        .filter(|l| *l <= cap)
                        .max()
                        .unwrap_or(SimdLevel::Scalar)
                        .min(best)
                }
                _ => best,
            }
        })
    }

    /// The lowercase name: `scalar`, `neon`, `avx2` or `avx512`.
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Neon => "neon",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
        }
    }

    /// The level named `s` ([`Self::name`]); an error lists the names otherwise.
    pub fn parse(s: &str) -> Result<SimdLevel, String> {
        [
            SimdLevel::Scalar,
            SimdLevel::Neon,
            SimdLevel::Avx2,
            SimdLevel::Avx512,
        ]
        .into_iter()
        .find(|l| l.name() == s)
        .ok_or_else(|| format!("unknown SIMD level '{s}' (expected scalar, neon, avx2 or avx512)"))
    }

    /// Every level this CPU can run (always includes `Scalar`), lowest first.
    pub fn available() -> Vec<SimdLevel> {
        let mut v = vec![SimdLevel::Scalar];
        #[cfg(target_arch = "aarch64")]
        v.push(SimdLevel::Neon);
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            if avx2 {
                v.push(SimdLevel::Avx2);
                if is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                {
                    v.push(SimdLevel::Avx512);
                }
            }
        }
        v
    }

    /// Whether this CPU can run the level.
    pub fn is_available(self) -> bool {
        static AVAIL: OnceLock<Vec<SimdLevel>> = OnceLock::new();
        AVAIL.get_or_init(Self::available).contains(&self)
    }
}

/// Dot product of one encoded row (bytes) with f32 activations of the same length.
pub(crate) type DotFn = fn(&[u8], &[f32]) -> f32;
/// `(row, x, out)`: `out[t]` = the [`DotFn`] of `row` with row `t` of `x` (`out.len()` rows
/// of equal length, 1 to the level's maximum), bit for bit; each weight block is decoded
/// once for all the rows.
pub(crate) type DotRowsFn = fn(&[u8], &[f32], &mut [f32]);
/// Dequantizes one encoded row (bytes) into f32 elements.
pub(crate) type DeqFn = fn(&[u8], &mut [f32]);
/// Dot product of two f32 vectors in a level's accumulation order.
pub(crate) type F32DotFn = fn(&[f32], &[f32]) -> f32;

/// Prepares one encoded row of a 32-element block type for repeated dots: the block's
/// integer values as f32 (`q`, one per element) and its scales (`d`, one per block).
pub(crate) type PrepFn = fn(&[u8], &mut [f32], &mut [f32]);
/// Dot product of a prepared row (`q`, `d`) with f32 activations, in the level's
/// block-scale order: equals the level's fused dot of the row bit for bit.
pub(crate) type PrepDotFn = fn(&[f32], &[f32], &[f32]) -> f32;

/// One level's kernels, indexed by [`slot`].
pub(crate) struct LevelKernels {
    pub dot: [DotFn; N_SLOTS],
    pub deq: [DeqFn; N_SLOTS],
    pub dot_f32: F32DotFn,
    /// Where the level's dot uses the block-scale scheme (not `dot_f32` over the dequantized
    /// row), the row preparation and prepared dot that reproduce it.
    pub prep: [Option<(PrepFn, PrepDotFn)>; N_SLOTS],
    /// The batch tile over dequantized rows (`dot_f32`'s operations), if the level has one.
    pub f32_tile: Option<tile::TileKernel>,
    /// The batch tile over prepared rows (`prep`'s dot's operations), if the level has one.
    pub prep_tile: Option<tile::TileKernel>,
    /// Multi-row dots that decode each block once for a few activation rows, equal to `dot`
    /// bit for bit, where the level has them.
    pub dot_rows: [Option<DotRowsFn>; N_SLOTS],
}

/// Number of types with kernels (the length of every kernel table).
pub(crate) const N_SLOTS: usize = N_BASE + N_EXT;

/// Number of types with kernels before the low-bit additions (slots `0..N_BASE`); the
/// slots `N_BASE..N_SLOTS` are [`EXT_TYPES`].
pub(crate) const N_BASE: usize = 9;
/// Number of low-bit types added after the first nine (see [`EXT_TYPES`]).
pub(crate) const N_EXT: usize = EXT_TYPES.len();

/// A kernel table from its first [`N_BASE`] entries and its [`N_EXT`] low-bit entries.
pub(crate) const fn join<T: Copy>(base: [T; N_BASE], ext: [T; N_EXT]) -> [T; N_SLOTS] {
    let mut out = [base[0]; N_SLOTS];
    let mut i = 0;
    while i < N_SLOTS {
        out[i] = if i < N_BASE { base[i] } else { ext[i - N_BASE] };
        i += 1;
    }
    out
}

/// The low-bit types (slots `N_BASE..`, in this order): legacy with minimum, k-quants, IQ
/// codebook types and ternary types.
pub const EXT_TYPES: [GgmlType; 16] = [
    GgmlType::Q4_1,
    GgmlType::Q5_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q5_K,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
];

/// Table index of a type with kernels: F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_K, Q6_K, MXFP4,
/// then the [`EXT_TYPES`].
pub(crate) fn slot(ty: GgmlType) -> Option<usize> {
    Some(match ty {
        GgmlType::F32 => 0,
        GgmlType::F16 => 1,
        GgmlType::BF16 => 2,
        GgmlType::Q8_0 => 3,
        GgmlType::Q4_0 => 4,
        GgmlType::Q5_0 => 5,
        GgmlType::Q4_K => 6,
        GgmlType::Q6_K => 7,
        GgmlType::MXFP4 => 8,
        GgmlType::Q4_1 => 9,
        GgmlType::Q5_1 => 10,
        GgmlType::Q2_K => 11,
        GgmlType::Q3_K => 12,
        GgmlType::Q5_K => 13,
        GgmlType::IQ1_S => 14,
        GgmlType::IQ1_M => 15,
        GgmlType::IQ2_XXS => 16,
        GgmlType::IQ2_XS => 17,
        GgmlType::IQ2_S => 18,
        GgmlType::IQ3_XXS => 19,
        GgmlType::IQ3_S => 20,
        GgmlType::IQ4_NL => 21,
        GgmlType::IQ4_XS => 22,
        GgmlType::TQ1_0 => 23,
        GgmlType::TQ2_0 => 24,
        _ => return None,
    })
}

/// The scalar decoders, by [`slot`].
pub(crate) const SCALAR_DECODE: [DeqFn; N_SLOTS] = [
    scalar::decode_f32,
    scalar::decode_f16,
    scalar::decode_bf16,
    scalar::decode_q8_0,
    scalar::decode_q4_0,
    scalar::decode_q5_0,
    scalar::decode_q4_k,
    scalar::decode_q6_k,
    scalar::decode_mxfp4,
    scalar_k::decode_q4_1,
    scalar_k::decode_q5_1,
    scalar_k::decode_q2_k,
    scalar_k::decode_q3_k,
    scalar_k::decode_q5_k,
    scalar_iq::decode_iq1_s,
    scalar_iq::decode_iq1_m,
    scalar_iq::decode_iq2_xxs,
    scalar_iq::decode_iq2_xs,
    scalar_iq::decode_iq2_s,
    scalar_iq::decode_iq3_xxs,
    scalar_iq::decode_iq3_s,
    scalar_iq::decode_iq4_nl,
    scalar_iq::decode_iq4_xs,
    scalar_k::decode_tq1_0,
    scalar_k::decode_tq2_0,
];

/// The types with kernels before the low-bit additions (slots `0..N_BASE`).
const BASE_TYPES: [GgmlType; N_BASE] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q5_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::MXFP4,
];

/// The types with kernels, in kernel-table order (see `slot`): `BASE_TYPES`, then
/// [`EXT_TYPES`].
pub const SLOT_TYPES: [GgmlType; N_SLOTS] = join(BASE_TYPES, EXT_TYPES);

macro_rules! scalar_fns {
    ($($dot:ident, $deq:ident = $slot:expr);*) => {
        $(fn $dot(row: &[u8], x: &[f32]) -> f32 {
            let ty = SLOT_TYPES[$slot];
            scalar::dot_decoded::<scalar::Scalar8>(
                row, x, ty.block_bytes(), ty.block_elems(), SCALAR_DECODE[$slot],
            )
        }
        fn $deq(src: &[u8], dst: &mut [f32]) {
            let ty = SLOT_TYPES[$slot];
            check_len(src.len(), dst.len(), ty.block_bytes(), ty.block_elems());
            SCALAR_DECODE[$slot](src, dst)
        })*
    };
}
scalar_fns!(sd0, sq0 = 0; sd1, sq1 = 1; sd2, sq2 = 2; sd3, sq3 = 3; sd4, sq4 = 4;
    sd5, sq5 = 5; sd6, sq6 = 6; sd7, sq7 = 7; sd8, sq8 = 8; sd9, sq9 = 9; sd10, sq10 = 10;
    sd11, sq11 = 11; sd12, sq12 = 12; sd13, sq13 = 13; sd14, sq14 = 14; sd15, sq15 = 15;
    sd16, sq16 = 16; sd17, sq17 = 17; sd18, sq18 = 18; sd19, sq19 = 19; sd20, sq20 = 20;
    sd21, sq21 = 21; sd22, sq22 = 22; sd23, sq23 = 23; sd24, sq24 = 24);

/// Scalar-level dequantization with length checks (also used by the NEON level for the
/// float types).
pub(crate) const SCALAR_DEQ: [DeqFn; N_SLOTS] = [
    sq0, sq1, sq2, sq3, sq4, sq5, sq6, sq7, sq8, sq9, sq10, sq11, sq12, sq13, sq14, sq15, sq16,
    sq17, sq18, sq19, sq20, sq21, sq22, sq23, sq24,
];

static SCALAR: LevelKernels = LevelKernels {
    dot: [
        sd0, sd1, sd2, sd3, sd4, sd5, sd6, sd7, sd8, sd9, sd10, sd11, sd12, sd13, sd14, sd15, sd16,
        sd17, sd18, sd19, sd20, sd21, sd22, sd23, sd24,
    ],
    deq: SCALAR_DEQ,
    dot_f32: scalar::dot_f32::<scalar::Scalar8>,
    prep: [None; N_SLOTS],
    f32_tile: tile::SCALAR_F32_TILE,
    prep_tile: None,
    dot_rows: [None; N_SLOTS],
};

/// The kernels of `level`. Panics when this CPU cannot run it (the tables of SIMD levels
/// are only handed out after runtime detection, which is what makes calling them sound).
pub(crate) fn level_kernels(level: SimdLevel) -> &'static LevelKernels {
    assert!(
        level.is_available(),
        "SIMD level {level:?} is not available on this CPU"
    );
    match level {
        SimdLevel::Scalar => &SCALAR,
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => &x86::avx2::KERNELS,
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 => {
            if is_x86_feature_detected!("gfni") {
                &x86::avx512::KERNELS_GFNI
            } else {
                &x86::avx512::KERNELS
            }
        }
        #[cfg(target_arch = "aarch64")]
        SimdLevel::Neon => &neon::KERNELS,
        #[allow(unreachable_patterns)]
        _ => unreachable!("level checked available"),
    }
}

/// The kernels of the detected level, resolved once.
fn best_kernels() -> &'static LevelKernels {
    static BEST: OnceLock<&'static LevelKernels> = OnceLock::new();
    BEST.get_or_init(|| level_kernels(SimdLevel::detect()))
}

/// The (dot, dequantize, f32 dot) kernels for `ty` at `level`, for callers that apply one
/// type to many rows. Panics if `ty` has no kernels or the level is unavailable.
pub(crate) fn row_kernels(level: SimdLevel, ty: GgmlType) -> (DotFn, DeqFn, F32DotFn) {
    let k = if level == SimdLevel::detect() {
        best_kernels()
    } else {
        level_kernels(level)
    };
    if ty == GgmlType::F8_E4M3_B128 {
        let (dot, deq) = fp8::kernels(level);
        return (dot, deq, k.dot_f32);
    }
    let s = slot(ty).unwrap_or_else(|| panic!("no kernels for {ty}"));
    (k.dot[s], k.deq[s], k.dot_f32)
}

/// The multi-row dot for `ty` at `level` and the most rows it takes, where the level has
/// one (AVX-512). Panics as [`row_kernels`] does when the level is unavailable.
pub(crate) fn rows_kernel(level: SimdLevel, ty: GgmlType) -> Option<(DotRowsFn, usize)> {
    let k = if level == SimdLevel::detect() {
        best_kernels()
    } else {
        level_kernels(level)
    };
    let s = slot(ty)?;
    #[cfg(target_arch = "x86_64")]
    let max = x86::avx512::MAX_ROWS;
    #[cfg(not(target_arch = "x86_64"))]
    let max = 0;
    k.dot_rows[s].map(|f| (f, max))
}

/// How a batch computes the dots of one weight row with many activation vectors so that
/// each equals the fused dot (`dot_row`) bit for bit.
#[derive(Clone, Copy)]
pub(crate) enum RowPlan {
    /// Dequantize the row once, then `dot_f32` per activation vector.
    Dequant(DeqFn, F32DotFn),
    /// Prepare the row once (integer values + block scales), then the prepared dot.
    Prepared(PrepFn, PrepDotFn),
}

/// The batch plan for `ty` at `level`. Panics as [`row_kernels`] does.
pub(crate) fn row_plan(level: SimdLevel, ty: GgmlType) -> RowPlan {
    let k = if level == SimdLevel::detect() {
        best_kernels()
    } else {
        level_kernels(level)
    };
    if ty == GgmlType::F8_E4M3_B128 {
        return RowPlan::Dequant(fp8::kernels(level).1, k.dot_f32);
    }
    let s = slot(ty).unwrap_or_else(|| panic!("no kernels for {ty}"));
    match k.prep[s] {
        Some((prep, dot)) => RowPlan::Prepared(prep, dot),
        None => RowPlan::Dequant(k.deq[s], k.dot_f32),
    }
}

/// Dequantizes one row: `src` holds `dst.len()` elements encoded as `ty`
/// (`src.len() == ty.row_bytes(dst.len())`), layouts per GGML `ggml-common.h`. The values
/// equal GGML's `dequantize_row_*` (and `gguf.quants.dequantize`) bit for bit, at every level.
/// Panics on a length mismatch or a type without kernels (`has_kernels`); loaders validate
/// both before any compute.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    dequantize_row_at(SimdLevel::detect(), ty, src, dst)
}

/// [`dequantize_row`] at a forced level (tests, benches). Panics if `level` is unavailable.
pub fn dequantize_row_at(level: SimdLevel, ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    (row_kernels(level, ty).1)(src, dst)
}

/// Dot product of one encoded row (`row`, `x.len()` elements of `ty`) with f32 activations `x`.
/// Panics on a length mismatch or a type without kernels. The result depends only on the
/// inputs (and the CPU's level), never on the thread that runs it. It equals
/// `dot_f32(&w, x)` exactly, where `w` is the row dequantized by [`dequantize_row`], except
/// for Q8_0, Q4_0 and Q5_0 at the AVX-512 level, which sum each block unscaled and apply its
/// scale once (`kernels::matmul` reproduces that order exactly).
pub fn dot_row(ty: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    dot_row_at(SimdLevel::detect(), ty, row, x)
}

/// [`dot_row`] at a forced level. Panics if `level` is unavailable.
pub fn dot_row_at(level: SimdLevel, ty: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    (row_kernels(level, ty).0)(row, x)
}

/// Dot product of two f32 vectors (same length, else panic) in the detected level's
/// accumulation order: `dot_f32(&dequantized_row, x) == dot_row(ty, row, x)` bit for bit
/// (except for the block-scale types noted at [`dot_row`]).
pub fn dot_f32(w: &[f32], x: &[f32]) -> f32 {
    dot_f32_at(SimdLevel::detect(), w, x)
}

/// [`dot_f32`] at a forced level. Panics if `level` is unavailable.
pub fn dot_f32_at(level: SimdLevel, w: &[f32], x: &[f32]) -> f32 {
    (row_kernels(level, GgmlType::F32).2)(w, x)
}

/// Panics unless `bytes` encodes exactly `elems` elements in blocks of `be` elements and
/// `bb` bytes.
#[inline]
pub(crate) fn check_len(bytes: usize, elems: usize, bb: usize, be: usize) {
    assert!(
        elems.is_multiple_of(be) && bytes == elems / be * bb,
        "row length mismatch: {bytes} bytes for {elems} elements"
    );
}
