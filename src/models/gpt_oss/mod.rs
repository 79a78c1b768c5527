//! GPT-OSS (from Hugging Face checkpoints here, from GGUF in [`self::gguf`]), as
//! transformers 5 defines it
//! (`models/gpt_oss/modeling_gpt_oss.py`): RMSNorm before attention and before the MoE block;
//! grouped-query attention with biases on q/k/v/o, NeoX-style RoPE (`rotate_half` over the two
//! halves of a head) with YaRN frequencies whose attention factor multiplies cos and sin (so
//! both q and k), scores scaled by `head_dim^-½`, a learned sink logit per head in the softmax
//! ([`crate::models::layers::attention_with_sinks`]), and `layer_types` alternating `sliding_attention` (window
//! `sliding_window`) and `full_attention`; router `x Wᵣᵀ + bᵣ`, top-k then a softmax over the
//! kept logits ([`route_topk_softmax`]); experts
//! `gate_up = x W_gu + b_gu` with gate in the even and up in the odd outputs,
//! `gate = min(gate, limit)`, `up = clamp(up, −limit, limit)`,
//! `h = (up + 1) · gate · σ(α · gate)`, `out = h W_d + b_d` (`swiglu_alpha`, `swiglu_limit`);
//! final RMSNorm and LM head.
//!
//! Expert storage: BF16 checkpoints stack every layer's experts input-major
//! (`gate_up_proj [E, H, 2I]`, `down_proj [E, I, H]`); one expert's slice is computed in place
//! with `kernels::matmul_t` (each stored row read once, no transposed copy, the same code for
//! resident and streamed experts, so streaming cannot change a bit). MXFP4 checkpoints store
//! `*_blocks [E, R, G, 16]` + `*_scales [E, R, G]` output-major; they are repacked into GGML
//! `MXFP4` rows (`quant::mxfp4::repack_hf_mxfp4`) once at load for resident experts, and as
//! each read lands for experts read on demand (by the expert store, whose cache then holds
//! them repacked), then computed by the MXFP4 kernels. GGUF files hold separate output-major
//! gate and up matrices, used as stored. The layouts and the expert FFN live in
//! `experts.rs`. Each (layer, expert) is one weight unit holding its matrices and
//! biases; spine units hold a layer's q/k/v/o and router weights. When the budget cannot hold
//! every weight the experts are read on demand through the expert store (`budget.rs`), which
//! with prefetch on reads the next layer's guessed experts (`moe::next_experts`,
//! router bias included).
//! A format's loader resolves and checks its tensors into a `Checkpoint`; `GptOss::build`
//! does the rest for both.

mod config;
mod experts;
pub mod gguf;

use std::path::PathBuf;

use anyhow::{bail, Result};

pub use self::config::Config;

use super::budget::{place, HeadTensors, Notes, OnDemand, WeightUnits};
use self::experts::{
    expert_ffn_on, mxfp4_transform, repack_expert, ExpertRef, ExpertTable, Packed,
};
use super::layers::generic::{gqa_attention_on, mm_on, norm_on, GqaOn, W};
use super::layers::{AttnShape, GqaRope};
use super::loading::{mat, unit_of, CheckpointFiles, MatRef, Tensors};
use super::moe::route_topk_softmax;
use super::moe_dev::{experts_on_with, ExpertStepOn};
use super::rope::RopeStyle;
use super::decoder::{Blocks, Decoder, Dims, RouterParts, ScratchOn};
use super::device::Device;
use crate::backend::Op;
use super::batch::Seqs;
use super::LoadOptions;
use crate::quant::GgmlType;
use crate::source::hf::HfModel;
use crate::source::tensor::TensorInfo;
use crate::store::{AlignedBuf, Unit, UnitBytes, WeightStore};

/// A layer's spine matrices inside its unit.
pub struct LayerMats {
    q: MatRef,
    k: MatRef,
    v: MatRef,
    o: MatRef,
    router: MatRef,
}

/// A layer's small vectors, resident as f32.
struct LayerVecs {
    input_norm: Vec<f32>,
    post_norm: Vec<f32>,
    q_bias: Vec<f32>,
    k_bias: Vec<f32>,
    v_bias: Vec<f32>,
    o_bias: Vec<f32>,
    router_bias: Vec<f32>,
    /// One sink logit per query head.
    sinks: Vec<f32>,
}

/// A loaded GPT-OSS model.
pub type GptOss = Decoder<GptOssBlocks>;

/// The GPT-OSS part of a [`Decoder`]: config, per-layer vectors, routed experts, YaRN RoPE.
pub struct GptOssBlocks {
    pub config: Config,
    vecs: Vec<LayerVecs>,
    experts: ExpertTable,
    inv_freq: Vec<f32>,
    attn_factor: f32,
}

