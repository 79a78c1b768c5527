//! The expert store under the families that re-encode their experts or mix routed experts with
//! dense layers and shared experts: `deepseek_v3` (bf16, and FP8 repacked into `F8_E4M3_B128`
//! rows as each read lands), `gpt_oss` (BF16, and Hugging Face MXFP4 repacked into GGML blocks
//! as each read lands) and their GGUF conversions (`deepseek2` f32/q8_0 and `gpt-oss`
//! f32/mxfp4_moe, used as stored), on the committed fixtures:
//! - logits bit-identical to everything resident with no weight resident under every cache
//!   policy, and with a cache holding a few experts (so hits compute on re-encoded bytes);
//! - one decode step: exactly `k` misses per MoE layer and none in the dense layer, the chosen
//!   experts' bytes and one read per range; the same step again: every use a hit, nothing
//!   read, the cache charged one re-encoded buffer per expert;
//! - with prefetch on and the spine resident: logits bit-identical to everything resident,
//!   guesses read and used, and every guess read either used or counted as waste;
//! - a file truncated mid-run: the pass fails naming the file and the (layer, expert);
//! - `deltafin run --stats` showing the expert store.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use common::gguf::load_path;
use deltafin::engine::Session;
use deltafin::models::{LoadOptions, Logits, Model};
use deltafin::store::{CachePolicy, ExpertStoreOptions, PrefetchMode, Unit, WeightStore, IO_ALIGN};

/// (label, path under tests/fixtures).
const FIXTURES: [(&str, &str); 8] = [
    ("deepseek_v3 bf16", "hf/deepseek_v3"),
    ("deepseek_v3 fp8", "hf/deepseek_v3_fp8"),
    ("gpt_oss bf16", "hf/gpt_oss"),
    ("gpt_oss mxfp4", "hf/gpt_oss_mxfp4"),
    ("deepseek2 f32", "gguf/deepseek_v3/deepseek_v3-f32.gguf"),
    ("deepseek2 q8_0", "gguf/deepseek_v3/deepseek_v3-q8_0.gguf"),
    ("gpt-oss f32", "gguf/gpt_oss/gpt_oss-f32.gguf"),
    ("gpt-oss mxfp4_moe", "gguf/gpt_oss/gpt_oss-mxfp4_moe.gguf"),
];

const PROMPT: [u32; 10] = [17, 300, 42, 99, 5, 256, 411, 3, 77, 128];
const N_CTX: usize = 64;

/// The fixtures' MoE shape.
struct Shape {
    layers: usize,
    /// The first MoE layer (deepseek_v3: `first_k_dense_replace` = 1).
    first_moe: usize,
    moe_layers: usize,
    experts: usize,
    k: usize,
}

fn shape(rel: &str) -> Shape {
    match rel.contains("deepseek") {
        true => Shape {
            layers: 3,
            first_moe: 1,
            moe_layers: 2,
            experts: 8,
            k: 2,
        },
        false => Shape {
            layers: 2,
            first_moe: 0,
            moe_layers: 2,
            experts: 8,
            k: 2,
        },
    }
}

impl Shape {
    /// The store unit of expert `e` of layer `l`: the spine units (one per layer) come first,
    /// then every MoE layer's experts in order.
    fn unit(&self, l: usize, e: usize) -> usize {
        self.layers + (l - self.first_moe) * self.experts + e
    }
}

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

fn opts(budget: Option<u64>, cache: CachePolicy, n_batch: usize) -> LoadOptions {
    LoadOptions {
        ram_budget: budget,
        n_ctx: N_CTX,
        n_batch,
        direct_io: true,
        experts: ExpertStoreOptions {
            cache,
            ..Default::default()
        },
        mtp: false,
        numerics: Default::default(),
        device: Default::default(),
    }
}

fn session(path: &Path, budget: Option<u64>, cache: CachePolicy) -> Session {
    let (m, s) = load_path(path, &opts(budget, cache, N_CTX)).unwrap();
    Session::new(m, s, N_CTX, N_CTX)
}

