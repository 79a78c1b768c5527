//! Hugging Face checkpoint folders: `config.json`, `model.safetensors` or shards listed by
//! `model.safetensors.index.json`, into the same tensor index GGUF files give
//! ([`TensorInfo`]: name, type, GGML-order shape, file, absolute offset, byte length).
//!
//! Only the header of each safetensors file is read: 8 bytes of little-endian header length `n`,
//! then `n` bytes of JSON (format: `safetensors` crate docs / README). The header length is
//! bounded by the file size and by [`MAX_HEADER_BYTES`]; the JSON is parsed, each tensor entry
//! checked (two ordered data offsets, sized by dtype and shape, contiguous: errors name the
//! tensor), then read by the `safetensors` crate's `Metadata`; the end
//! of the data must lie inside the file. Tensor data starts at `8 + n` plus its
//! `data_offsets[0]`.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use safetensors::tensor::{Dtype, Metadata};

use super::pack_info::PackInfo;
use super::tensor::TensorInfo;
use crate::quant::GgmlType;

/// Largest safetensors JSON header accepted, in bytes (the `safetensors` crate's own limit).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// An opened Hugging Face checkpoint folder.
#[derive(Clone, Debug)]
pub struct HfModel {
    /// The folder.
    pub dir: PathBuf,
    /// `config.json` as parsed JSON.
    pub config: serde_json::Value,
    /// The safetensors files, in the order [`TensorInfo::file`] indexes them (sorted by name).
    pub files: Vec<PathBuf>,
    /// Every tensor of every file, file by file, in data-offset order.
    pub tensors: Vec<TensorInfo>,
    /// Set when the folder is a Deltafin pack (see [`super::pack`]): `files` and `tensors` are
    /// then the pack's logical files, mapped to physical reads by the pack's relocation.
    pub pack: Option<std::sync::Arc<PackInfo>>,
}

/// Whether `path` is a Hugging Face checkpoint folder (a directory holding `config.json`, of
/// whatever kind: opening one that is not a regular file then says so by name).
pub fn is_hf_folder(path: &Path) -> bool {
    path.is_dir() && std::fs::symlink_metadata(path.join("config.json")).is_ok()
}

/// The GGML type of a safetensors dtype, for the dtypes Deltafin computes with.
///
/// Errors: any other dtype, naming `tensor` and the dtype.
pub fn ggml_type(tensor: &str, file: &Path, d: Dtype) -> Result<GgmlType> {
    Ok(match d {
        Dtype::F32 => GgmlType::F32,
        Dtype::F16 => GgmlType::F16,
        Dtype::BF16 => GgmlType::BF16,
        // raw bytes (MXFP4 blocks and scales): indexed as I8, read only as bytes
        Dtype::U8 => GgmlType::I8,
        // E8M0 exponents (compressed-tensors MXFP4 `weight_scale`): raw bytes as U8
        Dtype::F8_E8M0 => GgmlType::I8,
        // raw E4M3 bytes; architectures pair them with their block scales
        Dtype::F8_E4M3 => GgmlType::F8_E4M3,
        other => bail!(
            "{}: tensor '{tensor}' has dtype {other:?}, which Deltafin cannot read yet (supported: F32, F16, BF16, F8_E4M3, F8_E8M0, U8)",
            file.display()
        ),
    })
}

