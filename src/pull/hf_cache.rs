//! Models already in the Hugging Face cache, found as transformers and llama.cpp find them.
//!
//! Layout (`huggingface_hub`'s cache, "Understand caching" in its docs):
//! `CACHE/models--ORG--NAME/refs/main` holds the commit hash the `main` branch pointed to when
//! last fetched, `CACHE/models--ORG--NAME/snapshots/<commit>/` holds the repository's files
//! (links into `blobs/`, named by their hash). `CACHE` is `$HF_HUB_CACHE`, else
//! `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`
//! ([`hub_cache_dir`]). Files are used where they are: nothing is copied.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// A model named by its Hugging Face repository: `ORG/NAME`, or `ORG/NAME:FILE` to pick one
/// file (a GGUF among several) of the repository.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoSpec {
    /// `ORG/NAME`.
    pub repo: String,
    /// The file inside the repository's snapshot, when given.
    pub file: Option<String>,
}

impl RepoSpec {
    /// Parses `ORG/NAME` or `ORG/NAME:FILE`: exactly one `/`, both parts non-empty and made of
    /// ASCII letters, digits, `-`, `_`, `.` (the hub's repository names), not `.` or `..`;
    /// `FILE` non-empty, without `..` components or a leading `/`. `None` for anything else
    /// (such a text is a path, not a repository).
    pub fn parse(text: &str) -> Option<RepoSpec> {
        let (repo, file) = match text.split_once(':') {
            Some((r, f)) => (r, Some(f)),
            None => (text, None),
        };
        let (org, name) = repo.split_once('/')?;
        let ok = |s: &str| {
            !s.is_empty()
                && s != "."
                && s != ".."
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        };
        if !ok(org) || !ok(name) {
            return None;
        }
        if let Some(f) = file {
            if f.is_empty() || f.starts_with('/') || f.split('/').any(|c| c == ".." || c.is_empty())
            {
                return None;
            }
        }
        Some(RepoSpec {
            repo: repo.to_string(),
            file: file.map(str::to_string),
        })
    }

    /// The repository's folder in a cache: `models--ORG--NAME`.
    pub fn cache_folder(&self) -> String {
        format!("models--{}", self.repo.replace('/', "--"))
    }
}

/// The hub cache folder from the standard variables' values: `hf_hub_cache` (`HF_HUB_CACHE`),
/// else `hf_home/hub` (`HF_HOME`), else `xdg_cache/huggingface/hub` (`XDG_CACHE_HOME`), else
/// `home/.cache/huggingface/hub` (`HOME`); empty values count as unset. `None` when all are.
pub fn hub_cache_dir(
    hf_hub_cache: Option<&str>,
    hf_home: Option<&str>,
    xdg_cache: Option<&str>,
    home: Option<&str>,
) -> Option<PathBuf> {
    let set = |v: Option<&str>| v.filter(|s| !s.is_empty()).map(PathBuf::from);
    set(hf_hub_cache)
        .or_else(|| set(hf_home).map(|h| h.join("hub")))
        .or_else(|| set(xdg_cache).map(|x| x.join("huggingface").join("hub")))
        .or_else(|| set(home).map(|h| h.join(".cache").join("huggingface").join("hub")))
}

/// [`hub_cache_dir`] from this process's environment (`HF_HUB_CACHE`, `HF_HOME`,
/// `XDG_CACHE_HOME`, `HOME`: the Hugging Face tools' own variables).
pub fn hub_cache_dir_from_env() -> Option<PathBuf> {
    let var = |k: &str| std::env::var(k).ok();
    hub_cache_dir(
        var("HF_HUB_CACHE").as_deref(),
        var("HF_HOME").as_deref(),
        var("XDG_CACHE_HOME").as_deref(),
        var("HOME").as_deref(),
    )
}

/// The snapshot folder of `spec`'s repository in `cache`: `snapshots/<refs/main>`, or the only
/// snapshot when there is no `refs/main`.
///
/// Errors (naming the folder): the repository is not in the cache; `refs/main` names a
/// snapshot that is missing; no `refs/main` and zero or several snapshots.
pub fn snapshot_dir(cache: &Path, spec: &RepoSpec) -> Result<PathBuf> {
    let repo_dir = cache.join(spec.cache_folder());
    if !repo_dir.is_dir() {
        bail!(
            "{} is not a file or folder, and the Hugging Face cache has no {} ({}): \
             `deltafin pull {}` downloads it",
            spec_text(spec),
            spec.repo,
            repo_dir.display(),
            spec.repo
        );
    }
    let snapshots = repo_dir.join("snapshots");
    let refs_main = repo_dir.join("refs").join("main");
    if let Ok(rev) = std::fs::read_to_string(&refs_main) {
        let rev = rev.trim();
        let dir = snapshots.join(rev);
        if rev.is_empty() || rev.contains('/') || !dir.is_dir() {
            bail!(
                "{}: refs/main names snapshot {rev:?}, which {} lacks",
                repo_dir.display(),
                snapshots.display()
            );
        }
        return Ok(dir);
    }
    let mut found: Vec<PathBuf> = match std::fs::read_dir(&snapshots) {
        Ok(rd) => rd
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect(),
        Err(_) => Vec::new(),
    };
    found.sort();
    match found.len() {
        1 => Ok(found.remove(0)),
        n => bail!(
            "{}: no refs/main and {n} snapshots: cannot tell which revision to use",
            repo_dir.display()
        ),
    }
}

