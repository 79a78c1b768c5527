//! The `config.json` of GPT-OSS checkpoints (`model_type: gpt_oss`), field names as in
//! Hugging Face `GptOssConfig` (`models/gpt_oss/configuration_gpt_oss.py`), in both dialects:
//! published (`rope_theta` + `rope_scaling`) and transformers 5 (`rope_parameters`).
//! Also the YaRN RoPE frequencies and attention factor (`modeling_rope_utils.py`,
//! `_compute_yarn_parameters`; Peng et al. 2023, "YaRN").

use anyhow::{anyhow, bail, Result};
use serde::Deserialize;

use crate::models::rope::{default_inv_freq_f64, HfRope, Yarn};

use crate::models::config::config_dims;
use crate::models::config::defaults;
use crate::models::needs::MemoryNeeds;

/// Fields of `config.json` that the forward pass uses; defaults are transformers'.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Config {
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// Width of one expert (`gate_up_proj` has `2 × intermediate_size` outputs).
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    /// Default: `hidden_size / num_attention_heads`.
    #[serde(default)]
    pub head_dim: Option<usize>,
    #[serde(default = "defaults::eps_1e5")]
    pub rms_norm_eps: f64,
    #[serde(default)]
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    #[serde(default)]
    pub rope_parameters: Option<serde_json::Value>,
    #[serde(default = "defaults::count::<131072>")]
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Biases on q/k/v/o (transformers' default for gpt_oss: true).
    #[serde(default = "defaults::yes")]
    pub attention_bias: bool,
    /// Attention window of `sliding_attention` layers, in tokens (the current one included).
    #[serde(default = "defaults::count::<128>")]
    pub sliding_window: usize,
    /// Per layer: `sliding_attention` or `full_attention`. Default: alternating, starting
    /// with `sliding_attention` (transformers' `GptOssConfig`).
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    pub num_local_experts: usize,
    pub num_experts_per_tok: usize,
    #[serde(default = "default_alpha")]
    pub swiglu_alpha: f64,
    #[serde(default = "default_limit")]
    pub swiglu_limit: f64,
    #[serde(default = "defaults::silu")]
    pub hidden_act: String,
    /// `{"quant_method": "mxfp4", ...}` for MXFP4 experts.
    #[serde(default)]
    pub quantization_config: Option<serde_json::Value>,
}

/// The values transformers 5.24's `GptOssConfig` gives the fields this config reads when
/// `config.json` omits them (its `__init__` defaults, RoPE included: YaRN with factor 32 over
/// 4096 positions, base 150000). Checked field by field against transformers by this module's
/// tests.
fn transformers_defaults() -> serde_json::Value {
    serde_json::json!({"num_hidden_layers": 36, "num_local_experts": 128, "vocab_size": 201088,
        "hidden_size": 2880, "intermediate_size": 2880, "head_dim": 64,
        "num_attention_heads": 64, "num_key_value_heads": 8, "num_experts_per_tok": 4,
        "rope_parameters": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
            "beta_slow": 1.0, "truncate": false, "original_max_position_embeddings": 4096,
            "rope_theta": 150000.0}})
}

fn default_alpha() -> f64 {
    1.702
}
fn default_limit() -> f64 {
    7.0
}

impl Config {
    /// Parses and checks `config.json` (`label` names the file in errors).
    ///
    /// Errors: a missing or mistyped field (named), zero or absurd dimensions, heads not a
    /// multiple of KV heads, odd `head_dim`, `layer_types` of the wrong length or with an
    /// unknown entry, a zero `sliding_window`, a RoPE type other than `default` or `yarn`
    /// (or `yarn` without numeric `factor` / `original_max_position_embeddings`), an
    /// activation other than `silu`, `attention_bias = false`, expert count or top-k out of
    /// range, a `quant_method` other than `mxfp4`.
    pub fn from_json(v: &serde_json::Value, label: &str) -> Result<Self> {
        let v = crate::models::config::with_defaults(v, &transformers_defaults());
        let c: Config = serde_json::from_value(v).map_err(|e| anyhow!("{label}: {e}"))?;
        let dims = config_dims!(c;
            vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
            num_key_value_heads, head_dim = c.head_dim(), sliding_window
        );
        crate::models::config::check_config_dims(label, &dims)?;
        crate::models::config::check_gqa(label, c.num_attention_heads, c.num_key_value_heads, c.head_dim())?;
        crate::models::config::check_rope_theta_and_eps(label, &c.hf_rope(), 150_000.0, c.rms_norm_eps)?;
        if let Some(lt) = &c.layer_types {
            if lt.len() != c.num_hidden_layers {
                bail!(
                    "{label}: 'layer_types' has {} entries for {} layers",
                    lt.len(),
                    c.num_hidden_layers
                );
            }
            if let Some(bad) = lt
                .iter()
                .find(|t| *t != "sliding_attention" && *t != "full_attention")
            {
                bail!("{label}: 'layer_types' entry '{bad}' is not sliding_attention or full_attention");
            }
        }
        let e = c.num_local_experts;
        let k = c.num_experts_per_tok;
        if e == 0 || e > 1 << 16 || k == 0 || k > e {
            bail!("{label}: num_local_experts must be in 1..=65536 and num_experts_per_tok in 1..=num_local_experts (got {e}, {k})");
        }
        if c.hidden_act != "silu" {
            bail!(
                "{label}: hidden_act '{}' is not supported (only silu)",
                c.hidden_act
            );
        }
        if !c.attention_bias {
            bail!("{label}: attention_bias = false is not supported (gpt_oss has biases)");
        }
        if !(c.swiglu_limit > 0.0 && c.swiglu_alpha.is_finite()) {
            bail!(
                "{label}: swiglu_limit {} / swiglu_alpha {} out of range",
                c.swiglu_limit,
                c.swiglu_alpha
            );
        }
        c.hf_rope()
            .scaling(c.max_position_embeddings, &["default", "yarn"])
            .map_err(|e| anyhow!("{label}: {e}"))?;
        if let Some(q) = &c.quantization_config {
            let m = q.get("quant_method").and_then(|m| m.as_str()).unwrap_or("");
            if m != "mxfp4" {
                bail!(
                    "{label}: quantization_config.quant_method '{m}' is not supported (only mxfp4)"
                );
            }
        }
        Ok(c)
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim()
    }

