//! GGUF files of llama.cpp's architecture `deepseek2` (DeepSeek V2/V3 and Kimi K2 as
//! llama.cpp's `convert_hf_to_gguf.py` writes them) into the forward pass of
//! [`super`] (the `deepseek_v3` family).
//!
//! Metadata (keys `deepseek2.*` as llama.cpp's `src/llama-arch.cpp` names them and
//! `src/models/deepseek2.cpp` reads them) becomes a [`Config`] with the Hugging Face field
//! names, checked by [`Config::from_json`]. The converter writes MLA in its absorbed form:
//! `attention.head_count_kv` 1, `attention.key_length` / `value_length` the latent widths, the
//! per-head widths in `attention.key_length_mla` / `value_length_mla`, and `kv_b_proj` split
//! into `attn_k_b` (each head's key rows transposed, GGML shape `[nope, kv_lora_rank, heads]`)
//! and `attn_v_b` (`[kv_lora_rank, v, heads]`); older files keep the joint `attn_kv_b` and
//! per-head key/value lengths, which are read too.
//!
//! Tensors: `token_embd`, `output` (absent when tied), `output_norm`, and per layer
//! `blk.N.{attn_norm, attn_q_a, attn_q_a_norm, attn_q_b (or attn_q), attn_kv_a_mqa,
//! attn_kv_a_norm, attn_k_b + attn_v_b (or attn_kv_b), attn_output, ffn_norm}`, then the dense
//! `ffn_{gate,up,down}` in the first `leading_dense_block_count` layers, else the router
//! `ffn_gate_inp`, its correction bias `exp_probs_b.bias`, the stacked experts
//! `ffn_{gate,up,down}_exps` (split by byte ranges into one unit per (layer, expert)) and the
//! shared experts `ffn_{gate,up,down}_shexp`. Multi-token-prediction blocks
//! (`nextn_predict_layers`, the last blocks of `block_count`) are not run.
//!
//! RoPE: llama.cpp rotates the rotary slice as interleaved pairs (`LLAMA_ROPE_TYPE_NORM`) and
//! the converter does not permute the rows, as transformers' `rope_interleave`; q and k share
//! the layout, so scores are the same as with transformers' de-interleaved result. YaRN: the
//! rotation magnitude and the softmax scale follow llama.cpp (`llama-context.cpp` and
//! `deepseek2.cpp`): `mscale_all_dim = rope.scaling.yarn_log_multiplier / 0.1` (the converter
//! writes `0.1 · mscale_all_dim`) and `mscale = mscale_all_dim`, so rotated values keep their
//! magnitude and scores are scaled by `(0.1 · mscale_all_dim · ln factor + 1)² / √qk_head_dim`,
//! which is transformers' `DeepseekV3Attention.scaling` when `mscale == mscale_all_dim` (as in
//! the published DeepSeek V3 and Kimi K2 configs). Files whose YaRN lacks the log multiplier or
//! sets `rope.scaling.attn_factor` are refused (llama.cpp scales them differently from
//! transformers). The latent RMSNorms use `attention.layer_norm_rms_epsilon`, as llama.cpp.
//! Routing: `expert_gating_func` must be 2 (sigmoid); group-limited top-k over
//! `expert_group_count` groups keeping `expert_group_used_count`, weights renormalised when
//! `expert_weights_norm` and scaled by `expert_weights_scale` (llama.cpp's `build_moe_ffn`).

use anyhow::{anyhow, bail, Result};
use serde_json::json;

use super::{Config, DeepseekV3};
use super::tensors::{Checkpoint, FfnTensors, KvB, LayerTensors, Lin};
use crate::models::loading::{gate_up_down, Tensors};
use crate::models::config::{gguf_arch, gguf_count, gguf_sigmoid_moe, opt_gguf_count, GgufSigmoidMoe};
use crate::models::LoadOptions;
use crate::source::gguf::GgufModel;
use crate::store::WeightStore;

/// Dimension limit checked at load (a hostile file must not make us allocate terabytes).
const DIM_MAX: u64 = 1 << 20;

