//! Kimi K3 (Moonshot AI) from llama.cpp's `kimi-k3` GGUF files, as llama.cpp (vendored by
//! llama-cpp-python 0.3.36) computes it in `src/models/kimi-k3.cpp`: Kimi Linear's hybrid of
//! KDA and no-RoPE MLA layers ([`crate::models::kimi_linear`]'s mixers, reused) with
//!
//! - a full-rank KDA output gate (`ssm_g`, [`KdaWeights::g_a`] `None`) and the decay lower
//!   bound (`kda.gate_lower_bound`);
//! - a sigmoid output gate on MLA's attention output before `o_proj` ([`MlaLayer::gate`]);
//! - SiTU instead of SwiGLU in every feed-forward block ([`ffn::Situ`]);
//! - latent MoE: the router and the shared experts read the `ffn_norm`ed rows, the routed
//!   experts their down-projection (`ffn_routed_down`, `latent` wide); the routed sum is
//!   RMSNormed (`ffn_routed_norm`) and projected back (`ffn_routed_up`) in the layer's tail
//!   unit ([`Blocks::tail`]), then the shared experts are added;
//! - cross-layer attention residuals (`attn_res.block_size` = `B`): before its mixer and
//!   before its feed-forward block a layer reads not the residual stream `h` but
//!   [`ffn::res_mix`] of the checkpoints banked so far and `h`; layer `l` with `l % B == 0`
//!   banks its input `h` and restarts the stream from its mixer's output alone
//!   (`h ← mixer(...)`, not `h + mixer(...)`); the last hidden state is mixed once more
//!   (`output_res_score`) before the final norm. The checkpoints live in the pass's
//!   [`Scratch::bank`]; they are per token, so a pass needs none of an earlier pass's.
//!
//! Sigmoid routing with `exp_probs_b` ([`route_sigmoid_grouped`]), renormalized when
//! `expert_weights_norm`, times `expert_weights_scale`.
//!
//! Cache: per MLA layer one latent row per position, per KDA layer its recurrent state, as
//! Kimi Linear. Weight units: per layer a spine unit (mixer, dense MLP or router, shared
//! experts and `ffn_routed_down`), a tail unit (`ffn_routed_up`) for latent MoE layers, and one
//! unit per (layer, routed expert), placed under the RAM budget as the other MoE families.
//! Routed experts are computed in their stored type (F32 in the reference fixture, MXFP4 as
//! llama.cpp's converter repacks K3's compressed-tensors experts and as `synth --arch kimi_k3`
//! writes them); packs of K3 hold one record per expert as for the other families.

pub mod config;
pub mod ffn;
mod gguf;
mod hf;
mod mxfp4;

use anyhow::Result;

pub use self::config::Config;
pub use self::hf::MXFP4_FORMAT;

use self::ffn::{res_mix, situ_experts, Situ};
use self::gguf::{Checkpoint, FfnTensors, MixTensors, Score};
use self::mxfp4::{ExpertRepack, Mxfp4Experts};
use super::budget::{place, HeadTensors, Notes, OnDemand, WeightUnits};
use super::decoder::{Blocks, CacheShape, Decoder, Dims, RouterParts, Scratch};
use super::layers::hybrid::{a_log_of_neg_exp, Mixer};
use super::layers::mixers::{kda_mixer, mla_mixer, KdaShape, KdaWeights, MlaLayer};
use super::layers::mla::MlaShape;
use super::layers::{add_into, mm, rms_norm_rows};
use super::loading::{mat, unit_of, CheckpointFiles, MatRef};
use super::moe::{route_sigmoid_grouped, ExpertMats, ExpertStep, UnitExperts};
use super::batch::Seqs;
use super::LoadOptions;
use crate::source::gguf::GgufModel;
use crate::source::hf::HfModel;
use crate::source::tensor::TensorInfo;
use crate::store::{Unit, UnitBytes, WeightStore};

/// A layer's mixer matrices inside its spine unit.
enum Mix {
    /// `q`, `k`, `v`, `f_a`, `f_b`, `beta`, `g`, `o`.
    Kda([MatRef; 8]),
    Mla { q_a: Option<MatRef>, q: MatRef, kv_a: MatRef, kv_b: MatRef, v_b: Option<MatRef>, gate: Option<MatRef>, o: MatRef },
}

