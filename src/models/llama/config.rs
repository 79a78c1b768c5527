//! The `config.json` of Qwen3 (`model_type: qwen3`) and Qwen3-MoE (`qwen3_moe`) checkpoints,
//! field names as in Hugging Face `Qwen3Config` / `Qwen3MoeConfig`
//! (`models/qwen3{,_moe}/configuration_qwen3{,_moe}.py`), in both dialects: published
//! checkpoints (`rope_theta`, `rope_scaling`, `torch_dtype`, `num_experts`) and transformers 5
//! (`rope_parameters {rope_theta, rope_type}`, `dtype`, `num_local_experts`).
//!
//! The same struct reads Llama (`model_type: llama`, `LlamaConfig`, with `llama3` RoPE
//! scaling and `mlp_bias`) and Mixtral (`mixtral`, `MixtralConfig`: `num_local_experts`,
//! experts of `intermediate_size`, `sliding_window`).

use anyhow::{anyhow, bail, Result};
use serde::Deserialize;

use crate::models::config::config_dims;
use crate::models::config::defaults;
use crate::models::needs::MemoryNeeds;

use crate::models::rope::{HfRope, RopeScaling};

/// Fields of `config.json` that the forward pass uses; defaults are transformers'.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Config {
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// Dense MLP width (also the MoE layers' in `mlp_only_layers`).
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// Default: `num_attention_heads`.
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Default: `hidden_size / num_attention_heads`.
    #[serde(default)]
    pub head_dim: Option<usize>,
    #[serde(default = "defaults::eps_1e6")]
    pub rms_norm_eps: f64,
    /// Published dialect: RoPE base at top level.
    #[serde(default)]
    pub rope_theta: Option<f64>,
    /// Published dialect: `null` or `{type | rope_type, ...}`.
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    /// transformers 5 dialect: `{rope_type, rope_theta, ...}`.
    #[serde(default)]
    pub rope_parameters: Option<serde_json::Value>,
    #[serde(default = "defaults::count::<32768>")]
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default = "defaults::silu")]
    pub hidden_act: String,
    /// Llama: biases on the MLP projections (only `false` is supported).
    #[serde(default)]
    pub mlp_bias: bool,
    #[serde(default)]
    pub use_sliding_window: bool,
    /// Mixtral: attention window in tokens (`null`: full attention). Ignored by Qwen3, which
    /// only applies a window under `use_sliding_window` (rejected).
    #[serde(default)]
    pub sliding_window: Option<usize>,
    /// Published Qwen3-MoE name of the expert count.
    #[serde(default)]
    pub num_experts: Option<usize>,
    /// transformers 5 name of the expert count.
    #[serde(default)]
    pub num_local_experts: Option<usize>,
    #[serde(default)]
    pub num_experts_per_tok: Option<usize>,
    #[serde(default)]
    pub moe_intermediate_size: Option<usize>,
    #[serde(default)]
    pub norm_topk_prob: bool,
    #[serde(default = "defaults::count::<1>")]
    pub decoder_sparse_step: usize,
    #[serde(default)]
    pub mlp_only_layers: Vec<usize>,
}


use crate::models::config::CONFIG_DIM_MAX as DIM_MAX;

/// The values transformers 5.24's `Qwen3Config`, `Qwen3MoeConfig`, `LlamaConfig` and
/// `MixtralConfig` give the fields this config reads when `config.json` omits them (the
/// classes' `__init__` defaults; fields a class derives, such as Llama's
/// `num_key_value_heads` and `head_dim`, are left to [`Config::n_kv_heads`] and
/// [`Config::head_dim`]). Checked field by field against transformers by this module's tests.
fn transformers_defaults(model_type: &str) -> serde_json::Value {
    use serde_json::json;
    let rope = |theta: f64| json!({"rope_theta": theta, "rope_type": "default"});
    match model_type {
        "qwen3" => json!({"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
            "head_dim": 128, "rms_norm_eps": 1e-6, "max_position_embeddings": 32768,
            "rope_parameters": rope(10_000.0)}),
        "qwen3_moe" => json!({"vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
            "num_hidden_layers": 24, "num_attention_heads": 32, "num_key_value_heads": 4,
            "rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "decoder_sparse_step": 1,
            "moe_intermediate_size": 768, "num_experts_per_tok": 8, "norm_topk_prob": false,
            "rope_parameters": rope(10_000.0)}),
        "llama" => json!({"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
            "num_hidden_layers": 32, "num_attention_heads": 32, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 2048, "rope_parameters": rope(10_000.0)}),
        "mixtral" => json!({"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "rms_norm_eps": 1e-5, "max_position_embeddings": 131072, "num_experts_per_tok": 2,
            "num_local_experts": 8, "rope_parameters": rope(1e6)}),
        _ => json!({}),
    }
}

