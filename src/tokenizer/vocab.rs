//! The vocabulary as a GGUF file stores it (`tokenizer.ggml.*` keys), with token attributes
//! derived the way llama.cpp derives them (`src/llama-vocab.cpp`, `llama_vocab::impl::load`).

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Result};

use super::packed::{PackedBytes, PackedStrs};
use crate::source::gguf::Value;

/// Token type codes of `tokenizer.ggml.token_type` (llama.cpp `llama_token_type`).
/// `LLAMA_TOKEN_TYPE_UNDEFINED`; also stands for values outside `i8`, which match no type.
pub(crate) const TYPE_UNDEFINED: i8 = 0;
pub(crate) const TYPE_NORMAL: i8 = 1;
pub(crate) const TYPE_UNKNOWN: i8 = 2;
pub(crate) const TYPE_CONTROL: i8 = 3;
pub(crate) const TYPE_USER_DEFINED: i8 = 4;
pub(crate) const TYPE_BYTE: i8 = 6;

/// Texts that llama.cpp treats as end-of-generation tokens wherever they appear in a
/// vocabulary (`llama_vocab::impl::load`, "maintain a list of tokens that cause
/// end-of-generation"). Such tokens are also forced to the control attribute there.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Attributes of one token after llama.cpp's adjustments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Attr {
    /// Raw `token_type` value from the file ([`TYPE_UNDEFINED`] when outside `i8`: no type
    /// is compared against it then). One byte: there is one `Attr` per token.
    pub ty: i8,
    /// Control attribute (type 3, or forced because the token ends generation).
    pub control: bool,
}

impl Attr {
    /// Split out of raw text before BPE (llama.cpp `cache_special_tokens`).
    pub fn is_special_cacheable(self) -> bool {
        self.control || self.ty == TYPE_UNKNOWN || self.ty == TYPE_USER_DEFINED
    }
    /// Matched only when the caller parses special tokens.
    pub fn needs_parse_special(self) -> bool {
        self.control || self.ty == TYPE_UNKNOWN
    }
}

/// A GGUF vocabulary with the scalar settings that shape tokenization.
#[derive(Clone, Debug)]
pub(crate) struct Vocab {
    /// `tokenizer.ggml.model`, e.g. `llama`.
    pub model: String,
    /// Token texts by id, packed.
    pub texts: PackedStrs,
    /// `tokenizer.ggml.scores` by id; only needed while building the BPE merges.
    pub scores: Vec<f32>,
    pub attrs: Vec<Attr>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_space_prefix: bool,
    /// End-of-generation ids, ascending.
    pub eog: Vec<u32>,
}

fn get<'a>(meta: &'a BTreeMap<String, Value>, key: &str) -> Option<&'a Value> {
    meta.get(key)
}

fn as_u64(v: &Value) -> Option<u64> {
    match *v {
        Value::U8(x) => Some(x.into()),
        Value::U16(x) => Some(x.into()),
        Value::U32(x) => Some(x.into()),
        Value::U64(x) => Some(x),
        Value::I8(x) => u64::try_from(x).ok(),
        Value::I16(x) => u64::try_from(x).ok(),
        Value::I32(x) => u64::try_from(x).ok(),
        Value::I64(x) => u64::try_from(x).ok(),
        _ => None,
    }
}

fn as_i64(v: &Value) -> Option<i64> {
    match *v {
        Value::I8(x) => Some(x.into()),
        Value::I16(x) => Some(x.into()),
        Value::I32(x) => Some(x.into()),
        Value::I64(x) => Some(x),
        _ => as_u64(v).and_then(|x| i64::try_from(x).ok()),
    }
}

fn array<'a>(meta: &'a BTreeMap<String, Value>, key: &str) -> Result<Option<&'a [Value]>> {
    match get(meta, key) {
        None => Ok(None),
        Some(Value::Array(a)) => Ok(Some(a)),
        Some(other) => bail!("GGUF key {key} is not an array: {other:?}"),
    }
}

/// Reads a string value; `None` when absent, an error when of another type.
pub(crate) fn opt_str<'a>(meta: &'a BTreeMap<String, Value>, key: &str) -> Result<Option<&'a str>> {
    match get(meta, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => bail!("GGUF key {key} is not a string: {other:?}"),
    }
}

fn opt_bool(meta: &BTreeMap<String, Value>, key: &str) -> Result<Option<bool>> {
    match get(meta, key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => bail!("GGUF key {key} is not a bool: {other:?}"),
    }
}

/// Token id keys are u32 in the spec; some writers store -1 for "none".
fn opt_id(meta: &BTreeMap<String, Value>, key: &str, n: usize) -> Result<Option<u32>> {
    let Some(v) = get(meta, key) else {
        return Ok(None);
    };
    let x = as_i64(v).ok_or_else(|| anyhow!("GGUF key {key} is not an integer: {v:?}"))?;
    if x < 0 {
        return Ok(None);
    }
    if x as u64 >= n as u64 {
        bail!("GGUF key {key} = {x} is outside the vocabulary of {n} tokens");
    }
    Ok(Some(x as u32))
}

