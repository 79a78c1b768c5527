//! `deltafin inspect`: what a model holds — format, architecture, metadata, tensor bytes by
//! type, and the split between the spine (always resident candidates) and routed experts.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Result;

use crate::load::{open_any, OpenedModel};
use crate::source::gguf::Value;
use crate::source::tensor::TensorInfo;

/// Arguments of `deltafin inspect`.
#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// Model: a .gguf file, a folder holding one GGUF model, a Hugging Face folder, or a pack
    /// folder (default: the demo model).
    #[arg(short, long)]
    pub model: Option<PathBuf>,
    /// Also list every tensor.
    #[arg(long)]
    pub tensors: bool,
}

/// Whether tensor `name` holds routed-expert weights, as the model's family names them in
/// the registry ([`crate::models::registry::ExpertNames`]); false for a family without
/// experts or an architecture the registry does not know.
fn is_expert_tensor(m: &OpenedModel, name: &str) -> bool {
    m.family()
        .and_then(|f| f.experts)
        .is_some_and(|e| e.is_expert(name))
}

/// Number of routed experts per MoE layer, from the metadata or config.
fn n_experts(m: &OpenedModel) -> Option<u64> {
    match m {
        OpenedModel::Gguf(g) => {
            let arch = g.architecture().ok()?;
            g.opt_u64(&format!("{arch}.expert_count")).ok().flatten()
        }
        OpenedModel::Hf(h) => ["num_experts", "num_local_experts", "n_routed_experts"]
            .iter()
            .find_map(|k| h.config.get(*k).and_then(|v| v.as_u64())),
    }
}

fn mib(b: u64) -> String {
    format!("{b} bytes ({:.1} MiB)", b as f64 / 1048576.0)
}

/// Runs `deltafin inspect`.
pub fn run(a: InspectArgs) -> Result<()> {
    let model = super::model_path(a.model.as_deref())?;
    let m = open_any(model.as_deref())?;
    let (files, tensors): (&[PathBuf], &[TensorInfo]) = match &m {
        OpenedModel::Gguf(g) => (&g.files, &g.tensors),
        OpenedModel::Hf(h) => (&h.files, &h.tensors),
    };
    let names: Vec<String> = files.iter().map(|p| p.display().to_string()).collect();
    println!("files:        {}", names.join(", "));
    let pack = match &m {
        OpenedModel::Gguf(g) => &g.pack,
        OpenedModel::Hf(h) => &h.pack,
    };
    if let Some(p) = pack {
        let m = crate::source::pack::Manifest::read(&p.dir)?;
        println!(
            "format:       Deltafin pack v{} ({} over {} drive(s), {} expert records) of {} ({})",
            m.format_version,
            m.placement,
            m.drives.len(),
            m.experts.len(),
            m.source.path,
            m.source.format
        );
    }
    match &m {
        OpenedModel::Gguf(g) => {
            if g.pack.is_none() {
                println!(
                    "format:       GGUF v{} (alignment {})",
                    g.version, g.alignment
                );
            }
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
        }
        OpenedModel::Hf(h) => {
            if h.pack.is_none() {
                println!("format:       Hugging Face folder (safetensors)");
            }
            let mt = h
                .config
                .get("model_type")
                .and_then(|v| v.as_str())
                .unwrap_or("?");
            println!("architecture: {mt}");
            println!("config:");
            if let Some(obj) = h.config.as_object() {
                for (k, v) in obj {
                    println!("  {k} = {v}");
                }
            }
        }
    }
    let mut by_type: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
    let (mut spine, mut experts) = (0u64, 0u64);
    for t in tensors {
        let e = by_type.entry(t.ty.name()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes;
        if is_expert_tensor(&m, &t.name) {
            experts += t.n_bytes;
        } else {
            spine += t.n_bytes;
        }
    }
    println!("tensors:      {}, {}", tensors.len(), mib(spine + experts));
    for (ty, (n, b)) in by_type {
        println!(
            "  {ty:<6} {n:>5} tensors {:>10.1} MiB",
            b as f64 / 1048576.0
        );
    }
    println!("spine:        {}", mib(spine));
    println!("experts:      {}", mib(experts));
    if let Some(ne) = n_experts(&m).filter(|&n| n > 0 && experts > 0) {
        let moe_layers = tensors
            .iter()
            .filter(|t| is_expert_tensor(&m, &t.name))
            .filter_map(|t| {
                t.name
                    .split('.')
                    .nth(if t.name.starts_with("blk.") { 1 } else { 2 })
            })
            .collect::<std::collections::BTreeSet<_>>()
            .len() as u64;
        let per = experts / (ne * moe_layers.max(1));
        println!(
            "per expert:   {} ({ne} experts in each of {moe_layers} MoE layers)",
            mib(per)
        );
    }
    if a.tensors {
        for t in tensors {
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
