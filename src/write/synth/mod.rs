//! Synthetic checkpoints: random weights in the exact tensor layout of a real architecture, at
//! real per-expert sizes, streamed to disk (one 64-bit draw per 8 bytes, multi-MiB writes) so
//! benchmarks can have models of tens of GB in minutes.
//!
//! | `--arch` | presets | encodings |
//! | --- | --- | --- |
//! | `qwen3_moe` ([`qwen3_moe`]) | `tiny`, `small`, `qwen3-30b-a3b` | Hugging Face BF16; llama.cpp `qwen3moe` GGUF in Q4_0, Q8_0, Q4_K ([`qwen3_moe_gguf`]) |
//! | `deepseek_v3` ([`deepseek_v3`]) | `tiny`, `deepseek-v3` | Hugging Face BF16, FP8 E4M3 with 128×128 block scales |
//! | `gpt_oss` ([`gpt_oss`]) | `tiny`, `gpt-oss-20b` | Hugging Face MXFP4 experts, BF16 |
//! | `kimi_linear` ([`kimi_linear`]) | `tiny`, `kimi-linear-48b-a3b` | Hugging Face BF16 |
//! | `kimi_k3` ([`kimi_k3`], [`kimi_k3_hf`]) | `tiny`, `kimi-k3` | Hugging Face (`KimiK3ForConditionalGeneration`, compressed-tensors MXFP4 routed experts) or llama.cpp `kimi-k3` GGUF (MXFP4 routed experts); BF16 elsewhere |
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
mod fill;
mod fill_lowbit;
pub mod gpt_oss;
mod hf_checkpoint;
pub mod kimi_k3;
pub mod kimi_k3_hf;
pub mod kimi_linear;
mod planned;
pub mod qwen3_moe;
pub mod qwen3_moe_gguf;

use std::path::Path;

use anyhow::{bail, Result};

pub use deepseek_v3::DeepseekV3Shape;
pub use gpt_oss::GptOssShape;
pub use kimi_k3::KimiK3Shape;
pub use kimi_linear::KimiLinearShape;
pub use planned::Planned;
pub use qwen3_moe::{config_json, presets, write_qwen3_moe, Qwen3MoeShape};

use super::space::free_bytes;
use crate::quant::GgmlType;
use hf_checkpoint::HfCheckpoint;

/// The architectures `synth` writes (Hugging Face `model_type`), as the registry lists them
/// ([`crate::models::Family::synth`], in [`crate::models::FAMILIES`] order).
pub fn archs() -> Vec<&'static str> {
    crate::models::FAMILIES
        .iter()
        .flat_map(|f| f.synth.iter().copied())
        .collect()
}

/// A synthetic model: its architecture and shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shape {
    Qwen3Moe(Qwen3MoeShape),
    DeepseekV3(DeepseekV3Shape),
    GptOss(GptOssShape),
    KimiLinear(KimiLinearShape),
    KimiK3(KimiK3Shape),
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
    /// One llama.cpp GGUF file with matrices in this type (`qwen3_moe`: Q4_0, Q8_0, Q4_K and
    /// the low-bit types, `qwen3_moe_gguf::QUANTS`; `kimi_k3`: MXFP4 routed experts, the rest
    /// BF16).
    Gguf(GgmlType),
}

impl Encoding {
    /// Parses `--format` (`hf`, `gguf`) and `--quant` (`bf16`, `fp8`, `mxfp4`; `q4_0`, `q8_0`,
    /// `q4_k`, `q2_k`, `iq2_xxs`, ... : the lowercase GGML names) for `shape`; without `--quant`, the architecture's default (its first listed
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

/// `qwen3_moe`'s encodings: BF16, then a GGUF file in each of `qwen3_moe_gguf::QUANTS`.
const QWEN3_MOE_ENCODINGS: [Encoding; 20] = {
    let mut out = [Encoding::Bf16; 20];
    let mut i = 0;
    while i < qwen3_moe_gguf::QUANTS.len() {
        out[i + 1] = Encoding::Gguf(qwen3_moe_gguf::QUANTS[i]);
        i += 1;
    }
    out
};

impl Shape {
    /// The Hugging Face `model_type`.
    pub fn arch(&self) -> &'static str {
        match self {
            Shape::Qwen3Moe(_) => "qwen3_moe",
            Shape::DeepseekV3(_) => "deepseek_v3",
            Shape::GptOss(_) => "gpt_oss",
            Shape::KimiLinear(_) => "kimi_linear",
            Shape::KimiK3(_) => "kimi_k3",
        }
    }

