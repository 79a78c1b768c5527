//! From a path to a running model: what `run`, `bench` and `inspect` open, and what a library
//! user calls to get a model, its weight store, its tokenizer, chat template and sampling
//! defaults.
//!
//! A model path is a `.gguf` file (the first part of a split model), a folder holding one GGUF
//! model, a Hugging Face checkpoint folder (one with a `config.json`), or a pack folder written
//! by `deltafin pack` (a pack opens as the kind of model it was made of); `None` is the demo
//! model (Gemma 3 270M Q4_K_M), fetched on first use.
//!
//! [`load`] does it all in one call. The steps are public too, for a caller that needs the
//! tokenizer before it can size the weights (`deltafin run` sizes the KV cache from the
//! prompt's token count): [`open_any`], then [`OpenedModel::tokenizer`],
//! [`OpenedModel::sampling`], [`OpenedModel::chat_template`] and
//! [`OpenedModel::load_weights`].

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget};

use crate::engine::sampler::ModelSampling;
use crate::models::{load_gguf, load_hf_model, Model};
use crate::progress;
use crate::source::gguf::{GgufModel, Value};

use crate::source::hf::{is_hf_folder, HfModel};
use crate::store::plan::Allowance;
use crate::store::streamer::load_meter;
use crate::store::WeightStore;
use crate::tokenizer::chat::ChatTemplate;
use crate::tokenizer::hf::HfTokenizer;
use crate::tokenizer::{ModelTokenizer, Tokenizer};

/// Opens the GGUF model at `path` (a file, the first part of a split model, or a folder
/// holding one model), or the demo model when `None` (fetching it if absent).
pub fn open_model(path: Option<&Path>) -> Result<GgufModel> {
    use crate::pull::{home_dir, pull, PullOptions, DEMO_MODEL};
    match path {
        Some(p) => Ok(GgufModel::open_model_path(p)?),
        None => {
            let p = pull(DEMO_MODEL, &home_dir(), &PullOptions::default())?;
            GgufModel::open_model_path(&p).with_context(|| {
                format!(
                    "the cached demo model {} looks damaged; `deltafin pull {DEMO_MODEL} --force` fetches it again",
                    p.display()
                )
            })
        }
    }
}

/// A model opened from disk (headers, metadata, tensor index), before its weights are loaded.
pub enum OpenedModel {
    /// A GGUF model, or a pack made of one.
    Gguf(GgufModel),
    /// A Hugging Face checkpoint folder, or a pack made of one.
    Hf(HfModel),
}

/// Opens `path` as a pack when it holds a `manifest.json` (or refuses an unfinished pack; a
/// pack opens as the kind of model it was made of), as a Hugging Face folder when it is a
/// directory with a `config.json`, else as GGUF (see [`open_model`], which also fetches the
/// demo model when `path` is `None`).
pub fn open_any(path: Option<&Path>) -> Result<OpenedModel> {
    use crate::source::pack;
    if let Some(p) = path {
        check_model_path(p)?;
    }
    match path {
        Some(p) if pack::is_pack(p) || pack::is_incomplete_pack(p) => {
            match pack::Manifest::read(p)?.source.format.as_str() {
                "gguf" => Ok(OpenedModel::Gguf(pack::open_gguf_pack(p)?)),
                _ => Ok(OpenedModel::Hf(pack::open_pack(p)?)),
            }
        }
        Some(p) if is_hf_folder(p) => Ok(OpenedModel::Hf(HfModel::open(p)?)),
        _ => Ok(OpenedModel::Gguf(open_model(path)?)),
    }
}

/// Refuses a model path that names one `.safetensors` file: a Hugging Face checkpoint is the
/// folder holding its `config.json`, tokenizer and weight files.
///
/// Errors: `path` is a file whose name ends in `.safetensors`, as `DIR/model.safetensors: one
/// file of a Hugging Face checkpoint; pass the folder that holds it: DIR`.
pub fn check_model_path(path: &Path) -> Result<()> {
    let is_weights = path.extension().is_some_and(|e| e == "safetensors");
    if is_weights && path.is_file() {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        bail!(
            "{}: one file of a Hugging Face checkpoint; pass the folder that holds it: {}",
            path.display(),
            dir.display()
        );
    }
    Ok(())
}

