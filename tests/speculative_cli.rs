//! Speculative decoding through the command line (`deltafin run`): the same output as plain
//! decoding with its statistics, refusals that name their reason, the draft model's share of
//! the RAM budget, and tokens accepted past a stop reported as discarded.

mod common;

use std::path::Path;

use common::gguf::{gguf_path, reference};

fn deltafin(args: &[&str]) -> std::process::Output {
    common::output_or_kill(std::process::Command::new(env!("CARGO_BIN_EXE_deltafin")).args(args))
}

fn stderr_of(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn run_speculates_with_the_same_output_and_reports_it() {
    let dir = tempfile::tempdir().unwrap();
    let target = gguf_path("qwen3_moe", "f32");
    let text = reference("qwen3_moe")["prompt_text"]
        .as_str()
        .unwrap()
        .to_string();
    let prompt = format!("{text} {text}");
    let base = [
        "run",
        "-m",
        target.to_str().unwrap(),
        "-p",
        &prompt,
        "-n",
        "24",
        "--temp",
        "0",
        "--ram-budget",
        "800K",
    ];
    let plain = deltafin(&base);
    assert!(plain.status.success(), "{}", stderr_of(&plain));
    // a dense sibling with the same vocabulary as draft model, and prompt lookup; the draft
    // model's 925.5 KiB come out of the budget, so its run has that much more (the target
    // streams under the same 800 KiB)
    let qwen3 = gguf_path("qwen3", "f32");
    for (extra, source, budget) in [
        (vec!["--lookup", "--draft-fixed"], "lookup", "800K"),
        (
            vec!["--draft-model", qwen3.to_str().unwrap(), "--draft-fixed"],
            "draft-model",
            "1726K",
        ),
    ] {
        let json = dir.path().join(format!("{source}.json"));
        let mut args = base.to_vec();
        *args.last_mut().unwrap() = budget;
        args.extend(&extra);
        args.extend(["--stats-json", json.to_str().unwrap()]);
        let o = deltafin(&args);
        assert!(o.status.success(), "{source}: {}", stderr_of(&o));
        assert_eq!(o.stdout, plain.stdout, "{source}");
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let sp = &v["speculative"];
        assert_eq!(sp["source"], source);
        let (drafted, accepted) = (
            sp["drafted"].as_u64().unwrap(),
            sp["accepted"].as_u64().unwrap(),
        );
        assert!(drafted > 0 && accepted <= drafted, "{sp}");
        assert_eq!(
            sp["target_passes"].as_u64().unwrap(),
            sp["verify_passes"].as_u64().unwrap() + sp["plain_passes"].as_u64().unwrap()
        );
        let gen = v["generated_tokens"].as_u64().unwrap();
        assert_eq!(gen, 24);
        assert_eq!(
            sp["verify_tokens"].as_u64().unwrap() + sp["plain_passes"].as_u64().unwrap(),
            gen - 1
        );
        assert!(sp["verify_bytes"].as_u64().unwrap() > 0, "streamed: {sp}");
    }
}

#[test]
fn speculation_refusals_name_the_reason() {
    let f = |fam: &str| gguf_path(fam, "f32").to_str().unwrap().to_string();
    let (qm, mx) = (f("qwen3_moe"), f("mixtral"));
    let o = deltafin(&[
        "run",
        "-m",
        &qm,
        "-p",
        "hi",
        "-n",
        "2",
        "--draft-model",
        &mx,
    ]);
    assert_eq!(
        stderr_of(&o).trim(),
        format!("error: --draft-model {mx}: its vocabulary has 485 tokens but the model's has 512; a draft model needs the same vocabulary")
    );
    // same size, one token's text changed
    let dir = tempfile::tempdir().unwrap();
    let edited = dir.path().join("edited.gguf");
    common::gguf::edited_gguf(
        Path::new(&f("qwen3")),
        &edited,
        |m| {
            for (k, v) in m.iter_mut() {
                if k == "tokenizer.ggml.tokens" {
                    if let deltafin::source::gguf::Value::Array(a) = v {
                        a[300] = deltafin::source::gguf::Value::String("<|edited|>".into());
                    }
                }
            }
        },
        |_| true,
    );
    let o = deltafin(&[
        "run",
        "-m",
        &qm,
        "-p",
        "hi",
        "-n",
        "2",
        "--draft-model",
        edited.to_str().unwrap(),
    ]);
    let e = stderr_of(&o);
    assert!(
        e.contains("token 300 is '<|edited|>' there but '")
            && e.ends_with("in the model; a draft model needs the same vocabulary\n"),
        "{e}"
    );
    let o = deltafin(&[
        "run",
        "-m",
        &f("kimi_linear"),
        "-p",
        "hi",
        "-n",
        "2",
        "--lookup",
    ]);
    assert!(stderr_of(&o).contains("keeps a recurrent state (Kimi Delta Attention layers)"));
    let o = deltafin(&[
        "run",
        "-m",
        &qm,
        "-p",
        "hi",
        "--lookup",
        "--draft-max",
        "2",
        "--draft-min",
        "3",
    ]);
    assert_eq!(
        stderr_of(&o).trim(),
        "error: --draft-min 3 is above --draft-max 2"
    );
    // serve and chat check the same way, before listening or reading standard input
    for cmd in ["serve", "chat"] {
        let o = deltafin(&[cmd, "-m", &f("kimi_linear"), "--lookup"]);
        assert!(
            stderr_of(&o).contains("keeps a recurrent state (Kimi Delta Attention layers)"),
            "{cmd}: {}",
            stderr_of(&o)
        );
        let o = deltafin(&[cmd, "-m", &qm, "--draft-model", &mx]);
        assert_eq!(
            stderr_of(&o).trim(),
            format!("error: --draft-model {mx}: its vocabulary has 485 tokens but the model's has 512; a draft model needs the same vocabulary"),
            "{cmd}"
        );
    }
}

/// The draft model's RAM (weights, KV cache, activations) comes out of `--ram-budget` before
/// the target is placed: the target is placed exactly as a plain run under the budget less
/// the draft's bytes, which are the draft model's own placement; a budget that cannot hold the
/// draft, or the target beside it, is refused with both sizes named.
#[test]
fn a_draft_model_takes_its_share_of_the_ram_budget() {
    let dir = tempfile::tempdir().unwrap();
    let target = gguf_path("qwen3_moe", "f32");
    let draft = gguf_path("qwen3", "f32");
    let (t, d) = (target.to_str().unwrap(), draft.to_str().unwrap());
    let stats = |model: &str, extra: &[&str]| {
        let json = dir.path().join("s.json");
        let mut args = vec![
            "run",
            "-m",
            model,
            "-p",
            "hello hello",
            "-n",
            "8",
            "--temp",
            "0",
            "--stats-json",
            json.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let o = deltafin(&args);
        assert!(o.status.success(), "{extra:?}: {}", stderr_of(&o));
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        v
    };
    let u = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap();
    // the draft model's own placement, loaded whole with the same context
    let own = stats(d, &[]);
    let (w, kv, act) = (
        u(&own, "resident_bytes"),
        u(&own, "kv_bytes"),
        u(&own, "scratch_bytes"),
    );
    let budget = 900u64 << 10;
    let with = stats(t, &["--ram-budget", "900K", "--draft-model", d]);
    let share = u(&with["speculative"], "draft_bytes");
    assert_eq!(share, w + kv + act);
    let rest = (budget - share).to_string();
    let plain = stats(t, &["--ram-budget", &rest]);
    for k in [
        "placement",
        "resident_bytes",
        "streamed_bytes_per_pass",
        "stream_buffer_bytes",
        "kv_bytes",
        "scratch_bytes",
    ] {
        assert_eq!(with[k], plain[k], "{k}");
    }
    assert_eq!(
        with["experts"]["cache_budget_bytes"],
        plain["experts"]["cache_budget_bytes"]
    );
    assert!(u(&with, "streamed_bytes_per_pass") > 0, "{with}");
    let kib = |b: u64| format!("{:.1} KiB", b as f64 / 1024.0);
    let parts = format!(
        "--draft-model {d} takes {} (weights {}, KV cache for 17 tokens {}, activations {})",
        kib(share),
        kib(w),
        kib(kv),
        kib(act)
    );
    let run_err = |b: &str| {
        let o = deltafin(&[
            "run",
            "-m",
            t,
            "-p",
            "hello hello",
            "-n",
            "8",
            "--ram-budget",
            b,
            "--draft-model",
            d,
        ]);
        assert!(!o.status.success());
        stderr_of(&o).trim().to_string()
    };
    assert_eq!(
        run_err("500K"),
        format!(
            "error: --ram-budget 500.0 KiB cannot hold the draft model: {parts}, and the model needs room of its own"
        )
    );
    let e = run_err("600K");
    assert!(
        e.starts_with(&format!(
            "error: --ram-budget 600.0 KiB is too small for the model and its draft model: {parts}, leaving {}, and the model needs at least ",
            kib((600 << 10) - share)
        )) && e.contains("for the KV cache for 17 tokens"),
        "{e}"
    );
}

/// A stop string inside a verification's accepted drafts: the output ends at the stop as
/// plain decoding's does, and the tokens the step yielded past it are reported as
/// `discarded`, so `1 + plain_passes + verify_tokens − discarded` is the generated count.
/// Draft flags without a draft source are refused.
#[test]
fn tokens_accepted_past_a_stop_are_reported_as_discarded() {
    let dir = tempfile::tempdir().unwrap();
    let demo = common::demo_gguf();
    let m = demo.to_str().unwrap();
    let p = "Repeat after me exactly: the quick brown fox jumps over the lazy dog. the quick \
             brown fox jumps over the lazy dog. the quick brown fox jumps over the lazy dog.";
    let stop = "dog.\n\nThe quick";
    let base = [
        "run", "-m", m, "-p", p, "-n", "40", "--temp", "0", "--stop", stop,
    ];
    let plain = deltafin(&base);
    assert!(plain.status.success(), "{}", stderr_of(&plain));
    let json = dir.path().join("s.json");
    let mut a = base.to_vec();
    a.extend([
        "--lookup",
        "--draft-fixed",
        "--stats-json",
        json.to_str().unwrap(),
    ]);
    let spec = deltafin(&a);
    assert_eq!(spec.stdout, plain.stdout, "{}", stderr_of(&spec));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let sp = &v["speculative"];
    let n = |k: &str| sp[k].as_u64().unwrap();
    assert_eq!(v["finish"], "stop", "{v}");
    assert_eq!(v["stop_string"], stop, "{v}");
    assert!(n("discarded") > 0, "{sp}");
    assert_eq!(
        1 + n("plain_passes") + n("verify_tokens") - n("discarded"),
        v["generated_tokens"].as_u64().unwrap(),
        "{sp}"
    );
    let o = deltafin(&["run", "-m", m, "-p", "hi", "-n", "2", "--draft-max", "4"]);
    assert!(!o.status.success());
    assert!(
        stderr_of(&o).contains("<--lookup|--draft-model <MODEL>|--draft <KIND>>"),
        "{}",
        stderr_of(&o)
    );
}
