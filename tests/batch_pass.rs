//! One forward pass over several sequences (`Model::forward_batch`), for every family: three
//! sequences at different positions (a decode step at position 7, a 5-token prompt at 0, two
//! tokens at 3) give, in one pass, each sequence's logits alone bit for bit, and so does the
//! decode step after it over the caches the batch wrote. With the routed experts read from
//! disk (no expert cache, no prefetch), a MoE layer reads the union of the sequences' experts
//! once: the batch's expert reads are exactly that union, counted by the store.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::gguf::load_path;
use deltafin::models::{KvCache, LoadOptions, Logits, Model, SeqPass};
use deltafin::store::{CachePolicy, ExpertStoreOptions, PrefetchMode, WeightStore};

const N_CTX: usize = 32;

/// (label, fixture under tests/fixtures or `None` for the demo model, whether it has
/// routed experts).
const CASES: [(&str, Option<&str>, bool); 11] = [
    ("gemma3 (demo GGUF, q4_k_m)", None, false),
    ("qwen3", Some("hf/qwen3"), false),
    ("llama", Some("hf/llama"), false),
    ("qwen3_moe", Some("hf/qwen3_moe"), true),
    ("mixtral", Some("hf/mixtral"), true),
    ("gpt_oss", Some("hf/gpt_oss"), true),
    ("deepseek_v3", Some("hf/deepseek_v3"), true),
    ("kimi_linear", Some("hf/kimi_linear"), true),
    ("kimi_k3", Some("hf/kimi_k3"), true),
    (
        "deepseek2 q8_0 GGUF",
        Some("gguf/deepseek_v3/deepseek_v3-q8_0.gguf"),
        true,
    ),
    (
        "qwen3moe q5_0 GGUF",
        Some("gguf/qwen3_moe/qwen3_moe-q5_0.gguf"),
        true,
    ),
];

fn path(rel: Option<&str>) -> PathBuf {
    match rel {
        Some(r) => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(r),
        None => common::demo_gguf(),
    }
}

