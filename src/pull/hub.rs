//! `deltafin pull ORG/NAME`: downloads a Hugging Face repository into the Hugging Face cache
//! (the layout of [`super::hf_cache`], shared with transformers and llama.cpp) through the
//! `hf-hub` crate's blocking client.
//!
//! What is requested (the hub's HTTP API, as `hf-hub` 0.4.3 uses it):
//! 1. `GET {endpoint}/api/models/ORG/NAME/revision/main?blobs=true`: the commit (`sha`) and the
//!    files (`siblings[].rfilename`, with `lfs.sha256` and `lfs.size` for LFS files);
//! 2. per file, `GET {endpoint}/ORG/NAME/resolve/main/FILE` with `Range: bytes=0-0` (headers
//!    `X-Repo-Commit`, `ETag` or `X-Linked-Etag`, `Content-Range: bytes 0-0/SIZE`), then with
//!    `Range: bytes=N-` for the data, appended to `blobs/ETAG.part`: an interrupted download
//!    resumes from the bytes already there. A token is sent as `Authorization: Bearer TOKEN`.
//!
//! Each LFS file's SHA-256 is checked against the hub's listing after the download; a file
//! that does not match is removed (blob and snapshot link) and the pull fails. Files already
//! in the snapshot of the listed commit are not fetched again.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use hf_hub::api::sync::ApiBuilder;
use hf_hub::api::Progress;
use sha2::{Digest, Sha256};

/// The hub's default address.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// How to pull a repository.
#[derive(Clone, Debug)]
pub struct HubPullOptions {
    /// The hub's address (`HF_ENDPOINT`; default [`DEFAULT_ENDPOINT`]), without a trailing `/`.
    pub endpoint: String,
    /// Access token for gated or private repositories (`HF_TOKEN`).
    pub token: Option<String>,
    /// Glob patterns (`*`, `?`) a file's path must match one of; empty: every file.
    pub include: Vec<String>,
    /// Draw a progress bar per file on standard error.
    pub progress: bool,
    /// Attempts after a failed transfer (each resumes where the last stopped).
    pub retries: usize,
}

impl Default for HubPullOptions {
    fn default() -> Self {
        HubPullOptions {
            endpoint: DEFAULT_ENDPOINT.into(),
            token: None,
            include: Vec::new(),
            progress: true,
            retries: 3,
        }
    }
}

/// One file of a repository as the hub lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubFile {
    /// Path in the repository.
    pub path: String,
    /// SHA-256 (hex) of an LFS file's content; `None` for files kept in git.
    pub sha256: Option<String>,
}

/// Whether `text` matches the glob `pattern`: `*` any run of characters (`/` included, as
/// `huggingface-cli download --include`), `?` one character, anything else itself.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Parses the hub's repository listing (`/api/models/…?blobs=true`): the commit and the
/// files. Errors: no `sha` string or no `siblings` list, naming `repo`.
pub fn parse_listing(repo: &str, v: &serde_json::Value) -> Result<(String, Vec<HubFile>)> {
    let sha = v
        .get("sha")
        .and_then(|s| s.as_str())
        .ok_or_else(|| anyhow!("{repo}: the hub's listing has no commit (\"sha\")"))?;
    let siblings = v
        .get("siblings")
        .and_then(|s| s.as_array())
        .ok_or_else(|| anyhow!("{repo}: the hub's listing has no \"siblings\""))?;
    let files = siblings
        .iter()
        .filter_map(|s| {
            Some(HubFile {
                path: s.get("rfilename")?.as_str()?.to_string(),
                sha256: s
                    .get("lfs")
                    .and_then(|l| l.get("sha256"))
                    .and_then(|h| h.as_str())
                    .map(str::to_string),
            })
        })
        .collect();
    Ok((sha.to_string(), files))
}

/// A progress bar per file (`indicatif`), fed by `hf-hub`'s download loop.
struct FileBar {
    enabled: bool,
    bar: Option<indicatif::ProgressBar>,
}

impl Progress for FileBar {
    fn init(&mut self, size: usize, filename: &str) {
        if !self.enabled {
            return;
        }
        // hf-hub calls `init` again when a transfer (re)starts: keep one bar per file.
        let bar = self
            .bar
            .get_or_insert_with(|| crate::progress::bar(size as u64, filename, true));
        bar.set_length(size as u64);
        bar.set_position(0);
    }

    fn update(&mut self, size: usize) {
        if let Some(b) = &self.bar {
            b.inc(size as u64);
        }
    }

    fn finish(&mut self) {
        if let Some(b) = &self.bar {
            b.finish();
        }
    }
}

