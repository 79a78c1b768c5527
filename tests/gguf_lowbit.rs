//! A `qwen3moe` GGUF with 256-element rows quantized by llama.cpp itself (llama-cpp-python
//! 0.3.36's `llama_model_quantize`) to the Q2_K and Q3_K_M mixes, which use the Q2_K, Q3_K,
//! Q4_K, Q5_K and Q6_K blocks (`tests/fixtures/gguf/qwen3_moe_lowbit/`, written by
//! tools/reference/lowbit_gguf_fixtures.py).
//!
//! Tolerances are those of tests/gguf_moe.rs: against llama.cpp's pass over a copy of the file
//! dequantized to F32 by llama.cpp (same weight values, f32 arithmetic) [`F32_TOL`]; against its
//! pass over the quantized file (which rounds activations to 8 bits before integer dots) the
//! measured distance (`quantized_vs_dequant_rel` in reference.json: 1.07e-2, 1.17e-2) rounded
//! up by ~25%. Greedy continuations (8 tokens) must equal llama.cpp's.

mod common;

use common::gguf::{dir, prompt_logits, reference, session_at, worst_rel};
use common::hf::u32s;
use deltafin::quant::GgmlType;
use deltafin::source::gguf::GgufModel;

/// Relative tolerance where both sides compute in f32 over the same weight values.
const F32_TOL: f32 = 5e-6;

/// (variant, tolerance against llama.cpp's pass over the quantized file, tensor types used).
const CASES: &[(&str, f32, &[GgmlType])] = &[
    (
        "q2_k",
        0.0225,
        &[GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q6_K],
    ),
    (
        "q3_k_m",
        0.02,
        &[
            GgmlType::Q3_K,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
        ],
    ),
];

#[test]
fn llama_cpp_quantized_k_mixes_match_llama_cpp() {
    let r = reference("qwen3_moe_lowbit");
    let ids = u32s(&r["prompt_ids"]);
    for &(v, q_tol, types) in CASES {
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
        assert_eq!(used, types, "{v}");
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
        assert!(q <= q_tol, "{v}: quantized rel {q:e}");
        let want = u32s(&rv["dequant_continuation_ids"]);
        assert_eq!(
            want,
            u32s(&rv["continuation_ids"]),
            "{v}: llama.cpp's two passes agree"
        );
        let mut s = session_at(&path, None);
        assert_eq!(common::greedy_ids(&mut s, &ids, want.len()), want, "{v}");
    }
}
