//! Gemma 3 (text), as Hugging Face `transformers` (`models/gemma3/modeling_gemma3.py`) and
//! llama.cpp (`LLM_ARCH_GEMMA3`) define it: embeddings scaled by √hidden_size, RMSNorm before
//! and after attention and the feed-forward block, grouped-query attention with per-head q/k
//! RMSNorm, NeoX-style RoPE with one base for sliding-window layers and another for global
//! layers, GeGLU with tanh GELU, LM head tied to the embeddings.
//!
//! GGUF stores Gemma's norm weights with the `1 +` of `Gemma3RMSNorm` already added by
//! llama.cpp's converter, so here every norm is a plain RMSNorm with the stored weight.

mod config;

pub use config::Config;

use anyhow::Result;

use super::budget::streamed_payload;
use super::needs::Reserved;
use super::embed_head::{head_chunks, Embedding, Head};
use super::decoder::{Blocks, Decoder, Dims, RouterParts, ScratchOn};
use super::device::Device;
use super::layers::generic::{add_post_normed_on, glu_mlp_on, gqa_attention_on, norm_on, GqaOn, W};
use super::layers::{rope_inv_freq, softcap, AttnShape, GqaRope};
use super::loading::{mat, unit_of, CheckpointFiles, MatRef, Tensors};
use super::rope::RopeStyle;
use crate::backend::Glu;
use super::batch::Seqs;
use super::{LoadOptions, Placement};

use crate::source::gguf::GgufModel;
use crate::store::plan::{choose_resident, Candidate};
use crate::store::{Unit, UnitBytes, WeightStore};

/// Stream buffers used when any weight is streamed (double buffering: one being computed on,
/// one being read).
const STREAM_SLOTS: usize = 2;

/// One layer's matrices inside its spine unit.
pub struct LayerMats {
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
pub type Gemma3 = Decoder<Gemma3Blocks>;

/// The Gemma 3 part of a [`Decoder`]: config, per-layer norms, the two RoPE frequency sets.
pub struct Gemma3Blocks {
    pub config: Config,
    norms: Vec<LayerNorms>,
    inv_freq_global: Vec<f32>,
    inv_freq_local: Vec<f32>,
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
        // a dense family: never a pack (loading refuses packs of it)
        let files = CheckpointFiles::open(&g.files, None, opts.direct_io, false)?;
        let vec_of = |name: &str, n: usize| files.vector(ts.get(name, &[n])?);
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
        let Reserved {
            kv_bytes,
            scratch_bytes,
            n_ctx,
        } = c.memory_needs().reserve(opts);
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
        let fixed = kv_bytes + scratch_bytes;
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
                        let mib = |x: usize| crate::store::plan::size_text(x as u64);
                        return Err(crate::models::BudgetTooSmall {
                            budget: b as u64,
                            need: (fixed + stream_buf) as u64,
                            parts: format!(
                                "the KV cache for {n_ctx} tokens ({}), activations ({}) and stream buffers ({})",
                                mib(kv_bytes),
                                mib(scratch_bytes),
                                mib(stream_buf),
                            ),
                        }
                        .into());
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
        let streamed_bytes = streamed_payload(&units, &resident, 0..0);
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
            spine_streamed_bytes: streamed_bytes,
            stream_buffer_bytes: store.stream_buffer_bytes(),
            kv_bytes,
            scratch_bytes,
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
            numerics: Default::default(),
            kv_on_device: false,
            device_bytes: 0,
        };
        let scale = c.rope_scaling_factor.map_or(1.0, |f| 1.0 / f);
        let blocks = Gemma3Blocks {
            inv_freq_global: rope_inv_freq(hd, c.rope_theta, scale),
            inv_freq_local: rope_inv_freq(hd, c.rope_local_base_freq, 1.0),
            config: c,
            norms,
        };
        let dims = {
            let c = &blocks.config;
            Dims::with_kv(
                c.hidden_size,
                c.vocab_size,
                c.max_position_embeddings,
                c.num_hidden_layers,
                c.rms_norm_eps,
                c.kv_dim(),
            )
        };
        let m = Decoder::new(blocks, dims, layers, embedding, head, output_norm, placement);
        Ok((m, store))
    }
}

