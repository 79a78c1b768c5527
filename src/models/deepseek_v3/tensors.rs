//! The tensors of a DeepSeek V3 checkpoint, resolved and checked per format into one list
//! ([`Checkpoint`]) that [`super::DeepseekV3::build`] turns into weight units: the
//! Hugging Face layout here ([`hf_checkpoint`]), llama.cpp's `deepseek2` GGUF layout in
//! [`super::gguf`].

use std::path::PathBuf;

use anyhow::{anyhow, bail, Result};

use super::config::Config;
use crate::models::loading::{unit_of_pieces, MatRef, Tensors};
use crate::quant::GgmlType;
use crate::source::hf::HfModel;
use crate::source::tensor::TensorInfo;
use crate::store::{Fp8Pack, Unit};

/// `eps` of `q_a_layernorm` and `kv_a_layernorm` in transformers (built with the
/// `DeepseekV3RMSNorm` default, not `rms_norm_eps`).
pub(crate) const HF_LORA_NORM_EPS: f32 = 1e-6;

/// A linear weight (`rows × cols`, GGML shape `[cols, rows, ...]`) as stored: a plain tensor,
/// or FP8 E4M3 with its 128×128 block scales.
#[derive(Clone, Debug)]
pub(crate) enum Lin {
    Plain(TensorInfo),
    Fp8 { w: TensorInfo, s: TensorInfo },
}

/// The latent's key/value up-projection: Hugging Face's joint `kv_b_proj`, or llama.cpp's
/// split `attn_k_b` / `attn_v_b` (see [`super::mla::MlaWeights`]).
#[derive(Clone, Debug)]
pub(crate) enum KvB {
    Joint(Lin),
    Split { k: Lin, v: Lin },
}

/// The feed-forward tensors of one layer: gate, up, down.
#[derive(Clone, Debug)]
pub(crate) enum FfnTensors {
    Dense([Lin; 3]),
    /// Router (`n_routed_experts × hidden`), the shared experts as one SwiGLU, and each routed
    /// expert's SwiGLU.
    Moe {
        router: Lin,
        shared: [Lin; 3],
        experts: Vec<[Lin; 3]>,
    },
}

/// The checked tensors of one decoder layer.
#[derive(Clone, Debug)]
pub(crate) struct LayerTensors {
    /// `q_a_proj` (with `q_b_proj` in `q_b`), or `None` and `q_b` is `q_proj`.
    pub q_a: Option<Lin>,
    pub q_b: Lin,
    pub kv_a: Lin,
    pub kv_b: KvB,
    pub o: Lin,
    pub ffn: FfnTensors,
    pub input_norm: TensorInfo,
    pub q_a_norm: Option<TensorInfo>,
    pub kv_a_norm: TensorInfo,
    pub post_attn_norm: TensorInfo,
    /// `e_score_correction_bias` (MoE layers).
    pub bias: Option<TensorInfo>,
}

/// The checked tensors of a multi-token-prediction layer (DeepSeek-V3 technical report,
/// sec. 2.2).
#[derive(Clone, Debug)]
pub(crate) struct MtpTensors {
    /// `eh_proj` (`hidden × 2·hidden`: embedding columns first, then hidden).
    pub eh_proj: Lin,
    pub enorm: TensorInfo,
    pub hnorm: TensorInfo,
    /// `shared_head.norm`.
    pub head_norm: TensorInfo,
    /// `shared_head.head` (`[hidden, vocab]`), when present (else the model's LM head).
    pub head: Option<TensorInfo>,
    /// The layer's own `embed_tokens` (`[hidden, vocab]`), when present (else the model's).
    pub embed: Option<TensorInfo>,
    /// The decoder block.
    pub block: LayerTensors,
}

/// Every tensor the forward pass reads, checked against the config.
pub(crate) struct Checkpoint {
    pub files: Vec<PathBuf>,
    /// The pack `files` belong to (its relocation to physical files and expert checksums).
    pub pack: Option<std::sync::Arc<crate::source::pack::PackInfo>>,
    /// Token embeddings `[hidden, vocab]`.
    pub embd: TensorInfo,
    /// LM head `[hidden, vocab]` (the embeddings' tensor when tied).
    pub head: TensorInfo,
    pub final_norm: TensorInfo,
    pub layers: Vec<LayerTensors>,
    /// The multi-token-prediction layer, when asked for and present.
    pub mtp: Option<MtpTensors>,
    /// `eps` of the q/kv latent RMSNorms.
    pub lora_norm_eps: f32,
    /// Appended to the placement summary (e.g. ignored multi-token-prediction layers).
    pub note: String,
}

