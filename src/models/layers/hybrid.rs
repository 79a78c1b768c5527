//! The hybrid layer layout of Kimi Linear and Kimi K3: which layers run Kimi Delta Attention
//! ([`super::kda`]) and which multi-head latent attention ([`super::mla`]), read from a
//! Hugging Face `config.json` ([`mixers`]) or a llama.cpp GGUF ([`gguf_hybrid_attn`]), and
//! the `A_log` conversion both GGUF mappings need ([`a_log_of_neg_exp`]).

use anyhow::{anyhow, bail, Result};
use serde_json::Value;

use crate::models::config::{gguf_count, opt_gguf_count};
use crate::source::gguf::GgufModel;

/// Dimension limit checked at load (a hostile file must not make us allocate terabytes).
const DIM_MAX: u64 = 1 << 20;

/// What one layer's token mixer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mixer {
    /// Kimi Delta Attention (recurrent).
    Kda,
    /// Multi-head latent attention without RoPE.
    Mla,
}

/// Per-layer mixers: `layer_types` (`linear_attention` / `full_attention`) when present, else
/// `linear_attn_config.full_attn_layers` and `kda_layers` (1-based; one of them alone: the
/// other kind at every other layer), else transformers'
/// default (MLA at every 4th layer from layer 4, counting from 0: `i > 0 && i % 4 == 0`).
pub(crate) fn mixers(v: &Value, la: Option<&Value>, n: usize, label: &str) -> Result<Vec<Mixer>> {
    if let Some(t) = v.get("layer_types").and_then(Value::as_array) {
        if t.len() != n {
            bail!(
                "{label}: 'layer_types' has {} entries for {n} layers",
                t.len()
            );
        }
        return t
            .iter()
            .map(|x| match x.as_str() {
                Some("linear_attention") => Ok(Mixer::Kda),
                Some("full_attention") => Ok(Mixer::Mla),
                _ => bail!(
                    "{label}: 'layer_types' entry {x} is not linear_attention or full_attention"
                ),
            })
            .collect();
    }
    let list = |k: &str| -> Result<Option<Vec<usize>>> {
        let Some(a) = la.and_then(|o| o.get(k)) else {
            return Ok(None);
        };
        let a = a
            .as_array()
            .ok_or_else(|| anyhow!("{label}: 'linear_attn_config.{k}' is not a list"))?;
        a.iter()
            .map(|x| match x.as_u64() {
                Some(i) if (1..=n as u64).contains(&i) => Ok(i as usize - 1),
                _ => bail!("{label}: 'linear_attn_config.{k}' entry {x} is outside 1..={n}"),
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    };
    match (list("full_attn_layers")?, list("kda_layers")?) {
        (Some(full), Some(kda)) => {
            let mut m = vec![None; n];
            for (ls, kind) in [(full, Mixer::Mla), (kda, Mixer::Kda)] {
                for l in ls {
                    if m[l].replace(kind).is_some() {
                        bail!(
                            "{label}: layer {} is listed twice in 'linear_attn_config'",
                            l + 1
                        );
                    }
                }
            }
            m.iter()
                .enumerate()
                .map(|(l, x)| {
                    x.ok_or_else(|| {
                        anyhow!(
                            "{label}: layer {} is in neither 'full_attn_layers' nor 'kda_layers'",
                            l + 1
                        )
                    })
                })
                .collect()
        }
        // one list alone: the other kind everywhere else (llama.cpp's converters read
        // `full_attn_layers` only)
        (Some(full), None) => Ok((0..n)
            .map(|l| {
                if full.contains(&l) {
                    Mixer::Mla
                } else {
                    Mixer::Kda
                }
            })
            .collect()),
        (None, Some(kda)) => Ok((0..n)
            .map(|l| {
                if kda.contains(&l) {
                    Mixer::Kda
                } else {
                    Mixer::Mla
                }
            })
            .collect()),
        (None, None) => Ok((0..n)
            .map(|i| match i > 0 && i % 4 == 0 {
                true => Mixer::Mla,
                false => Mixer::Kda,
            })
            .collect()),
    }
}

/// The layer map and attention widths that llama.cpp's hybrid KDA + MLA architectures
/// (`kimi-linear`, `kimi-k3`) write under the same keys `ARCH.*`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GgufHybridAttn {
    /// `block_count`.
    pub layers: usize,
    /// `embedding_length`.
    pub hidden: usize,
    /// `attention.head_count`: the heads of both mixers (llama.cpp has one count).
    pub heads: usize,
    /// Per layer, from the array `attention.head_count_kv` (0: KDA, else MLA).
    pub mixers: Vec<Mixer>,
    /// `attention.kv_lora_rank`.
    pub kv_lora_rank: usize,
    /// `attention.q_lora_rank` (absent: a full-rank query projection).
    pub q_lora_rank: Option<usize>,
    /// `rope.dimension_count`: the rotary part of an MLA key head.
    pub rope: usize,
    /// `attention.key_length_mla` minus `rope`.
    pub qk_nope: usize,
    /// `attention.value_length_mla`.
    pub v_head_dim: usize,
    /// `kda.head_dim`.
    pub kda_head_dim: usize,
    /// `ssm.conv_kernel`: taps of the KDA short convolutions.
    pub conv_kernel: usize,
    /// Rows of `token_embd.weight`.
    pub vocab: usize,
}

/// Reads [`GgufHybridAttn`] from the keys `{arch}.*` and the token table. Errors name the
/// file and the key or tensor: a missing key, a count out of range, a `head_count_kv` that
/// is not an array of one count per block, a `key_length_mla` not above
/// `rope.dimension_count`, a token table of no rows (or over 2^24).
pub(crate) fn gguf_hybrid_attn(g: &GgufModel, arch: &str) -> Result<GgufHybridAttn> {
    let file = g.file_name();
    let k = |s: &str| format!("{arch}.{s}");
    let n = gguf_count(g, &k("block_count"), 1..=4096)?;
    let hidden = gguf_count(g, &k("embedding_length"), 1..=DIM_MAX)?;
    let heads = gguf_count(g, &k("attention.head_count"), 1..=4096)?;
    let kv_key = k("attention.head_count_kv");
    let kv = g
        .get(&kv_key)
        .and_then(|v| v.as_array())
        .and_then(|a| a.iter().map(|x| x.as_u64()).collect::<Option<Vec<u64>>>())
        .ok_or_else(|| anyhow!("{file}: metadata key '{kv_key}' is not an array of counts (one per layer: 0 for KDA, else MLA)"))?;
    if kv.len() != n {
        bail!(
            "{file}: metadata key '{kv_key}' has {} entries for {n} blocks",
            kv.len()
        );
    }
    let kv_lora_rank = gguf_count(g, &k("attention.kv_lora_rank"), 1..=DIM_MAX)?;
    let q_lora_rank = opt_gguf_count(g, &k("attention.q_lora_rank"), 1..=DIM_MAX)?;
    let rope = gguf_count(g, &k("rope.dimension_count"), 0..=512)?;
    let qk = gguf_count(g, &k("attention.key_length_mla"), 1..=8192)?;
    let v_head_dim = gguf_count(g, &k("attention.value_length_mla"), 1..=8192)?;
    if qk <= rope {
        bail!("{file}: metadata key '{arch}.attention.key_length_mla' = {qk} leaves no room beside '{arch}.rope.dimension_count' = {rope}");
    }
    let kda_head_dim = gguf_count(g, &k("kda.head_dim"), 1..=8192)?;
    let conv_kernel = gguf_count(g, &k("ssm.conv_kernel"), 1..=1024)?;
    let embd = g
        .tensor("token_embd.weight")
        .ok_or_else(|| anyhow!("{file}: tensor 'token_embd.weight' is missing"))?;
    let vocab = embd.shape.get(1).copied().unwrap_or(0);
    if vocab == 0 || vocab > 1 << 24 {
        bail!("{file}: tensor 'token_embd.weight' has {vocab} rows (vocabulary size)");
    }
    Ok(GgufHybridAttn {
        layers: n,
        hidden,
        heads,
        mixers: kv
            .iter()
            .map(|&h| if h == 0 { Mixer::Kda } else { Mixer::Mla })
            .collect(),
        kv_lora_rank,
        q_lora_rank,
        rope,
        qk_nope: qk - rope,
        v_head_dim,
        kda_head_dim,
        conv_kernel,
        vocab: vocab as usize,
    })
}

/// `A_log` from llama.cpp's `ssm_a` (`−exp(A_log)` per head): `ln(−a)`.
///
/// Errors: a value that is not negative and finite (named with the tensor).
pub(crate) fn a_log_of_neg_exp(name: &str, a: Vec<f32>) -> Result<Vec<f32>> {
    a.into_iter()
        .map(|x| match x < 0.0 && x.is_finite() {
            true => Ok((-x).ln()),
            false => Err(anyhow::anyhow!(
                "tensor '{name}' holds {x}: −exp(A_log) must be negative and finite"
            )),
        })
        .collect()
}
