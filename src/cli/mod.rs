//! Command-line interface (clap). Each command lives in its own file and calls the library.

use clap::{Parser, Subcommand};

pub mod inspect;
pub mod pull;
pub mod run;

/// Deltafin: run language models larger than RAM by streaming weights from disk.
#[derive(Parser, Debug)]
#[command(name = "deltafin", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Fetch a known model into the model cache ($DELTAFIN_HOME, default ~/.cache/deltafin).
    Pull(pull::PullArgs),
    /// Generate text from a model, streaming weights that do not fit the RAM budget.
    Run(Box<run::RunArgs>),
    /// Print a model's architecture, tensors and byte totals.
    Inspect(inspect::InspectArgs),
}

/// Parses the command line, runs the command and maps errors to exit code 1.
pub fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Pull(a) => pull::run(a),
        Command::Run(a) => run::run(*a),
        Command::Inspect(a) => inspect::run(a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
