//! Kimi Linear (`model_type: kimi_linear`, e.g. Kimi-Linear-48B-A3B) from Hugging Face
//! checkpoints, as transformers 5.24 defines it (`models/kimi_linear/modeling_kimi_linear.py`):
//! RMSNorm before the token mixer and before the feed-forward block; the mixer of each layer is
//! either Kimi Delta Attention ([`crate::models::layers::kda`], [`kda_mixer`]: a recurrent state
//! per layer) or no-RoPE multi-head latent attention ([`mla_mixer`]: DeepSeek's
//! latent cache), as `linear_attn_config.full_attn_layers` / `layer_types` say
//! ([`Config::mixers`]); a dense SwiGLU MLP in the first `first_k_dense_replace` layers and
//! the MoE block after (sigmoid routing with `e_score_correction_bias`,
//! [`super::moe::route_sigmoid_grouped`], renormalized and times `routed_scaling_factor`, plus
//! the shared experts as one SwiGLU); final RMSNorm and LM head.
//!
//! llama.cpp's `kimi-linear` GGUF files load into the same forward pass ([`self::gguf`]).
//!
//! The session's cache holds, per MLA layer, one latent row per position (`kv_lora_rank +
//! qk_rope_head_dim` floats) and, per KDA layer, its recurrent state
//! ([`Config::kda_state`] floats: the short convolutions' last inputs and one
//! `head_dim × head_dim` matrix per head; [`crate::models::KvCache::with_state`]). Every pass runs the delta
//! rule in its recurrent form, so a prompt's logits equal token-at-a-time decoding bit for bit
//! ([`self::kda`] says why the chunked form is not used).
//!
//! Weight units: one spine unit per layer (mixer, dense MLP or router and shared experts) and
//! one per (layer, routed expert), placed under the RAM budget as DeepSeek V3's
//! (`models/budget.rs`); routed experts go through the expert store when they do not all fit.

pub(crate) mod config;
pub mod gguf;
mod tensors;

use anyhow::Result;

pub use self::config::Config;
pub use super::layers::hybrid::Mixer;

use super::layers::hybrid::a_log_of_neg_exp;
use super::layers::kda;
use super::layers::generic::{glu_mlp_on, mm_on, norm_on, W};
use super::layers::mixers::{kda_mixer, mla_mixer, KdaShape, KdaWeights, MlaLayer, KDA_MLA_OPS};
use self::tensors::{hf_checkpoint, Checkpoint, FfnTensors, KvB, MixTensors};
use super::budget::{place, HeadTensors, Notes, OnDemand, WeightUnits};
use super::decoder::{Blocks, CacheShape, Decoder, Dims, RouterParts, ScratchOn};
use super::device::Device;
use super::layers::mla::MlaShape;
use super::loading::{mat, unit_of, CheckpointFiles, MatRef};
use super::moe::{route_sigmoid_grouped, ExpertMats, UnitExperts};
use super::moe_dev::{store_glu_experts_on, ExpertStepOn};
use crate::backend::{Glu, Op};
use super::batch::Seqs;
use super::LoadOptions;
use crate::source::hf::HfModel;
use crate::source::tensor::TensorInfo;
use crate::store::{Unit, UnitBytes, WeightStore};


/// A layer's mixer matrices inside its spine unit.
enum Mix {
    /// `q`, `k`, `v`, `f_a`, `f_b`, `b`, `g_a`, `g_b`, `o`.
    Kda([MatRef; 9]),
    /// `q_a` (with `q_b` as `q`) or `q`, `kv_a`, `kv_b` (or llama.cpp's `k_b` with `v_b`),
    /// `o`.
    Mla {
        q_a: Option<MatRef>,
        q: MatRef,
        kv_a: MatRef,
        kv_b: MatRef,
        v_b: Option<MatRef>,
        o: MatRef,
    },
}

/// The feed-forward matrices inside a spine unit.
enum Ffn {
    Dense([MatRef; 3]),
    /// Router, then the shared experts' gate, up, down.
    Moe([MatRef; 4]),
}

/// One layer's matrices inside its spine unit.
pub struct Layer {
    mix: Mix,
    ffn: Ffn,
}

