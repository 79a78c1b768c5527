//! The demo model (Gemma 3 270M Q4_K_M) against two references, with teacher forcing on
//! llama.cpp's own greedy continuations of 18 prompts (889 positions):
//!
//! - `exact_gemma3_reference.json`: a float64 forward pass over the dequantized weights
//!   (tools/reference/exact_reference.py). Deltafin computes with the stored weights and f32
//!   activations, so it must agree to f32 rounding.
//! - `llama_gemma3_reference.json`: llama.cpp (llama-cpp-python 0.3.36,
//!   tools/reference/llama_reference.py). llama.cpp quantizes activations to 8 bits and keeps
//!   the KV cache in f16; its own single-token and batched passes over the same text agree on
//!   the argmax at only 547 of 576 positions (95.0%), flip at top-2 gaps up to 1.02, and differ
//!   by up to 5.9% on the top-1 logit. The float64 reference itself agrees with llama.cpp's
//!   argmax at 850 of 889 positions. The bounds below are llama.cpp's own spread.

mod common;

use deltafin::engine::sampler::argmax;
use deltafin::models::Logits;
use serde_json::Value;

const VOCAB: usize = 262144;

type CaseLogits = Vec<(String, Vec<u32>, Vec<f32>)>;

/// Our logits for every position of every llama.cpp fixture sequence (prompt + continuation),
/// one batch per case, computed once for both tests (both fixtures hold the same sequences).
fn our_logits() -> &'static CaseLogits {
    static LOGITS: std::sync::OnceLock<CaseLogits> = std::sync::OnceLock::new();
    LOGITS.get_or_init(|| {
        let fx: Value =
            serde_json::from_str(include_str!("fixtures/llama_gemma3_reference.json")).unwrap();
        let g = common::demo_model();
        fx["cases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                let mut ids = u32s(&c["prompt_ids"]);
                ids.extend(u32s(&c["continuation_ids"]));
                let mut s = common::demo_session(&g, None, ids.len(), ids.len());
                let l = s.prefill(&ids, Logits::All).unwrap();
                assert_eq!(l.len(), ids.len() * VOCAB);
                (c["name"].as_str().unwrap().to_string(), ids, l)
            })
            .collect()
    })
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn logits_match_the_float64_reference() {
    let fx: Value =
        serde_json::from_str(include_str!("fixtures/exact_gemma3_reference.json")).unwrap();
    let cases = fx["cases"].as_array().unwrap();
    let ours = our_logits();
    assert_eq!(cases.len(), ours.len());
    let (mut worst, mut positions) = (0f64, 0);
    for (c, (name, ids, l)) in cases.iter().zip(ours) {
        assert_eq!(
            &u32s(&c["ids"]),
            ids,
            "{name}: the fixtures' sequences differ"
        );
        for i in 0..ids.len() {
            let row = &l[i * VOCAB..(i + 1) * VOCAB];
            let max_abs = c["max_abs"][i].as_f64().unwrap();
            let top = u32s(&c["top_ids"][i]);
            for (k, &id) in top.iter().enumerate() {
                let want = c["top_logits"][i][k].as_f64().unwrap();
                let rel = (row[id as usize] as f64 - want).abs() / max_abs;
                worst = worst.max(rel);
                assert!(
                    rel < 2e-5,
                    "{name} position {i} token {id}: {} vs {want} (max |logit| {max_abs})",
                    row[id as usize]
                );
            }
            let gap =
                c["top_logits"][i][0].as_f64().unwrap() - c["top_logits"][i][1].as_f64().unwrap();
            if gap > 1e-3 {
                assert_eq!(argmax(row), top[0] as usize, "{name} position {i}");
            }
            positions += 1;
        }
    }
    eprintln!("{positions} positions, worst |ours - f64| / max|logit| = {worst:.2e}");
    assert_eq!(positions, 889);
}

