//! Kimi K3 (Moonshot AI) from llama.cpp's `kimi-k3` GGUF files, as llama.cpp (vendored by
//! llama-cpp-python 0.3.36) computes it in `src/models/kimi-k3.cpp`: Kimi Linear's hybrid of
//! KDA and no-RoPE MLA layers ([`crate::models::kimi_linear`]'s mixers, reused) with
//!
//! - a full-rank KDA output gate (`ssm_g`, [`KdaWeights::g_a`] `None`) and the decay lower
//!   bound (`kda.gate_lower_bound`);
//! - a sigmoid output gate on MLA's attention output before `o_proj` ([`MlaLayer::gate`]);
//! - SiTU instead of SwiGLU in every feed-forward block ([`Glu::Situ`]);
//! - latent MoE: the router and the shared experts read the `ffn_norm`ed rows, the routed
//!   experts their down-projection (`ffn_routed_down`, `latent` wide); the routed sum is
//!   RMSNormed (`ffn_routed_norm`) and projected back (`ffn_routed_up`) in the layer's tail
//!   unit ([`Blocks::tail_on`]), then the shared experts are added;
//! - cross-layer attention residuals (`attn_res.block_size` = `B`): before its mixer and
//!   before its feed-forward block a layer reads not the residual stream `h` but
//!   the residual mix (`Backend::res_mix`, `backend::cpu::blocks::res_mix`) of the checkpoints banked so far and `h`; layer `l` with `l % B == 0`
//!   banks its input `h` and restarts the stream from its mixer's output alone
//!   (`h ← mixer(...)`, not `h + mixer(...)`); the last hidden state is mixed once more
//!   (`output_res_score`) before the final norm. The checkpoints live in the pass's
//!   `ScratchOn::bank`; they are per token, so a pass needs none of an earlier pass's.
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
mod gguf;
mod hf;
mod mxfp4;

use anyhow::Result;

pub use self::config::Config;
pub use self::hf::MXFP4_FORMAT;

use self::gguf::{Checkpoint, FfnTensors, MixTensors, Score};
use self::mxfp4::{ExpertRepack, Mxfp4Experts};
use super::budget::{place, HeadTensors, Notes, OnDemand, WeightUnits};
use super::decoder::{Blocks, CacheShape, Decoder, Dims, RouterParts, ScratchOn};
use super::device::Device;
use super::layers::generic::{glu_mlp_on, mm_on, norm_on, W};
use super::moe_dev::{store_glu_experts_on, ExpertStepOn};
use crate::backend::{Glu, Op};
use super::layers::hybrid::{a_log_of_neg_exp, Mixer};
use super::layers::mixers::{kda_mixer, mla_mixer, KdaShape, KdaWeights, MlaLayer, KDA_MLA_OPS};
use super::layers::mla::MlaShape;
use super::loading::{mat, unit_of, CheckpointFiles, MatRef};
use super::moe::{route_sigmoid_grouped, ExpertMats, UnitExperts};
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
    let files = CheckpointFiles::open(paths, pack, opts.direct_io, opts.experts.verify)?;
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

    /// SiTU as the backend's gated activation ([`Glu::Situ`]: `kimi-k3.cpp`'s `kimi_k3_situ`).
    fn situ(&self) -> Glu {
        Glu::Situ { beta: self.config.situ_beta, linear_beta: self.config.situ_linear_beta }
    }

    /// The mixer of layer `l` on `dev` over the normed rows `xn` of `seqs` into a new
    /// `rows × hidden` buffer.
    ///
    /// Errors: the device's.
    #[allow(clippy::too_many_arguments)]
    fn mixer_on<D: Device>(
        &self,
        dev: &D,
        l: usize,
        mix: &Mix,
        u: &UnitBytes,
        keep: bool,
        seqs: &mut Seqs<'_>,
        xn: &D::Buf,
    ) -> Result<D::Buf> {
        let v = &self.vecs[l];
        let wv = |m: &MatRef| W { m: m.view(u), keep };
        match mix {
            Mix::Kda(m) => {
                let [q, k, vv, f_a, f_b, b, g, om] = m.map(|r| wv(&r));
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
                kda_mixer(dev, &self.kda_shape(), &kw, xn, seqs, l)
            }
            Mix::Mla { q_a, q, kv_a, kv_b, v_b, gate, o: om } => {
                let ml = MlaLayer {
                    q_a: q_a.as_ref().map(|m| (wv(m), v.a_log.as_slice())),
                    q: wv(q),
                    kv_a: wv(kv_a),
                    kv_a_norm: &v.o_norm,
                    kv_b: kv_b.view(u),
                    v_b: v_b.as_ref().map(|m| m.view(u)),
                    keep,
                    gate: gate.as_ref().map(wv),
                    o: wv(om),
                };
                let eps = self.config.rms_norm_eps;
                mla_mixer(dev, &self.mla_shape(), &ml, None, eps, xn, seqs, l)
            }
        }
    }
}