/// The feed-forward matrices inside a spine unit.
enum Ffn {
    /// gate, up, down.
    Dense([MatRef; 3]),
    Moe {
        router: MatRef,
        /// The shared experts' gate, up, down.
        shared: Option<[MatRef; 3]>,
        routed_down: Option<MatRef>,
        /// `ffn_routed_up` in the tail unit (its id), when latent.
        tail: Option<(usize, MatRef)>,
    },
}

/// One layer's matrices.
pub struct Layer {
    mix: Mix,
    ffn: Ffn,
}

/// A layer's resident vectors.
#[derive(Default)]
struct Vecs {
    attn_norm: Vec<f32>,
    ffn_norm: Vec<f32>,
    /// `attn_res_score`, `ffn_res_score` (empty without attention residuals).
    attn_res: Vec<f32>,
    ffn_res: Vec<f32>,
    /// `exp_probs_b` (MoE layers).
    bias: Vec<f32>,
    /// `ffn_routed_norm` (empty: none).
    routed_norm: Vec<f32>,
    /// KDA: convolution taps (`3 · dim × kernel`), `A_log`, `dt_bias`, `ssm_norm`; MLA:
    /// `attn_q_a_norm` in `a_log`, `attn_kv_a_norm` in `o_norm`.
    conv: Vec<f32>,
    a_log: Vec<f32>,
    dt_bias: Vec<f32>,
    o_norm: Vec<f32>,
}

/// A loaded Kimi K3 model.
pub type KimiK3 = Decoder<KimiK3Blocks>;

/// The Kimi K3 part of a [`Decoder`].
pub struct KimiK3Blocks {
    pub config: Config,
    vecs: Vec<Vecs>,
    output_res: Vec<f32>,
    experts: UnitExperts,
}

/// Loads a `kimi-k3` GGUF under `opts`.
///
/// Errors: metadata errors ([`Config::from_gguf`]), a missing, mis-shaped or unsupported tensor
/// (named with the file), an `ssm_a` value that is not negative, a budget too small for the
/// cache, activations and stream buffers, an unreadable file.
pub fn load(g: &GgufModel, opts: &LoadOptions) -> Result<(KimiK3, WeightStore)> {
    let c = Config::from_gguf(g)?;
    let ck = gguf::checkpoint(&c, g)?;
    build(c, ck, &g.files, g.pack.as_ref(), opts)
}

/// Loads a Kimi K3 Hugging Face folder (or a pack of one) under `opts`: the layout llama.cpp's
/// converter reads (`conversion/kimi_k3.py`; see `hf.rs`), BF16/F16/F32 weights with routed
/// experts in the same types or as compressed-tensors MXFP4 (repacked to GGML MXFP4 as they
/// land, or once at load when resident).
///
/// Errors: `config.json` errors ([`Config::from_hf_json`]), an unsupported
/// `quantization_config`, a missing or mis-shaped tensor (named with the folder), a budget too
/// small, an unreadable file.
pub fn load_hf(h: &HfModel, opts: &LoadOptions) -> Result<(KimiK3, WeightStore)> {
    let label = h.dir.join("config.json").display().to_string();
    let c = Config::from_hf_json(&h.config, &label)?;
    let ck = hf::checkpoint(&c, h)?;
    build(c, ck, &h.files, h.pack.as_ref(), opts)
}

/// The product of a score's tensors ([`Score`]), read as f32 vectors.
fn score_of(files: &CheckpointFiles, s: &Score) -> Result<Vec<f32>> {
    let mut out = files.vector(&s[0])?;
    for t in &s[1..] {
        let v = files.vector(t)?;
        anyhow::ensure!(v.len() == out.len(), "tensor '{}' has {} values, not {}", t.name, v.len(), out.len());
        out.iter_mut().zip(v).for_each(|(a, b)| *a *= b);
    }
    Ok(out)
}