/// A layer's resident vectors.
struct Vecs {
    input: Vec<f32>,
    post_attn: Vec<f32>,
    /// `e_score_correction_bias` (MoE layers).
    bias: Vec<f32>,
    /// KDA: convolution taps (`3 · dim × kernel`), `A_log`, `dt_bias`, `o_norm`; MLA:
    /// `kv_a_layernorm` in `o_norm`, `q_a_layernorm` in `a_log`.
    conv: Vec<f32>,
    a_log: Vec<f32>,
    dt_bias: Vec<f32>,
    o_norm: Vec<f32>,
}

/// A loaded Kimi Linear model.
pub type KimiLinear = Decoder<KimiLinearBlocks>;

/// The Kimi Linear part of a [`Decoder`].
pub struct KimiLinearBlocks {
    pub config: Config,
    vecs: Vec<Vecs>,
    experts: UnitExperts,
    /// `eps` of the latent norms (1e-6 from Hugging Face folders, `rms_norm_eps` from GGUF as
    /// llama.cpp).
    lora_eps: f32,
}

impl KimiLinear {
    /// Loads a `kimi_linear` folder under `opts`.
    ///
    /// Errors: config errors ([`Config::from_json`]), a missing or mis-shaped tensor (named
    /// with the folder), a budget too small for the cache, activations and stream buffers, an
    /// unreadable file.
    pub fn load(hf: &HfModel, opts: &LoadOptions) -> Result<(Self, WeightStore)> {
        let c = Config::from_json(&hf.config, &hf.config_path().display().to_string())?;
        let ck = hf_checkpoint(&c, hf)?;
        Self::build(c, ck, opts)
    }

    fn build(c: Config, ck: Checkpoint, opts: &LoadOptions) -> Result<(Self, WeightStore)> {
        let files = CheckpointFiles::open(&ck.files, ck.pack.as_ref(), opts.direct_io, opts.experts.verify)?;
        let vec_of = |t: &TensorInfo| files.vector(t);
        let final_norm = vec_of(&ck.final_norm)?;
        let mut units: Vec<Unit> = Vec::new();
        let mut layers = Vec::with_capacity(ck.layers.len());
        let mut vecs = Vec::with_capacity(ck.layers.len());
        let mut experts = UnitExperts { units: Vec::new() };
        let mut expert_units = Vec::new();
        for lt in &ck.layers {
            let mut list: Vec<&TensorInfo> = Vec::new();
            let (mut conv, mut a_log, mut dt_bias) = (Vec::new(), Vec::new(), Vec::new());
            let o_norm;
            match &lt.mix {
                MixTensors::Kda(k) => {
                    list.extend(k.mats.iter());
                    for t in &k.conv {
                        conv.extend(vec_of(t)?);
                    }
                    a_log = vec_of(&k.a_log)?;
                    if ck.a_neg_exp {
                        a_log = a_log_of_neg_exp(&k.a_log.name, a_log)?;
                    }
                    dt_bias = vec_of(&k.dt_bias)?;
                    o_norm = vec_of(&k.o_norm)?;
                }
                MixTensors::Mla(m) => {
                    if let Some((qa, qn)) = &m.q_a {
                        list.push(qa);
                        a_log = vec_of(qn)?;
                    }
                    list.extend([&m.q, &m.kv_a]);
                    match &m.kv_b {
                        KvB::Joint(t) => list.push(t),
                        KvB::Split { k, v } => list.extend([k, v]),
                    }
                    list.push(&m.o);
                    o_norm = vec_of(&m.kv_a_norm)?;
                }
            }
            let mut routed: &[[TensorInfo; 3]] = &[];
            let mut bias = Vec::new();
            match &lt.ffn {
                FfnTensors::Dense(m) => list.extend(m.iter()),
                FfnTensors::Moe {
                    router,
                    bias: b,
                    shared,
                    experts,
                } => {
                    list.push(router);
                    list.extend(shared.iter());
                    bias = vec_of(b)?;
                    routed = experts;
                }
            }
            let (unit, place) = unit_of(&list);
            let mats: Vec<MatRef> = list.iter().zip(&place).map(|(t, &p)| mat(t, p)).collect();
            let mut it = mats.into_iter();
            let mut next = || it.next().expect("one view per tensor");
            let mix = match &lt.mix {
                MixTensors::Kda(_) => Mix::Kda(std::array::from_fn(|_| next())),
                MixTensors::Mla(m) => Mix::Mla {
                    q_a: m.q_a.as_ref().map(|_| next()),
                    q: next(),
                    kv_a: next(),
                    kv_b: next(),
                    v_b: matches!(m.kv_b, KvB::Split { .. }).then(&mut next),
                    o: next(),
                },
            };
            let ffn = match &lt.ffn {
                FfnTensors::Dense(_) => Ffn::Dense(std::array::from_fn(|_| next())),
                FfnTensors::Moe { .. } => Ffn::Moe(std::array::from_fn(|_| next())),
            };
            layers.push((units.len(), Layer { mix, ffn }));
            units.push(unit);
            vecs.push(Vecs {
                input: vec_of(&lt.input_norm)?,
                post_attn: vec_of(&lt.post_attn_norm)?,
                bias,
                conv,
                a_log,
                dt_bias,
                o_norm,
            });
            let mut le = Vec::new();
            for [g, u, dn] in routed {
                let (unit, p) = unit_of(&[g, u, dn]);
                le.push((
                    expert_units.len(),
                    ExpertMats {
                        gate: mat(g, p[0]),
                        up: mat(u, p[1]),
                        down: mat(dn, p[2]),
                    },
                ));
                expert_units.push(unit);
            }
            experts.units.push(le);
        }
        let mut w = WeightUnits::new(units, expert_units, &mut experts.units);
        w.units = files.relocate_all(w.units);

        let layer_vectors: usize = vecs
            .iter()
            .map(|v| v.input.len() + v.post_attn.len() + v.bias.len() + v.conv.len() + v.a_log.len() + v.dt_bias.len() + v.o_norm.len())
            .sum();
        let (embd, head_t) = (&ck.embd, &ck.head);
        let placed = place(
            opts,
            &files.paths,
            w,
            HeadTensors::new(&files, head_t, embd, c.tie_word_embeddings),
            c.memory_needs(layer_vectors),
            OnDemand {
                per_tok: c.num_experts_per_tok,
                transform: None,
                pack: files.pack.clone(),
            },
            Notes::default(),
        )?;
        let dims = Dims {
            hidden_size: c.hidden_size,
            vocab_size: c.vocab_size,
            context_length: c.max_position_embeddings,
            num_layers: c.num_hidden_layers,
            final_norm_eps: c.rms_norm_eps as f32,
            cache: CacheShape::Latent { width: c.latent_dim() },
        };
        let blocks = KimiLinearBlocks {
            config: c,
            vecs,
            experts,
            lora_eps: ck.lora_eps,
        };
        Ok(Decoder::placed(blocks, dims, layers, final_norm, placed))
    }
}

