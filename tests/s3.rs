//! Packs on object storage (issue 30) against a real S3-compatible server on loopback: moto's
//! server mode (`moto[server]`, installed by `tests/s3.sh` into `target/s3-venv`). With
//! `AWS_ENDPOINT_URL` set (as `tests/s3.sh` and CI set it) the tests use that server and must
//! reach it; without, they start `target/s3-venv/bin/moto_server` themselves, and skip with a
//! message only when it is not installed. Faults come from `tools/s3proxy/s3proxy.py` between
//! the engine and the server.
//!
//! A tiny synthetic `qwen3moe` GGUF (3 layers, 16 experts, top-4, Q4_0) packed on two drives
//! (stripe), uploaded with `pack --out s3://…`: logits from the pack on S3, with and without
//! the local tier, equal the local pack's bit for bit, and `run`'s text too; the second run
//! with a local tier fetches no expert byte; a killed upload resumes with the parts it had
//! sent; failed, short and stalled GETs are retried and counted, then named with the URL,
//! range, layer and expert; a corrupted record on the server is refused naming it; a corrupted
//! record in the local tier is fetched again, never used.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;

use common::pack::{bits, opts, pack_opts, session};
use common::prompt_and_greedy_logits;
use deltafin::quant::GgmlType;
use deltafin::remote::layout::record_offsets;
use deltafin::remote::local_copy;
use deltafin::source::pack::Manifest;
use deltafin::store::remote::{FetchOptions, Remote, S3Url};
use deltafin::write::pack::{write_pack, PackPlacement};
use deltafin::write::synth::presets;
use deltafin::write::synth::qwen3_moe_gguf::write_qwen3moe_gguf;

const PROMPT: [u32; 10] = [17, 300, 42, 99, 5, 256, 411, 3, 77, 128];
/// Keeps the spine and head resident and reads every expert on demand.
const BUDGET: &str = "384K";

/// The S3 server the tests use.
struct Server {
    endpoint: String,
}

static SERVER: OnceLock<Option<Server>> = OnceLock::new();

/// A free loopback port.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The status line of a plain HTTP request to `endpoint` (`None` when it cannot connect).
fn http(endpoint: &str, method: &str, path: &str) -> Option<String> {
    let hostport = endpoint.trim_start_matches("http://").trim_end_matches('/');
    let mut s = TcpStream::connect(hostport).ok()?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {hostport}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.lines().next().map(str::to_string)
}

/// The server: `AWS_ENDPOINT_URL`'s, else a moto server started here (stopped when the test
/// process ends), with test credentials; `None` (the test then returns) when there is none.
fn server() -> Option<&'static Server> {
    SERVER
        .get_or_init(|| {
            if let Ok(e) = std::env::var("AWS_ENDPOINT_URL") {
                return Some(Server { endpoint: e });
            }
            let moto = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/s3-venv/bin/moto_server");
            if !moto.exists() {
                eprintln!("skipped: no S3 server here ({} is not installed; tests/s3.sh installs moto[server] and runs these tests)", moto.display());
                return None;
            }
            let port = free_port();
            // the server ends when this process does
            let script = format!(
                "{} -H 127.0.0.1 -p {port} >/dev/null 2>&1 & m=$!; while kill -0 {} 2>/dev/null; do sleep 0.5; done; kill $m",
                moto.display(),
                std::process::id()
            );
            // the shell outlives every test and is reaped by whoever adopts it when this
            // process ends
            #[allow(clippy::zombie_processes)]
            let _shell = Command::new("sh")
                .args(["-c", &script])
                .env("S3_UPLOAD_PART_MIN_SIZE", "4096")
                .stdin(Stdio::null())
                .spawn()
                .unwrap();
            let endpoint = format!("http://127.0.0.1:{port}");
            for _ in 0..150 {
                if http(&endpoint, "GET", "/").is_some_and(|l| l.contains(" 200")) {
                    // SAFETY (of the environment): set once, while every other test of this
                    // file waits on this initialisation; the engine reads it as the standard
                    std::env::set_var("AWS_ENDPOINT_URL", &endpoint);
                    std::env::set_var("AWS_ACCESS_KEY_ID", "test");
                    std::env::set_var("AWS_SECRET_ACCESS_KEY", "test");
                    std::env::set_var("AWS_REGION", "us-east-1");
                    return Some(Server { endpoint });
                }
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            eprintln!("skipped: {} did not start on port {port}", moto.display());
            None
        })
        .as_ref()
}

