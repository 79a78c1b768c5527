//! Sessions, KV cache, prefill and decode, sampling and stop conditions.

pub mod kv;
pub mod report;
pub mod sampler;
pub mod session;

pub use kv::KvCache;
pub use sampler::{Sampler, SamplerConfig};
pub use session::{Finish, GenStats, GenerateOptions, Session};
