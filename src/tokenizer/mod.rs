//! Tokenization. Hugging Face folders: `tokenizer.json` through the `tokenizers` crate, see
//! [`hf`] (Kimi's `tiktoken.model` folders are read into the same pipeline, `tiktoken.rs`).
//! GGUF models: matching llama.cpp (`src/llama-vocab.cpp`) id for id.
//!
//! Special-token text: a raw prompt's special-token texts become control ids in both formats
//! unless the caller asks for literal text ([`ModelTokenizer::encode_prompt`]); chat message
//! contents are always literal, only a template's markup becomes control tokens
//! ([`ModelTokenizer::encode_messages`], `literal.rs`).
//!
//! The BPE itself runs in the `tokenizers` crate: a SentencePiece vocabulary (`llama` model in
//! GGUF) becomes a `tokenizers` BPE whose merge ranks follow the scores of the merged tokens,
//! with byte fallback through the `<0xNN>` tokens and `▁` for spaces; a byte-level vocabulary
//! (`gpt2` model) becomes a byte-level BPE with the file's merges, run on the pieces of the
//! pre-tokenizer of its `tokenizer.ggml.pre` (every name llama.cpp knows: `pre_tokenizers.rs`,
//! `pre_split.rs`, `byte_bpe.rs`). What lies around the BPE
//! follows llama.cpp: special and user-defined tokens are cut out of the raw text first (longest
//! text first), and decoding concatenates llama.cpp's token pieces. Chat templates live in
//! [`chat`], streamed detokenization in [`stream`].
//!
//! Files:
//!
//! - `hf.rs`: Hugging Face `tokenizer.json`; `tiktoken.rs`: Kimi's `tiktoken.model` as a
//!   `tokenizers` BPE.
//! - GGUF vocabularies: `vocab.rs` (the stored vocabulary and its token attributes), `bpe.rs`
//!   (SentencePiece `llama` as a `tokenizers` BPE), `byte_bpe.rs` (byte-level `gpt2`), every
//!   llama.cpp pre-tokenizer in `pre_tokenizers.rs`, split as llama.cpp splits in
//!   `pre_split.rs`; special tokens cut out of raw text first in `partition.rs`; `packed.rs`: the
//!   vocabulary's strings in one buffer.
//! - `chat.rs`: chat templates through `minijinja`, rendered as transformers'
//!   `render_jinja_template` renders them (message normalization, variables,
//!   `{% generation %}`); `chat_py.rs`: Python value printing, `tojson`, local-time
//!   `strftime_now`.
//! - `literal.rs`: message text kept literal inside rendered templates (used by
//!   `ModelTokenizer::encode_messages`).
//! - `stream.rs`: streaming detokenization.
//! - `token_bytes.rs`: every token's bytes and whether it is special (for constrained
//!   decoding).
//! - `model_tokenizer.rs`: either kind behind `ModelTokenizer`.

mod bpe;
mod byte_bpe;
pub mod chat;
mod chat_jinja2;
pub mod chat_py;
pub mod hf;
mod literal;
mod model_tokenizer;
mod packed;
mod partition;
mod pre_split;
mod pre_tokenizers;
pub mod stream;
mod tiktoken;
mod token_bytes;
mod vocab;

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Context, Result};

use crate::source::gguf::{GgufModel, Value};
pub use chat::{ChatTemplate, Message};
pub use model_tokenizer::{ModelStreamDecoder, ModelTokenizer};
pub use stream::StreamDecoder;
pub use token_bytes::TokenBytes;
use vocab::Vocab;

/// The BPE of either kind of GGUF vocabulary.
enum Bpe {
    /// SentencePiece (`llama`): a `tokenizers` pipeline (normalizer, byte fallback).
    Spm(Box<tokenizers::Tokenizer>),
    /// Byte-level (`gpt2`): llama.cpp's pre-tokenizer, then the BPE.
    Bytes(Box<byte_bpe::ByteBpe>),
}

impl Bpe {
    fn token_to_id(&self, text: &str) -> Option<u32> {
        match self {
            Bpe::Spm(t) => t.token_to_id(text),
            Bpe::Bytes(b) => b.token_to_id(text),
        }
    }

    fn encode(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        match self {
            Bpe::Spm(t) => {
                let enc = t
                    .encode_fast(text, false)
                    .map_err(|e| anyhow!("BPE tokenization failed: {e}"))?;
                out.extend_from_slice(enc.get_ids());
                Ok(())
            }
            Bpe::Bytes(b) => b.encode(text, out),
        }
    }
}

