//! Sessions (owning a model's KV cache, [`crate::models::KvCache`]), prefill and decode, sampling and stop conditions,
//! and speculative decoding (draft sources, verification, rollback).

pub mod draft;
pub mod draft_mtp;
mod generate;
pub mod report;
pub mod sampler;
pub mod session;
pub mod spec_policy;
pub mod spec_types;
pub mod speculative;

pub use sampler::{Sampler, SamplerConfig, SamplerOrder};
pub use session::{Finish, GenStats, GenerateOptions, Session};
pub use speculative::{SpecConfig, SpecStats, Speculator};
