//! Synthetic Kimi K3 GGUF files in llama.cpp's `kimi-k3` layout (the tensors and metadata keys
//! `vendor/llama.cpp/src/models/kimi-k3.cpp` loads and `conversion/kimi_k3.py` writes, read by
//! [`crate::models::kimi_k3`]): a hybrid of KDA and gated no-RoPE MLA layers, cross-layer
//! attention residuals, a latent MoE with MXFP4 routed experts (stacked `ffn_*_exps`, as the
//! converter repacks K3's compressed-tensors `mxfp4-pack-quantized` experts), SiTU.
//!
//! Encodings: MXFP4 routed experts (one E8M0 exponent byte and 16 bytes of E2M1 nibbles per
//! 32 values; exponents from `fill::e8m0_low` of the fan-in), BF16 matrices elsewhere
//! (uniform in `±1/√fan_in`, the embeddings `±1`), F32 vectors and router (norms 1, residual
//! scores and biases uniform, `ssm_a` = −1, i.e. `A_log` 0). The tokenizer metadata (byte-level
//! BPE of 512 tokens) is copied from the committed `tests/fixtures/gguf/kimi_k3` fixture.

use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context, Result};

use super::fill::{self, Bf16Uniform, Rng};
use super::planned::Planned;
use crate::quant::GgmlType;
use crate::source::gguf::Value;
use crate::write::gguf_writer::{streamed_len, write_streamed, StreamTensor};

/// The fixture whose tokenizer metadata synthetic K3 files reuse.
const TOKENIZER_SOURCE: &[u8] =
    include_bytes!("../../../tests/fixtures/gguf/kimi_k3/kimi_k3-f32.gguf");

/// llama.cpp's `LLAMA_FTYPE_MOSTLY_MXFP4_MOE` (`include/llama.h`), the file type the converter
/// gives a K3 with MXFP4 experts.
const FTYPE_MXFP4_MOE: u32 = 38;

/// The shape of a synthetic Kimi K3.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KimiK3Shape {
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    /// Leading dense SiTU MLP layers (`leading_dense_block_count`).
    pub first_k_dense_replace: usize,
    /// Width of the dense MLP.
    pub intermediate_size: usize,
    /// Heads of both mixers (llama.cpp's one `attention.head_count`).
    pub num_heads: usize,
    pub kda_head_dim: usize,
    pub conv_kernel: usize,
    pub q_lora_rank: usize,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    pub n_routed_experts: usize,
    pub num_experts_per_tok: usize,
    pub n_shared_experts: usize,
    /// Width of one routed expert (`moe_intermediate_size`).
    pub moe_intermediate_size: usize,
    /// The routed experts' row width (`routed_expert_hidden_size`).
    pub latent: usize,
    /// Every `mla_every`-th layer (1-based) and the last are MLA, the others KDA.
    pub mla_every: usize,
    /// Layers per attention-residual block (`attn_res_block_size`).
    pub attn_res_block_size: usize,
    pub vocab_size: usize,
}

impl KimiK3Shape {
    /// Whether layer `l` (0-based) is MLA: `(l + 1) % mla_every == 0` or the last layer.
    pub fn is_mla(&self, l: usize) -> bool {
        (l + 1).is_multiple_of(self.mla_every) || l + 1 == self.num_hidden_layers
    }
}

