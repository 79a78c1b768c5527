//! `deltafin plan` and `deltafin doctor` through the binary: the arithmetic on a fixture with
//! known byte counts (bandwidths and compute rates given, so nothing is measured), the `kimi-k3`
//! preset planned without a file, the refusal of bad inputs, the plot, and `doctor`'s JSON on
//! this machine (a probe of a temporary folder).

use std::process::{Command, Output};

/// The Qwen3-MoE fixture: 3 MoE layers of 8 Q8_0 experts of 6,528 bytes, top-2, a 117,120-byte
/// spine (embeddings and head 34,816 each), KV 3 layers × 2 heads × (16 + 16) × 4 = 768
/// bytes per token.
const QWEN: &str = "tests/fixtures/gguf/qwen3_moe/qwen3_moe-q8_0.gguf";

fn deltafin(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_deltafin"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    assert!(
        o.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    assert!(
        !o.status.success(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    String::from_utf8(o.stderr.clone()).unwrap()
}

/// The flags of a plan that measures nothing (with [`MEMORY`]): 64 tokens of context, two drives of 1 MiB/s, 10 MiB/s of decode compute, 100 MiB/s of prompt compute.
const GIVEN: &[&str] = &[
    "-c",
    "64",
    "--drive-bandwidth",
    "1M,1M",
    "--compute-rate",
    "10M",
    "--prefill-rate",
    "100M",
    "--prompt-tokens",
    "4",
    "--heat-file",
    "none",
];

/// 1 GiB of memory and a 256 KiB budget, unless the test gives its own.
const MEMORY: &[&str] = &["--ram", "1G", "--ram-budget", "256K"];

/// `plan -m model` with [`GIVEN`], `extra`, and [`MEMORY`] unless `extra` has a budget.
fn plan_args<'a>(model: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["plan", "-m", model];
    args.extend_from_slice(GIVEN);
    if !extra.contains(&"--ram-budget") {
        args.extend_from_slice(MEMORY);
    } else if !extra.contains(&"--ram") {
        args.extend_from_slice(&MEMORY[..2]);
    }
    args.extend_from_slice(extra);
    args
}

fn plan_json(model: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = plan_args(model, extra);
    args.push("--json");
    serde_json::from_str(&stdout(&deltafin(&args))).unwrap()
}

#[test]
fn plan_places_a_fixture_and_predicts_its_ladder_from_its_bytes() {
    let v = plan_json(QWEN, &[]);
    let m = &v["model"];
    assert_eq!(m["expert_bytes"], 6528);
    assert_eq!(m["spine_bytes"], 117_120);
    assert_eq!(m["embedding_bytes"], 34_816);
    assert_eq!(m["head_bytes"], 34_816);
    assert_eq!(m["kv_bytes_per_token"], 768);
    assert_eq!(
        (m["moe_layers"].clone(), m["experts"].clone()),
        (3.into(), 8.into())
    );
    assert_eq!(
        (
            m["experts_per_token"].clone(),
            m["reads_per_expert"].clone()
        ),
        (2.into(), 3.into())
    );
    let p = &v["placement"];
    // 256 KiB − KV 64 × 768 − 2 I/O buffers of 20 KiB (6,528 bytes + 3 × 4 KiB, rounded up)
    // − the spine: 54,912 bytes of cache, 8 of the 24 experts
    assert_eq!(p["kv_bytes"], 49_152);
    assert_eq!(p["io_buffer_bytes"], 40_960);
    assert_eq!(p["cache_bytes"], 54_912);
    assert_eq!(p["cache_experts"], 8);
    assert_eq!(v["hit_rate"], 1.0 / 3.0);
    assert_eq!(v["hit_rate_source"], "uniform routing");
    let one = &v["ladder"][0];
    // 3 layers × 2 experts × 2/3 missed × 18,816 bytes at 1 MiB/s
    assert_eq!(one["expert_read_s"], 4.0 * 18_816.0 / 1_048_576.0);
    // (117,120 − 34,816) spine bytes + 6 experts of 6,528 bytes at 10 MiB/s
    assert_eq!(one["compute_s"], (82_304.0 + 39_168.0) / 10_485_760.0);
    let t = 82_304.0 / 10_485_760.0 + 4.0 * 18_816.0 / 1_048_576.0;
    assert!((one["decode_tok_s"].as_f64().unwrap() - 1.0 / t).abs() < 1e-9);
    assert_eq!(one["bound"], "drives");
    assert_eq!(
        v["ladder"][1]["expert_read_s"],
        2.0 * 18_816.0 / 1_048_576.0
    );
    let ttft = &one["ttft"][0];
    // 4 rows touch 8 × (1 − (3/4)^4) = 5.46875 experts per layer
    assert_eq!(ttft["touched_fraction"], 1.0 - 0.75f64.powi(4));
    assert_eq!(ttft["bound"], "drives");
    assert_eq!(v["add_first"]["resource"], "RAM");
    let r = &v["recommend"];
    assert_eq!(r["ram_budget"], 262_144);
    // half of the 103,104 bytes beside the spine and I/O buffers, at 768 bytes a token
    assert_eq!(r["ctx_size"], 67);
    assert_eq!(r["placement"], "stripe");
    assert_eq!(r["pack"], true);
    assert_eq!(v["compute"]["measured"], false);
    // a stated hit rate replaces the cache's
    let h = plan_json(QWEN, &["--hit-rate", "0.5"]);
    assert_eq!(h["hit_rate"], 0.5);
    assert_eq!(
        h["ladder"][0]["expert_read_s"],
        3.0 * 18_816.0 / 1_048_576.0
    );
}

#[test]
fn plan_prints_a_table_and_draws_the_ladder() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("ladder.svg");
    let args = plan_args(QWEN, &["--plot", svg.to_str().unwrap()]);
    let out = stdout(&deltafin(&args));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        format!("model:      {QWEN} (qwen3moe, gguf): 3 layers, 3 MoE layers of 8 experts of 6.4 KiB (top-2, 3 read(s) each)")
    );
    assert_eq!(lines[4], "hit rate:   0.333 (uniform routing)");
    assert!(
        out.contains("\n| drives | read/s | decode tok/s | bound | TTFT 4 |\n"),
        "{out}"
    );
    assert!(
        out.contains("\n| 1 | 1.0 MiB/s | 12.559 | drives | 294 ms (drives) |\n"),
        "{out}"
    );
    assert!(
        out.contains("\n| 2 | 2.0 MiB/s | 22.864 | drives | 147 ms (drives) |\n"),
        "{out}"
    );
    assert!(
        out.contains("\nrecommend:  run with --ram-budget 256K -c 67; pack: yes, `deltafin pack --placement stripe`"),
        "{out}"
    );
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(
        s.starts_with("<svg") && s.contains("predicted decode tokens/s"),
        "{s}"
    );
    assert!(s.contains("4 prompt tokens"), "{s}");
}

