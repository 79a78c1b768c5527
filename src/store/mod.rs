//! Weight storage: aligned buffers, direct I/O reads, resident units and the streamer that
//! reads the rest ahead of compute.

pub mod aligned;
pub mod direct;
pub mod plan;
pub mod streamer;
pub mod weights;

pub use aligned::{AlignedBuf, IO_ALIGN};
pub use direct::DirectFile;
pub use streamer::{load_resident, IoStats, ReadRange, Streamer, Unit, UnitBytes};
pub use weights::{Fp8Pack, WeightStore};