    pub fn kv_dim(&self) -> usize {
        self.num_key_value_heads * self.head_dim()
    }

    /// RAM a pass needs besides the weights ([`MemoryNeeds`]); the resident vectors are each
    /// layer's two norms, attention biases, sinks and router bias, and the final norm.
    pub(super) fn memory_needs(&self) -> MemoryNeeds {
        let (d, l, ff) = (self.hidden_size, self.num_hidden_layers, self.intermediate_size);
        let (qd, kvd) = (self.q_dim(), self.kv_dim());
        let (ne, nh) = (self.num_local_experts, self.num_attention_heads);
        MemoryNeeds {
            row_floats: 4 * d + 2 * qd + 2 * kvd + 3 * ff + ne,
            pass_floats: self.vocab_size,
            thread_ctx_floats: 1,
            state_ctx_floats: 2 * l * kvd,
            vector_floats: l * (2 * d + qd + 2 * kvd + d + ne + nh) + d,
            max_ctx: self.max_position_embeddings,
            ..Default::default()
        }
    }

    /// Whether the experts are stored as MXFP4 (`quantization_config.quant_method`).
    pub fn mxfp4(&self) -> bool {
        self.quantization_config.is_some()
    }

    /// Attention window of layer `l`: `Some(sliding_window)` for `sliding_attention` layers,
    /// `None` for full attention.
    pub fn window(&self, l: usize) -> Option<usize> {
        let sliding = match &self.layer_types {
            Some(lt) => lt[l] == "sliding_attention",
            None => l.is_multiple_of(2),
        };
        sliding.then_some(self.sliding_window)
    }

