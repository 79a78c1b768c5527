//! DeepSeek V3 (and Kimi K2 text models) from Hugging Face checkpoints, as transformers 5.24
//! defines them (`models/deepseek_v3/modeling_deepseek_v3.py`): RMSNorm before attention and
//! before the feed-forward block; multi-head latent attention ([`crate::models::layers::mla`]) with an optional
//! low-rank query (`q_a_proj` → `q_a_layernorm` → `q_b_proj`, or `q_proj`), the KV latent
//! `kv_a_proj_with_mqa` → (`kv_a_layernorm`ed latent, shared rotary key) and `kv_b_proj`; YaRN
//! RoPE on the rotary parts; a dense SwiGLU MLP in the first `first_k_dense_replace` layers and
//! the MoE block after (sigmoid group-limited routing, [`super::moe::route_sigmoid_grouped`],
//! plus `n_shared_experts` shared experts as one SwiGLU of `n_shared_experts ×
//! moe_intermediate_size`); final RMSNorm and LM head.
//!
//! The KV cache holds the compressed latent per token and layer
//! ([`crate::models::KvCache::new_latent`]: `kv_lora_rank + qk_rope_head_dim` floats).
//!
//! Weights: BF16/F16/F32, or FP8 E4M3 with `weight_scale_inv` 128×128 block scales, repacked
//! when read into `GgmlType::F8_E4M3_B128` rows (see [`crate::quant::fp8`]). Multi-token-
//! prediction layers (`num_nextn_predict_layers`, stored as `model.layers.{N..}`) are ignored,
//! but for the first one when loaded with [`LoadOptions::mtp`] (`--draft mtp`): it becomes the
//! decoder's [`MtpLayer`] (layer index `N`: its spine unit after the decoder layers', its
//! routed experts in the same expert store, its own `shared_head.head` and `embed_tokens`, when
//! present, as chunked spine units).
//!
//! The same forward pass runs llama.cpp's `deepseek2` GGUF files: the tensors of either format
//! are resolved into one checked list (`self::tensors`, and
//! [`self::gguf`] for GGUF) and `DeepseekV3::build` makes the units.
//!
//! Weight units: one spine unit per layer (attention, and the dense MLP or the router and
//! shared experts) and one unit per (layer, routed expert); embeddings and LM head as in
//! [`super::embed_head`]. When the budget cannot hold every weight, the routed experts (never
//! the shared ones, nor the dense layers' MLPs) are read on demand through the expert store,
//! FP8 ones repacked as they land so that its cache holds them ready to compute
//! (`budget.rs`). With prefetch on, the next MoE layer's experts are guessed as
//! `moe::next_experts` describes (the dense layers have no router and guess nothing).

mod config;
pub mod gguf;
mod tensors;

use anyhow::Result;

pub use self::config::Config;

use super::budget::{place, HeadTensors, Notes, OnDemand, WeightUnits};
use self::tensors::{hf_checkpoint, unit_of_lins, Checkpoint, FfnTensors, KvB, Lin};
use super::layers::generic::{glu_mlp_on, mm_on, norm_on, W};
use super::layers::mixers::{mla_mixer, MlaLayer, MlaRope};
use super::loading::{CheckpointFiles, MatRef};
use super::moe::{route_sigmoid_grouped, ExpertMats, UnitExperts};
use super::moe_dev::{store_glu_experts_on, ExpertStepOn};
use super::decoder::{Blocks, CacheShape, ChunkedMatrix, Decoder, Dims, MtpLayer, RouterParts, ScratchOn};
use super::device::Device;
use super::embed_head::{head_chunks, Head};
use super::batch::Seqs;
use crate::backend::{Glu, MlaShape, Op};
use super::LoadOptions;
use crate::source::hf::HfModel;
use crate::source::tensor::TensorInfo;
use crate::store::{Fp8Pack, Unit, UnitBytes, WeightStore};

