//! Synthetic checkpoints: random weights in the exact tensor layout of a real architecture, at
//! real per-expert sizes, written fast (one xorshift64* draw gives four BF16 values through a
//! lookup table; tensors go out in multi-MiB writes) so benchmarks can have models of tens of
//! GB in minutes.
//!
//! `qwen3_moe` presets write a Hugging Face folder as published Qwen3-MoE checkpoints are laid
//! out (`config.json` in the published dialect, sharded `model-0000N-of-0000M.safetensors` with
//! `model.safetensors.index.json`, BF16, every expert's `down_proj`, `gate_proj`, `up_proj`
//! adjacent), plus the small byte-level BPE tokenizer of the `qwen3_moe` test fixture (vocabulary
//! of 512, ChatML template) so `deltafin run` works on it. Weights are uniform in
//! `±1/√fan_in`, norm weights 1, so activations stay in range through the layers.

use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context, Result};

/// The shape of a synthetic `qwen3_moe` model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Qwen3MoeShape {
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    pub vocab_size: usize,
}

impl Qwen3MoeShape {
    /// Bytes of one expert in BF16 (gate, up and down: `3 × hidden × moe_intermediate × 2`).
    pub fn expert_bytes(&self) -> usize {
        3 * self.hidden_size * self.moe_intermediate_size * 2
    }
}

/// The presets: name, description, shape.
pub fn presets() -> Vec<(&'static str, &'static str, Qwen3MoeShape)> {
    let qwen30 = |layers| Qwen3MoeShape {
        hidden_size: 2048,
        num_hidden_layers: layers,
        num_attention_heads: 32,
        num_key_value_heads: 4,
        head_dim: 128,
        num_experts: 128,
        num_experts_per_tok: 8,
        moe_intermediate_size: 768,
        vocab_size: 512,
    };
    vec![
        (
            "tiny",
            "CI: hidden 64, 3 layers, 16 experts, top-4, expert FFN 32 (12 KiB experts)",
            Qwen3MoeShape {
                hidden_size: 64,
                num_hidden_layers: 3,
                num_attention_heads: 4,
                num_key_value_heads: 2,
                head_dim: 16,
                num_experts: 16,
                num_experts_per_tok: 4,
                moe_intermediate_size: 32,
                vocab_size: 512,
            },
        ),
        (
            "small",
            "hidden 512, 4 layers, 64 experts, top-8, expert FFN 256 (768 KiB experts), ~200 MB",
            Qwen3MoeShape {
                hidden_size: 512,
                num_hidden_layers: 4,
                num_attention_heads: 8,
                num_key_value_heads: 2,
                head_dim: 64,
                num_experts: 64,
                num_experts_per_tok: 8,
                moe_intermediate_size: 256,
                vocab_size: 512,
            },
        ),
        (
            "qwen3-30b-a3b",
            "Qwen3-30B-A3B shape (hidden 2048, 128 experts, top-8, expert FFN 768: 9 MiB experts), 48 layers (~58 GB); use --layers for fewer",
            qwen30(48),
        ),
    ]
}

/// A fast pseudo-random generator (xorshift64*, Vigna 2016).
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Fills `out` (BF16 little-endian bytes) with values uniform in `±scale`.
fn fill_bf16(rng: &mut Rng, scale: f32, out: &mut [u8]) {
    let table: Vec<[u8; 2]> = (0..4096)
        .map(|i| {
            let v = ((i as f32 + 0.5) / 2048.0 - 1.0) * scale;
            half::bf16::from_f32(v).to_le_bytes()
        })
        .collect();
    for chunk in out.chunks_mut(8) {
        let r = rng.next();
        for (j, b) in chunk.chunks_mut(2).enumerate() {
            b.copy_from_slice(&table[((r >> (16 * j)) & 4095) as usize][..b.len()]);
        }
    }
}

/// One tensor to write: name, PyTorch shape `[out, in]` or `[n]`, fill.
struct Spec {
    name: String,
    shape: Vec<usize>,
    /// `None`: all ones (norm weights); else uniform in ±scale.
    scale: Option<f32>,
}

