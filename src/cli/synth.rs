//! `deltafin synth`: write a random-weight checkpoint of a real architecture for benchmarks.

use std::path::PathBuf;

use anyhow::{bail, Result};

use crate::source::gguf_synth::write_qwen3moe_gguf;
use crate::source::synth::{presets, write_qwen3_moe};
use crate::store::plan::parse_size;

/// Arguments of `deltafin synth`.
#[derive(clap::Args, Debug)]
pub struct SynthArgs {
    /// Architecture (Hugging Face `model_type`); today `qwen3_moe`.
    #[arg(long, default_value = "qwen3_moe")]
    pub arch: String,
    /// Shape preset: tiny, small, qwen3-30b-a3b (`--preset list` prints them).
    #[arg(long)]
    pub preset: String,
    /// Output folder (created; must not hold a model yet), or with `--format gguf` the file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Number of layers, overriding the preset's.
    #[arg(long)]
    pub layers: Option<usize>,
    /// Approximate size of each safetensors shard.
    #[arg(long, default_value = "4G", value_parser = parse_size)]
    pub shard_size: u64,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Output format: `hf` (a Hugging Face folder, BF16) or `gguf` (one llama.cpp `qwen3moe`
    /// GGUF file; `--out` is then the file path).
    #[arg(long, default_value = "hf")]
    pub format: String,
    /// Encoding of the GGUF matrices: q4_0 or q8_0 (`--format gguf` only).
    #[arg(long, default_value = "q4_0")]
    pub quant: String,
}

/// Runs `deltafin synth`.
pub fn run(a: SynthArgs) -> Result<()> {
    if a.arch != "qwen3_moe" {
        bail!("--arch {}: only qwen3_moe can be synthesized yet", a.arch);
    }
    let all = presets();
    if a.preset == "list" {
        for (n, d, _) in &all {
            println!("{n:16} {d}");
        }
        return Ok(());
    }
    let Some((_, _, shape)) = all.iter().find(|p| p.0 == a.preset) else {
        let names: Vec<&str> = all.iter().map(|p| p.0).collect();
        bail!(
            "unknown preset '{}' (known: {})",
            a.preset,
            names.join(", ")
        );
    };
    let Some(out) = a.out else {
        bail!("--out DIR is required");
    };
    let mut shape = shape.clone();
    if let Some(l) = a.layers {
        if l == 0 {
            bail!("--layers must be at least 1");
        }
        shape.num_hidden_layers = l;
    }
    let gguf_quant = match (a.format.as_str(), a.quant.as_str()) {
        ("hf", _) => None,
        ("gguf", "q4_0") => Some(crate::quant::GgmlType::Q4_0),
        ("gguf", "q8_0") => Some(crate::quant::GgmlType::Q8_0),
        ("gguf", q) => bail!("--quant {q}: synthetic GGUF matrices are q4_0 or q8_0"),
        (f, _) => bail!("--format {f}: expected hf or gguf"),
    };
    let t = std::time::Instant::now();
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
        )
        .expect("template"),
    );
    let mut progress = |w, total| {
        bar.set_length(total);
        bar.set_position(w);
    };
    match gguf_quant {
        None => write_qwen3_moe(&shape, &out, a.shard_size as usize, a.seed, &mut progress)?,
        Some(q) => write_qwen3moe_gguf(&shape, q, &out, a.seed, &mut progress)?,
    }
    bar.finish_and_clear();
    let total = bar.length().unwrap_or(0);
    let expert_bytes = match gguf_quant {
        None => shape.expert_bytes(),
        Some(q) => 3 * q.row_bytes(shape.hidden_size).unwrap_or(0) * shape.moe_intermediate_size,
    };
    eprintln!(
        "wrote {} ({:.2} GB, {} layers × {} experts of {:.2} MiB) in {:.1} s",
        out.display(),
        total as f64 / 1e9,
        shape.num_hidden_layers,
        shape.num_experts,
        expert_bytes as f64 / 1048576.0,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}