/// Attention weights of one layer.
struct Attn {
    /// `q_a_proj` and `q_b_proj`, or `q_proj` alone.
    q_a: Option<MatRef>,
    q_b: MatRef,
    kv_a: MatRef,
    kv_b: KvBRef,
    o: MatRef,
}

/// Where the latent's key/value up-projection lives ([`KvB`] as matrix views).
enum KvBRef {
    Joint(MatRef),
    Split { k: MatRef, v: MatRef },
}

/// The feed-forward part of a spine unit.
enum Ffn {
    Dense {
        gate: MatRef,
        up: MatRef,
        down: MatRef,
    },
    /// Router (`n_routed_experts × hidden`) and the shared experts' SwiGLU.
    Moe {
        router: MatRef,
        gate: MatRef,
        up: MatRef,
        down: MatRef,
    },
}

struct LayerNorms {
    input: Vec<f32>,
    q_a: Option<Vec<f32>>,
    kv_a: Vec<f32>,
    post_attn: Vec<f32>,
    /// `e_score_correction_bias` (MoE layers).
    bias: Vec<f32>,
}

/// One layer's matrices inside its spine unit.
pub struct Layer {
    attn: Attn,
    ffn: Ffn,
}

/// A loaded DeepSeek V3 model.
pub type DeepseekV3 = Decoder<DeepseekV3Blocks>;

/// The DeepSeek V3 part of a [`Decoder`]: config, per-layer norms, routed experts, RoPE.
pub struct DeepseekV3Blocks {
    pub config: Config,
    norms: Vec<LayerNorms>,
    experts: UnitExperts,
    inv_freq: Vec<f32>,
    rope_att: f32,
    /// `eps` of the q/kv latent RMSNorms.
    lora_norm_eps: f32,
}

impl DeepseekV3 {
    /// Loads a `deepseek_v3` / `kimi_k2` checkpoint folder under `opts`: checks every tensor's
    /// presence, shape and dtype (`hf_checkpoint`), then `Self::build`.
    ///
    /// Errors: config errors ([`Config::from_json`]), a missing or mis-shaped tensor or scale
    /// (named with the folder), a budget too small for KV cache, activations and stream
    /// buffers, an unreadable file.
    pub fn load(hf: &HfModel, opts: &LoadOptions) -> Result<(Self, WeightStore)> {
        let c = Config::from_json(&hf.config, &hf.config_path().display().to_string())?;
        let ck = hf_checkpoint(&c, hf, opts.mtp)?;
        Self::build(c, ck, opts)
    }

