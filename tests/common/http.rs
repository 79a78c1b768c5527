//! `deltafin serve` run as the real binary on the committed Qwen3-MoE fixture, spoken to in
//! raw HTTP/1.1 over TCP (so tests choose every header, byte and pause).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, ChildStderr, Command, Stdio};
use std::time::Duration;

pub const MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/hf/qwen3_moe");

/// A running server; stopped with SIGTERM when dropped.
pub struct Server {
    pub child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    pub stderr: BufReader<ChildStderr>,
}

/// An answer: status code, headers (names lowercased) and body (chunked bodies decoded).
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    /// The first header named `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

impl Server {
    /// Starts `deltafin serve -m MODEL --port 0 --temp 0 EXTRA…` and waits for its address.
    pub fn start(extra: &[&str]) -> Server {
        Server::start_model(MODEL, extra)
    }

    /// Starts `deltafin serve -m model --port 0 --temp 0 EXTRA…` and waits for its address.
    pub fn start_model(model: &str, extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_deltafin"))
            .args(["serve", "-m", model, "--port", "0", "--temp", "0"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut addr = None;
        let mut seen = String::new();
        for _ in 0..20 {
            let mut line = String::new();
            if stderr.read_line(&mut line).unwrap() == 0 {
                break;
            }
            seen.push_str(&line);
            if let Some(rest) = line.trim().split_once(" on http://").map(|(_, r)| r) {
                addr = rest
                    .strip_suffix(" (OpenAI API under /v1)")
                    .map(str::to_string);
                break;
            }
        }
        let addr = addr.unwrap_or_else(|| panic!("no address in {seen}"));
        Server {
            child,
            addr,
            stderr,
        }
    }

    /// Sends `head` (the request line and headers, without the blank line) and `body`, with
    /// `Host`, `Content-Length` and `Connection: close` added unless `head` has them, and
    /// reads the whole answer.
    pub fn raw(&self, head: &str, body: &str) -> Answer {
        let mut h = head.to_string();
        let lower = head.to_ascii_lowercase();
        if !lower.contains("\r\nhost:") {
            h.push_str(&format!("\r\nHost: {}", self.addr));
        }
        if !lower.contains("\r\ncontent-length:") {
            h.push_str(&format!("\r\nContent-Length: {}", body.len()));
        }
        h.push_str("\r\nConnection: close\r\n\r\n");
        let mut s = TcpStream::connect(&self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s.write_all(h.as_bytes()).unwrap();
        s.write_all(body.as_bytes()).unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).unwrap();
        parse(&String::from_utf8(out).unwrap())
    }

    /// `POST path` with a JSON body.
    pub fn post(&self, path: &str, body: &serde_json::Value) -> Answer {
        self.raw(
            &format!("POST {path} HTTP/1.1\r\nContent-Type: application/json"),
            &body.to_string(),
        )
    }

    /// `GET path`.
    pub fn get(&self, path: &str) -> Answer {
        self.raw(&format!("GET {path} HTTP/1.1"), "")
    }

    /// Sends SIGTERM and returns what the server wrote on standard error after its address,
    /// asserting it exited with success.
    pub fn stop(mut self) -> String {
        let mut rest = String::new();
        self.term();
        self.stderr.read_to_string(&mut rest).unwrap();
        assert!(self.child.wait().unwrap().success(), "{rest}");
        rest
    }

    fn term(&self) {
        // SAFETY: signalling the child this test started, by its id.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.term();
            let _ = self.child.wait();
        }
    }
}

/// Parses an HTTP/1.1 answer, decoding a chunked body.
pub fn parse(text: &str) -> Answer {
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {text:?}"));
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap()[9..12].parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v == "chunked");
    let body = if chunked {
        let mut out = String::new();
        let mut rest = body;
        while let Some((size, tail)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).unwrap();
            if n == 0 {
                break;
            }
            out.push_str(&tail[..n]);
            rest = &tail[n + 2..];
        }
        out
    } else {
        body.to_string()
    };
    Answer {
        status,
        headers,
        body,
    }
}