#[test]
fn plan_takes_the_kimi_k3_preset_without_a_file() {
    let v = plan_json("kimi-k3", &["--ram-budget", "100G", "--ram", "128G"]);
    let m = &v["model"];
    assert_eq!(m["source"], "preset");
    assert_eq!(m["architecture"], "kimi_k3");
    assert_eq!(
        (m["layers"].clone(), m["moe_layers"].clone()),
        (93.into(), 92.into())
    );
    assert_eq!(
        (m["experts"].clone(), m["experts_per_token"].clone()),
        (896.into(), 16.into())
    );
    assert_eq!(m["expert_bytes"], 17_547_264);
    // embeddings and head: 163,840 × 7168 BF16 each
    assert_eq!(m["embedding_bytes"], 2_348_810_240u64);
    // 24 MLA layers of a 512 + 64 float latent row
    assert_eq!(m["kv_bytes_per_token"], 24 * 576 * 4);
    // the BF16 spine of the Hugging Face folder synth writes (compressed-tensors MXFP4
    // experts, as published); 1.56 TB in all, 1.446 TB of it routed experts
    let spine = m["spine_bytes"].as_u64().unwrap();
    assert_eq!(spine, 112_828_562_560);
    assert_eq!(
        (spine + 1_446_456_066_048 + 5_000_000_000) / 10_000_000_000,
        156
    );
    assert_eq!(v["placement"]["all_resident"], false);
    let o = deltafin(&["plan", "-m", "kimi-k4", "--ram", "128G"]);
    assert_eq!(
        stderr(&o),
        "error: kimi-k4: No such file or directory (os error 2); and no synth preset is named \
         kimi-k4 (`deltafin synth --preset list` lists them)\n"
    );
}

