//! DeepSeek V3 (and Kimi K2 text models) from Hugging Face checkpoints, as transformers 5.24
//! defines them (`models/deepseek_v3/modeling_deepseek_v3.py`): RMSNorm before attention and
//! before the feed-forward block; multi-head latent attention ([`super::mla`]) with an optional
//! low-rank query (`q_a_proj` → `q_a_layernorm` → `q_b_proj`, or `q_proj`), the KV latent
//! `kv_a_proj_with_mqa` → (`kv_a_layernorm`ed latent, shared rotary key) and `kv_b_proj`; YaRN
//! RoPE on the rotary parts; a dense SwiGLU MLP in the first `first_k_dense_replace` layers and
//! the MoE block after (sigmoid group-limited routing, [`super::moe::route_sigmoid_grouped`],
//! plus `n_shared_experts` shared experts as one SwiGLU of `n_shared_experts ×
//! moe_intermediate_size`); final RMSNorm and LM head.
//!
//! The KV cache holds the compressed latent per token and layer
//! ([`KvCache::new_latent`]: `kv_lora_rank + qk_rope_head_dim` floats).
//!
//! Weights: BF16/F16/F32, or FP8 E4M3 with `weight_scale_inv` 128×128 block scales, repacked
//! when read into [`GgmlType::F8_E4M3_B128`] rows (see [`crate::quant::fp8`]). Multi-token-
//! prediction layers (`num_nextn_predict_layers`, stored as `model.layers.{N..}`) are ignored.
//!
//! Weight units: one spine unit per layer (attention, and the dense MLP or the router and
//! shared experts) and one unit per (layer, routed expert); embeddings and LM head as in
//! [`super::embed_head`].

use anyhow::{anyhow, bail, Context, Result};

pub use super::deepseek_v3_config::Config;

use super::embed_head::{head_chunks, whole, Embedding, Head};
use super::layers::{add_into, mm, rms_norm_rows, swiglu_mlp};
use super::loading::{read_vector, unit_of, MatRef, Tensors};
use super::mla::{mla_attention, rope_slice, MlaShape};
use super::moe::{moe_forward, route_sigmoid_grouped, ExpertMats, StoreExperts, UnitExperts};
use super::{LoadOptions, Logits, Model, Placement};
use crate::engine::KvCache;
use crate::quant::GgmlType;
use crate::source::gguf::TensorInfo;
use crate::source::hf::HfModel;
use crate::store::plan::{choose_resident, Candidate};
use crate::store::{DirectFile, Fp8Pack, ReadRange, Unit, UnitBytes, WeightStore, IO_ALIGN};

/// Stream buffers used when any weight is streamed.
const STREAM_SLOTS: usize = 2;

/// `eps` of `q_a_layernorm` and `kv_a_layernorm` (transformers builds them with the
/// `DeepseekV3RMSNorm` default, not `rms_norm_eps`).
const LORA_NORM_EPS: f32 = 1e-6;

/// A linear weight as stored: a plain tensor, or FP8 E4M3 with its block scales.
#[derive(Clone, Copy)]
enum Lin<'a> {
    Plain(&'a TensorInfo),
    Fp8 {
        w: &'a TensorInfo,
        s: &'a TensorInfo,
    },
}

/// One read range per tensor; FP8 weights are repacked into extra pieces after the raw ones
/// (piece `ranges.len() + k` for the k-th FP8 weight). Returns the unit, its FP8 packs and
/// every weight's matrix view.
fn unit_of_lins(lins: &[Lin]) -> (Unit, Vec<Fp8Pack>, Vec<MatRef>) {
    let mut ranges = Vec::new();
    let mut packs = Vec::new();
    let range = |t: &TensorInfo| ReadRange {
        file: t.file,
        offset: t.offset,
        len: t.n_bytes as usize,
    };
    let mut mats = Vec::new();
    for l in lins {
        match *l {
            Lin::Plain(t) => {
                ranges.push(range(t));
                mats.push(super::loading::mat(t, (ranges.len() - 1, 0)));
            }
            Lin::Fp8 { w, s } => {
                ranges.push(range(w));
                ranges.push(range(s));
                let (rows, cols) = (w.shape[1] as usize, w.shape[0] as usize);
                packs.push(Fp8Pack {
                    weight_piece: ranges.len() - 2,
                    scale_piece: ranges.len() - 1,
                    scale_ty: s.ty,
                    rows,
                    cols,
                });
                let ty = GgmlType::F8_E4M3_B128;
                mats.push(MatRef {
                    piece: usize::MAX - (packs.len() - 1),
                    offset: 0,
                    ty,
                    rows,
                    cols,
                    bytes: rows * ty.row_bytes(cols).expect("any width"),
                });
            }
        }
    }
    let n = ranges.len();
    for m in &mut mats {
        if m.piece > usize::MAX / 2 {
            m.piece = n + (usize::MAX - m.piece);
        }
    }
    (Unit::of(ranges), packs, mats)
}

