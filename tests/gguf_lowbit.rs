//! A `qwen3moe` GGUF with 256-element rows quantized by llama.cpp itself (llama-cpp-python
//! 0.3.36's `llama_model_quantize`) to the Q2_K and Q3_K_M mixes, which use the Q2_K, Q3_K,
//! Q4_K, Q5_K and Q6_K blocks, and the same model with every matrix quantized by ggml's own
//! quantizer (`ggml_quantize_chunk`, an all-ones importance matrix) to IQ1_S, IQ2_XXS, IQ3_S
//! and IQ4_XS (`tests/fixtures/gguf/qwen3_moe_lowbit/`, written by
//! tools/reference/lowbit_gguf_fixtures.py and tools/reference/iq_gguf_fixtures.py).
//!
//! Tolerances are those of tests/gguf_moe.rs: against llama.cpp's pass over a copy of the file
//! dequantized to F32 by llama.cpp (same weight values, f32 arithmetic) [`F32_TOL`]; against its
//! pass over the quantized file (which rounds activations to 8 bits before integer dots) our
//! measured worst per-position distance rounded up by ~25% (measured: q2_k 1.78e-2, q3_k_m
//! 1.57e-2, iq1_s 1.48e-2, iq2_xxs 1.63e-2, iq3_s 1.59e-2, iq4_xs 1.92e-2; llama.cpp's own
//! quantized-vs-dequantized distance, `quantized_vs_dequant_rel` in reference.json, is
//! 1.07e-2 ... 1.29e-2). Greedy continuations
//! (8 tokens) must equal llama.cpp's over the dequantized copy, and its pass over the quantized
//! file must agree with that up to a recorded near tie.

mod common;

use common::gguf::{dir, prompt_logits, reference, session_at, worst_rel};
use common::hf::u32s;
use deltafin::quant::GgmlType;
use deltafin::source::gguf::GgufModel;

/// Relative tolerance where both sides compute in f32 over the same weight values.
const F32_TOL: f32 = 5e-6;

/// One file: the variant, the tolerance against llama.cpp's pass over the quantized file,
/// the tensor types used, and how many continuation tokens llama.cpp's two passes share (fewer
/// than 8 where its quantized pass meets a near tie: a top-2 gap under 0.01).
struct Case {
    v: &'static str,
    q_tol: f32,
    types: &'static [GgmlType],
    agree: usize,
}

const K_CASES: &[Case] = &[
    Case {
        v: "q2_k",
        q_tol: 0.0225,
        types: &[GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q6_K],
        agree: 8,
    },
    Case {
        v: "q3_k_m",
        q_tol: 0.02,
        types: &[
            GgmlType::Q3_K,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
        ],
        agree: 8,
    },
];

const IQ_CASES: &[Case] = &[
    Case {
        v: "iq1_s",
        q_tol: 0.0185,
        types: &[GgmlType::IQ1_S],
        agree: 6,
    },
    Case {
        v: "iq2_xxs",
        q_tol: 0.0205,
        types: &[GgmlType::IQ2_XXS],
        agree: 8,
    },
    Case {
        v: "iq3_s",
        q_tol: 0.02,
        types: &[GgmlType::IQ3_S],
        agree: 8,
    },
    Case {
        v: "iq4_xs",
        q_tol: 0.024,
        types: &[GgmlType::IQ4_XS],
        agree: 1,
    },
];

/// Checks one file against llama.cpp (see the module comment).
fn check(c: &Case) {
    let r = reference("qwen3_moe_lowbit");
    let ids = u32s(&r["prompt_ids"]);
    let v = c.v;
    let rv = &r["variants"][v];
    let path = dir("qwen3_moe_lowbit").join(format!("{v}.gguf"));
    let g = GgufModel::open(&path).unwrap();
    let mut used: Vec<GgmlType> = g
        .tensors
        .iter()
        .map(|t| t.ty)
        .filter(|&t| t != GgmlType::F32)
        .collect();
    used.sort_by_key(|t| t.id());
    used.dedup();
    assert_eq!(used, c.types, "{v}");
    let mut s = session_at(&path, None);
    let (ours, vocab) = prompt_logits(&mut s, &ids);
    let d = dir("qwen3_moe_lowbit");
    let exact = worst_rel(
        &ours,
        vocab,
        &d.join(rv["dequant_logits_file"].as_str().unwrap()),
    );
    let q = worst_rel(&ours, vocab, &d.join(rv["logits_file"].as_str().unwrap()));
    eprintln!("{v}: vs llama.cpp dequantized {exact:e}, vs quantized {q:e}");
    assert!(exact <= F32_TOL, "{v}: dequantized rel {exact:e}");
    assert!(q <= c.q_tol, "{v}: quantized rel {q:e}");
    let want = u32s(&rv["dequant_continuation_ids"]);
    let quant = u32s(&rv["continuation_ids"]);
    assert_eq!(want.len(), 8, "{v}");
    assert_eq!(
        want[..c.agree],
        quant[..c.agree],
        "{v}: llama.cpp's two passes agree"
    );
    if c.agree < want.len() {
        assert_ne!(want[c.agree], quant[c.agree], "{v}");
        let gap = rv["continuation_gaps"][c.agree].as_f64().unwrap();
        assert!(
            gap < 0.01,
            "{v}: llama.cpp's quantized pass diverges at a gap of {gap}"
        );
    }
    let mut s = session_at(&path, None);
    assert_eq!(common::greedy_ids(&mut s, &ids, want.len()), want, "{v}");
}

#[test]
fn llama_cpp_quantized_k_mixes_match_llama_cpp() {
    K_CASES.iter().for_each(check);
}

#[test]
fn ggml_quantized_iq_files_match_llama_cpp() {
    IQ_CASES.iter().for_each(check);
}
