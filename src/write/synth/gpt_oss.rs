//! Synthetic `gpt_oss` checkpoints in the Hugging Face layout OpenAI publishes
//! (`openai/gpt-oss-20b`, read by [`crate::models::gpt_oss`]): attention with biases and
//! per-head `sinks`, alternating `sliding_attention` / `full_attention` layers, a router with a
//! bias, and each layer's experts fused: `mlp.experts.gate_up_proj` (gate and up interleaved in
//! the `2 × intermediate_size` outputs) and `mlp.experts.down_proj` with their biases.
//!
//! MXFP4 as published: `gate_up_proj_blocks` U8 `[E, 2I, H/32, 16]` (two E2M1 nibbles per
//! byte, low nibble first) with `gate_up_proj_scales` U8 `[E, 2I, H/32]` (E8M0 exponents,
//! 2^(e − 127)), `down_proj_blocks` `[E, H, I/32, 16]` / `down_proj_scales` `[E, H, I/32]`,
//! BF16 biases, and `quantization_config {quant_method: mxfp4, modules_to_not_convert: [...]}`.
//! Nibbles are random; exponents lie in four values around `1/√fan_in`
//! (`fill::e8m0_low`: 117..=120 for gpt-oss-20b, 120..=123 for `tiny`). Or BF16:
//! `gate_up_proj` `[E, H, 2I]` and `down_proj` `[E, I, H]`, input-major as transformers holds
//! them.
//!
//! The tokenizer and chat template are those of the `gpt_oss` test fixture (byte-level BPE,
//! harmony-style markers, 489 tokens in a vocabulary of 512).

use super::fill::e8m0_low;
use super::hf_checkpoint::{
    embeddings, linear_bf16, norm_and_head, ones_bf16, vector_bf16, Dtype, Fill, HfCheckpoint,
    TensorSpec,
};

/// The shape of a synthetic `gpt_oss` model (Hugging Face `GptOssConfig` fields).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GptOssShape {
    pub hidden_size: usize,
    /// Width of one expert (`gate_up_proj` has twice as many outputs).
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub num_local_experts: usize,
    pub num_experts_per_tok: usize,
    /// Window of the `sliding_attention` layers (the even ones).
    pub sliding_window: usize,
    pub vocab_size: usize,
}

/// The presets: `tiny` (the shape of the `gpt_oss` test fixture) and `gpt-oss-20b`
/// (gpt-oss-20b's `config.json` but a vocabulary of 512).
pub fn presets() -> Vec<(&'static str, &'static str, GptOssShape)> {
    vec![
        (
            "tiny",
            "CI: hidden 64, 2 layers (sliding 8, full), 4 heads / 2 KV, 8 experts, top-2, expert FFN 64",
            GptOssShape {
                hidden_size: 64,
                intermediate_size: 64,
                num_hidden_layers: 2,
                num_attention_heads: 4,
                num_key_value_heads: 2,
                head_dim: 16,
                num_local_experts: 8,
                num_experts_per_tok: 2,
                sliding_window: 8,
                vocab_size: 512,
            },
        ),
        (
            "gpt-oss-20b",
            "gpt-oss-20b shape (hidden 2880, 64 heads / 8 KV, 32 experts, top-4, expert FFN 2880: 12.6 MiB MXFP4 experts), 24 layers (~11.5 GB)",
            GptOssShape {
                hidden_size: 2880,
                intermediate_size: 2880,
                num_hidden_layers: 24,
                num_attention_heads: 64,
                num_key_value_heads: 8,
                head_dim: 64,
                num_local_experts: 32,
                num_experts_per_tok: 4,
                sliding_window: 128,
                vocab_size: 512,
            },
        ),
    ]
}

/// The MXFP4 blocks and scales `prefix_blocks` / `prefix_scales` of `e` experts' `[out, in]`
/// weights.
fn mxfp4(prefix: String, e: usize, out: usize, inp: usize) -> [TensorSpec; 2] {
    let g = inp / 32;
    [
        TensorSpec::new(
            format!("{prefix}_blocks"),
            Dtype::U8,
            vec![e, out, g, 16],
            Fill::Bytes,
        )
        .experts(e),
        TensorSpec::new(
            format!("{prefix}_scales"),
            Dtype::U8,
            vec![e, out, g],
            Fill::E8m0 { lo: e8m0_low(inp) },
        )
        .experts(e),
    ]
}