/// Attention weights of one layer.
struct Attn {
    /// `q_a_proj` and `q_b_proj`, or `q_proj` alone.
    q_a: Option<MatRef>,
    q_b: MatRef,
    kv_a: MatRef,
    kv_b: MatRef,
    o: MatRef,
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

/// A loaded DeepSeek V3 model.
pub struct DeepseekV3 {
    pub config: Config,
    layers: Vec<(usize, Attn, Ffn)>,
    norms: Vec<LayerNorms>,
    experts: UnitExperts,
    final_norm: Vec<f32>,
    embedding: Embedding,
    head: Head,
    inv_freq: Vec<f32>,
    rope_att: f32,
    placement: Placement,
}

impl DeepseekV3 {
    /// Loads a `deepseek_v3` / `kimi_k2` checkpoint folder under `opts`: checks every tensor's
    /// presence, shape and dtype (FP8 weights with their `weight_scale_inv` of shape
    /// `[ceil(out/128), ceil(in/128)]`), plans residency under the RAM budget (LM head,
    /// embeddings, then spine layers and experts, greedily), reads the resident units and
    /// starts the streamer.
    ///
    /// Errors: config errors ([`Config::from_json`]), a missing or mis-shaped tensor or scale
    /// (named with the folder), a budget too small for KV cache, activations and stream
    /// buffers, an unreadable file.
    pub fn load(hf: &HfModel, opts: &LoadOptions) -> Result<(Self, WeightStore)> {
        let label = hf.dir.display().to_string();
        let c = Config::from_json(&hf.config, &hf.config_path().display().to_string())?;
        let ts = Tensors::from_list(label.clone(), &hf.tensors);
        let (d, nh) = (c.hidden_size, c.num_attention_heads);
        let (ne, eff, dff) = (
            c.n_routed_experts,
            c.moe_intermediate_size,
            c.intermediate_size,
        );
        let sff = eff * c.n_shared_experts;
        // `name.weight` of `rows × cols`, plain or FP8 with its scales
        let lin = |name: &str, rows: usize, cols: usize| -> Result<Lin> {
            let wn = format!("{name}.weight");
            let t = ts
                .by_name
                .get(wn.as_str())
                .copied()
                .ok_or_else(|| anyhow!("{label}: tensor '{wn}' is missing"))?;
            if t.ty != GgmlType::F8_E4M3 {
                return Ok(Lin::Plain(ts.get(&wn, &[cols, rows])?));
            }
            let got: Vec<usize> = t.shape.iter().map(|&x| x as usize).collect();
            if got != [cols, rows] {
                bail!(
                    "{label}: tensor '{wn}' has shape {got:?}, expected {:?}",
                    [cols, rows]
                );
            }
            let sn = format!("{name}.weight_scale_inv");
            let s = ts.by_name.get(sn.as_str()).copied().ok_or_else(|| {
                anyhow!(
                    "{label}: tensor '{sn}' is missing (FP8 weight '{wn}' needs its block scales)"
                )
            })?;
            let want = [cols.div_ceil(128), rows.div_ceil(128)];
            let got: Vec<usize> = s.shape.iter().map(|&x| x as usize).collect();
            if got != want || !matches!(s.ty, GgmlType::F32 | GgmlType::BF16) {
                bail!(
                    "{label}: tensor '{sn}' has shape {got:?} and type {}, expected {want:?} F32 or BF16 (128×128 blocks of '{wn}')",
                    s.ty
                );
            }
            Ok(Lin::Fp8 { w: t, s })
        };
        let embd = ts.get("model.embed_tokens.weight", &[d, c.vocab_size])?;
        let head_t = if c.tie_word_embeddings {
            embd
        } else {
            ts.get("lm_head.weight", &[d, c.vocab_size])?
        };
        let files: Vec<DirectFile> = hf
            .files
            .iter()
            .map(|p| {
                DirectFile::open(p, opts.direct_io)
                    .with_context(|| format!("opening {}", p.display()))
            })
            .collect::<Result<_>>()?;
        let vec_of =
            |name: &str, n: usize| -> Result<Vec<f32>> { read_vector(&files, ts.get(name, &[n])?) };
        let final_norm = vec_of("model.norm.weight", d)?;

        let (qh, vd, rank) = (c.qk_head_dim(), c.v_head_dim, c.kv_lora_rank);
        let mut units: Vec<Unit> = Vec::new();
        let mut packs: Vec<Vec<Fp8Pack>> = Vec::new();
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        let mut norms = Vec::with_capacity(c.num_hidden_layers);
        let mut experts = UnitExperts { units: Vec::new() };
        let mut expert_units = Vec::new();
        let mut expert_packs = Vec::new();
        for l in 0..c.num_hidden_layers {
            let p = |s: &str| format!("model.layers.{l}.{s}");
            let moe = c.is_moe_layer(l);
            let mut list = Vec::new();
            if let Some(r) = c.q_lora_rank {
                list.push(lin(&p("self_attn.q_a_proj"), r, d)?);
                list.push(lin(&p("self_attn.q_b_proj"), nh * qh, r)?);
            } else {
                list.push(lin(&p("self_attn.q_proj"), nh * qh, d)?);
            }
            list.push(lin(&p("self_attn.kv_a_proj_with_mqa"), c.latent_dim(), d)?);
            list.push(lin(
                &p("self_attn.kv_b_proj"),
                nh * (c.qk_nope_head_dim + vd),
                rank,
            )?);
            list.push(lin(&p("self_attn.o_proj"), d, nh * vd)?);
            if moe {
                list.push(Lin::Plain(ts.get(&p("mlp.gate.weight"), &[d, ne])?));
                list.push(lin(&p("mlp.shared_experts.gate_proj"), sff, d)?);
                list.push(lin(&p("mlp.shared_experts.up_proj"), sff, d)?);
                list.push(lin(&p("mlp.shared_experts.down_proj"), d, sff)?);
            } else {
                list.push(lin(&p("mlp.gate_proj"), dff, d)?);
                list.push(lin(&p("mlp.up_proj"), dff, d)?);
                list.push(lin(&p("mlp.down_proj"), d, dff)?);
            }
            let (unit, pk, m) = unit_of_lins(&list);
            let a = usize::from(c.q_lora_rank.is_some());
            let attn = Attn {
                q_a: (a == 1).then_some(m[0]),
                q_b: m[a],
                kv_a: m[a + 1],
                kv_b: m[a + 2],
                o: m[a + 3],
            };
            let f = &m[a + 4..];
            let ffn = if moe {
                Ffn::Moe {
                    router: f[0],
                    gate: f[1],
                    up: f[2],
                    down: f[3],
                }
            } else {
                Ffn::Dense {
                    gate: f[0],
                    up: f[1],
                    down: f[2],
                }
            };
            layers.push((units.len(), attn, ffn));
            units.push(unit);
            packs.push(pk);
            norms.push(LayerNorms {
                input: vec_of(&p("input_layernorm.weight"), d)?,
                q_a: match c.q_lora_rank {
                    Some(r) => Some(vec_of(&p("self_attn.q_a_layernorm.weight"), r)?),
                    None => None,
                },
                kv_a: vec_of(&p("self_attn.kv_a_layernorm.weight"), rank)?,
                post_attn: vec_of(&p("post_attention_layernorm.weight"), d)?,
                bias: match moe {
                    true => vec_of(&p("mlp.gate.e_score_correction_bias"), ne)?,
                    false => Vec::new(),
                },
            });
            let mut le = Vec::new();
            if moe {
                for e in 0..ne {
                    let x = |s: &str| p(&format!("mlp.experts.{e}.{s}"));
                    let list = [
                        lin(&x("gate_proj"), eff, d)?,
                        lin(&x("up_proj"), eff, d)?,
                        lin(&x("down_proj"), d, eff)?,
                    ];
                    let (unit, pk, m) = unit_of_lins(&list);
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
            }
            experts.units.push(le);
        }
        let n_spine = units.len();
        for le in &mut experts.units {
            le.iter_mut().for_each(|(u, _)| *u += n_spine);
        }
        units.extend(expert_units);
        packs.extend(expert_packs);
        let n_weight_units = units.len();
        // bytes a unit holds when resident (repacked FP8) and what streaming it needs
        let resident_size: Vec<usize> = units
            .iter()
            .zip(&packs)
            .map(|(u, p)| WeightStore::resident_size(u, p))
            .collect();
        let unit_max = units.iter().map(|u| u.buffer_bytes()).max().unwrap_or(0);
        let pack_max = units
            .iter()
            .zip(&packs)
            .filter(|(_, p)| !p.is_empty())
            .map(|(u, p)| WeightStore::resident_size(u, p))
            .max()
            .unwrap_or(0);

        // --- budget -------------------------------------------------------------------------
        let n_ctx = opts.n_ctx.min(c.max_position_embeddings).max(1);
        let kv_bytes = KvCache::latent_bytes_for(c.num_hidden_layers, n_ctx, c.latent_dim());
        let nb = opts.n_batch.max(1);
        let per_tok = 4 * d
            + c.q_lora_rank.unwrap_or(0)
            + nh * (qh + vd + rank)
            + c.latent_dim()
            + 2 * dff.max(sff).max(eff)
            + ne;
        let scratch_bytes = 4
            * (nb * per_tok
                + c.vocab_size
                + rayon::current_num_threads() * (n_ctx + rank * (c.qk_nope_head_dim + 2)));
        let norms_bytes = 4
            * (d * (2 * c.num_hidden_layers + 1)
                + c.num_hidden_layers * (c.q_lora_rank.unwrap_or(0) + rank + ne));
        let head_unit = unit_of(&[head_t]).0;
        let embd_unit = unit_of(&[embd]).0;
        let mut cands = vec![Candidate {
            name: "LM head".into(),
            bytes: head_unit.buffer_bytes(),
        }];
        if !c.tie_word_embeddings {
            cands.push(Candidate {
                name: "embeddings".into(),
                bytes: embd_unit.buffer_bytes(),
            });
        }
        let n_head_cands = cands.len();
        for (i, b) in resident_size.iter().enumerate() {
            cands.push(Candidate {
                name: format!("unit {i}"),
                bytes: *b,
            });
        }
        let total: usize = cands.iter().map(|c| c.bytes).sum();
        let fixed = kv_bytes + scratch_bytes + norms_bytes;
        let slot = unit_max.max(IO_ALIGN * 4);
        let (flags, stream_buf) = match opts.ram_budget {
            Some(b) if fixed + total > b as usize => {
                let b = b as usize;
                let stream_buf = STREAM_SLOTS * slot + pack_max;
                if fixed + stream_buf > b {
                    bail!(
                        "--ram-budget {b} is too small: the KV cache for {n_ctx} tokens ({:.1} MiB), activations ({:.1} MiB) and stream buffers ({:.1} MiB) need at least {:.1} MiB",
                        kv_bytes as f64 / 1048576.0,
                        (scratch_bytes + norms_bytes) as f64 / 1048576.0,
                        stream_buf as f64 / 1048576.0,
                        (fixed + stream_buf) as f64 / 1048576.0
                    );
                }
                (
                    choose_resident(&cands, b - fixed - stream_buf).0,
                    STREAM_SLOTS * slot,
                )
            }
            _ => (vec![true; cands.len()], 0),
        };
        let head_resident = flags[0];
        let embd_resident = if c.tie_word_embeddings {
            head_resident
        } else {
            flags[1]
        };
        let mut resident: Vec<bool> = flags[n_head_cands..].to_vec();
        let head = if head_resident {
            units.push(head_unit);
            packs.push(Vec::new());
            resident.push(true);
            Head::Resident {
                unit: units.len() - 1,
                mat: whole(head_t),
            }
        } else {
            let mut chunks = Vec::new();
            for (u, r0, m) in head_chunks(head_t, slot) {
                units.push(u);
                packs.push(Vec::new());
                resident.push(false);
                chunks.push((units.len() - 1, r0, m));
            }
            Head::Chunks(chunks)
        };
        let embedding = match (&head, embd_resident, c.tie_word_embeddings) {
            (Head::Resident { unit, mat }, true, true) => Embedding::Resident {
                unit: *unit,
                mat: *mat,
            },
            (_, true, _) => {
                units.push(embd_unit);
                packs.push(Vec::new());
                resident.push(true);
                Embedding::Resident {
                    unit: units.len() - 1,
                    mat: whole(embd),
                }
            }
            (_, false, _) => Embedding::Streamed(embd.clone()),
        };
        let streamed_bytes: usize = units
            .iter()
            .zip(&resident)
            .filter(|(_, r)| !**r)
            .map(|(u, _)| u.payload_bytes())
            .sum();
        let res_spine = resident[..n_spine].iter().filter(|r| **r).count();
        let res_experts = resident[n_spine..n_weight_units]
            .iter()
            .filter(|r| **r)
            .count();
        let store = WeightStore::open_packed(
            &hf.files,
            units,
            packs,
            &resident,
            STREAM_SLOTS,
            stream_buf / STREAM_SLOTS,
            opts.direct_io,
        )?;
        // multi-token-prediction layers (`model.layers.{num_hidden_layers}..`) are not run
        let mtp: std::collections::BTreeSet<&str> = hf
            .tensors
            .iter()
            .filter_map(|t| {
                let rest = t.name.strip_prefix("model.layers.")?;
                let l = rest.split('.').next()?;
                (l.parse::<usize>().ok()? >= c.num_hidden_layers).then_some(l)
            })
            .collect();
        let mtp_note = match mtp.len() {
            0 => String::new(),
            k => format!(", {k} multi-token-prediction layer(s) ignored"),
        };
        let placement = Placement {
            resident_bytes: store.resident_bytes(),
            streamed_bytes,
            stream_buffer_bytes: store.stream_buffer_bytes(),
            kv_bytes,
            scratch_bytes: scratch_bytes + norms_bytes,
            summary: format!(
                "{res_spine}/{} layers and {res_experts}/{} experts resident, LM head {}{mtp_note}",
                c.num_hidden_layers,
                n_weight_units - n_spine,
                if head_resident {
                    "resident"
                } else {
                    "streamed"
                },
            ),
        };
        let (inv_freq, rope_att) = c.rope_freqs();
        Ok((
            Self {
                inv_freq,
                rope_att,
                config: c,
                layers,
                norms,
                experts,
                final_norm,
                embedding,
                head,
                placement,
            },
            store,
        ))
    }

    /// Queues what comes after layer `l`: the next spine unit, or the LM head chunks.
    fn plan_after(&self, store: &mut WeightStore, l: usize) {
        match self.layers.get(l + 1) {
            Some((u, _, _)) => store.plan([*u]),
            None => self.head.plan(store),
        }
    }

    /// Attention of layer `l` (with its residual) over the spine unit's bytes `u`, then the
    /// post-attention norm into `xn` and either the dense MLP added to `x`, or the router
    /// logits (`n × n_routed_experts`) into `router` and the shared experts' output into
    /// `shared` (`n × hidden`).
    #[allow(clippy::too_many_arguments)]
    fn spine(
        &self,
        l: usize,
        a: &Attn,
        f: &Ffn,
        u: &UnitBytes,
        cache: &mut KvCache,
        pos0: usize,
        x: &mut [f32],
        xn: &mut [f32],
        router: &mut Vec<f32>,
        shared: &mut Vec<f32>,
    ) {
        let c = &self.config;
        let (d, nh, qh) = (c.hidden_size, c.num_attention_heads, c.qk_head_dim());
        let (nope, rope, vd, rank) = (
            c.qk_nope_head_dim,
            c.qk_rope_head_dim,
            c.v_head_dim,
            c.kv_lora_rank,
        );
        let width = c.latent_dim();
        let n = x.len() / d;
        let nrm = &self.norms[l];
        let eps = c.rms_norm_eps as f32;
        rms_norm_rows(x, &nrm.input, eps, xn);
        // queries
        let mut q = vec![0f32; n * nh * qh];
        match (&a.q_a, &nrm.q_a) {
            (Some(qa), Some(w)) => {
                let mut t = vec![0f32; n * qa.rows];
                mm(&qa.view(u), xn, n, &mut t);
                let mut tn = vec![0f32; t.len()];
                rms_norm_rows(&t, w, LORA_NORM_EPS, &mut tn);
                mm(&a.q_b.view(u), &tn, n, &mut q);
            }
            _ => mm(&a.q_b.view(u), xn, n, &mut q),
        }
        for t in 0..n {
            for h in 0..nh {
                let o = (t * nh + h) * qh;
                let qr = &mut q[o + nope..o + qh];
                rope_slice(
                    qr,
                    pos0 + t,
                    &self.inv_freq,
                    c.rope_interleave,
                    self.rope_att,
                );
            }
        }
        // the compressed KV of the new tokens into the cache
        let mut kv = vec![0f32; n * width];
        mm(&a.kv_a.view(u), xn, n, &mut kv);
        for t in 0..n {
            let row = &mut kv[t * width..(t + 1) * width];
            let (lat, kr) = row.split_at_mut(rank);
            let mut normed = vec![0f32; rank];
            rms_norm_rows(lat, &nrm.kv_a, LORA_NORM_EPS, &mut normed);
            lat.copy_from_slice(&normed);
            rope_slice(
                kr,
                pos0 + t,
                &self.inv_freq,
                c.rope_interleave,
                self.rope_att,
            );
        }
        cache.k[l][pos0 * width..(pos0 + n) * width].copy_from_slice(&kv);
        let shape = MlaShape {
            n_heads: nh,
            nope,
            rope,
            v: vd,
            rank,
            scale: c.softmax_scale(),
        };
        let mut att = vec![0f32; n * nh * vd];
        mla_attention(
            &shape,
            &q,
            &a.kv_b.view(u),
            &cache.k[l][..(pos0 + n) * width],
            pos0,
            &mut att,
        );
        let mut o = vec![0f32; n * d];
        mm(&a.o.view(u), &att, n, &mut o);
        add_into(x, &o);
        rms_norm_rows(x, &nrm.post_attn, eps, xn);
        match f {
            Ffn::Dense { gate, up, down } => {
                swiglu_mlp(&gate.view(u), &up.view(u), &down.view(u), xn, n, &mut o);
                add_into(x, &o);
            }
            Ffn::Moe {
                router: r,
                gate,
                up,
                down,
            } => {
                router.resize(n * r.rows, 0.0);
                mm(&r.view(u), xn, n, router);
                shared.resize(n * d, 0.0);
                swiglu_mlp(&gate.view(u), &up.view(u), &down.view(u), xn, n, shared);
            }
        }
    }

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
        self.embedding.rows(store, tokens, d, &mut x)?;
        let mut xn = vec![0f32; n * d];
        let (mut router, mut shared) = (Vec::new(), Vec::new());
        for (l, (unit, a, f)) in self.layers.iter().enumerate() {
            let moe = matches!(f, Ffn::Moe { .. });
            if !moe {
                self.plan_after(store, l);
            }
            store.with_unit(*unit, |u| {
                self.spine(
                    l,
                    a,
                    f,
                    u,
                    cache,
                    pos0,
                    &mut x,
                    &mut xn,
                    &mut router,
                    &mut shared,
                )
            })?;
            if moe {
                let ne = c.n_routed_experts;
                let bias = &self.norms[l].bias;
                let routes: Vec<Vec<(usize, f32)>> = router
                    .chunks_exact(ne)
                    .map(|r| {
                        route_sigmoid_grouped(
                            r,
                            bias,
                            c.num_experts_per_tok,
                            c.n_group,
                            c.topk_group,
                            c.norm_topk_prob,
                            c.routed_scaling_factor as f32,
                        )
                    })
                    .collect();
                let mut out = vec![0f32; n * d];
                let mut src = StoreExperts {
                    table: &self.experts,
                    store,
                };
                moe_forward(&mut src, l, &routes, &xn, d, &mut out, |s| {
                    self.plan_after(s.store, l)
                })?;
                // transformers: (routed experts + shared experts) + residual
                add_into(&mut out, &shared);
                add_into(&mut x, &out);
            }
        }
        Ok(self.head.final_logits(
            store,
            &x,
            &self.final_norm,
            c.rms_norm_eps as f32,
            logits,
            vocab,
        )?)
    }
}

impl Model for DeepseekV3 {
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn context_length(&self) -> usize {
        self.config.max_position_embeddings
    }

    fn new_cache(&self, n_ctx: usize) -> KvCache {
        KvCache::new_latent(
            self.config.num_hidden_layers,
            n_ctx.min(self.config.max_position_embeddings),
            self.config.latent_dim(),
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
        let n = tokens.len();
        super::check_forward(tokens, cache, c.vocab_size)?;
        self.embedding.plan(store, tokens, c.hidden_size);
        store.plan([self.layers[0].0]);
        let r = self.forward_planned(store, cache, tokens, logits);
        super::finish_pass(store, cache, n, r)
    }
}
