//! Kimi Linear Hugging Face checkpoints against transformers 5.24 (float32, CPU, its reference
//! PyTorch KDA kernels): the committed fixture `tests/fixtures/hf/kimi_linear` (bf16; KDA layers
//! 1, 2, 4 and a no-RoPE MLA layer 3, a dense first layer then MoE layers; written by
//! tools/reference/hf_fixtures.py, which also records every prompt position's full logits).
//!
//! Tolerances: 1e-4 relative (max |ours − reference| / max |reference|) at every prompt
//! position over the whole vocabulary. transformers runs the prompt through the chunked delta
//! rule and decode steps through the recurrent one; Deltafin runs every pass in the recurrent
//! form (`src/models/layers/kda.rs` says why), so its prompt logits equal token-at-a-time
//! decoding bit for bit.

mod common;

use common::hf::*;
use deltafin::models::Logits;

const NAME: &str = "kimi_linear";

/// What the fixture meets besides the suite-wide 1e-4 ([`REL_TOL`]): f32 summation order.
const TIGHT: f32 = 1e-5;

#[test]
fn logits_match_transformers_at_every_position() {
    let (all, last, worst) = check_logits(NAME, None);
    let r = reference(NAME);
    let vocab = all.len() / u32s(&r["prompt_ids"]).len();
    let mut every = 0f32;
    for (i, row) in r["all_logits"].as_array().unwrap().iter().enumerate() {
        let rel = rel_diff(&all[i * vocab..(i + 1) * vocab], &f32s(row));
        assert!(rel < REL_TOL, "position {i}: rel {rel}");
        every = every.max(rel);
    }
    eprintln!("kimi_linear: last rel {last:e}, top-10 worst {worst:e}, every position {every:e}");
    // measured 8.8e-7 (last), 1.7e-6 (top-10), 2.5e-6 (every position, whole vocabulary)
    assert!(every < TIGHT, "{every}");
}

#[test]
fn greedy_continuation_matches() {
    greedy(NAME);
}

#[test]
fn streaming_everything_gives_identical_logits() {
    let (resident, _, _) = check_logits(NAME, None);
    let b = smallest_budget(NAME);
    let (streamed, _, _) = check_logits(NAME, Some(b));
    assert!(resident == streamed, "streamed logits differ");
}

#[test]
fn prefill_equals_token_at_a_time_bit_for_bit() {
    let ids = u32s(&reference(NAME)["prompt_ids"]);
    let all = session(NAME, None).prefill(&ids, Logits::All).unwrap();
    let vocab = all.len() / ids.len();
    let mut s = session(NAME, None);
    for (i, &t) in ids.iter().enumerate() {
        let l = s
            .model
            .forward(&mut s.store, &mut s.cache, &[t], Logits::Last)
            .unwrap();
        assert!(l[..] == all[i * vocab..(i + 1) * vocab], "position {i}");
    }
    // batches of 5: each pass carries the state of the one before
    let mut s = session(NAME, None);
    s.n_batch = 5;
    let batched = s.prefill(&ids, Logits::Last).unwrap();
    assert!(batched[..] == all[all.len() - vocab..], "batches of 5");
}

#[test]
fn the_cache_holds_latent_rows_for_mla_and_a_state_for_kda() {
    let mut s = session(NAME, None);
    // MLA layer 2 (0-based): kv_lora_rank 16 + qk_rope_head_dim 8 floats a position, grown
    // with the positions written (128 at most)
    assert!(s.cache.k[2].is_empty(), "no memory before the first pass");
    s.prefill(&[1, 2, 3], Logits::Last).unwrap();
    assert_eq!(s.cache.k[2].len(), 3 * 24);
    s.prefill(&[4], Logits::Last).unwrap();
    assert_eq!(s.cache.k[2].len(), 4 * 24);
    s.prefill(&[5; 40], Logits::Last).unwrap();
    assert_eq!(s.cache.k[2].len(), 44 * 24);
    s.prefill(&[6], Logits::Last).unwrap();
    assert_eq!(s.cache.k[2].len(), 55 * 24, "a quarter more than it held");
    // KDA layers: conv (4 − 1) × 3 × 64 + 4 heads × 16 × 16, no per-position rows
    for l in [0, 1, 3] {
        assert!(s.cache.k[l].is_empty());
        assert_eq!(s.cache.state[l].len(), 3 * 3 * 64 + 4 * 16 * 16);
    }
    assert!(s.cache.state[2].is_empty());
    assert_eq!(
        s.model.placement().kv_bytes,
        (128 * 24 + 3 * (576 + 1024)) * 4
    );
    // clearing zeroes the states: the same prompt gives the same logits again
    let ids = u32s(&reference(NAME)["prompt_ids"]);
    let mut s = session(NAME, None);
    let a = s.prefill(&ids, Logits::Last).unwrap();
    s.cache.clear();
    let b = s.prefill(&ids, Logits::Last).unwrap();
    assert!(a == b);
}

#[test]
fn one_streamed_decode_step_reads_only_the_chosen_experts() {
    let r = reference(NAME);
    let ids = u32s(&r["prompt_ids"]);
    let mut s = session(NAME, Some(smallest_budget(NAME)));
    s.prefill(&ids, Logits::Last).unwrap();
    let before = s.store.stats().snapshot();
    let t = u32s(&r["continuation_ids"])[0];
    s.model
        .forward(&mut s.store, &mut s.cache, &[t], Logits::Last)
        .unwrap();
    let after = s.store.stats().snapshot();
    let read = after.0 - before.0;
    let all: u64 = (0..s.store.len())
        .filter(|&i| !s.store.is_resident(i))
        .map(|i| s.store.unit(i).buffer_bytes() as u64)
        .sum();
    // 3 MoE layers × 8 experts, top-2: 18 expert reads of 3 × 32 × 64 bf16 (12 KiB) skipped
    assert!(read > 0 && read + 18 * 12288 <= all, "read {read} of {all}");
}

#[test]
fn load_errors_name_the_field_or_tensor() {
    let d = edited_copy(NAME, |c| c["layer_types"][0] = "sliding_attention".into());
    assert_eq!(
        load_err(d.path()),
        format!(
            "{}: 'layer_types' entry \"sliding_attention\" is not linear_attention or full_attention",
            d.path().join("config.json").display()
        )
    );
    // layer 0 as MLA: its KDA q_proj is there, not MLA-shaped
    let d = edited_copy(NAME, |c| c["layer_types"][0] = "full_attention".into());
    assert_eq!(
        load_err(d.path()),
        format!(
            "{}: tensor 'model.layers.0.self_attn.q_proj.weight' has shape [64, 64], expected [96, 64]",
            d.path().display()
        )
    );
    let d = edited_copy(NAME, |c| c["linear_head_dim"] = 8.into());
    assert_eq!(
        load_err(d.path()),
        format!(
            "{}: tensor 'model.layers.0.self_attn.q_proj.weight' has shape [64, 64], expected [32, 64]",
            d.path().display()
        )
    );
}
