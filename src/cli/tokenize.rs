//! `deltafin tokenize`: the token ids and pieces of a text, as a prompt would be tokenized.

use std::io::Read;
use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::load::open_any;

/// Arguments of `deltafin tokenize`.
#[derive(clap::Args, Debug, Clone)]
pub struct TokenizeArgs {
    /// Model (as for `run`); only its tokenizer is read.
    #[arg(short, long)]
    pub model: Option<PathBuf>,
    /// Text to tokenize (with the model's BOS, as `run` tokenizes a raw prompt); without it,
    /// or when it is `-`, the text is standard input, read verbatim (a trailing newline is
    /// text too).
    pub text: Option<String>,
    /// Keeps special-token text (`<|im_start|>`) literal instead of parsing it into control
    /// ids, as `run --no-parse-special` does.
    #[arg(long)]
    pub no_parse_special: bool,
    /// Adds no BOS (nor anything else the tokenizer adds around a text).
    #[arg(long)]
    pub no_bos: bool,
    /// Prints only the ids, on one line: `[480, 39, 68]`.
    #[arg(long, conflicts_with = "json")]
    pub ids: bool,
    /// Prints one JSON object: `{"text": …, "n_tokens": N, "tokens": [{"id": ID, "piece":
    /// PIECE}, …]}` (pieces as `token_text` shows them, special tokens as their text).
    #[arg(long)]
    pub json: bool,
}

/// The `--ids` line: the ids as a list, `[1, 2, 3]` (llama.cpp's `--ids` form).
pub fn ids_line(ids: &[u32]) -> String {
    let v: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    format!("[{}]", v.join(", "))
}

/// The `--json` object of `text` tokenized as `ids`.
pub fn tokens_json(
    text: &str,
    ids: &[u32],
    tok: &crate::tokenizer::ModelTokenizer,
) -> serde_json::Value {
    let tokens: Vec<serde_json::Value> = ids
        .iter()
        .map(|&id| serde_json::json!({"id": id, "piece": tok.token_text(id)}))
        .collect();
    serde_json::json!({"text": text, "n_tokens": ids.len(), "tokens": tokens})
}

/// Runs `deltafin tokenize`: prints the text, the count, and `ID -> 'PIECE'` per token, or
/// the `--ids` line or the `--json` object.
///
/// Errors: the model cannot be opened; standard input is not UTF-8 text.
pub fn run(a: TokenizeArgs) -> Result<()> {
    let model = super::model_path(a.model.as_deref())?;
    let tok = open_any(model.as_deref())?.tokenizer()?;
    let text = match a.text.as_deref() {
        None | Some("-") => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("reading the text from standard input")?;
            s
        }
        Some(t) => t.to_string(),
    };
    let ids = tok.encode_text(&text, !a.no_bos, !a.no_parse_special)?;
    if a.ids {
        outln!("{}", ids_line(&ids));
    } else if a.json {
        outln!("{}", tokens_json(&text, &ids, &tok));
    } else {
        out!("{}", super::run::describe_prompt(&text, &ids, &tok));
    }
    Ok(())
}
