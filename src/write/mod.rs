//! Writing model files: everything in Deltafin that produces weights on disk rather than reading
//! them. [`pack`] writes, resumes and verifies Deltafin packs from a Hugging Face folder or a
//! GGUF file; [`synth`] writes synthetic checkpoints (random weights in a real architecture's
//! layout, Hugging Face or GGUF, up to tens of gigabytes) for tests and benchmarks;
//! [`gguf_writer`] is the small GGUF writer both of them and the tests use.
//!
//! This module may read models through [`crate::source`] (and the pack format it defines), but
//! [`crate::source`] never uses anything here: running a model never writes one. Nothing here
//! computes or runs a model, and nothing here touches the network (that is [`crate::pull`]).
//!
//! Files:
//!
//! - `pack/`: planning (`plan.rs`), writing and resuming (`writer.rs`), verifying (`verify.rs`,
//!   reading back through `records.rs`); what Hugging Face and GGUF sources add (`hf.rs`,
//!   `gguf.rs`); every tensor checked by the family's loader before writing (`input.rs`);
//!   `guard.rs`: the lock, drive-file ownership, free space and the copied files, settled before
//!   writing.
//! - `synth/`: synthetic checkpoints, Hugging Face and GGUF: shapes and presets (`mod.rs`,
//!   `catalog()`), one writer per family, the planned files and sizes (`planned.rs`), random
//!   weight encoders (`fill.rs`, `fill_lowbit.rs`).
//! - `space.rs`: free space on the file systems a writer fills, checked before the first byte.
//! - `gguf_writer.rs`: the GGUF writer.

pub mod gguf_writer;
pub mod pack;
mod space;
pub mod synth;
