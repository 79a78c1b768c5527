//! Synthetic checkpoints: random weights in the exact tensor layout of a real architecture, at
//! real per-expert sizes, streamed to disk (one 64-bit draw per 8 bytes, multi-MiB writes) so
//! benchmarks can have models of tens of GB in minutes.
//!
//! | `--arch` | presets | encodings |
//! | --- | --- | --- |
//! | `qwen3_moe` ([`qwen3_moe`]) | `tiny`, `small`, `qwen3-30b-a3b` | Hugging Face BF16; llama.cpp `qwen3moe` GGUF in Q4_0, Q8_0, Q4_K ([`super::gguf_synth`]) |
//! | `deepseek_v3` ([`deepseek_v3`]) | `tiny`, `deepseek-v3` | Hugging Face BF16, FP8 E4M3 with 128×128 block scales |
//! | `gpt_oss` ([`gpt_oss`]) | `tiny`, `gpt-oss-20b` | Hugging Face MXFP4 experts, BF16 |
//!
//! Hugging Face folders are laid out as published checkpoints are: `config.json` in the
//! published dialect (`rope_theta` + `rope_scaling`, `torch_dtype`), sharded
//! `model-0000N-of-0000M.safetensors` with `model.safetensors.index.json`, every expert's
//! tensors adjacent and never split across shards, plus the small byte-level BPE tokenizer
//! (vocabulary of 512) and chat template of the family's test fixture so `deltafin run` works.
//! Weights are random with values of about `±1/√fan_in` (`fill` says how per encoding), norm
//! weights 1, so activations stay finite through the layers.
//!
//! [`plan`] computes every file's exact size without writing; [`write()`] writes and returns
//! the same plan.

pub mod deepseek_v3;
pub(crate) mod fill;
pub mod gpt_oss;
pub mod qwen3_moe;

use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context, Result};

pub use deepseek_v3::DeepseekV3Shape;
pub use gpt_oss::GptOssShape;
pub use qwen3_moe::{config_json, presets, write_qwen3_moe, Qwen3MoeShape};

use crate::quant::GgmlType;
use fill::{Bf16Uniform, Rng};

/// The architectures `synth` writes (Hugging Face `model_type`).
pub const ARCHS: [&str; 3] = ["qwen3_moe", "deepseek_v3", "gpt_oss"];

/// A synthetic model: its architecture and shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shape {
    Qwen3Moe(Qwen3MoeShape),
    DeepseekV3(DeepseekV3Shape),
    GptOss(GptOssShape),
}

/// How the weights are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// A Hugging Face folder, BF16.
    Bf16,
    /// A Hugging Face folder, FP8 E4M3 linear weights with 128×128 block scales
    /// (`weight_scale_inv`), as DeepSeek publishes DeepSeek-V3 (`deepseek_v3`).
    Fp8,
    /// A Hugging Face folder, MXFP4 experts (`*_blocks` + E8M0 `*_scales`), as OpenAI
    /// publishes gpt-oss (`gpt_oss`).
    Mxfp4,
    /// One llama.cpp GGUF file with matrices in this type (`qwen3_moe`: Q4_0, Q8_0, Q4_K).
    Gguf(GgmlType),
}

impl Encoding {
    /// Parses `--format` (`hf`, `gguf`) and `--quant` (`bf16`, `fp8`, `mxfp4`; `q4_0`, `q8_0`,
    /// `q4_k`) for `shape`; without `--quant`, the architecture's default (its first listed
    /// encoding of that format).
    ///
    /// Errors: an unknown format or encoding, or one the architecture is not written in
    /// (the message lists the ones it is).
    pub fn parse(shape: &Shape, format: &str, quant: Option<&str>) -> Result<Encoding> {
        let arch = shape.arch();
        let ok = shape.encodings();
        let names: Vec<String> = ok.iter().map(|e| e.to_string()).collect();
        let of_format: Vec<&Encoding> = ok
            .iter()
            .filter(|e| matches!(e, Encoding::Gguf(_)) == (format == "gguf"))
            .collect();
        if format != "hf" && format != "gguf" {
            bail!("--format {format}: expected hf or gguf");
        }
        let Some(q) = quant else {
            return of_format.first().map(|e| **e).ok_or_else(|| {
                anyhow::anyhow!(
                    "--format {format}: {arch} is written as {}",
                    names.join(", ")
                )
            });
        };
        of_format
            .into_iter()
            .find(|e| e.quant_name() == q)
            .copied()
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "--format {format} --quant {q}: {arch} is written as {}",
                    names.join(", ")
                )
            })
    }

    /// The `--quant` name: `bf16`, `fp8`, `mxfp4`, `q4_0`, `q8_0`, `q4_k`.
    pub fn quant_name(&self) -> String {
        match self {
            Encoding::Bf16 => "bf16".into(),
            Encoding::Fp8 => "fp8".into(),
            Encoding::Mxfp4 => "mxfp4".into(),
            Encoding::Gguf(t) => t.name().to_lowercase(),
        }
    }
}

