//! Synthetic Kimi K3 Hugging Face folders, in the layout llama.cpp's converter
//! (`conversion/kimi_k3.py`) reads and [`crate::models::kimi_k3`] loads (see
//! `src/models/kimi_k3/hf.rs`): `KimiK3ForConditionalGeneration` with the text model's fields in
//! `text_config` and its tensors under `language_model.`, BF16 matrices, F32 `A_log`, `dt_bias`
//! and router bias, and the routed experts as compressed-tensors MXFP4
//! (`quantization_config.format = mxfp4-pack-quantized`): per projection `weight_packed` (U8
//! `[rows, cols / 2]`, random E2M1 nibble pairs) and `weight_scale` (U8 `[rows, cols / 32]`
//! E8M0 exponents from `fill::e8m0_low` of the fan-in). One routed expert is 3 × latent ×
//! FFN × 17/32 bytes, as in the GGUF form ([`super::kimi_k3`]); no vision tower is written.

use super::fill;
use super::hf_checkpoint::{linear_bf16, ones_bf16, Dtype, Fill, HfCheckpoint, TensorSpec};
use super::kimi_k3::KimiK3Shape;
use crate::models::kimi_k3::config::MODEL_TYPE;
use crate::source::hf::TEXT_MODEL_PREFIX;

/// A SwiGLU-shaped MLP `prefix.{gate,up,down}_proj` of width `ff` (SiTU in K3).
fn mlp(prefix: &str, d: usize, ff: usize) -> Vec<TensorSpec> {
    vec![
        linear_bf16(format!("{prefix}.down_proj.weight"), d, ff),
        linear_bf16(format!("{prefix}.gate_proj.weight"), ff, d),
        linear_bf16(format!("{prefix}.up_proj.weight"), ff, d),
    ]
}

/// `prefix_norm.weight` (ones) and `prefix_proj.weight` (`[1, d]`, uniform): one residual score.
fn score(prefix: &str, d: usize) -> Vec<TensorSpec> {
    vec![
        ones_bf16(format!("{prefix}_norm.weight"), d),
        TensorSpec::new(
            format!("{prefix}_proj.weight"),
            Dtype::BF16,
            vec![1, d],
            Fill::Uniform(0.5),
        ),
    ]
}

/// One MXFP4 projection `prefix` of `rows × cols` (`cols` a multiple of 32).
fn mxfp4(prefix: &str, rows: usize, cols: usize) -> [TensorSpec; 2] {
    [
        TensorSpec::new(
            format!("{prefix}.weight_packed"),
            Dtype::U8,
            vec![rows, cols / 2],
            Fill::Bytes,
        )
        .experts(1),
        TensorSpec::new(
            format!("{prefix}.weight_scale"),
            Dtype::U8,
            vec![rows, cols / 32],
            Fill::E8m0 {
                lo: fill::e8m0_low(cols),
            },
        )
        .experts(1),
    ]
}