/// Reads the header of the safetensors file `path` (index `file` in the model's file list) into
/// tensor infos sorted by data offset; shapes are reversed into GGML order (`shape[0]` is the
/// contiguous row length). A 0-d tensor gets shape `[1]`.
///
/// Errors (each naming the file, and the tensor where one is concerned): unreadable file,
/// file shorter than 8 bytes, header length beyond the file or [`MAX_HEADER_BYTES`], header
/// not UTF-8 JSON of the safetensors schema, overlapping/gapped/mis-sized data offsets, data
/// past the end of the file, an unsupported dtype.
pub fn read_safetensors_header(path: &Path, file: usize) -> Result<Vec<TensorInfo>> {
    let name = path.display();
    super::check_regular(path)?;
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {name}"))?;
    let size = f
        .metadata()
        .with_context(|| format!("reading the size of {name}"))?
        .len();
    let mut len8 = [0u8; 8];
    if size < 8 {
        bail!("{name}: file of {size} bytes is too short for a safetensors header");
    }
    f.read_exact(&mut len8)
        .with_context(|| format!("reading {name}"))?;
    let n = u64::from_le_bytes(len8);
    if n > size - 8 || n > MAX_HEADER_BYTES {
        bail!(
            "{name}: safetensors header length {n} exceeds the file ({size} bytes) or the limit of {MAX_HEADER_BYTES} bytes"
        );
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header)
        .with_context(|| format!("reading the header of {name}"))?;
    let text = std::str::from_utf8(&header)
        .map_err(|e| anyhow!("{name}: safetensors header is not UTF-8: {e}"))?;
    let raw: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| anyhow!("{name}: invalid safetensors header: {e}"))?;
    check_tensor_entries(&raw).map_err(|e| anyhow!("{name}: invalid safetensors header: {e}"))?;
    let meta: Metadata = serde_json::from_value(raw)
        .map_err(|e| anyhow!("{name}: invalid safetensors header: {e}"))?;
    let data_start = 8 + n;
    let data_len = meta.data_len() as u64;
    if data_start
        .checked_add(data_len)
        .is_none_or(|end| end > size)
    {
        bail!(
            "{name}: tensor data ends at byte {} but the file has {size} bytes",
            data_start as u128 + data_len as u128
        );
    }
    let mut out = Vec::new();
    for key in meta.offset_keys() {
        let info = meta.info(&key).expect("key from the same metadata");
        let ty = match ggml_type(&key, path, info.dtype) {
            Ok(t) => t,
            // a multimodal checkpoint's other towers are never read (text only): their
            // integer buffers and the like need no type Deltafin computes with
            Err(_) if OTHER_TOWERS.iter().any(|p| key.starts_with(p)) => continue,
            Err(e) => return Err(e),
        };
        let mut shape: Vec<u64> = info.shape.iter().rev().map(|&d| d as u64).collect();
        if shape.is_empty() {
            shape.push(1);
        }
        out.push(TensorInfo {
            name: key.clone(),
            ty,
            shape,
            file,
            offset: data_start + info.data_offsets.0 as u64,
            n_bytes: (info.data_offsets.1 - info.data_offsets.0) as u64,
        });
    }
    Ok(out)
}

/// Checks each tensor entry of a parsed safetensors header before the `safetensors` crate
/// does, so that every error names the tensor: `data_offsets` must be exactly two
/// non-negative integers `[begin, end]` with `begin <= end`, and `end - begin` must equal the
/// byte size of `dtype` × `shape`; entries sorted by `begin` must be contiguous from byte 0.
/// The `__metadata__` entry is skipped. Error texts: `tensor 'NAME': …`.
fn check_tensor_entries(header: &serde_json::Value) -> Result<()> {
    let Some(map) = header.as_object() else {
        bail!("the header is not a JSON object");
    };
    let mut spans: Vec<(u64, u64, &str)> = Vec::new();
    for (tensor, entry) in map {
        if tensor == "__metadata__" {
            continue;
        }
        let offsets = entry.get("data_offsets").and_then(|o| o.as_array());
        let pair = offsets.and_then(|o| match o.as_slice() {
            [b, e] => Some((b.as_u64()?, e.as_u64()?)),
            _ => None,
        });
        let Some((begin, end)) = pair else {
            let found = entry
                .get("data_offsets")
                .map_or("nothing".to_string(), |o| o.to_string());
            bail!(
                "tensor '{tensor}': data_offsets must be two byte offsets [begin, end], found {found}"
            );
        };
        if begin > end {
            bail!("tensor '{tensor}': data_offsets begin {begin} is past end {end}");
        }
        let dtype: Option<Dtype> = entry
            .get("dtype")
            .and_then(|d| serde_json::from_value(d.clone()).ok());
        let shape: Option<Vec<u64>> = entry
            .get("shape")
            .and_then(|s| serde_json::from_value(s.clone()).ok());
        let (Some(dtype), Some(shape)) = (dtype, shape) else {
            bail!(
                "tensor '{tensor}': needs a known \"dtype\" and a \"shape\" of non-negative integers"
            );
        };
        let bits = shape.iter().try_fold(dtype.bitsize() as u128, |acc, &d| {
            acc.checked_mul(d as u128)
        });
        let want = bits.filter(|b| b % 8 == 0).map(|b| b / 8);
        if want != Some(u128::from(end - begin)) {
            bail!(
                "tensor '{tensor}': data_offsets [{begin}, {end}] span {} bytes but dtype {dtype:?} \
                 and shape {shape:?} need {}",
                end - begin,
                want.map_or("a whole number of bytes".to_string(), |w| w.to_string())
            );
        }
        spans.push((begin, end, tensor));
    }
    spans.sort();
    let mut at = 0u64;
    for (begin, end, tensor) in spans {
        if begin != at {
            bail!(
                "tensor '{tensor}': data starts at byte {begin} but the tensors before it end at byte {at}"
            );
        }
        at = end;
    }
    Ok(())
}

