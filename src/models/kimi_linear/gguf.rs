//! GGUF files of llama.cpp's architecture `kimi-linear` (Kimi Linear as llama.cpp's
//! `convert_hf_to_gguf.py`, `conversion/kimi_linear.py`, writes it) into the forward pass of
//! [`super`] (the `kimi_linear` family).
//!
//! Metadata (keys `kimi-linear.*` as llama.cpp's `src/llama-arch.cpp` names them and
//! `src/models/kimi-linear.cpp` reads them) becomes a [`Config`] in the published
//! `config.json` dialect, checked by [`Config::from_json`]. Which layers are MLA: those with a
//! non-zero entry in the per-layer array `attention.head_count_kv` (the converter writes 1 for
//! MLA, 0 for KDA). KDA uses `attention.head_count` heads (llama.cpp has one head count for
//! both mixers) of `kda.head_dim`, with `ssm.conv_kernel` taps; MLA widths come from
//! `attention.kv_lora_rank`, `rope.dimension_count`, `attention.key_length_mla` (nope + rope)
//! and `attention.value_length_mla`. Routing: `expert_gating_func` must be 2 (sigmoid); llama.cpp
//! always renormalizes the kept weights for this architecture and scales them by
//! `expert_weights_scale`.
//!
//! Tensors: `token_embd`, `output` (absent when tied), `output_norm`, and per layer
//! `blk.N.{attn_norm, ffn_norm}`; KDA layers `attn_{q,k,v}`, `ssm_conv1d_{q,k,v}` (GGML shape
//! `[kernel, 1, dim(, 1)]`, the bytes of Hugging Face's `[dim, 1, kernel]`), `ssm_f_a`,
//! `ssm_f_b`, `ssm_beta`, `ssm_g_a`, `ssm_g_b`, `attn_output`, `ssm_a` (`−exp(A_log)`, GGML
//! shape `[1, heads(, 1, 1)]`), `ssm_dt.bias` (Hugging Face's `dt_bias`), `ssm_norm` (`o_norm`);
//! MLA layers `attn_q` (or `attn_q_a`, `attn_q_a_norm`, `attn_q_b`), `attn_kv_a_mqa`,
//! `attn_kv_a_norm`, `attn_k_b` + `attn_v_b` (or the joint `attn_kv_b`), `attn_output`; the
//! dense `ffn_{gate,up,down}` in the first `leading_dense_block_count` layers, else the router
//! `ffn_gate_inp`, its correction bias `exp_probs_b.bias`, the stacked experts
//! `ffn_{gate,up,down}_exps` (split by byte ranges into one unit per (layer, expert)) and the
//! shared experts `ffn_{gate,up,down}_shexp`.
//!
//! Norm epsilons follow llama.cpp: the latent norms (`attn_kv_a_norm`, `attn_q_a_norm`) use
//! `attention.layer_norm_rms_epsilon`, as the other RMSNorms.

use anyhow::{bail, Result};
use serde_json::json;

use super::config::Config;
use super::tensors::{Checkpoint, FfnTensors, KdaTensors, KvB, LayerTensors, MixTensors, MlaTensors};
use super::KimiLinear;
use crate::models::config::{gguf_arch, gguf_count, gguf_sigmoid_moe, GgufSigmoidMoe};
use crate::models::layers::hybrid::{gguf_hybrid_attn, Mixer};
use crate::models::loading::{either, gate_up_down, Tensors};
use crate::models::LoadOptions;
use crate::source::gguf::GgufModel;
use crate::source::tensor::TensorInfo;
use crate::store::WeightStore;

/// The `general.architecture` llama.cpp gives Kimi Linear.
pub const ARCH: &str = "kimi-linear";


