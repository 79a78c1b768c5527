//! Deltafin: runs language models whose weights are larger than RAM by reading them from
//! disk as they are needed. `ARCHITECTURE.md` at the repository root is the map of the
//! modules.

pub mod backend;
pub mod cli;
pub mod engine;
pub mod fuzzing;
pub mod load;
pub mod models;
pub mod plan;
pub mod progress;
pub mod pull;
pub mod quant;
pub mod remote;
pub mod serve;
pub mod source;
pub mod store;
pub mod tokenizer;
pub mod write;
