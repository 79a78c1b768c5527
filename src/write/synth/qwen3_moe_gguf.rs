//! Synthetic `qwen3moe` GGUF files: random weights in llama.cpp's tensor names, shapes and
//! metadata (as its `convert_hf_to_gguf.py` writes a Qwen3-MoE checkpoint and
//! `src/llama-arch.cpp` names the keys), streamed to disk so files of tens of GB take minutes
//! and little memory. Both Deltafin and llama.cpp load them, which makes them the common input
//! of the llama.cpp comparison in BENCHMARKS.md.
//!
//! Matrices are Q4_0, Q8_0 or Q4_K (ggml `ggml-common.h` block layouts; random quants with
//! block scales chosen so values span about `±1/√fan_in`, the token embedding `±1`, with a
//! random sign per block so rows have no common bias: see `fill::ggml_blocks`).
//! A Q4_K matrix whose row length is not a multiple of 256 falls back to Q5_0, as llama.cpp's
//! quantizer does (`llama-quant.cpp`, "using fallback quantization"); Q4_K files are what
//! `llama-quantize --pure ... Q4_K_S` writes. Norm weights are F32 ones; routers
//! (`ffn_gate_inp`) stay F32 as llama.cpp's quantizer leaves them. The
//! tokenizer (byte-level BPE, `tokenizer.ggml.model = gpt2`, pre-tokenizer `qwen2`, 512 tokens,
//! ChatML template) is copied from the committed llama.cpp-converted fixture
//! `tests/fixtures/gguf/qwen3_moe/qwen3_moe-q5_0.gguf`.

use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context, Result};

use super::fill::{self, Rng};
use super::planned::Planned;
use super::qwen3_moe::Qwen3MoeShape;
use crate::quant::GgmlType;
use crate::source::gguf::Value;
use crate::write::gguf_writer::{streamed_len, write_streamed, StreamTensor};

/// The llama.cpp-converted fixture whose tokenizer metadata synthetic files reuse.
const TOKENIZER_SOURCE: &[u8] =
    include_bytes!("../../../tests/fixtures/gguf/qwen3_moe/qwen3_moe-q5_0.gguf");

/// The encodings a synthetic GGUF's matrices can use: Q4_0, Q8_0, Q4_K, then the low-bit
/// types (`quant::EXT_TYPES`).
pub const QUANTS: [GgmlType; 3 + crate::quant::EXT_TYPES.len()] = {
    let ext = crate::quant::EXT_TYPES;
    let mut out = [GgmlType::Q4_0; 3 + crate::quant::EXT_TYPES.len()];
    out[1] = GgmlType::Q8_0;
    out[2] = GgmlType::Q4_K;
    let mut i = 0;
    while i < ext.len() {
        out[3 + i] = ext[i];
        i += 1;
    }
    out
};

/// llama.cpp's `general.file_type` (`enum llama_ftype` in `llama.h`) of a file whose
/// matrices are `q` (the `_S` variant where llama.cpp has several mixes of one type).
fn file_type(q: GgmlType) -> u32 {
    match q {
        GgmlType::Q4_0 => 2,     // MOSTLY_Q4_0
        GgmlType::Q4_1 => 3,     // MOSTLY_Q4_1
        GgmlType::Q5_1 => 9,     // MOSTLY_Q5_1
        GgmlType::Q2_K => 10,    // MOSTLY_Q2_K
        GgmlType::Q3_K => 11,    // MOSTLY_Q3_K_S
        GgmlType::Q4_K => 14,    // MOSTLY_Q4_K_S
        GgmlType::Q5_K => 16,    // MOSTLY_Q5_K_S
        GgmlType::IQ2_XXS => 19, // MOSTLY_IQ2_XXS
        GgmlType::IQ2_XS => 20,  // MOSTLY_IQ2_XS
        GgmlType::IQ3_XXS => 23, // MOSTLY_IQ3_XXS
        GgmlType::IQ1_S => 24,   // MOSTLY_IQ1_S
        GgmlType::IQ4_NL => 25,  // MOSTLY_IQ4_NL
        GgmlType::IQ3_S => 26,   // MOSTLY_IQ3_S
        GgmlType::IQ2_S => 28,   // MOSTLY_IQ2_S
        GgmlType::IQ4_XS => 30,  // MOSTLY_IQ4_XS
        GgmlType::IQ1_M => 31,   // MOSTLY_IQ1_M
        GgmlType::TQ1_0 => 36,   // MOSTLY_TQ1_0
        GgmlType::TQ2_0 => 37,   // MOSTLY_TQ2_0
        _ => 7,                  // MOSTLY_Q8_0
    }
}