impl std::fmt::Display for Encoding {
    /// `hf bf16`, `hf fp8`, `hf mxfp4`, `gguf q4_k`, ...
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let format = match self {
            Encoding::Gguf(_) => "gguf",
            _ => "hf",
        };
        write!(f, "{format} {}", self.quant_name())
    }
}

impl Shape {
    /// The Hugging Face `model_type`.
    pub fn arch(&self) -> &'static str {
        match self {
            Shape::Qwen3Moe(_) => "qwen3_moe",
            Shape::DeepseekV3(_) => "deepseek_v3",
            Shape::GptOss(_) => "gpt_oss",
        }
    }

    /// The encodings this architecture is written in; per format the first is the default.
    pub fn encodings(&self) -> &'static [Encoding] {
        match self {
            Shape::Qwen3Moe(_) => &[
                Encoding::Bf16,
                Encoding::Gguf(GgmlType::Q4_0),
                Encoding::Gguf(GgmlType::Q8_0),
                Encoding::Gguf(GgmlType::Q4_K),
            ],
            Shape::DeepseekV3(_) => &[Encoding::Bf16, Encoding::Fp8],
            Shape::GptOss(_) => &[Encoding::Mxfp4, Encoding::Bf16],
        }
    }

    /// Overrides the number of decoder layers (`num_hidden_layers`, dense ones included) and,
    /// for `deepseek_v3`, the leading dense layers (`first_k_dense_replace`).
    ///
    /// Errors: zero layers; `dense` for another architecture; no MoE layer left
    /// (`layers <= first_k_dense_replace`).
    pub fn set_layers(&mut self, layers: Option<usize>, dense: Option<usize>) -> Result<()> {
        if layers == Some(0) {
            bail!("--layers must be at least 1");
        }
        match self {
            Shape::Qwen3Moe(s) => s.num_hidden_layers = layers.unwrap_or(s.num_hidden_layers),
            Shape::GptOss(s) => s.num_hidden_layers = layers.unwrap_or(s.num_hidden_layers),
            Shape::DeepseekV3(s) => {
                s.num_hidden_layers = layers.unwrap_or(s.num_hidden_layers);
                s.first_k_dense_replace = dense.unwrap_or(s.first_k_dense_replace);
                if s.num_hidden_layers <= s.first_k_dense_replace {
                    bail!(
                        "--layers {} leaves no MoE layer after the {} dense layers (first_k_dense_replace); lower --dense-layers",
                        s.num_hidden_layers,
                        s.first_k_dense_replace
                    );
                }
                return Ok(());
            }
        }
        if dense.is_some() {
            bail!("--dense-layers applies to deepseek_v3 only");
        }
        Ok(())
    }
}

/// A named shape of an architecture.
#[derive(Clone, Debug)]
pub struct Preset {
    /// `--preset` name, e.g. `deepseek-v3`.
    pub name: &'static str,
    /// One line for `--preset list`: the shape and its size.
    pub description: &'static str,
    pub shape: Shape,
}

/// Every preset of every architecture, in [`ARCHS`] order.
pub fn catalog() -> Vec<Preset> {
    let qwen = presets().into_iter().map(|(name, description, s)| Preset {
        name,
        description,
        shape: Shape::Qwen3Moe(s),
    });
    qwen.chain(deepseek_v3::presets())
        .chain(gpt_oss::presets())
        .collect()
}

/// What a write produces, computed from the shape alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    /// Every file and its exact size in bytes: for a Hugging Face folder, names inside it
    /// (shards, index, config, tokenizer files); for GGUF one entry with an empty name, the
    /// output file itself.
    pub files: Vec<(String, u64)>,
    /// Bytes of tensor data.
    pub tensor_bytes: u64,
    /// Bytes of one routed expert as stored: its weights, block scales and biases.
    pub expert_bytes: u64,
    /// Decoder layers, dense ones included.
    pub layers: usize,
    /// Layers with routed experts.
    pub moe_layers: usize,
    /// Routed experts per MoE layer.
    pub experts: usize,
}