/// SHA-256 (hex) of the file at `path` (links followed).
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Downloads the files of `repo` (`ORG/NAME`) matching `opts.include` into the hub cache
/// `cache` and returns the snapshot folder (`cache/models--ORG--NAME/snapshots/<commit>`),
/// which `-m ORG/NAME` then finds.
///
/// Errors: the listing cannot be fetched or read (HTTP status and URL in the message); no
/// file matches the patterns; a transfer fails after `opts.retries` retries; an LFS file's
/// SHA-256 differs from the hub's (`FILE: SHA-256 is X but the hub lists Y`; the file is
/// removed).
pub fn pull_repo(cache: &Path, repo: &str, opts: &HubPullOptions) -> Result<PathBuf> {
    std::fs::create_dir_all(cache).with_context(|| format!("creating {}", cache.display()))?;
    let api = ApiBuilder::new()
        .with_cache_dir(cache.to_path_buf())
        .with_endpoint(opts.endpoint.trim_end_matches('/').to_string())
        .with_token(opts.token.clone())
        .with_progress(false)
        .with_retries(opts.retries)
        .build()
        .map_err(|e| anyhow!("setting up the hub client: {e}"))?;
    let handle = api.model(repo.to_string());
    let listing_url = format!(
        "{}/api/models/{repo}/revision/main",
        opts.endpoint.trim_end_matches('/')
    );
    let listing: serde_json::Value = handle
        .info_request()
        .query("blobs", "true")
        .call()
        .map_err(|e| anyhow!("{listing_url}: {e}"))?
        .into_json()
        .map_err(|e| anyhow!("{listing_url}: the listing is not JSON: {e}"))?;
    let (commit, files) = parse_listing(repo, &listing)?;
    let wanted: Vec<&HubFile> = files
        .iter()
        .filter(|f| opts.include.is_empty() || opts.include.iter().any(|p| glob_match(p, &f.path)))
        .collect();
    if wanted.is_empty() {
        bail!(
            "{repo}: no file matches {} (the repository has {} files)",
            opts.include.join(", "),
            files.len()
        );
    }
    let snapshot = cache
        .join(format!("models--{}", repo.replace('/', "--")))
        .join("snapshots")
        .join(&commit);
    for f in wanted {
        let local = snapshot.join(&f.path);
        if local.exists() {
            continue;
        }
        let bar = FileBar {
            enabled: opts.progress,
            bar: None,
        };
        let path = handle
            .download_with_progress(&f.path, bar)
            .map_err(|e| anyhow!("{repo}: downloading {}: {e}", f.path))?;
        if let Some(want) = &f.sha256 {
            let got = sha256_file(&path)?;
            if &got != want {
                if let Ok(blob) = std::fs::canonicalize(&path) {
                    let _ = std::fs::remove_file(blob);
                }
                let _ = std::fs::remove_file(&path);
                bail!(
                    "{repo}: {}: SHA-256 is {got} but the hub lists {want}; the download was removed",
                    f.path
                );
            }
        }
    }
    Ok(snapshot)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_like_the_hub_cli() {
        assert!(glob_match("*.gguf", "model-Q4_K_M.gguf"));
        assert!(glob_match("*.gguf", "sub/model.gguf"));
        assert!(glob_match("*Q4_K_M*", "x-Q4_K_M-00001-of-00002.gguf"));
        assert!(glob_match("config.json", "config.json"));
        assert!(glob_match("model-?.bin", "model-1.bin"));
        assert!(!glob_match("*.gguf", "config.json"));
        assert!(!glob_match("model-?.bin", "model-12.bin"));
        assert!(glob_match("*", ""));
    }

    #[test]
    fn listing_gives_commit_and_lfs_hashes() {
        let v = serde_json::json!({"sha": "abc", "siblings": [
            {"rfilename": "config.json", "size": 10},
            {"rfilename": "m.gguf", "lfs": {"sha256": "ff", "size": 3}}]});
        let (c, f) = parse_listing("o/n", &v).unwrap();
        assert_eq!(c, "abc");
        assert_eq!(
            f,
            vec![
                HubFile {
                    path: "config.json".into(),
                    sha256: None
                },
                HubFile {
                    path: "m.gguf".into(),
                    sha256: Some("ff".into())
                }
            ]
        );
        let e = parse_listing("o/n", &serde_json::json!({"siblings": []})).unwrap_err();
        assert_eq!(
            e.to_string(),
            "o/n: the hub's listing has no commit (\"sha\")"
        );
    }
}
