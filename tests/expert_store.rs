//! The expert store on a tiny synthetic qwen3_moe checkpoint (`deltafin synth --preset tiny`:
//! 3 layers, 16 experts of 12 KiB, top-4), written on the fly: logits bit-identical to
//! everything resident under every cache policy and both read engines, exact read counts,
//! the heat file, and failures (missing file, short file, I/O error mid-run) that name the
//! file and the (layer, expert) without hanging.

mod common;

use std::path::Path;

use deltafin::engine::Session;
use deltafin::models::{load_hf_model, LoadOptions, Logits};
use deltafin::source::hf::HfModel;
use deltafin::store::{CachePolicy, EngineChoice, ExpertStoreOptions, IoOptions, PrefetchMode};
use deltafin::write::synth::{presets, write_qwen3_moe};

const PROMPT: [u32; 10] = [17, 300, 42, 99, 5, 256, 411, 3, 77, 128];
const DECODE: usize = 6;

fn tiny() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let shape = presets()[0].2.clone();
    // ~200 kB shards: the embeddings, then each layer, then the head in files of their own
    write_qwen3_moe(&shape, dir.path(), 200_000, 3, &mut |_, _| {}).unwrap();
    dir
}

fn opts(budget: Option<u64>, cache: CachePolicy, engine: EngineChoice, req: usize) -> LoadOptions {
    LoadOptions {
        ram_budget: budget,
        n_ctx: 64,
        n_batch: 64,
        direct_io: true,
        experts: ExpertStoreOptions {
            cache,
            io: IoOptions {
                engine,
                depth: 4,
                request_bytes: req,
                ..IoOptions::default()
            },
            heat_file: None,
            verify: false,
            ..ExpertStoreOptions::default()
        },
        mtp: false,
        numerics: Default::default(),
        device: Default::default(),
    }
}

fn session(dir: &Path, o: &LoadOptions) -> Session {
    let hf = HfModel::open(dir).unwrap();
    let (m, s) = load_hf_model(&hf, o).unwrap();
    Session::new(m, s, 64, 64)
}

/// Prompt logits (every position) and the logits of `DECODE` greedy steps.
fn logits(s: &mut Session) -> Vec<f32> {
    common::prompt_and_greedy_logits(s, &PROMPT, DECODE)
}

/// 800 KiB: the spine and head resident, an expert cache of 0.2 MiB (about 13 of the 48
/// experts), so experts are evicted and read again.
const BUDGET: u64 = 800 << 10;
/// 900 KiB: an expert cache of 0.3 MiB, room for the 12 experts one token uses.
const ROOMY: u64 = 900 << 10;

#[test]
fn logits_are_bit_identical_under_every_policy_and_engine() {
    let dir = tiny();
    let want = logits(&mut session(
        dir.path(),
        &opts(None, CachePolicy::LfuDa, EngineChoice::Auto, 1 << 20),
    ));
    assert_eq!(want.len(), (PROMPT.len() + DECODE) * 512);
    for cache in [CachePolicy::None, CachePolicy::Lru, CachePolicy::LfuDa] {
        for engine in [EngineChoice::Auto, EngineChoice::Pool] {
            for req in [4096, 1 << 20] {
                let mut s = session(dir.path(), &opts(Some(BUDGET), cache, engine, req));
                let es = s.store.experts().expect("experts read on demand");
                let backend = es.engine().backend_name();
                if engine == EngineChoice::Pool {
                    assert_eq!(backend, "pread-pool");
                }
                let got = logits(&mut s);
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{cache} {backend} request {req}: logits differ");
            }
        }
    }
}