/// Tensor groups (names without the `language_model.` prefix): embeddings; per layer its spine
/// and then each routed expert as a group of its own; the final norm, residual score and head.
fn groups(s: &KimiK3Shape) -> Vec<Vec<TensorSpec>> {
    let d = s.hidden_size;
    let nh = s.num_heads;
    let mut groups = vec![super::hf_checkpoint::embeddings(s.vocab_size, d)];
    for l in 0..s.num_hidden_layers {
        let p = |x: &str| format!("model.layers.{l}.{x}");
        let a = |x: &str| p(&format!("self_attn.{x}"));
        let mut g = vec![
            ones_bf16(p("input_layernorm.weight"), d),
            ones_bf16(p("post_attention_layernorm.weight"), d),
        ];
        g.extend(score(&p("self_attention_res"), d));
        g.extend(score(&p("mlp_res"), d));
        if s.is_mla(l) {
            let qk = s.qk_nope_head_dim + s.qk_rope_head_dim;
            g.push(linear_bf16(a("q_a_proj.weight"), s.q_lora_rank, d));
            g.push(ones_bf16(a("q_a_layernorm.weight"), s.q_lora_rank));
            g.push(linear_bf16(a("q_b_proj.weight"), nh * qk, s.q_lora_rank));
            g.push(linear_bf16(
                a("kv_a_proj_with_mqa.weight"),
                s.kv_lora_rank + s.qk_rope_head_dim,
                d,
            ));
            g.push(ones_bf16(a("kv_a_layernorm.weight"), s.kv_lora_rank));
            g.push(linear_bf16(
                a("kv_b_proj.weight"),
                nh * (s.qk_nope_head_dim + s.v_head_dim),
                s.kv_lora_rank,
            ));
            g.push(linear_bf16(a("g_proj.weight"), nh * s.v_head_dim, d));
            g.push(linear_bf16(a("o_proj.weight"), d, nh * s.v_head_dim));
        } else {
            let dim = nh * s.kda_head_dim;
            for x in ["q", "k", "v"] {
                g.push(linear_bf16(a(&format!("{x}_proj.weight")), dim, d));
                g.push(TensorSpec::new(
                    a(&format!("{x}_conv1d.weight")),
                    Dtype::BF16,
                    vec![dim, 1, s.conv_kernel],
                    Fill::Uniform(0.5),
                ));
            }
            g.push(linear_bf16(a("f_a_proj.weight"), s.kda_head_dim, d));
            g.push(linear_bf16(a("f_b_proj.weight"), dim, s.kda_head_dim));
            g.push(linear_bf16(a("b_proj.weight"), nh, d));
            g.push(linear_bf16(a("g_proj.weight"), dim, d));
            g.push(TensorSpec::new(
                a("A_log"),
                Dtype::F32,
                vec![nh],
                Fill::Const(0.0),
            ));
            g.push(TensorSpec::new(
                a("dt_bias"),
                Dtype::F32,
                vec![dim],
                Fill::Uniform(0.1),
            ));
            g.push(ones_bf16(a("o_norm.weight"), s.kda_head_dim));
            g.push(linear_bf16(a("o_proj.weight"), d, dim));
        }
        if l < s.first_k_dense_replace {
            g.extend(mlp(&p("mlp"), d, s.intermediate_size));
            groups.push(g);
            continue;
        }
        let m = |x: &str| p(&format!("block_sparse_moe.{x}"));
        g.push(linear_bf16(m("gate.weight"), s.n_routed_experts, d));
        g.push(TensorSpec::new(
            m("gate.e_score_correction_bias"),
            Dtype::F32,
            vec![s.n_routed_experts],
            Fill::Uniform(0.1),
        ));
        g.extend(mlp(
            &m("shared_experts"),
            d,
            s.moe_intermediate_size * s.n_shared_experts,
        ));
        g.push(linear_bf16(
            m("routed_expert_down_proj.weight"),
            s.latent,
            d,
        ));
        g.push(ones_bf16(m("routed_expert_norm.weight"), s.latent));
        g.push(linear_bf16(m("routed_expert_up_proj.weight"), d, s.latent));
        groups.push(g);
        let (ff, lat) = (s.moe_intermediate_size, s.latent);
        for e in 0..s.n_routed_experts {
            let x = |w: &str| m(&format!("experts.{e}.{w}"));
            let mut eg = Vec::new();
            eg.extend(mxfp4(&x("w1"), ff, lat));
            eg.extend(mxfp4(&x("w2"), lat, ff));
            eg.extend(mxfp4(&x("w3"), ff, lat));
            groups.push(eg);
        }
    }
    let mut tail = super::hf_checkpoint::norm_and_head(s.vocab_size, d);
    tail.extend(score("model.output_attn_res", d));
    groups.push(tail);
    for t in groups.iter_mut().flatten() {
        t.name = format!("{TEXT_MODEL_PREFIX}{}", t.name);
    }
    groups
}