impl Spec {
    fn bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * 2
    }
}

fn specs(s: &Qwen3MoeShape) -> Vec<Vec<Spec>> {
    let d = s.hidden_size;
    let (qd, kvd) = (
        s.num_attention_heads * s.head_dim,
        s.num_key_value_heads * s.head_dim,
    );
    let ff = s.moe_intermediate_size;
    let w = |name: String, out: usize, inp: usize| Spec {
        name,
        shape: vec![out, inp],
        scale: Some(1.0 / (inp as f32).sqrt()),
    };
    let ones = |name: String, n: usize| Spec {
        name,
        shape: vec![n],
        scale: None,
    };
    // groups: the embeddings, one per layer, the final norm and head
    let mut groups = vec![vec![Spec {
        name: "model.embed_tokens.weight".into(),
        shape: vec![s.vocab_size, d],
        scale: Some(1.0),
    }]];
    for l in 0..s.num_hidden_layers {
        let p = |x: &str| format!("model.layers.{l}.{x}.weight");
        let mut g = vec![
            ones(p("input_layernorm"), d),
            w(p("self_attn.q_proj"), qd, d),
            w(p("self_attn.k_proj"), kvd, d),
            w(p("self_attn.v_proj"), kvd, d),
            w(p("self_attn.o_proj"), d, qd),
            ones(p("self_attn.q_norm"), s.head_dim),
            ones(p("self_attn.k_norm"), s.head_dim),
            ones(p("post_attention_layernorm"), d),
            w(p("mlp.gate"), s.num_experts, d),
        ];
        for e in 0..s.num_experts {
            let x = |m: &str| p(&format!("mlp.experts.{e}.{m}"));
            g.push(w(x("down_proj"), d, ff));
            g.push(w(x("gate_proj"), ff, d));
            g.push(w(x("up_proj"), ff, d));
        }
        groups.push(g);
    }
    groups.push(vec![
        ones("model.norm.weight".into(), d),
        w("lm_head.weight".into(), s.vocab_size, d),
    ]);
    groups
}

/// The published-dialect `config.json` of `s`.
pub fn config_json(s: &Qwen3MoeShape) -> serde_json::Value {
    serde_json::json!({
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "attention_bias": false,
        "bos_token_id": null,
        "decoder_sparse_step": 1,
        "eos_token_id": 482,
        "head_dim": s.head_dim,
        "hidden_act": "silu",
        "hidden_size": s.hidden_size,
        "intermediate_size": s.moe_intermediate_size * s.num_experts_per_tok,
        "max_position_embeddings": 4096,
        "mlp_only_layers": [],
        "moe_intermediate_size": s.moe_intermediate_size,
        "norm_topk_prob": true,
        "num_attention_heads": s.num_attention_heads,
        "num_experts": s.num_experts,
        "num_experts_per_tok": s.num_experts_per_tok,
        "num_hidden_layers": s.num_hidden_layers,
        "num_key_value_heads": s.num_key_value_heads,
        "rms_norm_eps": 1e-6,
        "rope_scaling": null,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16",
        "vocab_size": s.vocab_size,
        "deltafin_synthetic": true,
    })
}

