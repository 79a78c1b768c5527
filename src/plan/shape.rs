//! A model's [`ModelShape`] without loading it: from an opened model's tensor index and its
//! metadata or `config.json` (a GGUF, a Hugging Face folder, a pack), or from a `synth` preset
//! (`kimi-k3`, ...) through the synthetic writer's exact plan, so a model can be planned before
//! it is downloaded.

use std::collections::BTreeMap;

use anyhow::{bail, Result};
use serde_json::Value as Json;

use super::predict::ModelShape;
use crate::load::OpenedModel;
use crate::quant::GgmlType;
use crate::store::plan::Allowance;
use crate::write::synth::{self, Encoding, Shape};

/// The layer of a tensor named `….layers.L.…` or `blk.L.…`.
fn layer_of(name: &str) -> Option<usize> {
    let rest = match name.strip_prefix("blk.") {
        Some(r) => r,
        None => name.split_once(".layers.")?.1,
    };
    rest.split_once('.')?.0.parse().ok()
}

/// A `config.json` field, top level or under `text_config`.
fn cfg<'a>(c: &'a Json, keys: &[&str]) -> Option<&'a Json> {
    keys.iter()
        .find_map(|k| c.get(*k).or_else(|| c.get("text_config")?.get(*k)))
}

fn cfg_u64(c: &Json, keys: &[&str]) -> Option<u64> {
    cfg(c, keys).and_then(|v| v.as_u64())
}