/// The prefix under which multimodal checkpoints (`…ForConditionalGeneration`, e.g. Kimi K3)
/// keep their text model; [`HfModel::open`] removes it, so the text model's tensors carry the
/// names a text-only checkpoint gives them (`model.layers.L.…`, `lm_head.weight`). The other
/// towers (`vision_tower.…`, `mm_projector.…`) keep their names and are never read.
pub const TEXT_MODEL_PREFIX: &str = "language_model.";

/// Name prefixes of the non-text parts of multimodal checkpoints (Kimi K3's `vision_tower.`
/// and `mm_projector.`, and the usual others): never read, so a tensor there in a dtype Deltafin
/// does not compute with is left out of the index instead of refusing the folder.
pub const OTHER_TOWERS: &[&str] = &[
    "vision_tower.",
    "mm_projector.",
    "multi_modal_projector.",
    "vision_model.",
    "audio_tower.",
];

/// Removes [`TEXT_MODEL_PREFIX`] from the tensor names that start with it.
///
/// Errors: a tensor present both with and without the prefix (naming both and the folder).
fn strip_text_prefix(tensors: &mut [TensorInfo], dir: &Path) -> Result<()> {
    if !tensors
        .iter()
        .any(|t| t.name.starts_with(TEXT_MODEL_PREFIX))
    {
        return Ok(());
    }
    let names: std::collections::HashSet<String> = tensors.iter().map(|t| t.name.clone()).collect();
    for t in tensors.iter_mut() {
        if let Some(rest) = t.name.strip_prefix(TEXT_MODEL_PREFIX) {
            if names.contains(rest) {
                bail!(
                    "{}: tensors '{}' and '{rest}' would both be the text model's '{rest}'",
                    dir.display(),
                    t.name
                );
            }
            t.name = rest.to_string();
        }
    }
    Ok(())
}

/// Reads a JSON file. Errors name the file (one that is not a regular file is not opened).
pub fn read_json(path: &Path) -> Result<serde_json::Value> {
    super::check_regular(path)?;
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: invalid JSON", path.display()))
}

