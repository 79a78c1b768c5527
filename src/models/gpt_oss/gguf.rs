//! GGUF files of llama.cpp's architecture `gpt-oss` into the forward pass of
//! [`super`] (the `gpt_oss` family).
//!
//! Metadata (keys `gpt-oss.*` as llama.cpp's `src/llama-arch.cpp` names them and
//! `convert_hf_to_gguf.py` / `conversion/gpt_oss.py` writes them) becomes a [`Config`] with the
//! Hugging Face field names, checked by [`Config::from_json`]:
//! - the sliding layers follow llama.cpp's pattern (`src/models/openai-moe.cpp`,
//!   `load_swa_pattern(ml, 2)`; `llama_hparams::set_swa_pattern`): layer `l` slides when
//!   `l % n < n − 1` for `attention.sliding_window_pattern` `n` (default 2: even layers slide,
//!   as transformers' default `layer_types`), or per layer when the key is an array of bools;
//!   the window is `attention.sliding_window` tokens, the current one included, as both
//!   llama.cpp (`LLAMA_SWA_TYPE_STANDARD`) and transformers count it;
//! - RoPE is NeoX-style with base `rope.freq_base`; `rope.scaling.type = yarn` gives YaRN with
//!   `rope.scaling.factor`, `rope.scaling.original_context_length` and
//!   `rope.scaling.yarn_beta_fast`/`_slow` (32 and 1 when absent), attention factor
//!   `0.1 ln(factor) + 1` on cos and sin (llama.cpp: `llama-context.cpp` sets
//!   `yarn_attn_factor` to cancel the factor `rope_yarn` in `ggml-cpu/ops.cpp` multiplies in,
//!   so the product is the same). The correction range is NOT rounded to whole dimensions
//!   (`truncate: false`, as the published GPT-OSS configs say and transformers computes);
//!   llama.cpp always rounds it (`ggml_rope_yarn_corr_dims`: floor/ceil), which is the one
//!   difference between its pass and ours (see tests/gguf_gpt_oss.rs);
//! - the clamped SwiGLU uses GPT-OSS's α = 1.702 and limit 7 (the transformers defaults;
//!   llama.cpp hard-codes the same in `build_moe_ffn`, `LLM_FFN_SWIGLU_OAI_MOE`).
//!
//! Tensors: `token_embd`, `output` (absent when tied), `output_norm`, and per layer
//! `blk.N.{attn_norm, post_attention_norm, attn_q, attn_k, attn_v, attn_output}` (weights and
//! biases), `attn_sinks.weight` (one logit per head), the router `ffn_gate_inp` (weight and
//! bias), and the stacked experts `ffn_{gate,up,down}_exps` (weight GGML shape
//! `[hidden, ff, n_experts]` / `[ff, hidden, n_experts]`, bias `[ff or hidden, n_experts]`).
//! The converter splits Hugging Face's interleaved `gate_up_proj` into `gate` (even rows) and
//! `up` (odd rows) and writes MXFP4 experts in GGML's block layout, so nothing is repacked:
//! each stacked tensor is split by byte ranges into one matrix per expert, and the store holds
//! one unit per (layer, expert).

use anyhow::{bail, Result};
use serde_json::json;

use super::{Checkpoint, Config, ExpertTensors, GptOss, LayerTensors};
use crate::models::loading::Tensors;
use crate::models::config::{gguf_arch, gguf_count, opt_gguf_count};
use crate::models::LoadOptions;
use crate::source::gguf::{GgufModel, Value};
use crate::store::WeightStore;

/// `general.architecture` of the files this loader reads.
pub const ARCHITECTURE: &str = "gpt-oss";

/// Dimension limit checked at load (a hostile file must not make us allocate terabytes).
const DIM_MAX: u64 = 1 << 20;

/// `layer_types` from `gpt-oss.attention.sliding_window_pattern` (see the module header).
fn layer_types(g: &GgufModel, n_layer: usize) -> Result<Vec<String>> {
    let key = format!("{ARCHITECTURE}.attention.sliding_window_pattern");
    let sliding: Vec<bool> = match g.get(&key) {
        None => (0..n_layer).map(|l| l % 2 == 0).collect(),
        Some(Value::Array(a)) => {
            let v: Option<Vec<bool>> = a
                .iter()
                .map(|x| match x {
                    Value::Bool(b) => Some(*b),
                    _ => None,
                })
                .collect();
            match v {
                Some(v) if v.len() == n_layer => v,
                _ => bail!(
                    "{}: metadata key '{key}' must be an integer or {n_layer} bools",
                    g.file_name()
                ),
            }
        }
        Some(_) => {
            let n = g.get_u32(&key)? as usize;
            (0..n_layer).map(|l| n == 0 || l % n < n - 1).collect()
        }
    };
    Ok(sliding
        .into_iter()
        .map(|s| {
            if s {
                "sliding_attention"
            } else {
                "full_attention"
            }
            .to_string()
        })
        .collect())
}