    /// The encodings this architecture is written in; per format the first is the default.
    pub fn encodings(&self) -> &'static [Encoding] {
        match self {
            Shape::Qwen3Moe(_) => &QWEN3_MOE_ENCODINGS,
            Shape::DeepseekV3(_) => &[Encoding::Bf16, Encoding::Fp8],
            Shape::GptOss(_) => &[Encoding::Mxfp4, Encoding::Bf16],
            Shape::KimiLinear(_) => &[Encoding::Bf16],
            Shape::KimiK3(_) => &[Encoding::Mxfp4, Encoding::Gguf(GgmlType::MXFP4)],
        }
    }

    /// Overrides the number of decoder layers (`num_hidden_layers`, dense ones included) and,
    /// for `deepseek_v3`, `kimi_linear` and `kimi_k3`, the leading dense layers
    /// (`first_k_dense_replace`).
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
            Shape::KimiLinear(s) => {
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
            Shape::KimiK3(s) => {
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
            bail!("--dense-layers applies to deepseek_v3, kimi_linear and kimi_k3 only");
        }
        Ok(())
    }

    /// Overrides the number of routed experts per MoE layer (`kimi_k3`, `deepseek_v3`,
    /// `kimi_linear`: the expert shape, top-k and so the bytes a decode step reads stay those
    /// of the preset, the file shrinks). DeepSeek V3's experts stay in `n_group` groups of
    /// which `topk_group` are kept, so the count must split into the groups with enough
    /// experts in the kept ones for the top-k.
    ///
    /// Errors: another architecture; fewer experts than the top-k; (DeepSeek V3) a count
    /// that does not split into the groups so.
    pub fn set_experts(&mut self, experts: Option<usize>) -> Result<()> {
        let Some(n) = experts else {
            return Ok(());
        };
        let (slot, top) = match self {
            Shape::Qwen3Moe(s) => (&mut s.num_experts, s.num_experts_per_tok),
            Shape::KimiK3(s) => (&mut s.n_routed_experts, s.num_experts_per_tok),
            Shape::KimiLinear(s) => (&mut s.n_routed_experts, s.num_experts_per_tok),
            Shape::DeepseekV3(s) => {
                if !n.is_multiple_of(s.n_group)
                    || n / s.n_group * s.topk_group < s.num_experts_per_tok
                {
                    bail!(
                        "--experts {n}: deepseek_v3 needs a multiple of its {} expert groups with at least {} experts in the {} groups kept",
                        s.n_group,
                        s.num_experts_per_tok,
                        s.topk_group
                    );
                }
                (&mut s.n_routed_experts, s.num_experts_per_tok)
            }
            _ => bail!("--experts applies to qwen3_moe, kimi_k3, deepseek_v3 and kimi_linear only"),
        };
        if n < top {
            bail!("--experts {n}: fewer than the {top} experts each token uses");
        }
        *slot = n;
        Ok(())
    }

    /// Sets the routed experts each token uses (`num_experts_per_tok`, the router's top-k)
    /// when `top_k` is given (qwen3_moe), to model another family's routing statistics: with
    /// random weights the share of experts a batch's sequences have in common depends only on
    /// the expert count and the top-k (Mixtral's 8 and 2: `--experts 8 --experts-per-tok 2`).
    /// Call before [`Shape::set_experts`], which checks the experts against the top-k.
    ///
    /// Errors: another architecture; 0, or more than the experts per layer.
    pub fn set_experts_per_tok(&mut self, top_k: Option<usize>) -> Result<()> {
        let Some(k) = top_k else {
            return Ok(());
        };
        let Shape::Qwen3Moe(s) = self else {
            bail!("--experts-per-tok applies to qwen3_moe only");
        };
        if k == 0 || k > s.num_experts {
            bail!(
                "--experts-per-tok {k}: outside 1..={} (the experts per layer)",
                s.num_experts
            );
        }
        s.num_experts_per_tok = k;
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

/// Every preset of every architecture ([`archs`]).
pub fn catalog() -> Vec<Preset> {
    let qwen = presets().into_iter().map(|(name, description, s)| Preset {
        name,
        description,
        shape: Shape::Qwen3Moe(s),
    });
    let deepseek = deepseek_v3::presets()
        .into_iter()
        .map(|(name, description, s)| Preset {
            name,
            description,
            shape: Shape::DeepseekV3(s),
        });
    let gpt_oss = gpt_oss::presets()
        .into_iter()
        .map(|(name, description, s)| Preset {
            name,
            description,
            shape: Shape::GptOss(s),
        });
    let kimi = kimi_linear::presets()
        .into_iter()
        .map(|(name, description, s)| Preset {
            name,
            description,
            shape: Shape::KimiLinear(s),
        });
    let k3 = kimi_k3::presets()
        .into_iter()
        .map(|(name, description, s)| Preset {
            name,
            description,
            shape: Shape::KimiK3(s),
        });
    qwen.chain(deepseek)
        .chain(gpt_oss)
        .chain(kimi)
        .chain(k3)
        .collect()
}

/// The files [`write()`] would write for `shape` in `enc`, with `shard_bytes` shards (Hugging
/// Face), without writing anything.
///
/// Errors: `enc` is not one of `shape`'s encodings, or the shape does not fit the encoding
/// (e.g. a GGUF row length that is not a multiple of 32).
pub fn plan(shape: &Shape, enc: Encoding, shard_bytes: u64) -> Result<Planned> {
    check_encoding(shape, enc)?;
    match (shape, enc) {
        (Shape::Qwen3Moe(s), Encoding::Gguf(q)) => qwen3_moe_gguf::plan(s, q),
        (Shape::KimiK3(s), Encoding::Gguf(_)) => kimi_k3::plan(s),
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
            qwen3_moe_gguf::write_qwen3moe_gguf(s, q, out, seed, progress)?
        }
        (Shape::KimiK3(s), Encoding::Gguf(_)) => {
            kimi_k3::write_kimi_k3_gguf(s, out, seed, progress)?
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
        Shape::KimiLinear(s) => kimi_linear::checkpoint(s),
        Shape::KimiK3(s) => kimi_k3_hf::checkpoint(s),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_names_exactly_the_architectures_with_presets() {
        let mut registry = archs();
        let mut presets: Vec<&str> = catalog().iter().map(|p| p.shape.arch()).collect();
        registry.sort_unstable();
        presets.sort_unstable();
        presets.dedup();
        assert_eq!(registry, presets);
    }

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
            "qwen3_moe cannot be written as hf fp8 (only hf bf16, gguf q4_0, gguf q8_0, gguf q4_k, \
             gguf q4_1, gguf q5_1, gguf q2_k, gguf q3_k, gguf q5_k, gguf iq1_s, gguf iq1_m, \
             gguf iq2_xxs, gguf iq2_xs, gguf iq2_s, gguf iq3_xxs, gguf iq3_s, gguf iq4_nl, \
             gguf iq4_xs, gguf tq1_0, gguf tq2_0)"
        );
        assert_eq!(
            p(&q.shape, "gguf", Some("iq2_xxs")).unwrap(),
            Encoding::Gguf(GgmlType::IQ2_XXS)
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
        assert_eq!(
            e,
            "--dense-layers applies to deepseek_v3, kimi_linear and kimi_k3 only"
        );
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

    #[test]
    fn deepseek_v3_expert_and_file_sizes_are_planned_without_writing() {
        let mut shape = Shape::DeepseekV3(deepseek_v3::presets().remove(1).2);
        shape.set_layers(Some(4), None).unwrap();
        let p = plan(&shape, Encoding::Fp8, 4 << 30).unwrap();
        // gate and up [2048, 7168], down [7168, 2048] in E4M3, each with 16 × 56 f32 scales
        assert_eq!(p.expert_bytes, 3 * 7168 * 2048 + 3 * 16 * 56 * 4);
        assert_eq!(p.expert_bytes, 44_050_944);
        assert_eq!((p.layers, p.moe_layers, p.experts), (4, 1, 256));
        let b = plan(&shape, Encoding::Bf16, 4 << 30).unwrap();
        assert_eq!(b.expert_bytes, 3 * 7168 * 2048 * 2);
        // per layer: MLA attention (q_a 1536×7168, q_b 24576×1536, kv_a 576×7168, kv_b
        // 32768×512, o 7168×16384) plus 7168-wide norms, then a dense MLP 3 × 7168 × 18432
        // or the router (256 × 7168 BF16, 256 F32 bias), the shared expert and 256 experts
        let attn: u64 = 1536 * 7168 + 24576 * 1536 + 576 * 7168 + 32768 * 512 + 7168 * 16384;
        let norms = 2 * 7168 + 1536 + 512;
        let dense = 3 * 7168 * 18432;
        let moe = 256 * 7168 + 257 * 3 * 7168 * 2048;
        let spine = 2 * 512 * 7168 + 7168;
        let want = 2 * (spine + 4 * (attn + norms) + 3 * dense + moe) + 256 * 4;
        assert_eq!(b.tensor_bytes, want);
        // 4 GiB shards: the 11.3 GB MoE layer of FP8 experts spreads over several, split
        // between experts
        let shards = p
            .files
            .iter()
            .filter(|f| f.0.ends_with(".safetensors"))
            .count();
        assert_eq!(shards, 4);
        assert!(p.total_bytes() > p.tensor_bytes && p.total_bytes() < p.tensor_bytes + (1 << 22));
    }

    #[test]
    fn kimi_linear_48b_expert_sizes_and_layer_kinds_are_planned_without_writing() {
        let mut shape = Shape::KimiLinear(kimi_linear::presets().remove(1).2);
        let Shape::KimiLinear(s) = &shape else {
            panic!()
        };
        let mla: Vec<usize> = (0..27).filter(|&l| s.is_mla(l)).map(|l| l + 1).collect();
        assert_eq!(mla, [4, 8, 12, 16, 20, 24, 27]);
        shape.set_layers(Some(4), None).unwrap();
        let p = plan(&shape, Encoding::Bf16, 4 << 30).unwrap();
        // w1, w3 [1024, 2304] and w2 [2304, 1024] in BF16
        assert_eq!(p.expert_bytes, 3 * 2304 * 1024 * 2);
        assert_eq!((p.layers, p.moe_layers, p.experts), (4, 3, 256));
        // layers 1-3 KDA, layer 4 (the last) MLA
        let (d, dim, hd) = (2304u64, 4096u64, 128u64);
        let kda = 2
            * (3 * dim * d
                + 3 * dim * 4
                + hd * d
                + dim * hd
                + 32 * d
                + hd * d
                + dim * hd
                + hd
                + d * dim)
            + 4 * (32 + dim);
        let mla = 2 * (32 * 192 * d + 576 * d + 512 + 32 * 256 * 512 + d * 32 * 128);
        let dense = 2 * 3 * d * 9216;
        let moe = 2 * (256 * d + 3 * d * 1024) + 4 * 256 + 256 * 3 * d * 1024 * 2;
        let spine = 2 * (2 * 512 * d + d);
        assert_eq!(
            p.tensor_bytes,
            spine + 3 * kda + mla + 4 * 2 * 2 * d + dense + 3 * moe
        );
    }

    #[test]
    fn kimi_k3_expert_sizes_and_layer_kinds_are_planned_without_writing() {
        let mut shape = Shape::KimiK3(kimi_k3::presets().remove(1).2);
        let Shape::KimiK3(s) = &shape else { panic!() };
        let mla: Vec<usize> = (0..93).filter(|&l| s.is_mla(l)).map(|l| l + 1).collect();
        assert_eq!(mla.len(), 24);
        assert_eq!(&mla[..3], [4, 8, 12]);
        assert_eq!(&mla[21..], [88, 92, 93]);
        let full = plan(&shape, Encoding::Gguf(GgmlType::MXFP4), 0).unwrap();
        // gate and up [3584 → 3072], down [3072 → 3584], MXFP4: 17 bytes per 32 values
        assert_eq!(full.expert_bytes, 3 * 3584 * 3072 / 32 * 17);
        assert_eq!(full.expert_bytes, 17_547_264);
        assert_eq!((full.layers, full.moe_layers, full.experts), (93, 92, 896));
        // 1.446 TB of routed experts (92 × 896 × 17.5 MB), 1.56 TB in all (as published:
        // ~1.56 TB)
        assert_eq!(92 * 896 * full.expert_bytes, 1_446_456_066_048);
        assert_eq!(full.tensor_bytes / 1_000_000_000, 1_560);
        shape.set_layers(Some(2), Some(0)).unwrap();
        shape.set_experts(Some(64)).unwrap();
        let p = plan(&shape, Encoding::Gguf(GgmlType::MXFP4), 0).unwrap();
        assert_eq!((p.layers, p.moe_layers, p.experts), (2, 2, 64));
        assert_eq!(p.expert_bytes, 17_547_264);
        // layer 0 KDA, layer 1 (the last) MLA, both MoE; BF16 matrices, F32 vectors and router
        // 96 heads of 128 in both mixers, a vocabulary of 163,840
        let (d, nh, dim, lat, sff, vocab) =
            (7168u64, 96u64, 12288u64, 3584u64, 6144u64, 163_840u64);
        let kda = 2 * (4 * d * dim + d * 128 + 128 * dim + d * nh + dim * d)
            + 4 * (3 * 4 * dim + nh + dim + 128);
        let mla = 2
            * (d * 1536 + 1536 * nh * 192 + d * 576 + 2 * 128 * 512 * nh + 2 * d * nh * 128)
            + 4 * (1536 + 512);
        let moe = 4 * (d * 64 + 64 + lat) + 2 * (2 * d * lat + 3 * d * sff) + 64 * 17_547_264;
        let layer = 4 * 4 * d;
        let top = 2 * 2 * vocab * d + 4 * 2 * d;
        assert_eq!(p.tensor_bytes, top + kda + mla + 2 * (moe + layer));
        assert_eq!(
            shape.set_experts(Some(8)).unwrap_err().to_string(),
            "--experts 8: fewer than the 16 experts each token uses"
        );
        let Shape::KimiK3(s) = &mut shape else {
            panic!()
        };
        s.latent = 3600;
        assert_eq!(
            plan(&shape, Encoding::Gguf(GgmlType::MXFP4), 0)
                .unwrap_err()
                .to_string(),
            "latent width 3600 and expert FFN width 3072 must be multiples of 32 for MXFP4"
        );
        assert_eq!(
            shape.set_experts_per_tok(Some(2)).unwrap_err().to_string(),
            "--experts-per-tok applies to qwen3_moe only"
        );
        // qwen3_moe with Mixtral's routing: 8 experts, top-2
        let mut q = catalog()[0].shape.clone();
        assert_eq!(q.arch(), "qwen3_moe");
        q.set_experts_per_tok(Some(2)).unwrap();
        q.set_experts(Some(8)).unwrap();
        let Shape::Qwen3Moe(s) = &q else { panic!() };
        assert_eq!((s.num_experts, s.num_experts_per_tok), (8, 2));
        assert_eq!(
            q.set_experts_per_tok(Some(9)).unwrap_err().to_string(),
            "--experts-per-tok 9: outside 1..=8 (the experts per layer)"
        );
        assert_eq!(
            q.set_experts(Some(1)).unwrap_err().to_string(),
            "--experts 1: fewer than the 2 experts each token uses"
        );
        let mut g = Shape::GptOss(gpt_oss::presets().remove(0).2);
        assert_eq!(
            g.set_experts(Some(64)).unwrap_err().to_string(),
            "--experts applies to qwen3_moe, kimi_k3, deepseek_v3 and kimi_linear only"
        );
    }

    #[test]
    fn gpt_oss_20b_expert_and_file_sizes_are_planned_without_writing() {
        let shape = Shape::GptOss(gpt_oss::presets().remove(1).2);
        let p = plan(&shape, Encoding::Mxfp4, 4 << 30).unwrap();
        // gate_up: 5760 rows × 90 blocks of (16 nibble bytes + 1 scale byte); down: 2880 rows
        // × 90 blocks; BF16 biases of 5760 and 2880 values
        assert_eq!(
            p.expert_bytes,
            5760 * 90 * 17 + 2880 * 90 * 17 + (5760 + 2880) * 2
        );
        assert_eq!(p.expert_bytes, 13_236_480);
        assert_eq!((p.layers, p.moe_layers, p.experts), (24, 24, 32));
        // per layer: q/o 4096 × 2880, k/v 512 × 2880 and their biases, 64 sinks, two norms,
        // the router (32 × 2880 + 32) in BF16, then 32 experts
        let attn: u64 = 2 * 4096 * 2880 + 2 * 512 * 2880 + 4096 + 2 * 512 + 2880 + 64;
        let layer = 2 * (attn + 2 * 2880 + 32 * 2880 + 32) + 32 * 13_236_480;
        let spine = 2 * (2 * 512 * 2880 + 2880);
        assert_eq!(p.tensor_bytes, spine + 24 * layer);
        let b = plan(&shape, Encoding::Bf16, 4 << 30).unwrap();
        assert_eq!(b.expert_bytes, 2 * (3 * 2880 * 2880 + 5760 + 2880));
    }
}
