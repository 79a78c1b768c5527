//! What every family's configuration shares: the serde defaults of Hugging Face
//! `config.json` fields ([`defaults`]), the bound on the dimensions a config may give
//! ([`check_config_dims`]), and the bounded integer getters for GGUF metadata
//! ([`gguf_count`], [`opt_gguf_count`]). RoPE parameters have their own module,
//! [`super::rope`].

use std::ops::RangeInclusive;

use anyhow::{anyhow, bail, Result};
use serde_json::Value;

use crate::source::gguf::GgufModel;

/// Typed field lookup over alternative names in a `config.json`, errors naming the file and
/// the field (Kimi Linear's and Kimi K3's configs).
pub(crate) struct Fields<'a> {
    pub v: &'a Value,
    pub label: &'a str,
}

impl<'a> Fields<'a> {
    /// The first of `names` present (and not null).
    pub(crate) fn find<'n>(&self, names: &[&'n str]) -> Option<(&'n str, &'a Value)> {
        names
            .iter()
            .find_map(|n| self.v.get(*n).filter(|x| !x.is_null()).map(|x| (*n, x)))
    }

    pub(crate) fn count(&self, names: &[&str], default: Option<usize>) -> Result<usize> {
        match (self.find(names), default) {
            (Some((n, x)), _) => x
                .as_u64()
                .map(|c| c as usize)
                .ok_or_else(|| anyhow!("{}: '{n}' = {x} is not a count", self.label)),
            (None, Some(d)) => Ok(d),
            (None, None) => bail!("{}: missing field '{}'", self.label, names[0]),
        }
    }

    pub(crate) fn opt_count(&self, names: &[&str]) -> Result<Option<usize>> {
        match self.find(names) {
            None => Ok(None),
            Some(_) => self.count(names, None).map(Some),
        }
    }

    pub(crate) fn float(&self, names: &[&str], default: f64) -> Result<f64> {
        match self.find(names) {
            None => Ok(default),
            Some((n, x)) => x
                .as_f64()
                .ok_or_else(|| anyhow!("{}: '{n}' = {x} is not a number", self.label)),
        }
    }

    pub(crate) fn flag(&self, names: &[&str], default: bool) -> Result<bool> {
        match self.find(names) {
            None => Ok(default),
            Some((n, x)) => x
                .as_bool()
                .ok_or_else(|| anyhow!("{}: '{n}' = {x} is not a boolean", self.label)),
        }
    }
}

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

/// `config` (a `config.json` object) with every field of `defaults` it lacks added: the
/// defaults transformers' config class gives omitted fields (each family keeps its table per
/// `model_type`, checked against transformers 5.24 by its tests). The RoPE fields go as one:
/// `defaults`' `rope_parameters` is added only when `config` has none of `rope_parameters`,
/// `rope_scaling` and `rope_theta` (a config with its own RoPE fields keeps them, and the
/// family's default `rope_theta` applies). Fields present with any value, `null` included,
/// stay as they are; a `config` that is not an object is returned unchanged.
pub fn with_defaults(
    config: &serde_json::Value,
    defaults: &serde_json::Value,
) -> serde_json::Value {
    let mut out = config.clone();
    let (Some(obj), Some(defs)) = (out.as_object_mut(), defaults.as_object()) else {
        return out;
    };
    let has_rope = ["rope_parameters", "rope_scaling", "rope_theta"]
        .iter()
        .any(|k| obj.contains_key(*k));
    for (k, v) in defs {
        if k == "rope_parameters" && has_rope {
            continue;
        }
        if !obj.contains_key(k) {
            obj.insert(k.clone(), v.clone());
        }
    }
    out
}

