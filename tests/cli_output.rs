//! The `deltafin` binary's machine-readable outputs: `tokenize --ids/--json/--no-bos` and text
//! from standard input, `inspect --json`, and `bench`'s table forms, JSON and plot.

mod common;

use std::process::{Command, Output};

fn deltafin(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_deltafin"))
        .args(args)
        .output()
        .expect("running deltafin")
}

fn stdout(o: &Output) -> String {
    assert!(
        o.status.success(),
        "deltafin failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

const LLAMA_GGUF: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/gguf/llama/llama-f32.gguf"
);

#[test]
fn tokenize_prints_ids_json_without_bos_and_reads_standard_input() {
    let ids = stdout(&deltafin(&[
        "tokenize",
        "-m",
        LLAMA_GGUF,
        "--ids",
        "Hello world",
    ]));
    assert_eq!(ids, "[480, 39, 68, 75, 75, 78, 297, 259, 75, 67]\n");
    let no_bos = deltafin(&[
        "tokenize",
        "-m",
        LLAMA_GGUF,
        "--ids",
        "--no-bos",
        "Hello world",
    ]);
    assert_eq!(stdout(&no_bos), "[39, 68, 75, 75, 78, 297, 259, 75, 67]\n");
    // no TEXT and `-` both read standard input, verbatim
    for args in [
        &["tokenize", "-m", LLAMA_GGUF, "--ids"][..],
        &["tokenize", "-m", LLAMA_GGUF, "--ids", "-"],
    ] {
        assert_eq!(
            stdout(&common::output_with_stdin(
                Command::new(env!("CARGO_BIN_EXE_deltafin")).args(args),
                "Hello world"
            )),
            ids
        );
    }
    let j: serde_json::Value = serde_json::from_str(&stdout(&deltafin(&[
        "tokenize", "-m", LLAMA_GGUF, "--json", "--no-bos", "Hel",
    ])))
    .unwrap();
    assert_eq!(
        j,
        serde_json::json!({"text": "Hel", "n_tokens": 3, "tokens": [
            {"id": 39, "piece": "H"}, {"id": 68, "piece": "e"}, {"id": 75, "piece": "l"}]})
    );
    let both = deltafin(&["tokenize", "-m", LLAMA_GGUF, "--ids", "--json", "x"]);
    assert!(!both.status.success());
    assert!(String::from_utf8_lossy(&both.stderr).contains("cannot be used with"));
}

#[test]
fn inspect_json_holds_the_facts_of_the_text() {
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/hf/qwen3_moe");
    let j: serde_json::Value =
        serde_json::from_str(&stdout(&deltafin(&["inspect", "-m", fixture, "--json"]))).unwrap();
    let keys: Vec<&str> = j.as_object().unwrap().keys().map(|k| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "files",
            "format",
            "architecture",
            "config",
            "tensor_count",
            "tensor_bytes",
            "by_type",
            "spine_bytes",
            "expert_bytes",
            "per_expert"
        ]
    );
    assert_eq!(j["format"], serde_json::json!({"kind": "safetensors"}));
    assert_eq!(j["architecture"], "qwen3_moe");
    assert_eq!(j["tensor_count"], 80);
    assert_eq!(j["tensor_bytes"], 441408);
    assert_eq!(j["spine_bytes"], 244800);
    assert_eq!(j["expert_bytes"], 196608);
    assert_eq!(
        j["per_expert"],
        serde_json::json!({"bytes": 12288, "experts": 8, "moe_layers": 2})
    );
    let g: serde_json::Value = serde_json::from_str(&stdout(&deltafin(&[
        "inspect",
        "-m",
        LLAMA_GGUF,
        "--json",
        "--tensors",
    ])))
    .unwrap();
    assert_eq!(g["format"]["kind"], "gguf");
    assert_eq!(g["architecture"], "llama");
    let n = g["tensor_count"].as_u64().unwrap();
    assert_eq!(g["tensors"].as_array().unwrap().len() as u64, n);
    let by_type: u64 = g["by_type"]
        .as_object()
        .unwrap()
        .values()
        .map(|t| t["bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(by_type, g["tensor_bytes"].as_u64().unwrap());
    // a vocabulary is summarized, as the text does
    assert!(
        g["metadata"]["tokenizer.ggml.tokens"]["array_len"]
            .as_u64()
            .unwrap()
            > 8
    );
    let t = &g["tensors"][0];
    let keys: Vec<&str> = t.as_object().unwrap().keys().map(|k| k.as_str()).collect();
    assert_eq!(keys, ["name", "type", "shape", "file", "offset", "bytes"]);
}

/// `bench` on the streamed demo model: the dense weights it streams are named and counted,
/// the page cache choice is stated, and the CSV, Markdown, JSON and SVG outputs have their
/// shapes.
#[test]
fn bench_reports_streamed_dense_weights_and_its_output_forms() {
    let model = common::demo_gguf();
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("b.svg");
    let json = dir.path().join("b.json");
    let base = [
        "bench",
        "-m",
        model.to_str().unwrap(),
        "--ram-budget",
        "64M",
        "-n",
        "3",
        "--prompt-tokens",
        "4",
        "--device",
        "cpu",
        "--scenarios",
        "cold-decode,prefill",
        "--keep-page-cache",
    ];
    let mut args = base.to_vec();
    args.extend([
        "--repetitions",
        "2",
        "--output",
        "csv",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    args.extend(["--json", json.to_str().unwrap()]);
    let o = deltafin(&args);
    let csv = stdout(&o);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[0],
        "scenario,stat,tok_s,ttft_s,mib_per_token,dense_mib_per_token,expert_mib_per_token,hit_pct,prefetch_recall_pct,read_mb_s,io_wait_pct,limit_pct,weights"
    );
    assert_eq!(lines.len(), 7, "{csv}");
    let stats: Vec<&str> = lines[1..]
        .iter()
        .map(|l| l.split(',').nth(1).unwrap())
        .collect();
    assert_eq!(stats, ["min", "median", "max", "min", "median", "max"]);
    assert!(lines[1].starts_with("cold-decode,min,"), "{csv}");
    assert!(
        lines[1].ends_with(
            ",\"dense: 15/18 layers resident, LM head streamed (tied to embeddings); device cpu\""
        ),
        "{csv}"
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("cold-decode: page cache not dropped: --keep-page-cache"),
        "{err}"
    );
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.contains("\ncold-decode\n</text>") && svg.contains("\nprefill\n</text>"));
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(j["repetitions"], 2);
    let d = &j["scenarios"][0];
    assert_eq!(d["scenario"], "cold-decode");
    assert_eq!(d["finish"], "length");
    assert_eq!(
        d["page_cache"],
        serde_json::json!({"dropped": false, "reason": "--keep-page-cache"})
    );
    assert_eq!(d["runs"].as_array().unwrap().len(), 2);
    let s = &d["spread"]["dense_mib_per_token"];
    assert!(s["min"].as_f64().unwrap() <= s["median"].as_f64().unwrap());
    assert!(s["median"].as_f64().unwrap() <= s["max"].as_f64().unwrap());
    // the demo model streams its LM head and 3 layers every token: 181.6 MiB, no experts
    assert_eq!(format!("{:.1}", s["median"].as_f64().unwrap()), "181.6");
    assert_eq!(d["spread"]["expert_mib_per_token"]["max"], 0.0);
    assert!(d["physical_limit"]["fraction"].as_f64().unwrap() <= 1.0);
    assert_eq!(d["summary"]["tok_s"], d["spread"]["tok_s"]["median"]);
    let mut args = base.to_vec();
    let at = args.len() - 2;
    args[at] = "prefill";
    args.extend(["--output", "md"]);
    let md = stdout(&deltafin(&args));
    assert_eq!(
        md.lines().next().unwrap(),
        "| scenario | tok/s | TTFT s | MiB/tok | dense MiB/tok | expert MiB/tok | hit % | pf % | read MB/s | wait % | limit % | weights |"
    );
    assert!(
        md.lines().nth(2).unwrap().starts_with("| prefill | "),
        "{md}"
    );
}
