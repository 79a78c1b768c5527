//! Qwen3 (dense) and Qwen3-MoE, as transformers 5 defines them
//! (`models/qwen3/modeling_qwen3.py`, `models/qwen3_moe/modeling_qwen3_moe.py`): RMSNorm with a
//! plain weight before attention and before the feed-forward block, grouped-query attention
//! with per-head q/k RMSNorm before NeoX-style RoPE (`rotate_half`), scores scaled by
//! `head_dim^-½`, SwiGLU MLP or the MoE block ([`super::moe`]), final RMSNorm, LM head tied to
//! the embeddings when `tie_word_embeddings`.
//!
//!
//! The same pass runs Llama (`models/llama/modeling_llama.py`: no q/k norm, `llama3` RoPE
//! frequencies from [`Config::rope_freqs`]) and Mixtral (`models/mixtral/modeling_mixtral.py`:
//! no q/k norm, every layer sparse with experts `block_sparse_moe.experts.E.{w1,w3,w2}` as
//! gate/up/down, router `block_sparse_moe.gate`, top-k always renormalised, attention limited
//! to `sliding_window` tokens when set).
//!
//! Checkpoints come as Hugging Face folders ([`Llama::load`]) or as GGUF files of llama.cpp's
//! `qwen3moe`, `qwen3` and `llama` architectures ([`self::gguf`]); each is resolved to a
//! `Checkpoint` of tensors and built by the same code. GGUF `llama` files rotate interleaved
//! pairs (llama.cpp's converter permuted their q/k rows), everything else NeoX pairs.
//!
//! Weight units: one *spine* unit per layer (q, k, v, o and either the dense MLP or the router)
//! and one unit per (layer, expert) holding its gate/up/down matrices; embeddings and LM head
//! as in [`super::embed_head`]. Streamed reads are planned as the pass goes: a layer's experts
//! right after its router ran, then the next layer's spine.

mod config;
pub mod gguf;

use anyhow::Result;

pub use self::config::Config;

use super::budget::{place, HeadTensors, Notes, OnDemand, WeightUnits};
use super::decoder::{Blocks, Decoder, Dims, RouterParts, ScratchOn};
use super::device::Device;
use super::layers::generic::{gqa_attention_on, glu_mlp_on, mm_on, norm_on, GqaOn, W};
use super::layers::{AttnShape, GqaRope};
use super::loading::{gate_up_down, mat, unit_of, CheckpointFiles, MatRef, Tensors};
use super::moe::{route_softmax_topk, ExpertMats, UnitExperts};
use super::moe_dev::{store_glu_experts_on, ExpertStepOn};
use super::rope::RopeStyle;
use crate::backend::Glu;
use super::batch::Seqs;
use super::LoadOptions;
use crate::source::hf::HfModel;
use crate::source::tensor::TensorInfo;
use crate::store::{Unit, UnitBytes, WeightStore};

/// The feed-forward part of a spine unit.
enum Ffn {
    /// SwiGLU MLP of `intermediate_size`.
    Dense {
        gate: MatRef,
        up: MatRef,
        down: MatRef,
    },
    /// The router (`n_experts × hidden`); experts live in their own units.
    Moe { router: MatRef },
}

/// One layer's matrices inside its spine unit.
pub struct LayerMats {
    q: MatRef,
    k: MatRef,
    v: MatRef,
    o: MatRef,
    ffn: Ffn,
}

struct LayerNorms {
    input: Vec<f32>,
    /// Per-head q/k RMSNorm weights (`head_dim`), Qwen3 families only.
    q: Option<Vec<f32>>,
    k: Option<Vec<f32>>,
    post_attn: Vec<f32>,
}

/// A loaded Qwen3, Qwen3-MoE, Llama or Mixtral model (the `llama` family).
pub type Llama = Decoder<LlamaBlocks>;

/// The `llama` family's part of a [`Decoder`]: its config, per-layer norms, routed experts
/// and RoPE.
pub struct LlamaBlocks {
    pub config: Config,
    norms: Vec<LayerNorms>,
    experts: UnitExperts,
    inv_freq: Vec<f32>,
    rope: RopeStyle,
}

/// The feed-forward tensors of one layer.
enum FfnTensors {
    /// SwiGLU MLP: gate, up (`[hidden, ff]` in GGML order), down (`[ff, hidden]`).
    Dense([TensorInfo; 3]),
    /// Router (`[hidden, n_experts]`) and each expert's gate, up, down (as for `Dense`, of
    /// the expert width). An expert's tensors may be byte ranges inside stacked tensors.
    Moe {
        router: TensorInfo,
        experts: Vec<[TensorInfo; 3]>,
    },
}

