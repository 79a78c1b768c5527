//! Reading checkpoints, and only reading: GGUF files, also split ([`gguf`], with its typed
//! metadata getters), Hugging Face safetensors folders ([`hf`]) and Deltafin packs ([`pack`]:
//! the format, and opening a pack as the GGUF or Hugging Face model it was made from), each
//! into the tensor index ([`tensor`]: name → file, byte range, type, shape) plus metadata.
//! Only headers and metadata are read here, never tensor data.
//!
//! Nothing here writes a file, computes or touches the network: writing packs, GGUF files and
//! synthetic models is [`crate::write`]'s, fetching models [`crate::pull`]'s. This module
//! must never import `write`, `models`, `engine` or `cli`.

pub mod gguf;
mod gguf_meta;
pub(crate) mod gguf_parse;
mod gguf_value;
pub mod hf;
pub mod pack;
mod pack_check;
mod pack_format;
mod pack_info;
pub mod tensor;

pub use crate::store::direct::check_regular;
