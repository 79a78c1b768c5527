//! Helpers for the tests of GGUF files: the llama.cpp-referenced fixtures
//! (`tests/fixtures/gguf/<family>/`, written by tools/reference/gguf_fixtures.py: `reference.json`
//! and raw f32 logits files), loading any model path as `deltafin run` does, logits
//! comparisons, tokenization checks, and edited or hand-made copies of GGUF files.

use std::path::{Path, PathBuf};

use deltafin::engine::Session;
use deltafin::load::open_any;
use deltafin::models::{LoadOptions, Logits, Model};
use deltafin::source::gguf::{GgufError, GgufModel, Value};
use deltafin::source::tensor::TensorInfo;
use deltafin::store::WeightStore;
use deltafin::tokenizer::Tokenizer;
use deltafin::write::gguf_writer::GgufWriter;
use serde_json::Value as Json;

use super::hf::{argmax, f32s, rel_diff, u32s};

/// The fixture folder of `family` (`tests/fixtures/gguf/<family>`).
pub fn dir(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gguf")
        .join(family)
}

/// The family's `reference.json` (llama-cpp-python's logits, continuations and token ids).
pub fn reference(family: &str) -> Json {
    let s = std::fs::read_to_string(dir(family).join("reference.json")).unwrap();
    serde_json::from_str(&s).unwrap()
}

/// The file of variant `v` (`f32`, `q8_0`…) of `family`: `<family>-<v>.gguf`.
pub fn gguf_path(family: &str, v: &str) -> PathBuf {
    dir(family).join(format!("{family}-{v}.gguf"))
}

/// Load options of the fixture tests: a 128-token cache and batch, `O_DIRECT`.
pub fn opts(ram_budget: Option<u64>) -> LoadOptions {
    LoadOptions {
        ram_budget,
        n_ctx: 128,
        n_batch: 128,
        direct_io: true,
        ..Default::default()
    }
}

/// A session over the GGUF file at `path` ([`opts`]).
pub fn session_at(path: &Path, ram_budget: Option<u64>) -> Session {
    let g = GgufModel::open(path).unwrap();
    let (m, s) = deltafin::models::load_gguf(&g, &opts(ram_budget)).unwrap();
    Session::new(m, s, 128, 128)
}

/// Loads the model at `path` (a GGUF file, a Hugging Face folder or a pack) as `deltafin run`
/// does ([`open_any`]).
pub fn load_path(path: &Path, o: &LoadOptions) -> anyhow::Result<(Box<dyn Model>, WeightStore)> {
    open_any(Some(path))?.load_weights(o)
}

/// The smallest budget (in 4 KiB steps) a file loads under, with no weight resident.
pub fn smallest_budget(path: &Path) -> u64 {
    let g = GgufModel::open(path).unwrap();
    let mut b = 4 << 10;
    loop {
        match deltafin::models::load_gguf(&g, &opts(Some(b))) {
            Ok((m, _)) => {
                let p = m.placement();
                assert_eq!(p.resident_bytes, 0, "{}", p.summary);
                return b;
            }
            Err(e) => assert!(e.to_string().contains("is too small"), "{e}"),
        }
        b += 4 << 10;
        assert!(b < 64 << 20, "no budget works");
    }
}

/// The message of loading the GGUF file at `path`, which must fail.
pub fn load_err(path: &Path) -> String {
    let g = GgufModel::open(path).unwrap();
    match deltafin::models::load_gguf(&g, &opts(None)) {
        Ok(_) => panic!("loading {} should fail", path.display()),
        Err(e) => format!("{e:#}"),
    }
}