/// The `config.json` of `s`: the K3 fields in `text_config` (the names
/// [`crate::models::kimi_k3::Config::from_hf_json`] and llama.cpp's converter read), the
/// compressed-tensors `quantization_config` at the top level.
pub fn config_json(s: &KimiK3Shape) -> serde_json::Value {
    let (full, kda): (Vec<usize>, Vec<usize>) =
        (1..=s.num_hidden_layers).partition(|&l| s.is_mla(l - 1));
    let mxfp4 = crate::models::kimi_k3::MXFP4_FORMAT;
    let text = serde_json::json!({
        "architectures": ["KimiLinearForCausalLM"],
        "model_type": "kimi_linear",
        "vocab_size": s.vocab_size,
        "hidden_size": s.hidden_size,
        "intermediate_size": s.intermediate_size,
        "moe_intermediate_size": s.moe_intermediate_size,
        "num_hidden_layers": s.num_hidden_layers,
        "num_attention_heads": s.num_heads,
        "num_key_value_heads": s.num_heads,
        "num_experts": s.n_routed_experts,
        "num_experts_per_token": s.num_experts_per_tok,
        "num_shared_experts": s.n_shared_experts,
        "moe_renormalize": true,
        "routed_scaling_factor": 2.446,
        "moe_router_activation_func": "sigmoid",
        "num_expert_group": 1,
        "topk_group": 1,
        "first_k_dense_replace": s.first_k_dense_replace,
        "q_lora_rank": s.q_lora_rank,
        "kv_lora_rank": s.kv_lora_rank,
        "qk_nope_head_dim": s.qk_nope_head_dim,
        "qk_rope_head_dim": s.qk_rope_head_dim,
        "v_head_dim": s.v_head_dim,
        "mla_use_nope": true,
        "hidden_act": "situ",
        "activation_situ_beta": 1.0,
        "activation_situ_linear_beta": 1.5,
        "attn_res_block_size": s.attn_res_block_size,
        "routed_expert_hidden_size": s.latent,
        "latent_moe_use_norm": true,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 1048576,
        "tie_word_embeddings": false,
        "linear_attn_config": {
            "full_attn_layers": full,
            "kda_layers": kda,
            "head_dim": s.kda_head_dim,
            "num_heads": s.num_heads,
            "short_conv_kernel_size": s.conv_kernel,
            "gate_lower_bound": -5.0,
        },
    });
    let quant = serde_json::json!({
        "quant_method": "compressed-tensors",
        "format": mxfp4,
        "config_groups": {"group_0": {
            "targets": ["re:.*block_sparse_moe\\.experts\\..*"],
            "format": mxfp4,
            "weights": {"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32, "symmetric": true},
        }},
        "ignore": ["lm_head"],
    });
    serde_json::json!({
        "architectures": ["KimiK3ForConditionalGeneration"],
        "model_type": MODEL_TYPE,
        "bos_token_id": 480,
        "eos_token_id": 481,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16",
        "text_config": text,
        "quantization_config": quant,
        "deltafin_synthetic": true,
    })
}

/// The Hugging Face checkpoint of `s` (BF16 spine, compressed-tensors MXFP4 routed experts).
pub(crate) fn checkpoint(s: &KimiK3Shape) -> HfCheckpoint {
    HfCheckpoint {
        groups: groups(s),
        config: config_json(s),
        side_files: [
            br#"{"bos_token_id": 480, "eos_token_id": 481, "do_sample": false}"#,
            include_bytes!("../../../tests/fixtures/hf/kimi_linear/tokenizer.json"),
            include_bytes!("../../../tests/fixtures/hf/kimi_linear/tokenizer_config.json"),
        ],
        layers: s.num_hidden_layers,
        moe_layers: s.num_hidden_layers - s.first_k_dense_replace.min(s.num_hidden_layers),
        experts: s.n_routed_experts,
    }
}
