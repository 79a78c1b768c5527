//! The commands around serving, run as the real binary on the committed Qwen3-MoE fixture:
//! `deltafin tokenize`, `run --verbose-prompt`, and `deltafin chat` reading standard input
//! that is not a terminal (history, `/reset`, `/system`), also decoding speculatively.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

const MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/hf/qwen3_moe");

fn deltafin(args: &[&str], stdin: &str) -> (String, String) {
    let o = common::output_with_stdin(
        Command::new(env!("CARGO_BIN_EXE_deltafin")).args(args),
        stdin,
    );
    let err = String::from_utf8(o.stderr).unwrap();
    assert!(o.status.success(), "{err}");
    (String::from_utf8(o.stdout).unwrap(), err)
}

#[test]
fn tokenize_prints_ids_and_pieces() {
    let (out, _) = deltafin(&["tokenize", "-m", MODEL, "Hi 🦀"], "");
    assert_eq!(
        out,
        "prompt: 'Hi 🦀'\nnumber of tokens in prompt = 5\n      39 -> 'H'\n      72 -> 'i'\n     393 -> ' \u{FFFD}'\n      99 -> '\u{FFFD}'\n     222 -> '\u{FFFD}'\n"
    );
}

#[test]
fn verbose_prompt_shows_the_rendered_chat() {
    let (_, err) = deltafin(
        &[
            "run",
            "-m",
            MODEL,
            "--chat",
            "-p",
            "Hello",
            "-n",
            "1",
            "--temp",
            "0",
            "--verbose-prompt",
        ],
        "",
    );
    assert!(err.starts_with(
        "prompt: '<|im_start|>user\\nHello<|im_end|>\\n<|im_start|>assistant\\n'\nnumber of tokens in prompt = 20\n     481 -> '<|im_start|>'\n      84 -> 'u'\n"
    ), "{err}");
}

#[test]
fn chat_keeps_history_and_resets() {
    let args = ["chat", "-m", MODEL, "--temp", "0", "-n", "5"];
    let (out, _) = deltafin(&args, "Hello\n/reset\nHello\n/system Be brief.\nHello\n");
    // one answer per line (the third answer ends in a newline of its own); after /reset the
    // same question gets the same greedy answer, and a system message changes it
    assert_eq!(
        out,
        ". netwSharJS\u{FFFD}\n. netwSharJS\u{FFFD}\n. netwShar\u{FFFD}.\n\n"
    );
    // without /reset, the second turn sees the first (its KV cache is reused)
    let (two, _) = deltafin(&args, "Hello\nHello\n");
    assert_eq!(two, ". netwSharJS\u{FFFD}\n.\u{30d3}\u{FFFD}en\n");
}

/// `chat` with `--lookup` or a draft model (the same fixture quantized to Q8_0, in GGUF) prints
/// exactly what plain decoding prints, over turns that reuse the KV cache and a `/reset`.
#[test]
fn chat_speculates_with_the_same_answers() {
    let args = ["chat", "-m", MODEL, "--temp", "0", "-n", "12"];
    let input = "Hello Hello Hello\nHello again\n/reset\nabc abc abc\n";
    let (plain, _) = deltafin(&args, input);
    assert_eq!(plain.lines().count(), 3, "{plain}");
    let draft = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/gguf/qwen3_moe/qwen3_moe-q8_0.gguf"
    );
    for extra in [
        &["--lookup"][..],
        &["--lookup", "--draft-fixed"][..],
        &["--draft-model", draft, "--draft-max", "3", "--draft-fixed"][..],
    ] {
        let mut a = args.to_vec();
        a.extend_from_slice(extra);
        a.push("--stats");
        let (out, err) = deltafin(&a, input);
        assert_eq!(out, plain, "{extra:?}");
        // one table per answer; with a fixed draft length (the adaptive one follows timings),
        // drafts were accepted in some answer
        assert_eq!(err.matches("--- speculative ---").count(), 3, "{err}");
        if extra.len() == 1 {
            continue;
        }
        assert!(
            err.lines()
                .filter(|l| l.starts_with("drafted / accepted"))
                .any(|l| !l.contains("/ 0 (")),
            "{err}"
        );
    }
}

/// `chat --draft mtp` on the DeepSeek V3 fixture with its multi-token-prediction layer
/// prints exactly what plain decoding prints, over turns that reuse the KV cache and a
/// `/reset`, and each answer's table names the source `mtp` and its counters.
#[test]
fn chat_draft_mtp_gives_the_same_answers() {
    let model = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/hf/deepseek_v3_mtp"
    );
    let args = ["chat", "-m", model, "--temp", "0", "-n", "12"];
    let input = "Which experts?\nAnd again\n/reset\nabc abc abc\n";
    let (plain, _) = deltafin(&args, input);
    let mut a = args.to_vec();
    a.extend([
        "--draft",
        "mtp",
        "--draft-max",
        "3",
        "--draft-fixed",
        "--stats",
    ]);
    let (out, err) = deltafin(&a, input);
    assert_eq!(out, plain);
    assert_eq!(err.matches("--- speculative ---").count(), 3, "{err}");
    assert_eq!(
        err.matches("source               mtp\n").count(),
        3,
        "{err}"
    );
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("drafted / accepted") || l.starts_with("target passes"))
        .collect();
    // each answer (12 tokens): 10 verifications of 3 drafts but the last, then one plain
    // pass; none accepted (the fixture's MTP layer has random weights); the second turn,
    // reusing the first's cache, drafts from its first step like the others
    let answer = [
        "drafted / accepted   27 / 0 (0.0% accepted, 0.00 per verification)",
        "target passes        11 (10 verification, 1 plain; 0 fallbacks; 0 tokens past the stop)",
    ];
    assert_eq!(lines, answer.repeat(3), "{err}");
}