/// The tensors of one decoder layer, already checked for presence, shape and type.
struct LayerTensors {
    /// q (`[hidden, q_dim]`), k, v (`[hidden, kv_dim]`), o (`[q_dim, hidden]`).
    pub attn: [TensorInfo; 4],
    pub input_norm: TensorInfo,
    /// Per-head q/k RMSNorm weights (`head_dim`), Qwen3 families only.
    pub qk_norm: Option<[TensorInfo; 2]>,
    pub post_attn_norm: TensorInfo,
    pub ffn: FfnTensors,
}

/// A checkpoint resolved to tensors, whatever its format (Hugging Face folder or GGUF).
struct Checkpoint {
    pub files: Vec<std::path::PathBuf>,
    /// The pack `files` belong to (its relocation to physical files and expert checksums).
    pub pack: Option<std::sync::Arc<crate::source::pack::PackInfo>>,
    /// Token embeddings, `[hidden, vocab]`.
    pub embd: TensorInfo,
    /// LM head, `[hidden, vocab]`; `None` when tied to the embeddings.
    pub head: Option<TensorInfo>,
    pub final_norm: TensorInfo,
    pub layers: Vec<LayerTensors>,
    /// RoPE inverse frequencies (`head_dim / 2`, radians per token).
    pub inv_freq: Vec<f32>,
    pub rope: RopeStyle,
}

