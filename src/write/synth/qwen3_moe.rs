//! Synthetic `qwen3_moe` checkpoints, laid out as published Qwen3-MoE checkpoints are: BF16,
//! every expert's `down_proj`, `gate_proj`, `up_proj` adjacent, with the `qwen3_moe` test
//! fixture's byte-level BPE tokenizer (vocabulary of 512, ChatML template). The llama.cpp GGUF
//! variant is [`super::qwen3_moe_gguf`].

use std::path::Path;

use anyhow::Result;

use super::hf_checkpoint::{
    embeddings, linear_bf16, norm_and_head, ones_bf16, HfCheckpoint, TensorSpec,
};

/// The shape of a synthetic `qwen3_moe` model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Qwen3MoeShape {
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    pub vocab_size: usize,
}

impl Qwen3MoeShape {
    /// Bytes of one expert in BF16 (gate, up and down: `3 × hidden × moe_intermediate × 2`).
    pub fn expert_bytes(&self) -> usize {
        3 * self.hidden_size * self.moe_intermediate_size * 2
    }
}

/// The presets: name, description, shape.
pub fn presets() -> Vec<(&'static str, &'static str, Qwen3MoeShape)> {
    let qwen30 = |layers| Qwen3MoeShape {
        hidden_size: 2048,
        num_hidden_layers: layers,
        num_attention_heads: 32,
        num_key_value_heads: 4,
        head_dim: 128,
        num_experts: 128,
        num_experts_per_tok: 8,
        moe_intermediate_size: 768,
        vocab_size: 512,
    };
    vec![
        (
            "tiny",
            "CI: hidden 64, 3 layers, 16 experts, top-4, expert FFN 32 (12 KiB experts)",
            Qwen3MoeShape {
                hidden_size: 64,
                num_hidden_layers: 3,
                num_attention_heads: 4,
                num_key_value_heads: 2,
                head_dim: 16,
                num_experts: 16,
                num_experts_per_tok: 4,
                moe_intermediate_size: 32,
                vocab_size: 512,
            },
        ),
        (
            "small",
            "hidden 512, 4 layers, 64 experts, top-8, expert FFN 256 (768 KiB experts), ~200 MB",
            Qwen3MoeShape {
                hidden_size: 512,
                num_hidden_layers: 4,
                num_attention_heads: 8,
                num_key_value_heads: 2,
                head_dim: 64,
                num_experts: 64,
                num_experts_per_tok: 8,
                moe_intermediate_size: 256,
                vocab_size: 512,
            },
        ),
        (
            "qwen3-30b-a3b",
            "Qwen3-30B-A3B shape (hidden 2048, 128 experts, top-8, expert FFN 768: 9 MiB experts), 48 layers (~58 GB); use --layers for fewer",
            qwen30(48),
        ),
    ]
}

/// The tensors of `s` in groups: the embeddings, one per layer (every expert's `down_proj`,
/// `gate_proj`, `up_proj` adjacent), the final norm and head.
fn groups(s: &Qwen3MoeShape) -> Vec<Vec<TensorSpec>> {
    let d = s.hidden_size;
    let (qd, kvd) = (
        s.num_attention_heads * s.head_dim,
        s.num_key_value_heads * s.head_dim,
    );
    let ff = s.moe_intermediate_size;
    let mut groups = vec![embeddings(s.vocab_size, d)];
    for l in 0..s.num_hidden_layers {
        let p = |x: &str| format!("model.layers.{l}.{x}.weight");
        let mut g = vec![
            ones_bf16(p("input_layernorm"), d),
            linear_bf16(p("self_attn.q_proj"), qd, d),
            linear_bf16(p("self_attn.k_proj"), kvd, d),
            linear_bf16(p("self_attn.v_proj"), kvd, d),
            linear_bf16(p("self_attn.o_proj"), d, qd),
            ones_bf16(p("self_attn.q_norm"), s.head_dim),
            ones_bf16(p("self_attn.k_norm"), s.head_dim),
            ones_bf16(p("post_attention_layernorm"), d),
            linear_bf16(p("mlp.gate"), s.num_experts, d),
        ];
        for e in 0..s.num_experts {
            let x = |m: &str| p(&format!("mlp.experts.{e}.{m}"));
            g.push(linear_bf16(x("down_proj"), d, ff).experts(1));
            g.push(linear_bf16(x("gate_proj"), ff, d).experts(1));
            g.push(linear_bf16(x("up_proj"), ff, d).experts(1));
        }
        groups.push(g);
    }
    groups.push(norm_and_head(s.vocab_size, d));
    groups
}