#[test]
fn without_a_cache_every_use_is_one_read_of_the_expert() {
    let dir = tiny();
    for (req, per_expert) in [(1 << 20, 1u64), (4096, 0)] {
        let mut s = session(
            dir.path(),
            &opts(Some(BUDGET), CachePolicy::None, EngineChoice::Auto, req),
        );
        s.prefill(&PROMPT, Logits::Last).unwrap();
        let c0 = s.store.experts().unwrap().counters();
        s.model
            .forward(&mut s.store, &mut s.cache, &[7], Logits::Last)
            .unwrap();
        let c1 = s.store.experts().unwrap().counters();
        // one token: 3 MoE layers × top-4 distinct experts, all misses
        assert_eq!(c1.hits - c0.hits, 0);
        assert_eq!(c1.misses - c0.misses, 12);
        let (bytes, reads) = (c1.bytes - c0.bytes, c1.reads - c0.reads);
        // each expert's 12 KiB (down, gate, up adjacent) is one range whose aligned span is
        // 12 or 16 KiB
        assert!((12 * 12288..=12 * 16384).contains(&bytes), "{bytes}");
        if per_expert == 1 {
            assert_eq!(reads, 12, "one read per expert");
        } else {
            // 3 or 4 pages per expert; only an expert ending its file reads a short last page
            assert!((36..=48).contains(&reads), "{reads}");
            assert!(
                bytes <= reads * 4096 && bytes > (reads - 12) * 4096,
                "{bytes} {reads}"
            );
        }
    }
}

#[test]
fn a_cache_serves_repeated_experts_within_its_budget() {
    let dir = tiny();
    let run = |cache| {
        let mut s = session(
            dir.path(),
            &opts(Some(ROOMY), cache, EngineChoice::Auto, 1 << 20),
        );
        // the same token again and again routes to the same experts
        s.prefill(&PROMPT[..1], Logits::Last).unwrap();
        for _ in 0..4 {
            s.model
                .forward(&mut s.store, &mut s.cache, &[PROMPT[0]], Logits::Last)
                .unwrap();
        }
        let es = s.store.experts().unwrap();
        assert!(es.cache().used() <= es.cache().budget());
        es.counters()
    };
    let none = run(CachePolicy::None);
    assert_eq!((none.hits, none.misses), (0, 60));
    // a lone token at any position routes the same way (attention averages identical values),
    // so after the first pass's 12 misses every use hits
    for p in [CachePolicy::Lru, CachePolicy::LfuDa] {
        let c = run(p);
        assert_eq!((c.hits, c.misses), (48, 12), "{p}");
    }
}

#[test]
fn the_heat_file_counts_every_use_across_runs() {
    let dir = tiny();
    let heat = dir.path().join("heat.json");
    for _ in 0..2 {
        let mut o = opts(
            Some(BUDGET),
            CachePolicy::LfuDa,
            EngineChoice::Auto,
            1 << 20,
        );
        o.experts.heat_file = Some(heat.clone());
        let mut s = session(dir.path(), &o);
        s.prefill(&PROMPT, Logits::Last).unwrap();
        drop(s); // saves the heat
    }
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&heat).unwrap()).unwrap();
    let counts: Vec<Vec<u64>> = serde_json::from_value(v["counts"].clone()).unwrap();
    assert_eq!((counts.len(), counts[0].len()), (3, 16));
    // one batch per run: each layer's union counted once per run, so every count is 0 or 2,
    // and a 10-token batch with top-4 touches at least 4 experts per layer
    for row in &counts {
        assert!(row.iter().all(|&c| c == 0 || c == 2), "{row:?}");
        assert!(row.iter().filter(|&&c| c == 2).count() >= 4, "{row:?}");
    }
}

#[test]
fn cli_a_heat_file_that_cannot_be_saved_is_reported_without_flags() {
    let dir = tiny();
    // the heat file's path is a folder: loading ignores it and saving fails, both said on stderr
    let heat = dir.path().join("heat.json");
    std::fs::create_dir(&heat).unwrap();
    std::fs::write(heat.join("x"), "x").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_deltafin"))
        .args(["run", "-m"])
        .arg(dir.path())
        .args([
            "-p",
            "hello",
            "-n",
            "2",
            "--temp",
            "0",
            "--ram-budget",
            "800K",
        ])
        .args(["-c", "64", "--heat-file"])
        .arg(&heat)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let name = heat.display();
    assert!(
        err.contains(&format!(
            "ignoring the expert heat file: {name}: not a regular file"
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "could not save the expert heat file: {name}: not a regular file"
        )),
        "{err}"
    );
    let mut left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("heat.json"))
        .collect();
    left.sort();
    assert_eq!(
        left,
        ["heat.json", "heat.json.lock"],
        "no temporary file is left"
    );
}

