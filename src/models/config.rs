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

/// Checks a config's RoPE base and RMSNorm epsilon: `rope_theta` (where `rope` gives one, in
/// either dialect; `default_theta` otherwise) must be a positive finite number, and
/// `rms_norm_eps` a finite number of at least 0 (a negative or non-finite one gives garbage).
///
/// Errors: as `LABEL: 'rope_theta' = -1 must be a positive finite number` (or
/// `'rope_parameters.rope_theta'`) or `LABEL: 'rms_norm_eps' = -0.1 must be a finite number of
/// at least 0`.
pub fn check_rope_theta_and_eps(
    label: &str,
    rope: &super::rope::HfRope<'_>,
    default_theta: f64,
    rms_norm_eps: f64,
) -> Result<()> {
    let in_parameters = rope
        .parameters
        .and_then(|p| p.get("rope_theta"))
        .is_some_and(|v| v.is_number());
    let field = if in_parameters {
        "rope_parameters.rope_theta"
    } else {
        "rope_theta"
    };
    let theta = rope.theta(default_theta);
    if !(theta.is_finite() && theta > 0.0) {
        bail!("{label}: '{field}' = {theta} must be a positive finite number");
    }
    if !(rms_norm_eps.is_finite() && rms_norm_eps >= 0.0) {
        bail!("{label}: 'rms_norm_eps' = {rms_norm_eps} must be a finite number of at least 0");
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

/// For the families' config tests: `parse` (a family's `Config::from_json` with the label
/// `c.json`) refuses `base` with a `rope_theta` of 0 or −1 (where `base` keeps it: in
/// `rope_parameters` or at the top level) and with an `rms_norm_eps` of −0.5, each error
/// naming the field.
#[cfg(test)]
pub(crate) fn assert_refuses_bad_theta_and_eps<T: std::fmt::Debug>(
    base: &serde_json::Value,
    parse: impl Fn(&serde_json::Value) -> Result<T>,
) {
    for theta in [0.0, -1.0] {
        let mut v = base.clone();
        match v
            .get_mut("rope_parameters")
            .filter(|p| p.get("rope_theta").is_some())
        {
            Some(p) => p["rope_theta"] = serde_json::json!(theta),
            None => v["rope_theta"] = serde_json::json!(theta),
        }
        let e = parse(&v).unwrap_err().to_string();
        assert!(
            e.starts_with("c.json: '")
                && e.ends_with(&format!(
                    "rope_theta' = {theta} must be a positive finite number"
                )),
            "{e}"
        );
    }
    let mut v = base.clone();
    v["rms_norm_eps"] = serde_json::json!(-0.5);
    let e = parse(&v).unwrap_err().to_string();
    assert_eq!(
        e,
        "c.json: 'rms_norm_eps' = -0.5 must be a finite number of at least 0"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::rope::HfRope;
    use serde_json::json;

    #[test]
    fn rope_theta_and_eps_are_refused_by_name() {
        let top = |t: f64| HfRope {
            parameters: None,
            scaling: None,
            theta: Some(t),
        };
        assert!(check_rope_theta_and_eps("c.json", &top(1e4), 1e4, 1e-6).is_ok());
        assert!(check_rope_theta_and_eps("c.json", &top(1e4), 1e4, 0.0).is_ok());
        let err = |r: &HfRope, eps: f64| {
            check_rope_theta_and_eps("c.json", r, 1e4, eps)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            err(&top(0.0), 1e-6),
            "c.json: 'rope_theta' = 0 must be a positive finite number"
        );
        assert_eq!(
            err(&top(-1.0), 1e-6),
            "c.json: 'rope_theta' = -1 must be a positive finite number"
        );
        assert_eq!(
            err(&top(f64::INFINITY), 1e-6),
            "c.json: 'rope_theta' = inf must be a positive finite number"
        );
        let p = json!({"rope_type": "default", "rope_theta": -5.0});
        let params = HfRope {
            parameters: Some(&p),
            scaling: None,
            theta: Some(1e4),
        };
        assert_eq!(
            err(&params, 1e-6),
            "c.json: 'rope_parameters.rope_theta' = -5 must be a positive finite number"
        );
        assert_eq!(
            err(&top(1e4), -0.1),
            "c.json: 'rms_norm_eps' = -0.1 must be a finite number of at least 0"
        );
        assert_eq!(
            err(&top(1e4), f64::NAN),
            "c.json: 'rms_norm_eps' = NaN must be a finite number of at least 0"
        );
    }
}
