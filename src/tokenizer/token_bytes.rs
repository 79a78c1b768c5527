//! The bytes every token stands for, as constrained decoding needs them
//! ([`ModelTokenizer::token_bytes`]): a grammar matches the bytes of the text, so each id must
//! be known as bytes, not as the text a detokenizer shows (a byte-fallback token is one byte,
//! possibly part of a character).

use anyhow::{bail, Result};

use super::hf::HfTokenizer;
use super::{ModelTokenizer, Tokenizer};

/// One token of the vocabulary as bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenBytes {
    /// The bytes of the token's text (for a special token, its text such as `<end_of_turn>`).
    /// Empty for an id that stands for no text (an unused id, an unknown-type GGUF token).
    pub bytes: Vec<u8>,
    /// A control token (EOS, end of turn, chat markup): never part of generated text.
    pub special: bool,
}

impl ModelTokenizer {
    /// Every token's bytes, by id (`vocab_size()` entries).
    ///
    /// GGUF: llama.cpp's piece of each token (`<0xNN>` tokens are one byte, `▁` is a space);
    /// control and unknown tokens are special. Hugging Face: added tokens as their content
    /// (special when marked so); the model's tokens through the decoder's rule: byte-level
    /// (GPT-2's byte alphabet) or SentencePiece (`▁` for spaces, `<0xNN>` bytes).
    ///
    /// The leading space a SentencePiece decoder strips from the first token of a text is kept
    /// here (the bytes are the token's own).
    ///
    /// Errors: a Hugging Face tokenizer whose decoder is neither kind (named), or a byte-level
    /// token holding a character outside the byte alphabet (named).
    pub fn token_bytes(&self) -> Result<Vec<TokenBytes>> {
        match self {
            ModelTokenizer::Gguf(t) => Ok(gguf(t)),
            ModelTokenizer::Hf(t) => hf(t),
        }
    }

    /// End-of-generation ids (EOS, end of turn…), ascending.
    pub fn eog_ids(&self) -> &[u32] {
        match self {
            ModelTokenizer::Gguf(t) => t.eog_ids(),
            ModelTokenizer::Hf(t) => t.eog_ids(),
        }
    }
}

fn gguf(t: &Tokenizer) -> Vec<TokenBytes> {
    (0..t.vocab_size() as u32)
        .map(|id| {
            let plain = t.token_to_piece(id, false);
            let all = t.token_to_piece(id, true);
            // a token that renders only with `special` is a control (or unknown) token
            let special = plain.is_empty() && !all.is_empty();
            TokenBytes {
                bytes: all.to_vec(),
                special,
            }
        })
        .collect()
}

/// How a Hugging Face decoder turns token strings into bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rule {
    /// GPT-2's byte alphabet: each character is one byte.
    ByteLevel,
    /// SentencePiece: `▁` is a space; `<0xNN>` is a byte when the decoder has byte fallback.
    Metaspace { byte_fallback: bool },
}

fn rule_of(d: &tokenizers::DecoderWrapper) -> Option<Rule> {
    use tokenizers::DecoderWrapper as D;
    match d {
        D::ByteLevel(_) => Some(Rule::ByteLevel),
        D::Metaspace(_) => Some(Rule::Metaspace {
            byte_fallback: false,
        }),
        D::ByteFallback(_) => Some(Rule::Metaspace {
            byte_fallback: true,
        }),
        D::Sequence(s) => {
            let rules: Vec<Rule> = s.get_decoders().iter().filter_map(rule_of).collect();
            if rules.contains(&Rule::ByteLevel) {
                return Some(Rule::ByteLevel);
            }
            let fallback = rules.contains(&Rule::Metaspace {
                byte_fallback: true,
            });
            // a `Replace` of `▁` by a space is the other half of the SentencePiece decoder
            let replace = s.get_decoders().iter().any(|d| {
                matches!(d, D::Replace(_))
                    && serde_json::to_string(d).is_ok_and(|j| j.contains('\u{2581}'))
            });
            (fallback || replace || !rules.is_empty()).then_some(Rule::Metaspace {
                byte_fallback: fallback,
            })
        }
        _ => None,
    }
}

