//! `deltafin pull NAME`.

/// Arguments of `deltafin pull`.
#[derive(clap::Args, Debug)]
pub struct PullArgs {
    /// Model name, e.g. `gemma-3-270m`.
    pub name: String,
}

/// Runs `deltafin pull`.
pub fn run(args: PullArgs) -> anyhow::Result<()> {
    anyhow::bail!("pull {} is not implemented yet", args.name)
}
