//! The `config.json` of Kimi Linear checkpoints (`model_type: kimi_linear`), read in both
//! dialects: the published one (`num_experts`, `num_experts_per_token`, `num_shared_experts`,
//! `moe_renormalize`, `num_expert_group`, `model_max_length`, `first_k_dense_replace`, and
//! `linear_attn_config {head_dim, num_heads, short_conv_kernel_size, full_attn_layers,
//! kda_layers}` with 1-based layer numbers) and the one transformers 5.24 writes
//! (`KimiLinearConfig`: `n_routed_experts`/`num_local_experts`, `num_experts_per_tok`,
//! `n_shared_experts`, `norm_topk_prob`, `n_group`, `max_position_embeddings`,
//! `linear_head_dim`, `linear_num_heads`, `linear_conv_kernel_dim`, `layer_types`,
//! `mlp_layer_types`). Where a field is missing the defaults are transformers'.

use anyhow::{anyhow, bail, Result};
use serde_json::Value;

use crate::models::config::config_dims;
use crate::models::config::Fields;
use crate::models::needs::MemoryNeeds;
use crate::models::layers::hybrid::{mixers, Mixer};

/// The fields of `config.json` the forward pass uses.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// Width of the dense MLP layers.
    pub intermediate_size: usize,
    /// Width of one routed expert (and, times `n_shared_experts`, of the shared expert).
    pub moe_intermediate_size: usize,
    pub num_hidden_layers: usize,
    /// Heads of the MLA layers.
    pub num_attention_heads: usize,
    pub n_routed_experts: usize,
    pub n_shared_experts: usize,
    pub num_experts_per_tok: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub routed_scaling_factor: f64,
    pub norm_topk_prob: bool,
    /// `None`: a plain `q_proj` (Kimi Linear's published models).
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_rope_head_dim: usize,
    pub qk_nope_head_dim: usize,
    pub v_head_dim: usize,
    pub rms_norm_eps: f64,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// KDA head width (keys and values alike).
    pub linear_head_dim: usize,
    /// KDA heads.
    pub linear_num_heads: usize,
    /// Taps of the short convolutions.
    pub linear_conv_kernel_dim: usize,
    /// Per layer: KDA or MLA.
    pub mixers: Vec<Mixer>,
    /// Per layer: MoE (true) or dense MLP.
    pub moe: Vec<bool>,
}

/// Largest `linear_head_dim` accepted.
const MAX_KDA_HEAD: usize = 1024;
/// Largest `linear_conv_kernel_dim` accepted.
const MAX_CONV: usize = 64;

