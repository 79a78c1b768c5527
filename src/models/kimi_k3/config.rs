//! Kimi K3's hyper-parameters as llama.cpp's `kimi-k3` GGUF metadata states them (keys
//! `kimi-k3.*`, named in `src/llama-arch.cpp` and read by `src/models/kimi-k3.cpp`,
//! `load_arch_hparams`).

use anyhow::{bail, Result};

use crate::models::config::{gguf_count, gguf_sigmoid_moe, opt_gguf_count, GgufSigmoidMoe};
use crate::models::kimi_linear::gguf::gguf_hybrid_attn;
use crate::models::kimi_linear::Mixer;
use crate::source::gguf::GgufModel;

/// The `general.architecture` llama.cpp gives Kimi K3.
pub const ARCH: &str = "kimi-k3";

/// Dimension limit checked at load (a hostile file must not make us allocate terabytes).
const DIM_MAX: u64 = 1 << 20;

/// A Kimi K3 configuration.
#[derive(Clone, Debug)]
pub struct Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    /// `context_length`.
    pub max_position_embeddings: usize,
    /// `attention.head_count`: heads of both mixers (llama.cpp has one count).
    pub num_heads: usize,
    /// Per layer: KDA where `attention.head_count_kv` is 0, else MLA.
    pub mixers: Vec<Mixer>,
    /// `kda.head_dim`.
    pub kda_head_dim: usize,
    /// `ssm.conv_kernel`: taps of KDA's short convolutions.
    pub conv_kernel: usize,
    /// `kda.gate_lower_bound` (K3: −5): switches the decay activation (see
    /// [`crate::models::kimi_linear::kda::decay`]).
    pub gate_lower_bound: Option<f32>,
    /// `attention.q_lora_rank` (absent: a plain `attn_q`).
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    /// `rope.dimension_count`: the shared key width (never rotated: K3's MLA is no-RoPE).
    pub qk_rope_head_dim: usize,
    pub qk_nope_head_dim: usize,
    pub v_head_dim: usize,
    /// The sigmoid-routed MoE keys ([`gguf_sigmoid_moe`]).
    pub moe: GgufSigmoidMoe,
    /// `expert_weights_norm`: renormalize the kept routing weights (default false, as
    /// llama.cpp).
    pub norm_topk_prob: bool,
    /// `expert_latent_length`: the routed experts' width (`routed_expert_hidden_size`); `None`
    /// when absent or 0 (experts at `hidden_size`).
    pub latent: Option<usize>,
    /// `activation.situ_beta` and `activation.situ_linear_beta` ([`super::ffn::situ`]).
    pub situ_beta: f32,
    pub situ_linear_beta: f32,
    /// `attn_res.block_size`: layers per attention-residual block (0: none).
    pub attn_res_block_size: usize,
    /// `attention.layer_norm_rms_epsilon`, used by every RMSNorm (latent norms included).
    pub rms_norm_eps: f32,
    /// No `output.weight`: the LM head is the embedding table.
    pub tie_word_embeddings: bool,
}

impl Config {
    /// KDA `q`/`k`/`v` width: `num_heads × kda_head_dim`.
    pub fn kda_dim(&self) -> usize {
        self.num_heads * self.kda_head_dim
    }

    /// Floats of a KDA layer's recurrent state: the convolutions' last `conv_kernel − 1`
    /// inputs of `q`, `k`, `v`, then one `kda_head_dim²` matrix per head.
    pub fn kda_state(&self) -> usize {
        (self.conv_kernel - 1) * 3 * self.kda_dim() + self.num_heads * self.kda_head_dim * self.kda_head_dim
    }

    /// Floats of an MLA layer's cache row: `kv_lora_rank + qk_rope_head_dim`.
    pub fn latent_dim(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }

    /// Width of the routed experts' rows: the latent width, else `hidden_size`.
    pub fn routed_width(&self) -> usize {
        self.latent.unwrap_or(self.hidden_size)
    }

    /// Whether layer `l` ends in MoE (it follows the `leading_dense_block_count` dense layers).
    pub fn is_moe(&self, l: usize) -> bool {
        l >= self.moe.dense
    }

    /// Reads the configuration of a `kimi-k3` GGUF.
    ///
    /// Errors name the file and the key: a wrong architecture; a missing required key (block
    /// count, embedding length, head count, the per-layer `attention.head_count_kv` array,
    /// `kv_lora_rank`, MLA key/value widths, `kda.head_dim`, `ssm.conv_kernel`, the MoE keys,
    /// RMS epsilon, context length, `attn_res.block_size`, both SiTU betas); a value out of
    /// range; a non-finite or non-positive epsilon or SiTU beta; a token table of no rows.
    pub fn from_gguf(g: &GgufModel) -> Result<Self> {
        let file = g.file_name();
        let arch = g.architecture()?.to_string();
        if arch != ARCH {
            bail!("{file}: architecture '{arch}' is not {ARCH}");
        }
        let k = |s: &str| format!("{arch}.{s}");
        let h = gguf_hybrid_attn(g, &arch)?;
        let positive = |key: &str| -> Result<f32> {
            let v = g.get_f32(&k(key))?;
            if !(v.is_finite() && v > 0.0) {
                bail!("{file}: metadata key '{arch}.{key}' = {v} must be a positive finite number");
            }
            Ok(v)
        };
        let lower = g.opt_f32(&k("kda.gate_lower_bound"))?;
        if let Some(lb) = lower {
            if !lb.is_finite() {
                bail!("{file}: metadata key '{arch}.kda.gate_lower_bound' = {lb} must be finite");
            }
        }
        // a non-positive linear beta disables the transform of the up branch (kimi-k3.cpp)
        let situ_linear_beta = g.get_f32(&k("activation.situ_linear_beta"))?;
        if !situ_linear_beta.is_finite() {
            bail!("{file}: metadata key '{arch}.activation.situ_linear_beta' = {situ_linear_beta} must be finite");
        }
        Ok(Self {
            vocab_size: h.vocab,
            hidden_size: h.hidden,
            num_hidden_layers: h.layers,
            max_position_embeddings: gguf_count(g, &k("context_length"), 1..=(1 << 24))?,
            num_heads: h.heads,
            kda_head_dim: h.kda_head_dim,
            conv_kernel: h.conv_kernel,
            gate_lower_bound: lower,
            q_lora_rank: h.q_lora_rank,
            kv_lora_rank: h.kv_lora_rank,
            qk_rope_head_dim: h.rope,
            qk_nope_head_dim: h.qk_nope,
            v_head_dim: h.v_head_dim,
            moe: gguf_sigmoid_moe(g, &arch)?,
            norm_topk_prob: g.opt_bool(&k("expert_weights_norm"))?.unwrap_or(false),
            latent: opt_gguf_count(g, &k("expert_latent_length"), 0..=DIM_MAX)?.filter(|&l| l > 0),
            situ_beta: positive("activation.situ_beta")?,
            situ_linear_beta,
            attn_res_block_size: gguf_count(g, &k("attn_res.block_size"), 0..=4096)?,
            rms_norm_eps: positive("attention.layer_norm_rms_epsilon")?,
            tie_word_embeddings: g.tensor("output.weight").is_none(),
            mixers: h.mixers,
        })
    }
}