impl Config {
    /// Parses and checks `config.json` (`label` names the file in errors).
    ///
    /// Errors: a missing or mistyped field (named), zero or absurd dimensions, heads not a
    /// multiple of KV heads, odd `head_dim`, a RoPE type other than `default` or `llama3` (or
    /// `llama3` with missing or inconsistent parameters), an activation other than `silu`,
    /// `attention_bias`, `mlp_bias` or `use_sliding_window` (not implemented), a zero
    /// `sliding_window`, a MoE config without expert count, top-k or expert width.
    pub fn from_json(v: &serde_json::Value, label: &str) -> Result<Self> {
        let model_type = v.get("model_type").and_then(|m| m.as_str()).unwrap_or("");
        let mut v = crate::models::config::with_defaults(v, &transformers_defaults(model_type));
        // Qwen3-MoE's expert count goes by either name: default it only when both are absent.
        if let Some(o) = v.as_object_mut() {
            if model_type == "qwen3_moe"
                && !o.contains_key("num_experts")
                && !o.contains_key("num_local_experts")
            {
                o.insert("num_local_experts".into(), 128.into());
            }
        }
        let c: Config = serde_json::from_value(v).map_err(|e| anyhow!("{label}: {e}"))?;
        let dims = config_dims!(c;
            vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
            num_key_value_heads = c.n_kv_heads(), head_dim = c.head_dim()
        );
        crate::models::config::check_config_dims(label, &dims)?;
        crate::models::config::check_gqa(label, c.num_attention_heads, c.n_kv_heads(), c.head_dim())?;
        crate::models::config::check_rope_theta_and_eps(label, &c.hf_rope(), c.default_theta(), c.rms_norm_eps)?;
        c.hf_rope()
            .scaling(c.max_position_embeddings, &["default", "llama3"])
            .map_err(|e| anyhow!("{label}: {e}"))?;
        if c.hidden_act != "silu" {
            bail!(
                "{label}: hidden_act '{}' is not supported (only silu)",
                c.hidden_act
            );
        }
        if c.attention_bias {
            bail!("{label}: attention_bias = true is not supported yet");
        }
        if c.mlp_bias {
            bail!("{label}: mlp_bias = true is not supported yet");
        }
        if c.model_type == "mixtral" && c.sliding_window == Some(0) {
            bail!("{label}: sliding_window must be at least 1 (or null)");
        }
        if c.use_sliding_window {
            bail!("{label}: use_sliding_window = true is not supported yet");
        }
        if c.model_type == "qwen3_moe" || c.model_type == "mixtral" {
            let e = c.n_experts();
            let k = c.num_experts_per_tok.unwrap_or(0);
            let ff = c.expert_ff();
            if e == 0 || e > 1 << 16 || k == 0 || k > e || ff == 0 || ff > DIM_MAX {
                bail!(
                    "{label}: MoE needs num_experts (or num_local_experts) in 1..=65536, num_experts_per_tok in 1..=num_experts and moe_intermediate_size in 1..={DIM_MAX} (got {e}, {k}, {ff})"
                );
            }
            if c.decoder_sparse_step == 0 {
                bail!("{label}: decoder_sparse_step must be at least 1");
            }
        }
        Ok(c)
    }

