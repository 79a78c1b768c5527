//! Sessions (owning a model's KV cache, [`crate::models::KvCache`]), prefill and decode, sampling and stop conditions.

pub mod report;
pub mod sampler;
pub mod session;

pub use sampler::{Sampler, SamplerConfig, SamplerOrder};
pub use session::{Finish, GenStats, GenerateOptions, Session};
