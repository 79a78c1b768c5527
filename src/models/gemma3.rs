//! Gemma 3 (text), as Hugging Face `transformers` (`models/gemma3/modeling_gemma3.py`) and
//! llama.cpp (`LLM_ARCH_GEMMA3`) define it: embeddings scaled by √hidden_size, RMSNorm before
//! and after attention and the feed-forward block, grouped-query attention with per-head q/k
//! RMSNorm, NeoX-style RoPE with one base for sliding-window layers and another for global
//! layers, GeGLU with tanh GELU, LM head tied to the embeddings.
//!
//! GGUF stores Gemma's norm weights with the `1 +` of `Gemma3RMSNorm` already added by
//! llama.cpp's converter, so here every norm is a plain RMSNorm with the stored weight.

use anyhow::{anyhow, bail, Context, Result};

use super::embed_head::{head_chunks, Embedding, Head};
use super::layers::{add_post_normed, attention, mm, rms_norm_rows, AttnShape};
use super::loading::{mat, read_vector, unit_of, MatRef, Tensors};
use super::{LoadOptions, Logits, Model, Placement};
use crate::engine::KvCache;
use crate::kernels::ops::{gelu_tanh, rms_norm_inplace, rope_inv_freq, rope_neox, softcap};
use crate::source::gguf::GgufModel;
use crate::store::plan::{choose_resident, Candidate};
use crate::store::{DirectFile, Unit, UnitBytes, WeightStore};

/// Stream buffers used when any weight is streamed (double buffering: one being computed on,
/// one being read).
const STREAM_SLOTS: usize = 2;

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

/// The integer at `key` as `usize`. Errors: missing, not an integer, or above `max`.
fn get_usize(g: &GgufModel, key: &str, max: u64) -> Result<usize> {
    let v = g.get_u64(key)?;
    if v > max {
        bail!(
            "{}: metadata key '{key}' = {v} is larger than the supported maximum {max}",
            g.file_name()
        );
    }
    Ok(v as usize)
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
        let num_hidden_layers = get_usize(g, &k("block_count"), 4096)?;
        let hidden_size = get_usize(g, &k("embedding_length"), DIM_MAX)?;
        let num_attention_heads = get_usize(g, &k("attention.head_count"), 4096)?;
        let num_key_value_heads = get_usize(g, &k("attention.head_count_kv"), 4096)?;
        let head_dim = get_usize(g, &k("attention.key_length"), 8192)?;
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
            intermediate_size: get_usize(g, &k("feed_forward_length"), DIM_MAX)?,
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
            max_position_embeddings: get_usize(g, &k("context_length"), 1 << 24)?,
            vocab_size: embd.shape.get(1).copied().unwrap_or(0) as usize,
        })
    }

    fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    fn kv_dim(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }

    /// Activation bytes of a forward pass over `n` tokens returning logits for `m` of them.
    fn scratch_bytes(&self, n: usize, m: usize, n_ctx: usize) -> usize {
        let per_tok = 4 * self.hidden_size
            + 2 * self.q_dim()
            + 2 * self.kv_dim()
            + 2 * self.intermediate_size;
        4 * (n * per_tok + m * self.vocab_size + rayon::current_num_threads() * n_ctx)
    }
}

struct LayerMats {
    q: MatRef,
    k: MatRef,
    v: MatRef,
    o: MatRef,
    gate: MatRef,
    up: MatRef,
    down: MatRef,
}

struct LayerNorms {
    attn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    post_attn: Vec<f32>,
    ffn: Vec<f32>,
    post_ffw: Vec<f32>,
}

/// A loaded Gemma 3 model.
pub struct Gemma3 {
    pub config: Config,
    layers: Vec<(usize, LayerMats)>,
    norms: Vec<LayerNorms>,
    output_norm: Vec<f32>,
    embedding: Embedding,
    head: Head,
    inv_freq_global: Vec<f32>,
    inv_freq_local: Vec<f32>,
    placement: Placement,
}

