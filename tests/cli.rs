//! The `deltafin` binary end to end on the demo model: greedy text, stop strings, seeded
//! sampling, statistics, the RAM budget measured as peak RSS, and clear errors on bad input.

mod common;

use std::path::Path;
use std::process::{Command, Output};

fn deltafin(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_deltafin"))
        .args(args)
        .output()
        .expect("running deltafin")
}

fn run_demo(extra: &[&str]) -> Output {
    let model = common::demo_gguf();
    let mut args = vec![
        "run",
        "-m",
        model.to_str().unwrap(),
        "-p",
        "The Eiffel Tower is located in the city of",
    ];
    args.extend_from_slice(extra);
    deltafin(&args)
}

fn stdout(o: &Output) -> String {
    assert!(
        o.status.success(),
        "deltafin failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

#[test]
fn greedy_demo_says_paris_france_while_streaming_under_64m() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("stats.json");
    let o = run_demo(&[
        "-n",
        "8",
        "--temp",
        "0",
        "--ram-budget",
        "64M",
        "--stats",
        "--stats-json",
        json.to_str().unwrap(),
    ]);
    let text = stdout(&o);
    assert!(
        text.starts_with("The Eiffel Tower is located in the city of Paris, France."),
        "{text}"
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("time to first token"), "{err}");
    assert!(err.contains("layers resident, LM head streamed"), "{err}");
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(s["prompt_tokens"], 10);
    assert_eq!(s["generated_tokens"], 8);
    assert_eq!(s["numerics"], "exact");
    assert!(err.contains("numerics             exact\n"), "{err}");
    // every decode pass reads the streamed part of the model: the 170 MiB LM head and more
    let per_tok = s["decode_bytes_per_token"].as_f64().unwrap();
    let streamed = s["streamed_bytes_per_pass"].as_f64().unwrap();
    assert!(streamed > 170.0 * 1048576.0, "{streamed}");
    assert!(
        per_tok >= streamed && per_tok < streamed + 4.0 * 1048576.0,
        "{per_tok} vs {streamed}"
    );
}

/// Allowance over `--ram-budget` for what the budget does not cover: the binary, the thread
/// stacks, the GGUF header and the tokenizer (Gemma 3's 262k-token vocabulary and 515k merges).
const RSS_ALLOWANCE: u64 = 224 << 20;

#[test]
fn peak_rss_stays_within_the_budget_plus_the_allowance() {
    let dir = tempfile::tempdir().unwrap();
    let mut peaks = Vec::new();
    for budget in ["64M", "1G"] {
        let json = dir.path().join(format!("{budget}.json"));
        let o = run_demo(&[
            "-n",
            "4",
            "--temp",
            "0",
            "--ram-budget",
            budget,
            "--stats-json",
            json.to_str().unwrap(),
        ]);
        stdout(&o);
        let s: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let charged = s["resident_bytes"].as_u64().unwrap()
            + s["stream_buffer_bytes"].as_u64().unwrap()
            + s["kv_bytes"].as_u64().unwrap()
            + s["scratch_bytes"].as_u64().unwrap();
        peaks.push((s["peak_rss_bytes"].as_u64().unwrap(), charged));
    }
    let (peak64, charged64) = peaks[0];
    assert!(
        charged64 <= 64 << 20,
        "charged {charged64} bytes to a 64 MiB budget"
    );
    assert!(
        peak64 <= (64 << 20) + RSS_ALLOWANCE,
        "peak RSS {peak64} over 64 MiB + allowance"
    );
    // with room for everything, the weights are resident and the RSS shows it
    let (peak1g, charged1g) = peaks[1];
    assert!(charged1g > 235 << 20, "{charged1g}");
    assert!(peak1g > peak64 + (150 << 20), "{peak1g} vs {peak64}");
}

#[test]
fn stop_strings_and_max_tokens_end_generation() {
    let text = stdout(&run_demo(&["-n", "32", "--temp", "0", "--stop", ","]));
    assert_eq!(text, "The Eiffel Tower is located in the city of Paris\n");
    let text = stdout(&run_demo(&["-n", "2", "--temp", "0"]));
    assert_eq!(text, "The Eiffel Tower is located in the city of Paris,\n");
}

#[test]
fn seeded_sampling_repeats() {
    let a = stdout(&run_demo(&["-n", "12", "--temp", "1.0", "--seed", "42"]));
    let b = stdout(&run_demo(&["-n", "12", "--temp", "1.0", "--seed", "42"]));
    assert_eq!(a, b);
    let runs: Vec<String> = (1..=4)
        .map(|s| {
            stdout(&run_demo(&[
                "-n",
                "12",
                "--temp",
                "1.5",
                "--seed",
                &s.to_string(),
            ]))
        })
        .collect();
    assert!(
        runs.iter().any(|r| r != &runs[0]),
        "four seeds gave the same text: {runs:?}"
    );
}

#[test]
fn chat_mode_renders_the_template() {
    let model = common::demo_gguf();
    // The demo model is a base model: it echoes the question. llama.cpp (llama-cpp-python
    // 0.3.36) gives the same 11 greedy tokens for the same rendered conversation
    // ids [2, 105, 2364, 107, 3689, ... 106, 107, 105, 4368, 107].
    let o = deltafin(&[
        "run",
        "-m",
        model.to_str().unwrap(),
        "--chat",
        "-p",
        "What is the capital of France? Answer in one word.",
        "-n",
        "11",
        "--temp",
        "0",
    ]);
    assert_eq!(
        stdout(&o),
        "What is the capital of France? Answer in one word\n"
    );
}

fn stderr_of_failure(args: &[&str]) -> String {
    let o = deltafin(args);
    assert!(!o.status.success(), "expected failure for {args:?}");
    // 1: a failed command, 2: a usage error from the argument parser; never a panic (101)
    assert!(
        matches!(o.status.code(), Some(1 | 2)),
        "exit status {:?}",
        o.status
    );
    String::from_utf8(o.stderr).unwrap()
}

#[test]
fn bad_input_gives_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.gguf");
    let e = stderr_of_failure(&["run", "-m", missing.to_str().unwrap(), "-p", "x"]);
    assert!(e.contains("nope.gguf") && e.contains("No such file"), "{e}");

    // the demo model cut short: the header is intact, the tensor data is not
    let truncated = dir.path().join("cut.gguf");
    let src = std::fs::read(common::demo_gguf()).unwrap();
    std::fs::write(&truncated, &src[..50 << 20]).unwrap();
    let e = stderr_of_failure(&["run", "-m", truncated.to_str().unwrap(), "-p", "x"]);
    assert!(e.contains("cut.gguf") && e.contains("tensor"), "{e}");

    // the header cut short
    std::fs::write(&truncated, &src[..1000]).unwrap();
    let e = stderr_of_failure(&["inspect", "-m", truncated.to_str().unwrap()]);
    assert!(e.contains("cut.gguf"), "{e}");

    let e = stderr_of_failure(&[
        "run",
        "-m",
        common::demo_gguf().to_str().unwrap(),
        "-p",
        "x",
        "--ram-budget",
        "1M",
    ]);
    assert!(e.contains("--ram-budget 1.0 MiB is too small: "), "{e}");
    let e = stderr_of_failure(&[
        "run",
        "-m",
        common::demo_gguf().to_str().unwrap(),
        "-p",
        "x",
        "--ram-budget",
        "lots",
    ]);
    assert!(e.contains("invalid size 'lots'"), "{e}");
    let m = common::demo_gguf();
    let m = m.to_str().unwrap();
    for (flag, value, want) in [
        ("--temp", "-1", "-1 is negative; use 0 for greedy"),
        ("--top-p", "2", "2 is not between 0 and 1"),
        (
            "--repeat-penalty",
            "0",
            "0 must be above 0 (1 turns it off)",
        ),
        ("--threads", "0", "'0' is not a thread count from 1 to 1024"),
        (
            "--batch-size",
            "0",
            "'0' is not a whole number of at least 1",
        ),
        ("--stop", "", "an empty stop string would stop at once"),
    ] {
        let e = stderr_of_failure(&["run", "-m", m, "-p", "x", flag, value]);
        assert!(e.contains(want), "{flag} {value}: {e}");
    }
    let e = stderr_of_failure(&["pull", "no-such-model"]);
    assert!(
        e.contains("unknown model 'no-such-model'") && e.contains("gemma-3-270m"),
        "{e}"
    );
}

