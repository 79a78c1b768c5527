//! Options of the expert store shared by `run`, `serve`, `chat` and `bench`. Each flag's
//! help is one line; docs/commands.md explains them.

use std::path::{Path, PathBuf};

use sha2::Digest;

use crate::store::io_engine::{
    DEFAULT_DEPTH, DEFAULT_PREFETCH_DEPTH, DEFAULT_REQUEST_BYTES, MAX_DEPTH,
};
use crate::store::plan::parse_size;
use crate::store::remote::FetchOptions;
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

/// The help heading of [`StoreArgs`].
const HEADING: &str = "Expert store";

/// Expert store flags (`run`, `serve`, `chat`, `bench`).
#[derive(clap::Args, Debug, Clone)]
pub struct StoreArgs {
    /// Expert cache policy: lfu-da, lru, or none
    #[arg(value_name = "POLICY", help_heading = HEADING, long, default_value = "lfu-da")]
    pub cache: CachePolicy,
    /// Expert use counts to seed the cache, none: off [default: per model, in $DELTAFIN_HOME]
    #[arg(help_heading = HEADING, long, value_name = "FILE")]
    pub heat_file: Option<String>,
    /// Expert read engine: auto (io_uring, else pool), uring, or pool
    #[arg(value_name = "ENGINE", help_heading = HEADING, long, default_value = "auto")]
    pub io_engine: EngineChoice,
    /// Expert reads in flight at most, 1 to 4096
    #[arg(value_name = "N", help_heading = HEADING, long, default_value_t = DEFAULT_DEPTH, value_parser = depth)]
    pub io_depth: usize,
    /// Largest expert read request, e.g. 1M (rounded up to 4 KiB)
    #[arg(value_name = "SIZE", help_heading = HEADING, long, default_value_t = DEFAULT_REQUEST_BYTES as u64, value_parser = parse_size)]
    pub io_request_size: u64,
    /// Drive read bandwidth per second, for the physical limit [default: measured]
    #[arg(value_name = "BYTES", help_heading = HEADING, long, value_parser = parse_size)]
    pub drive_bandwidth: Option<u64>,
    /// Print the expert store's spans (per MoE layer and pass) to standard error
    #[arg(help_heading = HEADING, long)]
    pub trace: bool,
    /// With a pack: check each expert and spine read against the manifest (the default for packs)
    #[arg(help_heading = HEADING, long, conflicts_with = "no_verify_experts")]
    pub verify_experts: bool,
    /// With a pack: do not check expert or spine reads (checked with xxh3-128 by default)
    #[arg(help_heading = HEADING, long)]
    pub no_verify_experts: bool,
    /// Prefetch the next layer's likely experts: auto (2+ drives), on, off
    #[arg(value_name = "MODE", help_heading = HEADING, long, default_value = "auto")]
    pub prefetch: PrefetchMode,
    /// Prefetch only while a drive has fewer reads in flight, 1 to 4096
    #[arg(value_name = "N", help_heading = HEADING, long, default_value_t = DEFAULT_PREFETCH_DEPTH, value_parser = depth)]
    pub prefetch_depth: usize,
    /// Read a long batch's next layer's experts ahead: on or off
    #[arg(value_name = "ON_OFF", help_heading = HEADING, long, default_value = "on", value_parser = on_off, action = clap::ArgAction::Set)]
    pub read_ahead: bool,
    #[command(flatten)]
    pub s3: S3Args,
}

/// The help heading of [`S3Args`].
const S3_HEADING: &str = "Object storage (-m s3://BUCKET/PREFIX)";

/// Flags of packs on object storage (docs/object-storage.md); endpoint, region and
/// credentials come from the standard `AWS_*` variables and profile files.
#[derive(clap::Args, Debug, Clone)]
pub struct S3Args {
    /// Keep fetched expert records (and the pack's spine) in this folder on a local drive
    #[arg(help_heading = S3_HEADING, long, value_name = "DIR")]
    pub local_cache: Option<PathBuf>,
    /// Bytes of records --local-cache may hold, e.g. 200G [default: the whole pack]
    #[arg(value_name = "SIZE", help_heading = S3_HEADING, long, value_parser = parse_size, requires = "local_cache")]
    pub local_cache_size: Option<u64>,
    /// Expert GETs in flight at most, 1 to 4096
    #[arg(value_name = "N", help_heading = S3_HEADING, long, default_value_t = crate::store::remote::client::DEFAULT_CONCURRENCY, value_parser = depth)]
    pub s3_concurrency: usize,
    /// Seconds one request may take before it is tried again
    #[arg(value_name = "SECS", help_heading = S3_HEADING, long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub s3_timeout: u64,
    /// Tries after the first before a failed GET ends the run
    #[arg(value_name = "N", help_heading = S3_HEADING, long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub s3_retries: u32,
}

impl S3Args {
    /// The fetch options these flags give.
    pub fn fetch(&self) -> FetchOptions {
        FetchOptions {
            concurrency: self.s3_concurrency,
            timeout: std::time::Duration::from_secs(self.s3_timeout),
            retries: self.s3_retries,
            ..FetchOptions::default()
        }
    }

    /// The path `model` names ([`super::model_path`]), an `s3://` pack's local copy being
    /// kept in `--local-cache` (default `$DELTAFIN_HOME/remote`).
    ///
    /// Errors: as [`super::model_path_s3`].
    pub fn model_path(&self, model: Option<&Path>) -> anyhow::Result<Option<PathBuf>> {
        super::model_path_s3(model, self.local_cache.as_deref(), &self.fetch())
    }
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
            // packs are checked unless --no-verify-experts; --verify-experts insists (and is
            // refused for a model that is not a pack)
            verify: self.verify_experts
                || (!self.no_verify_experts && model.is_some_and(crate::source::pack::is_pack)),
            prefetch: self.prefetch,
            read_ahead: self.read_ahead,
            remote: self.s3.fetch(),
            local_cache: self
                .s3
                .local_cache
                .as_ref()
                .map(|_| self.s3.local_cache_size.unwrap_or(u64::MAX)),
        }
    }
}