/// `chat --stats-json FILE`: one JSON object per answer, one per line, with the turn, the
/// finish reason, the token counts (the second turn reuses the first's KV cache) and the
/// speculation counters.
#[test]
fn chat_stats_json_writes_one_line_per_answer() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("chat.jsonl");
    let args = [
        "chat",
        "-m",
        MODEL,
        "--temp",
        "0",
        "-n",
        "6",
        "--lookup",
        "--stats-json",
        f.to_str().unwrap(),
    ];
    deltafin(&args, "Hello Hello Hello\nHello again\n");
    let text = std::fs::read_to_string(&f).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{text}");
    for (i, v) in lines.iter().enumerate() {
        assert_eq!(v["turn"], i as u64 + 1, "{v}");
        assert_eq!(v["finish"], "length", "{v}");
        assert_eq!(v["completion_tokens"], 6, "{v}");
        assert_eq!(v["speculative"]["source"], "lookup", "{v}");
    }
    assert_eq!(lines[0]["cached_tokens"], 0);
    assert!(
        lines[1]["cached_tokens"].as_u64().unwrap() > 0,
        "{}",
        lines[1]
    );
}

/// `deltafin serve` on the fixture at a free loopback port, greedy: the child, its standard
/// error past the first line, and the address that line names.
fn start_server() -> (
    std::process::Child,
    std::io::BufReader<std::process::ChildStderr>,
    String,
) {
    use std::io::BufRead;
    let mut child = Command::new(env!("CARGO_BIN_EXE_deltafin"))
        .args(["serve", "-m", MODEL, "--port", "0", "--temp", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut first = String::new();
    err.read_line(&mut first).unwrap();
    let addr = first
        .trim()
        .strip_prefix("serving qwen3_moe on http://")
        .and_then(|r| r.strip_suffix(" (OpenAI API under /v1)"))
        .unwrap_or_else(|| panic!("{first}"))
        .to_string();
    (child, err, addr)
}

/// `deltafin serve` logs each request in one line on standard error (method, path, status,
/// prompt and completion tokens, milliseconds), at info level with no flag: a completion, a
/// streamed one, and a request for an unknown path.
#[test]
fn serve_logs_each_request_in_one_line() {
    use std::io::Read;
    let (mut child, mut err, addr) = start_server();
    let request = |method: &str, path: &str, body: &str| -> String {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    let whole = request(
        "POST",
        "/v1/completions",
        r#"{"model":"qwen3_moe","prompt":"Hello","max_tokens":3}"#,
    );
    assert!(
        whole.starts_with("HTTP/1.1 200")
            && whole.contains(r#""usage":{"prompt_tokens":5,"completion_tokens":3,"#),
        "{whole}"
    );
    let streamed = request(
        "POST",
        "/v1/chat/completions",
        r#"{"model":"qwen3_moe","messages":[{"role":"user","content":"Hi"}],"max_tokens":2,"stream":true}"#,
    );
    assert!(streamed.contains("data: [DONE]"), "{streamed}");
    let missing = request("GET", "/nowhere", "");
    assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
    // SAFETY: signalling the child we started, by its id.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    assert!(child.wait().unwrap().success(), "{rest}");
    // each line: a timestamp, INFO, then the fields in order
    let fields: Vec<&str> = rest
        .lines()
        .filter_map(|l| l.split_once(" INFO request ").map(|(_, f)| f))
        .collect();
    assert_eq!(fields.len(), 3, "{rest}");
    let split = |f: &str| -> (String, u64) {
        let (a, ms) = f.rsplit_once(" ms=").unwrap();
        (a.to_string(), ms.parse().unwrap())
    };
    let lines: Vec<(String, u64)> = fields.iter().map(|f| split(f)).collect();
    assert_eq!(
        lines.iter().map(|l| l.0.as_str()).collect::<Vec<_>>(),
        [
            "method=POST path=/v1/completions status=200 prompt_tokens=5 completion_tokens=3",
            "method=POST path=/v1/chat/completions status=200 prompt_tokens=17 completion_tokens=2",
            "method=GET path=/nowhere status=404 prompt_tokens=0 completion_tokens=0",
        ]
    );
}

/// A client that hangs up mid-stream cannot kill `deltafin serve`: SIGPIPE stays ignored in
/// the server (CI once saw the server die of it when a write met a reset connection, a race),
/// checked on the process's signal mask in `/proc`, then by twelve streams cut after their
/// first event, each followed by a request the server must still answer.
#[test]
fn serve_survives_clients_that_hang_up_mid_stream() {
    use std::io::{BufRead, BufReader, Read};
    let (mut child, mut err, addr) = start_server();
    // SigIgn: the ignored signals as a hex mask, bit (n - 1) for signal n
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
    let ignored = status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .map(|h| u64::from_str_radix(h.trim(), 16).unwrap())
        .unwrap();
    assert_ne!(
        ignored & (1 << (libc::SIGPIPE - 1)),
        0,
        "SigIgn: {ignored:x}"
    );
    let body =
        r#"{"model":"qwen3_moe","prompt":"Once upon a time","max_tokens":400,"stream":true}"#;
    for _ in 0..12 {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        write!(
            s,
            "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut line = String::new();
        while !line.starts_with("data: ") {
            line.clear();
            r.read_line(&mut line).unwrap();
        }
        s.shutdown(std::net::Shutdown::Both).unwrap();
        drop((r, s));
        let mut h = std::net::TcpStream::connect(&addr).unwrap();
        write!(
            h,
            "GET /health HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        h.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    }
    // SAFETY: signalling the child we started, by its id.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    assert!(child.wait().unwrap().success(), "{rest}");
}