    /// The RoPE fields, in either dialect.
    pub fn hf_rope(&self) -> HfRope<'_> {
        HfRope {
            parameters: self.rope_parameters.as_ref(),
            scaling: self.rope_scaling.as_ref(),
            theta: self.rope_theta,
        }
    }

    /// RoPE type: `rope_type` (or `type`) of the RoPE parameters object, else `default`.
    pub fn rope_type(&self) -> String {
        self.hf_rope().rope_type()
    }

    /// RoPE base: `rope_parameters.rope_theta`, else `rope_theta`, else 150000 (GPT-OSS).
    pub fn rope_base(&self) -> f64 {
        self.hf_rope().theta(150_000.0)
    }

    /// The YaRN parameters, when the RoPE type is `yarn` ([`HfRope::scaling`]).
    pub fn yarn(&self) -> Option<Yarn> {
        self.hf_rope()
            .scaling(self.max_position_embeddings, &["yarn"])
            .ok()
            .and_then(|s| s.yarn().copied())
    }

    /// RoPE inverse frequencies (`head_dim / 2`, radians per token) and the factor applied to
    /// cos and sin (so to both q and k): `default`, `base^(-2i/d)` and 1; `yarn`,
    /// [`Yarn::inv_freq`] and [`Yarn::attention_factor`]. Computed in f64.
    pub fn rope(&self) -> (Vec<f32>, f32) {
        let (d, base) = (self.head_dim(), self.rope_base());
        let (inv, att) = match self.yarn() {
            Some(y) => (y.inv_freq(d, base), y.attention_factor()),
            None => (default_inv_freq_f64(d, base), 1.0),
        };
        (inv.iter().map(|&f| f as f32).collect(), att as f32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn omitted_fields_get_transformers_defaults() {
        use crate::models::config::default_mismatches;
        let c = Config::from_json(&json!({"model_type": "gpt_oss"}), "c.json").unwrap();
        let layer_types: Vec<&str> = (0..c.num_hidden_layers)
            .map(|l| match c.window(l) {
                Some(_) => "sliding_attention",
                None => "full_attention",
            })
            .collect();
        let y = c.yarn().unwrap();
        let view = json!({"vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
            "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_hidden_layers,
            "num_attention_heads": c.num_attention_heads,
            "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim(),
            "rms_norm_eps": c.rms_norm_eps, "max_position_embeddings": c.max_position_embeddings,
            "tie_word_embeddings": c.tie_word_embeddings, "attention_bias": c.attention_bias,
            "hidden_act": c.hidden_act, "num_local_experts": c.num_local_experts,
            "num_experts_per_tok": c.num_experts_per_tok, "sliding_window": c.sliding_window,
            "swiglu_alpha": c.swiglu_alpha, "swiglu_limit": c.swiglu_limit,
            "layer_types": layer_types,
            "rope_parameters": {"rope_type": c.rope_type(), "factor": y.factor,
                "beta_fast": y.beta_fast, "beta_slow": y.beta_slow, "truncate": y.truncate,
                "original_max_position_embeddings": y.original_max_position_embeddings,
                "rope_theta": c.rope_base()}});
        let view = view.as_object().unwrap();
        assert_eq!(view.len(), 19);
        let bad = default_mismatches("gpt_oss", view, "defaults");
        assert!(bad.is_empty(), "{}", bad.join("\n"));
        let d = Config::from_json(
            &json!({"model_type": "gpt_oss", "hidden_size": 1024, "num_attention_heads": 64}),
            "c.json",
        )
        .unwrap();
        let derived = json!({"num_key_value_heads": d.num_key_value_heads, "head_dim": d.head_dim()});
        let bad = default_mismatches("gpt_oss", derived.as_object().unwrap(), "derived_1024_64");
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }

    fn base() -> serde_json::Value {
        json!({"model_type": "gpt_oss", "vocab_size": 489, "hidden_size": 64,
               "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 16, "num_local_experts": 8,
               "num_experts_per_tok": 2, "sliding_window": 8,
               "layer_types": ["sliding_attention", "full_attention"],
               "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                   "original_max_position_embeddings": 4096, "beta_fast": 32.0,
                   "beta_slow": 1.0, "truncate": false}})
    }

    #[test]
    fn yarn_frequencies_and_attention_factor() {
        let c = Config::from_json(&base(), "c.json").unwrap();
        let (inv, af) = c.rope();
        // 0.1 ln 32 + 1
        assert!((af as f64 - 1.3465735902799727).abs() < 1e-7, "{af}");
        // low = 16 ln(4096 / 64π) / (2 ln 150000) = 1.8756..., high = 16 ln(4096 / 2π) / (2 ln
        // 150000) = 4.3452...: i = 0, 1 extrapolated (kept), i >= 5 interpolated (/ 32)
        let fe = |i: usize| 150000f64.powf(-((2 * i) as f64) / 16.0);
        assert_eq!(inv[0], 1.0);
        assert_eq!(inv[1], fe(1) as f32);
        assert_eq!(inv[6], (fe(6) / 32.0) as f32);
        let (low, high) = (
            16.0 * (4096.0 / (64.0 * std::f64::consts::PI)).ln() / (2.0 * 150000f64.ln()),
            16.0 * (4096.0 / (2.0 * std::f64::consts::PI)).ln() / (2.0 * 150000f64.ln()),
        );
        let r = (3.0 - low) / (high - low);
        let want = fe(3) / 32.0 * r + fe(3) * (1.0 - r);
        assert!(
            (inv[3] as f64 - want).abs() < 1e-7 * want,
            "{} vs {want}",
            inv[3]
        );
        assert_eq!((c.window(0), c.window(1)), (Some(8), None));
    }

    #[test]
    fn errors_name_the_field() {
        let mut v = base();
        v["num_local_experts"] = json!("x");
        let e = Config::from_json(&v, "c.json").unwrap_err().to_string();
        assert_eq!(e, "c.json: invalid type: string \"x\", expected usize");
        let mut v = base();
        v["layer_types"] = json!(["sliding_attention"]);
        let e = Config::from_json(&v, "c.json").unwrap_err().to_string();
        assert_eq!(e, "c.json: 'layer_types' has 1 entries for 2 layers");
        let mut v = base();
        v["layer_types"] = json!(["sliding_attention", "chunked"]);
        let e = Config::from_json(&v, "c.json").unwrap_err().to_string();
        assert_eq!(
            e,
            "c.json: 'layer_types' entry 'chunked' is not sliding_attention or full_attention"
        );
        let mut v = base();
        v["quantization_config"] = json!({"quant_method": "fp8"});
        let e = Config::from_json(&v, "c.json").unwrap_err().to_string();
        assert_eq!(
            e,
            "c.json: quantization_config.quant_method 'fp8' is not supported (only mxfp4)"
        );
        let mut v = base();
        v["rope_parameters"]["rope_type"] = json!("longrope");
        let e = Config::from_json(&v, "c.json").unwrap_err().to_string();
        assert_eq!(
            e,
            "c.json: rope type 'longrope' is not supported (only default, yarn)"
        );
    }

    #[test]
    fn rope_theta_and_rms_norm_eps_are_refused_by_name() {
        crate::models::config::assert_refuses_bad_theta_and_eps(&base(), |v| {
            Config::from_json(v, "c.json")
        });
    }
}
