//! The `config.json` of Qwen3 (`model_type: qwen3`) and Qwen3-MoE (`qwen3_moe`) checkpoints,
//! field names as in Hugging Face `Qwen3Config` / `Qwen3MoeConfig`
//! (`models/qwen3{,_moe}/configuration_qwen3{,_moe}.py`), in both dialects: published
//! checkpoints (`rope_theta`, `rope_scaling`, `torch_dtype`, `num_experts`) and transformers 5
//! (`rope_parameters {rope_theta, rope_type}`, `dtype`, `num_local_experts`).

use anyhow::{anyhow, bail, Result};
use serde::Deserialize;

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
    #[serde(default = "default_eps")]
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
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    #[serde(default)]
    pub use_sliding_window: bool,
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
    #[serde(default = "one")]
    pub decoder_sparse_step: usize,
    #[serde(default)]
    pub mlp_only_layers: Vec<usize>,
}

fn default_eps() -> f64 {
    1e-6
}
fn default_max_pos() -> usize {
    32768
}
fn default_act() -> String {
    "silu".into()
}
fn one() -> usize {
    1
}

/// Dimension limits checked at load (a hostile config must not make us allocate terabytes).
const DIM_MAX: usize = 1 << 20;

impl Config {
    /// Parses and checks `config.json` (`label` names the file in errors).
    ///
    /// Errors: a missing or mistyped field (named), zero or absurd dimensions, heads not a
    /// multiple of KV heads, odd `head_dim`, a RoPE type other than `default`, an activation
    /// other than `silu`, `attention_bias` or `use_sliding_window` (not implemented), a MoE
    /// config without expert count, top-k or expert width.
    pub fn from_json(v: &serde_json::Value, label: &str) -> Result<Self> {
        let c: Config = serde_json::from_value(v.clone()).map_err(|e| anyhow!("{label}: {e}"))?;
        let dims = [
            ("vocab_size", c.vocab_size),
            ("hidden_size", c.hidden_size),
            ("intermediate_size", c.intermediate_size),
            ("num_hidden_layers", c.num_hidden_layers),
            ("num_attention_heads", c.num_attention_heads),
            ("num_key_value_heads", c.n_kv_heads()),
            ("head_dim", c.head_dim()),
        ];
        for (k, d) in dims {
            if d == 0 || d > DIM_MAX {
                bail!("{label}: '{k}' = {d} is outside 1..={DIM_MAX}");
            }
        }
        if !c.num_attention_heads.is_multiple_of(c.n_kv_heads()) {
            bail!(
                "{label}: num_attention_heads {} is not a multiple of num_key_value_heads {}",
                c.num_attention_heads,
                c.n_kv_heads()
            );
        }
        if !c.head_dim().is_multiple_of(2) {
            bail!("{label}: head_dim {} must be even for RoPE", c.head_dim());
        }
        let rt = c.rope_type();
        if rt != "default" {
            bail!("{label}: rope type '{rt}' is not supported yet (only default)");
        }
        if c.hidden_act != "silu" {
            bail!(
                "{label}: hidden_act '{}' is not supported (only silu)",
                c.hidden_act
            );
        }
        if c.attention_bias {
            bail!("{label}: attention_bias = true is not supported yet");
        }
        if c.use_sliding_window {
            bail!("{label}: use_sliding_window = true is not supported yet");
        }
        if c.model_type == "qwen3_moe" {
            let e = c.n_experts();
            let k = c.num_experts_per_tok.unwrap_or(0);
            let ff = c.moe_intermediate_size.unwrap_or(0);
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

    /// Expert count: `num_experts`, else `num_local_experts`, else 0 (dense).
    pub fn n_experts(&self) -> usize {
        self.num_experts.or(self.num_local_experts).unwrap_or(0)
    }

    /// RoPE base: `rope_parameters.rope_theta`, else `rope_theta`, else 10000 (transformers'
    /// default).
    pub fn rope_base(&self) -> f64 {
        self.rope_parameters
            .as_ref()
            .and_then(|p| p.get("rope_theta"))
            .and_then(|v| v.as_f64())
            .or(self.rope_theta)
            .unwrap_or(10_000.0)
    }

    /// RoPE type: `rope_parameters.rope_type`, else `rope_scaling.rope_type` or `.type`, else
    /// `default`.
    pub fn rope_type(&self) -> String {
        let from = |v: &Option<serde_json::Value>| -> Option<String> {
            let o = v.as_ref()?.as_object()?;
            o.get("rope_type")
                .or_else(|| o.get("type"))
                .and_then(|t| t.as_str())
                .map(str::to_string)
        };
        from(&self.rope_parameters)
            .or_else(|| from(&self.rope_scaling))
            .unwrap_or_else(|| "default".into())
    }

    /// Whether layer `l` uses the sparse MoE block (transformers' `Qwen3MoeDecoderLayer`:
    /// not in `mlp_only_layers`, experts present and `(l + 1) % decoder_sparse_step == 0`).
    pub fn is_moe_layer(&self, l: usize) -> bool {
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
        v.as_object_mut().unwrap().remove("hidden_size");
        let e = Config::from_json(&v, "c.json").unwrap_err().to_string();
        assert_eq!(e, "c.json: missing field `hidden_size`");
        let mut v = base();
        v["num_local_experts"] = json!(8);
        v["rope_scaling"] = json!({"type": "yarn", "factor": 4.0});
        let e = Config::from_json(&v, "c.json").unwrap_err().to_string();
        assert_eq!(
            e,
            "c.json: rope type 'yarn' is not supported yet (only default)"
        );
        let e = Config::from_json(&base(), "c.json")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("c.json: MoE needs num_experts"), "{e}");
    }
}
