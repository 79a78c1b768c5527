//! What every family's configuration shares: the serde defaults of Hugging Face
//! `config.json` fields ([`defaults`]), the bound on the dimensions a config may give
//! ([`check_config_dims`]), and the bounded integer getters for GGUF metadata
//! ([`gguf_count`], [`opt_gguf_count`]). RoPE parameters have their own module,
//! [`super::rope`].

use std::ops::RangeInclusive;

use anyhow::{bail, Result};

use crate::source::gguf::GgufModel;

/// Functions for `#[serde(default = "…")]`: the defaults transformers' config classes give
/// fields that published `config.json` files omit. Each family names the ones its config
/// class uses (e.g. `defaults::count::<32768>` for Qwen3's `max_position_embeddings`).
pub mod defaults {
    /// A count or size default of `N`.
    pub fn count<const N: usize>() -> usize {
        N
    }
    /// `1.0` (e.g. DeepSeek's `routed_scaling_factor`).
    pub fn one_f64() -> f64 {
        1.0
    }
    /// `true` (e.g. `norm_topk_prob`, `rope_interleave`).
    pub fn yes() -> bool {
        true
    }
    /// `1e-6`, the `rms_norm_eps` of Qwen3, Llama and DeepSeek V3 configs.
    pub fn eps_1e6() -> f64 {
        1e-6
    }
    /// `1e-5`, GPT-OSS's `rms_norm_eps`.
    pub fn eps_1e5() -> f64 {
        1e-5
    }
    /// `"silu"`, the `hidden_act` of every SwiGLU family.
    pub fn silu() -> String {
        "silu".into()
    }
}

/// The largest dimension a Hugging Face `config.json` may give (a hostile config must not make
/// us allocate terabytes).
pub const CONFIG_DIM_MAX: usize = 1 << 20;

/// Checks that every `(field, value)` of a config lies in `1..=CONFIG_DIM_MAX`.
///
/// Errors: the first that does not, as `LABEL: 'field' = value is outside 1..=1048576`.
pub fn check_config_dims(label: &str, dims: &[(&str, usize)]) -> Result<()> {
    for &(k, d) in dims {
        if d == 0 || d > CONFIG_DIM_MAX {
            bail!("{label}: '{k}' = {d} is outside 1..={CONFIG_DIM_MAX}");
        }
    }
    Ok(())
}

/// Checks a grouped-query attention config: `num_attention_heads` a multiple of
/// `num_key_value_heads`, and an even `head_dim` (RoPE rotates pairs).
///
/// Errors: as `LABEL: num_attention_heads 6 is not a multiple of num_key_value_heads 4` or
/// `LABEL: head_dim 7 must be even for RoPE`.
pub fn check_gqa(label: &str, n_heads: usize, n_kv_heads: usize, head_dim: usize) -> Result<()> {
    if !n_heads.is_multiple_of(n_kv_heads) {
        bail!("{label}: num_attention_heads {n_heads} is not a multiple of num_key_value_heads {n_kv_heads}");
    }
    if !head_dim.is_multiple_of(2) {
        bail!("{label}: head_dim {head_dim} must be even for RoPE");
    }
    Ok(())
}

/// The integer at GGUF metadata `key`, required to lie in `range`.
///
/// Errors: missing, not an integer (both from [`GgufModel::get_u64`]), or outside `range`, as
/// `FILE: metadata key 'KEY' = V is outside LO..=HI`.
pub fn gguf_count(g: &GgufModel, key: &str, range: RangeInclusive<u64>) -> Result<usize> {
    let v = g.get_u64(key)?;
    in_range(g, key, v, range)
}

/// Like [`gguf_count`]; `None` when the key is absent.
pub fn opt_gguf_count(
    g: &GgufModel,
    key: &str,
    range: RangeInclusive<u64>,
) -> Result<Option<usize>> {
    g.opt_u64(key)?
        .map(|v| in_range(g, key, v, range))
        .transpose()
}

fn in_range(g: &GgufModel, key: &str, v: u64, range: RangeInclusive<u64>) -> Result<usize> {
    if !range.contains(&v) {
        bail!(
            "{}: metadata key '{key}' = {v} is outside {}..={}",
            g.file_name(),
            range.start(),
            range.end()
        );
    }
    Ok(v as usize)
}
