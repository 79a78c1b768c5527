//! The tensors of a `kimi-k3` GGUF (llama.cpp's `src/models/kimi-k3.cpp`,
//! `load_arch_tensors`; names from `src/llama-arch.cpp`), resolved and checked against the
//! [`Config`] (GGML shapes, `[cols, rows]`):
//!
//! - `token_embd` `[d, vocab]`, `output` (absent when tied), `output_norm` `[d]`,
//!   `output_res_score` `[d]` (with attention residuals);
//! - per layer `blk.N.`: `attn_norm`, `ffn_norm`, and with attention residuals
//!   `attn_res_score`, `ffn_res_score` (`[d]`: the converter's fused `*_res_norm × *_res_proj`);
//! - KDA layers: `attn_{q,k,v}` `[d, dim]`, `ssm_conv1d_{q,k,v}` `[kernel, 1, dim(, 1)]`,
//!   `ssm_f_a` `[d, head_dim]`, `ssm_f_b` `[head_dim, dim]`, `ssm_beta` `[d, heads]`, `ssm_a`
//!   (`−exp(A_log)`, `heads` values: `[1, heads, 1, 1]` from the converter), `ssm_dt.bias` `[dim]`, the full-rank gate `ssm_g` `[d, dim]`,
//!   `ssm_norm` `[head_dim]`, `attn_output` `[dim, d]`;
//! - MLA layers: `attn_q` (or `attn_q_a`, `attn_q_a_norm`, `attn_q_b`), `attn_kv_a_mqa`,
//!   `attn_kv_a_norm`, `attn_k_b` + `attn_v_b` (or the joint `attn_kv_b`), the optional output
//!   gate `attn_gate` `[d, heads·v]`, `attn_output`;
//! - dense layers (the first `leading_dense_block_count`): `ffn_{gate,up,down}`;
//! - MoE layers: `ffn_gate_inp` `[d, experts]`, `exp_probs_b.bias`, the stacked experts
//!   `ffn_{gate,up}_exps` `[w, ff, experts]` and `ffn_down_exps` `[ff, w, experts]` (`w` the
//!   latent width), with a latent `ffn_routed_down` `[d, latent]`, `ffn_routed_up`
//!   `[latent, d]` and the optional `ffn_routed_norm` `[latent]`; the optional shared experts
//!   `ffn_{gate,up,down}_shexp` (width `ff × shared count`).

use anyhow::Result;

use super::config::Config;
use crate::models::layers::hybrid::Mixer;
use crate::models::loading::either;
use crate::models::loading::{gate_up_down, Tensors};
use crate::source::gguf::GgufModel;
use crate::source::tensor::TensorInfo;

/// A layer's token-mixer tensors.
pub(crate) enum MixTensors {
    /// Matrices `q`, `k`, `v`, `f_a`, `f_b`, `beta`, `g`, `o`; vectors: the three convolutions,
    /// `ssm_a`, `dt_bias`, `o_norm`.
    Kda { mats: Box<[TensorInfo; 8]>, conv: Box<[TensorInfo; 3]>, a: TensorInfo, dt_bias: TensorInfo, o_norm: TensorInfo },
    /// Matrices (in spine order): `q_a` (when `q_lora_rank`), `q` (`q_b` or `q`), `kv_a`,
    /// `kv_b` (joint, or `k_b` then `v_b` when `split`), `gate` (when present), `o`; norms
    /// `q_a_norm` (when `q_lora_rank`) and `kv_a_norm`.
    Mla { mats: Vec<TensorInfo>, split: bool, gate: bool, q_a_norm: Option<TensorInfo>, kv_a_norm: TensorInfo },
}