impl KimiLinearBlocks {
    fn kda_shape(&self) -> KdaShape {
        let c = &self.config;
        KdaShape {
            n_heads: c.linear_num_heads,
            head_dim: c.linear_head_dim,
            conv: c.linear_conv_kernel_dim,
            eps: c.rms_norm_eps as f32,
            lower_bound: None,
            l2_eps: kda::L2_EPS,
        }
    }

    fn mla_shape(&self) -> MlaShape {
        let c = &self.config;
        MlaShape {
            n_heads: c.num_attention_heads,
            nope: c.qk_nope_head_dim,
            rope: c.qk_rope_head_dim,
            v: c.v_head_dim,
            rank: c.kv_lora_rank,
            scale: 1.0 / (c.qk_head_dim() as f32).sqrt(),
        }
    }
}

impl Blocks for KimiLinearBlocks {
    type Layer = Layer;

    /// KDA (convolution, L2 norms, decay, the scan, the gated norm) and no-RoPE MLA.
    fn needs(&self) -> (&'static str, &'static [Op]) {
        ("kimi_linear", &KDA_MLA_OPS)
    }

    fn is_moe(&self, w: &Layer) -> bool {
        matches!(w.ffn, Ffn::Moe(_))
    }

    /// The mixer of layer `l` (KDA with its state, or MLA with its latent rows) and its
    /// residual, then the post-attention norm into `s.xn` and the dense MLP added to `x`, or
    /// the router logits and the shared experts' output.
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
        let c = &self.config;
        let d = c.hidden_size;
        let n = seqs.rows();
        let v = &self.vecs[l];
        let eps = c.rms_norm_eps as f32;
        let wv = |m: &MatRef| W { m: m.view(u), keep };
        s.xn = norm_on(dev, x, n * d, &v.input, eps)?;
        let o = match &w.mix {
            Mix::Kda(m) => {
                let [q, k, vv, f_a, f_b, b, g_a, g_b, om] = m.map(|r| wv(&r));
                let kw = KdaWeights {
                    q,
                    k,
                    v: vv,
                    f_a,
                    f_b,
                    b,
                    g_a: Some(g_a),
                    g_b,
                    o: om,
                    conv: &v.conv,
                    a_log: &v.a_log,
                    dt_bias: &v.dt_bias,
                    o_norm: &v.o_norm,
                };
                kda_mixer(dev, &self.kda_shape(), &kw, &s.xn, seqs, l)?
            }
            Mix::Mla {
                q_a,
                q,
                kv_a,
                kv_b,
                v_b,
                o: om,
            } => {
                let ml = MlaLayer {
                    q_a: q_a.as_ref().map(|m| (wv(m), v.a_log.as_slice())),
                    q: wv(q),
                    kv_a: wv(kv_a),
                    kv_a_norm: &v.o_norm,
                    kv_b: kv_b.view(u),
                    v_b: v_b.as_ref().map(|m| m.view(u)),
                    keep,
                    gate: None,
                    o: wv(om),
                };
                let sh = self.mla_shape();
                mla_mixer(dev, &sh, &ml, None, self.lora_eps, &s.xn, seqs, l)?
            }
        };
        dev.add(x, &o)?;
        s.xn = norm_on(dev, x, n * d, &v.post_attn, eps)?;
        match &w.ffn {
            Ffn::Dense([g, up, dn]) => {
                let o = glu_mlp_on(dev, Glu::Swiglu, [&wv(g), &wv(up), &wv(dn)], &s.xn, n)?;
                dev.add(x, &o)
            }
            Ffn::Moe([r, g, up, dn]) => {
                let logits = mm_on(dev, &wv(r), &s.xn, n)?;
                s.router.resize(n * r.rows, 0.0);
                dev.download(&logits, &mut s.router)?;
                let sh = glu_mlp_on(dev, Glu::Swiglu, [&wv(g), &wv(up), &wv(dn)], &s.xn, n)?;
                s.shared = Some(sh);
                Ok(())
            }
        }
    }

    fn router<'a>(&'a self, l: usize, w: &'a Layer) -> Option<RouterParts<'a>> {
        let Ffn::Moe([router, ..]) = &w.ffn else {
            return None;
        };
        Some(RouterParts {
            router: *router,
            norm: &self.vecs[l].post_attn,
            eps: self.config.rms_norm_eps as f32,
            bias: None,
        })
    }

    fn n_experts(&self) -> usize {
        self.config.n_routed_experts
    }

    /// Sigmoid routing with layer `l`'s `e_score_correction_bias` ([`route_sigmoid_grouped`]).
    fn route(&self, l: usize, logits: &[f32]) -> Vec<(usize, f32)> {
        let c = &self.config;
        route_sigmoid_grouped(
            logits,
            &self.vecs[l].bias,
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

    fn recurrent_state(&self, l: usize) -> usize {
        match self.config.mixers[l] {
            Mixer::Kda => self.config.kda_state(),
            Mixer::Mla => 0,
        }
    }
}

/// The expert naming of Kimi Linear: Hugging Face `block_sparse_moe.experts.E.{w1,w3,w2}`
/// (gate, up, down) and GGUF `ffn_{gate,up,down}_exps`, as the SwiGLU families.
pub const EXPERTS: crate::models::registry::ExpertNames = crate::models::registry::SWIGLU_EXPERTS;

/// The registry entry of Kimi Linear.
pub const FAMILY: crate::models::Family = crate::models::Family {
    name: "kimi_linear",
    model_types: &["kimi_linear"],
    gguf_architectures: &[gguf::ARCH],
    load_hf: Some(|hf, o| KimiLinear::load(hf, o).map(crate::models::registry::boxed)),
    load_gguf: Some(|g, o| gguf::load(g, o).map(crate::models::registry::boxed)),
    check_hf: Some(|hf| Config::from_json(&hf.config, &hf.config_path().display().to_string()).map(drop)),
    check_gguf: Some(|g| gguf::config_from_gguf(g).map(drop)),
    experts: Some(EXPERTS),
    packable: true,
    synth: &["kimi_linear"],
};
