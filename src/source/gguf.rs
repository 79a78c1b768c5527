//! GGUF reader (versions 2 and 3), following the GGUF specification in the ggml repository
//! (`docs/gguf.md`). Every size and offset read from a file is checked before use.
//!
//! [`GgufModel::open`] reads one file, or every part of a split model
//! (`<prefix>-00001-of-0000N.gguf`, the naming of llama.cpp's `gguf-split`), with buffered
//! `std::fs::File` reads: only the header, metadata and tensor infos are read, never tensor
//! data (the engine reads that itself later). Typed metadata accessors live in `gguf_meta.rs`.

use std::collections::{BTreeMap, HashSet};
use std::io::BufReader;
use std::path::{Path, PathBuf};

use super::gguf_parse::{self, ParsedFile};
pub use super::gguf_value::{GgufError, Value};
use super::pack_info::PackInfo;
use super::tensor::TensorInfo;

/// A GGUF model: one file or all parts of a split (`-00001-of-0000N.gguf`).
#[derive(Clone, Debug)]
pub struct GgufModel {
    pub files: Vec<PathBuf>,
    pub version: u32,
    /// `general.alignment` (default 32).
    pub alignment: u64,
    /// Metadata of the first file (split bookkeeping keys included).
    pub metadata: BTreeMap<String, Value>,
    /// Every tensor of every part, in file order.
    pub tensors: Vec<TensorInfo>,
    /// Set when the model is a Deltafin pack of a GGUF file (see [`super::pack`]): `files` and
    /// `tensors` are then the pack's logical files, its stacked experts listed per expert
    /// (`NAME[E]`), mapped to physical reads by the pack's relocation; `metadata` comes from
    /// the pack's spine file.
    pub pack: Option<std::sync::Arc<PackInfo>>,
}

/// Name of `path` for error messages: its file name, or the whole path when it has none.
pub(crate) fn display_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// Splits a file name `<prefix>-NNNNN-of-MMMMM.gguf` (5 digits each, as written by
/// llama.cpp's `gguf-split`) into `(prefix, NNNNN, MMMMM)`.
pub fn split_name(file_name: &str) -> Option<(&str, u32, u32)> {
    let stem = file_name.strip_suffix(".gguf")?;
    // "-NNNNN-of-MMMMM" is 15 bytes.
    let cut = stem.len().checked_sub(15)?;
    if !stem.is_char_boundary(cut) {
        return None;
    }
    let (prefix, tail) = stem.split_at(cut);
    let t = tail.as_bytes();
    let digits = |s: &[u8]| s.iter().all(u8::is_ascii_digit);
    if t[0] != b'-' || &t[6..10] != b"-of-" || !digits(&t[1..6]) || !digits(&t[10..15]) {
        return None;
    }
    let no = tail[1..6].parse().ok()?;
    let count = tail[10..15].parse().ok()?;
    Some((prefix, no, count))
}

/// Path of part `no` (1-based) of `count` next to `dir` with the given prefix.
pub fn split_path(dir: &Path, prefix: &str, no: u32, count: u32) -> PathBuf {
    dir.join(format!("{prefix}-{no:05}-of-{count:05}.gguf"))
}

fn parse_file(path: &Path) -> Result<ParsedFile, GgufError> {
    let io = |source| GgufError::Io {
        path: path.display().to_string(),
        source,
    };
    if let Some(kind) = crate::store::direct::not_regular(path) {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("not a regular file ({kind})"),
        )));
    }
    let f = std::fs::File::open(path).map_err(io)?;
    let len = f.metadata().map_err(io)?.len();
    gguf_parse::parse(
        BufReader::with_capacity(1 << 16, f),
        len,
        &display_name(path),
    )
}