/// A GGUF model's tokenizer.
pub struct Tokenizer {
    vocab: Vocab,
    /// Tokenizes one raw-text fragment (no special tokens inside) with the model's BPE.
    bpe: Bpe,
    /// Bytes of every token as llama.cpp renders it with `special = true`, by id.
    pieces: packed::PackedBytes,
    /// Special and user-defined tokens, split out of raw text before BPE.
    specials: partition::SpecialMatcher,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("model", &self.vocab.model)
            .field("vocab_size", &self.vocab.texts.len())
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds the tokenizer of an opened GGUF model. See [`Tokenizer::from_gguf_metadata`].
    pub fn from_gguf(model: &GgufModel) -> Result<Tokenizer> {
        Self::from_gguf_metadata(&model.metadata)
    }

    /// Builds a tokenizer from GGUF metadata (`tokenizer.ggml.*` keys, GGUF spec
    /// `docs/gguf.md` in the ggml repository).
    ///
    /// Supported: `tokenizer.ggml.model = "llama"` (SentencePiece BPE) and `"gpt2"` (byte-level
    /// BPE with `tokenizer.ggml.merges`, for every `tokenizer.ggml.pre` name llama.cpp in
    /// llama-cpp-python 0.3.36 accepts, a missing one meaning `default`).
    /// Errors: any other model type or pre-tokenizer (named in the message), missing
    /// `tokenizer.ggml.tokens` or `tokenizer.ggml.merges`, arrays of the wrong type or length,
    /// token ids outside the vocabulary.
    pub fn from_gguf_metadata(meta: &BTreeMap<String, Value>) -> Result<Tokenizer> {
        let vocab = Vocab::from_metadata(meta)?;
        match vocab.model.as_str() {
            "llama" => Self::build_spm(vocab),
            "gpt2" => Self::build_byte_bpe(vocab, meta),
            other => bail!(
                "unsupported tokenizer model type {other:?} (tokenizer.ggml.model); \
                 only \"llama\" (SentencePiece BPE) and \"gpt2\" (byte-level BPE) are implemented"
            ),
        }
    }