#[test]
fn plan_refuses_bad_inputs() {
    let run = |extra: &[&str]| stderr(&deltafin(&plan_args(QWEN, extra)));
    assert_eq!(
        run(&["--hit-rate", "1.5"]),
        "error: --hit-rate 1.5: expected a fraction from 0 to 1\n"
    );
    assert_eq!(
        run(&["--prompt-tokens", "0"]),
        "error: --prompt-tokens 0: a prompt has at least 1 token\n"
    );
    assert_eq!(
        run(&["--drive-bandwidth", "0"]),
        "error: --drive-bandwidth 0: a drive reads more than 0 bytes per second\n"
    );
    assert_eq!(
        run(&["--ram-budget", "100K"]),
        "error: --ram-budget 100.0 KiB is too small: the KV cache for 64 tokens (48.0 KiB), \
         stream buffers (68.0 KiB) and expert I/O buffers (40.0 KiB) need at least 156.0 KiB\n"
    );
    assert_eq!(
        run(&["--ram-budget", "2G"]),
        "error: --ram-budget 2.0 GiB is more than the memory limit of 1.0 GiB (--ram) this \
         process may use\n"
    );
    let e = run(&["--drives", "/tmp"]);
    assert!(
        e.contains(
            "the argument '--drive-bandwidth <B,...>' cannot be used with '--drives <P,...>'"
        ),
        "{e}"
    );
    let o = deltafin(&[
        "plan",
        "-m",
        "no-such-model.gguf",
        "--drive-bandwidth",
        "1G",
    ]);
    assert!(
        stderr(&o).starts_with("error: no-such-model.gguf"),
        "{:?}",
        o
    );
}

#[test]
fn doctor_reports_this_machine_as_json_and_fails_on_a_missing_drive() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let args = [
        "doctor",
        "--drives",
        d,
        "--probe-size",
        "4M",
        "--probe-seconds",
        "0.1",
        "--json",
    ];
    let o = deltafin(&args);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(o.status.success(), v["ok"] == true);
    let simd = v["cpu"]["simd"].as_str().unwrap();
    assert!(
        ["scalar", "neon", "avx2", "avx512"].contains(&simd),
        "{simd}"
    );
    assert!(v["cpu"]["cores"].as_u64().unwrap() >= 1);
    assert!(v["cpu"]["threads"].as_u64().unwrap() >= 1);
    for k in [
        "available",
        "cgroup_limit",
        "limit",
        "largest_ram_budget",
        "allowance_held",
    ] {
        assert!(v["memory"].get(k).is_some(), "memory.{k}: {v}");
    }
    let drive = &v["drives"][0];
    assert_eq!(drive["path"], d);
    assert!(
        drive["o_direct"].is_boolean() && drive["io_uring"].is_boolean(),
        "{drive}"
    );
    assert!(drive["read_bytes_per_s"].as_f64().unwrap() > 0.0);
    assert_eq!(
        (drive["request_bytes"].clone(), drive["depth"].clone()),
        (1_048_576.into(), 32.into())
    );
    assert!(drive["free_bytes"].as_u64().is_some());
    assert!(v["open_files"]["soft"].as_u64().is_some());
    assert!(v["gpus"].is_array() && v["findings"].is_array());
    // the probe file is gone
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    let missing = dir.path().join("absent");
    let m = missing.to_str().unwrap();
    let o = deltafin(&["doctor", "--drives", m, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], false);
    let f = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["level"] == "error")
        .unwrap();
    assert_eq!(
        f["what"],
        format!("drive {m}: cannot be probed: {m}: not a folder")
    );
    assert!(stderr(&o).ends_with("error: doctor found 1 problem(s) that would stop a run\n"));
}