/// The Hugging Face checkpoint of `s` (BF16), with the `qwen3_moe` fixture's tokenizer.
pub(crate) fn checkpoint(s: &Qwen3MoeShape) -> HfCheckpoint {
    HfCheckpoint {
        groups: groups(s),
        config: config_json(s),
        side_files: [
            br#"{"eos_token_id": 482, "do_sample": false}"#,
            include_bytes!("../../../tests/fixtures/hf/qwen3_moe/tokenizer.json"),
            include_bytes!("../../../tests/fixtures/hf/qwen3_moe/tokenizer_config.json"),
        ],
        layers: s.num_hidden_layers,
        moe_layers: s.num_hidden_layers,
        experts: s.num_experts,
    }
}

/// The published-dialect `config.json` of `s`.
pub fn config_json(s: &Qwen3MoeShape) -> serde_json::Value {
    serde_json::json!({
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "attention_bias": false,
        "bos_token_id": null,
        "decoder_sparse_step": 1,
        "eos_token_id": 482,
        "head_dim": s.head_dim,
        "hidden_act": "silu",
        "hidden_size": s.hidden_size,
        "intermediate_size": s.moe_intermediate_size * s.num_experts_per_tok,
        "max_position_embeddings": 4096,
        "mlp_only_layers": [],
        "moe_intermediate_size": s.moe_intermediate_size,
        "norm_topk_prob": true,
        "num_attention_heads": s.num_attention_heads,
        "num_experts": s.num_experts,
        "num_experts_per_tok": s.num_experts_per_tok,
        "num_hidden_layers": s.num_hidden_layers,
        "num_key_value_heads": s.num_key_value_heads,
        "rms_norm_eps": 1e-6,
        "rope_scaling": null,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16",
        "vocab_size": s.vocab_size,
        "deltafin_synthetic": true,
    })
}

/// Writes a random-weight `qwen3_moe` checkpoint of shape `s` into `out` (created; must not
/// hold a `config.json` already), in shards of about `shard_bytes`, seeded by `seed`.
/// `progress(bytes written, total bytes)` is called after each tensor.
///
/// Errors: the folder already holds a model, or a write fails (the message names the file).
pub fn write_qwen3_moe(
    s: &Qwen3MoeShape,
    out: &Path,
    shard_bytes: usize,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    checkpoint(s).write(out, shard_bytes, seed, progress)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_preset_loads_as_a_hugging_face_folder_with_the_expected_sizes() {
        let dir = tempfile::tempdir().unwrap();
        let shape = presets()[0].2.clone();
        assert_eq!(shape.expert_bytes(), 12288);
        write_qwen3_moe(&shape, dir.path(), 100_000, 7, &mut |_, _| {}).unwrap();
        let hf = crate::source::hf::HfModel::open(dir.path()).unwrap();
        // 64 KiB embeddings, ~218 KiB per layer, head: each its own shard at ~100 kB
        assert_eq!(hf.files.len(), 5);
        let t = hf
            .tensors
            .iter()
            .find(|t| t.name == "model.layers.2.mlp.experts.15.down_proj.weight")
            .unwrap();
        assert_eq!(t.shape, vec![32, 64]);
        assert_eq!(t.n_bytes, 4096);
        let e = write_qwen3_moe(&shape, dir.path(), 100_000, 7, &mut |_, _| {}).unwrap_err();
        assert!(e.to_string().contains("already holds a model"), "{e}");
    }
}