/// The shape of an opened model named `name`; `types` receives the encoding holding the most
/// spine bytes and the one holding the most expert bytes.
///
/// Errors: a GGUF without `general.architecture`.
pub fn of_model(m: &OpenedModel, name: &str) -> Result<(ModelShape, [GgmlType; 2])> {
    let experts_names = m.family().and_then(|f| f.experts);
    let is_expert = |n: &str| experts_names.is_some_and(|e| e.is_expert(n));
    let (tensors, pack) = match m {
        OpenedModel::Gguf(g) => (&g.tensors, g.pack.is_some()),
        OpenedModel::Hf(h) => (&h.tensors, h.pack.is_some()),
    };
    let mut spine = 0u64;
    let mut expert_total = 0u64;
    let mut per_layer: BTreeMap<usize, u64> = BTreeMap::new();
    let mut expert_tensors: BTreeMap<usize, usize> = BTreeMap::new();
    let mut by_type: [BTreeMap<&'static str, (u64, GgmlType)>; 2] = Default::default();
    let (mut embd, mut head) = (0u64, 0u64);
    for t in tensors {
        let ex = is_expert(&t.name);
        let e = by_type[ex as usize].entry(t.ty.name()).or_insert((0, t.ty));
        e.0 += t.n_bytes;
        if ex {
            expert_total += t.n_bytes;
            if let Some(l) = layer_of(&t.name) {
                *expert_tensors.entry(l).or_default() += 1;
            }
            continue;
        }
        spine += t.n_bytes;
        let n = t.name.as_str();
        if n == "token_embd.weight" || n.ends_with("embed_tokens.weight") {
            embd = t.n_bytes;
        } else if n == "output.weight" || n == "lm_head.weight" || n.ends_with(".lm_head.weight") {
            head = t.n_bytes;
        } else if let Some(l) = layer_of(n) {
            *per_layer.entry(l).or_default() += t.n_bytes;
        }
    }
    if head == 0 {
        // tied: the embeddings are the head, multiplied every token
        head = embd;
        embd = 0;
    }
    let dominant = |i: usize| {
        by_type[i]
            .values()
            .max_by_key(|x| x.0)
            .map_or(GgmlType::BF16, |x| x.1)
    };
    let types = [dominant(0), dominant(1)];
    let (arch, layers, k, n_exp, ctx, kv, state) = match m {
        OpenedModel::Gguf(g) => {
            let arch = g.architecture()?.to_string();
            let u = |k: &str| g.opt_u64(&format!("{arch}.{k}")).ok().flatten();
            let layers = u("block_count").unwrap_or(per_layer.len() as u64);
            let heads = u("attention.head_count").unwrap_or(1);
            let d = u("embedding_length").unwrap_or(0);
            let kv_rows: Vec<u64> = match g.metadata.get(&format!("{arch}.attention.head_count_kv"))
            {
                Some(crate::source::gguf::Value::Array(a)) => {
                    a.iter().map(|v| v.as_u64().unwrap_or(0)).collect()
                }
                _ => vec![u("attention.head_count_kv").unwrap_or(heads); layers as usize],
            };
            let kv = match u("attention.kv_lora_rank") {
                // MLA: the latent row per attention layer (kimi-k3 marks them with 1s)
                Some(r) => {
                    let rope = u("rope.dimension_count").unwrap_or(0);
                    kv_rows.iter().filter(|&&h| h > 0).count() as u64 * (r + rope) * 4
                }
                None => {
                    let kl = u("attention.key_length").unwrap_or(d / heads.max(1));
                    let vl = u("attention.value_length").unwrap_or(kl);
                    kv_rows.iter().map(|h| h * (kl + vl) * 4).sum()
                }
            };
            let state = match u("kda.head_dim") {
                Some(hd) => {
                    let kda = kv_rows.iter().filter(|&&h| h == 0).count() as u64;
                    let conv = u("ssm.conv_kernel").unwrap_or(4);
                    kda * ((conv - 1) * 3 * heads * hd + heads * hd * hd) * 4
                }
                None => 0,
            };
            (
                arch.clone(),
                layers,
                u("expert_used_count"),
                u("expert_count"),
                u("context_length"),
                kv,
                state,
            )
        }
        OpenedModel::Hf(h) => {
            let c = &h.config;
            let arch = cfg(c, &["model_type"])
                .and_then(|v| v.as_str())
                .unwrap_or("?")
                .to_string();
            let layers = cfg_u64(c, &["num_hidden_layers", "n_layers"]).unwrap_or(0);
            let heads = cfg_u64(c, &["num_attention_heads"]).unwrap_or(1);
            let d = cfg_u64(c, &["hidden_size"]).unwrap_or(0);
            let kv = match cfg_u64(c, &["kv_lora_rank"]) {
                Some(r) => layers * (r + cfg_u64(c, &["qk_rope_head_dim"]).unwrap_or(0)) * 4,
                None => {
                    let kvh = cfg_u64(c, &["num_key_value_heads"]).unwrap_or(heads);
                    let hd = cfg_u64(c, &["head_dim"]).unwrap_or(d / heads.max(1));
                    layers * kvh * hd * 2 * 4
                }
            };
            (
                arch,
                layers,
                cfg_u64(c, &["num_experts_per_tok", "experts_per_token", "moe_topk"]),
                cfg_u64(c, &["num_experts", "num_local_experts", "n_routed_experts"]),
                cfg_u64(c, &["max_position_embeddings"]),
                kv,
                0,
            )
        }
    };
    let moe_layers = expert_tensors.len();
    let n_exp = n_exp.unwrap_or(0) as usize;
    let (expert_bytes, reads) = match (moe_layers, n_exp) {
        (0, _) | (_, 0) => (0, 0),
        (l, e) => {
            let per_layer_tensors = expert_tensors.values().next().copied().unwrap_or(0);
            let reads = match per_layer_tensors >= e {
                true => per_layer_tensors / e,
                false => per_layer_tensors,
            };
            (expert_total / (l * e) as u64, if pack { 1 } else { reads })
        }
    };
    let source = match (m, pack) {
        (_, true) => "pack",
        (OpenedModel::Gguf(_), _) => "gguf",
        (OpenedModel::Hf(_), _) => "safetensors",
    };
    let largest = per_layer.values().copied().max().unwrap_or(0).max(head);
    let shape = ModelShape {
        name: name.to_string(),
        source: source.into(),
        architecture: arch,
        layers: layers as usize,
        moe_layers: if expert_bytes > 0 { moe_layers } else { 0 },
        experts: if expert_bytes > 0 { n_exp } else { 0 },
        experts_per_token: if expert_bytes > 0 {
            k.unwrap_or(1) as usize
        } else {
            0
        },
        expert_bytes,
        reads_per_expert: reads,
        spine_bytes: spine + if expert_bytes > 0 { 0 } else { expert_total },
        embedding_bytes: embd,
        head_bytes: head,
        largest_spine_unit: largest,
        kv_bytes_per_token: kv,
        state_bytes: state,
        context_length: ctx,
        allowance: m.allowance(),
    };
    Ok((shape, types))
}

/// The shape of the synth preset `name` (`deltafin synth --preset list`) as `synth` would
/// write it in its architecture's default encoding; `None` when no preset has that name.
/// The tokenizer and file headers of the real model are not known: the allowance is the demo
/// model's (6.2 MiB of metadata) plus one index entry per tensor of the written file.
///
/// Errors: the preset cannot be planned (not expected for the catalog's shapes).
pub fn of_preset(name: &str) -> Result<Option<(ModelShape, [GgmlType; 2])>> {
    let Some(p) = synth::catalog().into_iter().find(|p| p.name == name) else {
        return Ok(None);
    };
    let enc = match p.shape.encodings().first() {
        Some(e) => *e,
        None => bail!("preset {name} has no encoding"),
    };
    let planned = synth::plan(&p.shape, enc, 4 << 30)?;
    let routed = (planned.moe_layers * planned.experts) as u64 * planned.expert_bytes;
    let expert_ty = match enc {
        Encoding::Mxfp4 => GgmlType::MXFP4,
        Encoding::Fp8 => GgmlType::F8_E4M3,
        Encoding::Gguf(t) => t,
        Encoding::Bf16 => GgmlType::BF16,
    };
    // (k, hidden, vocab, kv bytes per token, state bytes, context, tensors per expert)
    let f = |x: usize| x as u64;
    let (k, d, vocab, kv, state, ctx, reads) = match &p.shape {
        Shape::Qwen3Moe(s) => (
            s.num_experts_per_tok,
            f(s.hidden_size),
            f(s.vocab_size),
            f(s.num_hidden_layers * s.num_key_value_heads * s.head_dim * 8),
            0,
            40960,
            3,
        ),
        Shape::DeepseekV3(s) => (
            s.num_experts_per_tok,
            f(s.hidden_size),
            f(s.vocab_size),
            f(s.num_hidden_layers * (s.kv_lora_rank + s.qk_rope_head_dim) * 4),
            0,
            163840,
            3,
        ),
        Shape::GptOss(s) => (
            s.num_experts_per_tok,
            f(s.hidden_size),
            f(s.vocab_size),
            f(s.num_hidden_layers * s.num_key_value_heads * s.head_dim * 8),
            0,
            131072,
            4,
        ),
        Shape::KimiLinear(s) => {
            let mla = (0..s.num_hidden_layers).filter(|&l| s.is_mla(l)).count();
            let dim = s.linear_num_heads * s.linear_head_dim;
            let kda = (s.conv_kernel - 1) * 3 * dim + s.linear_num_heads * s.linear_head_dim.pow(2);
            (
                s.num_experts_per_tok,
                f(s.hidden_size),
                f(s.vocab_size),
                f(mla * (s.kv_lora_rank + s.qk_rope_head_dim) * 4),
                f((s.num_hidden_layers - mla) * kda * 4),
                1048576,
                3,
            )
        }
        Shape::KimiK3(s) => {
            let mla = (0..s.num_hidden_layers).filter(|&l| s.is_mla(l)).count();
            let dim = s.num_heads * s.kda_head_dim;
            let kda = (s.conv_kernel - 1) * 3 * dim + s.num_heads * s.kda_head_dim.pow(2);
            (
                s.num_experts_per_tok,
                f(s.hidden_size),
                f(s.vocab_size),
                f(mla * (s.kv_lora_rank + s.qk_rope_head_dim) * 4),
                f((s.num_hidden_layers - mla) * kda * 4),
                1048576,
                3,
            )
        }
    };
    let (embd, head) = (vocab * d * 2, vocab * d * 2);
    let spine = planned.tensor_bytes - routed;
    let layers = planned.layers as u64;
    let shape = ModelShape {
        name: name.to_string(),
        source: "preset".into(),
        architecture: p.shape.arch().into(),
        layers: planned.layers,
        moe_layers: planned.moe_layers,
        experts: planned.experts,
        experts_per_token: k,
        expert_bytes: planned.expert_bytes,
        reads_per_expert: reads,
        spine_bytes: spine,
        embedding_bytes: embd,
        head_bytes: head,
        largest_spine_unit: ((spine - embd - head) / layers.max(1)).max(head),
        kv_bytes_per_token: kv,
        state_bytes: state,
        context_length: Some(ctx),
        allowance: Allowance::estimate(6_525_000, layers * 20),
    };
    Ok(Some((shape, [GgmlType::BF16, expert_ty])))
}