fn build(
    c: Config,
    ck: Checkpoint,
    paths: &[std::path::PathBuf],
    pack: Option<&std::sync::Arc<crate::source::pack::PackInfo>>,
    opts: &LoadOptions,
) -> Result<(KimiK3, WeightStore)> {
    let files = CheckpointFiles::open(paths, pack, opts.direct_io)?;
    let vec_of = |t: &TensorInfo| files.vector(t);
    let (mut units, mut tails): (Vec<Unit>, Vec<Unit>) = (Vec::new(), Vec::new());
    let mut layers = Vec::with_capacity(ck.layers.len());
    let mut vecs = Vec::with_capacity(ck.layers.len());
    let mut experts = UnitExperts { units: Vec::new() };
    let mut expert_units = Vec::new();
    let mut mx = Mxfp4Experts::default();
    let n_layers = ck.layers.len();
    for lt in &ck.layers {
        let mut v = Vecs { attn_norm: vec_of(&lt.attn_norm)?, ffn_norm: vec_of(&lt.ffn_norm)?, ..Vecs::default() };
        if let Some((a, f)) = &lt.res {
            v.attn_res = score_of(&files, a)?;
            v.ffn_res = score_of(&files, f)?;
        }
        let mut list: Vec<&TensorInfo> = Vec::new();
        match &lt.mix {
            MixTensors::Kda { mats, conv, a, dt_bias, o_norm } => {
                list.extend(mats.iter());
                for t in conv.iter() {
                    v.conv.extend(vec_of(t)?);
                }
                v.a_log = match ck.a_neg_exp {
                    true => a_log_of_neg_exp(&a.name, vec_of(a)?)?,
                    false => vec_of(a)?,
                };
                v.dt_bias = vec_of(dt_bias)?;
                v.o_norm = vec_of(o_norm)?;
            }
            MixTensors::Mla { mats, q_a_norm, kv_a_norm, .. } => {
                list.extend(mats.iter());
                if let Some(t) = q_a_norm {
                    v.a_log = vec_of(t)?;
                }
                v.o_norm = vec_of(kv_a_norm)?;
            }
        }
        let mut routed: &[[TensorInfo; 3]] = &[];
        let mut routed_scales: &[[TensorInfo; 3]] = &[];
        let mut tail_t = None;
        match &lt.ffn {
            FfnTensors::Dense(m) => list.extend(m.iter()),
            FfnTensors::Moe { router, bias, shared, routed_down, routed_up, routed_norm, experts, scales } => {
                list.push(router);
                list.extend(shared.iter().flat_map(|s| s.iter()));
                list.extend(routed_down.iter());
                v.bias = vec_of(bias)?;
                if let Some(t) = routed_norm {
                    v.routed_norm = vec_of(t)?;
                }
                tail_t = routed_up.as_ref();
                routed = experts;
                routed_scales = scales;
            }
        }
        let (unit, place) = unit_of(&list);
        let mats: Vec<MatRef> = list.iter().zip(&place).map(|(t, &p)| mat(t, p)).collect();
        let mut it = mats.into_iter();
        let mut next = || it.next().expect("one view per tensor");
        let mix = match &lt.mix {
            MixTensors::Kda { .. } => Mix::Kda(std::array::from_fn(|_| next())),
            MixTensors::Mla { split, gate, q_a_norm, .. } => Mix::Mla {
                q_a: q_a_norm.as_ref().map(|_| next()),
                q: next(),
                kv_a: next(),
                kv_b: next(),
                v_b: split.then(&mut next),
                gate: gate.then(&mut next),
                o: next(),
            },
        };
        let ffn = match &lt.ffn {
            FfnTensors::Dense(_) => Ffn::Dense(std::array::from_fn(|_| next())),
            FfnTensors::Moe { shared, routed_down, .. } => Ffn::Moe {
                router: next(),
                shared: shared.as_ref().map(|_| std::array::from_fn(|_| next())),
                routed_down: routed_down.as_ref().map(|_| next()),
                // the tail unit's id is fixed below, once every spine unit is numbered
                tail: tail_t.map(|t| {
                    let (u, p) = unit_of(&[t]);
                    tails.push(u);
                    (tails.len() - 1, mat(t, p[0]))
                }),
            },
        };
        layers.push((units.len(), Layer { mix, ffn }));
        units.push(unit);
        vecs.push(v);
        let mut le = Vec::new();
        let mut lr = Vec::new();
        for (i, [g, u, dn]) in routed.iter().enumerate() {
            let (unit, mats) = match routed_scales.get(i) {
                None => {
                    let (unit, p) = unit_of(&[g, u, dn]);
                    (unit, ExpertMats { gate: mat(g, p[0]), up: mat(u, p[1]), down: mat(dn, p[2]) })
                }
                Some([gs, us, ds]) => {
                    let (unit, p) = unit_of(&[g, gs, u, us, dn, ds]);
                    let r = ExpertRepack::new([
                        (mat(g, p[0]), mat(gs, p[1])),
                        (mat(u, p[2]), mat(us, p[3])),
                        (mat(dn, p[4]), mat(ds, p[5])),
                    ]);
                    let m = r.mats();
                    lr.push(r);
                    (unit, m)
                }
            };
            le.push((expert_units.len(), mats));
            expert_units.push(unit);
        }
        experts.units.push(le);
        mx.layers.push(lr);
    }
    // tail units follow the spine units
    for (_, w) in &mut layers {
        if let Ffn::Moe { tail: Some((t, _)), .. } = &mut w.ffn {
            *t += n_layers;
        }
    }
    units.extend(tails);
    let mut wu = WeightUnits::new(units, expert_units, &mut experts.units);
    wu.units = files.relocate_all(wu.units);

    let layer_vectors: usize = vecs
        .iter()
        .map(|v| {
            [&v.attn_norm, &v.ffn_norm, &v.attn_res, &v.ffn_res, &v.bias, &v.routed_norm, &v.conv, &v.a_log, &v.dt_bias, &v.o_norm]
                .iter()
                .map(|x| x.len())
                .sum::<usize>()
        })
        .sum::<usize>();
    let (embd, head_t) = (&ck.embd, &ck.head);
    let placed = place(
        opts,
        &files.paths,
        wu,
        HeadTensors::new(&files, head_t, embd, c.tie_word_embeddings),
        c.memory_needs(layer_vectors),
        OnDemand { per_tok: c.moe.used, transform: mx.transform(), pack: files.pack.clone() },
        Notes { experts: if mx.is_empty() { "" } else { " (MXFP4)" }, tail: "" },
    )?;
    let mut placed = placed;
    mx.repack_resident(&experts, &mut placed.store);
    placed.placement.resident_bytes = placed.store.resident_bytes();
    let dims = Dims {
        hidden_size: c.hidden_size,
        vocab_size: c.vocab_size,
        context_length: c.max_position_embeddings,
        num_layers: c.num_hidden_layers,
        final_norm_eps: c.rms_norm_eps,
        cache: CacheShape::Latent { width: c.latent_dim() },
    };
    let output_res = ck.output_res.as_ref().map(|s| score_of(&files, s)).transpose()?.unwrap_or_default();
    let final_norm = vec_of(&ck.final_norm)?;
    let blocks = KimiK3Blocks { config: c, vecs, output_res, experts };
    Ok(Decoder::placed(blocks, dims, layers, final_norm, placed))
}

