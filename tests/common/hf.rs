//! Helpers for the tests of Hugging Face fixtures (`tests/fixtures/hf/<name>`, written by
//! tools/reference/hf_fixtures.py with transformers 5.24): loading, reference comparison,
//! greedy decoding, budgets and edited copies.

use std::path::{Path, PathBuf};

use deltafin::engine::Session;
use deltafin::models::{load_hf, LoadOptions, Logits};
use serde_json::Value;

/// Relative tolerance: max |ours − reference| over a set of logits divided by max |reference|.
pub const REL_TOL: f32 = 1e-4;

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(name)
}

pub fn reference(name: &str) -> Value {
    let s = std::fs::read_to_string(fixture(name).join("reference.json")).unwrap();
    serde_json::from_str(&s).unwrap()
}

pub fn u32s(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

pub fn f32s(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

pub fn session(name: &str, ram_budget: Option<u64>) -> Session {
    let opts = LoadOptions {
        ram_budget,
        n_ctx: 128,
        n_batch: 128,
        direct_io: true,
        ..Default::default()
    };
    let (m, s) = load_hf(&fixture(name), &opts).unwrap();
    Session::new(m, s, 128, 128)
}

/// max |a − b| / max |b|.
pub fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let num = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    let den = b.iter().map(|y| y.abs()).fold(0f32, f32::max);
    num / den
}

pub fn argmax(l: &[f32]) -> u32 {
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
pub fn check_logits(name: &str, budget: Option<u64>) -> (Vec<f32>, f32, f32) {
    check_logits_tol(name, budget, REL_TOL)
}

/// [`check_logits`] with relative tolerance `tol`.
pub fn check_logits_tol(name: &str, budget: Option<u64>, tol: f32) -> (Vec<f32>, f32, f32) {
    let r = reference(name);
    let ids = u32s(&r["prompt_ids"]);
    let mut s = session(name, budget);
    let all = s.prefill(&ids, Logits::All).unwrap();
    let vocab = s.model.vocab_size();
    assert_eq!(all.len(), ids.len() * vocab);
    let last = &all[(ids.len() - 1) * vocab..];
    let last_rel = rel_diff(last, &f32s(&r["last_logits"]));
    assert!(last_rel < tol, "{name}: last logits rel diff {last_rel}");
    let mut worst = 0f32;
    for (i, p) in r["positions"].as_array().unwrap().iter().enumerate() {
        let row = &all[i * vocab..(i + 1) * vocab];
        let want = f32s(&p["logits"]);
        let got: Vec<f32> = u32s(&p["ids"]).iter().map(|&t| row[t as usize]).collect();
        let rel = rel_diff(&got, &want);
        worst = worst.max(rel);
        assert!(rel < tol, "{name}: position {i} top-10 rel diff {rel}");
        assert_eq!(
            argmax(row),
            u32s(&p["ids"])[0],
            "{name}: position {i} argmax"
        );
    }
    (all, last_rel, worst)
}

pub fn greedy(name: &str) {
    let r = reference(name);
    let ids = u32s(&r["prompt_ids"]);
    let want = u32s(&r["continuation_ids"]);
    let mut s = session(name, None);
    let got = super::greedy_ids(&mut s, &ids, want.len());
    assert_eq!(got, want, "{name}: greedy continuation");
}

/// The smallest budget (in 4 KiB steps) the model loads under: it holds the KV cache,
/// activations and stream buffers and no weights.
pub fn smallest_budget(name: &str) -> u64 {
    let opts = |b| LoadOptions {
        ram_budget: Some(b),
        n_ctx: 128,
        n_batch: 128,
        direct_io: true,
        ..Default::default()
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
pub fn edited_copy(name: &str, edit: impl FnOnce(&mut Value)) -> tempfile::TempDir {
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

pub fn load_err(dir: &Path) -> String {
    let opts = LoadOptions {
        ram_budget: None,
        n_ctx: 16,
        n_batch: 16,
        direct_io: true,
        ..Default::default()
    };
    match load_hf(dir, &opts) {
        Ok(_) => panic!("loading {} should fail", dir.display()),
        Err(e) => format!("{e:#}"),
    }
}