impl HfModel {
    /// Opens the folder `dir`: parses `config.json`, then the headers of `model.safetensors`
    /// or of every shard `model.safetensors.index.json` names (its `weight_map`).
    ///
    /// Errors: missing or invalid `config.json`; neither weights file present; an index naming
    /// a shard outside the folder, a missing shard, or a tensor absent from the shard it is
    /// mapped to; a tensor name in two files; any header error of
    /// [`read_safetensors_header`]. Every message names the file and tensor concerned.
    pub fn open(dir: &Path) -> Result<HfModel> {
        let config = read_json(&dir.join("config.json"))?;
        if !config.is_object() {
            bail!(
                "{}: expected a JSON object",
                dir.join("config.json").display()
            );
        }
        let single = dir.join("model.safetensors");
        let index_path = dir.join("model.safetensors.index.json");
        let (files, weight_map): (Vec<PathBuf>, Option<BTreeMap<String, String>>) =
            // present at all (a FIFO or a folder is then refused by `read_json`, by name)
            if std::fs::symlink_metadata(&index_path).is_ok() {
                let idx = read_json(&index_path)?;
                let map = idx
                    .get("weight_map")
                    .and_then(|m| m.as_object())
                    .ok_or_else(|| anyhow!("{}: no 'weight_map' object", index_path.display()))?;
                let mut wm = BTreeMap::new();
                for (k, v) in map {
                    let shard = v.as_str().ok_or_else(|| {
                        anyhow!(
                            "{}: weight_map entry for '{k}' is not a file name",
                            index_path.display()
                        )
                    })?;
                    let p = Path::new(shard);
                    if p.components().count() != 1 || p.is_absolute() || shard == ".." {
                        bail!(
                        "{}: shard '{shard}' of tensor '{k}' is not a file name inside the folder",
                        index_path.display()
                    );
                    }
                    wm.insert(k.clone(), shard.to_string());
                }
                let mut shards: Vec<&String> = wm.values().collect();
                shards.sort();
                shards.dedup();
                (shards.iter().map(|s| dir.join(s)).collect(), Some(wm))
            } else if std::fs::symlink_metadata(&single).is_ok() {
                (vec![single], None)
            } else {
                bail!(
                    "{}: no model.safetensors or model.safetensors.index.json",
                    dir.display()
                );
            };
        let mut tensors = Vec::new();
        let mut seen: HashMap<String, usize> = HashMap::new();
        for (i, p) in files.iter().enumerate() {
            for t in read_safetensors_header(p, i)? {
                if let Some(&j) = seen.get(&t.name) {
                    bail!(
                        "tensor '{}' is in both {} and {}",
                        t.name,
                        files[j].display(),
                        p.display()
                    );
                }
                seen.insert(t.name.clone(), i);
                tensors.push(t);
            }
        }
        if let Some(wm) = &weight_map {
            for (name, shard) in wm {
                let want = dir.join(shard);
                match seen.get(name) {
                    Some(&i) if files[i] == want => {}
                    _ => bail!(
                        "{}: tensor '{name}' is mapped to {shard} but that file does not hold it",
                        index_path.display()
                    ),
                }
            }
        }
        strip_text_prefix(&mut tensors, dir)?;
        Ok(HfModel {
            dir: dir.to_path_buf(),
            config,
            files,
            tensors,
            pack: None,
        })
    }

    /// `config.json`'s `model_type`. Errors: missing or not a string.
    pub fn model_type(&self) -> Result<&str> {
        self.config
            .get("model_type")
            .and_then(|v| v.as_str())
            .ok_or_else(|| {
                anyhow!(
                    "{}: 'model_type' is missing or not a string",
                    self.dir.join("config.json").display()
                )
            })
    }