/// Reads the configuration of a `kimi-linear` GGUF as a Kimi Linear [`Config`].
///
/// Errors name the file and the key: a missing required key (block count, embedding length,
/// head counts, the per-layer `attention.head_count_kv` array, LoRA rank, MLA and KDA widths,
/// conv kernel, expert counts and widths, RMS epsilon, context length), an
/// `attention.head_count_kv` that is not an array of one count per block, a gating function
/// other than sigmoid, and whatever [`Config::from_json`] refuses.
pub fn config_from_gguf(g: &GgufModel) -> Result<Config> {
    let (file, arch) = gguf_arch(g, |a| a == ARCH, ARCH)?;
    let k = |s: &str| format!("{arch}.{s}");
    let h = gguf_hybrid_attn(g, &arch)?;
    let (n, d, n_head) = (h.layers, h.hidden, h.heads);
    let mla = |i: &usize| h.mixers[*i] == Mixer::Mla;
    let full: Vec<usize> = (0..n).filter(mla).map(|i| i + 1).collect();
    let kda: Vec<usize> = (0..n).filter(|i| !mla(i)).map(|i| i + 1).collect();
    let (rank, q_rank, rope, vd) = (h.kv_lora_rank, h.q_lora_rank, h.rope, h.v_head_dim);
    let qk = h.qk_nope + rope;
    let (kda_hd, conv) = (h.kda_head_dim, h.conv_kernel);
    let eps = g.get_f32(&k("attention.layer_norm_rms_epsilon"))?;
    if !(eps.is_finite() && eps > 0.0) {
        bail!("{file}: metadata key '{arch}.attention.layer_norm_rms_epsilon' = {eps} must be a positive finite number");
    }
    let GgufSigmoidMoe { experts: ne, used, expert_ff: eff, shared, dense, dense_ff: dff, groups, groups_used, scale } =
        gguf_sigmoid_moe(g, &arch)?;
    let max_pos = gguf_count(g, &k("context_length"), 1..=(1 << 24))?;
    let vocab = h.vocab;
    let v = json!({
        "model_type": "kimi_linear",
        "vocab_size": vocab,
        "hidden_size": d,
        "intermediate_size": dff,
        "moe_intermediate_size": eff,
        "num_hidden_layers": n,
        "num_attention_heads": n_head,
        "num_experts": ne,
        "num_shared_experts": shared,
        "num_experts_per_token": used,
        "num_expert_group": groups,
        "topk_group": groups_used,
        "routed_scaling_factor": scale,
        "moe_renormalize": true,
        "first_k_dense_replace": dense,
        "q_lora_rank": q_rank,
        "kv_lora_rank": rank,
        "qk_rope_head_dim": rope,
        "qk_nope_head_dim": qk - rope,
        "v_head_dim": vd,
        "rms_norm_eps": eps as f64,
        "model_max_length": max_pos,
        "tie_word_embeddings": g.tensor("output.weight").is_none(),
        "mla_use_nope": true,
        "moe_router_activation_func": "sigmoid",
        "linear_attn_config": {
            "head_dim": kda_hd,
            "num_heads": n_head,
            "short_conv_kernel_size": conv,
            "full_attn_layers": full,
            "kda_layers": kda,
        },
    });
    Config::from_json(&v, &file)
}

