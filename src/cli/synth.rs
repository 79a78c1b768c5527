//! `deltafin synth`: write a random-weight checkpoint of a real architecture for benchmarks.

use std::path::PathBuf;

use anyhow::{bail, Result};

use crate::store::plan::parse_size;
use crate::write::synth::{catalog, plan, write, Encoding, Planned, Shape};

/// Arguments of `deltafin synth`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Architectures, presets and encodings (--preset list describes each preset):
  qwen3_moe    tiny, small, qwen3-30b-a3b   hf: bf16; gguf: q4_0 (default), q8_0, q4_k,
               q4_1, q5_1, q2_k, q3_k, q5_k, iq1_s, iq1_m, iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s,
               iq4_nl, iq4_xs, tq1_0, tq2_0
  deepseek_v3  tiny, deepseek-v3            hf: bf16 (default), fp8 (E4M3, 128x128 block scales)
  gpt_oss      tiny, gpt-oss-20b            hf: mxfp4 (default), bf16
  kimi_linear  tiny, kimi-linear-48b-a3b    hf: bf16
  kimi_k3      tiny, kimi-k3                hf: mxfp4 (default; compressed-tensors MXFP4 routed
               experts), gguf: mxfp4 (llama.cpp's kimi-k3 layout); BF16 elsewhere;
               --experts cuts the experts per layer (of deepseek_v3, kimi_linear and qwen3_moe
               too); --experts-per-tok sets qwen3_moe's top-k
Matrices whose rows are not whole 256-element super-blocks fall back as llama.cpp's
quantizer does: q4_k to q5_0, q5_k to q5_1, q2_k/q3_k/tq1_0/tq2_0 to q4_0, iq* to iq4_nl.")]
pub struct SynthArgs {
    /// Architecture (Hugging Face `model_type`): qwen3_moe, deepseek_v3, gpt_oss, kimi_linear
    /// or kimi_k3.
    #[arg(long, default_value = "qwen3_moe")]
    pub arch: String,
    /// Shape preset of the architecture (`--preset list` prints them all).
    #[arg(long)]
    pub preset: String,
    /// Output folder (created; must not hold a model yet), or with `--format gguf` the file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Number of decoder layers (dense ones included), overriding the preset's.
    #[arg(long)]
    pub layers: Option<usize>,
    /// deepseek_v3, kimi_linear, kimi_k3: leading dense layers (`first_k_dense_replace`),
    /// overriding the preset's.
    #[arg(long)]
    pub dense_layers: Option<usize>,
    /// qwen3_moe, kimi_k3, deepseek_v3, kimi_linear: routed experts per MoE layer, overriding the preset's (each expert keeps its
    /// size and each token its top-k, so a decode step reads the same bytes).
    #[arg(long)]
    pub experts: Option<usize>,
    /// qwen3_moe: routed experts each token uses (`num_experts_per_tok`), overriding the
    /// preset's (another family's routing: `--experts 8 --experts-per-tok 2` is Mixtral's).
    #[arg(long, value_name = "K")]
    pub experts_per_tok: Option<usize>,
    /// Approximate size of each safetensors shard.
    #[arg(long, default_value = "4G", value_parser = parse_size)]
    pub shard_size: u64,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Output format: `hf` (a Hugging Face folder) or `gguf` (one llama.cpp GGUF file, `--out`
    /// is then the file path; qwen3_moe and kimi_k3).
    #[arg(long, default_value = "hf")]
    pub format: String,
    /// Weight encoding: bf16, fp8 (deepseek_v3), mxfp4 (gpt_oss experts) for `hf`; q4_0, q8_0,
    /// q4_k, q2_k, iq2_xxs, ... (listed below) for `gguf`. Default: the architecture's first
    /// listed below.
    #[arg(long)]
    pub quant: Option<String>,
    /// Print the planned files and sizes without writing anything.
    #[arg(long)]
    pub dry_run: bool,
}

/// The summary of a checkpoint: `4 layers (1 MoE × 256 experts of 42.01 MiB), hf fp8`.
fn describe(p: &Planned, enc: Encoding) -> String {
    let dense = match p.layers - p.moe_layers {
        0 => String::new(),
        n => format!("{n} dense + "),
    };
    format!(
        "{} layers ({dense}{} MoE × {} experts of {:.2} MiB), {enc}",
        p.layers,
        p.moe_layers,
        p.experts,
        p.expert_bytes as f64 / 1048576.0
    )
}

/// Runs `deltafin synth`.
pub fn run(a: SynthArgs) -> Result<()> {
    let archs = crate::write::synth::archs();
    if !archs.contains(&a.arch.as_str()) {
        bail!("--arch {}: synth writes {} only", a.arch, archs.join(", "));
    }
    let all = catalog();
    if a.preset == "list" {
        for p in &all {
            let encs: Vec<String> = p.shape.encodings().iter().map(|e| e.to_string()).collect();
            outln!("{:12} {:14} {}", p.shape.arch(), p.name, p.description);
            outln!("{:27} encodings: {}", "", encs.join(", "));
        }
        return Ok(());
    }
    let of_arch: Vec<_> = all.iter().filter(|p| p.shape.arch() == a.arch).collect();
    let Some(preset) = of_arch.iter().find(|p| p.name == a.preset) else {
        let names: Vec<&str> = of_arch.iter().map(|p| p.name).collect();
        bail!(
            "unknown {} preset '{}' (known: {})",
            a.arch,
            a.preset,
            names.join(", ")
        );
    };
    let mut shape: Shape = preset.shape.clone();
    shape.set_layers(a.layers, a.dense_layers)?;
    shape.set_experts_per_tok(a.experts_per_tok)?;
    shape.set_experts(a.experts)?;
    let enc = Encoding::parse(&shape, &a.format, a.quant.as_deref())?;
    if a.dry_run {
        let p = plan(&shape, enc, a.shard_size)?;
        for (name, bytes) in &p.files {
            outln!("{bytes:>16} {name}");
        }
        outln!(
            "{:.2} GB in {} files: {}",
            p.total_bytes() as f64 / 1e9,
            p.files.len(),
            describe(&p, enc)
        );
        return Ok(());
    }
    let Some(out) = a.out else {
        bail!("--out DIR is required");
    };
    let t = std::time::Instant::now();
    // a bar on a terminal, a plain line every 10% otherwise
    let mut bar = crate::progress::Progress::new("synth", "written");
    let mut progress = |w, total| bar.set(w, total);
    let p = write(&shape, enc, &out, a.shard_size, a.seed, &mut progress)?;
    bar.finish();
    let secs = t.elapsed().as_secs_f64();
    let gb = p.total_bytes() as f64 / 1e9;
    eprintln!(
        "wrote {} ({gb:.2} GB in {} files: {}) in {secs:.1} s ({:.2} GB/s)",
        out.display(),
        p.files.len(),
        describe(&p, enc),
        gb / secs.max(1e-9)
    );
    Ok(())
}
