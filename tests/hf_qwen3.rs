//! Qwen3 and Qwen3-MoE Hugging Face checkpoints against transformers 5.24 (float32, eager):
//! the committed fixtures `tests/fixtures/hf/{qwen3,qwen3_moe}` (see tools/reference/README.md).

use std::path::{Path, PathBuf};

use deltafin::engine::Session;
use deltafin::models::{load_hf, LoadOptions, Logits};
use serde_json::Value;

/// Relative tolerance: max |ours − reference| over a set of logits divided by max |reference|.
const REL_TOL: f32 = 1e-4;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(name)
}

fn reference(name: &str) -> Value {
    let s = std::fs::read_to_string(fixture(name).join("reference.json")).unwrap();
    serde_json::from_str(&s).unwrap()
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn f32s(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn session(name: &str, ram_budget: Option<u64>) -> Session {
    let opts = LoadOptions {
        ram_budget,
        n_ctx: 128,
        n_batch: 128,
        direct_io: true,
    };
    let (m, s) = load_hf(&fixture(name), &opts).unwrap();
    Session::new(m, s, 128, 128)
}

/// max |a − b| / max |b|.
fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let num = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    let den = b.iter().map(|y| y.abs()).fold(0f32, f32::max);
    num / den
}

fn argmax(l: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in l.iter().enumerate() {
        if v > l[best] {
            best = i;
        }
    }
    best as u32
}

/// Logits of every prompt position in one batch; checks last-position logits and every
/// position's top-10 against the reference; returns the worst relative differences.
fn check_logits(name: &str, budget: Option<u64>) -> (Vec<f32>, f32, f32) {
    let r = reference(name);
    let ids = u32s(&r["prompt_ids"]);
    let mut s = session(name, budget);
    let all = s.prefill(&ids, Logits::All).unwrap();
    let vocab = s.model.vocab_size();
    assert_eq!(all.len(), ids.len() * vocab);
    let last = &all[(ids.len() - 1) * vocab..];
    let last_rel = rel_diff(last, &f32s(&r["last_logits"]));
    assert!(
        last_rel < REL_TOL,
        "{name}: last logits rel diff {last_rel}"
    );
    let mut worst = 0f32;
    for (i, p) in r["positions"].as_array().unwrap().iter().enumerate() {
        let row = &all[i * vocab..(i + 1) * vocab];
        let want = f32s(&p["logits"]);
        let got: Vec<f32> = u32s(&p["ids"]).iter().map(|&t| row[t as usize]).collect();
        let rel = rel_diff(&got, &want);
        worst = worst.max(rel);
        assert!(rel < REL_TOL, "{name}: position {i} top-10 rel diff {rel}");
        assert_eq!(
            argmax(row),
            u32s(&p["ids"])[0],
            "{name}: position {i} argmax"
        );
    }
    (all, last_rel, worst)
}

fn greedy(name: &str) {
    let r = reference(name);
    let ids = u32s(&r["prompt_ids"]);
    let want = u32s(&r["continuation_ids"]);
    let mut s = session(name, None);
    let mut l = s.prefill(&ids, Logits::Last).unwrap();
    let mut got = Vec::new();
    for _ in 0..want.len() {
        let t = argmax(&l);
        got.push(t);
        l = s
            .model
            .forward(&mut s.store, &mut s.cache, &[t], Logits::Last)
            .unwrap();
    }
    assert_eq!(got, want, "{name}: greedy continuation");
}

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

/// The smallest budget (in 4 KiB steps) the model loads under: it holds the KV cache,
/// activations and stream buffers and no weights.
fn smallest_budget(name: &str) -> u64 {
    let opts = |b| LoadOptions {
        ram_budget: Some(b),
        n_ctx: 128,
        n_batch: 128,
        direct_io: true,
    };
    let mut b = 4 << 10;
    loop {
        match load_hf(&fixture(name), &opts(b)) {
            Ok((m, _)) => {
                let p = m.placement();
                assert_eq!(p.resident_bytes, 0, "{name}: {}", p.summary);
                assert!(p.summary.starts_with("0/"), "{}", p.summary);
                return b;
            }
            Err(e) => assert!(e.to_string().contains("is too small"), "{e}"),
        }
        b += 4 << 10;
        assert!(b < 64 << 20, "{name}: no budget works");
    }
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

/// A copy of fixture `name` in a temporary folder, with `edit` applied to its config.json.
fn edited_copy(name: &str, edit: impl FnOnce(&mut Value)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixture(name)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
    }
    let p = dir.path().join("config.json");
    let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    edit(&mut c);
    std::fs::write(&p, c.to_string()).unwrap();
    dir
}

fn load_err(dir: &Path) -> String {
    let opts = LoadOptions {
        ram_budget: None,
        n_ctx: 16,
        n_batch: 16,
        direct_io: true,
    };
    match load_hf(dir, &opts) {
        Ok(_) => panic!("loading {} should fail", dir.display()),
        Err(e) => format!("{e:#}"),
    }
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
            "{}: tensor 'model.layers.0.mlp.experts.0.gate_proj.weight' has shape [64, 32], expected [64, 16]",
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
            "{}: model_type 'qwen9' is not supported (supported: qwen3, qwen3_moe, llama, mixtral)",
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
