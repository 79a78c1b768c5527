//! Reading checkpoints: GGUF files (also split) into a tensor index (name → file, byte range,
//! type, shape) plus metadata. Nothing here computes.

pub mod gguf;
pub mod pull;
