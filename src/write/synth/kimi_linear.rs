//! Synthetic `kimi_linear` checkpoints in the Hugging Face layout Moonshot AI publishes
//! (`moonshotai/Kimi-Linear-48B-A3B-Instruct`, read by [`crate::models::kimi_linear`]): per
//! layer either Kimi Delta Attention (`self_attn.{q,k,v}_proj`, `{q,k,v}_conv1d`,
//! `f_a_proj`, `f_b_proj`, `A_log`, `dt_bias`, `b_proj`, `g_a_proj`, `g_b_proj`, `o_norm`,
//! `o_proj`) or no-RoPE MLA (`q_proj`, `kv_a_proj_with_mqa`, `kv_a_layernorm`, `kv_b_proj`,
//! `o_proj`) as `linear_attn_config` lists them (1-based), `first_k_dense_replace` dense MLP
//! layers, then MoE layers `block_sparse_moe.{gate, shared_experts, experts.N.{w1,w2,w3}}`.
//!
//! BF16 throughout (the router's correction bias, `A_log` and `dt_bias` F32). `A_log` is 0
//! (decay rate 1) and `dt_bias` uniform in ±0.1, so the decays stay moderate; the
//! convolution taps are uniform in ±½. The tokenizer and chat template are those of the
//! `kimi_linear` test fixture (byte-level BPE, vocabulary of 512).

use super::hf_checkpoint::{
    embeddings, linear_bf16, norm_and_head, ones_bf16, Dtype, Fill, HfCheckpoint, TensorSpec,
};

/// The shape of a synthetic `kimi_linear` model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KimiLinearShape {
    pub hidden_size: usize,
    /// Width of the dense MLP of the first `first_k_dense_replace` layers.
    pub intermediate_size: usize,
    /// Width of one routed expert (and, times `n_shared_experts`, of the shared expert).
    pub moe_intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub first_k_dense_replace: usize,
    /// MLA heads.
    pub num_attention_heads: usize,
    pub n_routed_experts: usize,
    pub n_shared_experts: usize,
    pub num_experts_per_tok: usize,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    /// KDA heads and their width.
    pub linear_num_heads: usize,
    pub linear_head_dim: usize,
    pub conv_kernel: usize,
    /// Every `mla_every`-th layer (1-based) and the last are MLA, the others KDA.
    pub mla_every: usize,
    pub vocab_size: usize,
}

impl KimiLinearShape {
    /// Whether layer `l` (0-based) is MLA: `(l + 1) % mla_every == 0` or the last layer.
    pub fn is_mla(&self, l: usize) -> bool {
        (l + 1).is_multiple_of(self.mla_every) || l + 1 == self.num_hidden_layers
    }
}

/// The presets: `tiny` (the `kimi_linear` test fixture's shape) and `kimi-linear-48b-a3b`
/// (Kimi-Linear-48B-A3B's `config.json`, a vocabulary of 512).
pub fn presets() -> Vec<(&'static str, &'static str, KimiLinearShape)> {
    let big = KimiLinearShape {
        hidden_size: 2304,
        intermediate_size: 9216,
        moe_intermediate_size: 1024,
        num_hidden_layers: 27,
        first_k_dense_replace: 1,
        num_attention_heads: 32,
        n_routed_experts: 256,
        n_shared_experts: 1,
        num_experts_per_tok: 8,
        kv_lora_rank: 512,
        qk_nope_head_dim: 128,
        qk_rope_head_dim: 64,
        v_head_dim: 128,
        linear_num_heads: 32,
        linear_head_dim: 128,
        conv_kernel: 4,
        mla_every: 4,
        vocab_size: 512,
    };
    vec![
        (
            "tiny",
            "CI: hidden 64, KDA (4 heads of 16) with MLA at layers 4, 8 and the last, 1 dense + MoE layers of 8 experts, top-2, 1 shared, expert FFN 32",
            KimiLinearShape {
                hidden_size: 64,
                intermediate_size: 128,
                moe_intermediate_size: 32,
                num_hidden_layers: 4,
                first_k_dense_replace: 1,
                num_attention_heads: 4,
                n_routed_experts: 8,
                n_shared_experts: 1,
                num_experts_per_tok: 2,
                kv_lora_rank: 16,
                qk_nope_head_dim: 16,
                qk_rope_head_dim: 8,
                v_head_dim: 16,
                linear_num_heads: 4,
                linear_head_dim: 16,
                conv_kernel: 4,
                mla_every: 4,
                vocab_size: 512,
            },
        ),
        (
            "kimi-linear-48b-a3b",
            "Kimi-Linear-48B-A3B shape (hidden 2304, KDA 32 heads of 128 with MLA every 4th layer and the last, 256 experts, top-8, 1 shared, expert FFN 1024: 13.5 MiB BF16 experts), 1 dense + 26 MoE layers (~98 GB BF16); use --layers for fewer",
            big,
        ),
    ]
}

/// A SwiGLU MLP `prefix.{down,gate,up}_proj` of width `ff`.
fn mlp(prefix: &str, d: usize, ff: usize) -> Vec<TensorSpec> {
    vec![
        linear_bf16(format!("{prefix}.down_proj.weight"), d, ff),
        linear_bf16(format!("{prefix}.gate_proj.weight"), ff, d),
        linear_bf16(format!("{prefix}.up_proj.weight"), ff, d),
    ]
}