#[test]
fn cli_a_shard_or_tokenizer_that_is_a_fifo_is_refused_by_name() {
    for name in [
        "model-00003-of-00005.safetensors",
        "tokenizer.json",
        "config.json",
    ] {
        let dir = tiny();
        let p = dir.path().join(name);
        std::fs::remove_file(&p).unwrap();
        common::mkfifo(&p);
        let o = common::output_or_kill(
            std::process::Command::new(env!("CARGO_BIN_EXE_deltafin"))
                .args(["run", "-p", "x", "-n", "1", "--heat-file", "none", "-m"])
                .arg(dir.path()),
        );
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{name}: {e}");
        assert!(
            e.contains(&format!("{}: not a regular file (a FIFO)", p.display())),
            "{name}: {e}"
        );
    }
}

fn layer_file(dir: &Path) -> std::path::PathBuf {
    // shard 3 holds layer 1 (shard 1: embeddings, 2: layer 0, 4: layer 2, 5: head)
    dir.join("model-00003-of-00005.safetensors")
}

#[test]
fn a_missing_file_is_named_at_load() {
    let dir = tiny();
    let hf = HfModel::open(dir.path()).unwrap();
    std::fs::remove_file(layer_file(dir.path())).unwrap();
    let e = match load_hf_model(
        &hf,
        &opts(
            Some(BUDGET),
            CachePolicy::LfuDa,
            EngineChoice::Auto,
            1 << 20,
        ),
    ) {
        Ok(_) => panic!("loading without a shard should fail"),
        Err(e) => format!("{e:#}"),
    };
    assert!(e.contains("model-00003-of-00005.safetensors"), "{e}");
}

#[test]
fn a_file_shorter_than_its_tensor_table_names_the_file_and_expert() {
    let dir = tiny();
    let hf = HfModel::open(dir.path()).unwrap();
    let p = layer_file(dir.path());
    let len = std::fs::metadata(&p).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(len - 5000)
        .unwrap();
    let e = match load_hf_model(
        &hf,
        &opts(
            Some(BUDGET),
            CachePolicy::LfuDa,
            EngineChoice::Auto,
            1 << 20,
        ),
    ) {
        Ok(_) => panic!("loading a short file should fail"),
        Err(e) => format!("{e:#}"),
    };
    // the last expert of layer 1 lies in the lost tail
    assert!(
        e.contains("model-00003-of-00005.safetensors")
            && e.contains("expert 15 of layer 1")
            && e.contains("shorter than its tensor table says"),
        "{e}"
    );
}

/// Layer 1's file loses every expert's bytes while a session runs (its resident spine was
/// read at load).
fn cut_layer_1_experts(dir: &Path) {
    let hf = HfModel::open(dir).unwrap();
    let first_expert = hf
        .tensors
        .iter()
        .find(|t| t.name == "model.layers.1.mlp.experts.0.down_proj.weight")
        .unwrap()
        .offset;
    std::fs::OpenOptions::new()
        .write(true)
        .open(layer_file(dir))
        .unwrap()
        .set_len(first_expert)
        .unwrap();
}

#[test]
fn an_io_error_mid_run_ends_the_pass_naming_file_and_expert_for_both_engines() {
    let cases = [EngineChoice::Auto, EngineChoice::Pool].map(|e| [(e, false), (e, true)]);
    for (engine, prefetch) in cases.into_iter().flatten() {
        let dir = tiny();
        let mut o = opts(Some(BUDGET), CachePolicy::None, engine, 4096);
        if prefetch {
            // a guess whose read fails is dropped; the demand read reports the error
            o = with_prefetch(o);
        }
        let mut s = session(dir.path(), &o);
        s.prefill(&PROMPT[..3], Logits::Last).unwrap();
        cut_layer_1_experts(dir.path());
        for _ in 0..2 {
            // the next pass fails the same way: nothing hangs, nothing is left in flight
            let e = format!("{:#}", s.prefill(&PROMPT[3..], Logits::Last).unwrap_err());
            assert!(
                e.contains("model-00003-of-00005.safetensors")
                    && e.contains("short read")
                    && e.contains("of layer 1"),
                "{engine:?}, prefetch {prefetch}: {e}"
            );
        }
        assert_eq!(s.store.experts().unwrap().engine().outstanding(), 0);
    }
}