    /// A byte-level BPE vocabulary (`gpt2`): merges from `tokenizer.ggml.merges`, the
    /// pre-tokenizer from `tokenizer.ggml.pre`.
    fn build_byte_bpe(vocab: Vocab, meta: &BTreeMap<String, Value>) -> Result<Tokenizer> {
        let merges: Vec<&str> = match meta.get("tokenizer.ggml.merges") {
            Some(Value::Array(a)) => a
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::String(s) => Ok(s.as_str()),
                    other => bail!("tokenizer.ggml.merges[{i}] is not a string: {other:?}"),
                })
                .collect::<Result<_>>()?,
            Some(other) => bail!("GGUF key tokenizer.ggml.merges is not an array: {other:?}"),
            None => {
                bail!("GGUF metadata has no tokenizer.ggml.merges (needed by a gpt2 vocabulary)")
            }
        };
        let pre = vocab::opt_str(meta, "tokenizer.ggml.pre")?;
        let bpe = Bpe::Bytes(Box::new(byte_bpe::build(&vocab, &merges, pre)?));
        let pieces = byte_bpe::pieces(&vocab)?;
        let specials = partition::SpecialMatcher::new(&vocab);
        Ok(Tokenizer {
            vocab,
            bpe,
            pieces,
            specials,
        })
    }

    /// Builds the BPE first (the large structures), then the small ones, then hands the
    /// memory freed by construction back to the system ([`release_freed_memory`]).
    fn build_spm(mut vocab: Vocab) -> Result<Tokenizer> {
        let scores = std::mem::take(&mut vocab.scores);
        let bpe = Bpe::Spm(Box::new(bpe::build(&vocab, scores)?));
        let pieces = vocab.spm_pieces()?;
        let specials = partition::SpecialMatcher::new(&vocab);
        release_freed_memory();
        Ok(Tokenizer {
            vocab,
            bpe,
            pieces,
            specials,
        })
    }

    /// Number of tokens in the vocabulary (ids are `0..vocab_size`).
    pub fn vocab_size(&self) -> usize {
        self.vocab.texts.len()
    }

    /// `tokenizer.ggml.bos_token_id`, if any.
    pub fn bos_id(&self) -> Option<u32> {
        self.vocab.bos
    }

    /// `tokenizer.ggml.eos_token_id`, if any.
    pub fn eos_id(&self) -> Option<u32> {
        self.vocab.eos
    }

    /// End-of-generation ids, ascending: EOS, EOT/EOM/FIM ids from metadata, and tokens whose
    /// text llama.cpp treats as ending a turn (`<end_of_turn>`, `<|im_end|>`, `<|eot_id|>`,
    /// `</s>`…; list from llama.cpp `llama_vocab::impl::load`).
    pub fn eog_ids(&self) -> &[u32] {
        &self.vocab.eog
    }

    /// Whether `id` ends generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.vocab.eog.binary_search(&id).is_ok()
    }

    /// The stored text of token `id` (with `▁` for spaces, `<0xNN>` for bytes), if in range.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.vocab.texts.get(id as usize)
    }

    /// Looks a token up by its stored text.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        // The BPE's vocabulary holds every text with llama.cpp's id (a later duplicate wins).
        self.bpe.token_to_id(text)
    }

    /// Bytes of one token as llama.cpp's `llama_token_to_piece(lstrip = 0)` gives them: control
    /// and unknown tokens are empty unless `special`; a byte token is one (possibly partial
    /// UTF-8) byte. Ids out of range give an empty piece.
    pub fn token_to_piece(&self, id: u32, special: bool) -> &[u8] {
        let Some(p) = self.pieces.get(id as usize) else {
            return &[];
        };
        if !special && self.vocab.attrs[id as usize].needs_parse_special() {
            return &[];
        }
        p
    }

    /// Tokenizes `text` like llama.cpp's `llama_tokenize(text, add_special, parse_special)`.
    ///
    /// `add_special` adds BOS when `tokenizer.ggml.add_bos_token` is true and EOS when
    /// `tokenizer.ggml.add_eos_token` is true. `parse_special` lets control tokens written in
    /// the text (e.g. `<start_of_turn>`) become their ids; user-defined tokens are always
    /// matched. Errors only if the BPE fails.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.vocab.add_bos {
            out.push(
                self.vocab
                    .bos
                    .context("add_bos_token is set but there is no BOS id")?,
            );
        }
        let mut prev_special = true;
        for frag in self.specials.partition(text, parse_special) {
            match frag {
                partition::Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                partition::Fragment::Text(s) => {
                    let unmarked;
                    let s = if s.contains(literal::MARK) {
                        unmarked = literal::unmark(s);
                        unmarked.as_str()
                    } else {
                        s
                    };
                    if self.vocab.add_space_prefix && prev_special {
                        self.bpe.encode(format!(" {s}").as_str(), &mut out)?;
                    } else {
                        self.bpe.encode(s, &mut out)?;
                    }
                    prev_special = false;
                }
            }
        }
        if add_special && self.vocab.add_eos {
            out.push(
                self.vocab
                    .eos
                    .context("add_eos_token is set but there is no EOS id")?,
            );
        }
        Ok(out)
    }

    /// Detokenizes like llama.cpp's `llama_detokenize`: with `skip_special`
    /// (`remove_special = true, unparse_special = false`) a leading BOS and trailing EOS added by
    /// the model's settings are dropped and control tokens render as nothing; without it every
    /// token is rendered. Invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        let mut d = StreamDecoder::new(self, skip_special);
        let mut ids = ids;
        if skip_special
            && self.vocab.add_eos
            && ids.last().is_some()
            && ids.last() == self.vocab.eos.as_ref()
        {
            ids = &ids[..ids.len() - 1];
        }
        let mut s = String::new();
        for &id in ids {
            s.push_str(&d.push(id));
        }
        s.push_str(&d.finish());
        s
    }

    /// Texts of the tokens matched only when special tokens are parsed (control and unknown
    /// tokens), longest first: the texts that must be broken to stay literal.
    pub(crate) fn parse_special_texts(&self) -> Vec<String> {
        let mut v: Vec<String> = (0..self.vocab.texts.len())
            .filter(|&i| self.vocab.attrs[i].needs_parse_special())
            .map(|i| self.vocab.text(i).to_string())
            .filter(|t| !t.is_empty())
            .collect();
        v.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        v.dedup();
        v
    }

    pub(crate) fn vocab(&self) -> &Vocab {
        &self.vocab
    }
}

