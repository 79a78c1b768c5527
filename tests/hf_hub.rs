//! Models where users keep them: `-m ORG/NAME` and `-m ORG/NAME:FILE.gguf` found in a Hugging
//! Face cache laid out as `huggingface_hub` lays it out (links from `snapshots/` into `blobs/`,
//! `refs/main`), used in place; and `deltafin pull ORG/NAME` through `hf-hub` against an
//! in-process HTTP server that answers in the hub's URL layout (listing, `resolve/main/FILE`
//! with ranges and the `X-Repo-Commit`/`ETag`/`X-Linked-Etag`/`Content-Range` headers).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use deltafin::load::{open_any, OpenedModel};
use deltafin::pull::hf_cache::{resolve, RepoSpec};
use deltafin::pull::hub::{pull_repo, sha256_file, HubPullOptions};
use sha2::{Digest, Sha256};

const FIX: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

fn hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Puts `files` (name → source file) into `cache` as the hub cache does: content in
/// `blobs/<hash>`, a relative link per file in `snapshots/<rev>/`, `refs/main` = `rev`
/// (when `main` is set).
fn cache_repo(cache: &Path, repo: &str, rev: &str, files: &[(&str, PathBuf)], main: bool) {
    let dir = cache.join(format!("models--{}", repo.replace('/', "--")));
    std::fs::create_dir_all(dir.join("blobs")).unwrap();
    let snap = dir.join("snapshots").join(rev);
    std::fs::create_dir_all(&snap).unwrap();
    for (name, src) in files {
        let bytes = std::fs::read(src).unwrap();
        let blob = dir.join("blobs").join(hex(&bytes));
        std::fs::write(&blob, &bytes).unwrap();
        std::os::unix::fs::symlink(format!("../../blobs/{}", hex(&bytes)), snap.join(name))
            .unwrap();
    }
    if main {
        std::fs::create_dir_all(dir.join("refs")).unwrap();
        std::fs::write(dir.join("refs").join("main"), rev).unwrap();
    }
}

fn spec(s: &str) -> RepoSpec {
    RepoSpec::parse(s).unwrap()
}