/// The unit of `lins`: one piece per tensor (an FP8 weight's piece followed by its scales'),
/// byte-adjacent tensors read as one range ([`unit_of_pieces`]); FP8 weights are repacked into
/// extra pieces after those (piece `n + k` for the k-th FP8 weight, `n` the number of
/// tensors). Returns the unit, its FP8 packs and every weight's matrix view (`rows` = product
/// of the GGML shape past the first dimension).
pub(crate) fn unit_of_lins(lins: &[&Lin]) -> (Unit, Vec<Fp8Pack>, Vec<MatRef>) {
    let mut tensors: Vec<&TensorInfo> = Vec::new();
    let mut packs = Vec::new();
    // each weight's piece (plain) or pack index (FP8)
    let mut at: Vec<Result<usize, usize>> = Vec::new();
    for l in lins {
        match l {
            Lin::Plain(t) => {
                tensors.push(t);
                at.push(Ok(tensors.len() - 1));
            }
            Lin::Fp8 { w, s } => {
                tensors.extend([w, s]);
                packs.push(Fp8Pack {
                    weight_piece: tensors.len() - 2,
                    scale_piece: tensors.len() - 1,
                    scale_ty: s.ty,
                    rows: w.shape[1] as usize,
                    cols: w.shape[0] as usize,
                });
                at.push(Err(packs.len() - 1));
            }
        }
    }
    let n = tensors.len();
    let ty = GgmlType::F8_E4M3_B128;
    let mats = at
        .iter()
        .map(|a| match *a {
            Ok(i) => crate::models::loading::mat(tensors[i], (i, 0)),
            Err(k) => {
                let (rows, cols) = (packs[k].rows, packs[k].cols);
                MatRef {
                    piece: n + k,
                    offset: 0,
                    ty,
                    rows,
                    cols,
                    bytes: rows * ty.row_bytes(cols).expect("any width"),
                }
            }
        })
        .collect();
    (unit_of_pieces(&tensors), packs, mats)
}

