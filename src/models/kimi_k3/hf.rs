//! The tensors of a Kimi K3 Hugging Face checkpoint, in the layout llama.cpp's converter
//! (`conversion/kimi_k3.py` of llama-cpp-python 0.3.36's vendored llama.cpp, with the tensor
//! map of `gguf-py/gguf/tensor_mapping.py`) reads, resolved into the same [`Checkpoint`] as a
//! `kimi-k3` GGUF. The text model sits under `language_model.`, which
//! [`crate::source::hf::HfModel::open`] removes; `vision_tower.*` and `mm_projector.*` are
//! never read. Shapes below are Hugging Face's `[out, in]`:
//!
//! - `model.embed_tokens.weight`, `lm_head.weight` (absent when tied), `model.norm.weight`, and
//!   with attention residuals `model.output_attn_res_{norm,proj}.weight` (`[d]`, `[1, d]`: the
//!   score vector is their elementwise product, as the converter fuses them);
//! - per layer `model.layers.L.`: `input_layernorm`, `post_attention_layernorm`, with attention
//!   residuals `self_attention_res_{norm,proj}` and `mlp_res_{norm,proj}`;
//! - KDA layers `self_attn.`: `{q,k,v}_proj` `[dim, d]`, `{q,k,v}_conv1d` `[dim, 1, kernel]` (or
//!   `[dim, kernel]`), `f_a_proj` `[head_dim, d]`, `f_b_proj` `[dim, head_dim]`, `b_proj`
//!   `[heads, d]`, the full-rank gate `g_proj` `[dim, d]`, `A_log` (`heads` values, any
//!   shape), `dt_bias` `[dim]`, `o_norm` `[head_dim]`, `o_proj` `[d, dim]`;
//! - MLA layers `self_attn.`: `q_proj` (or `q_a_proj`, `q_a_layernorm`, `q_b_proj`),
//!   `kv_a_proj_with_mqa`, `kv_a_layernorm`, the joint `kv_b_proj`, the optional output gate
//!   `g_proj` `[heads · v, d]`, `o_proj`;
//! - dense layers (the first `first_k_dense_replace`): `mlp.{gate,up,down}_proj`;
//! - MoE layers `block_sparse_moe.`: `gate.weight` `[experts, d]`,
//!   `gate.e_score_correction_bias`, `shared_experts.{gate,up,down}_proj`, the latent
//!   `routed_expert_down_proj` `[latent, d]`, `routed_expert_up_proj` `[d, latent]`,
//!   `routed_expert_norm` (used when present, as llama.cpp does; required when
//!   `latent_moe_use_norm`), and per expert
//!   `experts.E.{w1,w3,w2}` (gate, up, down) as `.weight`, or, with a compressed-tensors MXFP4
//!   `quantization_config`, as `.weight_packed` + `.weight_scale` ([`super::mxfp4`]).

use anyhow::{bail, Result};
use serde_json::Value;

use super::config::{merged_text_config, Config};
use super::gguf::{Checkpoint, FfnTensors, LayerTensors, MixTensors, Score};
use crate::models::layers::hybrid::Mixer;
use crate::models::loading::{gate_up_down, Tensors};
use crate::quant::GgmlType;
use crate::source::hf::HfModel;
use crate::source::tensor::TensorInfo;

/// The compressed-tensors format of MXFP4 weights (`quantization_config.format`).
pub const MXFP4_FORMAT: &str = "mxfp4-pack-quantized";

/// How the routed experts are stored, from `quantization_config` (`text_config`'s over the top
/// level's).
///
/// Errors: a `quantization_config` other than compressed-tensors `mxfp4-pack-quantized` (its
/// `format`, or every config group's), named with its method and format.
pub(crate) fn experts_mxfp4(root: &Value, label: &str) -> Result<bool> {
    let v = merged_text_config(root);
    let Some(q) = v.get("quantization_config").filter(|x| !x.is_null()) else {
        return Ok(false);
    };
    let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("");
    let groups: Vec<&str> = q
        .get("config_groups")
        .and_then(Value::as_object)
        .map(|g| g.values().filter_map(|x| x.get("format").and_then(Value::as_str)).collect())
        .unwrap_or_default();
    let format = q.get("format").and_then(Value::as_str);
    let mxfp4 = match format {
        Some(f) => f == MXFP4_FORMAT,
        None => !groups.is_empty() && groups.iter().all(|f| *f == MXFP4_FORMAT),
    };
    let mxfp4 = mxfp4 && groups.iter().all(|f| *f == MXFP4_FORMAT);
    if method != "compressed-tensors" || !mxfp4 {
        bail!(
            "{label}: 'quantization_config' (quant_method '{method}', format '{}') is not supported for kimi_k3 (only compressed-tensors {MXFP4_FORMAT} routed experts)",
            format.map_or_else(|| groups.join(","), str::to_string)
        );
    }
    // MXFP4 is 4-bit floats in groups of 32 (OCP Microscaling v1.0): a group that says otherwise
    // is not what the repack reads
    for (name, g) in q.get("config_groups").and_then(Value::as_object).into_iter().flatten() {
        let w = g.get("weights");
        let field = |k: &str| w.and_then(|w| w.get(k)).filter(|x| !x.is_null());
        for (k, want) in [("num_bits", serde_json::json!(4)), ("group_size", serde_json::json!(32)), ("type", serde_json::json!("float"))] {
            if let Some(x) = field(k).filter(|x| **x != want) {
                bail!("{label}: 'quantization_config.config_groups.{name}.weights.{k}' = {x} is not MXFP4's {want}");
            }
        }
    }
    Ok(true)
}

