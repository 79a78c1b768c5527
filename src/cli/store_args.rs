//! Options of the expert store shared by `run` and `bench`.

use std::path::{Path, PathBuf};

use sha2::Digest;

use crate::store::io_engine::{
    DEFAULT_DEPTH, DEFAULT_PREFETCH_DEPTH, DEFAULT_REQUEST_BYTES, MAX_DEPTH,
};
use crate::store::plan::parse_size;
use crate::store::{CachePolicy, EngineChoice, ExpertStoreOptions, IoOptions, PrefetchMode};

/// A read depth (`--io-depth`, `--prefetch-depth`) in `1..=`[`MAX_DEPTH`].
fn depth(s: &str) -> Result<usize, String> {
    let d: usize = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a whole number"))?;
    if !(1..=MAX_DEPTH).contains(&d) {
        return Err(format!("{d} is outside 1..={MAX_DEPTH}"));
    }
    Ok(d)
}

/// Expert store flags.
#[derive(clap::Args, Debug, Clone)]
pub struct StoreArgs {
    /// Expert cache policy when experts do not all fit the budget: lfu-da (LFU with dynamic
    /// aging, seeded from the heat file), lru, or none.
    #[arg(long, default_value = "lfu-da")]
    pub cache: CachePolicy,
    /// Heat file (per-(layer, expert) use counts, read at start to seed the cache and merged
    /// at the end). Default: `$DELTAFIN_HOME/heat/NAME-HASH.json` (NAME: the model folder or
    /// file name, HASH: of its absolute path), so model folders are never written to; `none`
    /// turns it off.
    #[arg(long)]
    pub heat_file: Option<String>,
    /// Expert read engine: auto (io_uring, else a pread thread pool), uring, or pool.
    #[arg(long, default_value = "auto")]
    pub io_engine: EngineChoice,
    /// Expert reads in flight at most (io_uring queue depth or pread threads), 1 to 4096.
    #[arg(long, default_value_t = DEFAULT_DEPTH, value_parser = depth)]
    pub io_depth: usize,
    /// Largest single expert read request, e.g. 1M (rounded up to 4 KiB).
    #[arg(long, default_value_t = DEFAULT_REQUEST_BYTES as u64, value_parser = parse_size)]
    pub io_request_size: u64,
    /// The drives' read bandwidth in bytes/s (e.g. from fio, `1.3G`) for the fraction of the
    /// physical limit in the statistics; default: the reads' own busy-time bandwidth (a value
    /// below the rate the reads delivered is replaced by that rate).
    #[arg(long, value_parser = parse_size)]
    pub drive_bandwidth: Option<u64>,
    /// Print the expert store's tracing spans to standard error (one `experts` span per MoE
    /// layer and pass, with hits, misses, bytes, I/O wait and compute time, and its duration).
    #[arg(long)]
    pub trace: bool,
    /// With a pack: check every expert read against its manifest checksum (SHA-256) as it
    /// lands; a mismatch ends the generation with an error naming the files and the expert.
    #[arg(long)]
    pub verify_experts: bool,
    /// Prefetch: guess the next MoE layer's experts by applying its router to this layer's
    /// hidden state (and the next token's first MoE layer from this token's) and read the
    /// guesses at low priority on idle drives: auto (on when the experts lie on two drives or
    /// more), on, or off.
    #[arg(long, default_value = "auto")]
    pub prefetch: PrefetchMode,
    /// A prefetch read starts only while fewer expert reads than this are in flight on its
    /// drive, so a demand read waits behind at most this many prefetch reads per drive
    /// (1 to 4096).
    #[arg(long, default_value_t = DEFAULT_PREFETCH_DEPTH, value_parser = depth)]
    pub prefetch_depth: usize,
    /// Read-ahead of long batches (a prompt's passes): when a layer's batch uses at least 3/4
    /// of its experts, the next MoE layer's experts are all read in file order before its
    /// router runs, in buffers lent by the expert cache's budget: on or off.
    #[arg(long, default_value = "on", value_parser = on_off, action = clap::ArgAction::Set)]
    pub read_ahead: bool,
}

/// `on` or `off`.
fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("'{s}' is not on or off")),
    }
}

impl StoreArgs {
    /// Installs the stderr subscriber for `tracing` ([`super::init_tracing`]): warnings
    /// always, the store's spans too when `--trace` is given.
    pub fn init_tracing(&self) {
        super::init_tracing(self.trace, false);
    }

    /// The heat file for the model at `model` (None when off).
    pub fn heat_path(&self, model: Option<&Path>) -> Option<PathBuf> {
        Self::heat_path_for(self.heat_file.as_deref(), model)
    }

    /// The heat file `flag` names (`none`: off) or, without the flag, the default one for
    /// the model at `model`.
    pub fn heat_path_for(flag: Option<&str>, model: Option<&Path>) -> Option<PathBuf> {
        match flag {
            Some("none") => None,
            Some(p) => Some(PathBuf::from(p)),
            None => {
                let m = model?;
                let abs = std::fs::canonicalize(m).unwrap_or_else(|_| m.to_path_buf());
                let name = abs
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "model".into());
                let digest = sha2::Sha256::digest(abs.as_os_str().as_encoded_bytes());
                let hash: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
                Some(
                    crate::pull::home_dir()
                        .join("heat")
                        .join(format!("{name}-{hash}.json")),
                )
            }
        }
    }

    /// The store options for the model at `model`.
    pub fn options(&self, model: Option<&Path>) -> ExpertStoreOptions {
        ExpertStoreOptions {
            cache: self.cache,
            io: IoOptions {
                engine: self.io_engine,
                depth: self.io_depth.max(1),
                request_bytes: self.io_request_size as usize,
                prefetch_depth: self.prefetch_depth.max(1),
            },
            heat_file: self.heat_path(model),
            verify: self.verify_experts,
            prefetch: self.prefetch,
            read_ahead: self.read_ahead,
        }
    }
}
