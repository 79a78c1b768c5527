//! Weight storage: aligned buffers, direct I/O reads, resident units and the streamer that
//! reads the rest ahead of compute.

pub mod aligned;
pub mod counters;
pub mod direct;
pub mod expert_cache;
pub mod experts;
pub mod heat;
pub mod io_engine;
pub mod plan;
pub mod relocate;
pub mod streamer;
pub mod telemetry;
pub mod weights;

pub use aligned::{AlignedBuf, IO_ALIGN};
pub use direct::DirectFile;
pub use expert_cache::CachePolicy;
pub use experts::{ExpertCounters, ExpertStore, ExpertStoreOptions, ExpertTransform, PrefetchMode};
pub use io_engine::{EngineChoice, IoOptions};
pub use streamer::{load_resident, IoStats, ReadRange, Streamer, Unit, UnitBytes};
pub use weights::{repack_fp8, Fp8Pack, WeightStore};