impl Planned {
    /// Bytes of all files.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.1).sum()
    }
}

/// The files [`write()`] would write for `shape` in `enc`, with `shard_bytes` shards (Hugging
/// Face), without writing anything.
///
/// Errors: `enc` is not one of `shape`'s encodings, or the shape does not fit the encoding
/// (e.g. a GGUF row length that is not a multiple of 32).
pub fn plan(shape: &Shape, enc: Encoding, shard_bytes: u64) -> Result<Planned> {
    check_encoding(shape, enc)?;
    match (shape, enc) {
        (Shape::Qwen3Moe(s), Encoding::Gguf(q)) => super::gguf_synth::plan(s, q),
        _ => Ok(hf_checkpoint(shape, enc).plan(shard_bytes as usize)),
    }
}

/// Writes a random-weight checkpoint of `shape` in `enc` to `out` (a folder, created and not
/// yet holding a `config.json`; for GGUF a file that must not exist), seeded by `seed`.
/// `progress(tensor bytes written, total)` runs after each tensor. Returns [`plan`]'s result.
///
/// Errors: as [`plan`]; `out` already holds a model; the planned bytes exceed the free space
/// of `out`'s file system; a write fails (the message names the file).
pub fn write(
    shape: &Shape,
    enc: Encoding,
    out: &Path,
    shard_bytes: u64,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Planned> {
    let planned = plan(shape, enc, shard_bytes)?;
    check_free_space(out, planned.total_bytes(), free_bytes(out))?;
    match (shape, enc) {
        (Shape::Qwen3Moe(s), Encoding::Gguf(q)) => {
            super::gguf_synth::write_qwen3moe_gguf(s, q, out, seed, progress)?
        }
        _ => hf_checkpoint(shape, enc).write(out, shard_bytes as usize, seed, progress)?,
    }
    Ok(planned)
}

fn check_encoding(shape: &Shape, enc: Encoding) -> Result<()> {
    if !shape.encodings().contains(&enc) {
        let names: Vec<String> = shape.encodings().iter().map(|e| e.to_string()).collect();
        bail!(
            "{} cannot be written as {enc} (only {})",
            shape.arch(),
            names.join(", ")
        );
    }
    Ok(())
}

fn hf_checkpoint(shape: &Shape, enc: Encoding) -> HfCheckpoint {
    match shape {
        Shape::Qwen3Moe(s) => qwen3_moe::checkpoint(s),
        Shape::DeepseekV3(s) => deepseek_v3::checkpoint(s, enc == Encoding::Fp8),
        Shape::GptOss(s) => gpt_oss::checkpoint(s, enc == Encoding::Mxfp4),
    }
}

/// Free bytes for an unprivileged user on the file system of `path` (or of its nearest
/// existing ancestor); `None` when it cannot be asked.
fn free_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let dir = path.ancestors().find(|p| p.is_dir())?;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a writable statvfs.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail as u64 * st.f_frsize as u64)
}

/// Errors when `needed` bytes exceed `free` (unknown free space passes).
fn check_free_space(out: &Path, needed: u64, free: Option<u64>) -> Result<()> {
    match free {
        Some(f) if needed > f => bail!(
            "{}: the checkpoint needs {:.2} GB but its file system has {:.2} GB free (use --layers for fewer layers)",
            out.display(),
            needed as f64 / 1e9,
            f as f64 / 1e9
        ),
        _ => Ok(()),
    }
}

/// Safetensors dtype of a synthetic tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dtype {
    BF16,
    F32,
    F8E4M3,
    U8,
}

impl Dtype {
    fn size(self) -> usize {
        match self {
            Dtype::BF16 => 2,
            Dtype::F32 => 4,
            Dtype::F8E4M3 | Dtype::U8 => 1,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Dtype::BF16 => "BF16",
            Dtype::F32 => "F32",
            Dtype::F8E4M3 => "F8_E4M3",
            Dtype::U8 => "U8",
        }
    }
}