#[test]
fn teacher_forced_argmax_stays_within_llama_cpp_own_spread() {
    let fx: Value =
        serde_json::from_str(include_str!("fixtures/llama_gemma3_reference.json")).unwrap();
    let cases = fx["cases"].as_array().unwrap();
    let ours = our_logits();
    let (mut positions, mut agree) = (0usize, 0usize);
    let mut rels = Vec::new();
    for (c, (name, ids, l)) in cases.iter().zip(ours) {
        let pos = &c["positions"];
        for i in 0..ids.len() {
            let row = &l[i * VOCAB..(i + 1) * VOCAB];
            let ref_top = pos["top_ids"][i][0].as_u64().unwrap() as usize;
            let ref_logit = pos["top_logits"][i][0].as_f64().unwrap();
            let gap = pos["gap"][i].as_f64().unwrap();
            positions += 1;
            if argmax(row) == ref_top {
                agree += 1;
            } else {
                assert!(
                    gap < 1.1,
                    "{name} position {i}: argmax {} vs llama.cpp {ref_top}, top-2 gap {gap}",
                    argmax(row)
                );
            }
            rels.push((row[ref_top] as f64 - ref_logit).abs() / ref_logit.abs());
        }
    }
    rels.sort_by(f64::total_cmp);
    let median = rels[rels.len() / 2];
    let p95 = rels[rels.len() * 95 / 100];
    eprintln!("argmax agreement {agree}/{positions}; top-1 logit relative difference: median {median:.4}, p95 {p95:.4}, max {:.4}", rels[rels.len() - 1]);
    assert_eq!(positions, 889);
    assert!(agree >= 845, "argmax agreement {agree}/{positions}");
    assert!(median < 0.01, "median relative difference {median}");
    assert!(p95 < 0.05, "95th percentile relative difference {p95}");
}

/// `--numerics q8` (lossy) against the float64 reference, beside llama.cpp's own distance
/// from it, which it should resemble since it computes as llama.cpp does (8-bit activations
/// per block, integer dots). The metric, per position: the float64 top-1 token's logit,
/// `|ours − f64| / max|f64 logit|`, and whether the argmax is the float64 one.
///
/// Measured (889 positions): llama.cpp (from the two fixtures; it also keeps its KV cache in
/// f16) median 0.0064, p95 0.0235, max 0.068, argmax agreement 850/889. Deltafin q8 at the
/// AVX-512 VNNI level: median 0.0066, p95 0.0217, max 0.0612, agreement 847/889. The exact
/// mode is at 2e-5 (`logits_match_the_float64_reference`). The bounds below sit about 20%
/// past llama.cpp's distance. q8 decode (the same prompt as single-token passes) gives the
/// batch's logits bit for bit, so its distance is the same.
#[test]
fn q8_numerics_stay_near_the_float64_reference_as_llama_cpp_does() {
    let fx: Value =
        serde_json::from_str(include_str!("fixtures/exact_gemma3_reference.json")).unwrap();
    let g = common::demo_model();
    let (mut rels, mut agree, mut positions) = (Vec::new(), 0usize, 0usize);
    for c in fx["cases"].as_array().unwrap() {
        let ids = u32s(&c["ids"]);
        // the prompt in one q8 batch, and again as single-token q8 passes (decode steps):
        // a row's q8 values do not depend on the batch, so the two agree bit for bit
        let run = |n_batch: usize| {
            let opts = deltafin::models::LoadOptions {
                n_ctx: ids.len(),
                n_batch,
                numerics: deltafin::models::Numerics::Q8,
                ..Default::default()
            };
            let (model, store) = deltafin::models::load_gguf(&g, &opts).unwrap();
            assert_eq!(model.numerics(), deltafin::models::Numerics::Q8);
            let mut s = deltafin::engine::Session::new(model, store, ids.len(), n_batch);
            s.prefill(&ids, Logits::All).unwrap()
        };
        let l = run(ids.len());
        let steps = run(1);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert!(
            bits(&l) == bits(&steps),
            "q8 decode steps differ from the q8 batch"
        );
        for i in 0..ids.len() {
            let row = &l[i * VOCAB..(i + 1) * VOCAB];
            let top = c["top_ids"][i][0].as_u64().unwrap() as usize;
            let want = c["top_logits"][i][0].as_f64().unwrap();
            let max_abs = c["max_abs"][i].as_f64().unwrap();
            rels.push((row[top] as f64 - want).abs() / max_abs);
            agree += usize::from(argmax(row) == top);
            positions += 1;
        }
    }
    rels.sort_by(f64::total_cmp);
    let (median, p95, max) = (
        rels[rels.len() / 2],
        rels[rels.len() * 95 / 100],
        rels[rels.len() - 1],
    );
    eprintln!("q8: argmax agreement with f64 {agree}/{positions}; |q8 - f64| / max|logit| of the f64 top-1: median {median:.4}, p95 {p95:.4}, max {max:.4}");
    assert_eq!(positions, 889);
    // lossy, so never as close as exact (2e-5)...
    assert!(median > 1e-4, "q8 is suspiciously exact: median {median}");
    // ...but near llama.cpp's own distance (median 0.0064, p95 0.0235, max 0.068, 850/889)
    assert!(median < 0.008, "median {median}");
    assert!(p95 < 0.03, "p95 {p95}");
    assert!(max < 0.08, "max {max}");
    assert!(agree >= 835, "argmax agreement {agree}/{positions}");
}
