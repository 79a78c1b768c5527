//! Reading checkpoints: Hugging Face folders (safetensors, see [`hf`]) and GGUF files (also split) into a tensor index (name → file, byte range,
//! type, shape) plus metadata; writing and reading Deltafin packs ([`pack`]); fetching known
//! models into the model cache. Nothing here computes.

pub mod gguf;
mod gguf_meta;
mod gguf_parse;
pub mod gguf_synth;
pub mod gguf_writer;
pub mod hf;
pub mod pack;
mod pack_gguf;
mod pack_verify;
pub mod pack_write;
pub mod synth;
