//! Sessions, KV cache, prefill and decode, sampling and stop conditions.

pub mod kv;
pub mod sampler;

pub use kv::KvCache;
pub use sampler::{Sampler, SamplerConfig};