/// How a tensor's values are drawn (see [`fill`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Fill {
    /// Every element this value (BF16 or F32): norm weights, block scales.
    Const(f32),
    /// Uniform in `±scale` (BF16 or F32).
    Uniform(f32),
    /// Random finite FP8 E4M3 codes ([`fill::fp8_e4m3`]).
    Fp8,
    /// Random bytes (MXFP4 nibble pairs).
    Bytes,
    /// E8M0 exponents uniform in `lo..=lo + 3` ([`fill::e8m0`]).
    E8m0 { lo: u8 },
}

/// One tensor of a Hugging Face checkpoint.
#[derive(Clone, Debug)]
pub(crate) struct TensorSpec {
    pub name: String,
    pub dtype: Dtype,
    /// PyTorch order (`[out, in]` for a linear weight).
    pub shape: Vec<usize>,
    pub fill: Fill,
    /// Routed experts whose weights the tensor holds: 0 (spine), 1 (one expert's tensor) or
    /// all of the layer's (fused or stacked experts).
    pub experts: usize,
}

impl TensorSpec {
    /// A spine tensor.
    pub fn new(name: String, dtype: Dtype, shape: Vec<usize>, fill: Fill) -> Self {
        TensorSpec {
            name,
            dtype,
            shape,
            fill,
            experts: 0,
        }
    }

    /// Marks the tensor as holding `n` routed experts.
    pub fn experts(mut self, n: usize) -> Self {
        self.experts = n;
        self
    }

    fn bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size()
    }
}

/// A Hugging Face checkpoint to write: tensors in groups that never straddle shards (e.g. the
/// embeddings, a layer's spine, one expert), the config and the small side files.
pub(crate) struct HfCheckpoint {
    pub groups: Vec<Vec<TensorSpec>>,
    pub config: serde_json::Value,
    /// The bytes of `generation_config.json`, `tokenizer.json`, `tokenizer_config.json`.
    pub side_files: [&'static [u8]; 3],
    pub layers: usize,
    pub moe_layers: usize,
    pub experts: usize,
}

/// One safetensors shard: file name, header (8-byte length included) and tensors.
struct Shard<'a> {
    name: String,
    header: Vec<u8>,
    tensors: Vec<&'a TensorSpec>,
}

