//! Gemma 3's configuration, read from GGUF metadata (llama.cpp's `gemma3.*` keys) into the
//! field names of Hugging Face `Gemma3TextConfig`.

use anyhow::{anyhow, bail, Result};

use crate::models::config::gguf_count;
use crate::models::needs::MemoryNeeds;
use crate::source::gguf::GgufModel;

/// Hyper-parameters, named as in the Hugging Face `Gemma3TextConfig`; read from the GGUF keys
/// `gemma3.*` (llama.cpp's names in comments).
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// `embedding_length`
    pub hidden_size: usize,
    /// `feed_forward_length`
    pub intermediate_size: usize,
    /// `block_count`
    pub num_hidden_layers: usize,
    /// `attention.head_count`
    pub num_attention_heads: usize,
    /// `attention.head_count_kv`
    pub num_key_value_heads: usize,
    /// `attention.key_length` (equal to `attention.value_length`)
    pub head_dim: usize,
    /// `attention.layer_norm_rms_epsilon`
    pub rms_norm_eps: f32,
    /// `rope.freq_base`: RoPE base of the global-attention layers.
    pub rope_theta: f32,
    /// `rope.freq_base_swa` when present, else 10000 (Gemma 3's `rope_local_base_freq`).
    pub rope_local_base_freq: f32,
    /// Linear RoPE scaling factor of the global layers (`rope.scaling.factor` with type linear).
    pub rope_scaling_factor: Option<f32>,
    /// `attention.sliding_window`, in tokens.
    pub sliding_window: usize,
    /// Per layer: whether it uses sliding-window attention. From
    /// `attention.sliding_window_pattern` (a period `n`: every `n`-th layer is global; or one
    /// bool per layer) and otherwise Gemma 3's period of 6.
    pub sliding_layers: Vec<bool>,
    /// Attention scores are scaled by `query_pre_attn_scalar^-½`. Not in GGUF: `head_dim`,
    /// except Gemma 3 27B (62 layers) which uses `hidden_size / num_attention_heads`, as in its
    /// Hugging Face config and llama.cpp.
    pub query_pre_attn_scalar: f32,
    /// `final_logit_softcapping` when present.
    pub final_logit_softcapping: Option<f32>,
    /// `attn_logit_softcapping` when present.
    pub attn_logit_softcapping: Option<f32>,
    /// `context_length`
    pub max_position_embeddings: usize,
    /// Rows of `token_embd.weight`.
    pub vocab_size: usize,
}

impl Config {
    /// Reads the configuration from GGUF metadata and checks that it can run. Errors name the
    /// file and the missing or invalid key.
    pub fn from_gguf(g: &GgufModel) -> Result<Self> {
        let file = g.file_name();
        let c = Self::read(g).map_err(|e| {
            if e.to_string().starts_with(&file) {
                e
            } else {
                e.context(file.clone())
            }
        })?;
        c.check().map_err(|e| e.context(file))?;
        Ok(c)
    }

    /// Rejects values that would run but compute nonsense (zero sizes, non-finite floats).
    fn check(&self) -> Result<()> {
        let sizes = [
            ("block_count", self.num_hidden_layers),
            ("embedding_length", self.hidden_size),
            ("feed_forward_length", self.intermediate_size),
            ("attention.head_count", self.num_attention_heads),
            ("attention.sliding_window", self.sliding_window),
            (
                "context_length",
                self.max_position_embeddings.saturating_sub(1),
            ),
            ("token_embd.weight rows", self.vocab_size),
        ];
        for (key, v) in sizes {
            if v == 0 {
                bail!("gemma3.{key} is too small to run a model");
            }
        }
        let floats = [
            ("attention.layer_norm_rms_epsilon", Some(self.rms_norm_eps)),
            ("rope.freq_base", Some(self.rope_theta)),
            ("rope.freq_base_swa", Some(self.rope_local_base_freq)),
            ("rope.scaling.factor", self.rope_scaling_factor),
            ("final_logit_softcapping", self.final_logit_softcapping),
            ("attn_logit_softcapping", self.attn_logit_softcapping),
        ];
        for (key, v) in floats {
            if let Some(v) = v {
                if !(v.is_finite() && v > 0.0) {
                    bail!("gemma3.{key} = {v} must be a positive finite number");
                }
            }
        }
        Ok(())
    }

