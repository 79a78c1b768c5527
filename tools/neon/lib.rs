//! Deltafin's `quant` and `backend` modules compiled on their own (ARCHITECTURE.md: `quant`
//! imports nothing in the crate, `backend` only `quant`), for `tools/neon/test.sh`: cross-building
//! the whole crate for aarch64 compiles every dependency (TLS, HTTP, tokenizers) that these two
//! modules never use. The sources are the crate's own files, not copies.
#![allow(dead_code, unused_imports)]

#[path = "../../src/backend/mod.rs"]
pub mod backend;
#[path = "../../src/quant/mod.rs"]
pub mod quant;