#[test]
fn cached_repositories_open_in_place() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path();
    let hf: Vec<(&str, PathBuf)> = [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    .iter()
    .map(|n| (*n, Path::new(FIX).join("hf/qwen3").join(n)))
    .collect();
    cache_repo(cache, "Qwen/Qwen3-tiny", COMMIT, &hf, true);
    // An older snapshot beside it: refs/main decides.
    cache_repo(cache, "Qwen/Qwen3-tiny", "old", &hf[..1], false);
    let p = resolve(cache, &spec("Qwen/Qwen3-tiny")).unwrap();
    assert_eq!(
        p,
        cache.join(format!("models--Qwen--Qwen3-tiny/snapshots/{COMMIT}"))
    );
    match open_any(Some(&p)).unwrap() {
        OpenedModel::Hf(m) => assert_eq!(m.model_type().unwrap(), "qwen3"),
        _ => panic!("expected a Hugging Face folder"),
    }

    // A repository of several GGUF files: ORG/NAME:FILE picks one, ORG/NAME alone is refused.
    let gguf = Path::new(FIX).join("gguf/qwen3/qwen3-f32.gguf");
    let moe = Path::new(FIX).join("gguf/qwen3_moe/qwen3_moe-q8_0.gguf");
    cache_repo(
        cache,
        "org/Qwen3-GGUF",
        "r1",
        &[("qwen3-f32.gguf", gguf.clone()), ("moe-q8_0.gguf", moe)],
        true,
    );
    let p = resolve(cache, &spec("org/Qwen3-GGUF:qwen3-f32.gguf")).unwrap();
    assert_eq!(
        p,
        cache.join("models--org--Qwen3-GGUF/snapshots/r1/qwen3-f32.gguf")
    );
    // Used in place: the path is the snapshot's link, not a copy.
    assert!(std::fs::symlink_metadata(&p)
        .unwrap()
        .file_type()
        .is_symlink());
    match open_any(Some(&p)).unwrap() {
        OpenedModel::Gguf(g) => assert_eq!(g.files[0], p),
        _ => panic!("expected GGUF"),
    }
    let e = resolve(cache, &spec("org/Qwen3-GGUF"))
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "org/Qwen3-GGUF: the cached snapshot holds 2 GGUF models (moe-q8_0.gguf, qwen3-f32.gguf): \
         name one as org/Qwen3-GGUF:FILE.gguf"
    );
    // One GGUF and no refs/main (a single snapshot): found.
    cache_repo(cache, "org/one", "only", &[("m.gguf", gguf)], false);
    assert_eq!(
        resolve(cache, &spec("org/one")).unwrap(),
        cache.join("models--org--one/snapshots/only/m.gguf")
    );
    let e = resolve(cache, &spec("org/Qwen3-GGUF:nope.gguf"))
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        format!(
            "org/Qwen3-GGUF:nope.gguf: the cached snapshot {} has no nope.gguf",
            cache.join("models--org--Qwen3-GGUF/snapshots/r1").display()
        )
    );
    let e = resolve(cache, &spec("org/missing"))
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        format!(
            "org/missing is not a file or folder, and the Hugging Face cache has no org/missing \
             ({}): `deltafin pull org/missing` downloads it",
            cache.join("models--org--missing").display()
        )
    );
    // refs/main naming a snapshot that is not there.
    std::fs::create_dir_all(cache.join("models--org--one/refs")).unwrap();
    std::fs::write(cache.join("models--org--one/refs/main"), "gone\n").unwrap();
    let e = resolve(cache, &spec("org/one")).unwrap_err().to_string();
    assert_eq!(
        e,
        format!(
            "{}: refs/main names snapshot \"gone\", which {} lacks",
            cache.join("models--org--one").display(),
            cache.join("models--org--one/snapshots").display()
        )
    );

    // The command line reads the standard variables: HF_HUB_CACHE, then HF_HOME/hub.
    for (var, root) in [
        ("HF_HUB_CACHE", cache.to_path_buf()),
        ("HF_HOME", tmp.path().join("home")),
    ] {
        if var == "HF_HOME" {
            std::fs::create_dir_all(&root).unwrap();
            std::os::unix::fs::symlink(cache, root.join("hub")).unwrap();
        }
        let out = Command::new(env!("CARGO_BIN_EXE_deltafin"))
            .args(["inspect", "-m", "org/Qwen3-GGUF:qwen3-f32.gguf"])
            .env_remove("HF_HUB_CACHE")
            .env_remove("HF_HOME")
            .env(var, &root)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("qwen3"),
            "{var}: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// One file the test hub serves.
#[derive(Clone)]
struct Served {
    bytes: Vec<u8>,
    /// The SHA-256 the listing gives for an LFS file (`None`: a git file).
    lfs_sha: Option<String>,
}

/// What the hub saw: (path and query, Range header, Authorization header).
type Seen = Arc<Mutex<Vec<(String, Option<String>, Option<String>)>>>;

/// A hub for repository `org/tiny` at commit [`COMMIT`], on 127.0.0.1; returns its address.
fn serve_hub(files: BTreeMap<String, Served>) -> (String, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let seen: Seen = Arc::default();
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            let target = line.split_whitespace().nth(1).unwrap_or("").to_string();
            let mut headers = BTreeMap::new();
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
                    break;
                }
                if let Some((k, v)) = h.split_once(':') {
                    headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
                }
            }
            log.lock().unwrap().push((
                target.clone(),
                headers.get("range").cloned(),
                headers.get("authorization").cloned(),
            ));
            let listing = "/api/models/org/tiny/revision/main?blobs=true";
            let (status, extra, body): (&str, String, Vec<u8>) = if target == listing {
                let siblings: Vec<serde_json::Value> = files
                    .iter()
                    .map(|(n, f)| match &f.lfs_sha {
                        Some(s) => serde_json::json!({"rfilename": n, "size": f.bytes.len(),
                            "lfs": {"sha256": s, "size": f.bytes.len()}}),
                        None => serde_json::json!({"rfilename": n, "size": f.bytes.len()}),
                    })
                    .collect();
                let v = serde_json::json!({"id": "org/tiny", "sha": COMMIT, "siblings": siblings});
                ("200 OK", String::new(), v.to_string().into_bytes())
            } else if let Some(f) = target
                .strip_prefix("/org/tiny/resolve/main/")
                .and_then(|n| files.get(n))
            {
                let total = f.bytes.len();
                let (a, b) = match headers.get("range").and_then(|r| r.strip_prefix("bytes=")) {
                    Some(r) => {
                        let (a, b) = r.split_once('-').unwrap();
                        let a: usize = a.parse().unwrap();
                        let b = if b.is_empty() {
                            total - 1
                        } else {
                            b.parse().unwrap()
                        };
                        (a, b.min(total - 1))
                    }
                    None => (0, total - 1),
                };
                let etag = match &f.lfs_sha {
                    Some(s) => format!("X-Linked-Etag: \"{s}\"\r\nETag: \"git-{total}\"\r\n"),
                    None => format!("ETag: \"{}\"\r\n", &hex(&f.bytes)[..40]),
                };
                (
                    "206 Partial Content",
                    format!(
                        "X-Repo-Commit: {COMMIT}\r\n{etag}Content-Range: bytes {a}-{b}/{total}\r\n"
                    ),
                    f.bytes[a..=b].to_vec(),
                )
            } else {
                ("404 Not Found", String::new(), b"not found".to_vec())
            };
            let head = format!(
                "HTTP/1.1 {status}\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(&body);
        }
    });
    (addr, seen)
}

