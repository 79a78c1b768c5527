//! `deltafin run`, `deltafin chat` (standard input) and `deltafin serve` (HTTP) go through the
//! engine's one generation loop: the same prompt with the same settings gives the same text
//! from all three, greedy and sampled with a seed, on the committed Qwen3-MoE fixture. The
//! chat prompt is sent as a user message (`run --chat`, `chat`, `/v1/chat/completions`) and as
//! its rendered template text, raw (`run -p`, `/v1/completions`).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};

const MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/hf/qwen3_moe");
const USER: &str = "Tell me a story";
/// `USER` as the fixture's chat template renders it for an answer.
const RENDERED: &str = "<|im_start|>user\nTell me a story<|im_end|>\n<|im_start|>assistant\n";
const MAX_TOKENS: u64 = 12;

/// Standard output of the binary run with `args` on `stdin`, which must succeed.
fn stdout(args: &[&str], stdin: &str) -> String {
    let o = common::output_with_stdin(
        Command::new(env!("CARGO_BIN_EXE_deltafin")).args(args),
        stdin,
    );
    let err = String::from_utf8(o.stderr).unwrap();
    assert!(o.status.success(), "{args:?}: {err}");
    String::from_utf8(o.stdout).unwrap()
}

/// The answer in an output that ends it with one newline.
fn answer(out: &str) -> String {
    out.strip_suffix('\n')
        .unwrap_or_else(|| panic!("no final newline: {out:?}"))
        .to_string()
}

/// A `deltafin serve` process, killed when dropped.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    /// Starts `deltafin serve` on a free port with `flags` and waits for its address.
    fn start(flags: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_deltafin"))
            .args(["serve", "-m", MODEL, "--port", "0"])
            .args(flags)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut seen = String::new();
        let addr = loop {
            let mut line = String::new();
            if err.read_line(&mut line).unwrap() == 0 {
                let _ = child.kill();
                panic!("serve ended before listening: {seen}");
            }
            seen.push_str(&line);
            if let Some(rest) = line.strip_prefix("serving qwen3_moe on http://") {
                break rest.split(' ').next().unwrap().to_string();
            }
        };
        // keep reading standard error so that the server never blocks on it
        std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
        Server { child, addr }
    }

    /// POSTs `body` to `path` and returns the JSON answer (status 200 asserted).
    fn post(&self, path: &str, body: &Value) -> Value {
        let body = body.to_string();
        let mut s = TcpStream::connect(&self.addr).unwrap();
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.addr,
            body.len()
        )
        .unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        let (head, body) = resp.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200 "), "{resp}");
        assert!(
            head.to_ascii_lowercase().contains("content-length:"),
            "{head}"
        );
        serde_json::from_str(body).unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The text each front end generates with the sampling `flags` (also the server's defaults,
/// which the requests do not override but for `temperature`, `seed` and `max_tokens`, set to
/// the same values): `run --chat`, `chat`, `run` on the rendered prompt, and the server's
/// chat and text completions.
fn texts(server: &Server, flags: &[&str], temperature: f64, seed: u64) -> [String; 5] {
    let n = MAX_TOKENS.to_string();
    let mut base = vec!["-m", MODEL, "-n", n.as_str()];
    base.extend_from_slice(flags);
    let run_chat = stdout(&[&["run", "--chat", "-p", USER], &base[..]].concat(), "");
    let chat = stdout(&[&["chat"], &base[..]].concat(), &format!("{USER}\n"));
    let raw = [&["run", "--no-display-prompt", "-p", RENDERED], &base[..]].concat();
    let run_raw = stdout(&raw, "");
    let common = json!({
        "model": "qwen3_moe",
        "max_tokens": MAX_TOKENS,
        "temperature": temperature,
        "seed": seed,
    });
    let mut chat_req = common.clone();
    chat_req["messages"] = json!([{"role": "user", "content": USER}]);
    let served_chat = server.post("/v1/chat/completions", &chat_req);
    let mut text_req = common;
    text_req["prompt"] = json!(RENDERED);
    let served_text = server.post("/v1/completions", &text_req);
    [
        answer(&run_chat),
        answer(&chat),
        answer(&run_raw),
        served_chat["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string(),
        served_text["choices"][0]["text"]
            .as_str()
            .unwrap()
            .to_string(),
    ]
}

#[test]
fn run_chat_and_serve_generate_the_same_text() {
    let sampled = ["--temp", "0.8", "--seed", "42"];
    let server = Server::start(&sampled);
    let greedy = texts(&server, &["--temp", "0", "--seed", "42"], 0.0, 42);
    let drawn = texts(&server, &sampled, 0.8, 42);
    for t in [&greedy, &drawn] {
        assert!(!t[0].is_empty());
        for (i, other) in t.iter().enumerate() {
            assert_eq!(
                other, &t[0],
                "front end {i} of run --chat, chat, run, serve chat, serve text"
            );
        }
    }
    // the settings took effect: sampling with this seed leaves the greedy path
    assert_ne!(greedy[0], drawn[0]);
}