impl GgufModel {
    /// Opens a GGUF file (versions 2 and 3, little-endian) and reads its header, metadata and
    /// tensor infos, not its tensor data.
    ///
    /// When the file name is `<prefix>-NNNNN-of-MMMMM.gguf`, all MMMMM parts are opened in
    /// order (any part may be given); `split.no` / `split.count` / `split.tensors.count` are
    /// checked when present; metadata comes from the first part and tensors from every part
    /// ([`TensorInfo::file`] indexes [`GgufModel::files`]).
    ///
    /// Errors: [`GgufError::Io`] if a file cannot be read, [`GgufError::MissingPart`] naming
    /// the absent part, [`GgufError::Format`] naming file and field for malformed content
    /// (truncation, sizes that cannot fit, bad alignment, unknown types, tensor data outside
    /// the data section, misaligned or overlapping data, duplicate names, invalid UTF-8...).
    pub fn open(path: &Path) -> Result<GgufModel, GgufError> {
        let name = display_name(path);
        let split = split_name(&name).map(|(p, no, count)| (p.to_string(), no, count));
        let files: Vec<PathBuf> = match &split {
            None => vec![path.to_path_buf()],
            Some((_, no, count)) if *no == 0 || *count == 0 || no > count => {
                return Err(GgufError::Format {
                    file: name,
                    msg: format!("split file name says part {no} of {count}"),
                })
            }
            Some((prefix, _, count)) => {
                let dir = path.parent().unwrap_or(Path::new(""));
                (1..=*count)
                    .map(|i| split_path(dir, prefix, i, *count))
                    .collect()
            }
        };
        if split.is_some() {
            for (i, f) in files.iter().enumerate() {
                if !f.exists() {
                    return Err(GgufError::MissingPart {
                        path: f.display().to_string(),
                        part: i as u32 + 1,
                        count: files.len() as u32,
                    });
                }
            }
        }

        let mut model = GgufModel {
            files: files.clone(),
            version: 0,
            alignment: 0,
            metadata: BTreeMap::new(),
            tensors: Vec::new(),
            pack: None,
        };
        let mut names = HashSet::new();
        for (i, f) in files.iter().enumerate() {
            let part = parse_file(f)?;
            check_split_keys(&part, f, i, files.len())?;
            if i == 0 {
                model.version = part.version;
                model.alignment = part.alignment;
                model.metadata = part.metadata;
            }
            for mut t in part.tensors {
                if !names.insert(t.name.clone()) {
                    return Err(GgufError::Format {
                        file: display_name(f),
                        msg: format!("tensor '{}' also appears in an earlier part", t.name),
                    });
                }
                t.file = i;
                model.tensors.push(t);
            }
        }
        if let Some(v) = model.metadata.get("split.tensors.count") {
            if v.as_u64() != Some(model.tensors.len() as u64) {
                return Err(GgufError::Format {
                    file: display_name(&model.files[0]),
                    msg: format!(
                        "metadata key 'split.tensors.count' is {v} but the parts hold {} tensors",
                        model.tensors.len()
                    ),
                });
            }
        }
        Ok(model)
    }

    /// Opens a model given either a `.gguf` file (see [`GgufModel::open`]) or a folder that
    /// holds exactly one model: one `.gguf` file or one complete-or-not split set (a missing
    /// part is reported by `open`). Subfolders are not searched.
    ///
    /// Errors: [`GgufError::NoModel`] naming the folder when it holds no `.gguf` file or more
    /// than one model; otherwise those of [`GgufModel::open`].
    pub fn open_model_path(path: &Path) -> Result<GgufModel, GgufError> {
        if !path.is_dir() {
            return GgufModel::open(path);
        }
        let io = |source| GgufError::Io {
            path: path.display().to_string(),
            source,
        };
        // Each model is keyed by its first file name (split sets by their part 1).
        let mut models = BTreeMap::<String, PathBuf>::new();
        for entry in std::fs::read_dir(path).map_err(io)? {
            let entry = entry.map_err(io)?;
            let Ok(fname) = entry.file_name().into_string() else {
                continue;
            };
            if !fname.to_ascii_lowercase().ends_with(".gguf") || !entry.path().is_file() {
                continue;
            }
            let first = match split_name(&fname) {
                Some((prefix, _, count)) => {
                    let p = split_path(path, prefix, 1, count);
                    (display_name(&p), p)
                }
                None => (fname, entry.path()),
            };
            models.insert(first.0, first.1);
        }
        match models.len() {
            1 => GgufModel::open(models.values().next().expect("one model")),
            0 => Err(GgufError::NoModel {
                dir: path.display().to_string(),
                msg: "folder contains no .gguf file".to_string(),
            }),
            n => Err(GgufError::NoModel {
                dir: path.display().to_string(),
                msg: format!(
                    "folder contains {n} models ({}); give the path of one file",
                    models.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            }),
        }
    }

    /// File name of the first file, as used in error messages.
    pub fn file_name(&self) -> String {
        self.files
            .first()
            .map(|p| display_name(p))
            .unwrap_or_default()
    }

    /// The tensor named `name`, if any.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Total bytes of tensor data over all parts.
    pub fn total_tensor_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.n_bytes).sum()
    }
}

/// Checks `split.no` (0-based) and `split.count` of part `index` of `count` when present.
fn check_split_keys(
    part: &ParsedFile,
    path: &Path,
    index: usize,
    count: usize,
) -> Result<(), GgufError> {
    let bad = |msg: String| GgufError::Format {
        file: display_name(path),
        msg,
    };
    if let Some(v) = part.metadata.get("split.count") {
        if v.as_u64() != Some(count as u64) {
            return Err(bad(format!(
                "metadata key 'split.count' is {v} but the model has {count} part(s)"
            )));
        }
    }
    if let Some(v) = part.metadata.get("split.no") {
        if v.as_u64() != Some(index as u64) {
            return Err(bad(format!(
                "metadata key 'split.no' is {v} but this is part {} (split.no {index})",
                index + 1
            )));
        }
    }
    Ok(())
}