/// The presets: `tiny` (the `kimi_k3` test fixture's shape) and `kimi-k3`.
///
/// `kimi-k3` has the published shape of the checkpoint: hidden 7168, 93 layers, 69 KDA and
/// 24 gated MLA (every 4th layer and the last), MLA q_lora 1536 and kv_lora 512 with 96 heads,
/// KDA 96 heads of 128 with a short convolution of 4, attention-residual blocks of 12 layers,
/// 896 routed experts of width 3072 in a latent space of 3584 (`routed_expert_hidden_size`),
/// top-16, 2 shared experts, a vocabulary of 163,840, MXFP4 routed experts: 3 matrices × 3584
/// × 3072 values × 17/32 bytes = 17,547,264 bytes (17.55 MB) per expert, 82,432 of them
/// (1.45 TB), BF16 elsewhere (1.56 TB in all). Still assumed, where the published description
/// is silent: the MLA head widths of Kimi K2 (nope 128, rope 64, v 128: a no-RoPE MLA keeps
/// the rope slice of the latent row), one dense leading layer of width 18432 (K2; 93 layers
/// less the 92 that hold the 82,432 experts), untied embeddings, and the tokenizer: the
/// written GGUF carries the test tokenizer's 512 tokens padded with reserved control tokens
/// up to the vocabulary.
pub fn presets() -> Vec<(&'static str, &'static str, KimiK3Shape)> {
    let tiny = KimiK3Shape {
        hidden_size: 64,
        num_hidden_layers: 4,
        first_k_dense_replace: 1,
        intermediate_size: 64,
        num_heads: 4,
        kda_head_dim: 16,
        conv_kernel: 4,
        q_lora_rank: 32,
        kv_lora_rank: 32,
        qk_nope_head_dim: 16,
        qk_rope_head_dim: 8,
        v_head_dim: 16,
        n_routed_experts: 8,
        num_experts_per_tok: 2,
        n_shared_experts: 2,
        moe_intermediate_size: 32,
        latent: 32,
        mla_every: 2,
        attn_res_block_size: 2,
        vocab_size: 512,
    };
    let k3 = KimiK3Shape {
        hidden_size: 7168,
        num_hidden_layers: 93,
        first_k_dense_replace: 1,
        intermediate_size: 18432,
        num_heads: 96,
        kda_head_dim: 128,
        conv_kernel: 4,
        q_lora_rank: 1536,
        kv_lora_rank: 512,
        qk_nope_head_dim: 128,
        qk_rope_head_dim: 64,
        v_head_dim: 128,
        n_routed_experts: 896,
        num_experts_per_tok: 16,
        n_shared_experts: 2,
        moe_intermediate_size: 3072,
        latent: 3584,
        mla_every: 4,
        attn_res_block_size: 12,
        vocab_size: 163_840,
    };
    vec![
        (
            "tiny",
            "CI: hidden 64, KDA (4 heads of 16) and MLA alternating, 1 dense + 3 MoE layers of 8 MXFP4 experts (latent 32, FFN 32), top-2, 2 shared",
            tiny,
        ),
        (
            "kimi-k3",
            "Kimi K3 shape (hidden 7168, 93 layers KDA with MLA every 4th and the last, 96 heads, 896 MXFP4 experts of 17.5 MB: latent 3584, FFN 3072, top-16, 2 shared, vocabulary 163,840), 1 dense + 92 MoE layers (~1.56 TB); use --layers and --experts for less",
            k3,
        ),
    ]
}

/// How a tensor's values are drawn.
#[derive(Clone, Copy, Debug)]
enum Fill {
    /// Uniform in `±scale` (F32 or BF16).
    Uniform(f32),
    /// Every value `v` (F32).
    Const(f32),
    /// MXFP4 blocks for fan-in `n` ([`fill::e8m0_low`]).
    Mxfp4(usize),
}

struct Spec {
    t: StreamTensor,
    fill: Fill,
    /// Routed experts the tensor holds (the stacked `ffn_*_exps`), else 0.
    experts: usize,
}