impl Config {
    /// Parses and checks `config.json` (`label` names the file in errors).
    ///
    /// Errors (each naming the field): a missing or mistyped field, zero or absurd
    /// dimensions, layer lists of the wrong length or with unknown kinds, layer numbers outside
    /// `1..=num_hidden_layers` or a layer in neither or both of `full_attn_layers` /
    /// `kda_layers`, `hidden_act` other than silu, `moe_router_activation_func` other than
    /// sigmoid, `mla_use_nope` false (RoPE MLA), `attention_bias`, a `quantization_config`,
    /// `num_experts_per_tok` beyond the experts of the kept groups.
    pub fn from_json(v: &Value, label: &str) -> Result<Self> {
        let f = Fields { v, label };
        let la = v.get("linear_attn_config").filter(|x| x.is_object());
        let la_count = |k: &str| -> Result<Option<usize>> {
            match la.and_then(|o| o.get(k)) {
                None | Some(Value::Null) => Ok(None),
                Some(x) => x
                    .as_u64()
                    .map(|n| Some(n as usize))
                    .ok_or_else(|| anyhow!("{label}: 'linear_attn_config.{k}' is not a count")),
            }
        };
        let n_layers = f.count(&["num_hidden_layers"], None)?;
        // bounded before the per-layer lists are built from it (a hostile count must not
        // allocate: the fuzzer's `num_hidden_layers: 3333333333333333`)
        crate::models::config::check_config_dims(label, &[("num_hidden_layers", n_layers)])?;
        let n_group = f.count(&["n_group", "num_expert_group"], Some(1))?;
        let c = Config {
            vocab_size: f.count(&["vocab_size"], None)?,
            hidden_size: f.count(&["hidden_size"], None)?,
            intermediate_size: f.count(&["intermediate_size"], None)?,
            moe_intermediate_size: f.count(&["moe_intermediate_size"], None)?,
            num_hidden_layers: n_layers,
            num_attention_heads: f.count(&["num_attention_heads"], None)?,
            n_routed_experts: f.count(&["n_routed_experts", "num_experts", "num_local_experts"], None)?,
            n_shared_experts: f.count(&["n_shared_experts", "num_shared_experts"], Some(1))?,
            num_experts_per_tok: f.count(&["num_experts_per_tok", "num_experts_per_token"], None)?,
            n_group,
            topk_group: f.count(&["topk_group"], Some(1))?,
            routed_scaling_factor: f.float(&["routed_scaling_factor"], 2.446)?,
            norm_topk_prob: f.flag(&["norm_topk_prob", "moe_renormalize"], true)?,
            q_lora_rank: f.opt_count(&["q_lora_rank"])?,
            kv_lora_rank: f.count(&["kv_lora_rank"], None)?,
            qk_rope_head_dim: f.count(&["qk_rope_head_dim"], None)?,
            qk_nope_head_dim: f.count(&["qk_nope_head_dim"], None)?,
            v_head_dim: f.count(&["v_head_dim"], None)?,
            rms_norm_eps: f.float(&["rms_norm_eps"], 1e-5)?,
            max_position_embeddings: f.count(&["max_position_embeddings", "model_max_length"], Some(1 << 20))?,
            tie_word_embeddings: f.flag(&["tie_word_embeddings"], false)?,
            linear_head_dim: match la_count("head_dim")? {
                Some(x) => x,
                None => f.count(&["linear_head_dim"], Some(128))?,
            },
            linear_num_heads: match la_count("num_heads")? {
                Some(x) => x,
                None => f.count(&["linear_num_heads"], Some(32))?,
            },
            linear_conv_kernel_dim: match la_count("short_conv_kernel_size")? {
                Some(x) => x,
                None => f.count(&["linear_conv_kernel_dim"], Some(4))?,
            },
            mixers: mixers(v, la, n_layers, label)?,
            moe: moe_layers(v, n_layers, label)?,
        };
        let dims = config_dims!(c;
            vocab_size, hidden_size, intermediate_size, moe_intermediate_size, num_hidden_layers,
            num_attention_heads, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim,
            n_routed_experts, n_shared_experts, num_experts_per_tok, n_group, topk_group,
            q_lora_rank = c.q_lora_rank.unwrap_or(1), linear_num_heads, max_position_embeddings
        );
        crate::models::config::check_config_dims(label, &dims)?;
        if c.linear_head_dim == 0 || c.linear_head_dim > MAX_KDA_HEAD {
            bail!("{label}: 'linear_head_dim' = {} is outside 1..={MAX_KDA_HEAD}", c.linear_head_dim);
        }
        if c.linear_conv_kernel_dim < 2 || c.linear_conv_kernel_dim > MAX_CONV {
            bail!(
                "{label}: 'short_conv_kernel_size' = {} is outside 2..={MAX_CONV}",
                c.linear_conv_kernel_dim
            );
        }
        if !(c.rms_norm_eps > 0.0 && c.rms_norm_eps < 1.0) {
            bail!("{label}: 'rms_norm_eps' = {} is outside (0, 1)", c.rms_norm_eps);
        }
        if !c.n_routed_experts.is_multiple_of(c.n_group) || c.topk_group > c.n_group {
            bail!(
                "{label}: 'n_routed_experts' = {} / 'n_group' = {} / 'topk_group' = {} do not form groups",
                c.n_routed_experts,
                c.n_group,
                c.topk_group
            );
        }
        let per_group = c.n_routed_experts / c.n_group;
        if c.num_experts_per_tok > c.topk_group * per_group || (c.n_group > 1 && per_group < 2) {
            bail!(
                "{label}: 'num_experts_per_tok' = {} does not fit {} groups of {per_group} experts",
                c.num_experts_per_tok,
                c.topk_group
            );
        }
        for (k, want) in [("hidden_act", "silu"), ("moe_router_activation_func", "sigmoid")] {
            if let Some(x) = v.get(k).filter(|x| !x.is_null()) {
                if x.as_str() != Some(want) {
                    bail!("{label}: '{k}' = {x} is not supported (only {want})");
                }
            }
        }
        if v.get("mla_use_nope").and_then(Value::as_bool) == Some(false) {
            bail!("{label}: 'mla_use_nope' = false (MLA with RoPE) is not supported");
        }
        if v.get("attention_bias").and_then(Value::as_bool) == Some(true) {
            bail!("{label}: 'attention_bias' = true is not supported");
        }
        if let Some(q) = v.get("quantization_config").filter(|x| !x.is_null()) {
            bail!("{label}: 'quantization_config' {q} is not supported for kimi_linear");
        }
        Ok(c)
    }

    /// Query/key head width of the MLA layers: `qk_nope_head_dim + qk_rope_head_dim`.
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// Floats of the MLA cache per token: `kv_lora_rank + qk_rope_head_dim`.
    pub fn latent_dim(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }

    /// KDA `q`/`k`/`v` width: `linear_num_heads × linear_head_dim`.
    pub fn kda_dim(&self) -> usize {
        self.linear_num_heads * self.linear_head_dim
    }

    /// Floats of a KDA layer's recurrent state: the short convolutions' last
    /// `kernel − 1` inputs of `q`, `k`, `v`, then one `head_dim × head_dim` matrix per head.
    pub fn kda_state(&self) -> usize {
        (self.linear_conv_kernel_dim - 1) * 3 * self.kda_dim()
            + self.linear_num_heads * self.linear_head_dim * self.linear_head_dim
    }

