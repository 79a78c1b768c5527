//! The `config.json` of DeepSeek V3 checkpoints (`model_type: deepseek_v3`, also Kimi K2 text
//! models as `kimi_k2`), field names as in Hugging Face `DeepseekV3Config`
//! (`models/deepseek_v3/configuration_deepseek_v3.py`, transformers 5.24), in both dialects:
//! published (`rope_theta` + `rope_scaling {type: yarn, ...}`, `torch_dtype`) and transformers 5
//! (`rope_parameters {rope_type, rope_theta, ...}`, `dtype`).
//!
//! YaRN (Peng et al. 2023, "YaRN: Efficient Context Window Extension") is computed as
//! transformers' `_compute_yarn_parameters` (`modeling_rope_utils.py`) does, in f32, and the
//! softmax scale as `DeepseekV3Attention.scaling` (`yarn_apply_mscale`).

use anyhow::{anyhow, bail, Result};
use serde::Deserialize;

use crate::models::rope::{default_inv_freq_f32, get_mscale, HfRope, Yarn};

use crate::models::config::config_dims;
use crate::models::config::defaults;
use crate::models::needs::MemoryNeeds;

/// Fields of `config.json` that the forward pass uses; defaults are transformers'.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Config {
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// Width of the dense MLP of the first `first_k_dense_replace` layers.
    pub intermediate_size: usize,
    /// Width of one routed expert (and, times `n_shared_experts`, of the shared expert).
    pub moe_intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// Routed experts per MoE layer.
    pub n_routed_experts: usize,
    #[serde(default = "defaults::count::<1>")]
    pub n_shared_experts: usize,
    pub num_experts_per_tok: usize,
    /// Expert groups for group-limited routing (default 1: no limit).
    #[serde(default = "defaults::count::<1>")]
    pub n_group: usize,
    /// Groups kept per token.
    #[serde(default = "defaults::count::<1>")]
    pub topk_group: usize,
    #[serde(default = "defaults::one_f64")]
    pub routed_scaling_factor: f64,
    #[serde(default = "defaults::yes")]
    pub norm_topk_prob: bool,
    /// Layers `0..first_k_dense_replace` use the dense MLP.
    #[serde(default)]
    pub first_k_dense_replace: usize,
    /// Rank of the query compression; `None`: a plain `q_proj`.
    #[serde(default)]
    pub q_lora_rank: Option<usize>,
    /// Rank of the compressed key/value latent (what the KV cache holds per token).
    pub kv_lora_rank: usize,
    pub qk_rope_head_dim: usize,
    pub qk_nope_head_dim: usize,
    pub v_head_dim: usize,
    #[serde(default = "defaults::eps_1e6")]
    pub rms_norm_eps: f64,
    #[serde(default)]
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    #[serde(default)]
    pub rope_parameters: Option<serde_json::Value>,
    /// Rotary pairs `(x0, x1), (x2, x3), ...` (true, transformers' default) or NeoX halves.
    #[serde(default = "defaults::yes")]
    pub rope_interleave: bool,
    #[serde(default = "defaults::count::<4096>")]
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default = "defaults::silu")]
    pub hidden_act: String,
    /// Multi-token-prediction layers stored after the decoder layers; not run.
    #[serde(default)]
    pub num_nextn_predict_layers: usize,
    /// Published DeepSeek field: only `noaux_tc` (sigmoid + correction bias) is implemented.
    #[serde(default)]
    pub topk_method: Option<String>,
    /// Published DeepSeek field: only `sigmoid`.
    #[serde(default)]
    pub scoring_func: Option<String>,
    #[serde(default)]
    pub quantization_config: Option<serde_json::Value>,
}


/// The values transformers 5.24's `DeepseekV3Config` gives the fields this config reads when
/// `config.json` omits them (its `__init__` defaults; Kimi K2 ships the same class as remote
/// code). Checked field by field against transformers by this module's tests.
fn transformers_defaults() -> serde_json::Value {
    serde_json::json!({"vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
        "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
        "n_shared_experts": 1, "n_routed_experts": 256, "routed_scaling_factor": 2.5,
        "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "qk_nope_head_dim": 128, "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
        "first_k_dense_replace": 3, "norm_topk_prob": true, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096, "rope_interleave": true, "num_nextn_predict_layers": 1,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}})
}