impl Gemma3 {
    /// Loads a Gemma 3 GGUF under `opts` (see [`LoadOptions`]): validates every tensor's
    /// presence, shape and type, plans which units stay resident under the RAM budget, reads
    /// those, and starts the streamer for the rest.
    ///
    /// Errors: a missing or mis-shaped tensor or metadata key (named), a budget too small for
    /// the KV cache and stream buffers, or an unreadable file.
    pub fn load(g: &GgufModel, opts: &LoadOptions) -> Result<(Self, WeightStore)> {
        let c = Config::from_gguf(g)?;
        let ts = Tensors::new(g);
        let (d, ff, qd, kvd, hd) = (
            c.hidden_size,
            c.intermediate_size,
            c.q_dim(),
            c.kv_dim(),
            c.head_dim,
        );
        let embd = ts.get("token_embd.weight", &[d, c.vocab_size])?;
        let head_t = match ts.by_name.get("output.weight") {
            Some(_) => ts.get("output.weight", &[d, c.vocab_size])?,
            None => embd,
        };
        let tied = std::ptr::eq(head_t, embd);
        let files: Vec<DirectFile> = g
            .files
            .iter()
            .map(|p| {
                DirectFile::open(p, opts.direct_io)
                    .with_context(|| format!("opening {}", p.display()))
            })
            .collect::<Result<_>>()?;
        let vec_of =
            |name: &str, n: usize| -> Result<Vec<f32>> { read_vector(&files, ts.get(name, &[n])?) };
        let output_norm = vec_of("output_norm.weight", d)?;

        let mut units: Vec<Unit> = Vec::new();
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        let mut norms = Vec::with_capacity(c.num_hidden_layers);
        for l in 0..c.num_hidden_layers {
            let n = |s: &str| format!("blk.{l}.{s}.weight");
            let list = [
                ts.get(&n("attn_q"), &[d, qd])?,
                ts.get(&n("attn_k"), &[d, kvd])?,
                ts.get(&n("attn_v"), &[d, kvd])?,
                ts.get(&n("attn_output"), &[qd, d])?,
                ts.get(&n("ffn_gate"), &[d, ff])?,
                ts.get(&n("ffn_up"), &[d, ff])?,
                ts.get(&n("ffn_down"), &[ff, d])?,
            ];
            let (unit, place) = unit_of(&list);
            let m: Vec<MatRef> = list.iter().zip(&place).map(|(t, &p)| mat(t, p)).collect();
            layers.push((
                units.len(),
                LayerMats {
                    q: m[0],
                    k: m[1],
                    v: m[2],
                    o: m[3],
                    gate: m[4],
                    up: m[5],
                    down: m[6],
                },
            ));
            units.push(unit);
            norms.push(LayerNorms {
                attn: vec_of(&n("attn_norm"), d)?,
                q: vec_of(&n("attn_q_norm"), hd)?,
                k: vec_of(&n("attn_k_norm"), hd)?,
                post_attn: vec_of(&n("post_attention_norm"), d)?,
                ffn: vec_of(&n("ffn_norm"), d)?,
                post_ffw: vec_of(&n("post_ffw_norm"), d)?,
            });
        }
        let n_layer_units = units.len();
        let layer_max = units.iter().map(|u| u.buffer_bytes()).max().unwrap_or(0);

        // --- budget -------------------------------------------------------------------------
        let n_ctx = opts.n_ctx.min(c.max_position_embeddings).max(1);
        let kv_bytes = KvCache::bytes_for(c.num_hidden_layers, n_ctx, kvd);
        let scratch_bytes = c.scratch_bytes(opts.n_batch.max(1), 1, n_ctx);
        let norms_bytes = 4 * (d * (4 * c.num_hidden_layers + 1) + 2 * hd * c.num_hidden_layers);
        let head_unit = unit_of(&[head_t]).0;
        let embd_unit = unit_of(&[embd]).0;
        let mut cands = vec![Candidate {
            name: "LM head".into(),
            bytes: head_unit.buffer_bytes(),
        }];
        if !tied {
            cands.push(Candidate {
                name: "embeddings".into(),
                bytes: embd_unit.buffer_bytes(),
            });
        }
        for (l, u) in units.iter().enumerate() {
            cands.push(Candidate {
                name: format!("layer {l}"),
                bytes: u.buffer_bytes(),
            });
        }
        let total: usize = cands.iter().map(|c| c.bytes).sum();
        let fixed = kv_bytes + scratch_bytes + norms_bytes;
        let (resident_flags, stream_buf) = match opts.ram_budget {
            None => (vec![true; cands.len()], 0),
            Some(b) => {
                let b = b as usize;
                if fixed + total <= b {
                    (vec![true; cands.len()], 0)
                } else {
                    // chunked head rows must fit a slot of the largest layer's size
                    let slot = layer_max.max(crate::store::IO_ALIGN * 4);
                    let stream_buf = STREAM_SLOTS * slot;
                    if fixed + stream_buf > b {
                        bail!(
                            "--ram-budget {} is too small: the KV cache for {n_ctx} tokens ({:.1} MiB), activations ({:.1} MiB) and stream buffers ({:.1} MiB) need at least {:.1} MiB",
                            b,
                            kv_bytes as f64 / 1048576.0,
                            (scratch_bytes + norms_bytes) as f64 / 1048576.0,
                            stream_buf as f64 / 1048576.0,
                            (fixed + stream_buf) as f64 / 1048576.0
                        );
                    }
                    (
                        choose_resident(&cands, b - fixed - stream_buf).0,
                        stream_buf,
                    )
                }
            }
        };
        let head_resident = resident_flags[0];
        let embd_resident = if tied {
            head_resident
        } else {
            resident_flags[1]
        };
        let layer_flags = &resident_flags[cands.len() - n_layer_units..];

        let mut resident: Vec<bool> = layer_flags.to_vec();
        let head = if head_resident {
            let id = units.len();
            units.push(head_unit);
            resident.push(true);
            Head::Resident {
                unit: id,
                mat: mat(head_t, (0, 0)),
            }
        } else {
            let slot = layer_max.max(crate::store::IO_ALIGN * 4);
            let mut chunks = Vec::new();
            for (u, r0, m) in head_chunks(head_t, slot) {
                units.push(u);
                resident.push(false);
                chunks.push((units.len() - 1, r0, m));
            }
            Head::Chunks(chunks)
        };
        let embedding = if embd_resident {
            match (&head, tied) {
                (Head::Resident { unit, mat }, true) => Embedding::Resident {
                    unit: *unit,
                    mat: *mat,
                },
                _ => {
                    units.push(embd_unit);
                    resident.push(true);
                    Embedding::Resident {
                        unit: units.len() - 1,
                        mat: mat(embd, (0, 0)),
                    }
                }
            }
        } else {
            Embedding::Streamed(embd.clone())
        };
        let streamed_bytes: usize = units
            .iter()
            .zip(&resident)
            .filter(|(_, r)| !**r)
            .map(|(u, _)| u.payload_bytes())
            .sum();
        let resident_layers = layer_flags.iter().filter(|r| **r).count();
        let store = WeightStore::open(
            &g.files,
            units,
            &resident,
            STREAM_SLOTS,
            stream_buf / STREAM_SLOTS,
            opts.direct_io,
        )?;
        let placement = Placement {
            resident_bytes: store.resident_bytes(),
            streamed_bytes,
            stream_buffer_bytes: store.stream_buffer_bytes(),
            kv_bytes,
            scratch_bytes: scratch_bytes + norms_bytes,
            summary: format!(
                "{resident_layers}/{} layers resident, LM head {}{}",
                c.num_hidden_layers,
                if head_resident {
                    "resident"
                } else {
                    "streamed"
                },
                if tied { " (tied to embeddings)" } else { "" }
            ),
        };
        let scale = c.rope_scaling_factor.map_or(1.0, |f| 1.0 / f);
        Ok((
            Self {
                inv_freq_global: rope_inv_freq(hd, c.rope_theta, scale),
                inv_freq_local: rope_inv_freq(hd, c.rope_local_base_freq, 1.0),
                config: c,
                layers,
                norms,
                output_norm,
                embedding,
                head,
                placement,
            },
            store,
        ))
    }