/// A raw little-endian f32 file (a reference's logits, row after row).
pub fn read_f32(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Our logits at every position of `ids` (one batch), with the vocabulary size.
pub fn prompt_logits(s: &mut Session, ids: &[u32]) -> (Vec<f32>, usize) {
    let all = s.prefill(ids, Logits::All).unwrap();
    let vocab = s.model.vocab_size();
    assert_eq!(all.len(), ids.len() * vocab);
    (all, vocab)
}

/// The worst per-position relative difference between `ours` and the reference rows in `file`.
pub fn worst_rel(ours: &[f32], vocab: usize, file: &Path) -> f32 {
    let want = read_f32(file);
    assert_eq!(want.len(), ours.len(), "{}", file.display());
    ours.chunks_exact(vocab)
        .zip(want.chunks_exact(vocab))
        .map(|(a, b)| rel_diff(a, b))
        .fold(0f32, f32::max)
}

/// Our logits at every prompt position (`ours`) against a transformers reference (an HF
/// fixture's `reference.json`): the last position's full row and every position's top-10,
/// whose first id must be our argmax (`label` names the case). Returns (the last row's
/// relative difference, the worst over the last row and every top-10).
pub fn vs_transformers(ours: &[f32], vocab: usize, hf: &Json, label: &str) -> (f32, f32) {
    let n = ours.len() / vocab;
    let last = rel_diff(&ours[(n - 1) * vocab..], &f32s(&hf["last_logits"]));
    let mut worst = last;
    for (i, p) in hf["positions"].as_array().unwrap().iter().enumerate() {
        let row = &ours[i * vocab..(i + 1) * vocab];
        let got: Vec<f32> = u32s(&p["ids"]).iter().map(|&t| row[t as usize]).collect();
        worst = worst.max(rel_diff(&got, &f32s(&p["logits"])));
        assert_eq!(argmax(row), u32s(&p["ids"])[0], "{label}: position {i}");
    }
    (last, worst)
}

/// Checks a GGUF tokenizer against llama.cpp's ids for one variant `rv` of a reference: the
/// chat text `chat` without BOS and with special tokens parsed (`chat_ids`), the variant's
/// `plain_text` with BOS (`plain_ids`), and the pieces of `continuation_ids`
/// (`continuation_pieces`). `label` names the case.
pub fn check_tokenization(t: &Tokenizer, chat: &str, rv: &Json, label: &str) {
    assert_eq!(
        t.encode(chat, false, true).unwrap(),
        u32s(&rv["chat_ids"]),
        "{label}"
    );
    let plain = rv["plain_text"].as_str().unwrap();
    assert_eq!(
        t.encode(plain, true, false).unwrap(),
        u32s(&rv["plain_ids"]),
        "{label}"
    );
    let bytes: Vec<u8> = u32s(&rv["continuation_ids"])
        .iter()
        .flat_map(|&i| t.token_to_piece(i, true).to_vec())
        .collect();
    assert_eq!(
        String::from_utf8_lossy(&bytes),
        rv["continuation_pieces"].as_str().unwrap(),
        "{label}"
    );
}

/// The data bytes of tensor `t` in `file`, the bytes of the file it lies in.
pub fn tensor_data<'a>(file: &'a [u8], t: &TensorInfo) -> &'a [u8] {
    &file[t.offset as usize..(t.offset + t.n_bytes) as usize]
}

/// Reads the data bytes of tensor `name` straight from its file.
pub fn tensor_bytes(m: &GgufModel, name: &str) -> Vec<u8> {
    let t = m.tensor(name).unwrap();
    let all = std::fs::read(&m.files[t.file]).unwrap();
    tensor_data(&all, t).to_vec()
}

/// Rewrites the one-file GGUF `src` into `dst` with metadata edited by `edit` and tensors for
/// which `keep` is false left out.
pub fn edited_gguf(
    src: &Path,
    dst: &Path,
    edit: impl FnOnce(&mut Vec<(String, Value)>),
    keep: impl Fn(&str) -> bool,
) {
    let g = GgufModel::open(src).unwrap();
    let bytes = std::fs::read(src).unwrap();
    let mut meta: Vec<(String, Value)> = g
        .metadata
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    edit(&mut meta);
    let mut w = GgufWriter::new();
    for (k, v) in meta {
        w.add(k, v);
    }
    for t in g.tensors.iter().filter(|t| keep(&t.name)) {
        w.add_tensor(
            t.name.clone(),
            t.ty,
            &t.shape,
            tensor_data(&bytes, t).to_vec(),
        );
    }
    w.write(dst).unwrap();
}

/// Writes `bytes` to `<tempdir>/<name>` and opens it (the folder is gone on return).
pub fn open_bytes(name: &str, bytes: &[u8]) -> Result<GgufModel, GgufError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).unwrap();
    GgufModel::open(&path)
}
