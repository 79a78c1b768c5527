//! Deltafin's `quant` and `kernels` modules compiled on their own (ARCHITECTURE.md: `quant`
//! imports nothing in the crate, `kernels` only `quant`), for `tools/neon/test.sh`: cross-building
//! the whole crate for aarch64 compiles every dependency (TLS, HTTP, tokenizers) that these two
//! modules never use. The sources are the crate's own files, not copies.
#![allow(dead_code, unused_imports)]

#[path = "../../src/kernels/mod.rs"]
pub mod kernels;
#[path = "../../src/quant/mod.rs"]
pub mod quant;