#[test]
fn cli_stats_json_reports_the_engine_the_cache_and_per_token_reads() {
    let dir = tiny();
    let json = dir.path().join("stats.json");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_deltafin"))
        .args(["run", "-m"])
        .arg(dir.path())
        .args([
            "-p",
            "hello",
            "-n",
            "3",
            "--temp",
            "0",
            "--ram-budget",
            "800K",
            "-c",
            "64",
            "--cache",
            "none",
            "--io-engine",
            "pool",
            "--heat-file",
            "none",
            "--prefetch",
            "off",
            "--stats-json",
        ])
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let e = &v["experts"];
    assert_eq!(e["backend"], "pread-pool");
    assert_eq!(e["cache_policy"], "none");
    // 3 generated tokens: 2 decode passes of 12 misses each, one read per expert
    assert_eq!(e["decode"]["misses"], 24);
    assert_eq!(e["decode"]["hits"], 0);
    assert_eq!(e["decode"]["reads"], 24);
    let per_token = e["per_token"].as_array().unwrap();
    assert_eq!(per_token.len(), 3, "the prompt's pass and 2 decode passes");
    assert!(per_token[1..]
        .iter()
        .all(|t| t["phase"] == "decode" && t["misses"] == 12));
    let drive_bytes: u64 = e["drives"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(drive_bytes, e["decode"]["bytes"].as_u64().unwrap());
    assert!(v["physical_limit"]["fraction"].as_f64().unwrap() > 0.0);
}

fn with_prefetch(mut o: LoadOptions) -> LoadOptions {
    o.experts.prefetch = PrefetchMode::On;
    o
}

#[test]
fn prefetch_changes_no_logit_and_every_guess_is_used_or_counted_as_waste() {
    let dir = tiny();
    let want = logits(&mut session(
        dir.path(),
        &opts(None, CachePolicy::None, EngineChoice::Auto, 1 << 20),
    ));
    let off = {
        let mut s = session(
            dir.path(),
            &opts(Some(BUDGET), CachePolicy::None, EngineChoice::Auto, 1 << 20),
        );
        logits(&mut s);
        s.store.experts().unwrap().counters()
    };
    assert_eq!((off.prefetch_reads, off.prefetch_hits), (0, 0));
    for cache in [CachePolicy::None, CachePolicy::LfuDa] {
        for engine in [EngineChoice::Auto, EngineChoice::Pool] {
            let o = with_prefetch(opts(Some(BUDGET), cache, engine, 1 << 20));
            let mut s = session(dir.path(), &o);
            assert!(s.store.experts().unwrap().prefetch_enabled());
            let got = logits(&mut s);
            let same = got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{cache} {engine:?} with prefetch: logits differ");
            // the last pass guessed layer 0 of a next pass that never comes (guesses the
            // cache holds are not read)
            let es = s.store.experts_mut().unwrap();
            assert!(cache != CachePolicy::None || es.prefetch_outstanding() > 0);
            es.settle().unwrap();
            assert_eq!(es.prefetch_outstanding(), 0);
            let c = s.store.experts().unwrap().counters();
            // every guess whose read started was either used or dropped as waste, and
            // nothing is left in flight after the last layer
            assert_eq!(
                c.prefetch_reads,
                c.prefetch_hits + c.prefetch_wasted,
                "{c:?}"
            );
            assert_eq!(s.store.experts().unwrap().engine().outstanding(), 0);
            assert!(c.prefetch_hits > 0 && c.prefetch_hits <= c.misses, "{c:?}");
            if cache == CachePolicy::None {
                // the same misses as without prefetch; the extra bytes and reads (one per
                // expert at 1 MiB requests) are exactly the wasted guesses
                assert_eq!((c.hits, c.misses), (off.hits, off.misses));
                assert_eq!(c.bytes, off.bytes + c.prefetch_wasted_bytes, "{c:?}");
                assert_eq!(c.reads, off.reads + c.prefetch_wasted, "{c:?}");
            }
        }
    }
}

/// 40 prompt tokens: enough that each layer's batch uses nearly all of its 16 experts.
fn long_prompt() -> Vec<u32> {
    (0..40u32).map(|i| (37 * i + 11) % 512).collect()
}

#[test]
fn read_ahead_changes_no_logit_and_reads_each_prompt_expert_once() {
    let dir = tiny();
    let p = long_prompt();
    let want = common::prompt_and_greedy_logits(
        &mut session(
            dir.path(),
            &opts(None, CachePolicy::None, EngineChoice::Auto, 1 << 20),
        ),
        &p,
        DECODE,
    );
    for cache in [CachePolicy::None, CachePolicy::LfuDa] {
        for engine in [EngineChoice::Auto, EngineChoice::Pool] {
            let mut o = opts(Some(BUDGET), cache, engine, 1 << 20);
            o.experts.read_ahead = true;
            let mut s = session(dir.path(), &o);
            let es = s.store.experts().unwrap();
            // the cache's memory lends one buffer per expert of a layer
            assert_eq!(es.read_ahead_slots(), 16, "{cache}");
            let budget0 = es.cache().budget();
            let got = common::prompt_and_greedy_logits(&mut s, &p, DECODE);
            let same = got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{cache} {engine:?} with read-ahead: logits differ");
            // decode batches (4 of 16 experts) ended it and gave the cache its budget back
            let es = s.store.experts().unwrap();
            assert!(!es.read_ahead_active());
            assert_eq!(es.cache().budget(), budget0);
        }
        // the prompt alone: layers 1 and 2 are read ahead while layers 0 and 1 compute
        let mut o = opts(Some(BUDGET), cache, EngineChoice::Auto, 1 << 20);
        o.experts.read_ahead = true;
        let mut s = session(dir.path(), &o);
        let budget0 = s.store.experts().unwrap().cache().budget();
        s.prefill(&p, Logits::Last).unwrap();
        let es = s.store.experts().unwrap();
        assert!(es.read_ahead_active());
        // the cache lends one expert buffer per read-ahead slot while batches are long
        let lent = 16 * es.expert_bytes();
        assert_eq!(es.cache().budget(), budget0.saturating_sub(lent), "{cache}");
        let c = es.counters();
        let layers = es.layer_counters();
        assert_eq!(layers.len(), 3);
        let touched: u64 = layers.iter().map(|l| l.touched).sum();
        assert!(layers.iter().all(|l| l.touched * 4 >= 16 * 3), "{layers:?}");
        assert_eq!(
            layers.iter().map(|l| l.uses).sum::<u64>(),
            c.hits + c.misses
        );
        assert_eq!(layers.iter().map(|l| l.bytes).sum::<u64>(), c.bytes);
        assert!(layers.iter().all(|l| l.spine_ns > 0 && l.compute_ns > 0));
        // one batch, nothing cached at the start: every expert used is one miss
        assert_eq!((c.hits, c.misses), (0, touched));
        assert!(c.prefetch_hits > 0, "{c:?}");
        assert_eq!(
            c.prefetch_reads,
            c.prefetch_hits + c.prefetch_wasted,
            "{c:?}"
        );
        // every byte read is a used expert's, once, or a read-ahead expert's left unused (the
        // aligned spans; an expert ending its layer's shard reads a short last page)
        let used: u64 =
            layers.iter().map(|l| l.touched_bytes).sum::<u64>() + c.prefetch_wasted_bytes;
        assert!(c.bytes <= used && used - c.bytes < 3 * 4096, "{c:?} {used}");
        // layer 0 is not read ahead (nothing routes before it)
        assert!(
            c.prefetch_reads <= layers[1].touched + layers[2].touched,
            "{c:?}"
        );
    }
}