impl Blocks for Gemma3Blocks {
    type Layer = LayerMats;

    /// Every streamed read of a pass is announced at its start, in order.
    fn plan_whole_pass(&self) -> bool {
        true
    }

    /// Gemma scales the embeddings by √hidden_size.
    fn scale_embeddings(&self, x: &mut [f32]) {
        let scale = (self.config.hidden_size as f32).sqrt();
        x.iter_mut().for_each(|v| *v *= scale);
    }

    fn is_moe(&self, _w: &LayerMats) -> bool {
        false
    }

    /// The core ops only: every backend runs it.
    fn needs(&self) -> (&'static str, &'static [crate::backend::Op]) {
        ("gemma3", &[])
    }

    /// One decoder layer over the rows of `seqs` (each sequence at its positions), updating
    /// `x` in place.
    fn spine_on<D: Device>(
        &self,
        dev: &D,
        l: usize,
        w: &LayerMats,
        u: &UnitBytes,
        keep: bool,
        seqs: &mut Seqs<'_>,
        x: &mut D::Buf,
        _s: &mut ScratchOn<D>,
    ) -> Result<()> {
        let c = &self.config;
        let (d, hd) = (c.hidden_size, c.head_dim);
        let n = seqs.rows();
        let nrm = &self.norms[l];
        let eps = c.rms_norm_eps;
        let sliding = c.sliding_layers[l];
        let inv_freq = if sliding {
            &self.inv_freq_local
        } else {
            &self.inv_freq_global
        };
        let v = |m: &MatRef| W { m: m.view(u), keep };

        let xn = norm_on(dev, x, n * d, &nrm.attn, eps)?;
        let shape = AttnShape {
            n_heads: c.num_attention_heads,
            n_kv_heads: c.num_key_value_heads,
            head_dim: hd,
            window: sliding.then_some(c.sliding_window),
            softcap: c.attn_logit_softcapping,
        };
        let gqa = GqaOn {
            q: v(&w.q),
            k: v(&w.k),
            v: v(&w.v),
            o: v(&w.o),
            biases: None,
            qk_norm: Some([&nrm.q, &nrm.k]),
            sinks: None,
        };
        let rope = GqaRope {
            inv_freq,
            style: RopeStyle::Neox,
            q_scale: 1.0 / c.query_pre_attn_scalar.sqrt(),
            k_scale: 1.0,
            eps,
        };
        let o = gqa_attention_on(dev, &shape, &gqa, &rope, &xn, seqs, l)?;
        add_post_normed_on(dev, x, &o, n * d, &nrm.post_attn, eps)?;

        // feed-forward (GeGLU)
        let xn = norm_on(dev, x, n * d, &nrm.ffn, eps)?;
        let mlp = [&v(&w.gate), &v(&w.up), &v(&w.down)];
        let o = glu_mlp_on(dev, Glu::GegluTanh, mlp, &xn, n)?;
        add_post_normed_on(dev, x, &o, n * d, &nrm.post_ffw, eps)
    }

    /// Gemma 3 has no routed experts.
    fn router<'a>(&'a self, _l: usize, _w: &'a LayerMats) -> Option<RouterParts<'a>> {
        None
    }

    fn n_experts(&self) -> usize {
        0
    }

    fn route(&self, _l: usize, _logits: &[f32]) -> Vec<(usize, f32)> {
        Vec::new()
    }

    /// `final_logit_softcapping`, when the model has it.
    fn finish_logits(&self, logits: &mut [f32]) {
        if let Some(cap) = self.config.final_logit_softcapping {
            logits.iter_mut().for_each(|v| *v = softcap(*v, cap));
        }
    }
}

/// The registry entry of Gemma 3 (text, GGUF).
pub const FAMILY: crate::models::Family = crate::models::Family {
    name: "gemma3",
    model_types: &[],
    gguf_architectures: &["gemma3"],
    load_hf: None,
    load_gguf: Some(|g, o| Gemma3::load(g, o).map(crate::models::registry::boxed)),
    check_hf: None,
    check_gguf: Some(|g| Config::from_gguf(g).map(drop)),
    experts: None,
    packable: false,
    synth: &[],
};
