//! Entry points of the fuzz targets (`fuzz/`, run with `cargo afl`) and of
//! `tests/fuzz_corpus.rs`, which replays the committed corpus through them without AFL.
//!
//! Each `fuzz_*` function takes arbitrary bytes, hands them to one parser the way a hostile
//! file would reach it, and ignores the result: a returned error is a correct answer; only a
//! panic, a hang or an unbounded allocation is a finding. Inputs that need several files are
//! written into a fresh temporary folder (removed afterwards) and split at [`SEPARATOR`].

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::models::FAMILIES;
use crate::source::gguf::GgufModel;
use crate::source::hf::HfModel;
use crate::source::pack::Manifest;
use crate::store::heat::Heat;
use crate::tokenizer::ChatTemplate;

/// Splits an input that stands for two files (safetensors index and header; chat template
/// and messages): the bytes before its first occurrence, and those after.
pub const SEPARATOR: &[u8] = b"\n#--#\n";

/// Layers and experts of the expert heat counts [`fuzz_heat`] reads its input as.
pub const HEAT_SHAPE: (usize, usize) = (2, 4);

/// A temporary folder removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "deltafin-fuzz-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating a temporary folder for a fuzz input");
        Scratch(dir)
    }

    fn write(&self, name: &str, data: &[u8]) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, data).expect("writing a fuzz input to the temporary folder");
        p
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn split(data: &[u8]) -> (&[u8], Option<&[u8]>) {
    match data.windows(SEPARATOR.len()).position(|w| w == SEPARATOR) {
        Some(i) => (&data[..i], Some(&data[i + SEPARATOR.len()..])),
        None => (data, None),
    }
}

/// `data` as a single-file GGUF model, opened with [`GgufModel::open`].
pub fn fuzz_gguf(data: &[u8]) {
    let s = Scratch::new();
    let p = s.write("model.gguf", data);
    let _ = GgufModel::open(&p);
}

/// A Hugging Face folder opened with [`HfModel::open`] (fixed `config.json`): `data` is
/// `model.safetensors`; or, when it holds [`SEPARATOR`], `INDEX SEPARATOR SHARD`, written as
/// `model.safetensors.index.json` and `model-00001-of-00001.safetensors`.
pub fn fuzz_safetensors(data: &[u8]) {
    let s = Scratch::new();
    s.write("config.json", br#"{"model_type":"llama"}"#);
    match split(data) {
        (single, None) => {
            s.write("model.safetensors", single);
        }
        (index, Some(shard)) => {
            s.write("model.safetensors.index.json", index);
            s.write("model-00001-of-00001.safetensors", shard);
        }
    }
    let _ = HfModel::open(s.path());
}

/// `data` as a pack's `manifest.json` (in a folder with no other files), read and checked
/// with [`Manifest::read_checked`].
pub fn fuzz_pack_manifest(data: &[u8]) {
    let s = Scratch::new();
    s.write("manifest.json", data);
    let _ = Manifest::read_checked(s.path());
}

/// `data` as an expert heat file of [`HEAT_SHAPE`]: loaded with [`Heat::load`], then a run
/// merged into it with [`Heat::merge_into_file`].
pub fn fuzz_heat(data: &[u8]) {
    let s = Scratch::new();
    let p = s.write("heat.json", data);
    let (layers, experts) = HEAT_SHAPE;
    let h = Heat::load(&p, layers, experts);
    let _ = h.seed();
    let _ = Heat::merge_into_file(&Heat::zeros(layers, experts), &p);
}

/// `data` as `config.json`, checked by every family's [`crate::models::Family::check_hf`]
/// (a model with no tensors, so only the configuration is looked at).
pub fn fuzz_config(data: &[u8]) {
    let Ok(config) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let m = HfModel {
        dir: PathBuf::from("fuzz-config"),
        config,
        files: Vec::new(),
        tensors: Vec::new(),
        pack: None,
    };
    for f in FAMILIES {
        if let Some(check) = f.check_hf {
            let _ = check(&m);
        }
    }
}

/// `TEMPLATE SEPARATOR MESSAGES`: a chat template compiled with [`ChatTemplate::new`] and
/// rendered with [`ChatTemplate::render_json`] over the messages (JSON; a fixed
/// conversation when absent or invalid), with and without the generation prompt.
pub fn fuzz_chat(data: &[u8]) {
    let (template, messages) = split(data);
    let Ok(template) = std::str::from_utf8(template) else {
        return;
    };
    let Ok(t) = ChatTemplate::new(template, "<s>", "</s>") else {
        return;
    };
    let messages = messages
        .and_then(|m| serde_json::from_slice::<serde_json::Value>(m).ok())
        .unwrap_or_else(|| {
            serde_json::json!([
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"}
            ])
        });
    let _ = t.render_json(&messages, None, true);
    let _ = t.render_json(&messages, None, false);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The config target's first finding (CI, session 20): a layer count of 3.3e15 made the
    /// Kimi Linear and Kimi K3 checks allocate their per-layer lists before the range check
    /// (an abort). Every family's check now answers it with an error; those two name the field.
    #[test]
    fn a_huge_layer_count_is_an_error_in_every_family() {
        let config: serde_json::Value = serde_json::from_slice(include_bytes!(
            "../tests/fixtures/fuzz/config-huge-layer-count.json"
        ))
        .unwrap();
        fuzz_config(&serde_json::to_vec(&config).unwrap());
        let m = HfModel {
            dir: PathBuf::from("f"),
            config,
            files: Vec::new(),
            tensors: Vec::new(),
            pack: None,
        };
        let mut named = Vec::new();
        for f in FAMILIES {
            if let Some(check) = f.check_hf {
                let e = check(&m).unwrap_err().to_string();
                if e.contains("'num_hidden_layers' = 3333333333333333 is outside 1..=1048576") {
                    named.push(f.name);
                }
            }
        }
        assert!(
            named.contains(&"kimi_linear") && named.contains(&"kimi_k3"),
            "{named:?}"
        );
    }
}