#[test]
fn read_depths_are_bounded_when_parsed() {
    let m = common::demo_gguf();
    let m = m.to_str().unwrap();
    for (flag, value, want) in [
        ("--io-depth", "40000", "40000 is outside 1..=4096"),
        ("--io-depth", "0", "0 is outside 1..=4096"),
        ("--prefetch-depth", "100000", "100000 is outside 1..=4096"),
    ] {
        let e = stderr_of_failure(&["run", "-m", m, "-p", "x", "-n", "1", flag, value]);
        assert!(
            e.contains(&format!("invalid value '{value}' for '{flag}")) && e.contains(want),
            "{flag} {value}: {e}"
        );
    }
}

#[test]
fn a_model_path_that_is_a_fifo_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("model.gguf");
    common::mkfifo(&fifo);
    for cmd in [&["inspect", "-m"][..], &["run", "-p", "x", "-m"][..]] {
        let o = common::output_or_kill(
            Command::new(env!("CARGO_BIN_EXE_deltafin"))
                .args(cmd)
                .arg(&fifo),
        );
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{e}");
        assert!(
            e.contains(&format!("{}: not a regular file (a FIFO)", fifo.display())),
            "{e}"
        );
    }
}

#[test]
fn the_default_budget_fits_a_small_limit_and_a_too_small_one_is_named() {
    use deltafin::models::{load_gguf, BudgetTooSmall, LoadOptions};
    use deltafin::store::plan::{ram_budget, LimitSource, MemoryLimit};
    let g = common::demo_model();
    let cgroup = |mib: u64| MemoryLimit {
        bytes: mib << 20,
        source: LimitSource::Cgroup,
    };
    let opts = |ram_budget| LoadOptions {
        ram_budget,
        n_ctx: 64,
        n_batch: 64,
        ..Default::default()
    };
    // a 256 MiB cgroup and no --ram-budget: 128 MiB, and the demo model loads (streamed)
    let b = ram_budget(None, Some(cgroup(256))).unwrap();
    assert_eq!(b, Some(128 << 20));
    let (m, _) = load_gguf(&g, &opts(b)).unwrap();
    assert!(m.placement().streamed_bytes > 0);
    // under 8 MiB even the least the model needs does not fit: the message speaks of the limit
    let l = cgroup(8);
    let e = load_gguf(&g, &opts(ram_budget(None, Some(l)).unwrap()))
        .err()
        .unwrap();
    let e = BudgetTooSmall::under_limit(e, &l).to_string();
    assert!(
        e.starts_with(
            "the memory limit of 8.0 MiB (cgroup) is too small for this model: it needs at least "
        ) && e.contains("for the KV cache for 64 tokens")
            && e.ends_with("and the default budget within that limit is 4.0 MiB"),
        "{e}"
    );
    // an explicit budget over the limit is refused before loading
    assert_eq!(
        ram_budget(Some(1 << 30), Some(cgroup(512))).unwrap_err(),
        "--ram-budget 1.0 GiB is more than the memory limit of 512.0 MiB (cgroup) this process may use"
    );
}