    /// The path of `config.json`, for messages.
    pub fn config_path(&self) -> PathBuf {
        self.dir.join("config.json")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::tensor::TensorView;

    fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    fn st_file(tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
        let views: Vec<(String, TensorView)> = tensors
            .iter()
            .map(|(n, d, s, b)| (n.to_string(), TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        safetensors::serialize(views, None).unwrap()
    }

    #[test]
    fn reads_header_into_ggml_order_with_absolute_offsets() {
        let dir = tempfile::tempdir().unwrap();
        let a: Vec<u8> = (0..24u8).collect(); // f32 [2,3]
        let b: Vec<u8> = (100..108u8).collect(); // bf16 [4]
        let bytes = st_file(&[
            ("a", Dtype::F32, vec![2, 3], a.clone()),
            ("b", Dtype::BF16, vec![4], b.clone()),
        ]);
        let p = write(dir.path(), "model.safetensors", &bytes);
        let ts = read_safetensors_header(&p, 3).unwrap();
        assert_eq!(ts.len(), 2);
        let ta = ts.iter().find(|t| t.name == "a").unwrap();
        let tb = ts.iter().find(|t| t.name == "b").unwrap();
        assert_eq!(
            (ta.ty, ta.shape.clone(), ta.file, ta.n_bytes),
            (GgmlType::F32, vec![3, 2], 3, 24)
        );
        assert_eq!(
            (tb.ty, tb.shape.clone(), tb.n_bytes),
            (GgmlType::BF16, vec![4], 8)
        );
        let o = ta.offset as usize;
        assert_eq!(&bytes[o..o + 24], &a[..]);
        let o = tb.offset as usize;
        assert_eq!(&bytes[o..o + 8], &b[..]);
    }

    #[test]
    fn an_index_or_weights_path_that_is_not_a_file_is_refused_by_name() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/qwen3_moe");
        for name in ["model.safetensors.index.json", "model.safetensors"] {
            let dir = tempfile::tempdir().unwrap();
            std::fs::copy(src.join("config.json"), dir.path().join("config.json")).unwrap();
            let p = dir.path().join(name);
            std::fs::create_dir(&p).unwrap();
            let e = HfModel::open(dir.path()).unwrap_err();
            assert_eq!(
                format!("{e:#}"),
                format!("{}: not a regular file (a folder)", p.display())
            );
        }
    }

    #[test]
    fn rejects_hostile_headers() {
        let dir = tempfile::tempdir().unwrap();
        let err = |bytes: &[u8]| {
            let p = write(dir.path(), "x.safetensors", bytes);
            format!("{:#}", read_safetensors_header(&p, 0).unwrap_err())
        };
        let e = err(&[1, 2, 3]);
        assert!(
            e.contains("x.safetensors: file of 3 bytes is too short"),
            "{e}"
        );
        let mut huge = u64::MAX.to_le_bytes().to_vec();
        huge.extend_from_slice(b"{}");
        let e = err(&huge);
        assert!(
            e.contains("header length 18446744073709551615 exceeds the file (10 bytes)"),
            "{e}"
        );
        let mut past = 100u64.to_le_bytes().to_vec();
        past.extend_from_slice(b"{}");
        assert!(err(&past).contains("header length 100 exceeds the file"));
        let hdr = |j: &str| {
            let mut v = (j.len() as u64).to_le_bytes().to_vec();
            v.extend_from_slice(j.as_bytes());
            v
        };
        let e = err(&hdr("{nope"));
        assert!(e.contains("invalid safetensors header"), "{e}");
        // data past the end of the file
        let e = err(&hdr(
            r#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#,
        ));
        assert!(
            e.contains("tensor data ends at byte 79 but the file has 63 bytes"),
            "{e}"
        );
        // Every offset error names the file and the tensor, with exact texts.
        let exact = |j: &str, want: &str| {
            let e = err(&hdr(j));
            let want = format!(
                "{}: invalid safetensors header: {want}",
                dir.path().join("x.safetensors").display()
            );
            assert_eq!(e, want);
        };
        exact(
            r#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,12]}}"#,
            "tensor 'w': data_offsets [0, 12] span 12 bytes but dtype F32 and shape [4] need 16",
        );
        exact(
            r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#,
            "tensor 'w': data starts at byte 4 but the tensors before it end at byte 0",
        );
        exact(
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b.weight":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}}"#,
            "tensor 'b.weight': data_offsets begin 8 is past end 4",
        );
        exact(
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b.weight":{"dtype":"F32","shape":[1],"data_offsets":[4]}}"#,
            "tensor 'b.weight': data_offsets must be two byte offsets [begin, end], found [4]",
        );
        exact(
            r#"{"c":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}"#,
            "tensor 'c': data_offsets must be two byte offsets [begin, end], found [0,4,8]",
        );
        exact(
            r#"{"c":{"dtype":"F32","shape":[1],"data_offsets":[-1,4]}}"#,
            "tensor 'c': data_offsets must be two byte offsets [begin, end], found [-1,4]",
        );
        exact(
            r#"{"c":{"dtype":"F32","shape":[1]}}"#,
            "tensor 'c': data_offsets must be two byte offsets [begin, end], found nothing",
        );
        exact(
            r#"{"c":{"dtype":"Q9","shape":[1],"data_offsets":[0,4]}}"#,
            "tensor 'c': needs a known \"dtype\" and a \"shape\" of non-negative integers",
        );
        // unsupported dtype names the tensor
        let v = st_file(&[("q.weight", Dtype::I8, vec![2], vec![1, 2])]);
        let e = err(&v);
        assert!(
            e.contains("tensor 'q.weight' has dtype I8, which Deltafin cannot read yet"),
            "{e}"
        );
    }

    #[test]
    fn text_model_prefix_is_removed_and_collisions_refused() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write(d, "config.json", br#"{"model_type":"kimi_k3"}"#);
        let tensors = [
            (
                "language_model.model.norm.weight",
                Dtype::BF16,
                vec![2],
                vec![0; 4],
            ),
            ("vision_tower.w", Dtype::BF16, vec![2], vec![0; 4]),
            // a dtype Deltafin does not read, in a tower it never reads: left out
            ("vision_tower.pos_ids", Dtype::I64, vec![2], vec![0; 16]),
            (
                "language_model.model.layers.0.mlp.experts.1.w1.weight_scale",
                Dtype::F8_E8M0,
                vec![2, 1],
                vec![127; 2],
            ),
        ];
        write(d, "model.safetensors", &st_file(&tensors));
        let m = HfModel::open(d).unwrap();
        let mut names: Vec<(&str, GgmlType)> =
            m.tensors.iter().map(|t| (t.name.as_str(), t.ty)).collect();
        names.sort_by_key(|n| n.0);
        assert_eq!(
            names,
            [
                ("model.layers.0.mlp.experts.1.w1.weight_scale", GgmlType::I8),
                ("model.norm.weight", GgmlType::BF16),
                ("vision_tower.w", GgmlType::BF16),
            ]
        );
        let clash = [
            (
                "language_model.lm_head.weight",
                Dtype::BF16,
                vec![2],
                vec![0; 4],
            ),
            ("lm_head.weight", Dtype::BF16, vec![2], vec![0; 4]),
        ];
        write(d, "model.safetensors", &st_file(&clash));
        let e = HfModel::open(d).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "{}: tensors 'language_model.lm_head.weight' and 'lm_head.weight' would both be the text model's 'lm_head.weight'",
                d.display()
            )
        );
    }

