//! Synthetic `deepseek_v3` checkpoints in the Hugging Face layout DeepSeek publishes
//! (`deepseek-ai/DeepSeek-V3`, read by [`crate::models::deepseek_v3`]): multi-head latent
//! attention (`q_a_proj` → `q_a_layernorm` → `q_b_proj`, `kv_a_proj_with_mqa` →
//! `kv_a_layernorm` → `kv_b_proj`, `o_proj`), `first_k_dense_replace` dense MLP layers, then
//! MoE layers with a sigmoid router (`mlp.gate.weight`, `e_score_correction_bias`), shared
//! experts and routed experts `mlp.experts.N.{gate,up,down}_proj`.
//!
//! BF16, or FP8 as published: every linear weight except the router and LM head is
//! `float8_e4m3fn` with a `weight_scale_inv` (F32, `[ceil(out/128), ceil(in/128)]`) and
//! `config.json` carries `quantization_config {quant_method: fp8, fmt: e4m3,
//! weight_block_size: [128, 128]}`; embeddings, norms, router and LM head stay BF16, the
//! correction bias F32. FP8 codes are uniform over the finite codes and every block scale is
//! `1/(√in · rms)` (`fill::fp8_e4m3_rms`), so weights have RMS `1/√in`.
//!
//! The tokenizer and chat template are those of the `deepseek_v3` test fixture (byte-level
//! BPE, 493 tokens in a vocabulary of 512).

use super::fill::fp8_e4m3_rms;
use super::hf_checkpoint::{
    embeddings, linear_bf16, norm_and_head, ones_bf16, Dtype, Fill, HfCheckpoint, TensorSpec,
};

/// The shape of a synthetic `deepseek_v3` model (Hugging Face `DeepseekV3Config` fields).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeepseekV3Shape {
    pub hidden_size: usize,
    /// Width of the dense MLP of the first `first_k_dense_replace` layers.
    pub intermediate_size: usize,
    /// Width of one routed expert (and, times `n_shared_experts`, of the shared expert).
    pub moe_intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub first_k_dense_replace: usize,
    pub num_attention_heads: usize,
    pub n_routed_experts: usize,
    pub n_shared_experts: usize,
    pub num_experts_per_tok: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub q_lora_rank: usize,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    pub vocab_size: usize,
}

/// The presets: `tiny` (the shape of the `deepseek_v3_fp8` test fixture) and `deepseek-v3`
/// (DeepSeek-V3's `config.json` but a vocabulary of 512).
pub fn presets() -> Vec<(&'static str, &'static str, DeepseekV3Shape)> {
    let v3 = DeepseekV3Shape {
        hidden_size: 7168,
        intermediate_size: 18432,
        moe_intermediate_size: 2048,
        num_hidden_layers: 61,
        first_k_dense_replace: 3,
        num_attention_heads: 128,
        n_routed_experts: 256,
        n_shared_experts: 1,
        num_experts_per_tok: 8,
        n_group: 8,
        topk_group: 4,
        q_lora_rank: 1536,
        kv_lora_rank: 512,
        qk_nope_head_dim: 128,
        qk_rope_head_dim: 64,
        v_head_dim: 128,
        vocab_size: 512,
    };
    vec![
        (
            "tiny",
            "CI: hidden 64, MLA (8 heads, q_lora 32, kv_lora 16), 1 dense + 2 MoE layers of 8 experts (4 groups, 2 kept), top-2, 1 shared, expert FFN 32",
            DeepseekV3Shape {
                hidden_size: 64,
                intermediate_size: 256,
                moe_intermediate_size: 32,
                num_hidden_layers: 3,
                first_k_dense_replace: 1,
                num_attention_heads: 8,
                n_routed_experts: 8,
                n_shared_experts: 1,
                num_experts_per_tok: 2,
                n_group: 4,
                topk_group: 2,
                q_lora_rank: 32,
                kv_lora_rank: 16,
                qk_nope_head_dim: 16,
                qk_rope_head_dim: 8,
                v_head_dim: 16,
                vocab_size: 512,
            },
        ),
        (
            "deepseek-v3",
            "DeepSeek-V3 shape (hidden 7168, MLA with 128 heads, 256 experts in 8 groups, top-8, 1 shared, expert FFN 2048: 42 MiB FP8 / 84 MiB BF16 experts), 3 dense + 58 MoE layers (~670 GB FP8, 1.34 TB BF16); use --layers (total) and --dense-layers for fewer",
            v3,
        ),
    ]
}

/// A linear weight `[out, in]`: BF16, or FP8 E4M3 plus its F32 block scales.
fn linear(name: &str, out: usize, inp: usize, fp8: bool) -> Vec<TensorSpec> {
    if !fp8 {
        return vec![linear_bf16(format!("{name}.weight"), out, inp)];
    }
    let scale = 1.0 / ((inp as f32).sqrt() * fp8_e4m3_rms());
    vec![
        TensorSpec::new(
            format!("{name}.weight"),
            Dtype::F8E4M3,
            vec![out, inp],
            Fill::Fp8,
        ),
        TensorSpec::new(
            format!("{name}.weight_scale_inv"),
            Dtype::F32,
            vec![out.div_ceil(128), inp.div_ceil(128)],
            Fill::Const(scale),
        ),
    ]
}

/// A SwiGLU MLP `prefix.{down,gate,up}_proj` of width `ff` (names in published order).
fn mlp(prefix: &str, d: usize, ff: usize, fp8: bool) -> Vec<TensorSpec> {
    let mut v = linear(&format!("{prefix}.down_proj"), d, ff, fp8);
    v.extend(linear(&format!("{prefix}.gate_proj"), ff, d, fp8));
    v.extend(linear(&format!("{prefix}.up_proj"), ff, d, fp8));
    v
}

