//! Weight storage: aligned buffers, direct I/O reads, resident units and the streamer that
//! reads the rest ahead of compute.
//!
//! Files:
//!
//! - `aligned.rs`: heap buffers aligned for direct I/O; `direct.rs`: `O_DIRECT` positional
//!   reads into them, buffered where the file system refuses `O_DIRECT`.
//! - `weights.rs`: the weight store (resident and streamed units); `streamer.rs`: units and the
//!   read-ahead streamer.
//! - `relocate.rs`: pack relocation, a pack's logical coordinates mapped to its physical files.
//! - `experts.rs`: the expert store. `experts/prefetch.rs`: guess prefetch and the read-ahead of
//!   long batches. `experts/speculative.rs`: a verification's draft-only experts count as uses
//!   only once accepted, and rejected drafts' misses leave the cache at the verdict.
//! - `io_engine.rs`: the expert store's read engine, io_uring (`io_engine/uring.rs`) or a pread
//!   pool (`io_engine/pool.rs`).
//! - `expert_cache.rs`: the expert cache (LFU-DA, LRU, none); `heat.rs`: the heat file.
//! - `counters.rs`: raw counters (`ExpertCounters`, per layer `LayerCounters`; a leaf module);
//!   `telemetry.rs`: statistics (snapshots, per-layer `LayerIo`, JSON).
//! - `remote/`: packs on object storage: the S3 client, the fetcher of expert records by
//!   ranged GETs and the local tier that keeps them (`experts/remote.rs` wires them into the
//!   expert store).
//! - `plan.rs`: residency planning under the RAM budget; `drive_probe.rs`: a short random-read
//!   probe of a drive through the read engine (`deltafin doctor`, `deltafin plan --drives`).

pub mod aligned;
pub mod checksum;
pub mod counters;
pub mod direct;
pub mod drive_probe;
pub mod expert_cache;
pub mod experts;
pub mod heat;
pub mod io_engine;
pub mod plan;
pub mod relocate;
pub mod remote;
pub mod streamer;
pub mod telemetry;
pub mod weights;

pub use aligned::{AlignedBuf, IO_ALIGN};
pub use direct::DirectFile;
pub use expert_cache::CachePolicy;
pub use experts::{ExpertCounters, ExpertStore, ExpertStoreOptions, ExpertTransform, PrefetchMode};
pub use io_engine::{EngineChoice, IoOptions};
pub use streamer::{load_resident, IoStats, ReadRange, Streamer, Unit, UnitBytes};
pub use weights::{repack_fp8, Fp8Pack, NextExperts, NextReads, WeightStore};
