//! The tensors of a Kimi Linear Hugging Face checkpoint (the published layout, which
//! transformers 5.24 reads through its `kimi_linear` weight conversions and writes back),
//! resolved and checked against the config into one list ([`Checkpoint`]).
//!
//! Per layer `model.layers.L.`: `input_layernorm`, `post_attention_layernorm`; KDA layers
//! `self_attn.{q,k,v}_proj`, `self_attn.{q,k,v}_conv1d.weight` (`[dim, 1, kernel]` or
//! `[dim, kernel]`), `self_attn.{f_a,f_b,b,g_a,g_b,o}_proj`, `self_attn.A_log`
//! (`[1, 1, heads, 1]`), `self_attn.dt_bias`, `self_attn.o_norm`; MLA layers `self_attn.q_proj`
//! (or `q_a_proj`, `q_a_layernorm`, `q_b_proj`), `kv_a_proj_with_mqa`, `kv_a_layernorm`,
//! `kv_b_proj`, `o_proj`; dense layers `mlp.{gate,up,down}_proj` (or
//! `block_sparse_moe.{gate,up,down}_proj`, as transformers 5.24 writes them); MoE layers
//! `block_sparse_moe.gate.weight`, `block_sparse_moe.gate.e_score_correction_bias`,
//! `block_sparse_moe.shared_experts.{gate,up,down}_proj` and the routed experts
//! `block_sparse_moe.experts.E.{w1,w3,w2}` (gate, up, down).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{anyhow, bail, Result};

use super::config::Config;
use crate::models::layers::hybrid::Mixer;
use crate::models::loading::{gate_up_down, Tensors};
use crate::source::hf::HfModel;
use crate::source::pack::PackInfo;
use crate::source::tensor::TensorInfo;

/// A KDA layer's tensors.
pub(crate) struct KdaTensors {
    /// `q_proj`, `k_proj`, `v_proj`, `f_a_proj`, `f_b_proj`, `b_proj`, `g_a_proj`,
    /// `g_b_proj`, `o_proj`, in that order.
    pub mats: [TensorInfo; 9],
    /// `q_conv1d`, `k_conv1d`, `v_conv1d`.
    pub conv: [TensorInfo; 3],
    /// `A_log` (Hugging Face) or `−exp(A_log)` (GGUF `ssm_a`), as [`Checkpoint::a_neg_exp`] says.
    pub a_log: TensorInfo,
    pub dt_bias: TensorInfo,
    pub o_norm: TensorInfo,
}

/// An MLA layer's tensors.
pub(crate) struct MlaTensors {
    /// `q_a_proj` and its norm, with `q_b_proj` in `q`; or `None` and `q` is `q_proj`.
    pub q_a: Option<(TensorInfo, TensorInfo)>,
    pub q: TensorInfo,
    pub kv_a: TensorInfo,
    pub kv_a_norm: TensorInfo,
    pub kv_b: KvB,
    pub o: TensorInfo,
}

/// An MLA layer's `kv_b_proj`: joint (Hugging Face) or split as llama.cpp's converter writes it
/// (`attn_k_b`, each head's key rows transposed, and `attn_v_b`; see
/// [`crate::models::layers::mla::MlaWeights`]).
pub(crate) enum KvB {
    Joint(TensorInfo),
    Split { k: TensorInfo, v: TensorInfo },
}

/// A layer's token mixer.
pub(crate) enum MixTensors {
    Kda(Box<KdaTensors>),
    Mla(Box<MlaTensors>),
}

/// A layer's feed-forward part.
pub(crate) enum FfnTensors {
    /// gate, up, down.
    Dense([TensorInfo; 3]),
    Moe {
        router: TensorInfo,
        bias: TensorInfo,
        /// Shared experts' gate, up, down.
        shared: [TensorInfo; 3],
        /// Each routed expert's gate (`w1`), up (`w3`), down (`w2`).
        experts: Vec<[TensorInfo; 3]>,
    },
}

/// One layer's checked tensors.
pub(crate) struct LayerTensors {
    pub mix: MixTensors,
    pub ffn: FfnTensors,
    pub input_norm: TensorInfo,
    pub post_attn_norm: TensorInfo,
}

/// Every tensor the forward pass reads.
pub(crate) struct Checkpoint {
    pub files: Vec<PathBuf>,
    pub pack: Option<Arc<PackInfo>>,
    pub embd: TensorInfo,
    pub head: TensorInfo,
    pub final_norm: TensorInfo,
    pub layers: Vec<LayerTensors>,
    /// The KDA layers' `a_log` tensors hold `−exp(A_log)` (llama.cpp's converter applies it).
    pub a_neg_exp: bool,
    /// `eps` of the latent norms (`q_a_layernorm`, `kv_a_layernorm`).
    pub lora_eps: f32,
}

/// `eps` of `q_a_layernorm` / `kv_a_layernorm` in Hugging Face checkpoints (transformers'
/// `KimiLinearRMSNorm` default).
pub(crate) const HF_LORA_NORM_EPS: f32 = 1e-6;

