//! Tokenizers of Hugging Face checkpoint folders: `tokenizer.json` run by the `tokenizers`
//! crate as transformers' fast tokenizers run it, end-of-generation ids from
//! `generation_config.json` / `config.json` / `tokenizer_config.json`, and the chat template
//! from `tokenizer_config.json` (`chat_template`) or `chat_template.jinja`.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Result};

use super::chat::ChatTemplate;
use crate::source::hf::read_json;

/// A Hugging Face folder's tokenizer.
pub struct HfTokenizer {
    inner: tokenizers::Tokenizer,
    dir: PathBuf,
    /// End-of-generation ids, ascending.
    eog: Vec<u32>,
    /// `tokenizer_config.json` (empty object when absent).
    config: serde_json::Value,
}

impl std::fmt::Debug for HfTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfTokenizer")
            .field("dir", &self.dir)
            .field("eog", &self.eog)
            .finish_non_exhaustive()
    }
}

/// The ids of a JSON id or list of ids (`eos_token_id` may be either).
fn ids_of(v: Option<&serde_json::Value>) -> Vec<u32> {
    match v {
        Some(serde_json::Value::Number(n)) => n.as_u64().map(|x| x as u32).into_iter().collect(),
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64())
            .map(|x| x as u32)
            .collect(),
        _ => vec![],
    }
}