/// Makes a bucket of its own for a test (`NAME-PID-NANOS`: a server outlives test runs; moto
/// takes an unsigned PUT) and returns the URL `s3://BUCKET/PREFIX`.
fn bucket(s: &Server, name: &str, prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let b = format!("{name}-{}-{nanos}", std::process::id());
    let l = http(&s.endpoint, "PUT", &format!("/{b}")).unwrap();
    assert!(l.contains(" 200"), "{l}");
    format!("s3://{b}/{prefix}")
}

/// The fault proxy in front of the server, with `args`; killed when dropped.
struct Proxy {
    child: Child,
    endpoint: String,
}

impl Proxy {
    fn start(s: &Server, args: &[&str]) -> Proxy {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/s3proxy/s3proxy.py");
        let mut child = Command::new("python3")
            .arg(script)
            .args(["--upstream", &s.endpoint])
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        out.read_line(&mut line).unwrap();
        // the proxy prints a line per fault: keep reading them
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        let port = line.trim().strip_prefix("listening ").unwrap();
        Proxy {
            endpoint: format!("http://127.0.0.1:{port}"),
            child,
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the binary with `args` (`DELTAFIN_HOME` in `home`, the endpoint `endpoint` when
/// given).
fn deltafin(home: &Path, endpoint: Option<&str>, args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_deltafin"));
    c.args(args).env("DELTAFIN_HOME", home);
    if let Some(e) = endpoint {
        c.env("AWS_ENDPOINT_URL", e);
    }
    c.output().unwrap()
}

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// A tiny GGUF source packed on two drives (stripe) in `tmp`: (source, pack).
fn packed(tmp: &Path) -> (PathBuf, PathBuf) {
    let src = tmp.join("src.gguf");
    let shape = presets()[0].2.clone();
    write_qwen3moe_gguf(&shape, GgmlType::Q4_0, &src, 3, &mut |_, _| {}).unwrap();
    let o = pack_opts(tmp, 2, PackPlacement::Stripe);
    write_pack(&src, &o).unwrap();
    (src, o.out)
}

/// `run`'s greedy text over `model`, with `extra` flags: no RAM cache and no read-ahead, so
/// that every expert use is one miss and every miss one read.
fn run_args<'a>(model: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![
        "run",
        "-m",
        model,
        "-p",
        "hello world",
        "-n",
        "8",
        "--temp",
        "0",
        "--ram-budget",
        BUDGET,
        "--cache",
        "none",
        "--read-ahead",
        "off",
    ];
    a.extend_from_slice(extra);
    a
}

/// The expert counters of a `--stats-json` file: (prefill, decode), each (misses,
/// fetched_bytes, fetches, fetch_retries, tier_hits).
fn fetch_stats(p: &Path) -> [[u64; 5]; 2] {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
    let e = &v["experts"];
    let one = |ph: &str| {
        let c = &e[ph];
        [
            "misses",
            "fetched_bytes",
            "fetches",
            "fetch_retries",
            "tier_hits",
        ]
        .map(|k| c[k].as_u64().unwrap_or_else(|| panic!("{k} in {c}")))
    };
    [one("prefill"), one("decode")]
}

#[test]
fn a_pack_on_s3_gives_the_local_packs_logits_and_text_bit_for_bit() {
    let Some(s) = server() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (_src, pack) = packed(tmp.path());
    let url = &bucket(s, "bits", "tiny/q4");
    let url = url.as_str();
    let home = tmp.path().join("home");
    let p = pack.to_str().unwrap();
    let m = Manifest::read(&pack).unwrap();
    let (_, experts_len) = record_offsets(&m);
    let sent = ok(&deltafin(&home, None, &["pack", "-m", p, "--out", url]));
    let mib = (experts_len + m.spine_len) as f64 / 1048576.0;
    assert_eq!(
        sent,
        format!("{url}: 3 objects and parts sent ({mib:.1} MiB), 0 already done\n")
    );
    assert_eq!(
        ok(&deltafin(&home, None, &["pack", "-m", p, "--out", url])),
        format!("{url}: already uploaded (its manifest matches {p})\n")
    );
    // the pack on S3: one expert object, every checksum as in the local pack
    let copy = local_copy(url, &tmp.path().join("copies"), &FetchOptions::default()).unwrap();
    let r = Manifest::read(&copy).unwrap();
    let sums = |m: &Manifest| -> Vec<_> {
        m.experts
            .iter()
            .map(|x| (x.layer, x.expert, x.len, x.sha256.clone(), x.xxh3.clone()))
            .collect()
    };
    assert_eq!(sums(&r), sums(&m));
    assert_eq!((r.placement.as_str(), r.drives.len()), ("spread", 1));
    assert_eq!(
        r.drives[0].file,
        copy.join("experts.bin").display().to_string()
    );
    let budget = Some(384 << 10);
    let want = bits(&prompt_and_greedy_logits(
        &mut session(&pack, &opts(budget, true)),
        &PROMPT,
        4,
    ));
    let got = bits(&prompt_and_greedy_logits(
        &mut session(&copy, &opts(budget, false)),
        &PROMPT,
        4,
    ));
    assert_eq!(got, want, "no local tier");
    let mut o = opts(budget, false);
    o.experts.local_cache = Some(u64::MAX);
    for pass in ["filling the tier", "from the tier"] {
        let got = bits(&prompt_and_greedy_logits(
            &mut session(&copy, &o),
            &PROMPT,
            4,
        ));
        assert_eq!(got, want, "{pass}");
    }
    let text = ok(&deltafin(&home, None, &run_args(p, &[])));
    assert!(text.starts_with("hello world") && text.len() > 11, "{text}");
    assert_eq!(ok(&deltafin(&home, None, &run_args(url, &[]))), text);
}

#[test]
fn the_second_run_with_a_local_tier_fetches_no_expert_byte() {
    let Some(s) = server() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (_src, pack) = packed(tmp.path());
    let url = &bucket(s, "tier", "p");
    let url = url.as_str();
    let home = tmp.path().join("home");
    ok(&deltafin(
        &home,
        None,
        &["pack", "-m", pack.to_str().unwrap(), "--out", url],
    ));
    let rec = Manifest::read(&pack).unwrap().experts[0].len;
    let cache = tmp.path().join("nvme");
    let stats = tmp.path().join("stats.json");
    let (c, st) = (cache.to_str().unwrap(), stats.to_str().unwrap());
    let flags = [
        "--local-cache",
        c,
        "--local-cache-size",
        "10M",
        "--stats-json",
        st,
    ];
    let first = ok(&deltafin(&home, None, &run_args(url, &flags)));
    let [p, d] = fetch_stats(&stats);
    for [misses, bytes, fetches, retries, tier] in [p, d] {
        assert!(misses > 0);
        assert_eq!(fetches + tier, misses, "each miss is a fetch or a tier hit");
        assert_eq!((bytes, retries), (fetches * rec, 0));
    }
    assert!(p[2] > 0, "the first run fetches");
    let second = ok(&deltafin(&home, None, &run_args(url, &flags)));
    assert_eq!(second, first);
    let [p2, d2] = fetch_stats(&stats);
    assert_eq!(p2, [p[0], 0, 0, 0, p[0]]);
    assert_eq!(d2, [d[0], 0, 0, 0, d[0]]);
    // a corrupted record in the tier is never used: fetched again, then kept again
    let mirror = std::fs::read_dir(&cache)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path()
        .join("experts.bin");
    let mut b = std::fs::read(&mirror).unwrap();
    let m = Manifest::read(mirror.parent().unwrap()).unwrap();
    let mut flipped = 0;
    for r in &m.experts {
        let at = r.extents[0].offset as usize + 100;
        if b[at..at + 64].iter().any(|&x| x != 0) {
            b[at] ^= 0x40;
            flipped += 1;
        }
    }
    assert!(flipped > 0);
    std::fs::write(&mirror, &b).unwrap();
    assert_eq!(ok(&deltafin(&home, None, &run_args(url, &flags))), first);
    let [p3, d3] = fetch_stats(&stats);
    assert_eq!(p3[2] + d3[2], flipped, "every damaged record fetched again");
    assert_eq!(ok(&deltafin(&home, None, &run_args(url, &flags))), first);
    let [p4, d4] = fetch_stats(&stats);
    assert_eq!(p4[1] + d4[1], 0);
}

#[test]
fn a_killed_upload_resumes_with_the_parts_it_had_sent() {
    let Some(s) = server() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (_src, pack) = packed(tmp.path());
    let url = &bucket(s, "killed", "p");
    let url = url.as_str();
    let home = tmp.path().join("home");
    let p = pack.to_str().unwrap();
    let up = [
        "pack",
        "-m",
        p,
        "--out",
        url,
        "--part-size",
        "8K",
        "--s3-concurrency",
        "1",
    ];
    let mut killed = up.to_vec();
    killed.extend(["--stop-after-parts", "3"]);
    let k = deltafin(&home, None, &killed);
    assert_eq!(
        k.status.code(),
        Some(137),
        "{}",
        String::from_utf8_lossy(&k.stderr)
    );
    let e = deltafin(&home, None, &run_args(url, &[]));
    assert!(!e.status.success());
    assert_eq!(
        String::from_utf8_lossy(&e.stderr),
        format!("error: {url}: no pack there ({url}/manifest.json is missing; an upload that did not finish has none)\n")
    );
    let m = Manifest::read(&pack).unwrap();
    let (_, experts_len) = record_offsets(&m);
    let parts = |n: u64| n.div_ceil(8192) as usize;
    let sent = parts(experts_len) - 3 + parts(m.spine_len) + 1;
    let mib = (experts_len - 3 * 8192 + m.spine_len) as f64 / 1048576.0;
    assert_eq!(
        ok(&deltafin(&home, None, &up)),
        format!("{url}: {sent} objects and parts sent ({mib:.1} MiB), 3 already done\n")
    );
    assert_eq!(
        ok(&deltafin(&home, None, &run_args(url, &[]))),
        ok(&deltafin(&home, None, &run_args(p, &[])))
    );
}

/// The `(layer, expert, first byte)` a GET error names: `s3://…/experts.bin: GET of bytes
/// A..B failed after N tries: … (expert E of layer L)`.
fn named(err: &str, url: &S3Url, tries: u32) -> (usize, usize, u64, u64) {
    let prefix = format!("error: {}: GET of bytes ", url.object("experts.bin"));
    let rest = err.strip_prefix(&prefix).unwrap_or_else(|| panic!("{err}"));
    let (range, rest) = rest.split_once(' ').unwrap();
    let (a, b) = range.split_once("..").unwrap();
    assert!(
        rest.starts_with(&format!("failed after {tries} tries: ")),
        "{err}"
    );
    let tail = rest.trim_end().rsplit_once(" (expert ").unwrap().1;
    let (e, l) = tail.trim_end_matches(')').split_once(" of layer ").unwrap();
    (
        l.parse().unwrap(),
        e.parse().unwrap(),
        a.parse().unwrap(),
        b.parse().unwrap(),
    )
}

/// Checks that `(layer, expert, a, b)` is a record of the pack on S3 `r` and its bytes.
fn is_record(r: &Manifest, (l, e, a, b): (usize, usize, u64, u64)) {
    let x = r
        .experts
        .iter()
        .find(|x| (x.layer, x.expert) == (l, e))
        .unwrap();
    assert_eq!((a, b), (x.extents[0].offset, x.extents[0].offset + x.len));
}

#[test]
fn failed_short_and_stalled_gets_are_retried_then_named() {
    let Some(s) = server() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (_src, pack) = packed(tmp.path());
    let url = &bucket(s, "faults", "p");
    let url = url.as_str();
    let home = tmp.path().join("home");
    let p = pack.to_str().unwrap();
    ok(&deltafin(&home, None, &["pack", "-m", p, "--out", url]));
    let want = ok(&deltafin(&home, None, &run_args(p, &[])));
    let stats = tmp.path().join("stats.json");
    let st = stats.to_str().unwrap();
    let only = ["--only", "experts.bin"];
    // two 503s and a short answer: retried, counted
    let px = Proxy::start(
        s,
        &[&only[..], &["--fail-gets", "2", "--short-gets", "1"]].concat(),
    );
    let out = deltafin(
        &home,
        Some(&px.endpoint),
        &run_args(url, &["--stats-json", st]),
    );
    assert_eq!(ok(&out), want);
    let [pf, d] = fetch_stats(&stats);
    assert_eq!(pf[3] + d[3], 3);
    drop(px);
    // a stalled GET times out and is tried again
    let px = Proxy::start(
        s,
        &[&only[..], &["--stall-gets", "1", "--stall-s", "4"]].concat(),
    );
    let out = deltafin(
        &home,
        Some(&px.endpoint),
        &run_args(url, &["--stats-json", st, "--s3-timeout", "1"]),
    );
    assert_eq!(ok(&out), want);
    let [pf, d] = fetch_stats(&stats);
    assert_eq!(pf[3] + d[3], 1);
    drop(px);
    // every GET fails: named with the URL, the range, the tries, the layer and the expert
    let px = Proxy::start(s, &[&only[..], &["--fail-gets", "100000"]].concat());
    let e = deltafin(
        &home,
        Some(&px.endpoint),
        &run_args(url, &["--s3-retries", "2"]),
    );
    assert!(!e.status.success());
    let err = String::from_utf8_lossy(&e.stderr).into_owned();
    assert!(err.contains("503"), "{err}");
    let r =
        Manifest::read(&local_copy(url, &tmp.path().join("c"), &FetchOptions::default()).unwrap())
            .unwrap();
    is_record(&r, named(&err, &S3Url::parse(url).unwrap(), 3));
}

#[test]
fn a_corrupted_record_on_the_server_is_refused_naming_it() {
    let Some(s) = server() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (_src, pack) = packed(tmp.path());
    let url = &bucket(s, "corrupt", "p");
    let url = url.as_str();
    let home = tmp.path().join("home");
    ok(&deltafin(
        &home,
        None,
        &["pack", "-m", pack.to_str().unwrap(), "--out", url],
    ));
    let u = S3Url::parse(url).unwrap();
    let remote = Remote::connect(&u, FetchOptions::default()).unwrap();
    let copy = local_copy(url, &tmp.path().join("c"), &FetchOptions::default()).unwrap();
    let r = Manifest::read(&copy).unwrap();
    let mut b = remote.get_small("experts.bin", 1 << 30).unwrap().unwrap();
    for x in &r.experts {
        b[x.extents[0].offset as usize + 7] ^= 1;
    }
    remote.put("experts.bin", b).unwrap();
    let cache = tmp.path().join("nvme");
    let e = deltafin(
        &home,
        None,
        &run_args(
            url,
            &[
                "--s3-retries",
                "1",
                "--local-cache",
                cache.to_str().unwrap(),
            ],
        ),
    );
    assert!(!e.status.success());
    let err = String::from_utf8_lossy(&e.stderr).into_owned();
    assert!(
        err.contains(" tries: the bytes do not match the record's checksum (expert "),
        "{err}"
    );
    is_record(&r, named(&err, &u, 2));
}