impl HfCheckpoint {
    /// Shards of consecutive groups up to `shard_bytes` each, and the small JSON files.
    fn layout(&self, shard_bytes: usize) -> (Vec<Shard<'_>>, Vec<(&'static str, Vec<u8>)>) {
        let mut parts: Vec<Vec<&TensorSpec>> = vec![vec![]];
        let mut in_shard = 0usize;
        for g in &self.groups {
            let gb: usize = g.iter().map(|t| t.bytes()).sum();
            if in_shard > 0 && in_shard + gb > shard_bytes {
                parts.push(vec![]);
                in_shard = 0;
            }
            parts.last_mut().expect("one shard").extend(g.iter());
            in_shard += gb;
        }
        let n = parts.len();
        let mut weight_map = serde_json::Map::new();
        let shards: Vec<Shard> = parts
            .into_iter()
            .enumerate()
            .map(|(i, tensors)| {
                let name = format!("model-{:05}-of-{n:05}.safetensors", i + 1);
                let mut header = serde_json::Map::new();
                header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
                let mut off = 0usize;
                for t in &tensors {
                    let end = off + t.bytes();
                    header.insert(
                        t.name.clone(),
                        serde_json::json!({"dtype": t.dtype.name(), "shape": t.shape, "data_offsets": [off, end]}),
                    );
                    weight_map.insert(t.name.clone(), name.clone().into());
                    off = end;
                }
                let mut h = serde_json::Value::Object(header).to_string().into_bytes();
                while !(8 + h.len()).is_multiple_of(8) {
                    h.push(b' ');
                }
                let mut header = (h.len() as u64).to_le_bytes().to_vec();
                header.extend(h);
                Shard { name, header, tensors }
            })
            .collect();
        let total = self.tensor_bytes();
        let index =
            serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        let mut small: Vec<(&'static str, Vec<u8>)> = vec![
            (
                "model.safetensors.index.json",
                index.to_string().into_bytes(),
            ),
            (
                "config.json",
                serde_json::to_vec_pretty(&self.config).expect("json"),
            ),
        ];
        let names = [
            "generation_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
        ];
        small.extend(names.into_iter().zip(self.side_files.map(|b| b.to_vec())));
        (shards, small)
    }

    fn tensor_bytes(&self) -> u64 {
        self.groups.iter().flatten().map(|t| t.bytes() as u64).sum()
    }

    fn plan(&self, shard_bytes: usize) -> Planned {
        let (shards, small) = self.layout(shard_bytes);
        let mut files: Vec<(String, u64)> = shards
            .iter()
            .map(|s| {
                let data: usize = s.tensors.iter().map(|t| t.bytes()).sum();
                (s.name.clone(), (s.header.len() + data) as u64)
            })
            .collect();
        files.extend(small.iter().map(|(n, b)| (n.to_string(), b.len() as u64)));
        let routed: u64 = self
            .groups
            .iter()
            .flatten()
            .filter(|t| t.experts > 0)
            .map(|t| t.bytes() as u64)
            .sum();
        Planned {
            files,
            tensor_bytes: self.tensor_bytes(),
            expert_bytes: routed / (self.moe_layers * self.experts).max(1) as u64,
            layers: self.layers,
            moe_layers: self.moe_layers,
            experts: self.experts,
        }
    }

    /// Writes the folder `out` (created; must not hold a `config.json`).
    fn write(
        &self,
        out: &Path,
        shard_bytes: usize,
        seed: u64,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<()> {
        if out.join("config.json").exists() {
            bail!("{}: already holds a model (config.json)", out.display());
        }
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        let (shards, small) = self.layout(shard_bytes);
        let total = self.tensor_bytes();
        let mut rng = Rng::seeded(seed);
        let mut bf16: Option<Bf16Uniform> = None;
        let mut written = 0u64;
        let mut buf = Vec::new();
        for shard in &shards {
            let path = out.join(&shard.name);
            let wr = |w: &mut std::io::BufWriter<std::fs::File>, b: &[u8]| {
                w.write_all(b)
                    .with_context(|| format!("writing {}", path.display()))
            };
            let f = std::fs::File::create(&path)
                .with_context(|| format!("creating {}", path.display()))?;
            let mut w = std::io::BufWriter::with_capacity(8 << 20, f);
            wr(&mut w, &shard.header)?;
            for t in &shard.tensors {
                buf.resize(t.bytes(), 0);
                fill_tensor(&mut rng, &mut bf16, t, &mut buf);
                wr(&mut w, &buf)?;
                written += buf.len() as u64;
                progress(written, total);
            }
            w.flush()
                .with_context(|| format!("writing {}", path.display()))?;
        }
        for (name, bytes) in small {
            let p = out.join(name);
            std::fs::write(&p, bytes).with_context(|| format!("writing {}", p.display()))?;
        }
        Ok(())
    }
}

/// Fills `buf` with `t`'s values; `bf16` caches the lookup table of the last BF16 scale.
fn fill_tensor(rng: &mut Rng, bf16: &mut Option<Bf16Uniform>, t: &TensorSpec, buf: &mut [u8]) {
    match (t.fill, t.dtype) {
        (Fill::Const(v), Dtype::BF16) => fill::repeat(&half::bf16::from_f32(v).to_le_bytes(), buf),
        (Fill::Const(v), Dtype::F32) => fill::repeat(&v.to_le_bytes(), buf),
        (Fill::Uniform(s), Dtype::BF16) => {
            if bf16.as_ref().is_none_or(|u| u.scale != s) {
                *bf16 = Some(Bf16Uniform::new(s));
            }
            bf16.as_ref().expect("set").fill(rng, buf)
        }
        (Fill::Uniform(s), Dtype::F32) => fill::f32_uniform(rng, s, buf),
        (Fill::Fp8, Dtype::F8E4M3) => fill::fp8_e4m3(rng, buf),
        (Fill::Bytes, Dtype::U8) => fill::bytes(rng, buf),
        (Fill::E8m0 { lo }, Dtype::U8) => fill::e8m0(rng, lo, buf),
        (f, d) => unreachable!("tensor {}: fill {f:?} for dtype {d:?}", t.name),
    }
}

/// Spec helpers shared by the architectures: the token embeddings `[vocab, hidden]` uniform in
/// `±1` (BF16) as the first group, the final norm and the LM head as the last, a linear weight
/// `[out, in]` uniform in `±1/√in`, a norm weight of ones, a vector uniform in `±scale`.
pub(crate) fn embeddings(vocab: usize, hidden: usize) -> Vec<TensorSpec> {
    vec![TensorSpec::new(
        "model.embed_tokens.weight".into(),
        Dtype::BF16,
        vec![vocab, hidden],
        Fill::Uniform(1.0),
    )]
}