impl Blocks for KimiK3Blocks {
    type Layer = Layer;

    /// Kimi Linear's KDA and MLA ops, MLA's output gate and the attention-residual mix.
    fn needs(&self) -> (&'static str, &'static [Op]) {
        ("kimi_k3", &K3_OPS)
    }

    fn is_moe(&self, w: &Layer) -> bool {
        matches!(w.ffn, Ffn::Moe { .. })
    }

    /// Layer `l` over the residual stream `x` (see the module header): the attention-residual
    /// mix, banking and the mixer; the feed-forward mix and norm; then the dense SiTU MLP added
    /// to `x`, or the router logits (from the normed rows), the shared experts' output and the
    /// routed experts' input (`ffn_routed_down` of the normed rows, `latent` wide) in `s.xn`.
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
        let (d, eps) = (c.hidden_size, c.rms_norm_eps);
        let n = seqs.rows();
        let v = &self.vecs[l];
        let bs = c.attn_res_block_size;
        let wv = |m: &MatRef| W { m: m.view(u), keep };
        let mut cur = dev.zeros(n * d)?;
        dev.res_mix(&s.bank.iter().collect::<Vec<_>>(), x, &v.attn_res, eps, &mut cur)?;
        let banked = bs > 0 && l.is_multiple_of(bs);
        if banked {
            let mut h = dev.zeros(n * d)?;
            dev.copy(x, 0, &mut h, 0, n * d)?;
            s.bank.push(h);
        }
        let xn = norm_on(dev, &cur, n * d, &v.attn_norm, eps)?;
        let o = self.mixer_on(dev, l, &w.mix, u, keep, seqs, &xn)?;
        match banked {
            true => *x = o,
            false => dev.add(x, &o)?,
        }
        if bs > 0 {
            dev.res_mix(&s.bank.iter().collect::<Vec<_>>(), x, &v.ffn_res, eps, &mut cur)?;
        } else {
            dev.copy(x, 0, &mut cur, 0, n * d)?;
        }
        let xn = norm_on(dev, &cur, n * d, &v.ffn_norm, eps)?;
        let act = self.situ();
        match &w.ffn {
            Ffn::Dense([g, up, dn]) => {
                let o = glu_mlp_on(dev, act, [&wv(g), &wv(up), &wv(dn)], &xn, n)?;
                dev.add(x, &o)
            }
            Ffn::Moe { router, shared, routed_down, .. } => {
                let logits = mm_on(dev, &wv(router), &xn, n)?;
                s.router.resize(n * router.rows, 0.0);
                dev.download(&logits, &mut s.router)?;
                s.shared = match shared {
                    Some([g, up, dn]) => Some(glu_mlp_on(dev, act, [&wv(g), &wv(up), &wv(dn)], &xn, n)?),
                    None => None,
                };
                s.xn = match routed_down {
                    Some(rd) => mm_on(dev, &wv(rd), &xn, n)?,
                    None => xn,
                };
                Ok(())
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

    /// SiTU experts from the store, `routed_width` wide (`moe_dev::store_glu_experts_on`).
    fn experts_on<D: Device>(&self, dev: &D, step: ExpertStepOn<'_, D>) -> Result<()> {
        let width = self.config.routed_width();
        store_glu_experts_on(dev, &self.experts, self.situ(), width, step)
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
    fn tail_on<D: Device>(
        &self,
        dev: &D,
        l: usize,
        w: &Layer,
        u: &UnitBytes,
        keep: bool,
        routed: &D::Buf,
        n: usize,
    ) -> Result<D::Buf> {
        let Ffn::Moe { tail: Some((_, up)), .. } = &w.ffn else {
            anyhow::bail!("layer {l} has no routed tail");
        };
        let rn = &self.vecs[l].routed_norm;
        let up = W { m: up.view(u), keep };
        match rn.is_empty() {
            true => mm_on(dev, &up, routed, n),
            false => {
                let width = self.config.routed_width();
                let normed = norm_on(dev, routed, n * width, rn, self.config.rms_norm_eps)?;
                mm_on(dev, &up, &normed, n)
            }
        }
    }

    /// The last attention-residual mix (`output_res_score`), when the model has them.
    fn finish_hidden_on<D: Device>(&self, dev: &D, x: &mut D::Buf, n: usize, s: &mut ScratchOn<D>) -> Result<()> {
        let c = &self.config;
        if c.attn_res_block_size == 0 {
            return Ok(());
        }
        let mut out = dev.zeros(n * c.hidden_size)?;
        let bank: Vec<&D::Buf> = s.bank.iter().collect();
        dev.res_mix(&bank, x, &self.output_res, c.rms_norm_eps, &mut out)?;
        *x = out;
        Ok(())
    }
}

/// The ops beyond the core set a K3 layer needs: Kimi Linear's, the attention-residual mix.
const K3_OPS: [Op; 9] = {
    let k = KDA_MLA_OPS;
    [k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7], Op::ResMix]
};

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