/// The tensors of one layer of a GPT-OSS checkpoint, checked by its format's loader.
struct LayerTensors {
    /// `q` (`[H, q_dim]`), `k`, `v` (`[H, kv_dim]`), `o` (`[q_dim, H]`), router
    /// (`[H, n_experts]`), GGML shape order.
    pub spine: [TensorInfo; 5],
    /// Input norm and post-attention norm (`H`), q/k/v/o biases (`q_dim`, `kv_dim`, `kv_dim`,
    /// `H`), router bias (`n_experts`), sinks (`n_heads`).
    pub vecs: [TensorInfo; 8],
    /// One entry per expert, sliced out of the stacked tensors.
    pub experts: Vec<ExpertTensors>,
}

/// One expert's tensors in their stored layout (see [`self::experts`]).
enum ExpertTensors {
    /// Hugging Face float experts: `gate_up`, `down`, `gate_up_bias`, `down_bias`.
    Float([TensorInfo; 4]),
    /// Hugging Face MXFP4 experts: `gate_up` blocks and scales, `down` blocks and scales,
    /// `gate_up_bias`, `down_bias`.
    Mxfp4([TensorInfo; 6]),
    /// GGUF experts: `gate`, `up`, `down`, and their three biases.
    Split([TensorInfo; 6]),
}

/// A GPT-OSS checkpoint's tensors, resolved and checked (presence, shape, type) by a format's
/// loader ([`GptOss::load`] for Hugging Face folders, [`self::gguf`] for GGUF), for
/// the shared [`GptOss::build`].
struct Checkpoint {
    pub files: Vec<PathBuf>,
    /// The pack `files` belong to (its relocation to physical files and expert checksums).
    pub pack: Option<std::sync::Arc<crate::source::pack::PackInfo>>,
    /// `[H, vocab]`.
    pub embd: TensorInfo,
    /// `[H, vocab]`; the embedding itself when tied.
    pub head: TensorInfo,
    /// `H`.
    pub final_norm: TensorInfo,
    pub layers: Vec<LayerTensors>,
    /// The repacked layout of Hugging Face MXFP4 experts.
    pub packed: Option<Packed>,
}

