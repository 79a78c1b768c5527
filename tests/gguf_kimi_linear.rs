//! The `kimi-linear` GGUF (llama.cpp's architecture name for Kimi Linear): the tiny Hugging
//! Face fixture `tests/fixtures/hf/kimi_linear` (its dense MLP renamed to the published `mlp.`
//! and its config given the published `linear_attn_config`, `first_k_dense_replace` and
//! `moe_router_activation_func`) converted to F32 by llama.cpp's own converter and run by
//! llama-cpp-python 0.3.36 (`tests/fixtures/gguf/kimi_linear/`, written by
//! `tools/reference/gguf_fixtures.py kimi_linear`).
//!
//! Tolerance: max |ours − llama.cpp| over the vocabulary ÷ max |llama.cpp|, at every prompt
//! position, at most [`TOL`] (1e-4). Both sides compute in f32 over the same weights; they
//! differ in summation order, in the KDA form (llama.cpp runs prompts chunked, Deltafin every
//! pass recurrent), and in small epsilons: llama.cpp
//! L2-normalizes KDA queries and keys with `rms_norm_eps` (1e-5), Deltafin with transformers'
//! 1e-6, and keeps `−exp(A_log)` where Deltafin takes `ln` of it back.

mod common;

use common::gguf::{
    check_tokenization, dir, edited_gguf, gguf_path, load_err, prompt_logits, reference,
    session_at, smallest_budget, worst_rel,
};
use common::hf::{f32s, u32s};
use deltafin::source::gguf::GgufModel;
use deltafin::tokenizer::Tokenizer;

const FAMILY: &str = "kimi_linear";

/// Relative tolerance against llama.cpp (see the module header; measured 8.7e-6).
const TOL: f32 = 1e-4;

fn all_logits(ram_budget: Option<u64>) -> (Vec<f32>, usize) {
    let r = reference(FAMILY);
    let mut s = session_at(&gguf_path(FAMILY, "f32"), ram_budget);
    prompt_logits(&mut s, &u32s(&r["prompt_ids"]))
}

#[test]
fn kimi_linear_gguf_matches_llama_cpp_at_every_position() {
    let r = reference(FAMILY);
    let rv = &r["variants"]["f32"];
    assert_eq!(rv["n_prompt"], 37);
    let (ours, vocab) = all_logits(None);
    assert_eq!(vocab, 512);
    assert_eq!(ours.len(), 37 * 512);
    let rel = worst_rel(
        &ours,
        vocab,
        &dir(FAMILY).join(rv["logits_file"].as_str().unwrap()),
    );
    eprintln!("kimi_linear/f32 vs llama.cpp: worst position rel {rel:e}");
    assert!(rel <= TOL, "rel {rel:e}");
}

#[test]
fn kimi_linear_gguf_greedy_continuation_matches_llama_cpp() {
    let r = reference(FAMILY);
    let rv = &r["variants"]["f32"];
    let want = u32s(&rv["continuation_ids"]);
    assert_eq!(want.len(), 16);
    // every step is compared: the smallest reference top-2 gap (5.9e-3, step 14) is ~40× the
    // worst absolute logit difference measured above (8.7e-6 × max |logit| 17.3 = 1.5e-4)
    let min_gap = f32s(&rv["continuation_gaps"])
        .into_iter()
        .fold(f32::INFINITY, f32::min);
    assert!(min_gap > 10.0 * TOL * 2.0, "min gap {min_gap}");
    let mut s = session_at(&gguf_path(FAMILY, "f32"), None);
    let got = common::greedy_ids(&mut s, &u32s(&r["prompt_ids"]), want.len());
    assert_eq!(got, want);
}

#[test]
fn kimi_linear_gguf_streamed_equals_resident() {
    let (resident, _) = all_logits(None);
    let b = smallest_budget(&gguf_path(FAMILY, "f32"));
    let (streamed, _) = all_logits(Some(b));
    assert!(resident == streamed, "streamed logits differ");
}

#[test]
fn kimi_linear_gguf_tokenization_matches_llama_cpp() {
    let r = reference(FAMILY);
    let g = GgufModel::open(&gguf_path(FAMILY, "f32")).unwrap();
    assert_eq!(g.architecture().unwrap(), "kimi-linear");
    let t = Tokenizer::from_gguf(&g).unwrap();
    check_tokenization(
        &t,
        r["prompt_text"].as_str().unwrap(),
        &r["variants"]["f32"],
        FAMILY,
    );
}

#[test]
fn kimi_linear_gguf_load_errors_name_the_key_or_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let src = gguf_path(FAMILY, "f32");
    let p = tmp.path().join("edited.gguf");
    edited_gguf(
        &src,
        &p,
        |m| m.retain(|(k, _)| k != "kimi-linear.kda.head_dim"),
        |_| true,
    );
    assert_eq!(
        load_err(&p),
        "edited.gguf: metadata key 'kimi-linear.kda.head_dim' is missing"
    );
    edited_gguf(
        &src,
        &p,
        |m| m.retain(|(k, _)| k != "kimi-linear.attention.head_count_kv"),
        |_| true,
    );
    assert_eq!(
        load_err(&p),
        "edited.gguf: metadata key 'kimi-linear.attention.head_count_kv' is not an array of counts (one per layer: 0 for KDA, else MLA)"
    );
    edited_gguf(&src, &p, |_| {}, |n| n != "blk.1.ssm_a");
    assert_eq!(
        load_err(&p),
        format!("{}: tensor 'blk.1.ssm_a' is missing", p.display())
    );
    edited_gguf(&src, &p, |_| {}, |n| n != "blk.2.attn_v_b.weight");
    assert_eq!(
        load_err(&p),
        format!("{}: tensor 'blk.2.attn_v_b.weight' is missing", p.display())
    );
}