/// For the families' tests: `view` (what a family's parsed `Config` uses for each field, as
/// JSON) against transformers 5.24's class defaults in tests/fixtures/config_defaults.json
/// (tools/reference/config_defaults.py) for `model_type`: every field the view names must be
/// in the fixture, with an equal value (numbers compared as f64; a `null` `head_dim` in the
/// fixture stands for `hidden_size / num_attention_heads`). Returns the mismatches, one per
/// field, as `MODEL_TYPE.FIELD: got G, transformers V`.
#[cfg(test)]
pub(crate) fn default_mismatches(
    model_type: &str,
    view: &serde_json::Map<String, serde_json::Value>,
    fixture_key: &str,
) -> Vec<String> {
    let fx: serde_json::Value =
        serde_json::from_str(include_str!("../../tests/fixtures/config_defaults.json")).unwrap();
    assert_eq!(fx["transformers_version"], "5.24.0");
    let want = &fx["model_types"][model_type][fixture_key];
    assert!(want.is_object(), "{model_type} is not in the fixture");
    let mut bad = Vec::new();
    for (field, got) in view {
        let Some(w) = want.get(field) else {
            bad.push(format!("{model_type}.{field}: not in transformers' class"));
            continue;
        };
        let w = if field == "head_dim" && w.is_null() {
            // The derived probe gives hidden_size 1024 and 64 heads.
            let d = &fx["model_types"][model_type]["defaults"];
            let (h, n) = match fixture_key {
                "defaults" => (d["hidden_size"].as_u64(), d["num_attention_heads"].as_u64()),
                _ => (Some(1024), Some(64)),
            };
            match (h, n) {
                (Some(h), Some(n)) => serde_json::json!(h / n),
                _ => w.clone(),
            }
        } else {
            w.clone()
        };
        if !json_eq(got, &w) {
            bad.push(format!("{model_type}.{field}: got {got}, transformers {w}"));
        }
    }
    bad
}