/// Reads the configuration of a `gpt-oss` GGUF (see the module header for the keys).
///
/// Errors name the file and the missing or invalid key: block count, embedding length, head
/// counts, key/value lengths that differ, a missing `attention.layer_norm_rms_epsilon`,
/// `attention.sliding_window`, `expert_count`, `expert_used_count` or
/// `expert_feed_forward_length`, a RoPE scaling type other than `none` or `yarn` (or YaRN
/// without its factor and original context length, or with `rope.scaling.yarn_log_multiplier`),
/// plus whatever [`Config::from_json`] refuses.
pub fn config_from_gguf(g: &GgufModel) -> Result<Config> {
    let (file, arch) = gguf_arch(g, |a| a == ARCHITECTURE, &format!("'{ARCHITECTURE}'"))?;
    let k = |s: &str| format!("{arch}.{s}");
    let n_layer = gguf_count(g, &k("block_count"), 1..=4096)?;
    let d = gguf_count(g, &k("embedding_length"), 1..=DIM_MAX)?;
    let n_head = gguf_count(g, &k("attention.head_count"), 1..=4096)?;
    let n_kv = opt_gguf_count(g, &k("attention.head_count_kv"), 1..=4096)?.unwrap_or(n_head);
    let head_dim = opt_gguf_count(g, &k("attention.key_length"), 1..=8192)?.unwrap_or(d / n_head);
    let v_len = opt_gguf_count(g, &k("attention.value_length"), 1..=8192)?.unwrap_or(head_dim);
    if v_len != head_dim {
        bail!("{file}: metadata key '{arch}.attention.value_length' {v_len} differs from key_length {head_dim}: not supported");
    }
    if let Some(n_rot) = opt_gguf_count(g, &k("rope.dimension_count"), 1..=8192)? {
        if n_rot != head_dim {
            bail!("{file}: metadata key '{arch}.rope.dimension_count' {n_rot} must equal the head size {head_dim}: partial rotary embeddings are not supported");
        }
    }
    let eps = g.get_f32(&k("attention.layer_norm_rms_epsilon"))?;
    let base = g.opt_f32(&k("rope.freq_base"))?.unwrap_or(150_000.0);
    let window = gguf_count(g, &k("attention.sliding_window"), 1..=(1 << 24))?;
    let n_expert = gguf_count(g, &k("expert_count"), 1..=(1 << 16))?;
    let used = gguf_count(g, &k("expert_used_count"), 1..=n_expert as u64)?;
    let ff = gguf_count(g, &k("expert_feed_forward_length"), 1..=DIM_MAX)?;
    let max_pos = gguf_count(g, &k("context_length"), 1..=(1 << 24))?;
    let mut rope = json!({"rope_type": "default", "rope_theta": base});
    match g.opt_str(&k("rope.scaling.type"))? {
        None | Some("none") => {}
        Some("yarn") => {
            let factor = g.get_f32(&k("rope.scaling.factor"))?;
            let orig = gguf_count(g, &k("rope.scaling.original_context_length"), 1..=(1 << 24))?;
            if let Some(m) = g.opt_f32(&k("rope.scaling.yarn_log_multiplier"))? {
                if m != 0.0 {
                    bail!("{file}: metadata key '{arch}.rope.scaling.yarn_log_multiplier' = {m} is not supported for gpt-oss");
                }
            }
            let beta_fast = g.opt_f32(&k("rope.scaling.yarn_beta_fast"))?.unwrap_or(32.0);
            let beta_slow = g.opt_f32(&k("rope.scaling.yarn_beta_slow"))?.unwrap_or(1.0);
            rope = json!({
                "rope_type": "yarn",
                "rope_theta": base,
                "factor": factor,
                "original_max_position_embeddings": orig,
                "beta_fast": beta_fast,
                "beta_slow": beta_slow,
                "truncate": false,
            });
        }
        Some(t) => bail!(
            "{file}: metadata key '{arch}.rope.scaling.type' = '{t}' is not supported (only none, yarn)"
        ),
    }
    let vocab = match g.tensor("token_embd.weight") {
        Some(t) => t.shape.get(1).copied().unwrap_or(0),
        None => bail!(
            "{}: tensor 'token_embd.weight' is missing",
            g.files[0].display()
        ),
    };
    if vocab == 0 || vocab > 1 << 24 {
        bail!("{file}: tensor 'token_embd.weight' has {vocab} rows (vocabulary size)");
    }
    let v = json!({
        "model_type": "gpt_oss",
        "vocab_size": vocab,
        "hidden_size": d,
        "intermediate_size": ff,
        "num_hidden_layers": n_layer,
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "rms_norm_eps": eps as f64,
        "rope_parameters": rope,
        "max_position_embeddings": max_pos,
        "tie_word_embeddings": g.tensor("output.weight").is_none(),
        "sliding_window": window,
        "layer_types": layer_types(g, n_layer)?,
        "num_local_experts": n_expert,
        "num_experts_per_tok": used,
    });
    Config::from_json(&v, &file)
}