/// Writes a random-weight `qwen3_moe` checkpoint of shape `s` into `out` (created; must not
/// hold a `config.json` already), in shards of about `shard_bytes`, seeded by `seed`.
/// `progress(bytes written, total bytes)` is called after each tensor group.
///
/// Errors: the folder already holds a model, or a write fails (the message names the file).
pub fn write_qwen3_moe(
    s: &Qwen3MoeShape,
    out: &Path,
    shard_bytes: usize,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    if out.join("config.json").exists() {
        bail!("{}: already holds a model (config.json)", out.display());
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let groups = specs(s);
    // shards: consecutive groups up to shard_bytes each
    let mut shards: Vec<Vec<&Spec>> = vec![vec![]];
    let mut in_shard = 0usize;
    for g in &groups {
        let gb: usize = g.iter().map(|t| t.bytes()).sum();
        if in_shard > 0 && in_shard + gb > shard_bytes {
            shards.push(vec![]);
            in_shard = 0;
        }
        shards.last_mut().unwrap().extend(g.iter());
        in_shard += gb;
    }
    let total: u64 = groups.iter().flatten().map(|t| t.bytes() as u64).sum();
    let n = shards.len();
    let mut rng = Rng(seed.max(1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut weight_map = serde_json::Map::new();
    let mut written = 0u64;
    for (i, shard) in shards.iter().enumerate() {
        let fname = format!("model-{:05}-of-{n:05}.safetensors", i + 1);
        let path = out.join(&fname);
        let mut header = serde_json::Map::new();
        header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
        let mut off = 0usize;
        for t in shard {
            header.insert(
                t.name.clone(),
                serde_json::json!({"dtype": "BF16", "shape": t.shape, "data_offsets": [off, off + t.bytes()]}),
            );
            weight_map.insert(t.name.clone(), fname.clone().into());
            off += t.bytes();
        }
        let mut h = serde_json::Value::Object(header).to_string().into_bytes();
        while !(8 + h.len()).is_multiple_of(8) {
            h.push(b' ');
        }
        let f =
            std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        let mut w = std::io::BufWriter::with_capacity(8 << 20, f);
        let wr = |w: &mut std::io::BufWriter<std::fs::File>, b: &[u8]| {
            w.write_all(b)
                .with_context(|| format!("writing {}", path.display()))
        };
        wr(&mut w, &(h.len() as u64).to_le_bytes())?;
        wr(&mut w, &h)?;
        let mut buf = Vec::new();
        for t in shard {
            buf.resize(t.bytes(), 0);
            match t.scale {
                Some(sc) => fill_bf16(&mut rng, sc, &mut buf),
                None => buf
                    .chunks_mut(2)
                    .for_each(|c| c.copy_from_slice(&half::bf16::ONE.to_le_bytes())),
            }
            wr(&mut w, &buf)?;
            written += t.bytes() as u64;
            if t.name.ends_with("up_proj.weight") || t.name.contains("lm_head") {
                progress(written, total);
            }
        }
        w.flush()
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let index = serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    let files: [(&str, Vec<u8>); 5] = [
        (
            "model.safetensors.index.json",
            index.to_string().into_bytes(),
        ),
        (
            "config.json",
            serde_json::to_vec_pretty(&config_json(s)).expect("json"),
        ),
        (
            "generation_config.json",
            br#"{"eos_token_id": 482, "do_sample": false}"#.to_vec(),
        ),
        (
            "tokenizer.json",
            include_bytes!("../../tests/fixtures/hf/qwen3_moe/tokenizer.json").to_vec(),
        ),
        (
            "tokenizer_config.json",
            include_bytes!("../../tests/fixtures/hf/qwen3_moe/tokenizer_config.json").to_vec(),
        ),
    ];
    for (name, bytes) in files {
        let p = out.join(name);
        std::fs::write(&p, bytes).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_preset_loads_as_a_hugging_face_folder_with_the_expected_sizes() {
        let dir = tempfile::tempdir().unwrap();
        let shape = presets()[0].2.clone();
        assert_eq!(shape.expert_bytes(), 12288);
        write_qwen3_moe(&shape, dir.path(), 100_000, 7, &mut |_, _| {}).unwrap();
        let hf = crate::source::hf::HfModel::open(dir.path()).unwrap();
        // 64 KiB embeddings, ~218 KiB per layer, head: each its own shard at ~100 kB
        assert_eq!(hf.files.len(), 5);
        let t = hf
            .tensors
            .iter()
            .find(|t| t.name == "model.layers.2.mlp.experts.15.down_proj.weight")
            .unwrap();
        assert_eq!(t.shape, vec![32, 64]);
        assert_eq!(t.n_bytes, 4096);
        let e = write_qwen3_moe(&shape, dir.path(), 100_000, 7, &mut |_, _| {}).unwrap_err();
        assert!(e.to_string().contains("already holds a model"), "{e}");
    }
}