/// A layer's feed-forward tensors.
// one per layer, built once at load: the size difference does not matter
#[allow(clippy::large_enum_variant)]
pub(crate) enum FfnTensors {
    /// gate, up, down.
    Dense(Box<[TensorInfo; 3]>),
    Moe {
        router: TensorInfo,
        bias: TensorInfo,
        /// Shared experts' gate, up, down.
        shared: Option<Box<[TensorInfo; 3]>>,
        /// `ffn_routed_down` (latent MoE).
        routed_down: Option<TensorInfo>,
        /// `ffn_routed_up` (latent MoE; the layer's tail unit).
        routed_up: Option<TensorInfo>,
        routed_norm: Option<TensorInfo>,
        /// Each routed expert's gate, up, down (compressed-tensors MXFP4: their
        /// `weight_packed` nibbles).
        experts: Vec<[TensorInfo; 3]>,
        /// Compressed-tensors MXFP4 experts: each expert's gate, up, down `weight_scale`
        /// (E8M0, one byte per 32 elements); empty for experts in a GGML type.
        scales: Vec<[TensorInfo; 3]>,
    },
}

/// An attention-residual score vector `[d]`: the elementwise product of these tensors (GGUF:
/// the converter's fused `*_res_score`; Hugging Face: `*_res_norm` and `*_res_proj`).
pub(crate) type Score = Vec<TensorInfo>;

/// One layer's tensors.
pub(crate) struct LayerTensors {
    pub mix: MixTensors,
    pub ffn: FfnTensors,
    pub attn_norm: TensorInfo,
    pub ffn_norm: TensorInfo,
    /// The mixer's and the feed-forward block's scores (with attention residuals).
    pub res: Option<(Score, Score)>,
}

/// A K3 GGUF's checked tensors.
pub(crate) struct Checkpoint {
    pub embd: TensorInfo,
    pub head: TensorInfo,
    pub final_norm: TensorInfo,
    pub output_res: Option<Score>,
    pub layers: Vec<LayerTensors>,
    /// The KDA layers' `a` tensors hold `−exp(A_log)` (GGUF `ssm_a`), not `A_log`.
    pub a_neg_exp: bool,
}

