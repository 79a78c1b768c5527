//! The demo model (Gemma 3 270M Q4_K_M) against llama.cpp: teacher forcing on llama.cpp's own
//! greedy continuations (tests/fixtures/llama_gemma3_reference.json, written by
//! tools/reference/llama_reference.py with llama-cpp-python 0.3.36).

mod common;

use deltafin::engine::sampler::argmax;
use deltafin::models::Logits;
use serde_json::Value;

#[test]
fn teacher_forced_argmax_and_top1_logit_match_llama_cpp() {
    let fixture: Value =
        serde_json::from_str(include_str!("fixtures/llama_gemma3_reference.json")).unwrap();
    let g = common::demo_model();
    let vocab = 262144;
    let (mut positions, mut agree, mut worst_rel) = (0usize, 0usize, 0f64);
    let mut report = Vec::new();
    for case in fixture["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let ids: Vec<u32> = case["prompt_ids"]
            .as_array()
            .unwrap()
            .iter()
            .chain(case["continuation_ids"].as_array().unwrap())
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let mut s = common::demo_session(&g, None, ids.len(), ids.len());
        let logits = s.prefill(&ids, Logits::All).unwrap();
        assert_eq!(logits.len(), ids.len() * vocab);
        let pos = &case["positions"];
        for i in 0..ids.len() {
            let row = &logits[i * vocab..(i + 1) * vocab];
            let ref_top = pos["top_ids"][i][0].as_u64().unwrap() as usize;
            let ref_logit = pos["top_logits"][i][0].as_f64().unwrap();
            let gap = pos["gap"][i].as_f64().unwrap();
            let ours = argmax(row);
            positions += 1;
            if ours == ref_top {
                agree += 1;
            } else {
                if gap >= 0.1 {
                    report.push(format!(
                        "BIGGAP {name}@{i} {gap:.3} ours {ours} ref {ref_top}"
                    ));
                }
                report.push(format!("{name}@{i} gap {gap:.3}"));
            }
            let rel = (row[ref_top] as f64 - ref_logit).abs() / ref_logit.abs();
            worst_rel = worst_rel.max(rel);
            if rel >= 0.02 {
                report.push(format!("REL {name}@{i} {rel:.4}"));
            }
        }
    }
    let rate = agree as f64 / positions as f64;
    eprintln!("argmax agreement {agree}/{positions} ({:.2}%), worst top-1 relative difference {worst_rel:.4}, near ties: {report:?}", 100.0 * rate);
    assert!(positions > 18 * 40, "{positions} positions");
    assert!(rate >= 0.99, "argmax agreement {rate}");
}