/// The type a matrix with rows of `n` elements gets when the file's matrices are `q`: `q`,
/// except 256-element super-block types for rows that are not whole super-blocks, which fall
/// back as llama.cpp's quantizer does (`llama-quant.cpp`, `tensor_type_fallback`): Q4_K to
/// Q5_0, Q5_K to Q5_1, Q2_K / Q3_K / TQ1_0 / TQ2_0 to Q4_0, the IQ types to IQ4_NL.
pub fn matrix_type(q: GgmlType, n: usize) -> GgmlType {
    if n.is_multiple_of(q.block_elems()) {
        return q;
    }
    match q {
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::TQ1_0 | GgmlType::TQ2_0 => GgmlType::Q4_0,
        GgmlType::IQ1_S
        | GgmlType::IQ1_M
        | GgmlType::IQ2_XXS
        | GgmlType::IQ2_XS
        | GgmlType::IQ2_S
        | GgmlType::IQ3_XXS
        | GgmlType::IQ3_S
        | GgmlType::IQ4_XS => GgmlType::IQ4_NL,
        _ => q,
    }
}

/// The metadata of a `qwen3moe` file of shape `s` with matrices in `q`.
fn metadata(s: &Qwen3MoeShape, q: GgmlType) -> Result<Vec<(String, Value)>> {
    let src = crate::source::gguf_parse::parse(
        std::io::Cursor::new(TOKENIZER_SOURCE),
        TOKENIZER_SOURCE.len() as u64,
        "qwen3_moe-q5_0.gguf",
    )
    .context("parsing the embedded tokenizer fixture")?;
    let n_tokens = src
        .metadata
        .get("tokenizer.ggml.tokens")
        .and_then(|v| v.as_array())
        .map_or(0, |a| a.len());
    if n_tokens != s.vocab_size {
        bail!(
            "the synthetic GGUF tokenizer has {n_tokens} tokens, the shape asks for a vocabulary of {}",
            s.vocab_size
        );
    }
    let u = |v: usize| Value::U32(v as u32);
    let a = |k: &str| format!("qwen3moe.{k}");
    let mut m: Vec<(String, Value)> = vec![
        (
            "general.architecture".into(),
            Value::String("qwen3moe".into()),
        ),
        ("general.type".into(), Value::String("model".into())),
        (
            "general.name".into(),
            Value::String("Deltafin synthetic qwen3moe".into()),
        ),
        (a("block_count"), u(s.num_hidden_layers)),
        (a("context_length"), u(4096)),
        (a("embedding_length"), u(s.hidden_size)),
        (
            a("feed_forward_length"),
            u(s.moe_intermediate_size * s.num_experts_per_tok),
        ),
        (a("attention.head_count"), u(s.num_attention_heads)),
        (a("attention.head_count_kv"), u(s.num_key_value_heads)),
        (a("rope.freq_base"), Value::F32(1_000_000.0)),
        (a("attention.layer_norm_rms_epsilon"), Value::F32(1e-6)),
        (a("expert_count"), u(s.num_experts)),
        (a("expert_used_count"), u(s.num_experts_per_tok)),
        (a("attention.key_length"), u(s.head_dim)),
        (a("attention.value_length"), u(s.head_dim)),
        (a("expert_feed_forward_length"), u(s.moe_intermediate_size)),
    ];
    for (k, v) in &src.metadata {
        if k.starts_with("tokenizer.") {
            m.push((k.clone(), v.clone()));
        }
    }
    m.push(("general.quantization_version".into(), Value::U32(2)));
    m.push(("general.file_type".into(), Value::U32(file_type(q))));
    Ok(m)
}