impl Config {
    /// Parses and checks `config.json` (`label` names the file in errors).
    ///
    /// Errors (each naming the field): a missing or mistyped field, zero or absurd
    /// dimensions, odd `qk_rope_head_dim` or one above 512, `n_routed_experts` not a multiple of `n_group`,
    /// `topk_group > n_group`, `num_experts_per_tok` beyond the experts the kept groups hold,
    /// a RoPE type other than `default` / `yarn` (or yarn without `factor` and
    /// `original_max_position_embeddings`), `hidden_act` other than silu, `attention_bias`,
    /// `topk_method` other than `noaux_tc`, `scoring_func` other than `sigmoid`, a
    /// `quantization_config` other than FP8 E4M3 with 128×128 blocks.
    pub fn from_json(v: &serde_json::Value, label: &str) -> Result<Self> {
        let v = crate::models::config::with_defaults(v, &transformers_defaults());
        let c: Config = serde_json::from_value(v).map_err(|e| anyhow!("{label}: {e}"))?;
        let dims = config_dims!(c;
            vocab_size, hidden_size, intermediate_size, moe_intermediate_size, num_hidden_layers,
            num_attention_heads, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim,
            n_routed_experts, n_shared_experts = c.n_shared_experts.max(1), num_experts_per_tok,
            n_group, topk_group, q_lora_rank = c.q_lora_rank.unwrap_or(1)
        );
        crate::models::config::check_config_dims(label, &dims)?;
        crate::models::config::check_rope_theta_and_eps(label, &c.hf_rope(), 10_000.0, c.rms_norm_eps)?;
        if !c.qk_rope_head_dim.is_multiple_of(2) || c.qk_rope_head_dim > 512 {
            bail!(
                "{label}: 'qk_rope_head_dim' = {} must be even and at most 512",
                c.qk_rope_head_dim
            );
        }
        if !c.n_routed_experts.is_multiple_of(c.n_group) {
            bail!(
                "{label}: 'n_routed_experts' = {} is not a multiple of 'n_group' = {}",
                c.n_routed_experts,
                c.n_group
            );
        }
        if c.topk_group > c.n_group {
            bail!(
                "{label}: 'topk_group' = {} exceeds 'n_group' = {}",
                c.topk_group,
                c.n_group
            );
        }
        let per_group = c.n_routed_experts / c.n_group;
        if c.num_experts_per_tok > c.topk_group * per_group {
            bail!(
                "{label}: 'num_experts_per_tok' = {} exceeds the {} experts of 'topk_group' = {} groups",
                c.num_experts_per_tok,
                c.topk_group * per_group,
                c.topk_group
            );
        }
        if c.n_group > 1 && per_group < 2 {
            bail!("{label}: group-limited routing needs at least 2 experts per group ('n_routed_experts' / 'n_group')");
        }
        if c.hidden_act != "silu" {
            bail!(
                "{label}: 'hidden_act' = '{}' is not supported (only silu)",
                c.hidden_act
            );
        }
        if c.attention_bias {
            bail!("{label}: 'attention_bias' = true is not supported");
        }
        if let Some(m) = c.topk_method.as_deref() {
            if m != "noaux_tc" {
                bail!("{label}: 'topk_method' = '{m}' is not supported (only noaux_tc)");
            }
        }
        if let Some(f) = c.scoring_func.as_deref() {
            if f != "sigmoid" {
                bail!("{label}: 'scoring_func' = '{f}' is not supported (only sigmoid)");
            }
        }
        c.hf_rope()
            .scaling(c.max_position_embeddings, &["default", "yarn"])
            .map_err(|e| anyhow!("{label}: {e}"))?;
        if let Some(q) = &c.quantization_config {
            let method = q.get("quant_method").and_then(|m| m.as_str()).unwrap_or("");
            let fmt = q.get("fmt").and_then(|m| m.as_str()).unwrap_or("e4m3");
            let block: Option<Vec<u64>> = q
                .get("weight_block_size")
                .and_then(|b| b.as_array())
                .map(|a| a.iter().filter_map(|x| x.as_u64()).collect());
            if method != "fp8" || fmt != "e4m3" || block.as_deref() != Some(&[128, 128]) {
                bail!(
                    "{label}: 'quantization_config' {q} is not supported (only quant_method fp8, fmt e4m3, weight_block_size [128, 128])"
                );
            }
        }
        Ok(c)
    }

    /// Query/key head width: `qk_nope_head_dim + qk_rope_head_dim`.
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// Floats of the compressed cache per token per layer: `kv_lora_rank + qk_rope_head_dim`.
    pub fn latent_dim(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }

    /// RAM a pass needs besides the weights ([`MemoryNeeds`]); with `mtp`, also the
    /// multi-token-prediction block: its latent cache, its three norms and the final hidden
    /// rows it reads.
    pub(super) fn memory_needs(&self, mtp: bool) -> MemoryNeeds {
        let (d, nh, rank) = (self.hidden_size, self.num_attention_heads, self.kv_lora_rank);
        let (ne, eff) = (self.n_routed_experts, self.moe_intermediate_size);
        let sff = eff * self.n_shared_experts;
        let q_rank = self.q_lora_rank.unwrap_or(0);
        let n_blocks = self.num_hidden_layers + usize::from(mtp);
        MemoryNeeds {
            row_floats: 4 * d
                + q_rank
                + nh * (self.qk_head_dim() + self.v_head_dim + rank)
                + self.latent_dim()
                + 2 * self.intermediate_size.max(sff).max(eff)
                + ne,
            pass_floats: self.vocab_size,
            ctx_floats: if mtp { d } else { 0 },
            thread_ctx_floats: 1,
            thread_floats: rank * (self.qk_nope_head_dim + 2),
            state_ctx_floats: n_blocks * self.latent_dim(),
            vector_floats: d * (2 * n_blocks + 1)
                + n_blocks * (q_rank + rank + ne)
                + if mtp { 3 * d } else { 0 },
            max_ctx: self.max_position_embeddings,
            ..Default::default()
        }
    }

    /// Whether the weights are FP8 (a `quantization_config` was accepted).
    pub fn is_fp8(&self) -> bool {
        self.quantization_config.is_some()
    }

    /// Whether layer `l` has the MoE block (`l >= first_k_dense_replace`).
    pub fn is_moe_layer(&self, l: usize) -> bool {
        l >= self.first_k_dense_replace
    }