/// The configuration check `pack` runs: `config.json` as [`super::load_hf`] reads it.
pub(crate) fn check(h: &HfModel) -> Result<()> {
    let label = h.dir.join("config.json").display().to_string();
    Config::from_hf_json(&h.config, &label)?;
    experts_mxfp4(&h.config, &label).map(drop)
}

/// Resolves the tensors of a Kimi K3 folder for `c`, with shape and type checks; errors name
/// the folder and the tensor.
pub(crate) fn checkpoint(c: &Config, h: &HfModel) -> Result<Checkpoint> {
    let label = h.dir.display().to_string();
    let mxfp4 = experts_mxfp4(&h.config, &h.dir.join("config.json").display().to_string())?;
    let latent_norm = match merged_text_config(&h.config).get("latent_moe_use_norm") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(x) => bail!("{}: 'latent_moe_use_norm' = {x} is not a boolean", h.dir.join("config.json").display()),
    };
    let ts = Tensors::hf(label.clone(), &h.tensors);
    let has = |name: &str| ts.by_name.contains_key(name);
    let d = c.hidden_size;
    let get = |name: &str, shape: &[usize]| -> Result<TensorInfo> { Ok(ts.get(name, shape)?.clone()) };
    let vector = |name: &str, n: usize| -> Result<TensorInfo> { Ok(ts.vector(name, n)?.clone()) };
    let score = |pre: &str| -> Result<Score> { Ok(vec![get(&format!("{pre}_norm.weight"), &[d])?, vector(&format!("{pre}_proj.weight"), d)?]) };
    let embd = get("model.embed_tokens.weight", &[d, c.vocab_size])?;
    let head = match c.tie_word_embeddings {
        true => embd.clone(),
        false => get("lm_head.weight", &[d, c.vocab_size])?,
    };
    let res = c.attn_res_block_size > 0;
    let (hd, dim, nh) = (c.kda_head_dim, c.kda_dim(), c.num_heads);
    let (nope, vd, rank) = (c.qk_nope_head_dim, c.v_head_dim, c.kv_lora_rank);
    let qh = nope + c.qk_rope_head_dim;
    let (ne, eff, w) = (c.moe.experts, c.moe.expert_ff, c.routed_width());
    let mut layers = Vec::with_capacity(c.num_hidden_layers);
    for l in 0..c.num_hidden_layers {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        let a = |s: &str| p(&format!("self_attn.{s}"));
        let mix = match c.mixers[l] {
            Mixer::Kda => {
                let kc = c.conv_kernel;
                let conv = |x: &str| -> Result<TensorInfo> {
                    let name = a(&format!("{x}_conv1d.weight"));
                    match ts.by_name.get(name.as_str()).map(|t| t.shape.len()) {
                        Some(2) => get(&name, &[kc, dim]),
                        _ => get(&name, &[kc, 1, dim]),
                    }
                };
                MixTensors::Kda {
                    mats: Box::new([
                        get(&a("q_proj.weight"), &[d, dim])?,
                        get(&a("k_proj.weight"), &[d, dim])?,
                        get(&a("v_proj.weight"), &[d, dim])?,
                        get(&a("f_a_proj.weight"), &[d, hd])?,
                        get(&a("f_b_proj.weight"), &[hd, dim])?,
                        get(&a("b_proj.weight"), &[d, nh])?,
                        get(&a("g_proj.weight"), &[d, dim])?,
                        get(&a("o_proj.weight"), &[dim, d])?,
                    ]),
                    conv: Box::new([conv("q")?, conv("k")?, conv("v")?]),
                    a: vector(&a("A_log"), nh)?,
                    dt_bias: get(&a("dt_bias"), &[dim])?,
                    o_norm: get(&a("o_norm.weight"), &[hd])?,
                }
            }
            Mixer::Mla => {
                let mut mats = Vec::new();
                let q_a_norm = match c.q_lora_rank {
                    Some(r) => {
                        mats.push(get(&a("q_a_proj.weight"), &[d, r])?);
                        mats.push(get(&a("q_b_proj.weight"), &[r, nh * qh])?);
                        Some(get(&a("q_a_layernorm.weight"), &[r])?)
                    }
                    None => {
                        mats.push(get(&a("q_proj.weight"), &[d, nh * qh])?);
                        None
                    }
                };
                mats.push(get(&a("kv_a_proj_with_mqa.weight"), &[d, c.latent_dim()])?);
                mats.push(get(&a("kv_b_proj.weight"), &[rank, nh * (nope + vd)])?);
                let gate = match has(&a("g_proj.weight")) {
                    true => Some(get(&a("g_proj.weight"), &[d, nh * vd])?),
                    false => None,
                };
                let has_gate = gate.is_some();
                mats.extend(gate);
                mats.push(get(&a("o_proj.weight"), &[nh * vd, d])?);
                MixTensors::Mla {
                    mats,
                    split: false,
                    gate: has_gate,
                    q_a_norm,
                    kv_a_norm: get(&a("kv_a_layernorm.weight"), &[rank])?,
                }
            }
        };
        let ffn = if c.is_moe(l) {
            let m = |s: &str| p(&format!("block_sparse_moe.{s}"));
            let sff = eff * c.moe.shared.max(1);
            let names = ["gate_proj", "up_proj", "down_proj"].map(|w| m(&format!("shared_experts.{w}.weight")));
            let shared = match c.moe.shared > 0 {
                true => Some(Box::new(gate_up_down(get, names, d, sff)?)),
                false => None,
            };
            let (routed_down, routed_up, routed_norm) = match c.latent {
                Some(lat) => (
                    Some(get(&m("routed_expert_down_proj.weight"), &[d, lat])?),
                    Some(get(&m("routed_expert_up_proj.weight"), &[lat, d])?),
                    // used whenever present, as llama.cpp does (`kimi-k3.cpp`); required when
                    // the config says the latent MoE is normed
                    match latent_norm || has(&m("routed_expert_norm.weight")) {
                        true => Some(get(&m("routed_expert_norm.weight"), &[lat])?),
                        false => None,
                    },
                ),
                None => (None, None, None),
            };
            let (mut experts, mut scales) = (Vec::with_capacity(ne), Vec::new());
            for e in 0..ne {
                let x = |wn: &str, s: &str| m(&format!("experts.{e}.{wn}.{s}"));
                // gate (w1) and up (w3) read the routed width, down (w2) writes it
                let dims = [("w1", w, eff), ("w3", w, eff), ("w2", eff, w)];
                match mxfp4 {
                    false => {
                        let [(g, gc, gr), (u, uc, ur), (dn, dc, dr)] = dims;
                        experts.push([
                            get(&x(g, "weight"), &[gc, gr])?,
                            get(&x(u, "weight"), &[uc, ur])?,
                            get(&x(dn, "weight"), &[dc, dr])?,
                        ]);
                    }
                    true => {
                        let mut packed = Vec::new();
                        let mut scale = Vec::new();
                        for (wn, cols, rows) in dims {
                            if !cols.is_multiple_of(32) {
                                bail!("{label}: expert '{}' rows of {cols} values are not whole MXFP4 groups of 32", x(wn, "weight_packed"));
                            }
                            packed.push(ts.get_raw(&x(wn, "weight_packed"), &[cols / 2, rows], GgmlType::I8)?.clone());
                            scale.push(ts.get_raw(&x(wn, "weight_scale"), &[cols / 32, rows], GgmlType::I8)?.clone());
                        }
                        experts.push(packed.try_into().expect("three"));
                        scales.push(scale.try_into().expect("three"));
                    }
                }
            }
            FfnTensors::Moe {
                router: get(&m("gate.weight"), &[d, ne])?,
                bias: get(&m("gate.e_score_correction_bias"), &[ne])?,
                shared,
                routed_down,
                routed_up,
                routed_norm,
                experts,
                scales,
            }
        } else {
            let ff = c.moe.dense_ff;
            FfnTensors::Dense(Box::new(gate_up_down(get, ["mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"].map(&p), d, ff)?))
        };
        layers.push(LayerTensors {
            mix,
            ffn,
            attn_norm: get(&p("input_layernorm.weight"), &[d])?,
            ffn_norm: get(&p("post_attention_layernorm.weight"), &[d])?,
            res: match res {
                true => Some((score(&p("self_attention_res"))?, score(&p("mlp_res"))?)),
                false => None,
            },
        });
    }
    Ok(Checkpoint {
        final_norm: get("model.norm.weight", &[d])?,
        output_res: match res {
            true => Some(score("model.output_attn_res")?),
            false => None,
        },
        embd,
        head,
        layers,
        a_neg_exp: false,
    })
}