    fn read(g: &GgufModel) -> Result<Self> {
        let a = "gemma3";
        let k = |s: &str| format!("{a}.{s}");
        const DIM_MAX: u64 = 1 << 20;
        let num_hidden_layers = gguf_count(g, &k("block_count"), 0..=4096)?;
        let hidden_size = gguf_count(g, &k("embedding_length"), 0..=DIM_MAX)?;
        let num_attention_heads = gguf_count(g, &k("attention.head_count"), 0..=4096)?;
        let num_key_value_heads = gguf_count(g, &k("attention.head_count_kv"), 0..=4096)?;
        let head_dim = gguf_count(g, &k("attention.key_length"), 0..=8192)?;
        let v_len = g
            .opt_u64(&k("attention.value_length"))?
            .unwrap_or(head_dim as u64);
        if v_len != head_dim as u64 {
            bail!("{a}.attention.value_length {v_len} differs from key_length {head_dim}: not supported");
        }
        if num_key_value_heads == 0 || num_attention_heads % num_key_value_heads != 0 {
            bail!("{a}.attention.head_count {num_attention_heads} is not a multiple of head_count_kv {num_key_value_heads}");
        }
        if head_dim % 2 != 0 || head_dim == 0 {
            bail!("{a}.attention.key_length {head_dim} must be even for RoPE");
        }
        let sliding_layers = match g.metadata.get(&k("attention.sliding_window_pattern")) {
            Some(crate::source::gguf::Value::Array(v)) => {
                let flags: Option<Vec<bool>> = v
                    .iter()
                    .map(|x| match x {
                        crate::source::gguf::Value::Bool(b) => Some(*b),
                        _ => None,
                    })
                    .collect();
                let flags = flags.ok_or_else(|| {
                    anyhow!("{a}.attention.sliding_window_pattern: expected an array of bools")
                })?;
                if flags.len() != num_hidden_layers {
                    bail!("{a}.attention.sliding_window_pattern has {} entries for {num_hidden_layers} layers", flags.len());
                }
                flags
            }
            _ => {
                let period = g
                    .opt_u64(&k("attention.sliding_window_pattern"))?
                    .unwrap_or(6)
                    .max(1) as usize;
                (0..num_hidden_layers)
                    .map(|i| (i + 1) % period != 0)
                    .collect()
            }
        };
        let rope_scaling_factor = match g.metadata.get(&k("rope.scaling.type")) {
            Some(crate::source::gguf::Value::String(t)) if t == "linear" => {
                g.opt_f32(&k("rope.scaling.factor"))?
            }
            Some(crate::source::gguf::Value::String(t)) if t == "none" => None,
            Some(v) => bail!("{a}.rope.scaling.type {v:?} is not supported (only linear)"),
            None => None,
        };
        let query_pre_attn_scalar = if num_hidden_layers == 62 {
            (hidden_size / num_attention_heads) as f32
        } else {
            head_dim as f32
        };
        let embd = g
            .tensors
            .iter()
            .find(|t| t.name == "token_embd.weight")
            .ok_or_else(|| {
                anyhow!(
                    "{}: tensor 'token_embd.weight' is missing",
                    g.files[0].display()
                )
            })?;
        Ok(Self {
            hidden_size,
            intermediate_size: gguf_count(g, &k("feed_forward_length"), 0..=DIM_MAX)?,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: g
                .opt_f32(&k("attention.layer_norm_rms_epsilon"))?
                .unwrap_or(1e-6),
            rope_theta: g.opt_f32(&k("rope.freq_base"))?.unwrap_or(1_000_000.0),
            rope_local_base_freq: g.opt_f32(&k("rope.freq_base_swa"))?.unwrap_or(10_000.0),
            rope_scaling_factor,
            sliding_window: g
                .opt_u64(&k("attention.sliding_window"))?
                .unwrap_or(u64::MAX)
                .min(usize::MAX as u64) as usize,
            sliding_layers,
            query_pre_attn_scalar,
            final_logit_softcapping: g.opt_f32(&k("final_logit_softcapping"))?,
            attn_logit_softcapping: g.opt_f32(&k("attn_logit_softcapping"))?,
            max_position_embeddings: gguf_count(g, &k("context_length"), 0..=(1 << 24))?,
            vocab_size: embd.shape.get(1).copied().unwrap_or(0) as usize,
        })
    }

