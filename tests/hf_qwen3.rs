//! Qwen3 and Qwen3-MoE Hugging Face checkpoints against transformers 5.24 (float32, eager):
//! the committed fixtures `tests/fixtures/hf/{qwen3,qwen3_moe}` (see tools/reference/README.md).

mod common;

use common::hf::*;
use deltafin::engine::Session;
use deltafin::models::{load_hf, LoadOptions, Logits};
use serde_json::Value;

#[test]
fn qwen3_logits_match_transformers() {
    let (_, last, worst) = check_logits("qwen3", None);
    eprintln!("qwen3: last rel {last:e}, top-10 worst rel {worst:e}");
}

#[test]
fn qwen3_moe_logits_match_transformers() {
    let (_, last, worst) = check_logits("qwen3_moe", None);
    eprintln!("qwen3_moe: last rel {last:e}, top-10 worst rel {worst:e}");
}

#[test]
fn qwen3_greedy_continuation_matches() {
    greedy("qwen3");
}

#[test]
fn qwen3_moe_greedy_continuation_matches() {
    greedy("qwen3_moe");
}

#[test]
fn streaming_everything_gives_identical_logits() {
    for name in ["qwen3", "qwen3_moe"] {
        let (resident, _, _) = check_logits(name, None);
        let b = smallest_budget(name);
        let (streamed, _, _) = check_logits(name, Some(b));
        assert!(resident == streamed, "{name}: streamed logits differ");
    }
}

#[test]
fn one_streamed_decode_step_reads_only_the_chosen_experts() {
    let name = "qwen3_moe";
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
    // Every streamed unit's aligned span: what one pass reads if it takes every expert.
    let all: u64 = (0..s.store.len())
        .filter(|&i| !s.store.is_resident(i))
        .map(|i| s.store.unit(i).buffer_bytes() as u64)
        .sum();
    // 2 MoE layers × 8 experts of 3 × 64 × 32 bf16 (12 KiB each); one token takes 2 per
    // layer, so 12 expert reads (≥ 144 KiB) are skipped; the embedding row adds ≤ 8 KiB.
    assert!(read > 0 && read + 10 * 12288 <= all, "read {read} of {all}");
}

#[test]
fn load_errors_name_the_tensor_or_field() {
    // untied head without lm_head.weight
    let d = edited_copy("qwen3", |c| c["tie_word_embeddings"] = Value::Bool(false));
    let e = load_err(d.path());
    assert_eq!(
        e,
        format!("{}: tensor 'lm_head.weight' is missing", d.path().display())
    );
    // experts narrower than the config says
    let d = edited_copy("qwen3_moe", |c| c["moe_intermediate_size"] = 16.into());
    assert_eq!(
        load_err(d.path()),
        format!(
            "{}: tensor 'model.layers.0.mlp.experts.0.gate_proj.weight' has shape [32, 64], expected [16, 64]",
            d.path().display()
        )
    );
    // a tensor removed from the file
    let d = edited_copy("qwen3", |_| {});
    let p = d.path().join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<(String, safetensors::tensor::TensorView)> = st
        .tensors()
        .into_iter()
        .filter(|(n, _)| n != "model.layers.1.self_attn.k_norm.weight")
        .collect();
    let out = safetensors::serialize(kept, None).unwrap();
    std::fs::write(&p, out).unwrap();
    assert_eq!(
        load_err(d.path()),
        format!(
            "{}: tensor 'model.layers.1.self_attn.k_norm.weight' is missing",
            d.path().display()
        )
    );
    // unknown architecture
    let d = edited_copy("qwen3", |c| c["model_type"] = "qwen9".into());
    assert_eq!(
        load_err(d.path()),
        format!(
            "{}: model_type 'qwen9' is not supported (supported: qwen3, qwen3_moe, llama, mixtral, gpt_oss, deepseek_v3, kimi_k2, kimi_linear, kimi_k3)",
            d.path().join("config.json").display()
        )
    );
}

#[test]
fn cli_chat_greedy_matches_the_reference_continuation() {
    let r = reference("qwen3_moe");
    let model = fixture("qwen3_moe");
    for budget in [None, Some("400K")] {
        let mut args = vec![
            "run",
            "-m",
            model.to_str().unwrap(),
            "--chat",
            "-p",
            "Which experts does the router keep for café? Answer in 3 words.",
            "--temp",
            "0",
            "-n",
            "16",
        ];
        if let Some(b) = budget {
            args.extend_from_slice(&["--ram-budget", b]);
        }
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_deltafin"))
            .args(&args)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let text = String::from_utf8(o.stdout).unwrap();
        assert_eq!(
            text,
            format!("{}\n", r["continuation_text"].as_str().unwrap())
        );
    }
}

#[test]
fn published_config_dialect_gives_the_same_logits() {
    let r = reference("qwen3_moe");
    let ids = u32s(&r["prompt_ids"]);
    let d = edited_copy("qwen3_moe", |c| {
        let o = c.as_object_mut().unwrap();
        let rp = o.remove("rope_parameters").unwrap();
        o.insert("rope_theta".into(), rp["rope_theta"].clone());
        o.insert("rope_scaling".into(), Value::Null);
        let n = o.remove("num_local_experts").unwrap();
        o.insert("num_experts".into(), n);
        let dt = o.remove("dtype").unwrap();
        o.insert("torch_dtype".into(), dt);
    });
    let opts = LoadOptions {
        ram_budget: None,
        n_ctx: 128,
        n_batch: 128,
        direct_io: true,
        ..Default::default()
    };
    let (m, st) = load_hf(d.path(), &opts).unwrap();
    let mut s = Session::new(m, st, 128, 128);
    let last = s.prefill(&ids, Logits::Last).unwrap();
    let rel = rel_diff(&last, &f32s(&r["last_logits"]));
    assert!(rel < REL_TOL, "published dialect: rel diff {rel}");
}

#[test]
fn chunked_prefill_equals_one_batch() {
    for name in ["qwen3", "qwen3_moe"] {
        let ids = u32s(&reference(name)["prompt_ids"]);
        let one = session(name, None).prefill(&ids, Logits::Last).unwrap();
        let mut s = session(name, None);
        s.n_batch = 5;
        let chunked = s.prefill(&ids, Logits::Last).unwrap();
        assert!(one == chunked, "{name}: chunked prefill differs");
    }
}