    pub fn n_kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim()
    }

    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads() * self.head_dim()
    }

    /// RAM a pass needs besides the weights ([`MemoryNeeds`]); `qk_norm`: the layers have
    /// query/key norms (Qwen3).
    pub(super) fn memory_needs(&self, qk_norm: bool) -> MemoryNeeds {
        let (d, l, kvd) = (self.hidden_size, self.num_hidden_layers, self.kv_dim());
        let qk_norms = if qk_norm { 2 * self.head_dim() } else { 0 };
        MemoryNeeds {
            row_floats: 4 * d
                + 2 * self.q_dim()
                + 2 * kvd
                + 2 * self.intermediate_size.max(self.expert_ff())
                + self.n_experts(),
            pass_floats: self.vocab_size,
            thread_ctx_floats: 1,
            state_ctx_floats: 2 * l * kvd,
            vector_floats: d * (2 * l + 1) + qk_norms * l,
            max_ctx: self.max_position_embeddings,
            ..Default::default()
        }
    }

    /// Expert count: `num_experts`, else `num_local_experts`, else 0 (dense).
    pub fn n_experts(&self) -> usize {
        self.num_experts.or(self.num_local_experts).unwrap_or(0)
    }

    /// The RoPE fields, in either dialect.
    pub fn hf_rope(&self) -> HfRope<'_> {
        HfRope {
            parameters: self.rope_parameters.as_ref(),
            scaling: self.rope_scaling.as_ref(),
            theta: self.rope_theta,
        }
    }

    /// RoPE base: `rope_parameters.rope_theta`, else `rope_theta`, else transformers' default
    /// (1e6 for Mixtral, 10000 for the others).
    pub fn rope_base(&self) -> f64 {
        self.hf_rope().theta(self.default_theta())
    }

    /// transformers' default `rope_theta` for this `model_type`.
    fn default_theta(&self) -> f64 {
        match self.model_type.as_str() {
            "mixtral" => 1e6,
            _ => 10_000.0,
        }
    }

    /// RoPE inverse frequencies (`head_dim / 2`, radians per token): `base^(-2i/head_dim)`,
    /// adjusted for `llama3` scaling ([`crate::models::rope::Llama3::apply`]); a config whose
    /// RoPE parameters [`Config::from_json`] refuses gets the default ones.
    pub fn rope_freqs(&self) -> Vec<f32> {
        let s = self
            .hf_rope()
            .scaling(self.max_position_embeddings, &["default", "llama3"])
            .unwrap_or(RopeScaling::Default);
        s.inv_freq(self.head_dim(), self.rope_base())
    }

    /// Width of one routed expert: `moe_intermediate_size` (Qwen3-MoE), `intermediate_size`
    /// (Mixtral), 0 otherwise.
    pub fn expert_ff(&self) -> usize {
        match self.model_type.as_str() {
            "mixtral" => self.intermediate_size,
            _ => self.moe_intermediate_size.unwrap_or(0),
        }
    }

    /// Whether the chosen experts' weights are renormalised to sum to 1: always for Mixtral,
    /// `norm_topk_prob` for Qwen3-MoE.
    pub fn renorm_topk(&self) -> bool {
        self.model_type == "mixtral" || self.norm_topk_prob
    }

    /// Whether attention layers carry per-head q/k RMSNorm (Qwen3 families only).
    pub fn has_qk_norm(&self) -> bool {
        self.model_type.starts_with("qwen3")
    }

    /// Attention window in tokens (Mixtral's `sliding_window`), `None` for full attention.
    pub fn attn_window(&self) -> Option<usize> {
        match self.model_type.as_str() {
            "mixtral" => self.sliding_window,
            _ => None,
        }
    }

    /// RoPE type: `rope_parameters.rope_type`, else `rope_scaling.rope_type` or `.type`, else
    /// `default`.
    pub fn rope_type(&self) -> String {
        self.hf_rope().rope_type()
    }

    /// Whether layer `l` uses the sparse MoE block (transformers' `Qwen3MoeDecoderLayer`:
    /// not in `mlp_only_layers`, experts present and `(l + 1) % decoder_sparse_step == 0`).
    /// Every Mixtral layer is sparse.
    pub fn is_moe_layer(&self, l: usize) -> bool {
        if self.model_type == "mixtral" {
            return self.n_experts() > 0;
        }
        self.model_type == "qwen3_moe"
            && self.n_experts() > 0
            && !self.mlp_only_layers.contains(&l)
            && (l + 1).is_multiple_of(self.decoder_sparse_step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What the parsed config uses for each field transformers defaults, as JSON.
    fn view(c: &Config) -> serde_json::Map<String, serde_json::Value> {
        let mut v = json!({"vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
            "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_hidden_layers,
            "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.n_kv_heads(),
            "head_dim": c.head_dim(), "rms_norm_eps": c.rms_norm_eps,
            "max_position_embeddings": c.max_position_embeddings,
            "tie_word_embeddings": c.tie_word_embeddings, "attention_bias": c.attention_bias,
            "hidden_act": c.hidden_act,
            "rope_parameters": {"rope_theta": c.rope_base(), "rope_type": c.hf_rope().rope_type()}});
        let o = v.as_object_mut().unwrap();
        match c.model_type.as_str() {
            "qwen3" => {
                o.insert("use_sliding_window".into(), c.use_sliding_window.into());
                o.insert("sliding_window".into(), json!(c.sliding_window));
            }
            "qwen3_moe" => {
                for (k, x) in [
                    ("use_sliding_window", json!(c.use_sliding_window)),
                    ("sliding_window", json!(c.sliding_window)),
                    ("num_local_experts", json!(c.n_experts())),
                    ("num_experts_per_tok", json!(c.num_experts_per_tok)),
                    ("moe_intermediate_size", json!(c.moe_intermediate_size)),
                    ("norm_topk_prob", json!(c.norm_topk_prob)),
                    ("decoder_sparse_step", json!(c.decoder_sparse_step)),
                    ("mlp_only_layers", json!(c.mlp_only_layers)),
                ] {
                    o.insert(k.into(), x);
                }
            }
            "llama" => {
                o.insert("mlp_bias".into(), c.mlp_bias.into());
            }
            _ => {
                // Mixtral's class has no attention_bias (its attention has none).
                o.remove("attention_bias");
                o.insert("sliding_window".into(), json!(c.sliding_window));
                o.insert("num_local_experts".into(), json!(c.n_experts()));
                o.insert("num_experts_per_tok".into(), json!(c.num_experts_per_tok));
            }
        }
        v.as_object().unwrap().clone()
    }

    #[test]
    fn omitted_fields_get_transformers_defaults() {
        use crate::models::config::default_mismatches;
        let mut bad = Vec::new();
        let mut checked = 0;
        for mt in ["qwen3", "qwen3_moe", "llama", "mixtral"] {
            let c = Config::from_json(&json!({ "model_type": mt }), "c.json").unwrap();
            let v = view(&c);
            checked += v.len();
            bad.extend(default_mismatches(mt, &v, "defaults"));
            // Derived fields: only hidden_size 1024 and 64 heads given.
            let c = Config::from_json(
                &json!({"model_type": mt, "hidden_size": 1024, "num_attention_heads": 64}),
                "c.json",
            )
            .unwrap();
            let d: serde_json::Map<_, _> = [
                ("num_key_value_heads".to_string(), json!(c.n_kv_heads())),
                ("head_dim".to_string(), json!(c.head_dim())),
            ]
            .into_iter()
            .collect();
            bad.extend(default_mismatches(mt, &d, "derived_1024_64"));
        }
        assert!(bad.is_empty(), "{}", bad.join("\n"));
        assert_eq!(checked, 15 + 21 + 14 + 15);
        // A config with its own RoPE fields keeps them; the family's theta fills in.
        let c = Config::from_json(
            &json!({"model_type": "mixtral", "rope_scaling": null}),
            "c.json",
        )
        .unwrap();
        assert_eq!(c.rope_base(), 1e6);
    }

    fn base() -> serde_json::Value {
        json!({"model_type": "qwen3_moe", "vocab_size": 512, "hidden_size": 64,
               "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 16, "moe_intermediate_size": 32,
               "num_experts_per_tok": 2})
    }

    #[test]
    fn reads_both_dialects() {
        let mut v = base();
        v["rope_theta"] = json!(1e6);
        v["rope_scaling"] = json!(null);
        v["torch_dtype"] = json!("bfloat16");
        v["num_experts"] = json!(8);
        v["mlp_only_layers"] = json!([1]);
        v["decoder_sparse_step"] = json!(1);
        let a = Config::from_json(&v, "c.json").unwrap();
        let mut w = base();
        w["rope_parameters"] = json!({"rope_theta": 1e6, "rope_type": "default"});
        w["dtype"] = json!("bfloat16");
        w["num_local_experts"] = json!(8);
        w["mlp_only_layers"] = json!([1]);
        let b = Config::from_json(&w, "c.json").unwrap();
        for c in [&a, &b] {
            assert_eq!(
                (c.rope_base(), c.rope_type().as_str(), c.n_experts()),
                (1e6, "default", 8)
            );
            let moe: Vec<bool> = (0..4).map(|l| c.is_moe_layer(l)).collect();
            assert_eq!(moe, [true, false, true, true]);
        }
        w["decoder_sparse_step"] = json!(2);
        let c = Config::from_json(&w, "c.json").unwrap();
        let moe: Vec<bool> = (0..4).map(|l| c.is_moe_layer(l)).collect();
        assert_eq!(moe, [false, false, false, true]);
    }

    #[test]
    fn errors_name_the_field() {
        let mut v = base();
        v["hidden_size"] = json!("x");
        let e = Config::from_json(&v, "c.json").unwrap_err().to_string();
        assert_eq!(e, "c.json: invalid type: string \"x\", expected usize");
        let mut v = base();
        v["num_local_experts"] = json!(8);
        v["rope_scaling"] = json!({"type": "yarn", "factor": 4.0});
        let e = Config::from_json(&v, "c.json").unwrap_err().to_string();
        assert_eq!(
            e,
            "c.json: rope type 'yarn' is not supported (only default, llama3)"
        );
        let mut v = base();
        v["num_experts_per_tok"] = json!(0);
        let e = Config::from_json(&v, "c.json").unwrap_err().to_string();
        assert!(e.starts_with("c.json: MoE needs num_experts"), "{e}");
        // Without an expert count, Qwen3-MoE gets transformers' 128.
        assert_eq!(Config::from_json(&base(), "c.json").unwrap().n_experts(), 128);
    }

    #[test]
    fn llama3_rope_frequencies_follow_the_three_bands() {
        let mut v = base();
        v["model_type"] = json!("llama");
        v["rope_parameters"] = json!({"rope_theta": 500000.0, "rope_type": "llama3",
            "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64});
        let c = Config::from_json(&v, "c.json").unwrap();
        // wavelengths 2π/f against 64/4 = 16 and 64/1 = 64 tokens: i = 0 (6.3) kept, i = 1
        // (32.4) interpolated, i >= 2 (>= 167) divided by 8; values from the formula in f64
        let want = [
            1.0,
            0.0794030091792082,
            0.004700753866357992,
            0.0009115830921521386,
            0.00017677669529663688,
            3.428102195952591e-05,
            6.647869871181236e-06,
            1.2891731721515574e-06,
        ];
        let got = c.rope_freqs();
        assert_eq!(got.len(), 8);
        for (g, w) in got.iter().zip(want) {
            assert!(((*g as f64) - w).abs() <= 1e-6 * w, "{g} vs {w}");
        }
        // `default` keeps base^(-2i/d)
        v["rope_parameters"] = json!({"rope_theta": 500000.0, "rope_type": "default"});
        let c = Config::from_json(&v, "c.json").unwrap();
        assert!((c.rope_freqs()[1] as f64 - 0.19392274474868576).abs() < 1e-7);
        v["rope_parameters"] = json!({"rope_theta": 500000.0, "rope_type": "llama3",
            "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0,
            "original_max_position_embeddings": 64});
        let e = Config::from_json(&v, "c.json").unwrap_err().to_string();
        assert_eq!(e, "c.json: llama3 RoPE parameters out of range (factor 8, low_freq_factor 4, high_freq_factor 1, original_max_position_embeddings 64)");
    }

    #[test]
    fn rope_theta_and_rms_norm_eps_are_refused_by_name() {
        crate::models::config::assert_refuses_bad_theta_and_eps(&base(), |v| {
            Config::from_json(v, "c.json")
        });
    }
}