impl GptOss {
    /// Loads a `gpt_oss` checkpoint folder (BF16/F16/F32 experts, or MXFP4 experts when
    /// `quantization_config.quant_method` is `mxfp4`) under `opts`: checks every tensor's
    /// presence, shape and dtype, then builds the model as GGUF files are (see the module
    /// header): store units, residency under the RAM budget, resident reads, the streamer.
    ///
    /// Errors: config errors ([`Config::from_json`]), a missing or mis-shaped tensor (named
    /// with the folder), a hidden or intermediate size not a multiple of 32 for MXFP4, a
    /// budget too small for KV cache, activations and stream buffers, an unreadable file.
    pub fn load(hf: &HfModel, opts: &LoadOptions) -> Result<(Self, WeightStore)> {
        let label = hf.dir.display().to_string();
        let c = Config::from_json(&hf.config, &hf.config_path().display().to_string())?;
        let ts = Tensors::hf(label.clone(), &hf.tensors);
        let (d, ff, qd, kvd) = (c.hidden_size, c.intermediate_size, c.q_dim(), c.kv_dim());
        let (ne, nh) = (c.num_local_experts, c.num_attention_heads);
        if c.mxfp4() && !(d.is_multiple_of(32) && ff.is_multiple_of(32)) {
            bail!("{label}: MXFP4 experts need hidden_size and intermediate_size divisible by 32 (got {d}, {ff})");
        }
        let get = |name: &str, shape: &[usize]| ts.get(name, shape).cloned();
        let embd = get("model.embed_tokens.weight", &[d, c.vocab_size])?;
        let head = if c.tie_word_embeddings {
            embd.clone()
        } else {
            get("lm_head.weight", &[d, c.vocab_size])?
        };
        let final_norm = get("model.norm.weight", &[d])?;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        let mut packed = None;
        for l in 0..c.num_hidden_layers {
            let n = |s: &str| format!("model.layers.{l}.{s}");
            let spine = [
                get(&n("self_attn.q_proj.weight"), &[d, qd])?,
                get(&n("self_attn.k_proj.weight"), &[d, kvd])?,
                get(&n("self_attn.v_proj.weight"), &[d, kvd])?,
                get(&n("self_attn.o_proj.weight"), &[qd, d])?,
                get(&n("mlp.router.weight"), &[d, ne])?,
            ];
            let vecs = [
                get(&n("input_layernorm.weight"), &[d])?,
                get(&n("post_attention_layernorm.weight"), &[d])?,
                get(&n("self_attn.q_proj.bias"), &[qd])?,
                get(&n("self_attn.k_proj.bias"), &[kvd])?,
                get(&n("self_attn.v_proj.bias"), &[kvd])?,
                get(&n("self_attn.o_proj.bias"), &[d])?,
                get(&n("mlp.router.bias"), &[ne])?,
                get(&n("self_attn.sinks"), &[nh])?,
            ];
            let x = |s: &str| format!("model.layers.{l}.mlp.experts.{s}");
            // stacked over the experts, or listed per expert (`NAME[E]`, as in a pack)
            let gub = ts.stacked(&x("gate_up_proj_bias"), &[2 * ff, ne])?;
            let db = ts.stacked(&x("down_proj_bias"), &[d, ne])?;
            let experts = if c.mxfp4() {
                let (gd, gf) = (d / 32, ff / 32);
                let i8 = GgmlType::I8;
                let gb = ts.stacked_raw(&x("gate_up_proj_blocks"), &[16, gd, 2 * ff, ne], i8)?;
                let gs = ts.stacked_raw(&x("gate_up_proj_scales"), &[gd, 2 * ff, ne], i8)?;
                let dbk = ts.stacked_raw(&x("down_proj_blocks"), &[16, gf, d, ne], i8)?;
                let ds = ts.stacked_raw(&x("down_proj_scales"), &[gf, d, ne], i8)?;
                let bias_ty = gub[0].ty;
                if gub.iter().chain(&db).any(|t| t.ty != bias_ty) {
                    bail!(
                        "{label}: '{}' and '{}' have different types",
                        x("gate_up_proj_bias"),
                        x("down_proj_bias")
                    );
                }
                packed = Some(Packed {
                    gate_up: 2 * ff * gd * 17,
                    down: d * gf * 17,
                    gate_up_bias: gub[0].n_bytes as usize,
                    down_bias: db[0].n_bytes as usize,
                    bias_ty,
                });
                (0..ne)
                    .map(|e| {
                        ExpertTensors::Mxfp4([&gb, &gs, &dbk, &ds, &gub, &db].map(|t| t[e].clone()))
                    })
                    .collect()
            } else {
                let gu = ts.stacked(&x("gate_up_proj"), &[2 * ff, d, ne])?;
                let dn = ts.stacked(&x("down_proj"), &[d, ff, ne])?;
                (0..ne)
                    .map(|e| ExpertTensors::Float([&gu, &dn, &gub, &db].map(|t| t[e].clone())))
                    .collect()
            };
            layers.push(LayerTensors {
                spine,
                vecs,
                experts,
            });
        }
        let ck = Checkpoint {
            files: hf.files.clone(),
            pack: hf.pack.clone(),
            embd,
            head,
            final_norm,
            layers,
            packed,
        };
        Self::build(c, ck, opts)
    }