fn opts(budget: Option<u64>) -> LoadOptions {
    LoadOptions {
        ram_budget: budget,
        n_ctx: N_CTX,
        n_batch: N_CTX,
        direct_io: true,
        experts: ExpertStoreOptions {
            cache: CachePolicy::None,
            prefetch: PrefetchMode::Off,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The model with its routed experts read from disk when it has any (the smallest budget it
/// loads under, found by bisection), else every weight resident.
fn load(p: &Path, moe: bool) -> (Box<dyn Model>, WeightStore) {
    if !moe {
        return load_path(p, &opts(None)).unwrap();
    }
    let (mut lo, mut hi) = (1u64, 16384u64); // 4 KiB pages
    assert!(load_path(p, &opts(Some(hi * 4096))).is_ok());
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        match load_path(p, &opts(Some(mid * 4096))) {
            Ok(_) => hi = mid,
            Err(_) => lo = mid,
        }
    }
    let (m, s) = load_path(p, &opts(Some(hi * 4096))).unwrap();
    assert!(s.experts().is_some(), "{}", m.placement().summary);
    (m, s)
}

/// `n` token ids inside a vocabulary of `vocab`, starting from `seed`.
fn ids(seed: u32, n: usize, vocab: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (seed + 977 * i + 31 * i * i) % vocab as u32)
        .collect()
}

/// The (layer, expert) pairs the store's heat counts grew by since `before`.
fn used_since(store: &WeightStore, before: &[Vec<u64>]) -> BTreeSet<(usize, usize)> {
    let Some(es) = store.experts() else {
        return BTreeSet::new();
    };
    let mut set = BTreeSet::new();
    for (l, row) in es.heat().counts.iter().enumerate() {
        for (e, &c) in row.iter().enumerate() {
            match c - before[l][e] {
                0 => {}
                1 => {
                    set.insert((l, e));
                }
                k => panic!("expert ({l}, {e}) used by {k} reads in one pass"),
            }
        }
    }
    set
}

fn heat(store: &WeightStore) -> Vec<Vec<u64>> {
    store
        .experts()
        .map(|es| es.heat().counts.clone())
        .unwrap_or_default()
}

fn misses(store: &WeightStore) -> u64 {
    store.experts().map_or(0, |es| es.counters().misses)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// One sequence's history before the batch, its tokens in the batch, and what it returns.
struct Case {
    prefix: Vec<u32>,
    tokens: Vec<u32>,
    logits: Logits,
}

#[test]
fn a_batch_of_sequences_at_different_positions_equals_each_alone() {
    for (label, rel, moe) in CASES {
        let (model, mut store) = load(&path(rel), moe);
        let v = model.vocab_size();
        let seqs = [
            Case {
                prefix: ids(11, 7, v),
                tokens: ids(5, 1, v),
                logits: Logits::Last,
            },
            Case {
                prefix: vec![],
                tokens: ids(23, 5, v),
                logits: Logits::All,
            },
            Case {
                prefix: ids(41, 3, v),
                tokens: ids(9, 2, v),
                logits: Logits::Last,
            },
        ];
        let next = ids(3, seqs.len(), v);

        // each alone: its prefix, its pass (the experts it uses), one decode step
        let mut alone = Vec::new();
        let mut union = BTreeSet::new();
        let mut alone_misses = 0;
        for (i, c) in seqs.iter().enumerate() {
            let mut cache = model.new_cache(N_CTX);
            if !c.prefix.is_empty() {
                model
                    .forward(&mut store, &mut cache, &c.prefix, Logits::Last)
                    .unwrap();
            }
            let (h0, m0) = (heat(&store), misses(&store));
            let l = model
                .forward(&mut store, &mut cache, &c.tokens, c.logits)
                .unwrap();
            let used = used_since(&store, &h0);
            assert_eq!(
                misses(&store) - m0,
                used.len() as u64,
                "{label}: sequence {i} alone"
            );
            alone_misses += used.len() as u64;
            union.extend(used);
            let d = model
                .forward(&mut store, &mut cache, &next[i..i + 1], Logits::Last)
                .unwrap();
            alone.push((l, d));
        }

        // together: the prefixes first (one batch of the two non-empty ones), then the three
        let mut caches: Vec<KvCache> = seqs.iter().map(|_| model.new_cache(N_CTX)).collect();
        {
            let mut pre: Vec<SeqPass> = caches
                .iter_mut()
                .zip(&seqs)
                .filter(|(_, c)| !c.prefix.is_empty())
                .map(|(k, c)| SeqPass::new(k, &c.prefix, Logits::Last))
                .collect();
            model.forward_batch(&mut store, &mut pre).unwrap();
        }
        assert_eq!(
            caches.iter().map(|c| c.len).collect::<Vec<_>>(),
            vec![7, 0, 3],
            "{label}"
        );
        let (h0, m0) = (heat(&store), misses(&store));
        let mut batch: Vec<SeqPass> = caches
            .iter_mut()
            .zip(&seqs)
            .map(|(k, c)| SeqPass::new(k, &c.tokens, c.logits))
            .collect();
        let together = model.forward_batch(&mut store, &mut batch).unwrap();
        drop(batch);
        let used = used_since(&store, &h0);
        let batch_misses = misses(&store) - m0;
        assert_eq!(
            used, union,
            "{label}: the batch uses the union of the experts"
        );
        assert_eq!(
            batch_misses,
            union.len() as u64,
            "{label}: each expert read once"
        );
        if moe {
            assert!(
                batch_misses < alone_misses,
                "{label}: sequences share experts"
            );
        }
        assert_eq!(
            caches.iter().map(|c| c.len).collect::<Vec<_>>(),
            vec![8, 5, 5],
            "{label}"
        );
        let mut step: Vec<SeqPass> = caches
            .iter_mut()
            .enumerate()
            .map(|(i, k)| SeqPass::new(k, &next[i..i + 1], Logits::Last))
            .collect();
        let after = model.forward_batch(&mut store, &mut step).unwrap();

        assert_eq!(together.len(), 3, "{label}");
        for (i, (l, d)) in alone.iter().enumerate() {
            let rows = if i == 1 { 5 } else { 1 };
            assert_eq!(together[i].len(), rows * v, "{label}: sequence {i}");
            assert!(
                bits(&together[i]) == bits(l),
                "{label}: sequence {i}'s logits in the batch"
            );
            assert!(
                bits(&after[i]) == bits(d),
                "{label}: sequence {i}'s next step"
            );
        }
        eprintln!(
            "{label}: {} expert reads for the batch, {alone_misses} for the three alone",
            union.len()
        );
    }
}

#[test]
fn a_batch_refuses_bad_input_before_reading_and_grows_no_cache() {
    let (model, mut store) = load(&path(Some("hf/qwen3_moe")), true);
    let v = model.vocab_size() as u32;
    let (mut a, mut b) = (model.new_cache(N_CTX), model.new_cache(N_CTX));
    let read0 = store.stats().snapshot().0;
    let err = model.forward_batch(&mut store, &mut []).unwrap_err();
    assert_eq!(err.to_string(), "forward pass over zero sequences");
    let (ok, bad) = ([1u32, 2], [3u32, v]);
    let mut batch = [
        SeqPass::new(&mut a, &ok, Logits::Last),
        SeqPass::new(&mut b, &bad, Logits::Last),
    ];
    let err = model.forward_batch(&mut store, &mut batch).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("token id {v} is outside the vocabulary of {v} tokens")
    );
    let mut batch = [
        SeqPass::new(&mut a, &ok, Logits::Last),
        SeqPass::new(&mut b, &[], Logits::Last),
    ];
    let err = model.forward_batch(&mut store, &mut batch).unwrap_err();
    assert_eq!(err.to_string(), "forward pass over zero tokens");
    assert_eq!((a.len, b.len), (0, 0));
    assert_eq!(store.stats().snapshot().0, read0, "nothing read");
}