impl OpenedModel {
    /// The architecture family of the model, from GGUF `general.architecture` or
    /// `config.json`'s `model_type` ([`crate::models::FAMILIES`]); `None` when the registry
    /// does not know it.
    pub fn family(&self) -> Option<&'static crate::models::Family> {
        use crate::models::{registry, FAMILIES};
        match self {
            OpenedModel::Gguf(g) => {
                registry::by_gguf_architecture(FAMILIES, g.architecture().ok()?)
            }
            OpenedModel::Hf(h) => registry::by_model_type(FAMILIES, h.model_type().ok()?),
        }
    }

    /// The model's tokenizer: from the GGUF metadata, or the folder's `tokenizer.json`.
    ///
    /// Errors: as [`Tokenizer::from_gguf`] and [`HfTokenizer::from_folder`].
    pub fn tokenizer(&self) -> Result<ModelTokenizer> {
        Ok(match self {
            OpenedModel::Gguf(g) => ModelTokenizer::Gguf(Box::new(Tokenizer::from_gguf(g)?)),
            OpenedModel::Hf(h) => ModelTokenizer::Hf(Box::new(HfTokenizer::from_folder(&h.dir)?)),
        })
    }

    /// The model's sampling defaults: a Hugging Face folder's `generation_config.json` (none
    /// when the file is absent); none for GGUF.
    ///
    /// Errors: the file exists but is not valid JSON or has a bad field (named).
    pub fn sampling(&self) -> Result<ModelSampling> {
        match self {
            OpenedModel::Hf(h) => generation_config_sampling(&h.dir),
            OpenedModel::Gguf(_) => Ok(ModelSampling::default()),
        }
    }

    /// The model's chat template: from the GGUF metadata
    /// ([`ChatTemplate::from_gguf_metadata`]), or from the Hugging Face tokenizer `tok`
    /// ([`HfTokenizer::chat_template`]).
    ///
    /// Errors: the model has none, it does not compile, or `tok` is a GGUF tokenizer given
    /// for a Hugging Face model.
    pub fn chat_template(&self, tok: &ModelTokenizer) -> Result<ChatTemplate> {
        match (self, tok) {
            (OpenedModel::Gguf(g), _) => ChatTemplate::from_gguf_metadata(&g.metadata),
            (_, ModelTokenizer::Hf(t)) => t.chat_template(),
            (OpenedModel::Hf(h), ModelTokenizer::Gguf(_)) => bail!(
                "{}: the chat template of a Hugging Face folder needs its own tokenizer",
                h.dir.display()
            ),
        }
    }

    /// What the model holds in RAM besides its budget ([`Allowance::estimate`]): from the
    /// bytes of its tokenizer data (a GGUF model's metadata as stored; a folder's
    /// `tokenizer.json`, `tiktoken.model` and `tokenizer_config.json`) and its tensor count.
    pub fn allowance(&self) -> Allowance {
        let (tok_bytes, tensors) = match self {
            OpenedModel::Gguf(g) => (
                g.metadata
                    .iter()
                    .map(|(k, v)| 12 + k.len() as u64 + stored_bytes(v))
                    .sum(),
                g.tensors.len(),
            ),
            OpenedModel::Hf(h) => (
                ["tokenizer.json", "tiktoken.model", "tokenizer_config.json"]
                    .iter()
                    .filter_map(|f| std::fs::metadata(h.dir.join(f)).ok())
                    .map(|m| m.len())
                    .sum(),
                h.tensors.len(),
            ),
        };
        Allowance::estimate(tok_bytes, tensors as u64)
    }

    /// Loads the weights under `opts` ([`load_gguf`] or [`load_hf_model`]).
    pub fn load_weights(
        &self,
        opts: &crate::models::LoadOptions,
    ) -> Result<(Box<dyn Model>, WeightStore)> {
        match self {
            OpenedModel::Gguf(g) => load_gguf(g, opts),
            OpenedModel::Hf(h) => load_hf_model(h, opts),
        }
    }

    /// Builds what `opts` asks for (tokenizer, sampling defaults, chat template, in that
    /// order), then loads the weights; the opened headers are dropped on return.
    pub fn load(self, opts: &Options) -> Result<Loaded> {
        let progress = LoadProgress::start("loading");
        let tokenizer = if opts.tokenizer || opts.chat_template {
            progress.phase("loading: tokenizer");
            Some(self.tokenizer()?)
        } else {
            None
        };
        let sampling = match opts.tokenizer {
            true => Some(self.sampling()?),
            false => None,
        };
        let chat_template = match (&tokenizer, opts.chat_template) {
            (Some(t), true) => Some(self.chat_template(t)?),
            _ => None,
        };
        progress.phase("loading: weights");
        let (model, store) = self.load_weights(&opts.weights)?;
        drop(progress);
        Ok(Loaded {
            model,
            store,
            tokenizer,
            sampling,
            chat_template,
        })
    }
}

/// What [`load`] builds besides the weights.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Where the weights go: RAM budget, context and batch sizes, I/O, the expert store.
    pub weights: crate::models::LoadOptions,
    /// Build the tokenizer and read the sampling defaults (what generating text needs; a
    /// caller feeding token ids, like `deltafin bench`, leaves it off).
    pub tokenizer: bool,
    /// Build the chat template too (and the tokenizer it comes with). Off by default: a
    /// model may have none.
    pub chat_template: bool,
}