    /// Builds the model over checked tensors `ck` (from either format): one spine unit per
    /// layer and one unit per (layer, routed expert), placed under the RAM budget by
    /// [`super::budget`] (everything resident when it fits; else LM head, embeddings and spine
    /// layers greedily, routed experts read on demand), the resident units read and the
    /// stores opened.
    ///
    /// Errors: a budget too small for KV cache, activations, stream and expert I/O buffers;
    /// an unreadable or short file (named, with the (layer, expert) for an expert).
    fn build(
        c: Config,
        ck: Checkpoint,
        opts: &LoadOptions,
    ) -> Result<(Self, WeightStore)> {
        let (embd, head_t) = (&ck.embd, &ck.head);
        let files = CheckpointFiles::open(&ck.files, ck.pack.as_ref(), opts.direct_io, opts.experts.verify)?;
        let vec_of = |t: &TensorInfo| files.vector(t);
        let final_norm = vec_of(&ck.final_norm)?;

        let mut units: Vec<Unit> = Vec::new();
        let mut packs: Vec<Vec<Fp8Pack>> = Vec::new();
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        let mut norms = Vec::with_capacity(c.num_hidden_layers);
        let mut experts = UnitExperts { units: Vec::new() };
        let mut expert_units = Vec::new();
        let mut expert_packs = Vec::new();
        // the multi-token-prediction layer runs as layer `num_hidden_layers` (its spine unit
        // and experts after the decoder layers'), `eh_proj` first in its spine unit
        let mtp_t = ck.mtp.as_ref();
        let blocks_t = ck.layers.iter().map(|lt| (lt, None)).chain(
            mtp_t.map(|m| (&m.block, Some(&m.eh_proj))),
        );
        let mut mtp_parts = None;
        for (lt, eh) in blocks_t {
            let mut list: Vec<&Lin> = Vec::new();
            list.extend(eh);
            list.extend(lt.q_a.iter());
            list.push(&lt.q_b);
            list.push(&lt.kv_a);
            match &lt.kv_b {
                KvB::Joint(w) => list.push(w),
                KvB::Split { k, v } => list.extend([k, v]),
            }
            list.push(&lt.o);
            let mut routed: &[[Lin; 3]] = &[];
            match &lt.ffn {
                FfnTensors::Dense(m) => list.extend(m.iter()),
                FfnTensors::Moe {
                    router,
                    shared,
                    experts,
                } => {
                    list.push(router);
                    list.extend(shared.iter());
                    routed = experts;
                }
            }
            let (unit, pk, m) = unit_of_lins(&list);
            let mut m = m.into_iter();
            let mut next = || m.next().expect("one view per tensor");
            let eh_view = eh.map(|_| next());
            let q_a = lt.q_a.as_ref().map(|_| next());
            let q_b = next();
            let kv_a = next();
            let kv_b = match lt.kv_b {
                KvB::Joint(_) => KvBRef::Joint(next()),
                KvB::Split { .. } => KvBRef::Split {
                    k: next(),
                    v: next(),
                },
            };
            let attn = Attn {
                q_a,
                q_b,
                kv_a,
                kv_b,
                o: next(),
            };
            let ffn = match lt.ffn {
                FfnTensors::Dense(_) => Ffn::Dense {
                    gate: next(),
                    up: next(),
                    down: next(),
                },
                FfnTensors::Moe { .. } => Ffn::Moe {
                    router: next(),
                    gate: next(),
                    up: next(),
                    down: next(),
                },
            };
            match eh_view {
                Some(v) => mtp_parts = Some((units.len(), Layer { attn, ffn }, v)),
                None => layers.push((units.len(), Layer { attn, ffn })),
            }
            units.push(unit);
            packs.push(pk);
            norms.push(LayerNorms {
                input: vec_of(&lt.input_norm)?,
                q_a: lt.q_a_norm.as_ref().map(vec_of).transpose()?,
                kv_a: vec_of(&lt.kv_a_norm)?,
                post_attn: vec_of(&lt.post_attn_norm)?,
                bias: match &lt.bias {
                    Some(b) => vec_of(b)?,
                    None => Vec::new(),
                },
            });
            let mut le = Vec::new();
            for [g, u, dn] in routed {
                let (unit, pk, m) = unit_of_lins(&[g, u, dn]);
                le.push((
                    expert_units.len(),
                    ExpertMats {
                        gate: m[0],
                        up: m[1],
                        down: m[2],
                    },
                ));
                expert_units.push(unit);
                expert_packs.push(pk);
            }
            experts.units.push(le);
        }
        // the layer's own head and embeddings, in chunks no larger than a spine unit's read
        let slot = units.iter().map(|u| u.buffer_bytes()).max().unwrap_or(0).max(1 << 20);
        let mut chunked = |t: &TensorInfo| {
            let mut ch = Vec::new();
            for (u, r0, m) in head_chunks(t, slot) {
                ch.push((units.len(), r0, m));
                units.push(u);
                packs.push(Vec::new());
            }
            ch
        };
        let mtp_head = mtp_t.and_then(|m| m.head.as_ref()).map(&mut chunked);
        let mtp_embed = mtp_t.and_then(|m| m.embed.as_ref()).map(&mut chunked);
        let mut w = WeightUnits::new(units, expert_units, &mut experts.units);
        w.units = files.relocate_all(w.units);
        packs.extend(expert_packs);
        w.packs = packs;

        // --- budget -------------------------------------------------------------------------
        let placed = place(
            opts,
            &files.paths,
            w,
            HeadTensors::new(&files, head_t, embd, c.tie_word_embeddings),
            c.memory_needs(mtp_t.is_some()),
            // FP8 experts are repacked by the store as they land
            OnDemand {
                per_tok: c.num_experts_per_tok,
                transform: None,
                pack: files.pack.clone(),
            },
            Notes {
                experts: "",
                tail: &ck.note,
            },
        )?;
        let (inv_freq, rope_att) = c.rope_freqs();
        let blocks = DeepseekV3Blocks {
            lora_norm_eps: ck.lora_norm_eps,
            inv_freq,
            rope_att,
            config: c,
            norms,
            experts,
        };
        let dims = Dims {
            hidden_size: blocks.config.hidden_size,
            vocab_size: blocks.config.vocab_size,
            context_length: blocks.config.max_position_embeddings,
            num_layers: blocks.config.num_hidden_layers,
            final_norm_eps: blocks.config.rms_norm_eps as f32,
            cache: CacheShape::Latent {
                width: blocks.config.latent_dim(),
            },
        };
        let (m, store) = Decoder::placed(blocks, dims, layers, final_norm, placed);
        let Some(((unit, layer, eh_proj), t)) = mtp_parts.zip(mtp_t) else {
            return Ok((m, store));
        };
        let mtp = MtpLayer {
            index: m.blocks.config.num_hidden_layers,
            unit,
            layer,
            eh_proj,
            enorm: vec_of(&t.enorm)?,
            hnorm: vec_of(&t.hnorm)?,
            head_norm: vec_of(&t.head_norm)?,
            eps: m.blocks.config.rms_norm_eps as f32,
            head: mtp_head.map(Head::Chunks),
            embed: mtp_embed.map(|chunks| ChunkedMatrix { chunks }),
        };
        Ok((m.with_mtp(mtp), store))
    }
}