/// A special token's text from `tokenizer_config.json` (a string or `{"content": ...}`).
fn token_text(v: Option<&serde_json::Value>) -> Option<String> {
    match v? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

impl HfTokenizer {
    /// Loads `dir/tokenizer.json` (`tokenizers::Tokenizer::from_file`). End-of-generation ids:
    /// the union of `eos_token_id` in `generation_config.json`, `config.json` and its
    /// `text_config`, and the id of `tokenizer_config.json`'s `eos_token`.
    ///
    /// Errors: `tokenizer.json` missing or not a tokenizer the crate can load (the message
    /// names the file); an existing but invalid JSON config file.
    pub fn from_folder(dir: &Path) -> Result<HfTokenizer> {
        let p = dir.join("tokenizer.json");
        let mut inner = if !p.exists() && dir.join("tiktoken.model").is_file() {
            super::tiktoken::from_folder(dir)?
        } else {
            crate::source::check_regular(&p)?;
            tokenizers::Tokenizer::from_file(&p)
                .map_err(|e| anyhow!("{}: cannot load the tokenizer: {e}", p.display()))?
        };
        remove_marks_first(&mut inner)?;
        let opt_json = |name: &str| -> Result<serde_json::Value> {
            let p = dir.join(name);
            // present but not a regular file (a FIFO, a folder): refused by `read_json`
            if std::fs::symlink_metadata(&p).is_ok() {
                read_json(&p)
            } else {
                Ok(serde_json::Value::Object(Default::default()))
            }
        };
        let gen = opt_json("generation_config.json")?;
        let cfg = opt_json("config.json")?;
        let config = opt_json("tokenizer_config.json")?;
        let mut eog = ids_of(gen.get("eos_token_id"));
        eog.extend(ids_of(cfg.get("eos_token_id")));
        // multimodal checkpoints (Kimi K3) keep the text model's fields in `text_config`
        eog.extend(ids_of(
            cfg.get("text_config").and_then(|t| t.get("eos_token_id")),
        ));
        if let Some(id) = token_text(config.get("eos_token")).and_then(|t| inner.token_to_id(&t)) {
            eog.push(id);
        }
        eog.sort_unstable();
        eog.dedup();
        Ok(HfTokenizer {
            inner,
            dir: dir.to_path_buf(),
            eog,
            config,
        })
    }

    /// The `tokenizers` pipeline (read-only).
    pub(crate) fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Number of tokens, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// End-of-generation ids, ascending.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    /// Whether `id` ends generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// Tokenizes `text` like transformers' `tokenizer(text, add_special_tokens=add_special)`:
    /// added (special) tokens written in the text always become their ids. Errors: the
    /// tokenizer fails (message from the crate).
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, add_special)
            .map_err(|e| anyhow!("tokenization failed: {e}"))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Texts of the added tokens marked `special` (matched in text only when special tokens
    /// are parsed), longest first.
    pub(crate) fn special_texts(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .inner
            .get_added_tokens_decoder()
            .values()
            .filter(|t| t.special && !t.content.is_empty())
            .map(|t| t.content.clone())
            .collect();
        v.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        v.dedup();
        v
    }

    /// Tokenizes text in which [`super::literal::mark`] broke the special-token texts that
    /// must stay literal: the marks are removed before the model sees the text. Errors: the
    /// tokenizer fails, or a special token was still formed out of marked text (a special
    /// token the tokenizer matches after normalizing; refused rather than let through).
    pub(crate) fn encode_marked(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, add_special)
            .map_err(|e| anyhow!("tokenization failed: {e}"))?;
        let specials = self.inner.get_added_tokens_decoder();
        for (&id, &(a, b)) in enc.get_ids().iter().zip(enc.get_offsets()) {
            let formed_from_marked = specials.get(&id).is_some_and(|t| t.special)
                && text
                    .get(a..b)
                    .is_some_and(|s| s.contains(super::literal::MARK));
            if formed_from_marked {
                bail!(
                    "message text would become the special token {:?}; refusing to tokenize it",
                    self.inner.id_to_token(id).unwrap_or_default()
                );
            }
        }
        Ok(enc.get_ids().to_vec())
    }

    /// Detokenizes like transformers' `decode(ids, skip_special_tokens=skip_special)`.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        self.inner.decode(ids, skip_special).unwrap_or_default()
    }

    /// The chat template: `tokenizer_config.json`'s `chat_template` (a string, or a list of
    /// `{name, template}` whose `default` entry is used), else `chat_template.jinja`.
    /// The special-token variables (`bos_token`, `eos_token`, `unk_token`, `sep_token`,
    /// `pad_token`, `cls_token`, `mask_token`: transformers' `special_tokens_map`) come from
    /// `tokenizer_config.json` (left undefined when absent).
    ///
    /// Errors: no template in either place (the message names the folder); compile errors.
    pub fn chat_template(&self) -> Result<ChatTemplate> {
        let names = [
            "bos_token",
            "eos_token",
            "unk_token",
            "sep_token",
            "pad_token",
            "cls_token",
            "mask_token",
        ];
        let texts: Vec<(&str, String)> = names
            .iter()
            .map(|n| (*n, token_text(self.config.get(*n)).unwrap_or_default()))
            .collect();
        let src = match self.config.get("chat_template") {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
            _ => None,
        };
        let src = match src {
            Some(s) => s,
            None => {
                let p = self.dir.join("chat_template.jinja");
                crate::source::check_regular(&p)?;
                std::fs::read_to_string(&p).map_err(|_| {
                    anyhow!(
                        "{}: no chat_template in tokenizer_config.json and no chat_template.jinja",
                        self.dir.display()
                    )
                })?
            }
        };
        let tokens: Vec<(&str, &str)> = texts.iter().map(|(n, t)| (*n, t.as_str())).collect();
        ChatTemplate::with_special_tokens(&src, &tokens)
    }
}

/// Puts the removal of [`super::literal::MARK`] before the tokenizer's own normalizer: the
/// added-token matching runs before normalization, so a marked special-token text stays
/// text, and the normalizer, pre-tokenizer and model never see a mark. Text without marks is
/// normalized as before.
fn remove_marks_first(t: &mut tokenizers::Tokenizer) -> Result<()> {
    use tokenizers::normalizers::{Replace, Sequence};
    use tokenizers::NormalizerWrapper;
    let strip = NormalizerWrapper::Replace(
        Replace::new(super::literal::MARK.to_string(), "")
            .map_err(|e| anyhow!("mark removal: {e}"))?,
    );
    let n = match t.get_normalizer().cloned() {
        None => strip,
        Some(orig) => NormalizerWrapper::Sequence(Sequence::new(vec![strip, orig])),
    };
    t.with_normalizer(Some(n));
    Ok(())
}