    /// Writes the scaled embeddings of `tokens` into `x` (`n × hidden_size`).
    fn embed(&self, store: &mut WeightStore, tokens: &[u32], x: &mut [f32]) -> Result<()> {
        let d = self.config.hidden_size;
        self.embedding.rows(store, tokens, d, x)?;
        let scale = (d as f32).sqrt();
        x.iter_mut().for_each(|v| *v *= scale);
        Ok(())
    }

    /// One decoder layer over `n` tokens at positions `pos0..pos0+n`, updating `x` in place.
    fn layer(
        &self,
        l: usize,
        w: &LayerMats,
        u: &UnitBytes,
        cache: &mut KvCache,
        pos0: usize,
        x: &mut [f32],
    ) {
        let c = &self.config;
        let (d, hd, ff) = (c.hidden_size, c.head_dim, c.intermediate_size);
        let (qd, kvd) = (c.q_dim(), c.kv_dim());
        let n = x.len() / d;
        let nrm = &self.norms[l];
        let eps = c.rms_norm_eps;
        let sliding = c.sliding_layers[l];
        let inv_freq = if sliding {
            &self.inv_freq_local
        } else {
            &self.inv_freq_global
        };

        let mut xn = vec![0f32; n * d];
        rms_norm_rows(x, &nrm.attn, eps, &mut xn);
        let mut q = vec![0f32; n * qd];
        let mut k = vec![0f32; n * kvd];
        let mut v = vec![0f32; n * kvd];
        mm(&w.q.view(u), &xn, n, &mut q);
        mm(&w.k.view(u), &xn, n, &mut k);
        mm(&w.v.view(u), &xn, n, &mut v);
        let qscale = 1.0 / c.query_pre_attn_scalar.sqrt();
        for t in 0..n {
            for h in q[t * qd..(t + 1) * qd].chunks_mut(hd) {
                rms_norm_inplace(h, &nrm.q, eps);
                rope_neox(h, pos0 + t, inv_freq);
                h.iter_mut().for_each(|v| *v *= qscale);
            }
            for h in k[t * kvd..(t + 1) * kvd].chunks_mut(hd) {
                rms_norm_inplace(h, &nrm.k, eps);
                rope_neox(h, pos0 + t, inv_freq);
            }
        }
        cache.k[l][pos0 * kvd..(pos0 + n) * kvd].copy_from_slice(&k);
        cache.v[l][pos0 * kvd..(pos0 + n) * kvd].copy_from_slice(&v);
        let shape = AttnShape {
            n_heads: c.num_attention_heads,
            n_kv_heads: c.num_key_value_heads,
            head_dim: hd,
            window: sliding.then_some(c.sliding_window),
            softcap: c.attn_logit_softcapping,
        };
        let mut att = vec![0f32; n * qd];
        attention(&shape, &q, &cache.k[l], &cache.v[l], pos0, &mut att);
        let mut o = vec![0f32; n * d];
        mm(&w.o.view(u), &att, n, &mut o);
        add_post_normed(x, &mut o, &nrm.post_attn, eps);

        // feed-forward (GeGLU)
        rms_norm_rows(x, &nrm.ffn, eps, &mut xn);
        let mut g = vec![0f32; n * ff];
        let mut up = vec![0f32; n * ff];
        mm(&w.gate.view(u), &xn, n, &mut g);
        mm(&w.up.view(u), &xn, n, &mut up);
        g.iter_mut()
            .zip(&up)
            .for_each(|(a, b)| *a = gelu_tanh(*a) * b);
        mm(&w.down.view(u), &g, n, &mut o);
        add_post_normed(x, &mut o, &nrm.post_ffw, eps);
    }
}

