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
    /// Prints the same facts as one JSON object instead: `files`, `format`, `architecture`,
    /// `name`, `metadata` (GGUF) or `config` (Hugging Face), `tensor_count`, `tensor_bytes`,
    /// `by_type` (per type: `tensors`, `bytes`), `spine_bytes`, `expert_bytes`, `per_expert`
    /// (MoE only: `bytes`, `experts`, `moe_layers`), and `tensors` with `--tensors`.
    #[arg(long)]
    pub json: bool,
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

/// A GGUF metadata value as JSON; an array of more than 8 values as `{"array_len": N}`, as
/// the text shows it (`[N values]`: a vocabulary is not worth printing).
fn value_json(v: &Value) -> serde_json::Value {
    use serde_json::json;
    match v {
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
        // the shortest decimal of the f32 (1e-6, not 9.99999997e-7)
        Value::F32(x) => json!(x.to_string().parse::<f64>().unwrap_or(f64::NAN)),
        Value::F64(x) => json!(x),
        Value::Bool(x) => json!(x),
        Value::String(x) => json!(x),
        Value::Array(a) if a.len() > 8 => json!({ "array_len": a.len() }),
        Value::Array(a) => a.iter().map(value_json).collect(),
    }
}

fn mib(b: u64) -> String {
    format!("{b} bytes ({:.1} MiB)", b as f64 / 1048576.0)
}

/// Runs `deltafin inspect`: the facts as text, or as JSON with `--json`.
///
/// Errors: the model cannot be opened; a pack's manifest cannot be read.
pub fn run(a: InspectArgs) -> Result<()> {
    let model = super::model_path(a.model.as_deref())?;
    let m = open_any(model.as_deref())?;
    let f = facts(&m, a.tensors)?;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&f)?);
    } else {
        out!("{}", text(&f));
    }
    Ok(())
}