/// Incremental detokenization for [`HfTokenizer`]: the text of the ids pushed so far, emitted
/// as it becomes final (a window of ids is re-decoded and the new suffix returned once it
/// does not end in an incomplete character, U+FFFD).
pub struct HfStreamDecoder<'t> {
    tok: &'t HfTokenizer,
    skip_special: bool,
    ids: Vec<u32>,
    /// Start of the window re-decoded on each push.
    prefix: usize,
    /// Ids before this index have been emitted.
    read: usize,
}

impl<'t> HfStreamDecoder<'t> {
    /// A decoder for one generation; `skip_special` as in [`HfTokenizer::decode`].
    pub fn new(tok: &'t HfTokenizer, skip_special: bool) -> Self {
        Self {
            tok,
            skip_special,
            ids: Vec::new(),
            prefix: 0,
            read: 0,
        }
    }

    /// Adds one id; returns the text it completes (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        self.ids.push(id);
        self.emit(false)
    }

    /// Returns whatever is still held back.
    pub fn finish(&mut self) -> String {
        self.emit(true)
    }

    fn emit(&mut self, all: bool) -> String {
        let before = self
            .tok
            .decode(&self.ids[self.prefix..self.read], self.skip_special);
        let now = self.tok.decode(&self.ids[self.prefix..], self.skip_special);
        if now.len() > before.len() && (all || !now.ends_with('\u{FFFD}')) {
            if let Some(s) = now.get(before.len()..) {
                let s = s.to_string();
                self.prefix = self.read;
                self.read = self.ids.len();
                return s;
            }
        }
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::Message;

    #[test]
    fn an_optional_config_that_is_not_a_file_is_refused_by_name() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/qwen3_moe");
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(
            src.join("tokenizer.json"),
            dir.path().join("tokenizer.json"),
        )
        .unwrap();
        let p = dir.path().join("generation_config.json");
        std::fs::create_dir(&p).unwrap();
        let e = HfTokenizer::from_folder(dir.path()).unwrap_err();
        assert_eq!(
            format!("{e:#}"),
            format!("{}: not a regular file (a folder)", p.display())
        );
    }

    fn fixture() -> (HfTokenizer, serde_json::Value) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/qwen3_moe");
        let r = read_json(&dir.join("reference.json")).unwrap();
        (HfTokenizer::from_folder(&dir).unwrap(), r)
    }

    fn ids(v: &serde_json::Value) -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    }

    #[test]
    fn matches_transformers_on_the_fixture() {
        let (t, r) = fixture();
        assert_eq!(t.eog_ids(), [480, 482]);
        assert_eq!(t.vocab_size(), 487);
        let text = r["prompt_text"].as_str().unwrap();
        assert_eq!(t.encode(text, false).unwrap(), ids(&r["prompt_ids"]));
        let tmpl = t.chat_template().unwrap();
        let user = "Which experts does the router keep for café? Answer in 3 words.";
        let rendered = tmpl.render(&[Message::new("user", user)], true).unwrap();
        assert_eq!(rendered, text);
        let cont = ids(&r["continuation_ids"]);
        let want = r["continuation_text"].as_str().unwrap();
        assert_eq!(t.decode(&cont, true), want);
        let mut d = HfStreamDecoder::new(&t, true);
        let mut s: String = cont.iter().map(|&i| d.push(i)).collect();
        s.push_str(&d.finish());
        assert_eq!(s, want);
    }

    #[test]
    fn missing_tokenizer_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let e = HfTokenizer::from_folder(dir.path())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("tokenizer.json: cannot load the tokenizer"),
            "{e}"
        );
    }
}