impl Blocks for DeepseekV3Blocks {
    type Layer = Layer;

    /// Multi-head latent attention with RoPE on its rotary parts.
    fn needs(&self) -> (&'static str, &'static [Op]) {
        ("deepseek_v3", &[Op::MlaAttention, Op::NormHead, Op::RopeTail])
    }

    fn is_moe(&self, w: &Layer) -> bool {
        matches!(w.ffn, Ffn::Moe { .. })
    }

    /// Attention of layer `l` (with its residual) over the spine unit's bytes `u`, then the
    /// post-attention norm into `s.xn` and either the dense MLP added to `x`, or the router
    /// logits (`n × n_routed_experts`) into `s.router` and the shared experts' output into
    /// `s.shared` (`n × hidden`).
    fn spine_on<D: Device>(
        &self,
        dev: &D,
        l: usize,
        w: &Layer,
        u: &UnitBytes,
        keep: bool,
        seqs: &mut Seqs<'_>,
        x: &mut D::Buf,
        s: &mut ScratchOn<D>,
    ) -> Result<()> {
        let (a, f) = (&w.attn, &w.ffn);
        let c = &self.config;
        let d = c.hidden_size;
        let n = seqs.rows();
        let nrm = &self.norms[l];
        let eps = c.rms_norm_eps as f32;
        let v = |m: &MatRef| W { m: m.view(u), keep };
        s.xn = norm_on(dev, x, n * d, &nrm.input, eps)?;
        let shape = MlaShape {
            n_heads: c.num_attention_heads,
            nope: c.qk_nope_head_dim,
            rope: c.qk_rope_head_dim,
            v: c.v_head_dim,
            rank: c.kv_lora_rank,
            scale: c.softmax_scale(),
        };
        let (kv_b, v_b) = match &a.kv_b {
            KvBRef::Joint(m) => (m.view(u), None),
            KvBRef::Split { k, v } => (k.view(u), Some(v.view(u))),
        };
        let ml = MlaLayer {
            q_a: match (&a.q_a, &nrm.q_a) {
                (Some(qa), Some(w)) => Some((v(qa), w.as_slice())),
                _ => None,
            },
            q: v(&a.q_b),
            kv_a: v(&a.kv_a),
            kv_a_norm: &nrm.kv_a,
            kv_b,
            v_b,
            keep,
            gate: None,
            o: v(&a.o),
        };
        let rope = MlaRope {
            inv_freq: &self.inv_freq,
            interleaved: c.rope_interleave,
            scale: self.rope_att,
        };
        let lora = self.lora_norm_eps;
        let o = mla_mixer(dev, &shape, &ml, Some(&rope), lora, &s.xn, seqs, l)?;
        dev.add(x, &o)?;
        s.xn = norm_on(dev, x, n * d, &nrm.post_attn, eps)?;
        match f {
            Ffn::Dense { gate, up, down } => {
                let o = glu_mlp_on(dev, Glu::Swiglu, [&v(gate), &v(up), &v(down)], &s.xn, n)?;
                dev.add(x, &o)
            }
            Ffn::Moe {
                router: r,
                gate,
                up,
                down,
            } => {
                let logits = mm_on(dev, &v(r), &s.xn, n)?;
                s.router.resize(n * r.rows, 0.0);
                dev.download(&logits, &mut s.router)?;
                let sh = glu_mlp_on(dev, Glu::Swiglu, [&v(gate), &v(up), &v(down)], &s.xn, n)?;
                s.shared = Some(sh);
                Ok(())
            }
        }
    }