impl Vocab {
    /// Reads `tokenizer.ggml.*` keys. Errors on missing or mistyped arrays and on arrays whose
    /// lengths differ from `tokenizer.ggml.tokens`.
    pub fn from_metadata(meta: &BTreeMap<String, Value>) -> Result<Vocab> {
        let model = opt_str(meta, "tokenizer.ggml.model")?
            .ok_or_else(|| anyhow!("GGUF metadata has no tokenizer.ggml.model"))?
            .to_string();
        let tokens = array(meta, "tokenizer.ggml.tokens")?
            .ok_or_else(|| anyhow!("GGUF metadata has no tokenizer.ggml.tokens"))?;
        let n = tokens.len();
        let total: usize = tokens
            .iter()
            .map(|v| match v {
                Value::String(s) => s.len(),
                _ => 0,
            })
            .sum();
        let mut texts = PackedStrs::with_capacity(n, total);
        for (i, v) in tokens.iter().enumerate() {
            match v {
                Value::String(s) => texts.push(s)?,
                other => bail!("tokenizer.ggml.tokens[{i}] is not a string: {other:?}"),
            }
        }
        let scores = match array(meta, "tokenizer.ggml.scores")? {
            None => vec![0.0; n],
            Some(a) => {
                if a.len() != n {
                    bail!(
                        "tokenizer.ggml.scores has {} entries, tokens has {n}",
                        a.len()
                    );
                }
                a.iter()
                    .enumerate()
                    .map(|(i, v)| match *v {
                        Value::F32(x) => Ok(x),
                        Value::F64(x) => Ok(x as f32),
                        ref other => bail!("tokenizer.ggml.scores[{i}] is not a float: {other:?}"),
                    })
                    .collect::<Result<Vec<_>>>()?
            }
        };
        let types = match array(meta, "tokenizer.ggml.token_type")? {
            None => vec![TYPE_NORMAL; n],
            Some(a) => {
                if a.len() != n {
                    bail!(
                        "tokenizer.ggml.token_type has {} entries, tokens has {n}",
                        a.len()
                    );
                }
                a.iter()
                    .enumerate()
                    .map(|(i, v)| {
                        as_i64(v)
                            .map(|x| i8::try_from(x).unwrap_or(TYPE_UNDEFINED))
                            .ok_or_else(|| {
                                anyhow!("tokenizer.ggml.token_type[{i}] is not an integer: {v:?}")
                            })
                    })
                    .collect::<Result<Vec<_>>>()?
            }
        };
        let mut attrs: Vec<Attr> = types
            .iter()
            .map(|&ty| Attr {
                ty,
                control: ty == TYPE_CONTROL,
            })
            .collect();

        let bos = opt_id(meta, "tokenizer.ggml.bos_token_id", n)?;
        let eos = opt_id(meta, "tokenizer.ggml.eos_token_id", n)?;
        let mut eog: Vec<u32> = Vec::new();
        for key in [
            "tokenizer.ggml.fim_pad_token_id",
            "tokenizer.ggml.fim_rep_token_id",
            "tokenizer.ggml.fim_sep_token_id",
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id",
        ] {
            eog.extend(opt_id(meta, key, n)?);
        }
        for (i, t) in texts.iter().enumerate() {
            if EOG_TEXTS.contains(&t) {
                eog.push(i as u32);
                attrs[i].control = true;
            }
        }
        eog.sort_unstable();
        eog.dedup();

        let default_space_prefix = model == "llama";
        // llama.cpp adds BOS for Gemma 4's pre-tokenizer whatever the file says
        let forced_bos = model == "gpt2"
            && matches!(
                opt_str(meta, "tokenizer.ggml.pre")?,
                Some("gemma4" | "granite-embed-multi-311m")
            );
        Ok(Vocab {
            add_bos: forced_bos
                || opt_bool(meta, "tokenizer.ggml.add_bos_token")?.unwrap_or(
                    model == "llama"
                        || (model == "gpt2"
                            && super::pre_tokenizers::default_add_bos(opt_str(
                                meta,
                                "tokenizer.ggml.pre",
                            )?)),
                ),
            add_eos: opt_bool(meta, "tokenizer.ggml.add_eos_token")?.unwrap_or(false),
            add_space_prefix: opt_bool(meta, "tokenizer.ggml.add_space_prefix")?
                .unwrap_or(default_space_prefix),
            model,
            texts,
            scores,
            attrs,
            bos,
            eos,
            eog,
        })
    }

    /// Text of token `id`; panics when out of range (callers iterate over `0..texts.len()`).
    pub fn text(&self, id: usize) -> &str {
        self.texts.get(id).expect("token id within the vocabulary")
    }

    /// Appends to `out` the bytes that llama.cpp's `token_to_piece` yields for `id` with
    /// `special = true` (SentencePiece vocabularies: `▁` becomes a space, `<0xNN>` tokens one
    /// byte, unused and undefined types nothing).
    pub fn spm_piece_into(&self, id: usize, out: &mut Vec<u8>) {
        let text = self.text(id);
        let a = self.attrs[id];
        if a.control || a.ty == TYPE_UNKNOWN || a.ty == TYPE_USER_DEFINED {
            out.extend_from_slice(text.as_bytes());
            return;
        }
        match a.ty {
            TYPE_NORMAL => {
                for (k, part) in text.split('\u{2581}').enumerate() {
                    if k > 0 {
                        out.push(b' ');
                    }
                    out.extend_from_slice(part.as_bytes());
                }
            }
            TYPE_BYTE => out.extend(parse_byte_token(text)),
            _ => {}
        }
    }

    /// Every token's [`spm_piece_into`](Self::spm_piece_into) bytes, packed. Errors only past
    /// 4 GiB of pieces.
    pub fn spm_pieces(&self) -> Result<PackedBytes> {
        let n = self.texts.len();
        let mut pieces = PackedBytes::with_capacity(n, self.texts.total_bytes());
        let mut one = Vec::new();
        for id in 0..n {
            one.clear();
            self.spm_piece_into(id, &mut one);
            pieces.push(&one)?;
        }
        pieces.shrink_to_fit();
        Ok(pieces)
    }
}

/// `<0xNN>` → NN.
pub(crate) fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}