/// Reads the configuration of a `deepseek2` GGUF as a DeepSeek V3 [`Config`]
/// (`model_type: deepseek_v3`). `n_shared_experts` is `expert_shared_count`,
/// `moe_intermediate_size` `expert_feed_forward_length`, `qk_rope_head_dim`
/// `rope.dimension_count`, `qk_nope_head_dim` the MLA key length minus it.
///
/// Errors name the file and the key: a missing required key (block count, embedding length,
/// head count, LoRA ranks, expert counts and widths, RMS epsilon, context length), a gating
/// function other than sigmoid, a RoPE scaling type other than none / yarn, YaRN without
/// `rope.scaling.yarn_log_multiplier` or with `rope.scaling.attn_factor` ≠ 1, key lengths that
/// do not fit, and whatever [`Config::from_json`] refuses.
pub fn config_from_gguf(g: &GgufModel) -> Result<Config> {
    let (file, arch) = gguf_arch(g, |a| a == "deepseek2", "deepseek2")?;
    let k = |s: &str| format!("{arch}.{s}");
    let n_all = gguf_count(g, &k("block_count"), 1..=4096)?;
    let nextn = g.opt_u64(&k("nextn_predict_layers"))?.unwrap_or(0) as usize;
    if nextn >= n_all {
        bail!("{file}: metadata key '{arch}.nextn_predict_layers' = {nextn} leaves no decoder layer of '{arch}.block_count' = {n_all}");
    }
    let d = gguf_count(g, &k("embedding_length"), 1..=DIM_MAX)?;
    let n_head = gguf_count(g, &k("attention.head_count"), 1..=4096)?;
    let rank = gguf_count(g, &k("attention.kv_lora_rank"), 1..=DIM_MAX)?;
    let q_rank = opt_gguf_count(g, &k("attention.q_lora_rank"), 1..=DIM_MAX)?;
    let rope = gguf_count(g, &k("rope.dimension_count"), 1..=512)?;
    // per-head widths: the MLA keys of the absorbed form, else the plain key/value lengths
    let qk = match opt_gguf_count(g, &k("attention.key_length_mla"), 1..=8192)? {
        Some(v) => v,
        None => gguf_count(g, &k("attention.key_length"), 1..=8192)?,
    };
    let vd = match opt_gguf_count(g, &k("attention.value_length_mla"), 1..=8192)? {
        Some(v) => v,
        None => gguf_count(g, &k("attention.value_length"), 1..=8192)?,
    };
    if qk <= rope {
        bail!("{file}: metadata key '{arch}.attention.key_length_mla' = {qk} leaves no room beside '{arch}.rope.dimension_count' = {rope}");
    }
    let eps = g.get_f32(&k("attention.layer_norm_rms_epsilon"))?;
    let base = g.opt_f32(&k("rope.freq_base"))?.unwrap_or(10_000.0);
    for (key, v) in [
        ("attention.layer_norm_rms_epsilon", eps),
        ("rope.freq_base", base),
    ] {
        if !(v.is_finite() && v > 0.0) {
            bail!("{file}: metadata key '{arch}.{key}' = {v} must be a positive finite number");
        }
    }
    let GgufSigmoidMoe { experts: ne, used, expert_ff: eff, shared, dense, dense_ff: dff, groups, groups_used, scale } =
        gguf_sigmoid_moe(g, &arch)?;
    let norm = g.opt_bool(&k("expert_weights_norm"))?.unwrap_or(false);
    let max_pos = gguf_count(g, &k("context_length"), 1..=(1 << 24))?;
    let rope_parameters = match g.opt_str(&k("rope.scaling.type"))? {
        None | Some("none") => json!({"rope_type": "default", "rope_theta": base}),
        Some("yarn") => {
            let factor = g.get_f32(&k("rope.scaling.factor"))?;
            let orig = gguf_count(g, &k("rope.scaling.original_context_length"), 1..=(1 << 24))?;
            let fast = g.opt_f32(&k("rope.scaling.yarn_beta_fast"))?.unwrap_or(32.0);
            let slow = g.opt_f32(&k("rope.scaling.yarn_beta_slow"))?.unwrap_or(1.0);
            let log_mul = g
                .opt_f32(&k("rope.scaling.yarn_log_multiplier"))?
                .filter(|&m| m != 0.0)
                .ok_or_else(|| anyhow!("{file}: metadata key '{arch}.rope.scaling.yarn_log_multiplier' is missing or 0 (YaRN without it is scaled differently by llama.cpp and transformers: not supported)"))?;
            if let Some(a) = g.opt_f32(&k("rope.scaling.attn_factor"))? {
                if a != 1.0 {
                    bail!("{file}: metadata key '{arch}.rope.scaling.attn_factor' = {a} is not supported (only 1)");
                }
            }
            if !(factor.is_finite() && factor >= 1.0 && log_mul.is_finite()) {
                bail!("{file}: metadata key '{arch}.rope.scaling.factor' = {factor} must be at least 1");
            }
            // llama.cpp divides the converter's 0.1 · mscale_all_dim back out, in f32
            let ma = (log_mul / 0.1) as f64;
            json!({
                "rope_type": "yarn",
                "rope_theta": base,
                "factor": factor,
                "original_max_position_embeddings": orig,
                "beta_fast": fast,
                "beta_slow": slow,
                "mscale": ma,
                "mscale_all_dim": ma,
            })
        }
        Some(t) => bail!(
            "{file}: metadata key '{arch}.rope.scaling.type' = '{t}' is not supported (only none, yarn)"
        ),
    };
    let embd = g.tensor("token_embd.weight").ok_or_else(|| {
        anyhow!(
            "{}: tensor 'token_embd.weight' is missing",
            g.files[0].display()
        )
    })?;
    let vocab = embd.shape.get(1).copied().unwrap_or(0);
    if vocab == 0 || vocab > 1 << 24 {
        bail!("{file}: tensor 'token_embd.weight' has {vocab} rows (vocabulary size)");
    }
    let v = json!({
        "model_type": "deepseek_v3",
        "vocab_size": vocab,
        "hidden_size": d,
        "intermediate_size": dff,
        "moe_intermediate_size": eff,
        "num_hidden_layers": n_all - nextn,
        "num_attention_heads": n_head,
        "n_routed_experts": ne,
        "n_shared_experts": shared,
        "num_experts_per_tok": used,
        "n_group": groups,
        "topk_group": groups_used,
        "routed_scaling_factor": scale,
        "norm_topk_prob": norm,
        "first_k_dense_replace": dense,
        "q_lora_rank": q_rank,
        "kv_lora_rank": rank,
        "qk_rope_head_dim": rope,
        "qk_nope_head_dim": qk - rope,
        "v_head_dim": vd,
        "rms_norm_eps": eps as f64,
        "rope_parameters": rope_parameters,
        "rope_interleave": true,
        "max_position_embeddings": max_pos,
        "tie_word_embeddings": g.tensor("output.weight").is_none(),
        "num_nextn_predict_layers": nextn,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
    });
    Config::from_json(&v, &file)
}

