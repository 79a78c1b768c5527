//! Llama (Llama-3 RoPE scaling) and Mixtral Hugging Face checkpoints against transformers 5.24
//! (float32, eager): the committed fixtures `tests/fixtures/hf/{llama,mixtral}` (see
//! tools/reference/README.md).

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
            "{}: llama3 RoPE needs numeric factor, low_freq_factor, high_freq_factor and original_max_position_embeddings",
            cfg(d.path())
        )
    );
    let d = edited_copy("mixtral", |c| c["intermediate_size"] = 16.into());
    assert_eq!(
        load_err(d.path()),
        format!(
            "{}: tensor 'model.layers.0.block_sparse_moe.experts.0.w1.weight' has shape [64, 32], expected [64, 16]",
            d.path().display()
        )
    );
    let d = edited_copy("mixtral", |c| c["num_local_experts"] = 4.into());
    assert_eq!(
        load_err(d.path()),
        format!(
            "{}: tensor 'model.layers.0.block_sparse_moe.gate.weight' has shape [64, 8], expected [64, 4]",
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
