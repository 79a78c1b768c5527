//! Which arithmetic the matrix products use: exact (the default: every output equals
//! `quant::dot_row`) or the lossy `q8` mode (activations quantized to 8 bits per block,
//! integer dot products, as llama.cpp's CPU backend; `gemm_q8.rs`).
//!
//! A model carries its setting (`models::Model::numerics`) and runs each forward pass
//! inside [`with_numerics`], which sets it for the calling thread for the pass's duration;
//! [`super::matmul`] and [`super::matvec`] read it there (single-token passes take the q8
//! single-row dots of `matvec_q8.rs`, equal to a batch's rows bit for bit). It is never
//! process-wide: two
//! models in one process (a draft and its target) keep their own.

use std::cell::Cell;

/// The arithmetic of matrix products.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Numerics {
    /// Every product equals `quant::dot_row` of the stored encoding, bit for bit.
    #[default]
    Exact,
    /// Lossy: activations quantized per block to 8 bits (Q8_0 per 32 values for the
    /// 32-value weight types, Q8_K per 256 for the K-quants), integer dot products. Q8_0,
    /// Q4_0, Q5_0, MXFP4, Q4_K, Q5_K and Q6_K weights, in every pass (prompts, decode,
    /// speculative verification: a row's values do not depend on the batch); every other
    /// type stays exact.
    Q8,
}

impl Numerics {
    /// The name the CLI and `--stats` use: `exact` or `q8`.
    pub fn name(self) -> &'static str {
        match self {
            Numerics::Exact => "exact",
            Numerics::Q8 => "q8",
        }
    }
}

impl std::fmt::Display for Numerics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Numerics {
    type Err = String;
    /// `exact` or `q8`; any other text is an error naming both.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "exact" => Ok(Numerics::Exact),
            "q8" => Ok(Numerics::Q8),
            _ => Err(format!("unknown numerics '{s}' (expected exact or q8)")),
        }
    }
}

thread_local! {
    static CURRENT: Cell<Numerics> = const { Cell::new(Numerics::Exact) };
}

/// Runs `f` with `n` as this thread's numerics, restoring the previous setting afterwards
/// (also when `f` panics).
pub fn with_numerics<R>(n: Numerics, f: impl FnOnce() -> R) -> R {
    struct Restore(Numerics);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(CURRENT.with(|c| c.replace(n)));
    f()
}

/// This thread's numerics ([`Numerics::Exact`] outside [`with_numerics`]).
pub fn current() -> Numerics {
    CURRENT.with(|c| c.get())
}

/// The calling thread's numerics (its [`with_numerics`] setting), to re-establish on the pool
/// thread that runs a forward pass for it ([`super::pool::on_pool`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Carried(Numerics);

impl Carried {
    /// This thread's setting.
    pub(super) fn here() -> Self {
        Self(current())
    }

    /// Runs `f` with this setting on the current thread, restoring the thread's own afterwards
    /// (also when `f` panics).
    pub(super) fn run<R>(self, f: impl FnOnce() -> R) -> R {
        with_numerics(self.0, f)
    }
}
