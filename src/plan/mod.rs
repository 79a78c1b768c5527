//! Planning a run before it happens (`deltafin plan`, `deltafin doctor`): a model's byte
//! shape read without loading its weights, the machine's memory, drives and compute speed,
//! and the arithmetic that turns them into a placement and a predicted speed.
//!
//! Files:
//!
//! - `predict.rs`: the arithmetic, from byte counts alone (placement under the budget, hit
//!   rate, decode tok/s and its bound per drive count, time to first token, what to add
//!   first, recommended flags); tests in `predict_tests.rs`.
//! - `shape.rs`: a model's shape from an opened model (GGUF, Hugging Face folder, pack) or a
//!   `synth` preset.
//! - `compute.rs`: the kernels' speed on this machine, in weight bytes per second.
//! - `machine.rs`: the CPU, memory, drive devices, open-file limit and GPUs, for `doctor`.
//!
//! The drive probe itself is the store's (`store::drive_probe`), through its read engine.

pub mod compute;
pub mod machine;
pub mod predict;
pub mod shape;

pub use predict::{ModelShape, Plan, PlanInputs, Rates, Routing};