    /// The router of a MoE layer (the first `first_k_dense_replace` layers have none).
    fn router<'a>(&'a self, l: usize, w: &'a Layer) -> Option<RouterParts<'a>> {
        let Ffn::Moe { router, .. } = &w.ffn else {
            return None;
        };
        Some(RouterParts {
            router: *router,
            norm: &self.norms[l].post_attn,
            eps: self.config.rms_norm_eps as f32,
            bias: None,
        })
    }

    fn n_experts(&self) -> usize {
        self.config.n_routed_experts
    }

    /// Sigmoid group-limited routing with layer `l`'s `e_score_correction_bias`
    /// ([`route_sigmoid_grouped`]).
    fn route(&self, l: usize, logits: &[f32]) -> Vec<(usize, f32)> {
        let c = &self.config;
        route_sigmoid_grouped(
            logits,
            &self.norms[l].bias,
            c.num_experts_per_tok,
            c.n_group,
            c.topk_group,
            c.norm_topk_prob,
            c.routed_scaling_factor as f32,
        )
    }

    /// SwiGLU experts from the store (`moe_dev::store_glu_experts_on`).
    fn experts_on<D: Device>(&self, dev: &D, step: ExpertStepOn<'_, D>) -> Result<()> {
        let d = self.config.hidden_size;
        store_glu_experts_on(dev, &self.experts, Glu::Swiglu, d, step)
    }
}

/// The registry entry of DeepSeek V3 (and Kimi K2).
pub const FAMILY: crate::models::Family = crate::models::Family {
    name: "deepseek_v3",
    model_types: &["deepseek_v3", "kimi_k2"],
    gguf_architectures: &["deepseek2"],
    load_hf: Some(|hf, o| DeepseekV3::load(hf, o).map(crate::models::registry::boxed)),
    load_gguf: Some(|g, o| gguf::load(g, o).map(crate::models::registry::boxed)),
    check_hf: Some(|hf| Config::from_json(&hf.config, &hf.config_path().display().to_string()).map(drop)),
    check_gguf: Some(|g| gguf::config_from_gguf(g).map(drop)),
    experts: Some(crate::models::registry::SWIGLU_EXPERTS),
    packable: true,
    synth: &["deepseek_v3"],
};