/// JSON equality with numbers compared as f64 (`4096` equals `4096.0`), objects key by key.
#[cfg(test)]
fn json_eq(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value as J;
    match (a, b) {
        (J::Number(x), J::Number(y)) => x.as_f64() == y.as_f64(),
        (J::Array(x), J::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_eq(p, q))
        }
        (J::Object(x), J::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

/// The largest dimension a Hugging Face `config.json` may give (a hostile config must not make
/// us allocate terabytes).
pub const CONFIG_DIM_MAX: usize = 1 << 20;

/// The `(field, value)` list [`check_config_dims`] takes, in the order given: `c; a, b = e,
/// "x.y" = e` is `[("a", c.a), ("b", e), ("x.y", e)]` (a field of `c` by its name, or any
/// value under a name).
macro_rules! config_dims {
    ($c:ident; $($t:tt)*) => { $crate::models::config::config_dims!(@acc $c; []; $($t)*) };
    (@acc $c:ident; [$($out:tt)*]; ) => { [$($out)*] };
    (@acc $c:ident; [$($out:tt)*]; $name:ident = $e:expr $(, $($rest:tt)*)?) => {
        $crate::models::config::config_dims!(@acc $c; [$($out)* (stringify!($name), $e),]; $($($rest)*)?)
    };
    (@acc $c:ident; [$($out:tt)*]; $name:literal = $e:expr $(, $($rest:tt)*)?) => {
        $crate::models::config::config_dims!(@acc $c; [$($out)* ($name, $e),]; $($($rest)*)?)
    };
    (@acc $c:ident; [$($out:tt)*]; $name:ident $(, $($rest:tt)*)?) => {
        $crate::models::config::config_dims!(@acc $c; [$($out)* (stringify!($name), $c.$name),]; $($($rest)*)?)
    };
}
pub(crate) use config_dims;

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

/// The file name (for errors) and the architecture of `g`, which `ok` must accept.
///
/// Errors: the architecture is missing, or `ok` refuses it, as
/// `FILE: architecture 'ARCH' is not WANT`.
pub fn gguf_arch(g: &GgufModel, ok: impl Fn(&str) -> bool, want: &str) -> Result<(String, String)> {
    let (file, arch) = (g.file_name(), g.architecture()?.to_string());
    if !ok(&arch) {
        bail!("{file}: architecture '{arch}' is not {want}");
    }
    Ok((file, arch))
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

/// The routed-MoE metadata of llama.cpp's DeepSeek-V3-style architectures (`deepseek2`,
/// `kimi-linear`), keys `ARCH.*` as `src/llama-arch.cpp` names them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GgufSigmoidMoe {
    /// `expert_count`: routed experts per MoE layer.
    pub experts: usize,
    /// `expert_used_count`: top-k.
    pub used: usize,
    /// `expert_feed_forward_length`: one routed (and shared) expert's FFN width.
    pub expert_ff: usize,
    /// `expert_shared_count`: shared experts per MoE layer.
    pub shared: usize,
    /// `leading_dense_block_count`: dense layers before the first MoE layer (default 0).
    pub dense: usize,
    /// `feed_forward_length`: the dense layers' FFN width (required when `dense` > 0; else
    /// `expert_ff` when absent).
    pub dense_ff: usize,
    /// `expert_group_count` / `expert_group_used_count`: group-limited routing (default 1 / 1).
    pub groups: usize,
    /// See `groups`.
    pub groups_used: usize,
    /// `expert_weights_scale`: the routed-weight scale; llama.cpp skips the scaling when the
    /// key is absent or 0, so both read as 1.
    pub scale: f32,
}

/// Reads [`GgufSigmoidMoe`] from the keys `{arch}.*`. Errors name the file and the key: a
/// missing required key, a count outside its range (`expert_used_count` above
/// `expert_count`, group counts likewise), and an `expert_gating_func` other than 2
/// (sigmoid; llama.cpp reads an absent key as softmax).
pub fn gguf_sigmoid_moe(g: &GgufModel, arch: &str) -> Result<GgufSigmoidMoe> {
    const DIM_MAX: u64 = 1 << 20;
    // llama.cpp's `LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID`
    const GATING_SIGMOID: u64 = 2;
    let k = |s: &str| format!("{arch}.{s}");
    let experts = gguf_count(g, &k("expert_count"), 1..=(1 << 16))?;
    let used = gguf_count(g, &k("expert_used_count"), 1..=experts as u64)?;
    let expert_ff = gguf_count(g, &k("expert_feed_forward_length"), 1..=DIM_MAX)?;
    let shared = gguf_count(g, &k("expert_shared_count"), 1..=1024)?;
    let dense = g.opt_u64(&k("leading_dense_block_count"))?.unwrap_or(0) as usize;
    let dense_ff = match dense {
        0 => opt_gguf_count(g, &k("feed_forward_length"), 1..=DIM_MAX)?.unwrap_or(expert_ff),
        _ => gguf_count(g, &k("feed_forward_length"), 1..=DIM_MAX)?,
    };
    match g.opt_u64(&k("expert_gating_func"))? {
        Some(GATING_SIGMOID) => {}
        other => bail!(
            "{}: metadata key '{arch}.expert_gating_func' = {} is not supported (only 2, sigmoid)",
            g.file_name(),
            other.map_or("missing (llama.cpp: softmax)".to_string(), |v| v
                .to_string())
        ),
    }
    let groups = opt_gguf_count(g, &k("expert_group_count"), 1..=(1 << 16))?.unwrap_or(1);
    let groups_used =
        opt_gguf_count(g, &k("expert_group_used_count"), 1..=groups as u64)?.unwrap_or(1);
    let scale = g.opt_f32(&k("expert_weights_scale"))?.unwrap_or(0.0);
    let scale = if scale == 0.0 { 1.0 } else { scale };
    Ok(GgufSigmoidMoe {
        experts,
        used,
        expert_ff,
        shared,
        dense,
        dense_ff,
        groups,
        groups_used,
        scale,
    })
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
