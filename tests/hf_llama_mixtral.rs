//! Llama (Llama-3 RoPE scaling) and Mixtral Hugging Face checkpoints against transformers 5.24
//! (float32, eager): the committed fixtures `tests/fixtures/hf/{llama,mixtral}` (see
//! tools/reference/README.md).

mod common;

use common::hf::*;
use deltafin::engine::Session;
use deltafin::models::{load_hf, LoadOptions, Logits};
use serde_json::Value;
use std::path::Path;

#[test]
fn llama_logits_match_transformers() {
    let (_, last, worst) = check_logits("llama", None);
    eprintln!("llama: last rel {last:e}, top-10 worst rel {worst:e}");
}

#[test]
fn mixtral_logits_match_transformers() {
    let (_, last, worst) = check_logits("mixtral", None);
    eprintln!("mixtral: last rel {last:e}, top-10 worst rel {worst:e}");
}

#[test]
fn llama_greedy_continuation_matches() {
    greedy("llama");
}

#[test]
fn mixtral_greedy_continuation_matches() {
    greedy("mixtral");
}

#[test]
fn streaming_everything_gives_identical_logits() {
    for name in ["llama", "mixtral"] {
        let (resident, _, _) = check_logits(name, None);
        let b = smallest_budget(name);
        let (streamed, _, _) = check_logits(name, Some(b));
        assert!(resident == streamed, "{name}: streamed logits differ");
    }
}

/// Last-position logits of the reference prompt for a folder.
fn last_logits(dir: &Path) -> Vec<f32> {
    let ids = u32s(&reference("mixtral")["prompt_ids"]);
    let opts = LoadOptions {
        ram_budget: None,
        n_ctx: 128,
        n_batch: 128,
        direct_io: true,
        ..Default::default()
    };
    let (m, st) = load_hf(dir, &opts).unwrap();
    Session::new(m, st, 128, 128)
        .prefill(&ids, Logits::Last)
        .unwrap()
}

#[test]
fn mixtral_sliding_window_limits_attention() {
    let n = u32s(&reference("mixtral")["prompt_ids"]).len();
    let full = last_logits(&fixture("mixtral"));
    // a window covering the whole prompt changes nothing
    let d = edited_copy("mixtral", |c| c["sliding_window"] = n.into());
    assert!(last_logits(d.path()) == full);
    // a window one token short drops the first token from the last position's view
    let d = edited_copy("mixtral", |c| c["sliding_window"] = (n - 1).into());
    let rel = rel_diff(&last_logits(d.path()), &full);
    assert!(rel > 1e-3, "window {}: rel diff {rel}", n - 1);
}

#[test]
fn llama3_rope_scaling_is_applied() {
    // the same weights with plain RoPE give different logits
    let r = reference("llama");
    let ids = u32s(&r["prompt_ids"]);
    let d = edited_copy("llama", |c| {
        c["rope_parameters"] = serde_json::json!({"rope_theta": 500000.0, "rope_type": "default"})
    });
    let opts = LoadOptions {
        ram_budget: None,
        n_ctx: 128,
        n_batch: 128,
        direct_io: true,
        ..Default::default()
    };
    let (m, st) = load_hf(d.path(), &opts).unwrap();
    let last = Session::new(m, st, 128, 128)
        .prefill(&ids, Logits::Last)
        .unwrap();
    let rel = rel_diff(&last, &f32s(&r["last_logits"]));
    assert!(rel > 1e-3, "default RoPE: rel diff {rel}");
    // the published dialect (`rope_theta` + `rope_scaling` with `type`) matches
    let d = edited_copy("llama", |c| {
        let o = c.as_object_mut().unwrap();
        let mut rp = o.remove("rope_parameters").unwrap();
        o.insert("rope_theta".into(), rp["rope_theta"].clone());
        let rp = rp.as_object_mut().unwrap();
        rp.remove("rope_theta");
        let t = rp.remove("rope_type").unwrap();
        rp.insert("type".into(), t);
        o.insert("rope_scaling".into(), Value::Object(rp.clone()));
    });
    let (m, st) = load_hf(d.path(), &opts).unwrap();
    let last = Session::new(m, st, 128, 128)
        .prefill(&ids, Logits::Last)
        .unwrap();
    let rel = rel_diff(&last, &f32s(&r["last_logits"]));
    assert!(rel < REL_TOL, "published dialect: rel diff {rel}");
}

#[test]
fn load_errors_name_the_field_or_tensor() {
    let cfg = |d: &Path| d.join("config.json").display().to_string();
    let d = edited_copy("llama", |c| c["attention_bias"] = true.into());
    assert_eq!(
        load_err(d.path()),
        format!(
            "{}: attention_bias = true is not supported yet",
            cfg(d.path())
        )
    );
    let d = edited_copy("llama", |c| c["mlp_bias"] = true.into());
    assert_eq!(
        load_err(d.path()),
        format!("{}: mlp_bias = true is not supported yet", cfg(d.path()))
    );
    let d = edited_copy("llama", |c| {
        c["rope_parameters"]
            .as_object_mut()
            .unwrap()
            .remove("low_freq_factor");
    });
    assert_eq!(
        load_err(d.path()),
        format!(
            "{}: llama3 RoPE needs numeric factor, low_freq_factor and high_freq_factor",
            cfg(d.path())
        )
    );
    let d = edited_copy("mixtral", |c| c["intermediate_size"] = 16.into());
    assert_eq!(
        load_err(d.path()),
        format!(
            "{}: tensor 'model.layers.0.block_sparse_moe.experts.0.w1.weight' has shape [32, 64], expected [16, 64]",
            d.path().display()
        )
    );
    let d = edited_copy("mixtral", |c| c["num_local_experts"] = 4.into());
    assert_eq!(
        load_err(d.path()),
        format!(
            "{}: tensor 'model.layers.0.block_sparse_moe.gate.weight' has shape [8, 64], expected [4, 64]",
            d.path().display()
        )
    );
}

#[test]
fn mixtral_streamed_decode_step_reads_only_the_chosen_experts() {
    let name = "mixtral";
    let r = reference(name);
    let ids = u32s(&r["prompt_ids"]);
    let mut s = session(name, Some(smallest_budget(name)));
    s.prefill(&ids, Logits::Last).unwrap();
    let before = s.store.stats().snapshot().0;
    let t = u32s(&r["continuation_ids"])[0];
    s.model
        .forward(&mut s.store, &mut s.cache, &[t], Logits::Last)
        .unwrap();
    let read = s.store.stats().snapshot().0 - before;
    let all: u64 = (0..s.store.len())
        .filter(|&i| !s.store.is_resident(i))
        .map(|i| s.store.unit(i).buffer_bytes() as u64)
        .sum();
    // 2 layers × 8 experts of 3 × 64 × 32 bf16 (12 KiB each); one token takes 2 per layer,
    // so 12 expert reads (≥ 144 KiB) are skipped; the embedding row adds ≤ 8 KiB.
    assert!(read > 0 && read + 10 * 12288 <= all, "read {read} of {all}");
}
