//! The models on a device (`--device`, `LoadOptions::device`).
//!
//! Anywhere: a family whose layers need ops whose CUDA kernels have not yet run on a GPU
//! (`backend::cuda::UNVERIFIED`, empty since session 22) would stay on the CPU under `auto`,
//! the placement line naming those ops when a GPU was found; every family runs on
//! `cuda:N` (or, without a GPU, `cuda` says why); without a GPU, `auto` falls back to the
//! CPU, saying so in the placement line.
//!
//! On a machine with a CUDA GPU (each test prints `CUDA model tests skipped: …` and passes
//! elsewhere; CI has none): every fixture family's logits on the GPU within 1e-3 relative
//! of the CPU's (max |gpu − cpu| / max |cpu| over a whole prompt's logits, the worst
//! printed), greedy continuations equal, a batch of sequences equal to each alone bit for
//! bit (passes of at most 8 rows), and experts streamed from disk equal to experts
//! resident, bit for bit in decode steps. The MLA, KDA, Kimi K3 and GPT-OSS fixtures are
//! their kernels' first run on a GPU.

mod common;

use std::path::{Path, PathBuf};

use common::gguf::load_path;
use common::hf::{argmax, rel_diff};
use deltafin::backend::cuda::Cuda;
use deltafin::backend::DeviceKind;
use deltafin::models::{KvCache, LoadOptions, Logits, Model, SeqPass};
use deltafin::store::{CachePolicy, ExpertStoreOptions, PrefetchMode, WeightStore};

const N_CTX: usize = 48;

/// (label, fixture under tests/fixtures): the GQA families (Qwen3, Llama, Qwen3-MoE,
/// Mixtral) as Hugging Face folders and as GGUF files of several encodings; DeepSeek V3
/// (MLA; BF16 and FP8 blocks), Kimi Linear and Kimi K3 (KDA + MLA; K3 also with MXFP4
/// experts) and GPT-OSS (BF16 input-major experts, and MXFP4).
const CASES: [(&str, &str); 18] = [
    ("qwen3", "hf/qwen3"),
    ("llama", "hf/llama"),
    ("qwen3_moe", "hf/qwen3_moe"),
    ("mixtral", "hf/mixtral"),
    ("qwen3 f32 GGUF", "gguf/qwen3/qwen3-f32.gguf"),
    ("llama f32 GGUF", "gguf/llama/llama-f32.gguf"),
    ("qwen3moe q8_0 GGUF", "gguf/qwen3_moe/qwen3_moe-q8_0.gguf"),
    ("qwen3moe q5_0 GGUF", "gguf/qwen3_moe/qwen3_moe-q5_0.gguf"),
    ("mixtral q4_0 GGUF", "gguf/mixtral/mixtral-q4_0.gguf"),
    ("qwen3moe q2_k GGUF", "gguf/qwen3_moe_lowbit/q2_k.gguf"),
    ("qwen3moe iq4_xs GGUF", "gguf/qwen3_moe_lowbit/iq4_xs.gguf"),
    ("deepseek_v3", "hf/deepseek_v3"),
    ("deepseek_v3 fp8", "hf/deepseek_v3_fp8"),
    ("kimi_linear", "hf/kimi_linear"),
    ("kimi_k3", "hf/kimi_k3"),
    ("kimi_k3 mxfp4", "hf/kimi_k3_mxfp4"),
    ("gpt_oss", "hf/gpt_oss"),
    ("gpt_oss mxfp4", "hf/gpt_oss_mxfp4"),
];

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

fn opts(device: DeviceKind, budget: Option<u64>) -> LoadOptions {
    LoadOptions {
        ram_budget: budget,
        n_ctx: N_CTX,
        n_batch: N_CTX,
        device,
        experts: ExpertStoreOptions {
            cache: CachePolicy::None,
            prefetch: PrefetchMode::Off,
            ..Default::default()
        },
        ..Default::default()
    }
}

fn load(rel: &str, device: DeviceKind) -> (Box<dyn Model>, WeightStore) {
    load_path(&fixture(rel), &opts(device, None)).unwrap()
}

/// Whether a CUDA GPU is usable here; prints why not once per test otherwise.
fn gpu() -> bool {
    if !Cuda::devices().is_empty() {
        return true;
    }
    let why = Cuda::open(0)
        .err()
        .map_or("no GPU".into(), |e| format!("{e:#}"));
    eprintln!("CUDA model tests skipped: {why}");
    false
}

