//! `deltafin inspect`: what a model file holds.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Result;

use crate::source::gguf::Value;

/// Arguments of `deltafin inspect`.
#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// Model: a .gguf file or a folder holding one model (default: the demo model).
    #[arg(short, long)]
    pub model: Option<PathBuf>,
    /// Also list every tensor.
    #[arg(long)]
    pub tensors: bool,
}

/// Runs `deltafin inspect`.
pub fn run(a: InspectArgs) -> Result<()> {
    let g = super::run::open_model(a.model.as_ref())?;
    println!(
        "files:        {}",
        g.files
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "format:       GGUF v{} (alignment {})",
        g.version, g.alignment
    );
    println!("architecture: {}", g.architecture()?);
    if let Some(n) = g.opt_str("general.name")? {
        println!("name:         {n}");
    }
    println!("metadata:");
    for (k, v) in &g.metadata {
        let shown = match v {
            Value::Array(a) if a.len() > 8 => format!("[{} values]", a.len()),
            Value::String(s) if s.len() > 80 => format!("({} chars)", s.len()),
            v => format!("{v}"),
        };
        println!("  {k} = {shown}");
    }
    let mut by_type: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
    for t in &g.tensors {
        let e = by_type.entry(t.ty.name()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes;
    }
    println!(
        "tensors:      {} ({:.1} MiB)",
        g.tensors.len(),
        g.total_tensor_bytes() as f64 / 1048576.0
    );
    for (ty, (n, b)) in by_type {
        println!(
            "  {ty:<6} {n:>5} tensors {:>10.1} MiB",
            b as f64 / 1048576.0
        );
    }
    if a.tensors {
        for t in &g.tensors {
            println!(
                "  {:<40} {:<5} {:?} file {} offset {} bytes {}",
                t.name,
                t.ty.name(),
                t.shape,
                t.file,
                t.offset,
                t.n_bytes
            );
        }
    }
    Ok(())
}