/// A loaded model with what generating text from it needs.
pub struct Loaded {
    /// The model, its weights placed under the RAM budget.
    pub model: Box<dyn Model>,
    /// Its weights: resident, streamed, or read per expert.
    pub store: WeightStore,
    /// Its tokenizer, when [`Options::tokenizer`] or [`Options::chat_template`].
    pub tokenizer: Option<ModelTokenizer>,
    /// Its sampling defaults, when [`Options::tokenizer`].
    pub sampling: Option<ModelSampling>,
    /// Its chat template, when [`Options::chat_template`].
    pub chat_template: Option<ChatTemplate>,
}

/// Opens the model at `path` ([`open_any`]; `None`: the demo model) and loads it as `opts`
/// says ([`OpenedModel::load`]).
pub fn load(path: Option<&Path>, opts: &Options) -> Result<Loaded> {
    open_any(path)?.load(opts)
}

/// Bytes `v` takes in a GGUF file (its value, without the key and type tag).
fn stored_bytes(v: &Value) -> u64 {
    match v {
        Value::U8(_) | Value::I8(_) | Value::Bool(_) => 1,
        Value::U16(_) | Value::I16(_) => 2,
        Value::U32(_) | Value::I32(_) | Value::F32(_) => 4,
        Value::U64(_) | Value::I64(_) | Value::F64(_) => 8,
        Value::String(s) => 8 + s.len() as u64,
        Value::Array(a) => 12 + a.iter().map(stored_bytes).sum::<u64>(),
    }
}

/// How long a load runs before [`LoadProgress`] shows itself.
pub const PROGRESS_DELAY: Duration = Duration::from_secs(1);

/// The progress of a model load on standard error: nothing for a load shorter than
/// [`PROGRESS_DELAY`] or when standard error is not a terminal; else the phase (`loading:
/// tokenizer`) with a spinner, then, once resident weights are being read, a byte bar of them
/// ([`crate::progress::bar_style`], fed by [`crate::store::streamer::load_meter`]). Cleared
/// when dropped.
pub struct LoadProgress {
    bar: ProgressBar,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LoadProgress {
    /// Starts watching a load labelled `label` (a thread draws it from [`PROGRESS_DELAY`] on).
    pub fn start(label: &str) -> Self {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
        bar.set_style(progress::spinner_style());
        bar.set_message(label.to_string());
        if !progress::stderr_is_terminal() {
            return Self {
                bar,
                stop: None,
                thread: None,
            };
        }
        let (tx, rx) = mpsc::channel::<()>();
        let b = bar.clone();
        let (planned0, read0) = load_meter();
        let thread = std::thread::spawn(move || {
            if rx.recv_timeout(PROGRESS_DELAY) != Err(mpsc::RecvTimeoutError::Timeout) {
                return;
            }
            b.set_draw_target(ProgressDrawTarget::stderr());
            let mut bytes = false;
            loop {
                let (planned, read) = load_meter();
                let (planned, read) = (planned - planned0, read - read0);
                if planned > 0 && !bytes {
                    bytes = true;
                    b.set_style(progress::bar_style());
                    b.reset();
                }
                if bytes {
                    b.set_length(planned);
                    b.set_position(read.min(planned));
                }
                b.tick();
                match rx.recv_timeout(Duration::from_millis(100)) {
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    _ => break,
                }
            }
            b.finish_and_clear();
        });
        Self {
            bar,
            stop: Some(tx),
            thread: Some(thread),
        }
    }

    /// Names the phase the load is in (`loading: weights`).
    pub fn phase(&self, label: &str) {
        self.bar.set_message(label.to_string());
    }

    /// Runs `f` with the progress line out of the way (for printing to standard error).
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        self.bar.suspend(f)
    }
}

impl Drop for LoadProgress {
    fn drop(&mut self) {
        self.stop.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.bar.finish_and_clear();
    }
}

/// The sampling settings in `dir/generation_config.json`, none when the file is absent.
///
/// Errors: the file exists but is not a regular file (a FIFO, a folder), is not valid JSON, or
/// has a bad field (named).
fn generation_config_sampling(dir: &Path) -> Result<ModelSampling> {
    let p = dir.join("generation_config.json");
    if std::fs::symlink_metadata(&p).is_err() {
        return Ok(ModelSampling::default());
    }
    let v = crate::source::hf::read_json(&p)?;
    ModelSampling::from_generation_config(&v, &p.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generation_config_that_is_not_a_file_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("generation_config.json");
        std::fs::create_dir(&p).unwrap();
        let e = generation_config_sampling(dir.path()).unwrap_err();
        assert_eq!(
            format!("{e:#}"),
            format!("{}: not a regular file (a folder)", p.display())
        );
    }

    #[test]
    fn reads_the_fixture_generation_config() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/qwen3");
        let m = generation_config_sampling(&dir).unwrap();
        assert_eq!(
            m,
            ModelSampling {
                temperature: Some(0.6),
                top_k: Some(20),
                top_p: Some(0.95),
                min_p: None,
                repeat_penalty: None,
            }
        );
        let none = generation_config_sampling(Path::new("/nonexistent")).unwrap();
        assert_eq!(none, ModelSampling::default());
    }
}
