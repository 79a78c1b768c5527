//! `deltafin tokenize`: the token ids and pieces of a text, as a prompt would be tokenized.

use std::path::PathBuf;

use anyhow::Result;

use crate::load::open_any;

/// Arguments of `deltafin tokenize`.
#[derive(clap::Args, Debug, Clone)]
pub struct TokenizeArgs {
    /// Model (as for `run`); only its tokenizer is read.
    #[arg(short, long)]
    pub model: Option<PathBuf>,
    /// Text to tokenize (with the model's BOS, as `run` tokenizes a raw prompt).
    pub text: String,
    /// Keeps special-token text (`<|im_start|>`) literal instead of parsing it into control
    /// ids, as `run --no-parse-special` does.
    #[arg(long)]
    pub no_parse_special: bool,
}

/// Runs `deltafin tokenize`: prints the text, the count, and `ID -> 'PIECE'` per token.
pub fn run(a: TokenizeArgs) -> Result<()> {
    let model = super::model_path(a.model.as_deref())?;
    let tok = open_any(model.as_deref())?.tokenizer()?;
    let ids = tok.encode_prompt(&a.text, !a.no_parse_special)?;
    print!("{}", super::run::describe_prompt(&a.text, &ids, &tok));
    Ok(())
}