/// One group per layer (its spine and its fused experts), between the embeddings and the
/// final norm and head.
fn groups(s: &GptOssShape, mx: bool) -> Vec<Vec<TensorSpec>> {
    let (d, ff, ne) = (s.hidden_size, s.intermediate_size, s.num_local_experts);
    let (qd, kvd) = (
        s.num_attention_heads * s.head_dim,
        s.num_key_value_heads * s.head_dim,
    );
    let mut groups = vec![embeddings(s.vocab_size, d)];
    for l in 0..s.num_hidden_layers {
        let p = |x: &str| format!("model.layers.{l}.{x}");
        let x = |m: &str| p(&format!("mlp.experts.{m}"));
        let bias = |name: String, n: usize| {
            TensorSpec::new(name, Dtype::BF16, vec![ne, n], Fill::Uniform(0.1)).experts(ne)
        };
        let mut g = vec![ones_bf16(p("input_layernorm.weight"), d)];
        if mx {
            g.push(bias(x("down_proj_bias"), d));
            g.extend(mxfp4(x("down_proj"), ne, d, ff));
            g.push(bias(x("gate_up_proj_bias"), 2 * ff));
            g.extend(mxfp4(x("gate_up_proj"), ne, 2 * ff, d));
        } else {
            let w = |name: String, inp: usize, out: usize| {
                let sc = 1.0 / (inp as f32).sqrt();
                TensorSpec::new(name, Dtype::BF16, vec![ne, inp, out], Fill::Uniform(sc))
                    .experts(ne)
            };
            g.push(w(x("down_proj"), ff, d));
            g.push(bias(x("down_proj_bias"), d));
            g.push(w(x("gate_up_proj"), d, 2 * ff));
            g.push(bias(x("gate_up_proj_bias"), 2 * ff));
        }
        g.push(vector_bf16(p("mlp.router.bias"), ne, 0.1));
        g.push(linear_bf16(p("mlp.router.weight"), ne, d));
        g.push(ones_bf16(p("post_attention_layernorm.weight"), d));
        for (name, out, inp) in [
            ("k_proj", kvd, d),
            ("o_proj", d, qd),
            ("q_proj", qd, d),
            ("v_proj", kvd, d),
        ] {
            let a = p(&format!("self_attn.{name}"));
            g.push(vector_bf16(format!("{a}.bias"), out, 0.1));
            g.push(linear_bf16(format!("{a}.weight"), out, inp));
        }
        g.push(vector_bf16(
            p("self_attn.sinks"),
            s.num_attention_heads,
            1.0,
        ));
        groups.push(g);
    }
    groups.push(norm_and_head(s.vocab_size, d));
    groups
}

/// The published-dialect `config.json` of `s` (gpt-oss-20b's fields: YaRN RoPE with factor 32
/// over 4096 positions, base 150000, `swiglu_limit` 7), with `quantization_config` when `mx`.
pub fn config_json(s: &GptOssShape, mx: bool) -> serde_json::Value {
    let layer_types: Vec<&str> = (0..s.num_hidden_layers)
        .map(|l| match l % 2 {
            0 => "sliding_attention",
            _ => "full_attention",
        })
        .collect();
    let mut c = serde_json::json!({
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "attention_bias": true,
        "attention_dropout": 0.0,
        "eos_token_id": 482,
        "experts_per_token": s.num_experts_per_tok,
        "head_dim": s.head_dim,
        "hidden_act": "silu",
        "hidden_size": s.hidden_size,
        "initial_context_length": 4096,
        "intermediate_size": s.intermediate_size,
        "layer_types": layer_types,
        "max_position_embeddings": 131072,
        "num_attention_heads": s.num_attention_heads,
        "num_experts_per_tok": s.num_experts_per_tok,
        "num_hidden_layers": s.num_hidden_layers,
        "num_key_value_heads": s.num_key_value_heads,
        "num_local_experts": s.num_local_experts,
        "pad_token_id": 481,
        "rms_norm_eps": 1e-5,
        "rope_scaling": {
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "factor": 32.0,
            "original_max_position_embeddings": 4096,
            "rope_type": "yarn",
            "truncate": false
        },
        "rope_theta": 150000,
        "sliding_window": s.sliding_window,
        "swiglu_limit": 7.0,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16",
        "use_cache": true,
        "vocab_size": s.vocab_size,
        "deltafin_synthetic": true,
    });
    if mx {
        c["quantization_config"] = serde_json::json!({
            "modules_to_not_convert": [
                "model.layers.*.self_attn",
                "model.layers.*.mlp.router",
                "model.embed_tokens",
                "lm_head"
            ],
            "quant_method": "mxfp4"
        });
    }
    c
}

/// The Hugging Face checkpoint of `s`, MXFP4 experts when `mx` (else BF16).
pub(crate) fn checkpoint(s: &GptOssShape, mx: bool) -> HfCheckpoint {
    HfCheckpoint {
        groups: groups(s, mx),
        config: config_json(s, mx),
        side_files: [
            br#"{"eos_token_id": [482, 488], "pad_token_id": 481, "do_sample": false}"#,
            include_bytes!("../../../tests/fixtures/hf/gpt_oss/tokenizer.json"),
            include_bytes!("../../../tests/fixtures/hf/gpt_oss/tokenizer_config.json"),
        ],
        layers: s.num_hidden_layers,
        moe_layers: s.num_hidden_layers,
        experts: s.num_local_experts,
    }
}