fn spec_text(spec: &RepoSpec) -> String {
    match &spec.file {
        Some(f) => format!("{}:{f}", spec.repo),
        None => spec.repo.clone(),
    }
}

/// The path to open for `spec` in `cache`: the named file of the snapshot
/// (`ORG/NAME:FILE`), else the snapshot folder when it is a Hugging Face checkpoint
/// (`config.json`) or holds GGUF files of one model (one file, or the parts of one split
/// model), else an error listing the GGUF files to choose from.
///
/// Errors: as [`snapshot_dir`]; the named file is missing; a snapshot with several GGUF
/// models (the message lists them and the `ORG/NAME:FILE.gguf` form); a snapshot with
/// neither `config.json` nor a GGUF file.
pub fn resolve(cache: &Path, spec: &RepoSpec) -> Result<PathBuf> {
    let snap = snapshot_dir(cache, spec)?;
    if let Some(f) = &spec.file {
        let p = snap.join(f);
        if !p.exists() {
            bail!(
                "{}: the cached snapshot {} has no {f}",
                spec_text(spec),
                snap.display()
            );
        }
        return Ok(p);
    }
    if snap.join("config.json").exists() {
        return Ok(snap);
    }
    let mut ggufs: Vec<String> = std::fs::read_dir(&snap)
        .with_context(|| format!("reading {}", snap.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".gguf"))
        .collect();
    ggufs.sort();
    // The parts of one split model (NAME-00001-of-00003.gguf, …) count as one model.
    let models: Vec<&String> = ggufs.iter().filter(|n| !is_later_split_part(n)).collect();
    match models.len() {
        0 => bail!(
            "{}: the cached snapshot {} has neither config.json nor a .gguf file",
            spec.repo,
            snap.display()
        ),
        1 => Ok(snap.join(models[0])),
        _ => bail!(
            "{}: the cached snapshot holds {} GGUF models ({}): name one as {}:FILE.gguf",
            spec.repo,
            models.len(),
            models
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            spec.repo
        ),
    }
}

/// Whether `name` is part 2 or later of a split GGUF (`…-0000K-of-0000N.gguf`, K > 1).
fn is_later_split_part(name: &str) -> bool {
    let Some(stem) = name.strip_suffix(".gguf") else {
        return false;
    };
    let parts: Vec<&str> = stem.rsplitn(4, '-').collect();
    // parts: [N, "of", K, rest]
    matches!(parts.as_slice(), [n, "of", k, _]
        if n.chars().all(|c| c.is_ascii_digit())
            && k.chars().all(|c| c.is_ascii_digit())
            && k.parse::<u32>().is_ok_and(|k| k > 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_repository_names_and_files() {
        assert_eq!(
            RepoSpec::parse("Qwen/Qwen3-0.6B"),
            Some(RepoSpec {
                repo: "Qwen/Qwen3-0.6B".into(),
                file: None
            })
        );
        assert_eq!(
            RepoSpec::parse("unsloth/Qwen3-GGUF:sub/Q4_K_M.gguf")
                .unwrap()
                .file,
            Some("sub/Q4_K_M.gguf".into())
        );
        assert_eq!(
            RepoSpec::parse("a/b").unwrap().cache_folder(),
            "models--a--b"
        );
        for bad in [
            "model.gguf",
            "a/b/c",
            "./x",
            "../x",
            "/abs/x",
            "a/",
            "a/b:",
            "a/b:../x",
            "a/b:/x",
            "a b/c",
        ] {
            assert_eq!(RepoSpec::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn cache_dir_follows_the_hub_variables_in_order() {
        let d = |a, b, c, e| hub_cache_dir(a, b, c, e);
        assert_eq!(
            d(Some("/c"), Some("/h"), Some("/x"), Some("/home")),
            Some("/c".into())
        );
        assert_eq!(
            d(Some(""), Some("/h"), Some("/x"), Some("/home")),
            Some("/h/hub".into())
        );
        assert_eq!(
            d(None, None, Some("/x"), Some("/home")),
            Some("/x/huggingface/hub".into())
        );
        assert_eq!(
            d(None, None, None, Some("/home/u")),
            Some("/home/u/.cache/huggingface/hub".into())
        );
        assert_eq!(d(None, None, None, None), None);
    }

    #[test]
    fn split_parts_after_the_first_are_not_models() {
        assert!(is_later_split_part("m-00002-of-00003.gguf"));
        assert!(!is_later_split_part("m-00001-of-00003.gguf"));
        assert!(!is_later_split_part("m-q4_0.gguf"));
    }
}