/// The smallest budget (in 4 KiB steps, below 64 MiB) under which the model loads and `ok`
/// holds; `ok` must hold for every larger budget too.
fn first_budget(path: &Path, n_batch: usize, ok: impl Fn(&dyn Model, &WeightStore) -> bool) -> u64 {
    let ok_at =
        |pages: u64| match load_path(path, &opts(Some(pages * 4096), CachePolicy::None, n_batch)) {
            Ok((m, s)) => ok(m.as_ref(), &s),
            Err(e) => {
                assert!(e.to_string().contains("is too small"), "{e}");
                false
            }
        };
    let (mut lo, mut hi) = (0u64, 16384u64);
    assert!(ok_at(hi), "{}: no budget works", path.display());
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if ok_at(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi * 4096
}

/// The smallest budget the model loads under: nothing resident, the experts read on demand.
fn smallest(path: &Path, n_batch: usize) -> u64 {
    let b = first_budget(path, n_batch, |_, _| true);
    let (m, s) = load_path(path, &opts(Some(b), CachePolicy::None, n_batch)).unwrap();
    assert_eq!(m.placement().resident_bytes, 0, "{}", m.placement().summary);
    assert!(s.experts().is_some(), "{}", m.placement().summary);
    b
}

/// The smallest budget holding every weight but the routed experts (spine, LM head and
/// embeddings resident), with the experts read on demand.
fn spine_resident(path: &Path, sh: &Shape) -> u64 {
    let full = load_path(path, &opts(None, CachePolicy::None, N_CTX))
        .unwrap()
        .1
        .len();
    let n_experts = sh.moe_layers * sh.experts;
    let b = first_budget(path, N_CTX, |_, s| {
        let streamed = (0..s.len()).filter(|&i| !s.is_resident(i)).count();
        // a streamed embedding has no unit, a streamed head has chunks
        s.len() == full && streamed == if s.experts().is_some() { n_experts } else { 0 }
    });
    let (m, s) = load_path(path, &opts(Some(b), CachePolicy::None, N_CTX)).unwrap();
    assert!(s.experts().is_some(), "{}", m.placement().summary);
    b
}

/// `(smallest(path, N_CTX), spine_resident(path))` of fixture `rel`, found once per test
/// binary.
fn budgets(rel: &str) -> (u64, u64) {
    static FOUND: OnceLock<Mutex<HashMap<String, (u64, u64)>>> = OnceLock::new();
    let m = FOUND.get_or_init(Default::default);
    if let Some(&b) = m.lock().unwrap().get(rel) {
        return b;
    }
    let p = fixture(rel);
    let b = (smallest(&p, N_CTX), spine_resident(&p, &shape(rel)));
    m.lock().unwrap().insert(rel.to_string(), b);
    b
}

/// Prompt logits (every position) and 3 greedy decode steps' logits.
fn run(s: &mut Session) -> Vec<f32> {
    common::prompt_and_greedy_logits(s, &PROMPT, 3)
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// The cache's charge per expert: one I/O buffer (sized for the larger of the read and the
/// re-encoded expert).
fn charge(s: &Session, sh: &Shape) -> u64 {
    (s.store.experts().unwrap().io_buffer_bytes() / sh.k) as u64
}

#[test]
fn streamed_logits_equal_resident_logits_under_every_cache_policy() {
    for (name, rel) in FIXTURES {
        let (p, sh) = (fixture(rel), shape(rel));
        let mut r = session(&p, None, CachePolicy::LfuDa);
        assert!(r.store.experts().is_none(), "{name}: all resident");
        let want = run(&mut r);
        assert_eq!(want.len(), (PROMPT.len() + 3) * r.model.vocab_size());
        let (lo, spine) = budgets(rel);
        let c = charge(&session(&p, Some(spine), CachePolicy::LfuDa), &sh);
        // a cache of 3 experts of the 16: experts are evicted and read again
        let cached = spine + 3 * c;
        for (b, cache) in [
            (lo, CachePolicy::None),
            (lo, CachePolicy::Lru),
            (lo, CachePolicy::LfuDa),
            (cached, CachePolicy::Lru),
            (cached, CachePolicy::LfuDa),
        ] {
            let mut s = session(&p, Some(b), cache);
            let got = run(&mut s);
            assert!(same_bits(&got, &want), "{name}: budget {b}, {cache}");
            let es = s.store.experts().expect("experts read on demand");
            let n = es.counters();
            assert!(es.cache().used() <= es.cache().budget());
            if b == cached {
                // the cache took experts (re-encoded) and kept at most 3
                assert!(es.cache().budget() >= 3 * c as usize, "{name}");
                assert!(
                    es.cache().used() > 0 && es.cache().len() <= 3,
                    "{name} {cache}"
                );
                eprintln!("{name} {cache}: {} hits, {} misses", n.hits, n.misses);
            } else {
                assert_eq!(n.hits, 0, "{name} {cache}: no room for an expert");
            }
        }
    }
}

/// Bytes the expert store reads for `u`: every range's 4 KiB-aligned span, cut at the end of
/// its file.
fn read_bytes(u: &Unit, file_len: &dyn Fn(usize) -> u64) -> u64 {
    let a = IO_ALIGN as u64;
    u.ranges
        .iter()
        .map(|r| {
            let start = r.offset / a * a;
            let end = (r.offset + r.len as u64).div_ceil(a) * a;
            end.min(file_len(r.file)) - start
        })
        .sum()
}

/// Reads the expert store issues for `u`: one per run of ranges whose aligned spans touch
/// (same file, each span starting where the last ended), none here exceeding 1 MiB.
fn reads(u: &Unit) -> u64 {
    let a = IO_ALIGN as u64;
    let mut n = 0;
    let mut last: Option<(usize, u64)> = None;
    for r in &u.ranges {
        let (start, end) = (r.offset / a * a, (r.offset + r.len as u64).div_ceil(a) * a);
        if last != Some((r.file, start)) {
            n += 1;
        }
        last = Some((r.file, end));
    }
    n
}

#[test]
fn one_decode_step_reads_exactly_the_chosen_experts_and_a_repeat_hits() {
    for (name, rel) in FIXTURES {
        let (p, sh) = (fixture(rel), shape(rel));
        let n_uses = (sh.moe_layers * sh.k) as u64;
        // no cache: every use of one decode step is read
        let (lo, spine) = budgets(rel);
        let mut s = session(&p, Some(lo), CachePolicy::None);
        s.prefill(&PROMPT, Logits::Last).unwrap();
        let es = s.store.experts().unwrap();
        let (h0, c0) = (es.heat().counts.clone(), es.counters());
        s.model
            .forward(&mut s.store, &mut s.cache, &[7], Logits::Last)
            .unwrap();
        let es = s.store.experts().unwrap();
        let (h1, c1) = (es.heat().counts.clone(), es.counters());
        assert_eq!(h1.len(), sh.layers, "{name}: one heat row per layer");
        let mut chosen = Vec::new();
        for l in 0..sh.layers {
            let used: Vec<usize> = (0..h1[l].len()).filter(|&e| h1[l][e] > h0[l][e]).collect();
            assert!(h1[l].iter().zip(&h0[l]).all(|(a, b)| a - b <= 1));
            let moe = (sh.first_moe..sh.first_moe + sh.moe_layers).contains(&l);
            // k routed experts per MoE layer; the dense layer and the shared experts read none
            assert_eq!(used.len(), if moe { sh.k } else { 0 }, "{name}: layer {l}");
            chosen.extend(used.iter().map(|&e| s.store.unit(sh.unit(l, e)).clone()));
        }
        let files = es.engine().files();
        let file_len = |f: usize| files[f].len();
        let bytes: u64 = chosen.iter().map(|u| read_bytes(u, &file_len)).sum();
        let n_reads: u64 = chosen.iter().map(reads).sum();
        assert_eq!(c1.misses - c0.misses, n_uses, "{name}: misses");
        assert_eq!(c1.hits - c0.hits, 0, "{name}: hits");
        assert_eq!(c1.bytes - c0.bytes, bytes, "{name}: bytes");
        assert_eq!(c1.reads - c0.reads, n_reads, "{name}: reads");
        // the budget charged the store's I/O buffers, plus the one a re-encoding keeps
        let io = s.model.placement().stream_buffer_bytes - s.store.stream_buffer_bytes();
        let reencoded = rel.ends_with("_fp8") || rel.ends_with("_mxfp4");
        let kept = if reencoded {
            es.io_buffer_bytes() / sh.k
        } else {
            0
        };
        assert_eq!(io, es.io_buffer_bytes() + kept, "{name}: I/O buffers");

        // a cache with room for one step's experts: the same step again only hits
        let c = charge(&session(&p, Some(spine), CachePolicy::LfuDa), &sh);
        let b = spine + n_uses * c;
        let mut s = session(&p, Some(b), CachePolicy::LfuDa);
        let step = |s: &mut Session| {
            s.cache = s.model.new_cache(N_CTX);
            s.model
                .forward(&mut s.store, &mut s.cache, &[7], Logits::Last)
                .unwrap()
        };
        let c0 = s.store.experts().unwrap().counters();
        let first = step(&mut s);
        let c1 = s.store.experts().unwrap().counters();
        let again = step(&mut s);
        let es = s.store.experts().unwrap();
        let c2 = es.counters();
        assert_eq!(
            (c1.misses - c0.misses, c1.hits - c0.hits),
            (n_uses, 0),
            "{name}"
        );
        assert_eq!(
            (c2.misses - c1.misses, c2.hits - c1.hits),
            (0, n_uses),
            "{name}"
        );
        assert_eq!((c2.bytes - c1.bytes, c2.reads - c1.reads), (0, 0), "{name}");
        // the cache holds the chosen experts, each charged one (re-encoded) buffer
        assert_eq!(es.cache().len() as u64, n_uses, "{name}");
        assert_eq!(es.cache().used() as u64, n_uses * c, "{name}");
        assert!(
            same_bits(&first, &again),
            "{name}: a hit computes what a miss did"
        );
        let mut r = session(&p, None, CachePolicy::None);
        assert!(same_bits(&first, &step(&mut r)), "{name}: resident");
    }
}

#[test]
fn prefetch_changes_no_logit_and_every_guess_is_used_or_counted_as_waste() {
    for (name, rel) in FIXTURES {
        let (p, sh) = (fixture(rel), shape(rel));
        let want = run(&mut session(&p, None, CachePolicy::None));
        let spine = budgets(rel).1;
        let off = {
            let mut s = session(&p, Some(spine), CachePolicy::None);
            assert!(!s.store.experts().unwrap().prefetch_enabled(), "{name}");
            run(&mut s);
            s.store.experts().unwrap().counters()
        };
        // prefetch takes as many I/O buffers again as the demand reads (k)
        let extra = session(&p, Some(spine), CachePolicy::None)
            .store
            .experts()
            .unwrap()
            .io_buffer_bytes() as u64;
        let mut o = opts(Some(spine + extra), CachePolicy::None, N_CTX);
        o.experts.prefetch = PrefetchMode::On;
        let (m, st) = load_path(&p, &o).unwrap();
        let mut s = Session::new(m, st, N_CTX, N_CTX);
        let streamed = (0..s.store.len())
            .filter(|&i| !s.store.is_resident(i))
            .count();
        assert_eq!(
            streamed,
            sh.moe_layers * sh.experts,
            "{name}: spine resident"
        );
        assert!(s.store.experts().unwrap().prefetch_enabled(), "{name}");
        let got = run(&mut s);
        assert!(
            same_bits(&got, &want),
            "{name}: logits differ with prefetch"
        );
        let es = s.store.experts_mut().unwrap();
        // the last pass guessed the first MoE layer of a next pass that never comes
        assert!(es.prefetch_outstanding() > 0, "{name}");
        es.settle().unwrap();
        assert_eq!(es.prefetch_outstanding(), 0, "{name}");
        assert_eq!(es.engine().outstanding(), 0, "{name}");
        let c = es.counters();
        eprintln!(
            "{name}: {} guesses read, {} used, {} wasted, {} misses",
            c.prefetch_reads, c.prefetch_hits, c.prefetch_wasted, c.misses
        );
        assert!(c.prefetch_reads > 0 && c.prefetch_hits > 0, "{name}: {c:?}");
        assert_eq!(
            c.prefetch_reads,
            c.prefetch_hits + c.prefetch_wasted,
            "{name}: {c:?}"
        );
        // the same uses as without prefetch; the extra bytes are exactly the wasted guesses
        assert_eq!((c.hits, c.misses), (off.hits, off.misses), "{name}");
        assert!(c.prefetch_hits <= c.misses, "{name}: {c:?}");
        assert_eq!(
            c.bytes,
            off.bytes + c.prefetch_wasted_bytes,
            "{name}: {c:?}"
        );
    }
}

#[test]
fn a_file_truncated_mid_run_fails_naming_the_file_and_the_expert() {
    for (name, rel) in FIXTURES {
        let (src, sh) = (fixture(rel), shape(rel));
        let dir = tempfile::tempdir().unwrap();
        let (model, file) = if src.is_dir() {
            for e in std::fs::read_dir(&src).unwrap() {
                let e = e.unwrap();
                std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
            }
            (
                dir.path().to_path_buf(),
                dir.path().join("model.safetensors"),
            )
        } else {
            let f = dir.path().join(src.file_name().unwrap());
            std::fs::copy(&src, &f).unwrap();
            (f.clone(), f)
        };
        // everything but the experts resident (read at load), so only expert reads touch the
        // file after the cut
        // (the copy's budgets are the fixture's)
        let mut s = session(&model, Some(budgets(rel).1), CachePolicy::None);
        s.prefill(&PROMPT[..3], Logits::Last).unwrap();
        let cut = (0..sh.moe_layers * sh.experts)
            .flat_map(|i| s.store.unit(sh.layers + i).ranges.clone())
            .map(|r| r.offset)
            .min()
            .unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&file)
            .unwrap()
            .set_len(cut)
            .unwrap();
        let fname = file.file_name().unwrap().to_str().unwrap();
        for _ in 0..2 {
            // the next pass fails the same way: nothing hangs, nothing is left in flight
            let e = format!("{:#}", s.prefill(&PROMPT[3..], Logits::Last).unwrap_err());
            assert!(
                e.contains(fname)
                    && e.contains("short read")
                    && e.contains("(expert ")
                    && e.contains(&format!(" of layer {})", sh.first_moe)),
                "{name}: {e}"
            );
        }
        assert_eq!(s.store.experts().unwrap().engine().outstanding(), 0);
    }
}

#[test]
fn run_stats_show_the_expert_store() {
    for rel in [
        "hf/deepseek_v3_fp8",
        "hf/gpt_oss_mxfp4",
        "gguf/deepseek_v3/deepseek_v3-q8_0.gguf",
        "gguf/gpt_oss/gpt_oss-mxfp4_moe.gguf",
    ] {
        let p = fixture(rel);
        // the CLI's batch is 1 with `-b 1`, so the same budget applies
        let b = smallest(&p, 1).to_string();
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_deltafin"))
            .args(["run", "-m"])
            .arg(&p)
            .args([
                "-p", "hello", "-n", "3", "--temp", "0", "-c", "64", "-b", "1",
            ])
            .args(["--ram-budget", &b, "--heat-file", "none", "--stats"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{rel}: {err}");
        // no cache room at the smallest budget: every use of a decode token is read,
        // 2 MoE layers × top-2
        for want in [
            "experts read on demand through ",
            "--- experts ---",
            "hit rate             0.0% decode (0 hits, 8 misses)",
            "expert reads / token 4.0",
        ] {
            assert!(err.contains(want), "{rel}: missing {want:?} in\n{err}");
        }
    }
}
