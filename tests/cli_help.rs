//! The front door of the `deltafin` binary: each command lists (and takes) only the flags it
//! honours, `run --help` gives one line per flag, `pack --help` lists the packable families
//! from the registry, and every model flag (`-m` of each command, `--draft-model`) goes
//! through the one resolver: Hugging Face repositories `ORG/NAME` in the cache, and a single
//! `.safetensors` file refused with the folder to pass instead.

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::gguf::gguf_path;
use common::hf::fixture;

fn deltafin(args: &[&str]) -> Output {
    common::output_or_kill(Command::new(env!("CARGO_BIN_EXE_deltafin")).args(args))
}

/// `deltafin ARGS` with `HF_HUB_CACHE` set to `cache`, `stdin` written to it.
fn deltafin_in(cache: &Path, args: &[&str], stdin: &str) -> Output {
    common::output_with_stdin(
        Command::new(env!("CARGO_BIN_EXE_deltafin"))
            .args(args)
            .env("HF_HUB_CACHE", cache)
            .env_remove("HF_HOME"),
        stdin,
    )
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn help(cmd: &str) -> String {
    ok(&deltafin(&[cmd, "--help"]))
}

/// The long flags a help text lists (the first `--NAME` of each option line).
fn long_flags(help: &str) -> BTreeSet<String> {
    help.lines()
        .filter(|l| l.trim_start().starts_with('-'))
        .filter_map(|l| {
            l.split_whitespace()
                .find(|w| w.starts_with("--"))
                .map(|w| w.trim_end_matches(',').to_string())
        })
        .collect()
}

fn set(flags: &[&str]) -> BTreeSet<String> {
    flags.iter().map(|s| s.to_string()).collect()
}

/// The flags of the model and how it runs, which `run`, `serve` and `chat` all take.
const ENGINE: &[&str] = &[
    "--model",
    "--max-tokens",
    "--temp",
    "--top-k",
    "--top-p",
    "--min-p",
    "--repeat-penalty",
    "--repeat-last-n",
    "--seed",
    "--stop",
    "--ram-budget",
    "--ctx-size",
    "--batch-size",
    "--threads",
    "--no-direct-io",
    "--numerics",
    "--device",
    "--cache",
    "--heat-file",
    "--io-engine",
    "--io-depth",
    "--io-request-size",
    "--drive-bandwidth",
    "--trace",
    "--verify-experts",
    "--no-verify-experts",
    "--prefetch",
    "--prefetch-depth",
    "--read-ahead",
    "--local-cache",
    "--local-cache-size",
    "--s3-concurrency",
    "--s3-timeout",
    "--s3-retries",
    "--lookup",
    "--draft-model",
    "--draft",
    "--draft-max",
    "--draft-min",
    "--draft-fixed",
    "--help",
];

#[test]
fn each_command_lists_exactly_the_flags_it_takes() {
    let with = |extra: &[&str]| {
        let mut s = set(ENGINE);
        s.extend(set(extra));
        s
    };
    assert_eq!(
        long_flags(&help("run")),
        with(&[
            "--prompt",
            "--file",
            "--chat",
            "--system",
            "--no-parse-special",
            "--no-display-prompt",
            "--verbose-prompt",
            "--stats",
            "--stats-json",
        ])
    );
    assert_eq!(
        long_flags(&help("serve")),
        with(&[
            "--host",
            "--port",
            "--api-key",
            "--api-key-file",
            "--queue",
            "--parallel",
            "--kv-unified",
            "--alias",
            "--allowed-hosts",
            "--cors-origin",
            "--timeout",
            "--idle-timeout",
            "--write-timeout",
            "--body-limit",
            "--body-timeout",
        ])
    );
    assert_eq!(
        long_flags(&help("chat")),
        with(&["--system", "--stats", "--stats-json"])
    );
}

#[test]
fn flags_a_command_does_not_take_are_refused_by_clap() {
    for (args, flag) in [
        (&["serve", "-p", "x"][..], "-p"),
        (&["serve", "--system", "x"][..], "--system"),
        (&["serve", "--chat"][..], "--chat"),
        (&["serve", "--stats"][..], "--stats"),
        (&["serve", "--verbose-prompt"][..], "--verbose-prompt"),
        (&["chat", "-p", "x"][..], "-p"),
        (&["chat", "--chat"][..], "--chat"),
        (&["chat", "--verbose-prompt"][..], "--verbose-prompt"),
        (&["chat", "-f", "x"][..], "-f"),
    ] {
        let o = deltafin(args);
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
        assert!(
            e.starts_with(&format!("error: unexpected argument '{flag}' found")),
            "{args:?}: {e}"
        );
    }
    // run's --system belongs to --chat
    let o = deltafin(&["run", "--system", "x", "-p", "y"]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.starts_with("error: the following required arguments were not provided:\n  --chat\n"),
        "{e}"
    );
    let o = deltafin(&["run", "-p", "x", "-f", "y"]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.starts_with("error: the argument '--prompt <TEXT>' cannot be used with '--file <FILE>'"),
        "{e}"
    );
}

/// `chat --system TEXT` starts the conversation as `/system TEXT` does.
#[test]
fn chat_takes_a_system_message() {
    let m = fixture("qwen3_moe");
    let m = m.to_str().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let args = ["chat", "-m", m, "--temp", "0", "-n", "5"];
    let typed = ok(&deltafin_in(
        cache.path(),
        &args,
        "/system Be brief.\nHello\n",
    ));
    let mut flag = args.to_vec();
    flag.extend(["--system", "Be brief."]);
    assert_eq!(ok(&deltafin_in(cache.path(), &flag, "Hello\n")), typed);
    // and it changes the answer
    assert_ne!(ok(&deltafin_in(cache.path(), &args, "Hello\n")), typed);
}

#[test]
fn run_help_gives_one_line_per_flag() {
    let h = help("run");
    assert_eq!(h.matches("docs/commands.md").count(), 1, "{h}");
    for line in h.lines().filter(|l| l.trim_start().starts_with('-')) {
        // a flag, then its help on the same line
        let help_text = line
            .trim_start()
            .split("  ")
            .filter(|s| !s.is_empty())
            .nth(1);
        assert!(help_text.is_some(), "no help on the flag's line: {line:?}");
    }
    // no continuation lines: every indented line is a flag
    for line in h.lines().filter(|l| l.starts_with(' ')) {
        assert!(line.trim_start().starts_with('-'), "{line:?}");
    }
    assert_eq!(ok(&deltafin(&["run", "-h"])), h);
    insta::assert_snapshot!(h);
}

#[test]
fn pack_help_lists_the_families_of_the_registry() {
    let h = help("pack");
    let families = h
        .split("Families packed (config.json model_type / GGUF general.architecture):\n")
        .nth(1)
        .unwrap_or_else(|| panic!("{h}"));
    assert_eq!(
        families,
        "  llama        qwen3, qwen3_moe, llama, mixtral / qwen3moe, qwen3, llama\n  \
         gpt_oss      gpt_oss / gpt-oss\n  \
         deepseek_v3  deepseek_v3, kimi_k2 / deepseek2\n  \
         kimi_linear  kimi_linear / kimi-linear\n  \
         kimi_k3      kimi_k3 / kimi-k3\n"
    );
    for name in ["kimi_linear", "kimi_k3", "kimi-linear", "kimi-k3"] {
        assert!(families.contains(name), "{name}");
    }
    // Gemma 3 is dense: not packed
    assert!(!families.contains("gemma3"));
}

/// Puts the files of `src` (a fixture folder, or one file) into `cache` as the Hugging Face
/// hub lays out repository `repo` at revision `r1`: links in `snapshots/r1/` into `blobs/`,
/// `refs/main`.
fn cache_repo(cache: &Path, repo: &str, src: &Path) {
    let dir = cache.join(format!("models--{}", repo.replace('/', "--")));
    let snap = dir.join("snapshots/r1");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(dir.join("blobs")).unwrap();
    std::fs::create_dir_all(dir.join("refs")).unwrap();
    std::fs::write(dir.join("refs/main"), "r1").unwrap();
    let files: Vec<PathBuf> = match src.is_dir() {
        true => std::fs::read_dir(src)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect(),
        false => vec![src.to_path_buf()],
    };
    for (i, f) in files.iter().enumerate() {
        let blob = format!("blob{i}");
        std::fs::copy(f, dir.join("blobs").join(&blob)).unwrap();
        std::os::unix::fs::symlink(
            format!("../../blobs/{blob}"),
            snap.join(f.file_name().unwrap()),
        )
        .unwrap();
    }
}

/// `-m ORG/NAME` of `serve`, `chat`, `tokenize` and `pack`, and `--draft-model ORG/NAME:FILE`,
/// find the models in the Hugging Face cache and do what they do with the folder or file.
#[test]
fn every_model_flag_reads_the_hugging_face_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("hub");
    let folder = fixture("qwen3_moe");
    let qm = folder.to_str().unwrap();
    cache_repo(&cache, "org/Qwen3-MoE", &folder);
    cache_repo(&cache, "org/Qwen3-GGUF", &gguf_path("qwen3", "f32"));

    // tokenize and chat: the same output as with the folder
    let t = ["tokenize", "-m", "org/Qwen3-MoE", "Hi there"];
    let want = ok(&deltafin(&["tokenize", "-m", qm, "Hi there"]));
    assert_eq!(ok(&deltafin_in(&cache, &t, "")), want);
    let chat = |m: &str| {
        ok(&deltafin_in(
            &cache,
            &["chat", "-m", m, "--temp", "0", "-n", "4"],
            "Hello\n",
        ))
    };
    assert_eq!(chat("org/Qwen3-MoE"), chat(qm));

    // --draft-model: speculation gives plain decoding's greedy text
    let target = gguf_path("qwen3_moe", "f32");
    let t = target.to_str().unwrap();
    let run = [
        "run",
        "-m",
        t,
        "-p",
        "hello hello hello",
        "-n",
        "6",
        "--temp",
        "0",
    ];
    let plain = ok(&deltafin(&run));
    let mut spec = run.to_vec();
    spec.extend(["--draft-model", "org/Qwen3-GGUF:qwen3-f32.gguf"]);
    assert_eq!(ok(&deltafin_in(&cache, &spec, "")), plain);
    let mut missing = run.to_vec();
    missing.extend(["--draft-model", "org/none"]);
    let o = deltafin_in(&cache, &missing, "");
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        format!(
            "error: --draft-model org/none: org/none is not a file or folder, and the Hugging Face cache has no org/none ({}): `deltafin pull org/none` downloads it\n",
            cache.join("models--org--none").display()
        )
    );

    // pack: the pack of the cached folder
    let out = tmp.path().join("pack");
    let drive = tmp.path().join("d0");
    std::fs::create_dir_all(&drive).unwrap();
    let args = [
        "pack",
        "-m",
        "org/Qwen3-MoE",
        "--out",
        out.to_str().unwrap(),
        "--drives",
        drive.to_str().unwrap(),
    ];
    let text = ok(&deltafin_in(&cache, &args, ""));
    assert!(
        text.starts_with(&format!("{}: ", out.display())) && text.contains(" items written"),
        "{text}"
    );
    assert_eq!(
        ok(&deltafin_in(
            &cache,
            &["tokenize", "-m", out.to_str().unwrap(), "Hi there"],
            ""
        )),
        want
    );

    // serve: listens with the cached model, named as given
    let mut child = Command::new(env!("CARGO_BIN_EXE_deltafin"))
        .args(["serve", "-m", "org/Qwen3-MoE", "--port", "0"])
        .env("HF_HUB_CACHE", &cache)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    while err.read_line(&mut first).unwrap() > 0 && !first.contains("serving ") {}
    // SAFETY: signalling the child started above.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    child.wait().unwrap();
    assert!(
        first.starts_with("serving Qwen3-MoE on http://127.0.0.1:"),
        "{first}"
    );
}

