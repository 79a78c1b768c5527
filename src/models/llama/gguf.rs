//! GGUF files of llama.cpp's architectures `qwen3moe`, `qwen3` and `llama` (dense Llama, and
//! Mixtral, which llama.cpp's converter writes as `llama` with experts) into the forward pass
//! of [`super`] (the `llama` family).
//!
//! Metadata (keys `{arch}.*` as llama.cpp's `src/llama-arch.cpp` names them and its
//! `convert_hf_to_gguf.py` writes them) becomes a [`Config`] with the Hugging Face field names.
//! Tensor names are llama.cpp's: `token_embd`, `output` (absent when tied), `output_norm`,
//! `rope_freqs` (Llama 3 RoPE factors), and per layer `blk.N.{attn_norm, attn_q, attn_k,
//! attn_v, attn_output, attn_q_norm, attn_k_norm, ffn_norm}` plus either `ffn_{gate,up,down}`
//! or the router `ffn_gate_inp` and the stacked experts `ffn_{gate,up,down}_exps` (GGML shape
//! `[hidden, ff, n_experts]` / `[ff, hidden, n_experts]`). A stacked tensor is split by byte
//! ranges into one matrix per expert (a pack of the file lists them so already, each expert's
//! three slices one record), so the store still holds one unit per (layer, expert) and reads
//! only the experts the router chose.
//!
//! RoPE: `qwen3` and `qwen3moe` use the NeoX layout; `llama` the interleaved one (the
//! converter permuted the q/k rows for it), with the frequencies divided by `rope_freqs` when
//! present (llama.cpp's `ggml_rope_ext` frequency factors). Routing is a softmax over the
//! experts with the chosen weights renormalised, which llama.cpp applies to both MoE
//! architectures (`build_moe_ffn` with `norm_w = true` in `src/models/{qwen3moe,llama}.cpp`).

use anyhow::{anyhow, bail, Context, Result};

use crate::models::config::{gguf_arch, gguf_count, opt_gguf_count};
use crate::models::loading::{gate_up_down, CheckpointFiles, Tensors};
use super::{Checkpoint, Config, FfnTensors, LayerTensors, Llama};
use crate::models::LoadOptions;
use crate::models::rope::RopeStyle;
use crate::quant::GgmlType;
use crate::source::gguf::GgufModel;
use crate::store::WeightStore;

/// Dimension limit checked at load (a hostile file must not make us allocate terabytes).
const DIM_MAX: u64 = 1 << 20;

/// The architectures this loader reads, as `general.architecture` names them.
pub const ARCHITECTURES: [&str; 3] = ["qwen3moe", "qwen3", "llama"];