pub(crate) fn norm_and_head(vocab: usize, hidden: usize) -> Vec<TensorSpec> {
    vec![
        ones_bf16("model.norm.weight".into(), hidden),
        linear_bf16("lm_head.weight".into(), vocab, hidden),
    ]
}

pub(crate) fn linear_bf16(name: String, out: usize, inp: usize) -> TensorSpec {
    TensorSpec::new(
        name,
        Dtype::BF16,
        vec![out, inp],
        Fill::Uniform(1.0 / (inp as f32).sqrt()),
    )
}

pub(crate) fn ones_bf16(name: String, n: usize) -> TensorSpec {
    TensorSpec::new(name, Dtype::BF16, vec![n], Fill::Const(1.0))
}

pub(crate) fn vector_bf16(name: String, n: usize, scale: f32) -> TensorSpec {
    TensorSpec::new(name, Dtype::BF16, vec![n], Fill::Uniform(scale))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_parse_per_architecture() {
        let get = |arch: &str| {
            catalog()
                .into_iter()
                .find(|p| p.shape.arch() == arch)
                .unwrap()
        };
        let (q, d, g) = (get("qwen3_moe"), get("deepseek_v3"), get("gpt_oss"));
        let p = |s: &Shape, f: &str, q: Option<&str>| Encoding::parse(s, f, q);
        assert_eq!(p(&q.shape, "hf", None).unwrap(), Encoding::Bf16);
        assert_eq!(
            p(&q.shape, "gguf", None).unwrap(),
            Encoding::Gguf(GgmlType::Q4_0)
        );
        assert_eq!(
            p(&q.shape, "gguf", Some("q4_k")).unwrap(),
            Encoding::Gguf(GgmlType::Q4_K)
        );
        assert_eq!(p(&d.shape, "hf", Some("fp8")).unwrap(), Encoding::Fp8);
        assert_eq!(p(&g.shape, "hf", None).unwrap(), Encoding::Mxfp4);
        assert_eq!(p(&g.shape, "hf", Some("bf16")).unwrap(), Encoding::Bf16);
        assert_eq!(
            p(&d.shape, "hf", Some("mxfp4")).unwrap_err().to_string(),
            "--format hf --quant mxfp4: deepseek_v3 is written as hf bf16, hf fp8"
        );
        assert_eq!(
            p(&g.shape, "gguf", None).unwrap_err().to_string(),
            "--format gguf: gpt_oss is written as hf mxfp4, hf bf16"
        );
        assert_eq!(
            p(&q.shape, "safetensors", None).unwrap_err().to_string(),
            "--format safetensors: expected hf or gguf"
        );
        let e = plan(&q.shape, Encoding::Fp8, 1 << 30).unwrap_err();
        assert_eq!(
            e.to_string(),
            "qwen3_moe cannot be written as hf fp8 (only hf bf16, gguf q4_0, gguf q8_0, gguf q4_k)"
        );
    }

    #[test]
    fn layer_overrides_keep_a_moe_layer() {
        let mut d = catalog()
            .into_iter()
            .find(|p| p.name == "deepseek-v3")
            .unwrap()
            .shape;
        let e = d.set_layers(Some(3), None).unwrap_err().to_string();
        assert_eq!(e, "--layers 3 leaves no MoE layer after the 3 dense layers (first_k_dense_replace); lower --dense-layers");
        d.set_layers(Some(2), Some(1)).unwrap();
        let Shape::DeepseekV3(s) = &d else { panic!() };
        assert_eq!((s.num_hidden_layers, s.first_k_dense_replace), (2, 1));
        let mut q = catalog()[0].shape.clone();
        let e = q.set_layers(Some(2), Some(1)).unwrap_err().to_string();
        assert_eq!(e, "--dense-layers applies to deepseek_v3 only");
        assert_eq!(
            q.set_layers(Some(0), None).unwrap_err().to_string(),
            "--layers must be at least 1"
        );
    }

    #[test]
    fn free_space_is_checked_before_writing() {
        let p = Path::new("/x");
        assert!(check_free_space(p, 10, Some(10)).is_ok());
        assert!(check_free_space(p, 10, None).is_ok());
        let e = check_free_space(p, 2_500_000_000, Some(1_000_000_000)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "/x: the checkpoint needs 2.50 GB but its file system has 1.00 GB free (use --layers for fewer layers)"
        );
        assert!(free_bytes(Path::new("/nonexistent-dir/x")).is_some());
    }
}