    /// Builds the model from a checked checkpoint under `opts`: groups the tensors into store
    /// units (one per layer's spine, one per (layer, expert)), places them under the RAM
    /// budget ([`super::budget`]: everything resident when it fits; else LM head, embeddings
    /// and spine layers greedily, experts read on demand), reads the resident units (repacking
    /// resident Hugging Face MXFP4 experts) and opens the stores.
    ///
    /// Errors: a budget too small for KV cache, activations, stream and expert I/O buffers;
    /// an unreadable or short file (named, with the (layer, expert) for an expert).
    fn build(
        c: Config,
        ck: Checkpoint,
        opts: &LoadOptions,
    ) -> Result<(Self, WeightStore)> {
        let (d, ff, ne) = (c.hidden_size, c.intermediate_size, c.num_local_experts);
        let files = CheckpointFiles::open(&ck.files, ck.pack.as_ref(), opts.direct_io, opts.experts.verify)?;
        let (embd, head_t) = (&ck.embd, &ck.head);
        let final_norm = files.vector(&ck.final_norm)?;
        let mxfp4 = ck.layers.iter().flat_map(|l| &l.experts).any(|e| match e {
            ExpertTensors::Float(_) => false,
            ExpertTensors::Mxfp4(_) => true,
            ExpertTensors::Split(t) => t[0].ty == GgmlType::MXFP4,
        });
        let mut units: Vec<Unit> = Vec::new();
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        let mut vecs = Vec::with_capacity(c.num_hidden_layers);
        let mut table = ExpertTable {
            units: Vec::new(),
            packed: ck.packed,
            hidden: d,
            ff,
        };
        let mut expert_units = Vec::new();
        for lt in &ck.layers {
            let refs: Vec<&TensorInfo> = lt.spine.iter().collect();
            let (unit, place) = unit_of(&refs);
            let m: Vec<MatRef> = refs.iter().zip(&place).map(|(t, &p)| mat(t, p)).collect();
            layers.push((
                units.len(),
                LayerMats {
                    q: m[0],
                    k: m[1],
                    v: m[2],
                    o: m[3],
                    router: m[4],
                },
            ));
            units.push(unit);
            let v: Vec<Vec<f32>> = lt
                .vecs
                .iter()
                .map(|t| files.vector(t))
                .collect::<Result<_>>()?;
            let [input_norm, post_norm, q_bias, k_bias, v_bias, o_bias, router_bias, sinks] =
                <[Vec<f32>; 8]>::try_from(v).expect("eight vectors");
            vecs.push(LayerVecs {
                input_norm,
                post_norm,
                q_bias,
                k_bias,
                v_bias,
                o_bias,
                router_bias,
                sinks,
            });
            let mut le = Vec::with_capacity(ne);
            for et in &lt.experts {
                let list: &[TensorInfo] = match et {
                    ExpertTensors::Float(t) => t,
                    ExpertTensors::Mxfp4(t) | ExpertTensors::Split(t) => t,
                };
                let refs: Vec<&TensorInfo> = list.iter().collect();
                let (unit, place) = unit_of(&refs);
                let m: Vec<MatRef> = refs.iter().zip(&place).map(|(t, &p)| mat(t, p)).collect();
                let r = match et {
                    ExpertTensors::Float(_) => ExpertRef::Float {
                        gate_up: m[0],
                        down: m[1],
                        gate_up_bias: m[2],
                        down_bias: m[3],
                    },
                    ExpertTensors::Mxfp4(_) => ExpertRef::Mxfp4 {
                        gate_up_blocks: m[0],
                        gate_up_scales: m[1],
                        down_blocks: m[2],
                        down_scales: m[3],
                        gate_up_bias: m[4],
                        down_bias: m[5],
                    },
                    ExpertTensors::Split(_) => ExpertRef::Split {
                        gate: m[0],
                        up: m[1],
                        down: m[2],
                        gate_bias: m[3],
                        up_bias: m[4],
                        down_bias: m[5],
                    },
                };
                le.push((expert_units.len(), r));
                expert_units.push(unit);
            }
            table.units.push(le);
        }
        let mut w = WeightUnits::new(units, expert_units, &mut table.units);
        w.units = files.relocate_all(w.units);

        // --- budget -------------------------------------------------------------------------
        let mut placed = place(
            opts,
            &files.paths,
            w,
            HeadTensors::new(&files, head_t, embd, c.tie_word_embeddings),
            c.memory_needs(),
            OnDemand {
                per_tok: c.num_experts_per_tok,
                // Hugging Face MXFP4 experts are repacked as they land
                transform: mxfp4_transform(&table),
                pack: files.pack.clone(),
            },
            Notes {
                experts: if mxfp4 { " (MXFP4)" } else { "" },
                tail: "",
            },
        )?;
        let store = &mut placed.store;
        // resident MXFP4 experts: repack once, keep only the GGML layout
        if let Some(p) = table.packed {
            for le in &table.units {
                for (u, r) in le {
                    if store.is_resident(*u) {
                        store.transform_resident(*u, |b| {
                            repack_expert(b, r, &p, AlignedBuf::new(p.total()))
                        });
                    }
                }
            }
        }
        placed.placement.resident_bytes = placed.store.resident_bytes();
        let (inv_freq, attn_factor) = c.rope();
        let blocks = GptOssBlocks {
            inv_freq,
            attn_factor,
            config: c,
            vecs,
            experts: table,
        };
        let dims = {
            let c = &blocks.config;
            Dims::with_kv(
                c.hidden_size,
                c.vocab_size,
                c.max_position_embeddings,
                c.num_hidden_layers,
                c.rms_norm_eps as f32,
                c.kv_dim(),
            )
        };
        Ok(Decoder::placed(blocks, dims, layers, final_norm, placed))
    }
}

impl Blocks for GptOssBlocks {
    type Layer = LayerMats;

    /// Attention biases and the fused clamped-SwiGLU experts (stored input-major in Hugging
    /// Face BF16 checkpoints).
    fn needs(&self) -> (&'static str, &'static [Op]) {
        ("gpt_oss", &[Op::Bias, Op::MatmulT, Op::SwigluOai])
    }

    /// Every GPT-OSS layer is a MoE layer.
    fn is_moe(&self, _w: &LayerMats) -> bool {
        true
    }