fn specs(s: &KimiK3Shape) -> Vec<Spec> {
    let d = s.hidden_size as u64;
    let spec = |name: String, ty, shape: Vec<u64>, fill| Spec {
        t: StreamTensor { name, ty, shape },
        fill,
        experts: 0,
    };
    // a BF16 matrix `[fan_in, rows]` (GGML order), values in ±1/√fan_in
    let m = |name: String, shape: Vec<u64>| {
        let sc = 1.0 / (shape[0] as f32).sqrt();
        spec(name, GgmlType::BF16, shape, Fill::Uniform(sc))
    };
    let v = |name: String, n: u64, f| spec(name, GgmlType::F32, vec![n], f);
    let ones = |name: String, n: u64| v(name, n, Fill::Const(1.0));
    let res = s.attn_res_block_size > 0;
    let (nh, hd) = (s.num_heads as u64, s.kda_head_dim as u64);
    let dim = nh * hd;
    let (qr, rank, nope, rope, vd) = (
        s.q_lora_rank as u64,
        s.kv_lora_rank as u64,
        s.qk_nope_head_dim as u64,
        s.qk_rope_head_dim as u64,
        s.v_head_dim as u64,
    );
    let (ne, eff, lat) = (
        s.n_routed_experts as u64,
        s.moe_intermediate_size as u64,
        s.latent as u64,
    );
    let sff = eff * s.n_shared_experts.max(1) as u64;
    let vocab = s.vocab_size as u64;
    let mut out = vec![
        spec(
            "token_embd.weight".into(),
            GgmlType::BF16,
            vec![d, vocab],
            Fill::Uniform(1.0),
        ),
        ones("output_norm.weight".into(), d),
        m("output.weight".into(), vec![d, vocab]),
    ];
    if res {
        out.push(v("output_res_score.weight".into(), d, Fill::Uniform(0.5)));
    }
    for l in 0..s.num_hidden_layers {
        let n = |x: &str| format!("blk.{l}.{x}.weight");
        out.push(ones(n("attn_norm"), d));
        out.push(ones(n("ffn_norm"), d));
        if res {
            out.push(v(n("attn_res_score"), d, Fill::Uniform(0.5)));
            out.push(v(n("ffn_res_score"), d, Fill::Uniform(0.5)));
        }
        if s.is_mla(l) {
            out.extend([
                m(n("attn_q_a"), vec![d, qr]),
                ones(n("attn_q_a_norm"), qr),
                m(n("attn_q_b"), vec![qr, nh * (nope + rope)]),
                m(n("attn_kv_a_mqa"), vec![d, rank + rope]),
                ones(n("attn_kv_a_norm"), rank),
                m(n("attn_k_b"), vec![nope, rank, nh]),
                m(n("attn_v_b"), vec![rank, vd, nh]),
                m(n("attn_gate"), vec![d, nh * vd]),
                m(n("attn_output"), vec![nh * vd, d]),
            ]);
        } else {
            for x in ["q", "k", "v"] {
                let conv = vec![s.conv_kernel as u64, 1, dim];
                out.push(spec(
                    n(&format!("ssm_conv1d_{x}")),
                    GgmlType::F32,
                    conv,
                    Fill::Uniform(0.5),
                ));
                out.push(m(n(&format!("attn_{x}")), vec![d, dim]));
            }
            out.extend([
                m(n("ssm_f_a"), vec![d, hd]),
                m(n("ssm_f_b"), vec![hd, dim]),
                m(n("ssm_beta"), vec![d, nh]),
                v(format!("blk.{l}.ssm_a"), nh, Fill::Const(-1.0)),
                v(format!("blk.{l}.ssm_dt.bias"), dim, Fill::Uniform(0.1)),
                m(n("ssm_g"), vec![d, dim]),
                ones(n("ssm_norm"), hd),
                m(n("attn_output"), vec![dim, d]),
            ]);
        }
        if l < s.first_k_dense_replace {
            let ff = s.intermediate_size as u64;
            out.extend([
                m(n("ffn_gate"), vec![d, ff]),
                m(n("ffn_up"), vec![d, ff]),
                m(n("ffn_down"), vec![ff, d]),
            ]);
            continue;
        }
        let exps = |name: String, fan_in: u64, rows: u64| Spec {
            t: StreamTensor {
                name,
                ty: GgmlType::MXFP4,
                shape: vec![fan_in, rows, ne],
            },
            fill: Fill::Mxfp4(fan_in as usize),
            experts: ne as usize,
        };
        out.extend([
            spec(
                n("ffn_gate_inp"),
                GgmlType::F32,
                vec![d, ne],
                Fill::Uniform(1.0 / (d as f32).sqrt()),
            ),
            v(format!("blk.{l}.exp_probs_b.bias"), ne, Fill::Uniform(0.1)),
            exps(n("ffn_gate_exps"), lat, eff),
            exps(n("ffn_up_exps"), lat, eff),
            exps(n("ffn_down_exps"), eff, lat),
            m(n("ffn_routed_down"), vec![d, lat]),
            m(n("ffn_routed_up"), vec![lat, d]),
            ones(n("ffn_routed_norm"), lat),
            m(n("ffn_gate_shexp"), vec![d, sff]),
            m(n("ffn_up_shexp"), vec![d, sff]),
            m(n("ffn_down_shexp"), vec![sff, d]),
        ]);
    }
    out
}