fn tiny_repo(corrupt: bool) -> BTreeMap<String, Served> {
    let gguf = std::fs::read(Path::new(FIX).join("gguf/qwen3/qwen3-f32.gguf")).unwrap();
    let sha = hex(&gguf);
    let mut served = gguf.clone();
    if corrupt {
        served[1000] ^= 1;
    }
    BTreeMap::from([
        (
            "model-q.gguf".to_string(),
            Served {
                bytes: served,
                lfs_sha: Some(sha),
            },
        ),
        (
            "README.md".to_string(),
            Served {
                bytes: b"# tiny\n".to_vec(),
                lfs_sha: None,
            },
        ),
    ])
}

fn opts(endpoint: &str, include: &[&str]) -> HubPullOptions {
    HubPullOptions {
        endpoint: endpoint.to_string(),
        token: Some("hf_test_token".into()),
        include: include.iter().map(|s| s.to_string()).collect(),
        progress: false,
        retries: 0,
    }
}

#[test]
fn pull_downloads_into_the_hub_cache_with_token_ranges_and_checks() {
    let (endpoint, seen) = serve_hub(tiny_repo(false));
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("hub");
    let snap = pull_repo(&cache, "org/tiny", &opts(&endpoint, &["*.gguf"])).unwrap();
    assert_eq!(
        snap,
        cache.join(format!("models--org--tiny/snapshots/{COMMIT}"))
    );
    let want = std::fs::read(Path::new(FIX).join("gguf/qwen3/qwen3-f32.gguf")).unwrap();
    assert_eq!(std::fs::read(snap.join("model-q.gguf")).unwrap(), want);
    assert!(!snap.join("README.md").exists(), "--include left it out");
    assert_eq!(
        std::fs::read_to_string(cache.join("models--org--tiny/refs/main")).unwrap(),
        COMMIT
    );
    // The blob is named by its SHA-256 (the hub's X-Linked-Etag) and holds the bytes.
    let blob = cache.join(format!("models--org--tiny/blobs/{}", hex(&want)));
    assert_eq!(sha256_file(&blob).unwrap(), hex(&want));
    // The requests: listing, then metadata (bytes=0-0) and data (bytes=0-) of the one file,
    // each with the token.
    let log = seen.lock().unwrap().clone();
    let paths: Vec<(&str, Option<&str>)> = log
        .iter()
        .map(|(p, r, _)| (p.as_str(), r.as_deref()))
        .collect();
    assert_eq!(
        paths,
        [
            ("/api/models/org/tiny/revision/main?blobs=true", None),
            ("/org/tiny/resolve/main/model-q.gguf", Some("bytes=0-0")),
            ("/org/tiny/resolve/main/model-q.gguf", Some("bytes=0-")),
        ]
    );
    assert!(log
        .iter()
        .all(|(_, _, a)| a.as_deref() == Some("Bearer hf_test_token")));
    // Found by -m ORG/NAME afterwards (the repository's one GGUF).
    assert_eq!(
        resolve(&cache, &spec("org/tiny")).unwrap(),
        snap.join("model-q.gguf")
    );
    // A second pull fetches nothing but the listing.
    seen.lock().unwrap().clear();
    pull_repo(&cache, "org/tiny", &opts(&endpoint, &["*.gguf"])).unwrap();
    assert_eq!(seen.lock().unwrap().len(), 1);
    // No file matching the pattern.
    let e = pull_repo(&cache, "org/tiny", &opts(&endpoint, &["*.safetensors"]))
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "org/tiny: no file matches *.safetensors (the repository has 2 files)"
    );
}