/// One safetensors file given as the model: refused by every command, naming the folder.
#[test]
fn a_safetensors_file_names_the_folder_to_pass() {
    let dir = fixture("qwen3_moe");
    let file = dir.join("model-00001-of-00002.safetensors");
    let f = file.to_str().unwrap();
    let want = format!(
        "error: {f}: one file of a Hugging Face checkpoint; pass the folder that holds it: {}\n",
        dir.display()
    );
    let out = tempfile::tempdir().unwrap();
    let o = out.path().to_str().unwrap();
    for args in [
        &["run", "-m", f, "-p", "x"][..],
        &["inspect", "-m", f][..],
        &["tokenize", "-m", f, "x"][..],
        &["chat", "-m", f][..],
        &["serve", "-m", f][..],
        &["bench", "-m", f][..],
        &["pack", "-m", f, "--out", o, "--drives", o][..],
        &[
            "run",
            "-m",
            dir.to_str().unwrap(),
            "-p",
            "x",
            "--draft-model",
            f,
        ][..],
    ] {
        let r = deltafin(args);
        let e = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(1), "{args:?}: {e}");
        match args.contains(&"--draft-model") {
            true => assert_eq!(
                e,
                want.replacen("error: ", &format!("error: --draft-model {f}: "), 1)
            ),
            false => assert_eq!(e, want, "{args:?}"),
        }
    }
}