/// Resolves the tensors of a `gpt-oss` GGUF for `c`, with shape and type checks; errors name
/// the file and the tensor.
fn gguf_checkpoint(c: &Config, g: &GgufModel) -> Result<Checkpoint> {
    let ts = Tensors::new(g);
    let (d, ff, qd, kvd) = (c.hidden_size, c.intermediate_size, c.q_dim(), c.kv_dim());
    let (ne, nh) = (c.num_local_experts, c.num_attention_heads);
    let get = |name: &str, shape: &[usize]| ts.get(name, shape).cloned();
    let embd = get("token_embd.weight", &[d, c.vocab_size])?;
    let head = match c.tie_word_embeddings {
        true => embd.clone(),
        false => get("output.weight", &[d, c.vocab_size])?,
    };
    let mut layers = Vec::with_capacity(c.num_hidden_layers);
    for l in 0..c.num_hidden_layers {
        let w = |s: &str| format!("blk.{l}.{s}.weight");
        let b = |s: &str| format!("blk.{l}.{s}.bias");
        let spine = [
            get(&w("attn_q"), &[d, qd])?,
            get(&w("attn_k"), &[d, kvd])?,
            get(&w("attn_v"), &[d, kvd])?,
            get(&w("attn_output"), &[qd, d])?,
            get(&w("ffn_gate_inp"), &[d, ne])?,
        ];
        let vecs = [
            get(&w("attn_norm"), &[d])?,
            get(&w("post_attention_norm"), &[d])?,
            get(&b("attn_q"), &[qd])?,
            get(&b("attn_k"), &[kvd])?,
            get(&b("attn_v"), &[kvd])?,
            get(&b("attn_output"), &[d])?,
            get(&b("ffn_gate_inp"), &[ne])?,
            get(&w("attn_sinks"), &[nh])?,
        ];
        // stacked over the experts, or listed per expert (`NAME[E]`, as in a pack)
        let stacked = [
            ts.stacked(&w("ffn_gate_exps"), &[d, ff, ne])?,
            ts.stacked(&w("ffn_up_exps"), &[d, ff, ne])?,
            ts.stacked(&w("ffn_down_exps"), &[ff, d, ne])?,
            ts.stacked(&b("ffn_gate_exps"), &[ff, ne])?,
            ts.stacked(&b("ffn_up_exps"), &[ff, ne])?,
            ts.stacked(&b("ffn_down_exps"), &[d, ne])?,
        ];
        let experts = (0..ne)
            .map(|e| ExpertTensors::Split(stacked.each_ref().map(|t| t[e].clone())))
            .collect();
        layers.push(LayerTensors {
            spine,
            vecs,
            experts,
        });
    }
    Ok(Checkpoint {
        files: g.files.clone(),
        pack: g.pack.clone(),
        embd,
        head,
        final_norm: get("output_norm.weight", &[d])?,
        layers,
        packed: None,
    })
}

/// Loads a `gpt-oss` GGUF under `opts`: one store unit per layer's spine and per (layer,
/// expert), residency planned under the RAM budget (LM head, embeddings, spine, then experts),
/// resident units read, the streamer started (as [`GptOss::load`] does for folders).
///
/// Errors: metadata errors ([`config_from_gguf`]), a missing, mis-shaped or unsupported tensor
/// (named with the file), a budget too small to run, an unreadable file.
pub fn load(g: &GgufModel, opts: &LoadOptions) -> Result<(GptOss, WeightStore)> {
    load_with_config(g, config_from_gguf(g)?, opts)
}

/// [`load`] with a configuration given instead of read from the metadata (e.g.
/// [`config_from_gguf`]'s with a field changed, to reproduce another implementation's
/// choices).
///
/// Errors: as [`load`].
pub fn load_with_config(
    g: &GgufModel,
    c: Config,
    opts: &LoadOptions,
) -> Result<(GptOss, WeightStore)> {
    let ck = gguf_checkpoint(&c, g)?;
    GptOss::build(c, ck, opts)
}
