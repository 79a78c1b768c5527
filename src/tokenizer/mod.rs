//! Tokenization for GGUF models, matching llama.cpp (`src/llama-vocab.cpp`) id for id.
//!
//! The BPE itself runs in the `tokenizers` crate: a SentencePiece vocabulary (`llama` model in
//! GGUF) becomes a `tokenizers` BPE whose merge ranks follow the scores of the merged tokens,
//! with byte fallback through the `<0xNN>` tokens and `▁` for spaces. What lies around the BPE
//! follows llama.cpp: special and user-defined tokens are cut out of the raw text first (longest
//! text first), and decoding concatenates llama.cpp's token pieces. Chat templates live in
//! [`chat`], streamed detokenization in [`stream`].

pub mod chat;
mod partition;
pub mod stream;
mod vocab;

use std::collections::{BTreeMap, HashMap};

use anyhow::{anyhow, bail, Context, Result};
use rayon::prelude::*;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::Replace;

use crate::source::gguf::{GgufModel, Value};
pub use chat::{ChatTemplate, Message};
pub use stream::StreamDecoder;
use vocab::Vocab;

/// A GGUF model's tokenizer.
pub struct Tokenizer {
    vocab: Vocab,
    /// Tokenizes one raw-text fragment (no special tokens inside) with the model's BPE.
    bpe: tokenizers::Tokenizer,
    /// Bytes of every token as llama.cpp renders it with `special = true`.
    pieces: Vec<Vec<u8>>,
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
    /// Supported: `tokenizer.ggml.model = "llama"` (SentencePiece BPE). Errors: any other model
    /// type (named in the message), missing `tokenizer.ggml.tokens`, arrays of the wrong type or
    /// length, token ids outside the vocabulary.
    pub fn from_gguf_metadata(meta: &BTreeMap<String, Value>) -> Result<Tokenizer> {
        let vocab = Vocab::from_metadata(meta)?;
        match vocab.model.as_str() {
            "llama" => Self::build_spm(vocab),
            other => bail!(
                "unsupported tokenizer model type {other:?} (tokenizer.ggml.model); \
                 only \"llama\" (SentencePiece BPE) is implemented"
            ),
        }
    }

    fn build_spm(vocab: Vocab) -> Result<Tokenizer> {
        let n = vocab.texts.len();
        // llama.cpp looks tokens up by text; a later duplicate wins (`token_to_id[word] = i`).
        let mut ids: HashMap<&str, u32, FastHash> = HashMap::with_capacity_and_hasher(n, FastHash);
        for (i, t) in vocab.texts.iter().enumerate() {
            ids.insert(t.as_str(), i as u32);
        }
        // llama.cpp's SentencePiece BPE merges, among adjacent symbols whose concatenation is
        // a token, the one whose token has the highest score (leftmost on ties). In BPE terms
        // every split of a token into two tokens is a merge, ranked by the merged token's score.
        let (texts, scores) = (&vocab.texts, &vocab.scores);
        let mut merges: Vec<(f32, u32, usize)> = (0..n as u32)
            .into_par_iter()
            .flat_map_iter(|id| {
                let t = texts[id as usize].as_str();
                let ids = &ids;
                let live = ids.get(t) == Some(&id);
                t.char_indices()
                    .skip(1)
                    .filter(move |&(cut, _)| {
                        live && ids.contains_key(&t[..cut]) && ids.contains_key(&t[cut..])
                    })
                    .map(move |(cut, _)| (scores[id as usize], id, cut))
            })
            .collect();
        merges.par_sort_unstable_by(|a, b| {
            b.0.partial_cmp(&a.0)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(a.1.cmp(&b.1))
                .then(a.2.cmp(&b.2))
        });
        let merges: Vec<(String, String)> = merges
            .into_iter()
            .map(|(_, id, cut)| {
                let t = &vocab.texts[id as usize];
                (t[..cut].to_string(), t[cut..].to_string())
            })
            .collect();
        let bpe_vocab: tokenizers::models::bpe::Vocab =
            ids.iter().map(|(t, &i)| (t.to_string(), i)).collect();
        let bpe = BPE::builder()
            .vocab_and_merges(bpe_vocab, merges)
            .byte_fallback(true)
            .build()
            .map_err(|e| anyhow!("building the BPE model: {e}"))?;
        let mut tk = tokenizers::Tokenizer::new(bpe);
        let escape = Replace::new(" ", "\u{2581}").map_err(|e| anyhow!("{e}"))?;
        tk.with_normalizer(Some(escape));

        let pieces = (0..n).into_par_iter().map(|i| vocab.spm_piece(i)).collect();
        let specials = partition::SpecialMatcher::new(&vocab);
        Ok(Tokenizer {
            vocab,
            bpe: tk,
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
        self.vocab.texts.get(id as usize).map(String::as_str)
    }

    /// Looks a token up by its stored text.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        // Rarely used; a linear scan keeps the tokenizer free of a second map.
        self.vocab
            .texts
            .iter()
            .rposition(|t| t == text)
            .map(|i| i as u32)
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
                    let enc = if self.vocab.add_space_prefix && prev_special {
                        self.bpe.encode_fast(format!(" {s}").as_str(), false)
                    } else {
                        self.bpe.encode_fast(s, false)
                    }
                    .map_err(|e| anyhow!("BPE tokenization failed: {e}"))?;
                    out.extend_from_slice(enc.get_ids());
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

    pub(crate) fn vocab(&self) -> &Vocab {
        &self.vocab
    }
}

/// FxHash-style hasher for the build-time text → id map (std's SipHash is needlessly slow for
/// 262k keys of trusted data). Multiply-rotate per 8-byte word, as in rustc's `FxHasher`.
#[derive(Clone, Copy, Default)]
struct FastHash;

#[derive(Default)]
struct FastHasher(u64);

impl std::hash::BuildHasher for FastHash {
    type Hasher = FastHasher;
    fn build_hasher(&self) -> FastHasher {
        FastHasher(0)
    }
}

impl std::hash::Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let w = u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
            self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(K);
        }
        for &b in chunks.remainder() {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(K);
        }
    }
    fn finish(&self) -> u64 {
        self.0
    }
}