/// What `inspect` reports, as the `--json` object (the text is written from it).
fn facts(m: &OpenedModel, with_tensors: bool) -> Result<serde_json::Value> {
    use serde_json::json;
    let (files, tensors): (&[PathBuf], &[TensorInfo]) = match m {
        OpenedModel::Gguf(g) => (&g.files, &g.tensors),
        OpenedModel::Hf(h) => (&h.files, &h.tensors),
    };
    let names: Vec<String> = files.iter().map(|p| p.display().to_string()).collect();
    let mut v = json!({ "files": names });
    let pack = match m {
        OpenedModel::Gguf(g) => &g.pack,
        OpenedModel::Hf(h) => &h.pack,
    };
    if let Some(p) = pack {
        let mf = crate::source::pack::Manifest::read(&p.dir)?;
        v["format"] = json!({
            "kind": "pack", "version": mf.format_version,
            "placement": mf.placement.to_string(), "drives": mf.drives.len(),
            "expert_records": mf.experts.len(),
            "source": mf.source.path, "source_format": mf.source.format.to_string(),
        });
    }
    match m {
        OpenedModel::Gguf(g) => {
            if g.pack.is_none() {
                v["format"] =
                    json!({"kind": "gguf", "version": g.version, "alignment": g.alignment});
            }
            v["architecture"] = g.architecture()?.into();
            v["name"] = g.opt_str("general.name")?.into();
            let meta: serde_json::Map<String, serde_json::Value> = g
                .metadata
                .iter()
                .map(|(k, x)| (k.clone(), value_json(x)))
                .collect();
            v["metadata"] = meta.into();
        }
        OpenedModel::Hf(h) => {
            if h.pack.is_none() {
                v["format"] = json!({"kind": "safetensors"});
            }
            let mt = h.config.get("model_type").and_then(|x| x.as_str());
            v["architecture"] = mt.unwrap_or("?").into();
            v["config"] = h.config.clone();
        }
    }
    let mut by_type: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
    let (mut spine, mut experts) = (0u64, 0u64);
    for t in tensors {
        let e = by_type.entry(t.ty.name()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes;
        if is_expert_tensor(m, &t.name) {
            experts += t.n_bytes;
        } else {
            spine += t.n_bytes;
        }
    }
    v["tensor_count"] = tensors.len().into();
    v["tensor_bytes"] = (spine + experts).into();
    v["by_type"] = by_type
        .iter()
        .map(|(ty, (n, b))| (ty.to_string(), json!({"tensors": n, "bytes": b})))
        .collect::<serde_json::Map<_, _>>()
        .into();
    v["spine_bytes"] = spine.into();
    v["expert_bytes"] = experts.into();
    if let Some(ne) = n_experts(m).filter(|&n| n > 0 && experts > 0) {
        let moe_layers = tensors
            .iter()
            .filter(|t| is_expert_tensor(m, &t.name))
            .filter_map(|t| {
                t.name
                    .split('.')
                    .nth(if t.name.starts_with("blk.") { 1 } else { 2 })
            })
            .collect::<std::collections::BTreeSet<_>>()
            .len() as u64;
        let per = experts / (ne * moe_layers.max(1));
        v["per_expert"] = json!({"bytes": per, "experts": ne, "moe_layers": moe_layers});
    }
    if with_tensors {
        v["tensors"] = tensors
            .iter()
            .map(|t| {
                json!({"name": t.name, "type": t.ty.name(), "shape": t.shape, "file": t.file,
                       "offset": t.offset, "bytes": t.n_bytes})
            })
            .collect();
    }
    Ok(v)
}

/// The text of `inspect` from its [`facts`].
fn text(f: &serde_json::Value) -> String {
    use std::fmt::Write;
    let u = |x: &serde_json::Value| x.as_u64().unwrap_or(0);
    let mut o = String::new();
    let files: Vec<&str> = f["files"]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x.as_str()).collect())
        .unwrap_or_default();
    let _ = writeln!(o, "files:        {}", files.join(", "));
    let fm = &f["format"];
    let _ = match fm["kind"].as_str() {
        Some("pack") => writeln!(
            o,
            "format:       Deltafin pack v{} ({} over {} drive(s), {} expert records) of {} ({})",
            fm["version"],
            fm["placement"].as_str().unwrap_or("?"),
            fm["drives"],
            fm["expert_records"],
            fm["source"].as_str().unwrap_or("?"),
            fm["source_format"].as_str().unwrap_or("?")
        ),
        Some("gguf") => writeln!(
            o,
            "format:       GGUF v{} (alignment {})",
            fm["version"], fm["alignment"]
        ),
        _ => writeln!(o, "format:       Hugging Face folder (safetensors)"),
    };
    let _ = writeln!(
        o,
        "architecture: {}",
        f["architecture"].as_str().unwrap_or("?")
    );
    if let Some(n) = f["name"].as_str() {
        let _ = writeln!(o, "name:         {n}");
    }
    if let Some(meta) = f["metadata"].as_object() {
        let _ = writeln!(o, "metadata:");
        for (k, v) in meta {
            let shown = match v {
                serde_json::Value::Object(a) => format!("[{} values]", a["array_len"]),
                serde_json::Value::String(s) if s.len() > 80 => format!("({} chars)", s.len()),
                serde_json::Value::String(s) => format!("{s:?}"),
                v => gguf_text(v),
            };
            let _ = writeln!(o, "  {k} = {shown}");
        }
    }
    if let Some(cfg) = f["config"].as_object() {
        let _ = writeln!(o, "config:");
        for (k, v) in cfg {
            let _ = writeln!(o, "  {k} = {v}");
        }
    }
    let _ = writeln!(
        o,
        "tensors:      {}, {}",
        f["tensor_count"],
        mib(u(&f["tensor_bytes"]))
    );
    for (ty, t) in f["by_type"].as_object().into_iter().flatten() {
        let _ = writeln!(
            o,
            "  {ty:<6} {:>5} tensors {:>10.1} MiB",
            u(&t["tensors"]),
            u(&t["bytes"]) as f64 / 1048576.0
        );
    }
    let _ = writeln!(o, "spine:        {}", mib(u(&f["spine_bytes"])));
    let _ = writeln!(o, "experts:      {}", mib(u(&f["expert_bytes"])));
    let pe = &f["per_expert"];
    if !pe.is_null() {
        let _ = writeln!(
            o,
            "per expert:   {} ({} experts in each of {} MoE layers)",
            mib(u(&pe["bytes"])),
            pe["experts"],
            pe["moe_layers"]
        );
    }
    for t in f["tensors"].as_array().into_iter().flatten() {
        let shape: Vec<String> = t["shape"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|d| d.to_string())
            .collect();
        let _ = writeln!(
            o,
            "  {:<40} {:<5} [{}] file {} offset {} bytes {}",
            t["name"].as_str().unwrap_or("?"),
            t["type"].as_str().unwrap_or("?"),
            shape.join(", "),
            t["file"],
            t["offset"],
            t["bytes"]
        );
    }
    o
}

/// A short metadata value (number, bool, array of at most 8) as the GGUF text shows it.
fn gguf_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Array(a) => {
            let items: Vec<String> = a.iter().map(gguf_text).collect();
            format!("[{}]", items.join(", "))
        }
        serde_json::Value::String(s) => format!("{s:?}"),
        serde_json::Value::Number(n) if n.is_f64() => format!("{}", n.as_f64().unwrap_or(0.0)),
        v => v.to_string(),
    }
}