    /// Attention (with its residual) and the router of layer `l` over the spine unit's bytes
    /// `u`: the post-attention normed rows in `s.xn` and the router logits (`n × n_experts`,
    /// bias added) in `s.router`.
    fn spine_on<D: Device>(
        &self,
        dev: &D,
        l: usize,
        w: &LayerMats,
        u: &UnitBytes,
        keep: bool,
        seqs: &mut Seqs<'_>,
        x: &mut D::Buf,
        s: &mut ScratchOn<D>,
    ) -> Result<()> {
        let c = &self.config;
        let (d, hd) = (c.hidden_size, c.head_dim());
        let n = seqs.rows();
        let v_ = &self.vecs[l];
        let eps = c.rms_norm_eps as f32;
        let v = |m: &MatRef| W { m: m.view(u), keep };
        s.xn = norm_on(dev, x, n * d, &v_.input_norm, eps)?;
        let shape = AttnShape {
            n_heads: c.num_attention_heads,
            n_kv_heads: c.num_key_value_heads,
            head_dim: hd,
            window: c.window(l),
            softcap: None,
        };
        let gqa = GqaOn {
            q: v(&w.q),
            k: v(&w.k),
            v: v(&w.v),
            o: v(&w.o),
            biases: Some([&v_.q_bias, &v_.k_bias, &v_.v_bias, &v_.o_bias]),
            qk_norm: None,
            sinks: Some(&v_.sinks),
        };
        // the YaRN attention factor multiplies cos and sin, so q and k each once
        let af = self.attn_factor;
        let rope = GqaRope {
            inv_freq: &self.inv_freq,
            style: RopeStyle::Neox,
            q_scale: af / (hd as f32).sqrt(),
            k_scale: af,
            eps,
        };
        let o = gqa_attention_on(dev, &shape, &gqa, &rope, &s.xn, seqs, l)?;
        dev.add(x, &o)?;
        s.xn = norm_on(dev, x, n * d, &v_.post_norm, eps)?;
        let mut logits = mm_on(dev, &v(&w.router), &s.xn, n)?;
        dev.add_rows(&mut logits, &v_.router_bias)?;
        s.router.resize(n * w.router.rows, 0.0);
        dev.download(&logits, &mut s.router)
    }

    /// Every layer's router, with its bias.
    fn router<'a>(&'a self, l: usize, w: &'a LayerMats) -> Option<RouterParts<'a>> {
        let v = &self.vecs[l];
        Some(RouterParts {
            router: w.router,
            norm: &v.post_norm,
            eps: self.config.rms_norm_eps as f32,
            bias: Some(&v.router_bias),
        })
    }

    fn n_experts(&self) -> usize {
        self.config.num_local_experts
    }

    /// Top-k then softmax over the kept logits ([`route_topk_softmax`]).
    fn route(&self, _l: usize, logits: &[f32]) -> Vec<(usize, f32)> {
        route_topk_softmax(logits, self.config.num_experts_per_tok)
    }

    /// GPT-OSS experts in their stored layout (`experts::expert_ffn_on`), through
    /// `moe_dev::experts_on_with`.
    fn experts_on<D: Device>(&self, dev: &D, step: ExpertStepOn<'_, D>) -> Result<()> {
        let c = &self.config;
        let (alpha, limit) = (c.swiglu_alpha as f32, c.swiglu_limit as f32);
        let t = &self.experts;
        let units = &t.units[step.layer];
        experts_on_with(dev, c.hidden_size, step, |e| units[e].0, |u, keep, e, xg, m| {
            expert_ffn_on(dev, &t.view(&units[e].1, u), keep, alpha, limit, xg, m)
        })
    }
}

/// The registry entry of GPT-OSS.
pub const FAMILY: crate::models::Family = crate::models::Family {
    name: "gpt_oss",
    model_types: &["gpt_oss"],
    gguf_architectures: &["gpt-oss"],
    load_hf: Some(|hf, o| GptOss::load(hf, o).map(crate::models::registry::boxed)),
    load_gguf: Some(|g, o| gguf::load(g, o).map(crate::models::registry::boxed)),
    check_hf: Some(|hf| Config::from_json(&hf.config, &hf.config_path().display().to_string()).map(drop)),
    check_gguf: Some(|g| gguf::config_from_gguf(g).map(drop)),
    experts: Some(crate::models::registry::ExpertNames {
        markers: &[".experts.", "_exps."],
        roles: &[
            &["gate_up_proj", "_gate_exps."],
            &["_up_exps."],
            &["down_proj", "_down_exps."],
        ],
    }),
    packable: true,
    synth: &["gpt_oss"],
};