/// Tensor groups: the embeddings; per layer its spine (attention, norms, dense MLP or router
/// and shared experts) and then each routed expert as a group of its own (so shards break
/// between experts); the final norm and head.
fn groups(s: &DeepseekV3Shape, fp8: bool) -> Vec<Vec<TensorSpec>> {
    let d = s.hidden_size;
    let nh = s.num_attention_heads;
    let qk = s.qk_nope_head_dim + s.qk_rope_head_dim;
    let mut groups = vec![embeddings(s.vocab_size, d)];
    for l in 0..s.num_hidden_layers {
        let p = |x: &str| format!("model.layers.{l}.{x}");
        let mut g = vec![ones_bf16(p("input_layernorm.weight"), d)];
        let a = |x: &str| p(&format!("self_attn.{x}"));
        g.extend(linear(&a("q_a_proj"), s.q_lora_rank, d, fp8));
        g.push(ones_bf16(a("q_a_layernorm.weight"), s.q_lora_rank));
        g.extend(linear(&a("q_b_proj"), nh * qk, s.q_lora_rank, fp8));
        let latent = s.kv_lora_rank + s.qk_rope_head_dim;
        g.extend(linear(&a("kv_a_proj_with_mqa"), latent, d, fp8));
        g.push(ones_bf16(a("kv_a_layernorm.weight"), s.kv_lora_rank));
        let kv_b = nh * (s.qk_nope_head_dim + s.v_head_dim);
        g.extend(linear(&a("kv_b_proj"), kv_b, s.kv_lora_rank, fp8));
        g.extend(linear(&a("o_proj"), d, nh * s.v_head_dim, fp8));
        g.push(ones_bf16(p("post_attention_layernorm.weight"), d));
        if l < s.first_k_dense_replace {
            g.extend(mlp(&p("mlp"), d, s.intermediate_size, fp8));
            groups.push(g);
            continue;
        }
        g.push(linear_bf16(p("mlp.gate.weight"), s.n_routed_experts, d));
        g.push(TensorSpec::new(
            p("mlp.gate.e_score_correction_bias"),
            Dtype::F32,
            vec![s.n_routed_experts],
            Fill::Uniform(0.1),
        ));
        let shared = s.moe_intermediate_size * s.n_shared_experts;
        g.extend(mlp(&p("mlp.shared_experts"), d, shared, fp8));
        groups.push(g);
        for e in 0..s.n_routed_experts {
            let x = mlp(
                &p(&format!("mlp.experts.{e}")),
                d,
                s.moe_intermediate_size,
                fp8,
            );
            groups.push(x.into_iter().map(|t| t.experts(1)).collect());
        }
    }
    groups.push(norm_and_head(s.vocab_size, d));
    groups
}

/// The published-dialect `config.json` of `s` (the fields of DeepSeek-V3's own, YaRN RoPE
/// with factor 40 over 4096 positions), with `quantization_config` when `fp8`.
pub fn config_json(s: &DeepseekV3Shape, fp8: bool) -> serde_json::Value {
    let mut c = serde_json::json!({
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "attention_bias": false,
        "attention_dropout": 0.0,
        "bos_token_id": 480,
        "eos_token_id": 481,
        "first_k_dense_replace": s.first_k_dense_replace,
        "hidden_act": "silu",
        "hidden_size": s.hidden_size,
        "intermediate_size": s.intermediate_size,
        "kv_lora_rank": s.kv_lora_rank,
        "max_position_embeddings": 163840,
        "moe_intermediate_size": s.moe_intermediate_size,
        "moe_layer_freq": 1,
        "n_group": s.n_group,
        "n_routed_experts": s.n_routed_experts,
        "n_shared_experts": s.n_shared_experts,
        "norm_topk_prob": true,
        "num_attention_heads": s.num_attention_heads,
        "num_experts_per_tok": s.num_experts_per_tok,
        "num_hidden_layers": s.num_hidden_layers,
        "num_key_value_heads": s.num_attention_heads,
        "num_nextn_predict_layers": 0,
        "q_lora_rank": s.q_lora_rank,
        "qk_nope_head_dim": s.qk_nope_head_dim,
        "qk_rope_head_dim": s.qk_rope_head_dim,
        "rms_norm_eps": 1e-6,
        "rope_scaling": {
            "beta_fast": 32,
            "beta_slow": 1,
            "factor": 40,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 4096,
            "type": "yarn"
        },
        "rope_theta": 10000,
        "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid",
        "tie_word_embeddings": false,
        "topk_group": s.topk_group,
        "topk_method": "noaux_tc",
        "torch_dtype": "bfloat16",
        "use_cache": true,
        "v_head_dim": s.v_head_dim,
        "vocab_size": s.vocab_size,
        "deltafin_synthetic": true,
    });
    if fp8 {
        c["quantization_config"] = serde_json::json!({
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "weight_block_size": [128, 128]
        });
    }
    c
}

/// The Hugging Face checkpoint of `s`, FP8 when `fp8` (else BF16).
pub(crate) fn checkpoint(s: &DeepseekV3Shape, fp8: bool) -> HfCheckpoint {
    HfCheckpoint {
        groups: groups(s, fp8),
        config: config_json(s, fp8),
        side_files: [
            br#"{"bos_token_id": 480, "eos_token_id": 481, "do_sample": false}"#,
            include_bytes!("../../../tests/fixtures/hf/deepseek_v3/tokenizer.json"),
            include_bytes!("../../../tests/fixtures/hf/deepseek_v3/tokenizer_config.json"),
        ],
        layers: s.num_hidden_layers,
        moe_layers: s.num_hidden_layers - s.first_k_dense_replace.min(s.num_hidden_layers),
        experts: s.n_routed_experts,
    }
}