impl KimiK3Blocks {
    fn kda_shape(&self) -> KdaShape {
        let c = &self.config;
        KdaShape {
            n_heads: c.num_heads,
            head_dim: c.kda_head_dim,
            conv: c.conv_kernel,
            eps: c.rms_norm_eps,
            lower_bound: c.gate_lower_bound,
            // llama.cpp's build_gdn_l2_norm: x / √(Σx² + rms_norm_eps)
            l2_eps: c.rms_norm_eps,
        }
    }

    fn mla_shape(&self) -> MlaShape {
        let c = &self.config;
        MlaShape {
            n_heads: c.num_heads,
            nope: c.qk_nope_head_dim,
            rope: c.qk_rope_head_dim,
            v: c.v_head_dim,
            rank: c.kv_lora_rank,
            scale: 1.0 / ((c.qk_nope_head_dim + c.qk_rope_head_dim) as f32).sqrt(),
        }
    }

    fn situ(&self) -> Situ {
        Situ { beta: self.config.situ_beta, linear_beta: self.config.situ_linear_beta }
    }

    /// The mixer of layer `l` over the normed rows `xn` of `seqs` into `o` (`rows × hidden`).
    fn mixer(&self, l: usize, mix: &Mix, u: &UnitBytes, seqs: &mut Seqs<'_>, xn: &[f32], o: &mut [f32]) {
        let v = &self.vecs[l];
        match mix {
            Mix::Kda(m) => {
                let [q, k, vv, f_a, f_b, b, g, om] = m.map(|r| r.view(u));
                let kw = KdaWeights {
                    q,
                    k,
                    v: vv,
                    f_a,
                    f_b,
                    b,
                    g_a: None,
                    g_b: g,
                    o: om,
                    conv: &v.conv,
                    a_log: &v.a_log,
                    dt_bias: &v.dt_bias,
                    o_norm: &v.o_norm,
                };
                kda_mixer(&self.kda_shape(), &kw, xn, seqs, l, o);
            }
            Mix::Mla { q_a, q, kv_a, kv_b, v_b, gate, o: om } => {
                let ml = MlaLayer {
                    q_a: q_a.as_ref().map(|m| (m.view(u), v.a_log.as_slice())),
                    q: q.view(u),
                    kv_a: kv_a.view(u),
                    kv_a_norm: &v.o_norm,
                    kv_b: kv_b.view(u),
                    v_b: v_b.as_ref().map(|m| m.view(u)),
                    gate: gate.as_ref().map(|m| m.view(u)),
                    o: om.view(u),
                };
                mla_mixer(&self.mla_shape(), &ml, self.config.rms_norm_eps, xn, seqs, l, o);
            }
        }
    }
}