/// `n` token ids inside a vocabulary of `vocab`, starting from `seed`.
fn ids(seed: u32, n: usize, vocab: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (seed + 977 * i + 31 * i * i) % vocab as u32)
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The logits of every position of a 12-token prompt, then of 6 greedy steps: (prompt
/// logits, greedy ids, each step's logits).
fn prompt_and_greedy(m: &dyn Model, s: &mut WeightStore) -> (Vec<f32>, Vec<u32>, Vec<f32>) {
    let v = m.vocab_size();
    let mut c = m.new_cache(N_CTX);
    let all = m.forward(s, &mut c, &ids(7, 12, v), Logits::All).unwrap();
    let mut next = argmax(&all[all.len() - v..]);
    let (mut out, mut steps) = (vec![next], Vec::new());
    for _ in 0..5 {
        let l = m.forward(s, &mut c, &[next], Logits::Last).unwrap();
        next = argmax(&l);
        out.push(next);
        steps.extend(l);
    }
    (all, out, steps)
}

#[test]
fn auto_takes_the_gpu_unless_a_kernel_is_unverified_and_cuda_runs_every_family() {
    let gpu = !Cuda::devices().is_empty();
    // (fixture, the ops `auto` finds unverified: none since every kernel's GPU run; the rule
    // itself is tested in models::device with a list)
    let none: Option<&str> = None;
    for (rel, unverified) in [
        ("hf/deepseek_v3", none),
        ("hf/kimi_linear", none),
        ("hf/kimi_k3", none),
        ("hf/gpt_oss", none),
    ] {
        // auto: the GPU where one is, unless an op is unverified (then the CPU, naming it)
        let (m, _) = load(rel, DeviceKind::Auto);
        let summary = &m.placement().summary;
        match (gpu, unverified) {
            (true, None) => assert!(summary.contains("; device cuda:0 ("), "{rel}: {summary}"),
            (true, Some(ops)) => {
                let want = format!("; device cpu (cuda: {ops} not yet verified on a GPU)");
                assert!(summary.ends_with(&want), "{rel}: {summary}");
            }
            (false, _) => assert!(summary.ends_with("; device cpu"), "{rel}: {summary}"),
        }
        // cuda:0 runs it (with a warning on stderr if unverified) where a GPU is, else says why
        match load_path(&fixture(rel), &opts(DeviceKind::Cuda(0), None)) {
            Ok((m, _)) => {
                assert!(gpu, "{rel}: loaded on cuda:0 without a GPU");
                let summary = &m.placement().summary;
                assert!(summary.contains("; device cuda:0 ("), "{rel}: {summary}");
            }
            Err(e) => {
                let e = format!("{e:#}");
                assert!(!gpu && e.starts_with("cuda:0: "), "{rel}: {e}");
            }
        }
    }
}

#[test]
fn without_a_gpu_cuda_says_why_and_auto_is_the_cpu() {
    let (m, _) = load("hf/qwen3", DeviceKind::Auto);
    let summary = m.placement().summary.clone();
    if !Cuda::devices().is_empty() {
        assert!(summary.contains("; device cuda:0 ("), "{summary}");
        return;
    }
    assert!(summary.ends_with("; device cpu"), "{summary}");
    let e = load_path(&fixture("hf/qwen3"), &opts(DeviceKind::Cuda(0), None))
        .err()
        .expect("no GPU here");
    let e = format!("{e:#}");
    assert!(e.starts_with("cuda:0: "), "{e}");
}

#[test]
fn gpu_logits_are_the_cpus_within_1e3_and_greedy_continuations_equal() {
    if !gpu() {
        return;
    }
    let mut worst = (0f32, "");
    for (label, rel) in CASES {
        let (cm, mut cs) = load(rel, DeviceKind::Cpu);
        let (gm, mut gs) = load(rel, DeviceKind::Cuda(0));
        assert!(gm.placement().summary.contains("device cuda:0"), "{label}");
        let (ca, cids, csteps) = prompt_and_greedy(cm.as_ref(), &mut cs);
        let (ga, gids, gsteps) = prompt_and_greedy(gm.as_ref(), &mut gs);
        let v = cm.vocab_size();
        let mut rel_worst = 0f32;
        for (g, c) in ga
            .chunks(v)
            .zip(ca.chunks(v))
            .chain(gsteps.chunks(v).zip(csteps.chunks(v)))
        {
            rel_worst = rel_worst.max(rel_diff(g, c));
        }
        eprintln!("{label}: worst relative difference {rel_worst:.2e}, greedy {gids:?}");
        assert!(rel_worst < 1e-3, "{label}: {rel_worst}");
        assert_eq!(gids, cids, "{label}: greedy continuation");
        if rel_worst > worst.0 {
            worst = (rel_worst, label);
        }
    }
    eprintln!("worst over the fixtures: {:.2e} ({})", worst.0, worst.1);
}

#[test]
fn gpu_batch_of_sequences_equals_each_alone() {
    if !gpu() {
        return;
    }
    // passes of at most 8 rows in all: the direct product kernels, whose rows do not depend
    // on each other (more rows take cuBLAS, whose order depends on the row count)
    // the MLA, KDA, K3 and GPT-OSS fixtures: each sequence's latent rows or recurrent state
    // in its own slot on the device
    for rel in [
        "hf/qwen3_moe",
        "gguf/mixtral/mixtral-q4_0.gguf",
        "hf/llama",
        "hf/deepseek_v3",
        "hf/kimi_linear",
        "hf/kimi_k3",
        "hf/gpt_oss",
    ] {
        let (m, mut s) = load(rel, DeviceKind::Cuda(0));
        let v = m.vocab_size();
        let seqs = [
            (ids(11, 3, v), Logits::Last),
            (ids(23, 4, v), Logits::All),
            (ids(41, 1, v), Logits::Last),
        ];
        let mut alone = Vec::new();
        for (t, which) in &seqs {
            let mut c = m.new_cache(N_CTX);
            let a = m.forward(&mut s, &mut c, t, *which).unwrap();
            let b = m.forward(&mut s, &mut c, &[5], Logits::Last).unwrap();
            alone.push((a, b));
        }
        let mut caches: Vec<KvCache> = seqs.iter().map(|_| m.new_cache(N_CTX)).collect();
        let mut batch: Vec<SeqPass> = caches
            .iter_mut()
            .zip(&seqs)
            .map(|(c, (t, w))| SeqPass::new(c, t, *w))
            .collect();
        let together = m.forward_batch(&mut s, &mut batch).unwrap();
        drop(batch);
        let five = [5u32];
        let mut step: Vec<SeqPass> = caches
            .iter_mut()
            .map(|c| SeqPass::new(c, &five, Logits::Last))
            .collect();
        let after = m.forward_batch(&mut s, &mut step).unwrap();
        for (i, (a, b)) in alone.iter().enumerate() {
            assert!(
                bits(&together[i]) == bits(a),
                "{rel}: sequence {i} in the batch"
            );
            assert!(
                bits(&after[i]) == bits(b),
                "{rel}: sequence {i}'s next step"
            );
        }
        eprintln!("{rel}: batch == alone on the GPU");
    }
}

#[test]
fn gpu_streamed_experts_equal_resident_experts() {
    if !gpu() {
        return;
    }
    for rel in ["hf/qwen3_moe", "gguf/qwen3_moe/qwen3_moe-q5_0.gguf"] {
        let (rm, mut rs) = load(rel, DeviceKind::Cuda(0));
        // the smallest budget the model loads under: the experts read from disk
        let (mut lo, mut hi) = (1u64, 16384u64);
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            match load_path(&fixture(rel), &opts(DeviceKind::Cuda(0), Some(mid * 4096))) {
                Ok(_) => hi = mid,
                Err(_) => lo = mid,
            }
        }
        let (sm, mut ss) =
            load_path(&fixture(rel), &opts(DeviceKind::Cuda(0), Some(hi * 4096))).unwrap();
        assert!(ss.experts().is_some(), "{}", sm.placement().summary);
        let (ra, rids, rsteps) = prompt_and_greedy(rm.as_ref(), &mut rs);
        let (sa, sids, ssteps) = prompt_and_greedy(sm.as_ref(), &mut ss);
        // the prompt's head may be streamed in chunks: cuBLAS may order a chunk's sums
        // otherwise than the whole head's; every layer (and so the cache) is the same
        let prompt = rel_diff(&sa, &ra);
        assert!(prompt < 1e-5, "{rel}: prompt logits {prompt}");
        assert!(bits(&rsteps) == bits(&ssteps), "{rel}: decode logits");
        assert_eq!(rids, sids, "{rel}");
        eprintln!("{rel}: streamed == resident on the GPU");
    }
}