/// The KDA tensors of layer `l` under `a` (`model.layers.L.self_attn.`).
fn kda(s: &KimiLinearShape, a: &dyn Fn(&str) -> String) -> Vec<TensorSpec> {
    let (d, hd, nh) = (s.hidden_size, s.linear_head_dim, s.linear_num_heads);
    let dim = hd * nh;
    let mut g = Vec::new();
    for x in ["q", "k", "v"] {
        g.push(linear_bf16(a(&format!("{x}_proj.weight")), dim, d));
        g.push(TensorSpec::new(
            a(&format!("{x}_conv1d.weight")),
            Dtype::BF16,
            vec![dim, 1, s.conv_kernel],
            Fill::Uniform(0.5),
        ));
    }
    g.push(linear_bf16(a("f_a_proj.weight"), hd, d));
    g.push(linear_bf16(a("f_b_proj.weight"), dim, hd));
    g.push(TensorSpec::new(
        a("A_log"),
        Dtype::F32,
        vec![1, 1, nh, 1],
        Fill::Const(0.0),
    ));
    g.push(TensorSpec::new(
        a("dt_bias"),
        Dtype::F32,
        vec![dim],
        Fill::Uniform(0.1),
    ));
    g.push(linear_bf16(a("b_proj.weight"), nh, d));
    g.push(linear_bf16(a("g_a_proj.weight"), hd, d));
    g.push(linear_bf16(a("g_b_proj.weight"), dim, hd));
    g.push(ones_bf16(a("o_norm.weight"), hd));
    g.push(linear_bf16(a("o_proj.weight"), d, dim));
    g
}

/// Tensor groups: embeddings; per layer its spine and then each routed expert as a group of
/// its own; the final norm and head.
fn groups(s: &KimiLinearShape) -> Vec<Vec<TensorSpec>> {
    let d = s.hidden_size;
    let nh = s.num_attention_heads;
    let mut groups = vec![embeddings(s.vocab_size, d)];
    for l in 0..s.num_hidden_layers {
        let p = |x: &str| format!("model.layers.{l}.{x}");
        let a = |x: &str| p(&format!("self_attn.{x}"));
        let mut g = vec![ones_bf16(p("input_layernorm.weight"), d)];
        if s.is_mla(l) {
            let qk = s.qk_nope_head_dim + s.qk_rope_head_dim;
            g.push(linear_bf16(a("q_proj.weight"), nh * qk, d));
            g.push(linear_bf16(
                a("kv_a_proj_with_mqa.weight"),
                s.kv_lora_rank + s.qk_rope_head_dim,
                d,
            ));
            g.push(ones_bf16(a("kv_a_layernorm.weight"), s.kv_lora_rank));
            let kv_b = nh * (s.qk_nope_head_dim + s.v_head_dim);
            g.push(linear_bf16(a("kv_b_proj.weight"), kv_b, s.kv_lora_rank));
            g.push(linear_bf16(a("o_proj.weight"), d, nh * s.v_head_dim));
        } else {
            g.extend(kda(s, &a));
        }
        g.push(ones_bf16(p("post_attention_layernorm.weight"), d));
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
        groups.push(g);
        let ff = s.moe_intermediate_size;
        for e in 0..s.n_routed_experts {
            let x = |w: &str| m(&format!("experts.{e}.{w}.weight"));
            groups.push(
                [
                    linear_bf16(x("w1"), ff, d),
                    linear_bf16(x("w2"), d, ff),
                    linear_bf16(x("w3"), ff, d),
                ]
                .into_iter()
                .map(|t| t.experts(1))
                .collect(),
            );
        }
    }
    groups.push(norm_and_head(s.vocab_size, d));
    groups
}

/// The published-dialect `config.json` of `s`.
pub fn config_json(s: &KimiLinearShape) -> serde_json::Value {
    let (full, kda): (Vec<usize>, Vec<usize>) =
        (1..=s.num_hidden_layers).partition(|&l| s.is_mla(l - 1));
    serde_json::json!({
        "architectures": ["KimiLinearForCausalLM"],
        "model_type": "kimi_linear",
        "bos_token_id": 480,
        "eos_token_id": 481,
        "first_k_dense_replace": s.first_k_dense_replace,
        "hidden_act": "silu",
        "hidden_size": s.hidden_size,
        "intermediate_size": s.intermediate_size,
        "kv_lora_rank": s.kv_lora_rank,
        "linear_attn_config": {
            "full_attn_layers": full,
            "kda_layers": kda,
            "head_dim": s.linear_head_dim,
            "num_heads": s.linear_num_heads,
            "short_conv_kernel_size": s.conv_kernel,
        },
        "mla_use_nope": true,
        "model_max_length": 1048576,
        "moe_intermediate_size": s.moe_intermediate_size,
        "moe_renormalize": true,
        "moe_router_activation_func": "sigmoid",
        "num_attention_heads": s.num_attention_heads,
        "num_expert_group": 1,
        "num_experts": s.n_routed_experts,
        "num_experts_per_token": s.num_experts_per_tok,
        "num_hidden_layers": s.num_hidden_layers,
        "num_key_value_heads": s.num_attention_heads,
        "num_shared_experts": s.n_shared_experts,
        "q_lora_rank": null,
        "qk_nope_head_dim": s.qk_nope_head_dim,
        "qk_rope_head_dim": s.qk_rope_head_dim,
        "rms_norm_eps": 1e-5,
        "routed_scaling_factor": 2.446,
        "tie_word_embeddings": false,
        "topk_group": 1,
        "torch_dtype": "bfloat16",
        "v_head_dim": s.v_head_dim,
        "vocab_size": s.vocab_size,
        "deltafin_synthetic": true,
    })
}

/// The Hugging Face checkpoint of `s` (BF16).
pub(crate) fn checkpoint(s: &KimiLinearShape) -> HfCheckpoint {
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