impl Blocks for KimiK3Blocks {
    type Layer = Layer;

    /// No device path: `--device cuda` is refused naming what is missing.
    fn device_path(&self) -> std::result::Result<(), (&'static str, &'static str)> {
        Err((
            "kimi_k3",
            "the KDA scan, multi-head latent attention and the latent MoE have no device path yet (Backend::kda_scan and Backend::mla_attention have no CUDA kernel)",
        ))
    }

    fn is_moe(&self, w: &Layer) -> bool {
        matches!(w.ffn, Ffn::Moe { .. })
    }

    /// Layer `l` over the residual stream `x` (see the module header): the attention-residual
    /// mix, banking and the mixer; the feed-forward mix and norm; then the dense SiTU MLP added
    /// to `x`, or the router logits (from the normed rows), the shared experts' output and the
    /// routed experts' input (`ffn_routed_down` of the normed rows, `latent` wide) in `s.xn`.
    fn spine(&self, l: usize, w: &Layer, u: &UnitBytes, seqs: &mut Seqs<'_>, x: &mut [f32], s: &mut Scratch) {
        let c = &self.config;
        let (d, eps) = (c.hidden_size, c.rms_norm_eps);
        let n = x.len() / d;
        let v = &self.vecs[l];
        let bs = c.attn_res_block_size;
        let mut cur = vec![0f32; n * d];
        let mut xn = vec![0f32; n * d];
        res_mix(&s.bank, x, &v.attn_res, eps, &mut cur);
        let banked = bs > 0 && l.is_multiple_of(bs);
        if banked {
            s.bank.push(x.to_vec());
        }
        rms_norm_rows(&cur, &v.attn_norm, eps, &mut xn);
        let mut o = vec![0f32; n * d];
        self.mixer(l, &w.mix, u, seqs, &xn, &mut o);
        match banked {
            true => x.copy_from_slice(&o),
            false => add_into(x, &o),
        }
        if bs > 0 {
            res_mix(&s.bank, x, &v.ffn_res, eps, &mut cur);
        } else {
            cur.copy_from_slice(x);
        }
        rms_norm_rows(&cur, &v.ffn_norm, eps, &mut xn);
        match &w.ffn {
            Ffn::Dense([g, up, dn]) => {
                self.situ().mlp(&g.view(u), &up.view(u), &dn.view(u), &xn, n, &mut o);
                add_into(x, &o);
            }
            Ffn::Moe { router, shared, routed_down, .. } => {
                s.router.resize(n * router.rows, 0.0);
                mm(&router.view(u), &xn, n, &mut s.router);
                s.shared.clear();
                if let Some([g, up, dn]) = shared {
                    s.shared.resize(n * d, 0.0);
                    self.situ().mlp(&g.view(u), &up.view(u), &dn.view(u), &xn, n, &mut s.shared);
                }
                match routed_down {
                    Some(rd) => {
                        s.xn.resize(n * rd.rows, 0.0);
                        mm(&rd.view(u), &xn, n, &mut s.xn);
                    }
                    None => s.xn = xn,
                }
            }
        }
    }