    /// RAM a pass needs besides the weights ([`MemoryNeeds`]): a latent cache for the MLA
    /// layers, a recurrent state for the KDA layers; `layer_vectors`: the floats of the
    /// layers' resident vectors as loaded (norms, router biases, convolutions, KDA gates), to
    /// which the final norm adds `hidden_size`.
    pub(super) fn memory_needs(&self, layer_vectors: usize) -> MemoryNeeds {
        let (d, nh, rank) = (self.hidden_size, self.num_attention_heads, self.kv_lora_rank);
        let n_mla = self.mixers.iter().filter(|m| **m == Mixer::Mla).count();
        MemoryNeeds {
            row_floats: 4 * d
                + 12 * self.kda_dim()
                + nh * (self.qk_head_dim() + self.v_head_dim + rank)
                + self.latent_dim()
                + 2 * self
                    .intermediate_size
                    .max(self.moe_intermediate_size * self.n_shared_experts)
                + self.n_routed_experts,
            pass_floats: self.vocab_size,
            thread_ctx_floats: 1,
            thread_floats: rank * (self.qk_nope_head_dim + 2),
            thread_row_floats: 4 * self.linear_head_dim + 1,
            state_ctx_floats: n_mla * self.latent_dim(),
            state_floats: (self.num_hidden_layers - n_mla) * self.kda_state(),
            vector_floats: layer_vectors + d,
            max_ctx: self.max_position_embeddings,
            ..Default::default()
        }
    }
}

/// Per-layer MoE flags: `mlp_layer_types` (`dense` / `sparse`) when present, else the first
/// `first_k_dense_replace` layers (default 1) dense and the rest MoE.
fn moe_layers(v: &Value, n: usize, label: &str) -> Result<Vec<bool>> {
    if let Some(t) = v.get("mlp_layer_types").and_then(Value::as_array) {
        if t.len() != n {
            bail!("{label}: 'mlp_layer_types' has {} entries for {n} layers", t.len());
        }
        return t
            .iter()
            .map(|x| match x.as_str() {
                Some("sparse") => Ok(true),
                Some("dense") => Ok(false),
                _ => bail!("{label}: 'mlp_layer_types' entry {x} is not dense or sparse"),
            })
            .collect();
    }
    let k = match v.get("first_k_dense_replace") {
        None | Some(Value::Null) => 1,
        Some(x) => x
            .as_u64()
            .ok_or_else(|| anyhow!("{label}: 'first_k_dense_replace' = {x} is not a count"))?
            as usize,
    };
    Ok((0..n).map(|i| i >= k).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn published() -> Value {
        serde_json::json!({
            "model_type": "kimi_linear", "vocab_size": 1000, "hidden_size": 64,
            "intermediate_size": 128, "moe_intermediate_size": 32, "num_hidden_layers": 5,
            "num_attention_heads": 4, "num_experts": 8, "num_experts_per_token": 2,
            "num_shared_experts": 1, "moe_renormalize": true, "num_expert_group": 1,
            "topk_group": 1, "routed_scaling_factor": 2.446, "kv_lora_rank": 16,
            "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16,
            "first_k_dense_replace": 2, "model_max_length": 4096, "mla_use_nope": true,
            "moe_router_activation_func": "sigmoid",
            "linear_attn_config": {"head_dim": 16, "num_heads": 4, "short_conv_kernel_size": 4,
                                    "full_attn_layers": [4], "kda_layers": [1, 2, 3, 5]}
        })
    }

    #[test]
    fn published_fields_and_one_based_layer_lists() {
        let c = Config::from_json(&published(), "c").unwrap();
        use Mixer::*;
        assert_eq!(c.mixers, [Kda, Kda, Kda, Mla, Kda]);
        assert_eq!(c.moe, [false, false, true, true, true]);
        assert_eq!((c.n_routed_experts, c.num_experts_per_tok, c.max_position_embeddings), (8, 2, 4096));
        assert_eq!(c.kda_state(), 3 * 3 * 64 + 4 * 16 * 16);
    }

    #[test]
    fn layer_lists_are_checked() {
        let mut v = published();
        v["linear_attn_config"]["full_attn_layers"] = serde_json::json!([0]);
        let e = Config::from_json(&v, "c").unwrap_err().to_string();
        assert_eq!(e, "c: 'linear_attn_config.full_attn_layers' entry 0 is outside 1..=5");
        let mut v = published();
        v["linear_attn_config"]["kda_layers"] = serde_json::json!([1, 2, 3]);
        let e = Config::from_json(&v, "c").unwrap_err().to_string();
        assert_eq!(e, "c: layer 5 is in neither 'full_attn_layers' nor 'kda_layers'");
        let mut v = published();
        v["mla_use_nope"] = serde_json::json!(false);
        let e = Config::from_json(&v, "c").unwrap_err().to_string();
        assert_eq!(e, "c: 'mla_use_nope' = false (MLA with RoPE) is not supported");
    }
}