impl Model for Gemma3 {
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn context_length(&self) -> usize {
        self.config.max_position_embeddings
    }

    fn new_cache(&self, n_ctx: usize) -> KvCache {
        KvCache::new(
            self.config.num_hidden_layers,
            n_ctx.min(self.config.max_position_embeddings),
            self.config.kv_dim(),
        )
    }

    fn placement(&self) -> &Placement {
        &self.placement
    }

    fn forward(
        &self,
        store: &mut WeightStore,
        cache: &mut KvCache,
        tokens: &[u32],
        logits: Logits,
    ) -> Result<Vec<f32>> {
        let c = &self.config;
        // announce every streamed read of this pass, in order
        let plan = |s: &mut WeightStore| {
            self.embedding.plan(s, tokens, c.hidden_size);
            s.plan(self.layers.iter().map(|(u, _)| *u));
            self.head.plan(s);
        };
        super::run_pass(store, cache, tokens, c.vocab_size, plan, |s, k| {
            self.forward_planned(s, k, tokens, logits)
        })
    }
}

impl Gemma3 {
    fn forward_planned(
        &self,
        store: &mut WeightStore,
        cache: &mut KvCache,
        tokens: &[u32],
        logits: Logits,
    ) -> Result<Vec<f32>> {
        let c = &self.config;
        let (n, d, vocab) = (tokens.len(), c.hidden_size, c.vocab_size);
        let pos0 = cache.len;
        let mut x = vec![0f32; n * d];
        self.embed(store, tokens, &mut x)?;
        for (l, (unit, w)) in self.layers.iter().enumerate() {
            store.with_unit(*unit, |u| self.layer(l, w, u, cache, pos0, &mut x))?;
        }
        let mut out =
            self.head
                .final_logits(store, &x, &self.output_norm, c.rms_norm_eps, logits, vocab)?;
        if let Some(cap) = c.final_logit_softcapping {
            out.iter_mut().for_each(|v| *v = softcap(*v, cap));
        }
        Ok(out)
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