    fn router<'a>(&'a self, l: usize, w: &'a Layer) -> Option<RouterParts<'a>> {
        let Ffn::Moe { router, .. } = &w.ffn else {
            return None;
        };
        Some(RouterParts { router: *router, norm: &self.vecs[l].ffn_norm, eps: self.config.rms_norm_eps, bias: None })
    }

    fn n_experts(&self) -> usize {
        self.config.moe.experts
    }

    /// Sigmoid routing with layer `l`'s `exp_probs_b` ([`route_sigmoid_grouped`]).
    fn route(&self, l: usize, logits: &[f32]) -> Vec<(usize, f32)> {
        let c = &self.config;
        let m = &c.moe;
        route_sigmoid_grouped(logits, &self.vecs[l].bias, m.used, m.groups, m.groups_used, c.norm_topk_prob, m.scale)
    }

    fn experts(&self, step: ExpertStep<'_>) -> std::io::Result<()> {
        situ_experts(&self.experts, self.config.routed_width(), self.situ(), step)
    }

    fn recurrent_state(&self, l: usize) -> usize {
        match self.config.mixers[l] {
            Mixer::Kda => self.config.kda_state(),
            Mixer::Mla => 0,
        }
    }

    fn routed_width(&self) -> Option<usize> {
        self.config.latent
    }

    fn tail_unit(&self, w: &Layer) -> Option<usize> {
        match &w.ffn {
            Ffn::Moe { tail: Some((t, _)), .. } => Some(*t),
            _ => None,
        }
    }

    /// `ffn_routed_up(rmsnorm(routed))` (the norm only when `ffn_routed_norm` is present).
    fn tail(&self, l: usize, w: &Layer, u: &UnitBytes, routed: &[f32], out: &mut [f32]) {
        let Ffn::Moe { tail: Some((_, up)), .. } = &w.ffn else {
            return;
        };
        let n = out.len() / self.config.hidden_size;
        let rn = &self.vecs[l].routed_norm;
        let mut normed;
        let x = match rn.is_empty() {
            true => routed,
            false => {
                normed = vec![0f32; routed.len()];
                rms_norm_rows(routed, rn, self.config.rms_norm_eps, &mut normed);
                &normed
            }
        };
        mm(&up.view(u), x, n, out);
    }

    /// The last attention-residual mix (`output_res_score`), when the model has them.
    fn finish_hidden(&self, x: &mut [f32], s: &mut Scratch) {
        if self.config.attn_res_block_size == 0 {
            return;
        }
        let mut out = vec![0f32; x.len()];
        res_mix(&s.bank, x, &self.output_res, self.config.rms_norm_eps, &mut out);
        x.copy_from_slice(&out);
    }
}

/// The registry entry of Kimi K3: Hugging Face `model_type` `kimi_k3` and llama.cpp's
/// `kimi-k3` GGUF.
pub const FAMILY: crate::models::Family = crate::models::Family {
    name: "kimi_k3",
    model_types: &[config::MODEL_TYPE],
    gguf_architectures: &[config::ARCH],
    load_hf: Some(|h, o| load_hf(h, o).map(crate::models::registry::boxed)),
    load_gguf: Some(|g, o| load(g, o).map(crate::models::registry::boxed)),
    check_hf: Some(hf::check),
    check_gguf: Some(|g| Config::from_gguf(g).map(drop)),
    experts: Some(crate::models::registry::SWIGLU_EXPERTS),
    packable: true,
    synth: &["kimi_k3"],
};