#[test]
fn inspect_prints_architecture_and_totals() {
    let model = common::demo_gguf();
    let text = stdout(&deltafin(&["inspect", "-m", model.to_str().unwrap()]));
    assert!(text.contains("architecture: gemma3"), "{text}");
    assert!(
        text.contains("tensors:      236, 246587904 bytes (235.2 MiB)"),
        "{text}"
    );
    assert!(text.contains("experts:      0 bytes"), "{text}");
    assert!(
        text.contains("  Q8_0      10 tensors      171.5 MiB"),
        "{text}"
    );
    assert!(Path::new(&model).exists());
}

#[test]
fn a_full_context_ends_generation_like_max_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("s.json");
    let o = run_demo(&[
        "-n",
        "8",
        "--temp",
        "0",
        "--ctx-size",
        "12",
        "--stats-json",
        json.to_str().unwrap(),
    ]);
    // 10 prompt tokens + 2 cached generated tokens; the third is sampled from the last pass
    assert_eq!(
        stdout(&o),
        "The Eiffel Tower is located in the city of Paris, France\n"
    );
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(s["finish"], "length");
    assert_eq!(s["generated_tokens"], 3);
    // and says so, with the flag that makes room
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        "context full: 12 tokens (-c 12); a larger -c (up to 32768) lets the text go on\n"
    );
}