/// One tensor and its fill: `None` all ones (F32 norms), else values spanning `±scale`.
struct Spec {
    t: StreamTensor,
    scale: Option<f32>,
    /// Routed experts the tensor holds (the stacked `ffn_*_exps`), else 0.
    experts: usize,
}

fn specs(s: &Qwen3MoeShape, q: GgmlType) -> Vec<Spec> {
    let d = s.hidden_size as u64;
    let (qd, kvd) = (
        (s.num_attention_heads * s.head_dim) as u64,
        (s.num_key_value_heads * s.head_dim) as u64,
    );
    let (ff, ne, hd) = (
        s.moe_intermediate_size as u64,
        s.num_experts as u64,
        s.head_dim as u64,
    );
    let mat = |name: String, ty: GgmlType, shape: Vec<u64>, scale: f32| Spec {
        experts: if name.contains("_exps") {
            ne as usize
        } else {
            0
        },
        t: StreamTensor { name, ty, shape },
        scale: Some(scale),
    };
    let w = |name: String, shape: Vec<u64>| {
        let sc = 1.0 / (shape[0] as f32).sqrt();
        mat(name, matrix_type(q, shape[0] as usize), shape, sc)
    };
    let ones = |name: String, n: u64| Spec {
        t: StreamTensor {
            name,
            ty: GgmlType::F32,
            shape: vec![n],
        },
        scale: None,
        experts: 0,
    };
    let v = s.vocab_size as u64;
    let mut out = vec![mat(
        "token_embd.weight".into(),
        matrix_type(q, d as usize),
        vec![d, v],
        1.0,
    )];
    for l in 0..s.num_hidden_layers {
        let n = |x: &str| format!("blk.{l}.{x}.weight");
        out.extend([
            ones(n("attn_norm"), d),
            w(n("attn_q"), vec![d, qd]),
            w(n("attn_k"), vec![d, kvd]),
            w(n("attn_v"), vec![d, kvd]),
            w(n("attn_output"), vec![qd, d]),
            ones(n("attn_q_norm"), hd),
            ones(n("attn_k_norm"), hd),
            ones(n("ffn_norm"), d),
            mat(
                n("ffn_gate_inp"),
                GgmlType::F32,
                vec![d, ne],
                1.0 / (d as f32).sqrt(),
            ),
            w(n("ffn_gate_exps"), vec![d, ff, ne]),
            w(n("ffn_up_exps"), vec![d, ff, ne]),
            w(n("ffn_down_exps"), vec![ff, d, ne]),
        ]);
    }
    out.push(ones("output_norm.weight".into(), d));
    out.push(w("output.weight".into(), vec![d, v]));
    out
}

/// Fills `out` with random `ty` data whose values span about `±scale`.
fn fill(rng: &mut Rng, ty: GgmlType, scale: f32, out: &mut [u8]) {
    match ty {
        GgmlType::F32 => fill::f32_uniform(rng, scale, out),
        _ if crate::quant::EXT_TYPES.contains(&ty) => {
            super::fill_lowbit::lowbit_blocks(rng, ty, scale, out)
        }
        _ => fill::ggml_blocks(rng, ty, scale, out),
    }
}

/// Total bytes of a synthetic file of shape `s` with matrices in `q` (tensor data, without
/// header and padding).
pub fn data_bytes(s: &Qwen3MoeShape, q: GgmlType) -> u64 {
    specs(s, q).iter().map(|x| x.t.n_bytes()).sum()
}

/// The file [`write_qwen3moe_gguf`] writes, without writing it: its exact size, tensor bytes
/// and the bytes of one expert (its slices of `ffn_{gate,up,down}_exps`).
///
/// Errors: as [`write_qwen3moe_gguf`] before it writes.
pub fn plan(s: &Qwen3MoeShape, q: GgmlType) -> Result<Planned> {
    check(s, q)?;
    let specs = specs(s, q);
    let tensors: Vec<StreamTensor> = specs.iter().map(|x| x.t.clone()).collect();
    let routed: u64 = specs
        .iter()
        .filter(|x| x.experts > 0)
        .map(|x| x.t.n_bytes())
        .sum();
    Ok(Planned {
        files: vec![(String::new(), streamed_len(&metadata(s, q)?, &tensors))],
        tensor_bytes: tensors.iter().map(|t| t.n_bytes()).sum(),
        expert_bytes: routed / (s.num_hidden_layers * s.num_experts) as u64,
        layers: s.num_hidden_layers,
        moe_layers: s.num_hidden_layers,
        experts: s.num_experts,
    })
}