/// Resolves the tensors of a `deepseek_v3` / `kimi_k2` checkpoint folder for `c`: presence,
/// shape and dtype of every tensor (FP8 weights with their `weight_scale_inv` of shape
/// `[ceil(out/128), ceil(in/128)]`). With `with_mtp`, the first multi-token-prediction layer
/// (`model.layers.{num_hidden_layers}.*`: `eh_proj`, `enorm`, `hnorm`, `shared_head.norm`,
/// optional `shared_head.head` and `embed_tokens`, and a decoder block) when the folder has
/// its `eh_proj` (transformers drops these layers when it saves); other such layers are noted,
/// not run.
///
/// Errors: a missing or mis-shaped tensor or scale, named with the folder.
pub(crate) fn hf_checkpoint(c: &Config, hf: &HfModel, with_mtp: bool) -> Result<Checkpoint> {
    let label = hf.dir.display().to_string();
    let ts = Tensors::hf(label.clone(), &hf.tensors);
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
            return Ok(Lin::Plain(ts.get(&wn, &[cols, rows])?.clone()));
        }
        // shapes are GGML order here, printed as the safetensors header lists them
        let got: Vec<usize> = t.shape.iter().rev().map(|&x| x as usize).collect();
        if got != [rows, cols] {
            bail!(
                "{label}: tensor '{wn}' has shape {got:?}, expected {:?}",
                [rows, cols]
            );
        }
        let sn = format!("{name}.weight_scale_inv");
        let s = ts.by_name.get(sn.as_str()).copied().ok_or_else(|| {
            anyhow!("{label}: tensor '{sn}' is missing (FP8 weight '{wn}' needs its block scales)")
        })?;
        let want = [rows.div_ceil(128), cols.div_ceil(128)];
        let got: Vec<usize> = s.shape.iter().rev().map(|&x| x as usize).collect();
        if got != want || !matches!(s.ty, GgmlType::F32 | GgmlType::BF16) {
            bail!(
                "{label}: tensor '{sn}' has shape {got:?} and type {}, expected {want:?} F32 or BF16 (128×128 blocks of '{wn}')",
                s.ty
            );
        }
        Ok(Lin::Fp8 {
            w: t.clone(),
            s: s.clone(),
        })
    };
    let vec = |name: &str, n: usize| -> Result<TensorInfo> { Ok(ts.get(name, &[n])?.clone()) };
    let embd = ts
        .get("model.embed_tokens.weight", &[d, c.vocab_size])?
        .clone();
    let head = match c.tie_word_embeddings {
        true => embd.clone(),
        false => ts.get("lm_head.weight", &[d, c.vocab_size])?.clone(),
    };
    let (qh, vd, rank) = (c.qk_head_dim(), c.v_head_dim, c.kv_lora_rank);
    // one decoder block's tensors, `model.layers.{l}.*`
    let layer = |l: usize| -> Result<LayerTensors> {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        let moe = c.is_moe_layer(l);
        let (q_a, q_b) = match c.q_lora_rank {
            Some(r) => (
                Some(lin(&p("self_attn.q_a_proj"), r, d)?),
                lin(&p("self_attn.q_b_proj"), nh * qh, r)?,
            ),
            None => (None, lin(&p("self_attn.q_proj"), nh * qh, d)?),
        };
        let ffn = if moe {
            let experts = (0..ne)
                .map(|e| {
                    let x = |s: &str| p(&format!("mlp.experts.{e}.{s}"));
                    Ok([
                        lin(&x("gate_proj"), eff, d)?,
                        lin(&x("up_proj"), eff, d)?,
                        lin(&x("down_proj"), d, eff)?,
                    ])
                })
                .collect::<Result<Vec<_>>>()?;
            FfnTensors::Moe {
                router: Lin::Plain(ts.get(&p("mlp.gate.weight"), &[d, ne])?.clone()),
                shared: [
                    lin(&p("mlp.shared_experts.gate_proj"), sff, d)?,
                    lin(&p("mlp.shared_experts.up_proj"), sff, d)?,
                    lin(&p("mlp.shared_experts.down_proj"), d, sff)?,
                ],
                experts,
            }
        } else {
            FfnTensors::Dense([
                lin(&p("mlp.gate_proj"), dff, d)?,
                lin(&p("mlp.up_proj"), dff, d)?,
                lin(&p("mlp.down_proj"), d, dff)?,
            ])
        };
        Ok(LayerTensors {
            q_a,
            q_b,
            kv_a: lin(&p("self_attn.kv_a_proj_with_mqa"), c.latent_dim(), d)?,
            kv_b: KvB::Joint(lin(
                &p("self_attn.kv_b_proj"),
                nh * (c.qk_nope_head_dim + vd),
                rank,
            )?),
            o: lin(&p("self_attn.o_proj"), d, nh * vd)?,
            ffn,
            input_norm: vec(&p("input_layernorm.weight"), d)?,
            q_a_norm: match c.q_lora_rank {
                Some(r) => Some(vec(&p("self_attn.q_a_layernorm.weight"), r)?),
                None => None,
            },
            kv_a_norm: vec(&p("self_attn.kv_a_layernorm.weight"), rank)?,
            post_attn_norm: vec(&p("post_attention_layernorm.weight"), d)?,
            bias: match moe {
                true => Some(vec(&p("mlp.gate.e_score_correction_bias"), ne)?),
                false => None,
            },
        })
    };
    let layers = (0..c.num_hidden_layers)
        .map(layer)
        .collect::<Result<Vec<_>>>()?;
    // the multi-token-prediction layer: run with `--draft mtp` (`with_mtp`), else noted
    let n = c.num_hidden_layers;
    let has = |s: &str| ts.by_name.contains_key(format!("model.layers.{n}.{s}").as_str());
    let mtp = match with_mtp && c.num_nextn_predict_layers > 0 && has("eh_proj.weight") {
        false => None,
        true => {
            let p = |s: &str| format!("model.layers.{n}.{s}");
            let opt = |s: &str| -> Result<Option<TensorInfo>> {
                match has(s) {
                    true => Ok(Some(ts.get(&p(s), &[d, c.vocab_size])?.clone())),
                    false => Ok(None),
                }
            };
            Some(MtpTensors {
                eh_proj: lin(&p("eh_proj"), d, 2 * d)?,
                enorm: vec(&p("enorm.weight"), d)?,
                hnorm: vec(&p("hnorm.weight"), d)?,
                head_norm: vec(&p("shared_head.norm.weight"), d)?,
                head: opt("shared_head.head.weight")?,
                embed: opt("embed_tokens.weight")?,
                block: layer(n)?,
            })
        }
    };
    // multi-token-prediction layers (`model.layers.{num_hidden_layers}..`) not run
    let unused: std::collections::BTreeSet<&str> = hf
        .tensors
        .iter()
        .filter_map(|t| {
            let rest = t.name.strip_prefix("model.layers.")?;
            let l = rest.split('.').next()?;
            let l_n = l.parse::<usize>().ok()?;
            (l_n >= c.num_hidden_layers + usize::from(mtp.is_some())).then_some(l)
        })
        .collect();
    let mut note = match unused.len() {
        0 => String::new(),
        k => format!(", {k} multi-token-prediction layer(s) ignored"),
    };
    if mtp.is_some() {
        note.push_str(", multi-token-prediction layer loaded");
    }
    Ok(Checkpoint {
        files: hf.files.clone(),
        pack: hf.pack.clone(),
        final_norm: vec("model.norm.weight", d)?,
        embd,
        head,
        layers,
        mtp,
        lora_norm_eps: HF_LORA_NORM_EPS,
        note,
    })
}