#[test]
fn pull_resumes_a_partial_download() {
    let (endpoint, seen) = serve_hub(tiny_repo(false));
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("hub");
    let want = std::fs::read(Path::new(FIX).join("gguf/qwen3/qwen3-f32.gguf")).unwrap();
    let blobs = cache.join("models--org--tiny/blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    // An interrupted transfer left its first 100000 bytes.
    std::fs::write(blobs.join(format!("{}.part", hex(&want))), &want[..100_000]).unwrap();
    let snap = pull_repo(&cache, "org/tiny", &opts(&endpoint, &[])).unwrap();
    assert_eq!(std::fs::read(snap.join("model-q.gguf")).unwrap(), want);
    assert_eq!(std::fs::read(snap.join("README.md")).unwrap(), b"# tiny\n");
    let ranges: Vec<Option<String>> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(p, _, _)| p.ends_with("model-q.gguf"))
        .map(|(_, r, _)| r.clone())
        .collect();
    assert_eq!(
        ranges,
        [
            Some("bytes=0-0".to_string()),
            Some("bytes=100000-".to_string())
        ]
    );
}

#[test]
fn pull_refuses_a_file_whose_sha256_differs_from_the_hub() {
    let (endpoint, _) = serve_hub(tiny_repo(true));
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("hub");
    let e = pull_repo(&cache, "org/tiny", &opts(&endpoint, &["*.gguf"]))
        .unwrap_err()
        .to_string();
    let want = hex(&std::fs::read(Path::new(FIX).join("gguf/qwen3/qwen3-f32.gguf")).unwrap());
    let mut bad = std::fs::read(Path::new(FIX).join("gguf/qwen3/qwen3-f32.gguf")).unwrap();
    bad[1000] ^= 1;
    assert_eq!(
        e,
        format!(
            "org/tiny: model-q.gguf: SHA-256 is {} but the hub lists {want}; the download was removed",
            hex(&bad)
        )
    );
    let snap = cache.join(format!("models--org--tiny/snapshots/{COMMIT}"));
    assert!(std::fs::symlink_metadata(snap.join("model-q.gguf")).is_err());
    assert!(!cache
        .join(format!("models--org--tiny/blobs/{want}"))
        .exists());
}

#[test]
fn the_pull_command_reads_hf_endpoint_token_and_cache() {
    let (endpoint, seen) = serve_hub(tiny_repo(false));
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_deltafin"))
        .args(["pull", "org/tiny", "--include", "README*", "--quiet"])
        .env("HF_ENDPOINT", &endpoint)
        .env("HF_TOKEN", "hf_cli")
        .env("HF_HUB_CACHE", tmp.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let snap = tmp
        .path()
        .join(format!("models--org--tiny/snapshots/{COMMIT}"));
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        format!("{}\n", snap.display())
    );
    assert_eq!(std::fs::read(snap.join("README.md")).unwrap(), b"# tiny\n");
    assert!(seen
        .lock()
        .unwrap()
        .iter()
        .all(|(_, _, a)| a.as_deref() == Some("Bearer hf_cli")));
}