/// Resolves the tensors of a `kimi-linear` GGUF for `c` ([`config_from_gguf`]), with shape
/// and type checks; errors name the file and the tensor.
fn gguf_checkpoint(c: &Config, g: &GgufModel) -> Result<Checkpoint> {
    let ts = Tensors::new(g);
    let d = c.hidden_size;
    let get = |name: &str, shape: &[usize]| -> Result<TensorInfo> { Ok(ts.get(name, shape)?.clone()) };
    let embd = get("token_embd.weight", &[d, c.vocab_size])?;
    let head = match c.tie_word_embeddings {
        true => embd.clone(),
        false => get("output.weight", &[d, c.vocab_size])?,
    };
    let (hd, dim, nh, kh) = (c.linear_head_dim, c.kda_dim(), c.num_attention_heads, c.linear_num_heads);
    let (nope, vd, qh, rank) = (c.qk_nope_head_dim, c.v_head_dim, c.qk_head_dim(), c.kv_lora_rank);
    let (ne, eff, sff) = (
        c.n_routed_experts,
        c.moe_intermediate_size,
        c.moe_intermediate_size * c.n_shared_experts,
    );
    let mut layers = Vec::with_capacity(c.num_hidden_layers);
    for l in 0..c.num_hidden_layers {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        let mix = match c.mixers[l] {
            Mixer::Kda => {
                let kc = c.linear_conv_kernel_dim;
                let conv = |x: &str| either(&ts, &n(&format!("ssm_conv1d_{x}")), &[kc, 1, dim, 1], &[kc, 1, dim]);
                MixTensors::Kda(Box::new(KdaTensors {
                    mats: [
                        get(&n("attn_q"), &[d, dim])?,
                        get(&n("attn_k"), &[d, dim])?,
                        get(&n("attn_v"), &[d, dim])?,
                        get(&n("ssm_f_a"), &[d, hd])?,
                        get(&n("ssm_f_b"), &[hd, dim])?,
                        get(&n("ssm_beta"), &[d, kh])?,
                        get(&n("ssm_g_a"), &[d, hd])?,
                        get(&n("ssm_g_b"), &[hd, dim])?,
                        get(&n("attn_output"), &[dim, d])?,
                    ],
                    conv: [conv("q")?, conv("k")?, conv("v")?],
                    a_log: either(&ts, &format!("blk.{l}.ssm_a"), &[1, kh, 1, 1], &[1, kh])?,
                    dt_bias: get(&format!("blk.{l}.ssm_dt.bias"), &[dim])?,
                    o_norm: get(&n("ssm_norm"), &[hd])?,
                }))
            }
            Mixer::Mla => MixTensors::Mla(Box::new(MlaTensors {
                q_a: match c.q_lora_rank {
                    Some(r) => Some((get(&n("attn_q_a"), &[d, r])?, get(&n("attn_q_a_norm"), &[r])?)),
                    None => None,
                },
                q: match c.q_lora_rank {
                    Some(r) => get(&n("attn_q_b"), &[r, nh * qh])?,
                    None => get(&n("attn_q"), &[d, nh * qh])?,
                },
                kv_a: get(&n("attn_kv_a_mqa"), &[d, c.latent_dim()])?,
                kv_a_norm: get(&n("attn_kv_a_norm"), &[rank])?,
                kv_b: match g.tensor(&n("attn_kv_b")) {
                    Some(_) if g.tensor(&n("attn_k_b")).is_none() => {
                        KvB::Joint(get(&n("attn_kv_b"), &[rank, nh * (nope + vd)])?)
                    }
                    _ => KvB::Split {
                        k: get(&n("attn_k_b"), &[nope, rank, nh])?,
                        v: get(&n("attn_v_b"), &[rank, vd, nh])?,
                    },
                },
                o: get(&n("attn_output"), &[nh * vd, d])?,
            })),
        };
        let ffn = if c.moe[l] {
            let split = |s: &str, shape: &[usize]| ts.stacked(&n(s), shape);
            let gate = split("ffn_gate_exps", &[d, eff, ne])?;
            let up = split("ffn_up_exps", &[d, eff, ne])?;
            let down = split("ffn_down_exps", &[eff, d, ne])?;
            FfnTensors::Moe {
                router: get(&n("ffn_gate_inp"), &[d, ne])?,
                bias: get(&format!("blk.{l}.exp_probs_b.bias"), &[ne])?,
                shared: gate_up_down(get, ["ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"].map(&n), d, sff)?,
                experts: gate.into_iter().zip(up).zip(down).map(|((g, u), d)| [g, u, d]).collect(),
            }
        } else {
            let ff = c.intermediate_size;
            FfnTensors::Dense(gate_up_down(get, ["ffn_gate", "ffn_up", "ffn_down"].map(&n), d, ff)?)
        };
        layers.push(LayerTensors {
            mix,
            ffn,
            input_norm: get(&n("attn_norm"), &[d])?,
            post_attn_norm: get(&n("ffn_norm"), &[d])?,
        });
    }
    Ok(Checkpoint {
        files: g.files.clone(),
        pack: g.pack.clone(),
        final_norm: get("output_norm.weight", &[d])?,
        embd,
        head,
        layers,
        a_neg_exp: true,
        lora_eps: c.rms_norm_eps as f32,
    })
}

/// Loads a `kimi-linear` GGUF under `opts` (see [`KimiLinear::load`] for what loading does).
///
/// Errors: metadata errors ([`config_from_gguf`]), a missing, mis-shaped or unsupported tensor
/// (named with the file), an `ssm_a` value that is not negative, a budget too small to run, an
/// unreadable file.
pub fn load(g: &GgufModel, opts: &LoadOptions) -> Result<(KimiLinear, WeightStore)> {
    let c = config_from_gguf(g)?;
    let ck = gguf_checkpoint(&c, g)?;
    KimiLinear::build(c, ck, opts)
}
