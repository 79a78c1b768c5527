//! Kimi K3's hyper-parameters, as llama.cpp's `kimi-k3` GGUF metadata states them (keys
//! `kimi-k3.*`, named in `src/llama-arch.cpp` and read by `src/models/kimi-k3.cpp`,
//! `load_arch_hparams`) and as a Hugging Face `config.json` does (the fields llama.cpp's
//! converter `conversion/kimi_k3.py` reads, with `text_config` merged over the top level).

use anyhow::{anyhow, bail, Result};
use serde_json::Value;

use crate::models::config::config_dims;
use crate::models::config::{gguf_arch, gguf_count, gguf_sigmoid_moe, opt_gguf_count, GgufSigmoidMoe};
use crate::models::config::Fields;
use crate::models::needs::MemoryNeeds;
use crate::models::layers::hybrid::{gguf_hybrid_attn, mixers, Mixer};
use crate::source::gguf::GgufModel;

/// The `general.architecture` llama.cpp gives Kimi K3.
pub const ARCH: &str = "kimi-k3";

/// The `config.json` `model_type` of a Kimi K3 checkpoint (`KimiK3ForConditionalGeneration`).
/// No K3 checkpoint is published to check it against: this is the name Deltafin's fixture
/// (`tools/reference/k3_hf_fixtures.py`) and `synth` give it, following `kimi_k2` and
/// `kimi_linear`.
pub const MODEL_TYPE: &str = "kimi_k3";

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
    /// [`crate::models::layers::kda::decay`]).
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
    /// `activation.situ_beta` and `activation.situ_linear_beta` (SiTU, `backend::Glu::Situ`).
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

    /// RAM a pass needs besides the weights ([`MemoryNeeds`]): a latent cache for the MLA
    /// layers, a recurrent state for the KDA layers; `layer_vectors`: the floats of the
    /// layers' resident vectors as loaded (norms, attention-residual scores, router biases,
    /// convolutions, KDA gates), to which the final norm and the output residual score add
    /// `2 · hidden_size`.
    pub(super) fn memory_needs(&self, layer_vectors: usize) -> MemoryNeeds {
        let (d, nh, nl) = (self.hidden_size, self.num_heads, self.num_hidden_layers);
        let n_mla = self.mixers.iter().filter(|m| **m == Mixer::Mla).count();
        let n_banks = nl.div_ceil(self.attn_res_block_size.max(1));
        let m = &self.moe;
        MemoryNeeds {
            row_floats: (8 + n_banks) * d
                + 12 * self.kda_dim()
                + nh * (self.qk_nope_head_dim
                    + self.qk_rope_head_dim
                    + 2 * self.v_head_dim
                    + self.kv_lora_rank)
                + self.latent_dim()
                + 2 * m.dense_ff.max(m.expert_ff * m.shared.max(1))
                + 4 * self.routed_width()
                + m.experts,
            pass_floats: self.vocab_size,
            thread_ctx_floats: 1,
            thread_floats: self.kv_lora_rank * (self.qk_nope_head_dim + 2),
            thread_row_floats: 4 * self.kda_head_dim + 1,
            state_ctx_floats: n_mla * self.latent_dim(),
            state_floats: (nl - n_mla) * self.kda_state(),
            vector_floats: layer_vectors + 2 * d,
            max_ctx: self.max_position_embeddings,
            ..Default::default()
        }
    }

    /// Width of the routed experts' rows: the latent width, else `hidden_size`.
    pub fn routed_width(&self) -> usize {
        self.latent.unwrap_or(self.hidden_size)
    }

    /// Whether layer `l` ends in MoE (it follows the `leading_dense_block_count` dense layers).
    pub fn is_moe(&self, l: usize) -> bool {
        l >= self.moe.dense
    }

    /// Reads a Kimi K3 Hugging Face `config.json` (`KimiK3ForConditionalGeneration`: the text
    /// model's fields in `text_config`, merged over the top level as llama.cpp's converter
    /// does; a top-level-only config reads the same). Fields: `vocab_size`, `hidden_size`,
    /// `num_hidden_layers`, `max_position_embeddings` (or `model_max_length`),
    /// `num_attention_heads` (which must equal `linear_attn_config.num_heads` when given: one
    /// head count serves both mixers), `linear_attn_config` (`full_attn_layers` and
    /// `kda_layers`, 1-based; `head_dim`, `short_conv_kernel_size`, `gate_lower_bound`),
    /// `q_lora_rank`, `kv_lora_rank`, `qk_{nope,rope}_head_dim`, `v_head_dim`, `mla_use_nope`
    /// (must be true), `num_experts`, `num_experts_per_token` (or `_tok`),
    /// `moe_intermediate_size`, `num_shared_experts`, `first_k_dense_replace`,
    /// `intermediate_size` (the dense layers), `num_expert_group` (or `n_group`, default 1),
    /// `topk_group` (1), `routed_scaling_factor`, `moe_renormalize`,
    /// `moe_router_activation_func` (sigmoid only), `routed_expert_hidden_size` (the latent
    /// width; absent or 0: none), `hidden_act` (situ only), `activation_situ_beta`,
    /// `activation_situ_linear_beta`, `attn_res_block_size` (0: none), `rms_norm_eps` (every
    /// RMSNorm, as llama.cpp), `tie_word_embeddings`. Required, as llama.cpp's converter
    /// requires them (no default could be right for a checkpoint that omits them):
    /// `num_shared_experts`, `first_k_dense_replace`, `routed_scaling_factor`,
    /// `moe_renormalize`, `attn_res_block_size`. Numbers are range-checked as the f32 the
    /// forward pass uses.
    ///
    /// Errors name `label` and the field: missing or mistyped, out of range, an unsupported
    /// activation, router function or RoPE MLA, differing head counts, layer lists that do not
    /// cover the layers once.
    pub fn from_hf_json(root: &Value, label: &str) -> Result<Self> {
        let v = merged_text_config(root);
        for (k, x) in [("text_config", root.get("text_config")), ("linear_attn_config", v.get("linear_attn_config"))] {
            if let Some(x) = x.filter(|x| !x.is_null() && !x.is_object()) {
                bail!("{label}: '{k}' = {x} is not an object");
            }
        }
        let f = Fields { v: &v, label };
        let la = v.get("linear_attn_config").filter(|x| x.is_object());
        let la_get = |k: &str| la.and_then(|o| o.get(k)).filter(|x| !x.is_null());
        let la_count = |k: &str| -> Result<usize> {
            let x = la_get(k).ok_or_else(|| anyhow!("{label}: missing field 'linear_attn_config.{k}'"))?;
            x.as_u64()
                .map(|n| n as usize)
                .ok_or_else(|| anyhow!("{label}: 'linear_attn_config.{k}' = {x} is not a count"))
        };
        let n_layers = f.count(&["num_hidden_layers"], None)?;
        // bounded before the per-layer lists are built from it (a hostile count must not
        // allocate: the fuzzer's `num_hidden_layers: 3333333333333333`)
        crate::models::config::check_config_dims(label, &[("num_hidden_layers", n_layers)])?;
        let heads = f.count(&["num_attention_heads"], None)?;
        if let Some(x) = la_get("num_heads") {
            match x.as_u64() {
                Some(h) if h == heads as u64 => {}
                Some(_) => bail!("{label}: 'linear_attn_config.num_heads' = {x} differs from 'num_attention_heads' = {heads}"),
                None => bail!("{label}: 'linear_attn_config.num_heads' = {x} is not a count"),
            }
        }
        for (k, want) in [("hidden_act", "situ"), ("moe_router_activation_func", "sigmoid")] {
            match v.get(k).and_then(Value::as_str) {
                Some(x) if x == want => {}
                _ => bail!(
                    "{label}: '{k}' = {} is not supported (Kimi K3 needs {want})",
                    v.get(k).map_or("missing".to_string(), |x| x.to_string())
                ),
            }
        }
        if v.get("mla_use_nope").and_then(Value::as_bool) != Some(true) {
            bail!("{label}: 'mla_use_nope' must be true (Kimi K3's MLA has no RoPE)");
        }
        // numbers are checked as the f32 the forward pass uses (1e39 is no finite f32)
        let finite = |k: &str, x: &Value| -> Result<f32> {
            x.as_f64()
                .map(|b| b as f32)
                .filter(|b| b.is_finite())
                .ok_or_else(|| anyhow!("{label}: '{k}' = {x} is not a finite f32 number"))
        };
        let lower = match la_get("gate_lower_bound") {
            None => None,
            Some(x) => Some(finite("linear_attn_config.gate_lower_bound", x)?),
        };
        let required = |k: &str| -> Result<&Value> { f.find(&[k]).map(|(_, x)| x).ok_or_else(|| anyhow!("{label}: missing field '{k}'")) };
        let positive = |k: &str| -> Result<f32> {
            match finite(k, required(k)?)? {
                b if b > 0.0 => Ok(b),
                b => bail!("{label}: '{k}' = {b} must be a positive finite number"),
            }
        };
        let situ_linear_beta = finite("activation_situ_linear_beta", required("activation_situ_linear_beta")?)?;
        // what llama.cpp's converter requires (`conversion/kimi_k3.py`): no defaults here, so a
        // checkpoint never runs with parts of itself silently left out
        for k in ["num_shared_experts", "first_k_dense_replace", "routed_scaling_factor", "moe_renormalize", "attn_res_block_size"] {
            required(k)?;
        }
        let experts = f.count(&["num_experts", "n_routed_experts"], None)?;
        let used = f.count(&["num_experts_per_token", "num_experts_per_tok"], None)?;
        let expert_ff = f.count(&["moe_intermediate_size"], None)?;
        let dense = f.count(&["first_k_dense_replace"], None)?;
        let moe = GgufSigmoidMoe {
            experts,
            used,
            expert_ff,
            shared: f.count(&["num_shared_experts"], None)?,
            dense,
            dense_ff: match dense {
                0 => f.count(&["intermediate_size"], Some(expert_ff))?,
                _ => f.count(&["intermediate_size"], None)?,
            },
            groups: f.count(&["num_expert_group", "n_group"], Some(1))?,
            groups_used: f.count(&["topk_group"], Some(1))?,
            scale: positive("routed_scaling_factor")?,
        };
        let c = Config {
            vocab_size: f.count(&["vocab_size"], None)?,
            hidden_size: f.count(&["hidden_size"], None)?,
            num_hidden_layers: n_layers,
            max_position_embeddings: f.count(&["max_position_embeddings", "model_max_length"], None)?,
            num_heads: heads,
            mixers: mixers(&v, la, n_layers, label)?,
            kda_head_dim: la_count("head_dim")?,
            conv_kernel: la_count("short_conv_kernel_size")?,
            gate_lower_bound: lower,
            q_lora_rank: f.opt_count(&["q_lora_rank"])?,
            kv_lora_rank: f.count(&["kv_lora_rank"], None)?,
            qk_rope_head_dim: f.count(&["qk_rope_head_dim"], None)?,
            qk_nope_head_dim: f.count(&["qk_nope_head_dim"], None)?,
            v_head_dim: f.count(&["v_head_dim"], None)?,
            moe,
            norm_topk_prob: f.flag(&["moe_renormalize"], true)?,
            latent: f.opt_count(&["routed_expert_hidden_size"])?.filter(|&l| l > 0),
            situ_beta: positive("activation_situ_beta")?,
            situ_linear_beta,
            attn_res_block_size: f.count(&["attn_res_block_size"], None)?,
            rms_norm_eps: positive("rms_norm_eps")?,
            tie_word_embeddings: f.flag(&["tie_word_embeddings"], false)?,
        };
        c.check_hf_dims(label)?;
        Ok(c)
    }

    /// The range checks of [`Config::from_hf_json`] (the GGUF reader's bounds).
    fn check_hf_dims(&self, label: &str) -> Result<()> {
        let m = &self.moe;
        let dims = config_dims!(self;
            vocab_size, hidden_size, num_hidden_layers, num_attention_heads = self.num_heads,
            "linear_attn_config.head_dim" = self.kda_head_dim, kv_lora_rank, qk_nope_head_dim,
            qk_rope_head_dim, v_head_dim, q_lora_rank = self.q_lora_rank.unwrap_or(1),
            num_experts = m.experts, num_experts_per_token = m.used, moe_intermediate_size = m.expert_ff,
            intermediate_size = m.dense_ff, num_expert_group = m.groups, topk_group = m.groups_used,
            routed_expert_hidden_size = self.latent.unwrap_or(1), num_shared_experts = m.shared.max(1),
            "shared experts' width" = m.expert_ff.saturating_mul(m.shared.max(1))
        );
        crate::models::config::check_config_dims(label, &dims)?;
        // as the GGUF reader's `context_length`
        if !(1..=1 << 24).contains(&self.max_position_embeddings) {
            bail!("{label}: 'max_position_embeddings' = {} is outside 1..={}", self.max_position_embeddings, 1 << 24);
        }
        if !(2..=64).contains(&self.conv_kernel) {
            bail!("{label}: 'linear_attn_config.short_conv_kernel_size' = {} is outside 2..=64", self.conv_kernel);
        }
        if m.used > m.experts || m.groups_used > m.groups || !m.experts.is_multiple_of(m.groups) {
            bail!(
                "{label}: 'num_experts_per_token' = {} / 'num_experts' = {} / 'num_expert_group' = {} / 'topk_group' = {} do not fit",
                m.used,
                m.experts,
                m.groups,
                m.groups_used
            );
        }
        if m.dense > self.num_hidden_layers || self.attn_res_block_size > 4096 {
            bail!(
                "{label}: 'first_k_dense_replace' = {} or 'attn_res_block_size' = {} is out of range",
                m.dense,
                self.attn_res_block_size
            );
        }
        if self.rms_norm_eps >= 1.0 {
            bail!("{label}: 'rms_norm_eps' = {} is outside (0, 1)", self.rms_norm_eps);
        }
        Ok(())
    }

    /// Reads the configuration of a `kimi-k3` GGUF.
    ///
    /// Errors name the file and the key: a wrong architecture; a missing required key (block
    /// count, embedding length, head count, the per-layer `attention.head_count_kv` array,
    /// `kv_lora_rank`, MLA key/value widths, `kda.head_dim`, `ssm.conv_kernel`, the MoE keys,
    /// RMS epsilon, context length, `attn_res.block_size`, both SiTU betas); a value out of
    /// range; a non-finite or non-positive epsilon or SiTU beta; a token table of no rows.
    pub fn from_gguf(g: &GgufModel) -> Result<Self> {
        let (file, arch) = gguf_arch(g, |a| a == ARCH, ARCH)?;
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

/// `config.json` with its `text_config` (when an object) merged over the top level, the text
/// model's fields winning (as llama.cpp's converter reads a multimodal checkpoint).
pub(crate) fn merged_text_config(root: &Value) -> Value {
    let mut v = root.clone();
    if let (Some(o), Some(t)) = (v.as_object_mut(), root.get("text_config").and_then(Value::as_object)) {
        for (k, x) in t {
            o.insert(k.clone(), x.clone());
        }
    }
    v
}