/// The metadata of a `kimi-k3` file of shape `s` (keys as `conversion/kimi_k3.py` writes them).
fn metadata(s: &KimiK3Shape) -> Result<Vec<(String, Value)>> {
    let src = crate::source::gguf_parse::parse(
        std::io::Cursor::new(TOKENIZER_SOURCE),
        TOKENIZER_SOURCE.len() as u64,
        "kimi_k3-f32.gguf",
    )
    .context("parsing the embedded tokenizer fixture")?;
    let n_tokens = src
        .metadata
        .get("tokenizer.ggml.tokens")
        .and_then(|v| v.as_array())
        .map_or(0, |a| a.len());
    if n_tokens > s.vocab_size {
        bail!("the synthetic GGUF tokenizer has {n_tokens} tokens, the shape asks for a vocabulary of {}", s.vocab_size);
    }
    let u = |v: usize| Value::U32(v as u32);
    let a = |k: &str| format!("kimi-k3.{k}");
    let kv: Vec<Value> = (0..s.num_hidden_layers)
        .map(|l| Value::I32(s.is_mla(l) as i32))
        .collect();
    let mut m: Vec<(String, Value)> = vec![
        (
            "general.architecture".into(),
            Value::String("kimi-k3".into()),
        ),
        ("general.type".into(), Value::String("model".into())),
        (
            "general.name".into(),
            Value::String("Deltafin synthetic kimi-k3".into()),
        ),
        (a("block_count"), u(s.num_hidden_layers)),
        (a("context_length"), u(1_048_576)),
        (a("embedding_length"), u(s.hidden_size)),
        (a("feed_forward_length"), u(s.intermediate_size)),
        (a("attention.head_count"), u(s.num_heads)),
        (a("attention.head_count_kv"), Value::Array(kv)),
        (a("attention.layer_norm_rms_epsilon"), Value::F32(1e-5)),
        (a("vocab_size"), u(s.vocab_size)),
        (a("ssm.conv_kernel"), u(s.conv_kernel)),
        (a("kda.head_dim"), u(s.kda_head_dim)),
        (a("kda.gate_lower_bound"), Value::F32(-5.0)),
        (a("attention.q_lora_rank"), u(s.q_lora_rank)),
        (a("attention.kv_lora_rank"), u(s.kv_lora_rank)),
        (a("rope.dimension_count"), u(s.qk_rope_head_dim)),
        (
            a("attention.key_length"),
            u(s.kv_lora_rank + s.qk_rope_head_dim),
        ),
        (a("attention.value_length"), u(s.kv_lora_rank)),
        (
            a("attention.key_length_mla"),
            u(s.qk_nope_head_dim + s.qk_rope_head_dim),
        ),
        (a("attention.value_length_mla"), u(s.v_head_dim)),
        (a("expert_count"), u(s.n_routed_experts)),
        (a("expert_used_count"), u(s.num_experts_per_tok)),
        (a("expert_feed_forward_length"), u(s.moe_intermediate_size)),
        (a("expert_shared_count"), u(s.n_shared_experts)),
        (a("leading_dense_block_count"), u(s.first_k_dense_replace)),
        (a("expert_weights_scale"), Value::F32(2.446)),
        (a("expert_weights_norm"), Value::Bool(true)),
        // LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
        (a("expert_gating_func"), u(2)),
        (a("expert_latent_length"), u(s.latent)),
        (a("activation.situ_beta"), Value::F32(1.0)),
        (a("activation.situ_linear_beta"), Value::F32(1.5)),
        (a("attn_res.block_size"), u(s.attn_res_block_size)),
    ];
    // the vocabulary beyond the test tokenizer's tokens: reserved control tokens, as Kimi's
    // own vocabulary names its unused ids
    let pad = s.vocab_size - n_tokens;
    for (k, v) in &src.metadata {
        match (k.as_str(), v) {
            ("tokenizer.ggml.tokens", Value::Array(a)) if pad > 0 => {
                let mut a = a.clone();
                a.extend(
                    (n_tokens..s.vocab_size)
                        .map(|i| Value::String(format!("<|reserved_token_{i}|>"))),
                );
                m.push((k.clone(), Value::Array(a)));
            }
            ("tokenizer.ggml.token_type", Value::Array(a)) if pad > 0 => {
                let mut a = a.clone();
                a.extend(std::iter::repeat_n(Value::I32(3), pad));
                m.push((k.clone(), Value::Array(a)));
            }
            _ if k.starts_with("tokenizer.") => m.push((k.clone(), v.clone())),
            _ => {}
        }
    }
    m.push(("general.quantization_version".into(), Value::U32(2)));
    m.push(("general.file_type".into(), Value::U32(FTYPE_MXFP4_MOE)));
    Ok(m)
}