    #[test]
    fn opens_sharded_folders_and_checks_the_index() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write(d, "config.json", br#"{"model_type":"qwen3"}"#);
        write(
            d,
            "s-1.safetensors",
            &st_file(&[("x", Dtype::F16, vec![2, 2], vec![0; 8])]),
        );
        write(
            d,
            "s-2.safetensors",
            &st_file(&[("y", Dtype::F32, vec![1], vec![0; 4])]),
        );
        write(
            d,
            "model.safetensors.index.json",
            br#"{"weight_map":{"x":"s-1.safetensors","y":"s-2.safetensors"}}"#,
        );
        let m = HfModel::open(d).unwrap();
        assert_eq!(m.model_type().unwrap(), "qwen3");
        assert_eq!(
            m.files,
            vec![d.join("s-1.safetensors"), d.join("s-2.safetensors")]
        );
        let names: Vec<(&str, usize)> = m
            .tensors
            .iter()
            .map(|t| (t.name.as_str(), t.file))
            .collect();
        assert_eq!(names, [("x", 0), ("y", 1)]);
        write(
            d,
            "model.safetensors.index.json",
            br#"{"weight_map":{"x":"s-2.safetensors","y":"s-2.safetensors"}}"#,
        );
        let e = format!("{:#}", HfModel::open(d).unwrap_err());
        assert!(
            e.contains("tensor 'x' is mapped to s-2.safetensors but that file does not hold it"),
            "{e}"
        );
        write(
            d,
            "model.safetensors.index.json",
            br#"{"weight_map":{"x":"../s-1.safetensors"}}"#,
        );
        let e = format!("{:#}", HfModel::open(d).unwrap_err());
        assert!(
            e.contains(
                "shard '../s-1.safetensors' of tensor 'x' is not a file name inside the folder"
            ),
            "{e}"
        );
    }
}