/// Hands memory that the allocator keeps but no longer uses back to the operating system
/// (glibc `malloc_trim(0)`, see `malloc_trim(3)`). Building a [`Tokenizer`] frees ~60 MB of
/// small blocks (the BPE builder's merge strings) that would otherwise stay in the resident set,
/// so [`Tokenizer::from_gguf`] calls it; it is worth calling again after dropping the GGUF
/// metadata for the same reason. Returns whether any memory was released; always `false`
/// where the C library is not glibc.
pub fn release_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim takes no pointers; it only walks glibc's own heaps under their locks.
        unsafe { libc::malloc_trim(0) != 0 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (text, score, token type); "a" twice, and a type outside `i8`.
    const VOCAB: &[(&str, f32, i32)] = &[
        ("<unk>", 0.0, 2),      // 0
        ("<s>", 0.0, 3),        // 1
        ("a", -3.0, 1),         // 2
        ("b", -4.0, 1),         // 3
        ("ab", -1.0, 1),        // 4
        ("a", -5.0, 1),         // 5: a later duplicate wins the text
        ("\u{2581}b", -2.0, 1), // 6
        ("<0x41>", 0.0, 6),     // 7
        ("c", -6.0, 300),       // 8: unknown type, renders as nothing
        ("\u{2581}", -7.0, 1),  // 9
    ];

    fn tok() -> Tokenizer {
        let col = |f: fn(&(&str, f32, i32)) -> Value| Value::Array(VOCAB.iter().map(f).collect());
        let mut m = BTreeMap::new();
        m.insert("tokenizer.ggml.model".into(), Value::String("llama".into()));
        m.insert(
            "tokenizer.ggml.tokens".into(),
            col(|t| Value::String(t.0.into())),
        );
        m.insert("tokenizer.ggml.scores".into(), col(|t| Value::F32(t.1)));
        m.insert("tokenizer.ggml.token_type".into(), col(|t| Value::I32(t.2)));
        m.insert("tokenizer.ggml.add_space_prefix".into(), Value::Bool(false));
        Tokenizer::from_gguf_metadata(&m).unwrap()
    }

    #[test]
    fn duplicate_texts_resolve_to_the_last_id() {
        let t = tok();
        assert_eq!(t.vocab_size(), 10);
        assert_eq!(t.token_id("a"), Some(5));
        assert_eq!(t.token_id("\u{2581}b"), Some(6));
        assert_eq!(t.token_id("zz"), None);
        assert_eq!(t.token_text(2), Some("a"));
        assert_eq!(t.token_text(5), Some("a"));
        assert_eq!(t.token_text(10), None);
        // The BPE starts from the winning id of "a" and merges "a"+"b" into "ab".
        assert_eq!(t.encode("a", false, false).unwrap(), [5]);
        assert_eq!(t.encode("ab b", false, false).unwrap(), [4, 6]);
        // "A" is not a token: byte fallback.
        assert_eq!(t.encode("Ac", false, false).unwrap(), [7, 8]);
    }

    /// A byte-level (`gpt2`) vocabulary: texts in GPT-2's byte alphabet (`Ġ` is the space).
    fn byte_level(pre: &str) -> Result<Tokenizer> {
        let texts = ["a", "b", "ab", "\u{120}", "\u{120}ab", "<|end|>"];
        let types = [1, 1, 1, 1, 1, 3];
        let mut m = BTreeMap::new();
        m.insert("tokenizer.ggml.model".into(), Value::String("gpt2".into()));
        m.insert("tokenizer.ggml.pre".into(), Value::String(pre.into()));
        let strs =
            |v: &[&str]| Value::Array(v.iter().map(|t| Value::String(t.to_string())).collect());
        m.insert("tokenizer.ggml.tokens".into(), strs(&texts));
        m.insert(
            "tokenizer.ggml.token_type".into(),
            Value::Array(types.iter().map(|&t| Value::I32(t)).collect()),
        );
        m.insert("tokenizer.ggml.merges".into(), strs(&["a b", "\u{120} ab"]));
        Tokenizer::from_gguf_metadata(&m)
    }

    #[test]
    fn byte_level_vocabularies_split_merge_and_render_bytes() {
        let t = byte_level("qwen2").unwrap();
        // " ab" is one pre-token: Ġ a b → Ġ ab → Ġab
        assert_eq!(t.encode("ab ab<|end|>", false, true).unwrap(), [2, 4, 5]);
        assert_eq!(t.token_to_piece(4, false), b" ab");
        assert_eq!(t.token_to_piece(5, false), b"");
        assert_eq!(t.token_to_piece(5, true), b"<|end|>");
        // qwen2 adds no BOS by default; an unknown pre-tokenizer is named
        assert!(!t.vocab.add_bos);
        let e = byte_level("gpt-5x").unwrap_err().to_string();
        assert!(
            e.starts_with(
                "tokenizer.ggml.pre 'gpt-5x' is not supported (supported: default, llama3, "
            ),
            "{e}"
        );
        assert!(byte_level("gpt-4o").is_ok());
    }

    #[test]
    fn packed_pieces_follow_token_types() {
        let t = tok();
        assert_eq!(t.token_to_piece(6, false), b" b");
        assert_eq!(t.token_to_piece(7, false), b"A");
        assert_eq!(t.token_to_piece(8, true), b"");
        assert_eq!(t.token_to_piece(0, false), b"");
        assert_eq!(t.token_to_piece(0, true), b"<unk>");
        assert_eq!(t.token_to_piece(1, true), b"<s>");
        assert_eq!(t.token_to_piece(9, false), b" ");
        assert_eq!(t.token_to_piece(10, true), b"");
        assert_eq!(t.decode(&[4, 6, 7], false), "ab bA");
    }
}