/// GPT-2's byte alphabet inverted: the character standing for each byte. Printable bytes
/// (`!`..`~`, `¡`..`¬`, `®`..`ÿ`) stand for themselves; the others, in byte order, take the
/// characters from U+0100 on.
fn byte_of_char() -> std::collections::HashMap<char, u8> {
    let mut m = std::collections::HashMap::with_capacity(256);
    let mut next = 0x100u32;
    for b in 0..=255u8 {
        let c = b as char;
        let printable = matches!(c, '!'..='~' | '\u{a1}'..='\u{ac}' | '\u{ae}'..='\u{ff}');
        if printable {
            m.insert(c, b);
        } else {
            m.insert(char::from_u32(next).unwrap_or('\0'), b);
            next += 1;
        }
    }
    m
}

/// `<0xNN>` as the byte NN.
fn byte_token(s: &str) -> Option<u8> {
    let hex = s.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok())?
}

fn hf(t: &HfTokenizer) -> Result<Vec<TokenBytes>> {
    let inner = t.inner();
    let rule = match inner.get_decoder() {
        Some(d) => rule_of(d),
        None => None,
    };
    let Some(rule) = rule else {
        let name = inner
            .get_decoder()
            .and_then(|d| serde_json::to_value(d).ok())
            .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(str::to_string))
            .unwrap_or_else(|| "none".to_string());
        bail!(
            "constrained decoding needs each token's bytes, but this tokenizer's decoder \
             ({name}) is neither byte-level nor SentencePiece"
        );
    };
    let n = t.vocab_size();
    let mut out = vec![TokenBytes::default(); n];
    let chars = byte_of_char();
    for (text, id) in inner.get_vocab(false) {
        let Some(slot) = out.get_mut(id as usize) else {
            continue;
        };
        slot.bytes = match rule {
            Rule::ByteLevel => {
                let mut b = Vec::with_capacity(text.len());
                for c in text.chars() {
                    match chars.get(&c) {
                        Some(&x) => b.push(x),
                        None => bail!(
                            "token {id} ({text:?}) holds {c:?}, which is not in the byte-level \
                             alphabet of its decoder"
                        ),
                    }
                }
                b
            }
            Rule::Metaspace { byte_fallback } => match byte_token(&text) {
                Some(x) if byte_fallback => vec![x],
                _ => text.replace('\u{2581}', " ").into_bytes(),
            },
        };
    }
    // added tokens are stored as their text, whatever the decoder
    for (id, a) in inner.get_added_tokens_decoder() {
        if let Some(slot) = out.get_mut(id as usize) {
            *slot = TokenBytes {
                bytes: a.content.into_bytes(),
                special: a.special,
            };
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn the_byte_alphabet_is_a_bijection() {
        let m = byte_of_char();
        assert_eq!(m.len(), 256);
        let mut bytes: Vec<u8> = m.values().copied().collect();
        bytes.sort_unstable();
        bytes.dedup();
        assert_eq!(bytes.len(), 256);
        assert_eq!(m[&'\u{120}'], b' ');
        assert_eq!(m[&'\u{10a}'], b'\n');
        assert_eq!(m[&'a'], b'a');
        assert_eq!(byte_token("<0x0A>"), Some(b'\n'));
        assert_eq!(byte_token("<0xZZ>"), None);
        assert_eq!(byte_token("<0x0AB>"), None);
    }

    /// Every token of the byte-level fixture: its bytes, as text, are what the tokenizer
    /// decodes it to (tokens that are whole characters), and the special ones are marked.
    #[test]
    fn hugging_face_bytes_agree_with_decoding() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/qwen3_moe");
        let t = ModelTokenizer::Hf(Box::new(HfTokenizer::from_folder(&dir).unwrap()));
        let v = t.token_bytes().unwrap();
        assert_eq!(v.len(), 487);
        let mut checked = 0;
        for (id, tb) in v.iter().enumerate() {
            if let Ok(s) = std::str::from_utf8(&tb.bytes) {
                assert_eq!(t.decode(&[id as u32], false), s, "token {id}");
                checked += 1;
            }
        }
        // the others are bytes of multi-byte characters (the byte alphabet's upper half)
        assert_eq!(checked, 351);
        assert_eq!(v.iter().filter(|t| t.bytes.len() == 1).count(), 256);
        let special: Vec<usize> = (0..v.len()).filter(|&i| v[i].special).collect();
        assert!(
            special.contains(&480) && special.contains(&482),
            "{special:?}"
        );
        assert_eq!(v[480].bytes, t.token_text(480).into_bytes());
        assert_eq!(t.eog_ids(), [480, 482]);
    }
}
