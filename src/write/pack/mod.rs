//! Writing, resuming and verifying Deltafin packs. The format, and opening a pack to run it,
//! are [`crate::source::pack`]'s; this module only produces packs and checks them.
//!
//! [`write_pack`] plans the whole layout first (spine offsets, each expert's record and its
//! extents on the drives; `plan.rs`) and keeps that plan in `pack.plan.json`; a later run with
//! the same plan resumes: records listed in `pack.journal` whose bytes read back with the
//! journaled checksum are skipped (`writer.rs`). Data files are synced before their records
//! enter the journal, and `manifest.json` is written last, by rename, so an unfinished pack is
//! never loadable. The source is only ever read. Before the first byte is written, the writer
//! takes the folder's lock, and checks the source's configuration and every tensor (as its
//! family's loader resolves them, `input.rs`), that no drive file of another pack would be written and that every file system has room (`guard.rs`); a finished
//! pack stays loadable until something in it must change, and one made with other settings is
//! replaced only when asked ([`PackOptions::overwrite`]). Hugging Face folders (`hf.rs`) and GGUF files
//! (`gguf.rs`) are packed by the same code over one description of the source (its files and
//! tensor index, `input.rs`). [`verify_pack`] reads every checksum back (`verify.rs`).

mod gguf;
mod guard;
mod hf;
mod input;
mod plan;
mod records;
mod verify;
mod writer;

pub use plan::{PackOptions, PackPlacement};
pub use verify::{verify_pack, Mismatch};
pub use writer::{write_pack, PackReport};