/// `-c` above the model's trained context (the DeepSeek V3 fixture's `max_position_embeddings`,
/// 256 tokens) is capped to it, with a warning.
#[test]
fn a_context_above_the_trained_one_is_capped_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("s.json");
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/hf/deepseek_v3");
    let run = |ctx: &str| {
        let o = deltafin(&[
            "run",
            "-m",
            model,
            "-p",
            "Hello",
            "-n",
            "2",
            "--temp",
            "0",
            "-c",
            ctx,
            "--stats-json",
            json.to_str().unwrap(),
        ]);
        let text = stdout(&o);
        let s: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let err = String::from_utf8(o.stderr).unwrap();
        (text, err, s["kv_bytes"].as_u64().unwrap())
    };
    let (text, err, kv) = run("300");
    assert_eq!(
        err,
        "warning: -c 300 is above the model's trained context of 256 tokens; the context is 256 tokens\n"
    );
    // the same run as -c 256: the same text and KV cache
    assert_eq!(run("256"), (text, String::new(), kv));
}

/// `-f FILE` reads the prompt from a file (`-f -`: standard input), and
/// `--no-display-prompt` prints only the generated text (the prompt is echoed by default, as
/// llama.cpp does).
#[test]
fn the_prompt_comes_from_a_file_and_its_echo_can_be_turned_off() {
    let model = common::demo_gguf();
    let m = model.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prompt.txt");
    std::fs::write(&file, "The Eiffel Tower is located in the city of").unwrap();
    let f = file.to_str().unwrap();
    let want = "The Eiffel Tower is located in the city of Paris,\n";
    let args = ["run", "-m", m, "-n", "2", "--temp", "0"];
    fn join<'a>(a: &[&'a str], b: &[&'a str]) -> Vec<&'a str> {
        [a, b].concat()
    }
    assert_eq!(stdout(&deltafin(&join(&args, &["-f", f]))), want);
    let mut child = Command::new(env!("CARGO_BIN_EXE_deltafin"))
        .args(join(&args, &["-f", "-"]))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"The Eiffel Tower is located in the city of")
        .unwrap();
    assert_eq!(stdout(&child.wait_with_output().unwrap()), want);
    assert_eq!(
        stdout(&deltafin(&join(&args, &["-f", f, "--no-display-prompt"]))),
        " Paris,\n"
    );
    let missing = dir.path().join("nope.txt");
    let e = stderr_of_failure(&join(&args, &["-f", missing.to_str().unwrap()]));
    assert_eq!(
        e,
        format!(
            "error: reading the prompt from {}: No such file or directory (os error 2)\n",
            missing.display()
        )
    );
}

/// Ctrl-C (SIGINT) during generation stops it after the step under way: the text so far, a
/// newline and the statistics are still written, and the exit status is 130.
#[test]
fn ctrl_c_stops_the_generation_and_keeps_the_statistics() {
    use std::io::Read;
    let model = common::demo_gguf();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("s.json");
    let mut child = Command::new(env!("CARGO_BIN_EXE_deltafin"))
        .args([
            "run",
            "-m",
            model.to_str().unwrap(),
            "-p",
            "Once upon a time",
            "-n",
            "4000",
            "--temp",
            "0",
            "--stats",
            "--stats-json",
            json.to_str().unwrap(),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // the prompt is echoed, then generated text: interrupt once the generation has begun
    let mut out = child.stdout.take().unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 64];
    while seen.len() <= "Once upon a time".len() {
        let n = out.read(&mut buf).unwrap();
        assert!(n > 0, "the output ended early");
        seen.extend_from_slice(&buf[..n]);
    }
    // SAFETY: signalling the child started above.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    out.read_to_end(&mut seen).unwrap();
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(130), "{err}");
    let text = String::from_utf8(seen).unwrap();
    assert!(
        text.starts_with("Once upon a time") && text.ends_with('\n'),
        "{text}"
    );
    assert!(err.contains("time to first token"), "{err}");
    assert!(err.ends_with("interrupted\n"), "{err}");
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(s["finish"], "interrupted");
    let n = s["generated_tokens"].as_u64().unwrap();
    assert!((1..4000).contains(&n), "{n}");
}