/// Resolves a Hugging Face folder's tensors (names of transformers' `Qwen3ForCausalLM`,
/// `Qwen3MoeForCausalLM`, `LlamaForCausalLM`, `MixtralForCausalLM`).
fn hf_checkpoint(c: &Config, hf: &HfModel) -> Result<Checkpoint> {
    let ts = Tensors::hf(hf.dir.display().to_string(), &hf.tensors);
    let (d, ff, qd, kvd, hd) = (
        c.hidden_size,
        c.intermediate_size,
        c.q_dim(),
        c.kv_dim(),
        c.head_dim(),
    );
    let (ne, eff) = (c.n_experts(), c.expert_ff());
    let mixtral = c.model_type == "mixtral";
    // (router, expert prefix, gate, up, down) tensor names
    let (router_name, expert_prefix, [eg, eu, ed]) = if mixtral {
        (
            "block_sparse_moe.gate",
            "block_sparse_moe",
            ["w1", "w3", "w2"],
        )
    } else {
        ("mlp.gate", "mlp", ["gate_proj", "up_proj", "down_proj"])
    };
    let get = |name: &str, shape: &[usize]| ts.get(name, shape).cloned();
    let embd = get("model.embed_tokens.weight", &[d, c.vocab_size])?;
    let head = match c.tie_word_embeddings {
        true => None,
        false => Some(get("lm_head.weight", &[d, c.vocab_size])?),
    };
    let mut layers = Vec::with_capacity(c.num_hidden_layers);
    for l in 0..c.num_hidden_layers {
        let n = |s: &str| format!("model.layers.{l}.{s}.weight");
        let attn = [
            get(&n("self_attn.q_proj"), &[d, qd])?,
            get(&n("self_attn.k_proj"), &[d, kvd])?,
            get(&n("self_attn.v_proj"), &[d, kvd])?,
            get(&n("self_attn.o_proj"), &[qd, d])?,
        ];
        let ffn = if c.is_moe_layer(l) {
            let router = get(&n(router_name), &[d, ne])?;
            let experts = (0..ne)
                .map(|e| {
                    let x = |s: &str| {
                        format!("model.layers.{l}.{expert_prefix}.experts.{e}.{s}.weight")
                    };
                    Ok([
                        get(&x(eg), &[d, eff])?,
                        get(&x(eu), &[d, eff])?,
                        get(&x(ed), &[eff, d])?,
                    ])
                })
                .collect::<Result<_>>()?;
            FfnTensors::Moe { router, experts }
        } else {
            FfnTensors::Dense(gate_up_down(get, ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"].map(&n), d, ff)?)
        };
        layers.push(LayerTensors {
            attn,
            input_norm: get(&n("input_layernorm"), &[d])?,
            qk_norm: match c.has_qk_norm() {
                true => Some([
                    get(&n("self_attn.q_norm"), &[hd])?,
                    get(&n("self_attn.k_norm"), &[hd])?,
                ]),
                false => None,
            },
            post_attn_norm: get(&n("post_attention_layernorm"), &[d])?,
            ffn,
        });
    }
    Ok(Checkpoint {
        files: hf.files.clone(),
        pack: hf.pack.clone(),
        embd,
        head,
        final_norm: get("model.norm.weight", &[d])?,
        layers,
        inv_freq: c.rope_freqs(),
        rope: RopeStyle::Neox,
    })
}

impl Llama {
    /// Loads a `qwen3`, `qwen3_moe`, `llama` or `mixtral` checkpoint folder under `opts`:
    /// checks every tensor's presence, shape and dtype, plans residency under the RAM budget
    /// (LM head, embeddings, spine layers, then experts, greedily), reads the resident units
    /// and starts the streamer.
    ///
    /// Errors: config errors ([`Config::from_json`]), a missing or mis-shaped tensor (named
    /// with the folder), a budget too small for KV cache, activations and stream buffers, an
    /// unreadable file.
    pub fn load(hf: &HfModel, opts: &LoadOptions) -> Result<(Self, WeightStore)> {
        let c = Config::from_json(&hf.config, &hf.config_path().display().to_string())?;
        let ck = hf_checkpoint(&c, hf)?;
        Self::build(c, ck, opts)
    }

    /// Builds the model over resolved tensors: groups them into units (one spine unit per
    /// layer, one unit per (layer, expert)), plans residency under `opts.ram_budget`, reads
    /// the norms and the resident units and opens the store.
    ///
    /// Errors: a budget too small for KV cache, activations and stream buffers; an unreadable
    /// file.
    fn build(
        c: Config,
        ck: Checkpoint,
        opts: &LoadOptions,
    ) -> Result<(Self, WeightStore)> {
        let embd = &ck.embd;
        let head_t = ck.head.as_ref().unwrap_or(embd);
        let tied = ck.head.is_none();
        let files = CheckpointFiles::open(&ck.files, ck.pack.as_ref(), opts.direct_io, opts.experts.verify)?;
        let vec_of = |t: &TensorInfo| files.vector(t);
        let final_norm = vec_of(&ck.final_norm)?;

        let mut units: Vec<Unit> = Vec::new();
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        let mut norms = Vec::with_capacity(c.num_hidden_layers);
        let mut experts = UnitExperts { units: Vec::new() };
        let mut expert_units = Vec::new();
        for lt in &ck.layers {
            let mut list: Vec<&TensorInfo> = lt.attn.iter().collect();
            match &lt.ffn {
                FfnTensors::Dense(m) => list.extend(m.iter()),
                FfnTensors::Moe { router, .. } => list.push(router),
            }
            let (unit, place) = unit_of(&list);
            let m: Vec<MatRef> = list.iter().zip(&place).map(|(t, &p)| mat(t, p)).collect();
            let ffn = match &lt.ffn {
                FfnTensors::Moe { .. } => Ffn::Moe { router: m[4] },
                FfnTensors::Dense(_) => Ffn::Dense {
                    gate: m[4],
                    up: m[5],
                    down: m[6],
                },
            };
            layers.push((
                units.len(),
                LayerMats {
                    q: m[0],
                    k: m[1],
                    v: m[2],
                    o: m[3],
                    ffn,
                },
            ));
            units.push(unit);
            norms.push(LayerNorms {
                input: vec_of(&lt.input_norm)?,
                q: lt.qk_norm.as_ref().map(|t| vec_of(&t[0])).transpose()?,
                k: lt.qk_norm.as_ref().map(|t| vec_of(&t[1])).transpose()?,
                post_attn: vec_of(&lt.post_attn_norm)?,
            });
            let mut le = Vec::new();
            if let FfnTensors::Moe { experts: xs, .. } = &lt.ffn {
                for x in xs {
                    let list: Vec<&TensorInfo> = x.iter().collect();
                    let (unit, place) = unit_of(&list);
                    let m: Vec<MatRef> = list.iter().zip(&place).map(|(t, &p)| mat(t, p)).collect();
                    le.push((
                        expert_units.len(),
                        ExpertMats {
                            gate: m[0],
                            up: m[1],
                            down: m[2],
                        },
                    ));
                    expert_units.push(unit);
                }
            }
            experts.units.push(le);
        }
        let mut w = WeightUnits::new(units, expert_units, &mut experts.units);
        w.units = files.relocate_all(w.units);

        // --- budget -------------------------------------------------------------------------
        let qk_norm = ck.layers.iter().any(|l| l.qk_norm.is_some());
        let placed = place(
            opts,
            &files.paths,
            w,
            HeadTensors::new(&files, head_t, embd, tied),
            c.memory_needs(qk_norm),
            OnDemand {
                per_tok: c.num_experts_per_tok.unwrap_or(1),
                transform: None,
                pack: files.pack.clone(),
            },
            Notes::default(),
        )?;
        let blocks = LlamaBlocks {
            inv_freq: ck.inv_freq,
            rope: ck.rope,
            config: c,
            norms,
            experts,
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

impl Blocks for LlamaBlocks {
    type Layer = LayerMats;

    fn is_moe(&self, w: &LayerMats) -> bool {
        matches!(w.ffn, Ffn::Moe { .. })
    }

    /// The core ops only: every backend runs it.
    fn needs(&self) -> (&'static str, &'static [crate::backend::Op]) {
        ("llama", &[])
    }

    /// Attention (with its residual) and the start of the feed-forward block of layer `l`:
    /// the dense SwiGLU MLP added to `x`, or the router logits (`n × n_experts`).
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
        let nrm = &self.norms[l];
        let eps = c.rms_norm_eps as f32;
        let v = |m: &MatRef| W { m: m.view(u), keep };
        s.xn = norm_on(dev, x, n * d, &nrm.input, eps)?;
        let shape = AttnShape {
            n_heads: c.num_attention_heads,
            n_kv_heads: c.n_kv_heads(),
            head_dim: hd,
            window: c.attn_window(),
            softcap: None,
        };
        let gqa = GqaOn {
            q: v(&w.q),
            k: v(&w.k),
            v: v(&w.v),
            o: v(&w.o),
            biases: None,
            qk_norm: nrm.q.as_deref().zip(nrm.k.as_deref()).map(|(q, k)| [q, k]),
            sinks: None,
        };
        let rope = GqaRope {
            inv_freq: &self.inv_freq,
            style: self.rope,
            q_scale: 1.0 / (hd as f32).sqrt(),
            k_scale: 1.0,
            eps,
        };
        let o = gqa_attention_on(dev, &shape, &gqa, &rope, &s.xn, seqs, l)?;
        dev.add(x, &o)?;
        s.xn = norm_on(dev, x, n * d, &nrm.post_attn, eps)?;
        match &w.ffn {
            Ffn::Dense { gate, up, down } => {
                let o = glu_mlp_on(dev, Glu::Swiglu, [&v(gate), &v(up), &v(down)], &s.xn, n)?;
                dev.add(x, &o)
            }
            Ffn::Moe { router: r } => {
                let logits = mm_on(dev, &v(r), &s.xn, n)?;
                s.router.resize(n * r.rows, 0.0);
                dev.download(&logits, &mut s.router)
            }
        }
    }

    fn router<'a>(&'a self, l: usize, w: &'a LayerMats) -> Option<RouterParts<'a>> {
        let Ffn::Moe { router } = &w.ffn else {
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
        self.config.n_experts()
    }

    /// Top-k softmax routing ([`route_softmax_topk`]).
    fn route(&self, _l: usize, logits: &[f32]) -> Vec<(usize, f32)> {
        let c = &self.config;
        route_softmax_topk(logits, c.num_experts_per_tok.unwrap_or(1), c.renorm_topk())
    }

    /// SwiGLU experts from the store, on the device (`moe_dev::store_glu_experts_on`).
    fn experts_on<D: Device>(&self, dev: &D, step: ExpertStepOn<'_, D>) -> Result<()> {
        let d = self.config.hidden_size;
        store_glu_experts_on(dev, &self.experts, Glu::Swiglu, d, step)
    }
}

/// The registry entry of the Llama family (Qwen3, Qwen3-MoE, Llama, Mixtral).
pub const FAMILY: crate::models::Family = crate::models::Family {
    name: "llama",
    model_types: &["qwen3", "qwen3_moe", "llama", "mixtral"],
    gguf_architectures: &gguf::ARCHITECTURES,
    load_hf: Some(|hf, o| Llama::load(hf, o).map(crate::models::registry::boxed)),
    load_gguf: Some(|g, o| gguf::load(g, o).map(crate::models::registry::boxed)),
    check_hf: Some(|hf| Config::from_json(&hf.config, &hf.config_path().display().to_string()).map(drop)),
    check_gguf: Some(|g| gguf::config_from_gguf(g).map(drop)),
    experts: Some(crate::models::registry::SWIGLU_EXPERTS),
    packable: true,
    synth: &["qwen3_moe"],
};