    /// The RoPE fields, in either dialect.
    pub fn hf_rope(&self) -> HfRope<'_> {
        HfRope {
            parameters: self.rope_parameters.as_ref(),
            scaling: self.rope_scaling.as_ref(),
            theta: self.rope_theta,
        }
    }

    /// RoPE base: `rope_parameters.rope_theta`, else `rope_theta`, else 10000.
    pub fn rope_base(&self) -> f64 {
        self.hf_rope().theta(10_000.0)
    }

    /// RoPE type: `rope_type`, else `type`, of the RoPE parameters, else `default`.
    pub fn rope_type(&self) -> String {
        self.hf_rope().rope_type()
    }

    /// YaRN parameters when the RoPE type is `yarn` and the required numbers are present
    /// ([`HfRope::scaling`]).
    pub fn yarn(&self) -> Option<Yarn> {
        self.hf_rope()
            .scaling(self.max_position_embeddings, &["yarn"])
            .ok()
            .and_then(|s| s.yarn().copied())
    }

    /// RoPE inverse frequencies (`qk_rope_head_dim / 2`) and the factor the rotated values are
    /// multiplied by (transformers multiplies cos and sin by it).
    ///
    /// Default RoPE: `base^(-2i/dim)`, factor 1. YaRN, as transformers computes it in f32:
    /// `pos = base^(2i/dim)`, extrapolated `1/pos` and interpolated `1/(factor·pos)` mixed with
    /// `e = 1 − clamp((i − low)/(high − low), 0, 1)` as `interp·(1 − e) + extrap·e`, where
    /// `low/high = dim·ln(orig/(β·2π)) / (2 ln base)` for β = beta_fast / beta_slow (floored /
    /// ceiled when `truncate`, clamped to `[0, dim − 1]`); the attention factor is
    /// `attention_factor`, else `mscale(factor, mscale) / mscale(factor, mscale_all_dim)` when
    /// both are non-zero, else `mscale(factor, 1)`, with `mscale(s, m) = 0.1 m ln s + 1`.
    pub fn rope_freqs(&self) -> (Vec<f32>, f32) {
        let (dim, base) = (self.qk_rope_head_dim, self.rope_base());
        match self.yarn() {
            Some(y) => (y.inv_freq_f32(dim, base), y.attention_factor() as f32),
            None => (default_inv_freq_f32(dim, base), 1.0),
        }
    }

    /// Softmax scale of the attention scores (`DeepseekV3Attention.scaling`):
    /// `qk_head_dim^(-1/2)`, times `mscale(factor, mscale_all_dim)²` for YaRN when
    /// `mscale_all_dim` is non-zero.
    pub fn softmax_scale(&self) -> f32 {
        let s = (self.qk_head_dim() as f64).powf(-0.5);
        let m = match self.yarn() {
            Some(Yarn {
                factor,
                mscale_all_dim: Some(ma),
                ..
            }) if ma != 0.0 => get_mscale(factor, ma),
            _ => 1.0,
        };
        (s * m * m) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn omitted_fields_get_transformers_defaults() {
        use crate::models::config::default_mismatches;
        for mt in ["deepseek_v3", "kimi_k2"] {
            let c = Config::from_json(&json!({ "model_type": mt }), "c.json").unwrap();
            let view = json!({"vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
                "intermediate_size": c.intermediate_size,
                "moe_intermediate_size": c.moe_intermediate_size,
                "num_hidden_layers": c.num_hidden_layers,
                "num_attention_heads": c.num_attention_heads,
                "n_routed_experts": c.n_routed_experts, "n_shared_experts": c.n_shared_experts,
                "num_experts_per_tok": c.num_experts_per_tok, "n_group": c.n_group,
                "topk_group": c.topk_group, "routed_scaling_factor": c.routed_scaling_factor,
                "norm_topk_prob": c.norm_topk_prob,
                "first_k_dense_replace": c.first_k_dense_replace, "q_lora_rank": c.q_lora_rank,
                "kv_lora_rank": c.kv_lora_rank, "qk_rope_head_dim": c.qk_rope_head_dim,
                "qk_nope_head_dim": c.qk_nope_head_dim, "v_head_dim": c.v_head_dim,
                "rms_norm_eps": c.rms_norm_eps, "rope_interleave": c.rope_interleave,
                "max_position_embeddings": c.max_position_embeddings,
                "tie_word_embeddings": c.tie_word_embeddings,
                "attention_bias": c.attention_bias, "hidden_act": c.hidden_act,
                "num_nextn_predict_layers": c.num_nextn_predict_layers,
                "rope_parameters": {"rope_theta": c.rope_base(), "rope_type": c.rope_type()}});
            let view = view.as_object().unwrap();
            assert_eq!(view.len(), 27);
            let bad = default_mismatches(mt, view, "defaults");
            assert!(bad.is_empty(), "{}", bad.join("\n"));
        }
    }

    fn fixture() -> serde_json::Value {
        let p = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/hf/deepseek_v3/config.json"
        );
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    }

    #[test]
    fn yarn_frequencies_and_scale_follow_transformers() {
        let c = Config::from_json(&fixture(), "c.json").unwrap();
        let (inv, att) = c.rope_freqs();
        // dim 8, base 1e4, factor 4, orig 64: low = max(floor(-0.497), 0) = 0,
        // high = ceil(1.008) = 2; ramp i/2: i = 0 extrapolated (1), i = 1 half-way
        // (0.5 · 0.1/4 + 0.5 · 0.1), i >= 2 interpolated (base^(-2i/8) / 4)
        let want = [1.0, 0.0625, 0.0025, 0.00025];
        for (g, w) in inv.iter().zip(want) {
            assert!(((*g as f64) - w).abs() <= 1e-6 * w, "{g} vs {w}");
        }
        assert_eq!(att, 1.0);
        // 24^-½ · (0.1 ln 4 + 1)²
        let m = 0.1 * 4f64.ln() + 1.0;
        assert!((c.softmax_scale() as f64 - m * m / 24f64.sqrt()).abs() < 1e-7);
    }

    #[test]
    fn published_dialect_reads_the_same() {
        let mut v = fixture();
        let o = v.as_object_mut().unwrap();
        let mut rp = o.remove("rope_parameters").unwrap();
        o.insert("rope_theta".into(), rp["rope_theta"].clone());
        let r = rp.as_object_mut().unwrap();
        r.remove("rope_theta");
        let t = r.remove("rope_type").unwrap();
        r.insert("type".into(), t);
        o.insert("rope_scaling".into(), rp);
        o.remove("rope_interleave");
        o.insert("topk_method".into(), json!("noaux_tc"));
        let a = Config::from_json(&v, "c.json").unwrap();
        let b = Config::from_json(&fixture(), "c.json").unwrap();
        assert_eq!(a.rope_freqs(), b.rope_freqs());
        assert_eq!(a.softmax_scale(), b.softmax_scale());
        assert!(a.rope_interleave);
    }

    #[test]
    fn errors_name_the_field() {
        let err = |f: &dyn Fn(&mut serde_json::Value)| {
            let mut v = fixture();
            f(&mut v);
            Config::from_json(&v, "c.json").unwrap_err().to_string()
        };
        assert_eq!(
            err(&|v| v["kv_lora_rank"] = json!("x")),
            "c.json: invalid type: string \"x\", expected usize"
        );
        assert_eq!(
            err(&|v| v["n_group"] = json!(3)),
            "c.json: 'n_routed_experts' = 8 is not a multiple of 'n_group' = 3"
        );
        assert_eq!(
            err(&|v| v["topk_method"] = json!("greedy")),
            "c.json: 'topk_method' = 'greedy' is not supported (only noaux_tc)"
        );
        assert_eq!(
            err(&|v| v["rope_parameters"]["rope_type"] = json!("longrope")),
            "c.json: rope type 'longrope' is not supported (only default, yarn)"
        );
        let e = err(&|v| {
            v["quantization_config"] = json!({"quant_method": "fp8", "weight_block_size": [64, 64]})
        });
        assert!(e.contains("'quantization_config'"), "{e}");
    }

    #[test]
    fn rope_theta_and_rms_norm_eps_are_refused_by_name() {
        crate::models::config::assert_refuses_bad_theta_and_eps(&fixture(), |v| {
            Config::from_json(v, "c.json")
        });
    }
}