/// Reads the configuration of a `qwen3moe`, `qwen3` or `llama` GGUF. Fields follow the Hugging
/// Face configs (`model_type` becomes `qwen3_moe`, `qwen3`, `mixtral` for `llama` with
/// experts, or `llama`); `mlp_only_layers` lists the layers without a router tensor (llama.cpp
/// itself requires one in every `qwen3moe` layer).
///
/// Errors name the file and the missing or invalid key: block count, embedding length, head
/// counts, key/value lengths that differ or do not match `rope.dimension_count`, a missing
/// `attention.layer_norm_rms_epsilon`, a RoPE scaling type other than `none` or `linear`,
/// expert counts without experts' widths.
pub fn config_from_gguf(g: &GgufModel) -> Result<Config> {
    let want = format!("one of {ARCHITECTURES:?}");
    let (file, arch) = gguf_arch(g, |a| ARCHITECTURES.contains(&a), &want)?;
    let k = |s: &str| format!("{arch}.{s}");
    let n_layer = gguf_count(g, &k("block_count"), 1..=4096)?;
    let d = gguf_count(g, &k("embedding_length"), 1..=DIM_MAX)?;
    let n_head = gguf_count(g, &k("attention.head_count"), 1..=4096)?;
    let n_kv = opt_gguf_count(g, &k("attention.head_count_kv"), 1..=4096)?.unwrap_or(n_head);
    if !n_head.is_multiple_of(n_kv) {
        bail!("{file}: metadata key '{arch}.attention.head_count' {n_head} is not a multiple of '{arch}.attention.head_count_kv' {n_kv}");
    }
    let head_dim = opt_gguf_count(g, &k("attention.key_length"), 1..=8192)?.unwrap_or(d / n_head);
    let v_len = opt_gguf_count(g, &k("attention.value_length"), 1..=8192)?.unwrap_or(head_dim);
    if v_len != head_dim {
        bail!("{file}: metadata key '{arch}.attention.value_length' {v_len} differs from key_length {head_dim}: not supported");
    }
    let n_rot = opt_gguf_count(g, &k("rope.dimension_count"), 1..=8192)?.unwrap_or(head_dim);
    if n_rot != head_dim || !head_dim.is_multiple_of(2) {
        bail!("{file}: metadata key '{arch}.rope.dimension_count' {n_rot} must equal the (even) head size {head_dim}: partial rotary embeddings are not supported");
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
    let rope_scaling = match g.opt_str(&k("rope.scaling.type"))? {
        None | Some("none") => None,
        Some("linear") => {
            let f = g.get_f32(&k("rope.scaling.factor"))?;
            if !(f.is_finite() && f >= 1.0) {
                bail!("{file}: metadata key '{arch}.rope.scaling.factor' = {f} must be at least 1");
            }
            Some(serde_json::json!({"rope_type": "linear", "factor": f}))
        }
        Some(t) => bail!(
            "{file}: metadata key '{arch}.rope.scaling.type' = '{t}' is not supported (only none, linear)"
        ),
    };
    let n_expert = g.opt_u64(&k("expert_count"))?.unwrap_or(0) as usize;
    let embd = g.tensor("token_embd.weight").ok_or_else(|| {
        anyhow!(
            "{}: tensor 'token_embd.weight' is missing",
            g.files[0].display()
        )
    })?;
    let vocab = embd.shape.get(1).copied().unwrap_or(0) as usize;
    let ff = opt_gguf_count(g, &k("feed_forward_length"), 1..=DIM_MAX)?;
    let (model_type, intermediate, moe_ff) = match (arch.as_str(), n_expert) {
        ("qwen3moe", _) => {
            if n_expert == 0 {
                bail!("{file}: metadata key '{arch}.expert_count' is missing or 0 (qwen3moe needs experts)");
            }
            let used = gguf_count(g, &k("expert_used_count"), 1..=n_expert as u64)?;
            // llama.cpp's fallback when the expert width is absent: n_ff / n_expert_used
            let eff = match opt_gguf_count(g, &k("expert_feed_forward_length"), 1..=DIM_MAX)? {
                Some(e) => e,
                None => ff.map(|f| f / used).filter(|&e| e > 0).ok_or_else(|| {
                    anyhow!("{file}: metadata key '{arch}.expert_feed_forward_length' is missing")
                })?,
            };
            ("qwen3_moe", ff.unwrap_or(eff), Some(eff))
        }
        ("llama", e) if e > 0 => {
            let ff = gguf_count(g, &k("feed_forward_length"), 1..=DIM_MAX)?;
            ("mixtral", ff, None)
        }
        _ => {
            let ff = gguf_count(g, &k("feed_forward_length"), 1..=DIM_MAX)?;
            (if arch == "qwen3" { "qwen3" } else { "llama" }, ff, None)
        }
    };
    let used = match n_expert {
        0 => None,
        _ => Some(gguf_count(g, &k("expert_used_count"), 1..=n_expert as u64)?),
    };
    if n_expert > 1 << 16 {
        bail!("{file}: metadata key '{arch}.expert_count' = {n_expert} is larger than 65536");
    }
    let mlp_only_layers = match model_type {
        "qwen3_moe" => (0..n_layer)
            .filter(|l| g.tensor(&format!("blk.{l}.ffn_gate_inp.weight")).is_none())
            .collect(),
        _ => vec![],
    };
    let max_pos = gguf_count(g, &k("context_length"), 1..=(1 << 24))?;
    let c = Config {
        model_type: model_type.to_string(),
        vocab_size: vocab,
        hidden_size: d,
        intermediate_size: intermediate,
        num_hidden_layers: n_layer,
        num_attention_heads: n_head,
        num_key_value_heads: Some(n_kv),
        head_dim: Some(head_dim),
        rms_norm_eps: eps as f64,
        rope_theta: Some(base as f64),
        rope_scaling,
        rope_parameters: None,
        max_position_embeddings: max_pos,
        tie_word_embeddings: g.tensor("output.weight").is_none(),
        attention_bias: false,
        hidden_act: "silu".into(),
        mlp_bias: false,
        use_sliding_window: false,
        sliding_window: None,
        num_experts: (n_expert > 0).then_some(n_expert),
        num_local_experts: None,
        num_experts_per_tok: used,
        moe_intermediate_size: moe_ff,
        norm_topk_prob: n_expert > 0,
        decoder_sparse_step: 1,
        mlp_only_layers,
    };
    if vocab == 0 || vocab as u64 > 1 << 24 {
        bail!("{file}: tensor 'token_embd.weight' has {vocab} rows (vocabulary size)");
    }
    Ok(c)
}

/// Resolves the tensors of a `qwen3moe`, `qwen3` or `llama` GGUF for `c`
/// ([`config_from_gguf`]), with shape and type checks; errors name the file and the tensor.
fn gguf_checkpoint(c: &Config, g: &GgufModel) -> Result<Checkpoint> {
    let ts = Tensors::new(g);
    let (d, ff, qd, kvd, hd) = (
        c.hidden_size,
        c.intermediate_size,
        c.q_dim(),
        c.kv_dim(),
        c.head_dim(),
    );
    let (ne, eff) = (c.n_experts(), c.expert_ff());
    let label = g.files[0].display().to_string();
    // Biases would be silently ignored: refuse them.
    if let Some(b) = g.tensors.iter().find(|t| t.name.ends_with(".bias")) {
        bail!("{label}: tensor '{}' (a bias) is not supported", b.name);
    }
    let get = |name: &str, shape: &[usize]| ts.get(name, shape).cloned();
    let embd = get("token_embd.weight", &[d, c.vocab_size])?;
    let head = match c.tie_word_embeddings {
        true => None,
        false => Some(get("output.weight", &[d, c.vocab_size])?),
    };
    let qk_norm = c.has_qk_norm();
    let mut layers = Vec::with_capacity(c.num_hidden_layers);
    for l in 0..c.num_hidden_layers {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        let attn = [
            get(&n("attn_q"), &[d, qd])?,
            get(&n("attn_k"), &[d, kvd])?,
            get(&n("attn_v"), &[d, kvd])?,
            get(&n("attn_output"), &[qd, d])?,
        ];
        let ffn = if c.is_moe_layer(l) {
            let router = get(&n("ffn_gate_inp"), &[d, ne])?;
            let gate = ts.stacked(&n("ffn_gate_exps"), &[d, eff, ne])?;
            let up = ts.stacked(&n("ffn_up_exps"), &[d, eff, ne])?;
            let down = ts.stacked(&n("ffn_down_exps"), &[eff, d, ne])?;
            let experts = gate
                .into_iter()
                .zip(up)
                .zip(down)
                .map(|((g, u), d)| [g, u, d])
                .collect();
            FfnTensors::Moe { router, experts }
        } else {
            FfnTensors::Dense(gate_up_down(get, ["ffn_gate", "ffn_up", "ffn_down"].map(&n), d, ff)?)
        };
        layers.push(LayerTensors {
            attn,
            input_norm: get(&n("attn_norm"), &[d])?,
            qk_norm: match qk_norm {
                true => Some([
                    get(&n("attn_q_norm"), &[hd])?,
                    get(&n("attn_k_norm"), &[hd])?,
                ]),
                false => None,
            },
            post_attn_norm: get(&n("ffn_norm"), &[d])?,
            ffn,
        });
    }
    let llama = g.architecture()? == "llama";
    let scaling = c
        .hf_rope()
        .scaling(c.max_position_embeddings, &["default", "linear"])
        .map_err(|e| anyhow!("{label}: {e}"))?;
    let mut inv_freq = scaling.inv_freq(hd, c.rope_base());
    if let Some(t) = g.tensor("rope_freqs.weight") {
        let t = ts.get(&t.name, &[hd / 2])?;
        if t.ty != GgmlType::F32 {
            bail!(
                "{label}: tensor 'rope_freqs.weight' has type {}, expected F32",
                t.ty
            );
        }
        let files = CheckpointFiles::open(&g.files, g.pack.as_ref(), false, true)?;
        let factors = files.vector(t).with_context(|| label.clone())?;
        for (f, &s) in inv_freq.iter_mut().zip(&factors) {
            if !(s.is_finite() && s > 0.0) {
                bail!("{label}: tensor 'rope_freqs.weight' holds {s}, expected positive factors");
            }
            *f /= s;
        }
    }
    Ok(Checkpoint {
        files: g.files.clone(),
        pack: g.pack.clone(),
        embd,
        head,
        final_norm: get("output_norm.weight", &[d])?,
        layers,
        inv_freq,
        rope: if llama {
            RopeStyle::Interleaved
        } else {
            RopeStyle::Neox
        },
    })
}

/// Loads a `qwen3moe`, `qwen3` or `llama` GGUF under `opts` (see [`Llama::load`] for what
/// loading does).
///
/// Errors: metadata errors ([`config_from_gguf`]), a missing, mis-shaped or unsupported tensor
/// (named with the file), a budget too small to run, an unreadable file.
pub fn load(g: &GgufModel, opts: &LoadOptions) -> Result<(Llama, WeightStore)> {
    let c = config_from_gguf(g)?;
    let ck = gguf_checkpoint(&c, g)?;
    Llama::build(c, ck, opts)
}