/// Errors unless `q` is one of [`QUANTS`] and every row length a multiple of 32.
fn check(s: &Qwen3MoeShape, q: GgmlType) -> Result<()> {
    if !QUANTS.contains(&q) {
        bail!("--quant {q}: not an encoding of synthetic GGUF matrices");
    }
    if [
        s.hidden_size,
        s.moe_intermediate_size,
        s.num_attention_heads * s.head_dim,
    ]
    .iter()
    .any(|n| n % 32 != 0)
    {
        bail!("hidden size, expert FFN width and q width must be multiples of 32 for {q}");
    }
    Ok(())
}

/// Writes a random-weight `qwen3moe` GGUF of shape `s`, matrices in `q` (one of [`QUANTS`]),
/// to `path` (must not exist), seeded by `seed`. `progress(bytes written, total)` runs after
/// each tensor.
///
/// Errors: `path` exists, `q` is not in [`QUANTS`], a row length is not a multiple of 32, or a
/// write fails (the message names the file). Q4_K rows that are not multiples of 256 are
/// written as Q5_0 ([`matrix_type`]).
pub fn write_qwen3moe_gguf(
    s: &Qwen3MoeShape,
    q: GgmlType,
    path: &Path,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    check(s, q)?;
    if path.exists() {
        bail!("{}: already exists", path.display());
    }
    let meta = metadata(s, q)?;
    let specs = specs(s, q);
    let tensors: Vec<StreamTensor> = specs.iter().map(|x| x.t.clone()).collect();
    let total: u64 = tensors.iter().map(|t| t.n_bytes()).sum();
    let f = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut w = std::io::BufWriter::with_capacity(8 << 20, f);
    let mut rng = Rng::seeded(seed);
    let mut done = 0u64;
    write_streamed(&mut w, &meta, &tensors, &mut |i, buf| {
        match specs[i].scale {
            Some(sc) => fill(&mut rng, specs[i].t.ty, sc, buf),
            None => buf
                .chunks_mut(4)
                .for_each(|c| c.copy_from_slice(&1f32.to_le_bytes())),
        }
        done += buf.len() as u64;
        progress(done, total);
    })
    .and_then(|_| w.flush())
    .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::gguf::GgufModel;

    #[test]
    fn tiny_synthetic_gguf_reads_back_with_llama_cpp_names_and_tokenizer() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.gguf");
        let shape = crate::write::synth::qwen3_moe::presets()[0].2.clone();
        write_qwen3moe_gguf(&shape, GgmlType::Q4_0, &p, 3, &mut |_, _| {}).unwrap();
        let g = GgufModel::open(&p).unwrap();
        assert_eq!(g.architecture().unwrap(), "qwen3moe");
        assert_eq!(g.get_u64("qwen3moe.expert_count").unwrap(), 16);
        assert_eq!(g.opt_str("tokenizer.ggml.pre").unwrap(), Some("qwen2"));
        let t = g.tensor("blk.2.ffn_down_exps.weight").unwrap();
        assert_eq!(t.shape, vec![32, 64, 16]);
        assert_eq!(t.ty, GgmlType::Q4_0);
        // 64 rows of one 18-byte block per expert
        assert_eq!(t.n_bytes, 16 * 64 * 18);
        assert_eq!(g.total_tensor_bytes(), data_bytes(&shape, GgmlType::Q4_0));
        let e = write_qwen3moe_gguf(&shape, GgmlType::Q4_0, &p, 3, &mut |_, _| {}).unwrap_err();
        assert!(e.to_string().contains("already exists"), "{e}");
    }
}