/// Resolves the tensors of a `deepseek2` GGUF for `c` ([`config_from_gguf`]), with shape and
/// type checks; errors name the file and the tensor.
fn gguf_checkpoint(c: &Config, g: &GgufModel) -> Result<Checkpoint> {
    let ts = Tensors::new(g);
    let (d, nh, rank, rope) = (
        c.hidden_size,
        c.num_attention_heads,
        c.kv_lora_rank,
        c.qk_rope_head_dim,
    );
    let (nope, vd, qh) = (c.qk_nope_head_dim, c.v_head_dim, c.qk_head_dim());
    let (ne, eff, dff) = (
        c.n_routed_experts,
        c.moe_intermediate_size,
        c.intermediate_size,
    );
    let sff = eff * c.n_shared_experts;
    let get = |name: &str, shape: &[usize]| ts.get(name, shape).cloned();
    let lin = |name: &str, shape: &[usize]| get(name, shape).map(Lin::Plain);
    let embd = get("token_embd.weight", &[d, c.vocab_size])?;
    let head = match c.tie_word_embeddings {
        true => embd.clone(),
        false => get("output.weight", &[d, c.vocab_size])?,
    };
    let mut layers = Vec::with_capacity(c.num_hidden_layers);
    for l in 0..c.num_hidden_layers {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        let (q_a, q_b, q_a_norm) = match c.q_lora_rank {
            Some(r) => (
                Some(lin(&n("attn_q_a"), &[d, r])?),
                lin(&n("attn_q_b"), &[r, nh * qh])?,
                Some(get(&n("attn_q_a_norm"), &[r])?),
            ),
            None => (None, lin(&n("attn_q"), &[d, nh * qh])?, None),
        };
        let kv_b = match g.tensor(&n("attn_kv_b")) {
            Some(_) if g.tensor(&n("attn_k_b")).is_none() => {
                KvB::Joint(lin(&n("attn_kv_b"), &[rank, nh * (nope + vd)])?)
            }
            _ => KvB::Split {
                k: lin(&n("attn_k_b"), &[nope, rank, nh])?,
                v: lin(&n("attn_v_b"), &[rank, vd, nh])?,
            },
        };
        let moe = c.is_moe_layer(l);
        let ffn = if moe {
            let split = |s: &str, shape: &[usize]| -> Result<Vec<Lin>> {
                Ok(ts
                    .stacked(&n(s), shape)?
                    .into_iter()
                    .map(Lin::Plain)
                    .collect())
            };
            let gate = split("ffn_gate_exps", &[d, eff, ne])?;
            let up = split("ffn_up_exps", &[d, eff, ne])?;
            let down = split("ffn_down_exps", &[eff, d, ne])?;
            let experts = gate
                .into_iter()
                .zip(up)
                .zip(down)
                .map(|((g, u), d)| [g, u, d])
                .collect();
            FfnTensors::Moe {
                router: lin(&n("ffn_gate_inp"), &[d, ne])?,
                shared: gate_up_down(lin, ["ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"].map(&n), d, sff)?,
                experts,
            }
        } else {
            FfnTensors::Dense(gate_up_down(lin, ["ffn_gate", "ffn_up", "ffn_down"].map(&n), d, dff)?)
        };
        layers.push(LayerTensors {
            q_a,
            q_b,
            kv_a: lin(&n("attn_kv_a_mqa"), &[d, rank + rope])?,
            kv_b,
            o: lin(&n("attn_output"), &[nh * vd, d])?,
            ffn,
            input_norm: get(&n("attn_norm"), &[d])?,
            q_a_norm,
            kv_a_norm: get(&n("attn_kv_a_norm"), &[rank])?,
            post_attn_norm: get(&n("ffn_norm"), &[d])?,
            bias: match moe {
                true => Some(get(&format!("blk.{l}.exp_probs_b.bias"), &[ne])?),
                false => None,
            },
        });
    }
    let note = match c.num_nextn_predict_layers {
        0 => String::new(),
        k => format!(", {k} multi-token-prediction layer(s) ignored"),
    };
    Ok(Checkpoint {
        files: g.files.clone(),
        pack: g.pack.clone(),
        final_norm: get("output_norm.weight", &[d])?,
        embd,
        head,
        layers,
        mtp: None,
        lora_norm_eps: c.rms_norm_eps as f32,
        note,
    })
}

/// Loads a `deepseek2` GGUF under `opts` (see `DeepseekV3::build` for what loading does).
///
/// Errors: metadata errors ([`config_from_gguf`]), a missing, mis-shaped or unsupported tensor
/// (named with the file), a budget too small to run, an unreadable file.
pub fn load(g: &GgufModel, opts: &LoadOptions) -> Result<(DeepseekV3, WeightStore)> {
    let c = config_from_gguf(g)?;
    let ck = gguf_checkpoint(&c, g)?;
    DeepseekV3::build(c, ck, opts)
}
