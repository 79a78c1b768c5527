//! Reading checkpoints, and only reading: GGUF files, also split ([`gguf`], with its typed
//! metadata getters), Hugging Face safetensors folders ([`hf`]) and Deltafin packs ([`pack`]:
//! the format, and opening a pack as the GGUF or Hugging Face model it was made from), each
//! into the tensor index ([`tensor`]: name → file, byte range, type, shape) plus metadata.
//! Only headers and metadata are read here, never tensor data.
//!
//! Nothing here writes a file, computes or touches the network: writing packs, GGUF files and
//! synthetic models is [`crate::write`]'s, fetching models [`crate::pull`]'s. This module
//! must never import `write`, `models`, `engine` or `cli`.
//!
//! Files:
//!
//! - `gguf.rs`: the GGUF model reader (versions 2 and 3, split files, a folder holding one
//!   model); `gguf_parse.rs`: the file parser, every size read from the file checked before it
//!   is used; `gguf_meta.rs`: typed metadata getters; `gguf_value.rs`: metadata values and the
//!   reader's errors.
//! - `hf.rs`: Hugging Face folders: safetensors headers and the sharded index. A multimodal
//!   checkpoint's `language_model.` prefix is removed, so its text model has text-only names.
//! - `pack.rs`: opening a pack as the model it was made of; `pack_format.rs`: the manifest's
//!   types, read with a size bound; `pack_check.rs`: every manifest field checked against the
//!   others and the files, for opening and `--verify` alike; `pack_info.rs`: what the loaders
//!   need of an opened pack beyond its tensor index.
//! - `tensor.rs`: the tensor index (name → file, byte range, type, shape).

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
