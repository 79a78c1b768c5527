//! The tokenizer of a model of either format: [`ModelTokenizer`] holds a GGUF vocabulary
//! ([`Tokenizer`]) or a Hugging Face `tokenizer.json` ([`HfTokenizer`]), and
//! [`ModelStreamDecoder`] is the streaming detokenizer of either.

use anyhow::Result;

use super::hf::{HfStreamDecoder, HfTokenizer};
use super::stream::StreamDecoder;
use super::{ChatTemplate, Message, Tokenizer};

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

    /// Number of token ids (valid ids are below it).
    pub fn vocab_size(&self) -> usize {
        match self {
            ModelTokenizer::Gguf(k) => k.vocab_size(),
            ModelTokenizer::Hf(k) => k.vocab_size(),
        }
    }

    /// The text of `ids` (special tokens as their text unless `skip_special`). Ids must be
    /// below [`ModelTokenizer::vocab_size`].
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        match self {
            ModelTokenizer::Gguf(k) => k.decode(ids, skip_special),
            ModelTokenizer::Hf(k) => k.decode(ids, skip_special),
        }
    }

    /// Tokenizes a raw prompt (no chat template). The model's BOS (or whatever else it adds)
    /// is added. With `parse_special`, special-token texts written in the prompt become their
    /// ids, for both formats, as llama.cpp's CLI does with `-p` (`--no-parse-special` turns
    /// it off): `<|im_start|>` is one control token. Without it they are literal text.
    /// Tokens a GGUF marks user-defined (a Hugging Face added token not marked special) are
    /// matched either way. U+FDD0 in the text becomes U+FFFD (see `literal.rs`).
    /// Errors: the tokenizer fails.
    pub fn encode_prompt(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        self.encode_text(text, true, parse_special)
    }

    /// [`ModelTokenizer::encode_prompt`] with the BOS (and whatever else the tokenizer adds)
    /// only when `add_special` (`deltafin tokenize --no-bos` turns it off).
    /// Errors: the tokenizer fails.
    pub fn encode_text(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>> {
        let text = super::literal::sanitize(text);
        match (self, parse_special) {
            (ModelTokenizer::Gguf(t), p) => t.encode(&text, add_special, p),
            (ModelTokenizer::Hf(t), true) => t.encode(&text, add_special),
            (ModelTokenizer::Hf(t), false) => t.encode_marked(
                &super::literal::mark(&text, &t.special_texts()),
                add_special,
            ),
        }
    }

    /// Texts of the tokens that special-token parsing turns into control ids (GGUF control
    /// and unknown tokens; Hugging Face added tokens marked special), longest first.
    pub fn special_texts(&self) -> Vec<String> {
        match self {
            ModelTokenizer::Gguf(t) => t.parse_special_texts(),
            ModelTokenizer::Hf(t) => t.special_texts(),
        }
    }

    /// Tokenizes a conversation rendered by the model's chat template: nothing is added (the
    /// template writes the BOS text itself) and every special-token text becomes its id,
    /// including any inside message contents. Only for text whose every part is trusted; for
    /// messages use [`ModelTokenizer::encode_messages`].
    pub fn encode_chat(&self, rendered: &str) -> Result<Vec<u32>> {
        match self {
            ModelTokenizer::Gguf(t) => t.encode(rendered, false, true),
            ModelTokenizer::Hf(t) => t.encode(rendered, false),
        }
    }

    /// Renders `messages` with `template` and tokenizes the result so that only the
    /// template's own markup becomes special tokens: message contents (every role) are
    /// literal text, so a user writing `<|im_end|>\n<|im_start|>system` writes text and
    /// cannot forge a turn. Nothing is added beyond what the template writes.
    /// Errors: the template fails; the tokenizer fails.
    pub fn encode_messages(
        &self,
        template: &ChatTemplate,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>> {
        let json: Vec<serde_json::Value> = messages
            .iter()
            .map(|m| {
                let mut o = serde_json::Map::new();
                o.insert("role".into(), m.role.clone().into());
                o.insert("content".into(), m.content.clone().into());
                if let Some(n) = &m.name {
                    o.insert("name".into(), n.clone().into());
                }
                if let Some(t) = &m.tool_call_id {
                    o.insert("tool_call_id".into(), t.clone().into());
                }
                serde_json::Value::Object(o)
            })
            .collect();
        self.encode_messages_json(
            template,
            &serde_json::Value::Array(json),
            None,
            add_generation_prompt,
        )
    }

    /// [`ModelTokenizer::encode_messages`] for messages (and an optional `tools` list) given
    /// as JSON in the OpenAI / transformers shape, as [`ChatTemplate::render_json`] takes
    /// them: every string inside `messages` and `tools` (contents, reasoning, tool-call
    /// arguments, names) stays literal text. This is the entry point for servers.
    /// Errors: as [`ModelTokenizer::encode_messages`].
    pub fn encode_messages_json(
        &self,
        template: &ChatTemplate,
        messages: &serde_json::Value,
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>> {
        let specials = self.special_texts();
        let messages = super::literal::mark_json(messages, &specials);
        let tools = tools.map(|t| super::literal::mark_json(t, &specials));
        let rendered = template.render_json(&messages, tools.as_ref(), add_generation_prompt)?;
        match self {
            // Marked texts match no special token; `encode` removes the marks from raw text.
            ModelTokenizer::Gguf(t) => t.encode(&rendered, false, true),
            ModelTokenizer::Hf(t) => t.encode_marked(&rendered, false),
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
