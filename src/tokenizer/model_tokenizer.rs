//! The tokenizer of a model of either format: [`ModelTokenizer`] holds a GGUF vocabulary
//! ([`Tokenizer`]) or a Hugging Face `tokenizer.json` ([`HfTokenizer`]), and
//! [`ModelStreamDecoder`] is the streaming detokenizer of either.

use anyhow::Result;

use super::hf::{HfStreamDecoder, HfTokenizer};
use super::stream::StreamDecoder;
use super::Tokenizer;

/// The tokenizer of either kind of model.
pub enum ModelTokenizer {
    /// A GGUF model's vocabulary (`tokenizer.ggml.*` metadata).
    Gguf(Box<Tokenizer>),
    /// A Hugging Face folder's `tokenizer.json`.
    Hf(Box<HfTokenizer>),
}

/// The streaming detokenizer of either kind ([`ModelTokenizer::decoder`]).
pub enum ModelStreamDecoder<'t> {
    /// Over a GGUF vocabulary ([`StreamDecoder`]).
    Gguf(StreamDecoder<'t>),
    /// Over a Hugging Face tokenizer ([`HfStreamDecoder`]).
    Hf(HfStreamDecoder<'t>),
}

impl ModelTokenizer {
    /// Whether `t` ends generation (EOS, end of turn…).
    pub fn is_eog(&self, t: u32) -> bool {
        match self {
            ModelTokenizer::Gguf(k) => k.is_eog(t),
            ModelTokenizer::Hf(k) => k.is_eog(t),
        }
    }

    /// A streaming detokenizer for one generation, skipping special tokens.
    pub fn decoder(&self) -> ModelStreamDecoder<'_> {
        match self {
            ModelTokenizer::Gguf(k) => ModelStreamDecoder::Gguf(StreamDecoder::new(k, true)),
            ModelTokenizer::Hf(k) => ModelStreamDecoder::Hf(HfStreamDecoder::new(k, true)),
        }
    }

    /// A streaming detokenizer that keeps special tokens as their text (tool-call markers
    /// such as `<tool_call>` are special tokens in some vocabularies).
    pub fn decoder_with_special(&self) -> ModelStreamDecoder<'_> {
        match self {
            ModelTokenizer::Gguf(k) => ModelStreamDecoder::Gguf(StreamDecoder::new(k, false)),
            ModelTokenizer::Hf(k) => ModelStreamDecoder::Hf(HfStreamDecoder::new(k, false)),
        }
    }

    /// The text of one token, special tokens included (a byte token that is part of a
    /// character shows as U+FFFD).
    pub fn token_text(&self, t: u32) -> String {
        match self {
            ModelTokenizer::Gguf(k) => k.decode(&[t], false),
            ModelTokenizer::Hf(k) => k.decode(&[t], false),
        }
    }

    /// Tokenizes plain prompt text: the model's BOS (or other special tokens it adds) is
    /// added, and special-token texts inside a GGUF prompt stay text.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>> {
        match self {
            ModelTokenizer::Gguf(t) => t.encode(text, true, false),
            ModelTokenizer::Hf(t) => t.encode(text, true),
        }
    }

    /// Tokenizes a conversation rendered by the model's chat template: nothing is added (the
    /// template writes the BOS text itself) and special-token texts become their ids.
    pub fn encode_chat(&self, rendered: &str) -> Result<Vec<u32>> {
        match self {
            ModelTokenizer::Gguf(t) => t.encode(rendered, false, true),
            ModelTokenizer::Hf(t) => t.encode(rendered, false),
        }
    }
}

impl ModelStreamDecoder<'_> {
    /// Adds one id; returns the text it completes (possibly empty).
    pub fn push(&mut self, t: u32) -> String {
        match self {
            ModelStreamDecoder::Gguf(d) => d.push(t),
            ModelStreamDecoder::Hf(d) => d.push(t),
        }
    }

    /// Returns whatever is still held back.
    pub fn finish(&mut self) -> String {
        match self {
            ModelStreamDecoder::Gguf(d) => d.finish(),
            ModelStreamDecoder::Hf(d) => d.finish(),
        }
    }
}