    pub(super) fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    pub(super) fn kv_dim(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }

    /// RAM a pass needs besides the weights ([`MemoryNeeds`]); the resident vectors are each
    /// layer's four norms and query/key norms, and the final norm.
    pub(super) fn memory_needs(&self) -> MemoryNeeds {
        let (d, l, kvd) = (self.hidden_size, self.num_hidden_layers, self.kv_dim());
        MemoryNeeds {
            row_floats: 4 * d + 2 * self.q_dim() + 2 * kvd + 2 * self.intermediate_size,
            pass_floats: self.vocab_size,
            thread_ctx_floats: 1,
            state_ctx_floats: 2 * l * kvd,
            vector_floats: d * (4 * l + 1) + 2 * self.head_dim * l,
            max_ctx: self.max_position_embeddings,
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::GgmlType;
    use crate::source::gguf::Value;
    use crate::source::tensor::TensorInfo;

    fn header(extra: &[(&str, Value)]) -> GgufModel {
        let mut metadata = std::collections::BTreeMap::new();
        for (k, v) in [
            ("gemma3.block_count", Value::U32(2)),
            ("gemma3.embedding_length", Value::U32(64)),
            ("gemma3.feed_forward_length", Value::U32(128)),
            ("gemma3.attention.head_count", Value::U32(2)),
            ("gemma3.attention.head_count_kv", Value::U32(1)),
            ("gemma3.attention.key_length", Value::U32(32)),
            ("gemma3.attention.sliding_window", Value::U32(16)),
            ("gemma3.context_length", Value::U32(256)),
        ]
        .into_iter()
        .chain(extra.iter().cloned())
        {
            metadata.insert(k.to_string(), v);
        }
        GgufModel {
            files: vec!["tiny.gguf".into()],
            version: 3,
            alignment: 32,
            metadata,
            tensors: vec![TensorInfo {
                name: "token_embd.weight".into(),
                ty: GgmlType::F32,
                shape: vec![64, 100],
                file: 0,
                offset: 0,
                n_bytes: 64 * 100 * 4,
            }],
            pack: None,
        }
    }

    #[test]
    fn config_defaults_and_sliding_pattern() {
        let c = Config::from_gguf(&header(&[])).unwrap();
        assert_eq!(c.vocab_size, 100);
        assert_eq!(c.rms_norm_eps, 1e-6);
        assert_eq!(c.rope_local_base_freq, 10_000.0);
        assert_eq!(c.query_pre_attn_scalar, 32.0);
        assert_eq!(c.sliding_layers, vec![true, true]);
        let c = Config::from_gguf(&header(&[(
            "gemma3.attention.sliding_window_pattern",
            Value::U32(2),
        )]))
        .unwrap();
        assert_eq!(c.sliding_layers, vec![true, false]);
    }

    #[test]
    fn config_that_cannot_run_is_rejected_with_file_and_key() {
        let err = |extra: &[(&str, Value)]| {
            format!("{:#}", Config::from_gguf(&header(extra)).unwrap_err())
        };
        assert_eq!(
            err(&[("gemma3.attention.layer_norm_rms_epsilon", Value::F32(f32::NAN))]),
            "tiny.gguf: gemma3.attention.layer_norm_rms_epsilon = NaN must be a positive finite number"
        );
        assert_eq!(
            err(&[("gemma3.block_count", Value::U32(0))]),
            "tiny.gguf: gemma3.block_count is too small to run a model"
        );
        assert_eq!(
            err(&[("gemma3.attention.sliding_window", Value::U32(0))]),
            "tiny.gguf: gemma3.attention.sliding_window is too small to run a model"
        );
        assert_eq!(
            err(&[("gemma3.attention.head_count_kv", Value::U32(0))]),
            "tiny.gguf: gemma3.attention.head_count 2 is not a multiple of head_count_kv 0"
        );
    }
}
