//! Writing model files: everything in Deltafin that produces weights on disk rather than reading
//! them. [`pack`] writes, resumes and verifies Deltafin packs from a Hugging Face folder or a
//! GGUF file; [`synth`] writes synthetic checkpoints (random weights in a real architecture's
//! layout, Hugging Face or GGUF, up to tens of gigabytes) for tests and benchmarks;
//! [`gguf_writer`] is the small GGUF writer both of them and the tests use.
//!
//! This module may read models through [`crate::source`] (and the pack format it defines), but
//! [`crate::source`] never uses anything here: running a model never writes one. Nothing here
//! computes or runs a model, and nothing here touches the network (that is [`crate::pull`]).

pub mod gguf_writer;
pub mod pack;
mod space;
pub mod synth;