#[test]
fn a_closed_pipe_ends_the_process_quietly() {
    use std::io::Read;
    let model = common::demo_gguf();
    let mut child = Command::new(env!("CARGO_BIN_EXE_deltafin"))
        .args([
            "run",
            "-m",
            model.to_str().unwrap(),
            "-p",
            "Once upon a time",
            "-n",
            "200",
            "--temp",
            "0",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // the prompt is echoed at once; the 200 tokens take seconds
    let mut first = [0u8; 8];
    child
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut first)
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    use std::os::unix::process::ExitStatusExt;
    // killed by SIGPIPE like any Unix tool, never a panic (exit 101)
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "{:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn inspect_splits_a_moe_folder_into_spine_and_experts() {
    // byte totals cross-checked against the safetensors headers with Python
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/hf/qwen3_moe");
    let text = stdout(&deltafin(&["inspect", "-m", fixture]));
    assert!(text.contains("architecture: qwen3_moe"), "{text}");
    assert!(text.contains("tensors:      80, 441408 bytes"), "{text}");
    assert!(text.contains("spine:        244800 bytes"), "{text}");
    assert!(text.contains("experts:      196608 bytes"), "{text}");
    assert!(
        text.contains("per expert:   12288 bytes (0.0 MiB) (8 experts in each of 2 MoE layers)"),
        "{text}"
    );
}

/// `--numerics q8` is named by `--stats` and `--stats-json` (it is lossy), still answers
/// the demo prompt, and an unknown value is refused with the accepted ones.
#[test]
fn q8_numerics_are_named_in_the_statistics() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("stats.json");
    let o = run_demo(&[
        "-n",
        "8",
        "--temp",
        "0",
        "--numerics",
        "q8",
        "--stats",
        "--stats-json",
        json.to_str().unwrap(),
    ]);
    let text = stdout(&o);
    assert!(
        text.starts_with("The Eiffel Tower is located in the city of Paris, France."),
        "{text}"
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("numerics             q8 (lossy: activations quantized to 8 bits per block"),
        "{err}"
    );
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(s["numerics"], "q8");
    let o = run_demo(&["--numerics", "q4"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("unknown numerics 'q4' (expected exact or q8)"),
        "{err}"
    );
}

/// Under `--numerics q8`, speculative decoding gives plain decoding's greedy output token for
/// token: verification passes and plain single-token steps both run q8, and a row's q8 values
/// are the same in a batch and alone (`kernels::matvec_q8`), as is the q8 prompt. A repeating prompt makes lookup draft
/// (and get verified) on most steps; the statistics show that it did.
#[test]
fn q8_numerics_keep_speculative_output_equal_to_plain() {
    let model = common::demo_gguf();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("stats.json");
    let p = "Repeat this list exactly: apple, banana, cherry, date, elderberry, fig, grape. Again: apple, banana, cherry, date, elderberry, fig, grape. Again:";
    let base = [
        "run",
        "-m",
        model.to_str().unwrap(),
        "-p",
        p,
        "-n",
        "40",
        "--temp",
        "0",
        "--numerics",
        "q8",
    ];
    let plain = stdout(&deltafin(&base));
    let mut spec = base.to_vec();
    spec.extend_from_slice(&[
        "--lookup",
        "--draft-fixed",
        "--stats-json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(stdout(&deltafin(&spec)), plain);
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let sp = &s["speculative"];
    assert!(sp["verify_passes"].as_u64().unwrap() > 0, "{sp}");
    assert!(sp["accepted"].as_u64().unwrap() > 0, "{sp}");
}