/// Resolves the tensors of a Kimi Linear folder for `c`: presence, shape (GGML order) and a
/// type with kernels for each.
///
/// Errors: a missing or mis-shaped tensor, named with the folder.
pub(crate) fn hf_checkpoint(c: &Config, hf: &HfModel) -> Result<Checkpoint> {
    let label = hf.dir.display().to_string();
    let ts = Tensors::hf(label.clone(), &hf.tensors);
    let d = c.hidden_size;
    let get = |name: &str, shape: &[usize]| -> Result<TensorInfo> { Ok(ts.get(name, shape)?.clone()) };
    let embd = get("model.embed_tokens.weight", &[d, c.vocab_size])?;
    let head = match c.tie_word_embeddings {
        true => embd.clone(),
        false => get("lm_head.weight", &[d, c.vocab_size])?,
    };
    let (hd, dim, nh) = (c.linear_head_dim, c.kda_dim(), c.num_attention_heads);
    let (ne, eff, sff) = (
        c.n_routed_experts,
        c.moe_intermediate_size,
        c.moe_intermediate_size * c.n_shared_experts,
    );
    let mut layers = Vec::with_capacity(c.num_hidden_layers);
    for l in 0..c.num_hidden_layers {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        let a = |s: &str| format!("model.layers.{l}.self_attn.{s}");
        let mix = match c.mixers[l] {
            Mixer::Kda => {
                let conv = |x: &str| -> Result<TensorInfo> {
                    let name = a(&format!("{x}_conv1d.weight"));
                    let t = ts
                        .by_name
                        .get(name.as_str())
                        .ok_or_else(|| anyhow!("{label}: tensor '{name}' is missing"))?;
                    let k = c.linear_conv_kernel_dim;
                    let shape = match t.shape.len() {
                        2 => vec![k, dim],
                        _ => vec![k, 1, dim],
                    };
                    get(&name, &shape)
                };
                MixTensors::Kda(Box::new(KdaTensors {
                    mats: [
                        get(&a("q_proj.weight"), &[d, dim])?,
                        get(&a("k_proj.weight"), &[d, dim])?,
                        get(&a("v_proj.weight"), &[d, dim])?,
                        get(&a("f_a_proj.weight"), &[d, hd])?,
                        get(&a("f_b_proj.weight"), &[hd, dim])?,
                        get(&a("b_proj.weight"), &[d, c.linear_num_heads])?,
                        get(&a("g_a_proj.weight"), &[d, hd])?,
                        get(&a("g_b_proj.weight"), &[hd, dim])?,
                        get(&a("o_proj.weight"), &[dim, d])?,
                    ],
                    conv: [conv("q")?, conv("k")?, conv("v")?],
                    a_log: get(&a("A_log"), &[1, c.linear_num_heads, 1, 1])?,
                    dt_bias: get(&a("dt_bias"), &[dim])?,
                    o_norm: get(&a("o_norm.weight"), &[hd])?,
                }))
            }
            Mixer::Mla => MixTensors::Mla(Box::new(MlaTensors {
                q_a: match c.q_lora_rank {
                    Some(r) => Some((
                        get(&a("q_a_proj.weight"), &[d, r])?,
                        get(&a("q_a_layernorm.weight"), &[r])?,
                    )),
                    None => None,
                },
                q: match c.q_lora_rank {
                    Some(r) => get(&a("q_b_proj.weight"), &[r, nh * c.qk_head_dim()])?,
                    None => get(&a("q_proj.weight"), &[d, nh * c.qk_head_dim()])?,
                },
                kv_a: get(&a("kv_a_proj_with_mqa.weight"), &[d, c.latent_dim()])?,
                kv_a_norm: get(&a("kv_a_layernorm.weight"), &[c.kv_lora_rank])?,
                kv_b: KvB::Joint(get(
                    &a("kv_b_proj.weight"),
                    &[c.kv_lora_rank, nh * (c.qk_nope_head_dim + c.v_head_dim)],
                )?),
                o: get(&a("o_proj.weight"), &[nh * c.v_head_dim, d])?,
            })),
        };
        let ffn = if c.moe[l] {
            let m = |s: &str| p(&format!("block_sparse_moe.{s}"));
            let experts = (0..ne)
                .map(|e| {
                    let x = |w: &str| m(&format!("experts.{e}.{w}.weight"));
                    gate_up_down(get, ["w1", "w3", "w2"].map(&x), d, eff)
                })
                .collect::<Result<Vec<_>>>()?;
            let shared = ["gate_proj", "up_proj", "down_proj"].map(|w| m(&format!("shared_experts.{w}.weight")));
            FfnTensors::Moe {
                router: get(&m("gate.weight"), &[d, ne])?,
                bias: get(&m("gate.e_score_correction_bias"), &[ne])?,
                shared: gate_up_down(get, shared, d, sff)?,
                experts,
            }
        } else {
            let ff = c.intermediate_size;
            // published: `mlp.`; transformers 5.24 writes the dense MLP under
            // `block_sparse_moe.` too (its `mlp.` ↔ `block_sparse_moe.` renaming, reversed)
            let pre = match ts.by_name.contains_key(p("mlp.gate_proj.weight").as_str()) {
                true => "mlp",
                false if ts.by_name.contains_key(p("block_sparse_moe.gate_proj.weight").as_str()) => "block_sparse_moe",
                false => "mlp",
            };
            let m = |s: &str| p(&format!("{pre}.{s}"));
            FfnTensors::Dense(gate_up_down(get, ["gate_proj.weight", "up_proj.weight", "down_proj.weight"].map(&m), d, ff)?)
        };
        layers.push(LayerTensors {
            mix,
            ffn,
            input_norm: get(&p("input_layernorm.weight"), &[d])?,
            post_attn_norm: get(&p("post_attention_layernorm.weight"), &[d])?,
        });
    }
    if layers.is_empty() {
        bail!("{label}: no layers");
    }
    Ok(Checkpoint {
        files: hf.files.clone(),
        pack: hf.pack.clone(),
        final_norm: get("model.norm.weight", &[d])?,
        embd,
        head,
        layers,
        a_neg_exp: false,
        lora_eps: HF_LORA_NORM_EPS,
    })
}
