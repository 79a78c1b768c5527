//! Sessions, KV cache, prefill and decode, sampling and stop conditions.

pub mod kv;

pub use kv::KvCache;