/// Errors unless every MXFP4 and BF16 row is whole: the latent width and expert FFN width
/// multiples of 32, and the shape leaves a MoE layer.
fn check(s: &KimiK3Shape) -> Result<()> {
    if !s.latent.is_multiple_of(32) || !s.moe_intermediate_size.is_multiple_of(32) {
        bail!(
            "latent width {} and expert FFN width {} must be multiples of 32 for MXFP4",
            s.latent,
            s.moe_intermediate_size
        );
    }
    if s.num_hidden_layers <= s.first_k_dense_replace {
        bail!(
            "{} layers leave no MoE layer after {} dense ones",
            s.num_hidden_layers,
            s.first_k_dense_replace
        );
    }
    Ok(())
}

/// The file [`write_kimi_k3_gguf`] writes, without writing it: its exact size, tensor bytes
/// and the bytes of one expert (its slices of `ffn_{gate,up,down}_exps`).
///
/// Errors: as `check` (the shape checks).
pub fn plan(s: &KimiK3Shape) -> Result<Planned> {
    check(s)?;
    let specs = specs(s);
    let tensors: Vec<StreamTensor> = specs.iter().map(|x| x.t.clone()).collect();
    let moe_layers = s.num_hidden_layers - s.first_k_dense_replace;
    let routed: u64 = specs
        .iter()
        .filter(|x| x.experts > 0)
        .map(|x| x.t.n_bytes())
        .sum();
    Ok(Planned {
        files: vec![(String::new(), streamed_len(&metadata(s)?, &tensors))],
        tensor_bytes: tensors.iter().map(|t| t.n_bytes()).sum(),
        expert_bytes: routed / (moe_layers * s.n_routed_experts) as u64,
        layers: s.num_hidden_layers,
        moe_layers,
        experts: s.n_routed_experts,
    })
}

/// Fills `out` (a tensor of type `ty`) as `f` says.
fn fill_tensor(rng: &mut Rng, ty: GgmlType, f: Fill, out: &mut [u8]) {
    match (f, ty) {
        (Fill::Const(c), _) => fill::repeat(&c.to_le_bytes(), out),
        (Fill::Uniform(sc), GgmlType::BF16) => Bf16Uniform::new(sc).fill(rng, out),
        (Fill::Uniform(sc), _) => fill::f32_uniform(rng, sc, out),
        (Fill::Mxfp4(n), _) => {
            let lo = fill::e8m0_low(n);
            for blk in out.chunks_mut(17) {
                fill::e8m0(rng, lo, &mut blk[..1]);
                fill::bytes(rng, &mut blk[1..]);
            }
        }
    }
}

/// Writes a random-weight `kimi-k3` GGUF of shape `s` to `path` (must not exist), seeded by
/// `seed`. `progress(bytes written, total)` runs after each tensor.
///
/// Errors: `path` exists, the shape fails `check`, or a write fails (the message names the
/// file).
pub fn write_kimi_k3_gguf(
    s: &KimiK3Shape,
    path: &Path,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    check(s)?;
    if path.exists() {
        bail!("{}: already exists", path.display());
    }
    let meta = metadata(s)?;
    let specs = specs(s);
    let tensors: Vec<StreamTensor> = specs.iter().map(|x| x.t.clone()).collect();
    let total: u64 = tensors.iter().map(|t| t.n_bytes()).sum();
    let f = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut w = std::io::BufWriter::with_capacity(8 << 20, f);
    let mut rng = Rng::seeded(seed);
    let mut done = 0u64;
    write_streamed(&mut w, &meta, &tensors, &mut |i, buf| {
        fill_tensor(&mut rng, specs[i].t.ty, specs[i].fill, buf);
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

    #[test]
    fn the_test_tokenizer_is_padded_with_reserved_tokens_up_to_the_vocabulary() {
        let mut s = presets().remove(0).2;
        s.vocab_size = 515;
        let m = metadata(&s).unwrap();
        let get = |k: &str| m.iter().find(|(n, _)| n == k).unwrap().1.clone();
        let Value::Array(tokens) = get("tokenizer.ggml.tokens") else {
            panic!()
        };
        let Value::Array(types) = get("tokenizer.ggml.token_type") else {
            panic!()
        };
        assert_eq!((tokens.len(), types.len()), (515, 515));
        assert_eq!(tokens[514], Value::String("<|reserved_token_514|>".into()));
        assert_eq!(tokens[512], Value::String("<|reserved_token_512|>".into()));
        assert_eq!(types[512..], [Value::I32(3), Value::I32(3), Value::I32(3)]);
        s.vocab_size = 100;
        assert_eq!(
            metadata(&s).unwrap_err().to_string(),
            "the synthetic GGUF tokenizer has 512 tokens, the shape asks for a vocabulary of 100"
        );
    }
}