/// Resolves the tensors of a `kimi-k3` GGUF for `c`, with shape and type checks; errors name
/// the file and the tensor.
pub(crate) fn checkpoint(c: &Config, g: &GgufModel) -> Result<Checkpoint> {
    let ts = Tensors::new(g);
    let d = c.hidden_size;
    let get = |name: &str, shape: &[usize]| -> Result<TensorInfo> { Ok(ts.get(name, shape)?.clone()) };
    let opt = |name: &str, shape: &[usize]| -> Result<Option<TensorInfo>> {
        g.tensor(name).map(|_| get(name, shape)).transpose()
    };
    let embd = get("token_embd.weight", &[d, c.vocab_size])?;
    let head = match c.tie_word_embeddings {
        true => embd.clone(),
        false => get("output.weight", &[d, c.vocab_size])?,
    };
    let res = c.attn_res_block_size > 0;
    let (hd, dim, nh) = (c.kda_head_dim, c.kda_dim(), c.num_heads);
    let (nope, vd, rank) = (c.qk_nope_head_dim, c.v_head_dim, c.kv_lora_rank);
    let qh = nope + c.qk_rope_head_dim;
    let (ne, eff, w) = (c.moe.experts, c.moe.expert_ff, c.routed_width());
    let mut layers = Vec::with_capacity(c.num_hidden_layers);
    for l in 0..c.num_hidden_layers {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        let mix = match c.mixers[l] {
            Mixer::Kda => {
                let kc = c.conv_kernel;
                let conv = |x: &str| either(&ts, &n(&format!("ssm_conv1d_{x}")), &[kc, 1, dim, 1], &[kc, 1, dim]);
                MixTensors::Kda {
                    mats: Box::new([
                        get(&n("attn_q"), &[d, dim])?,
                        get(&n("attn_k"), &[d, dim])?,
                        get(&n("attn_v"), &[d, dim])?,
                        get(&n("ssm_f_a"), &[d, hd])?,
                        get(&n("ssm_f_b"), &[hd, dim])?,
                        get(&n("ssm_beta"), &[d, nh])?,
                        get(&n("ssm_g"), &[d, dim])?,
                        get(&n("attn_output"), &[dim, d])?,
                    ]),
                    conv: Box::new([conv("q")?, conv("k")?, conv("v")?]),
                    // `[heads]`, or `[1, heads, 1, 1]` as the converter writes it
                    a: ts.vector(&format!("blk.{l}.ssm_a"), nh)?.clone(),
                    dt_bias: get(&format!("blk.{l}.ssm_dt.bias"), &[dim])?,
                    o_norm: get(&n("ssm_norm"), &[hd])?,
                }
            }
            Mixer::Mla => {
                let mut mats = Vec::new();
                let q_a_norm = match c.q_lora_rank {
                    Some(r) => {
                        mats.push(get(&n("attn_q_a"), &[d, r])?);
                        mats.push(get(&n("attn_q_b"), &[r, nh * qh])?);
                        Some(get(&n("attn_q_a_norm"), &[r])?)
                    }
                    None => {
                        mats.push(get(&n("attn_q"), &[d, nh * qh])?);
                        None
                    }
                };
                mats.push(get(&n("attn_kv_a_mqa"), &[d, c.latent_dim()])?);
                let split = g.tensor(&n("attn_k_b")).is_some() || g.tensor(&n("attn_kv_b")).is_none();
                if split {
                    mats.push(get(&n("attn_k_b"), &[nope, rank, nh])?);
                    mats.push(get(&n("attn_v_b"), &[rank, vd, nh])?);
                } else {
                    mats.push(get(&n("attn_kv_b"), &[rank, nh * (nope + vd)])?);
                }
                let gate = opt(&n("attn_gate"), &[d, nh * vd])?;
                let has_gate = gate.is_some();
                mats.extend(gate);
                mats.push(get(&n("attn_output"), &[nh * vd, d])?);
                MixTensors::Mla { mats, split, gate: has_gate, q_a_norm, kv_a_norm: get(&n("attn_kv_a_norm"), &[rank])? }
            }
        };
        let ffn = if c.is_moe(l) {
            let split = |s: &str, shape: &[usize]| ts.stacked(&n(s), shape);
            let gate = split("ffn_gate_exps", &[w, eff, ne])?;
            let up = split("ffn_up_exps", &[w, eff, ne])?;
            let down = split("ffn_down_exps", &[eff, w, ne])?;
            let sff = eff * c.moe.shared.max(1);
            let shared = match g.tensor(&n("ffn_gate_shexp")) {
                Some(_) => Some(Box::new(gate_up_down(get, ["ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"].map(&n), d, sff)?)),
                None => None,
            };
            let (routed_down, routed_up, routed_norm) = match c.latent {
                Some(lat) => (
                    Some(get(&n("ffn_routed_down"), &[d, lat])?),
                    Some(get(&n("ffn_routed_up"), &[lat, d])?),
                    opt(&n("ffn_routed_norm"), &[lat])?,
                ),
                None => (None, None, None),
            };
            FfnTensors::Moe {
                router: get(&n("ffn_gate_inp"), &[d, ne])?,
                bias: get(&format!("blk.{l}.exp_probs_b.bias"), &[ne])?,
                shared,
                routed_down,
                routed_up,
                routed_norm,
                experts: gate.into_iter().zip(up).zip(down).map(|((g, u), d)| [g, u, d]).collect(),
                scales: Vec::new(),
            }
        } else {
            let ff = c.moe.dense_ff;
            FfnTensors::Dense(Box::new(gate_up_down(get, ["ffn_gate", "ffn_up", "ffn_down"].map(&n), d, ff)?))
        };
        layers.push(LayerTensors {
            mix,
            ffn,
            attn_norm: get(&n("attn_norm"), &[d])?,
            ffn_norm: get(&n("ffn_norm"), &[d])?,
            res: match res {
                true => Some((vec![get(&n("attn_res_score"), &[d])?], vec![get(&n("ffn_res_score"), &[d])?])),
                false => None,
            },
        });
    }
    Ok(Checkpoint {
        final_norm: get("output_norm.weight", &[d])?,
        output_res: match res {
            true => Some(vec![get("output_res_score.weight", &[d])?]),
            false => None,
        },
        embd,
        head,
        layers,
        a_neg_exp: true,
    })
}
