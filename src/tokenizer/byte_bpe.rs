//! A GGUF byte-level BPE vocabulary (`tokenizer.ggml.model = "gpt2"`) as a `tokenizers` BPE.
//!
//! Token texts are stored in GPT-2's byte-to-unicode alphabet (every byte one printable
//! character, Radford et al. 2019, `encoder.py` of the GPT-2 release); `tokenizer.ggml.merges`
//! lists the merges as `"left right"` in rank order. Raw text is split by the pre-tokenizer
//! steps that llama.cpp associates with `tokenizer.ggml.pre` (`llm_tokenizer_bpe` in
//! `src/llama-vocab.cpp`; table in `pre_tokenizers.rs`, splitting in `pre_split.rs`), each
//! piece's bytes are mapped to the alphabet, and the BPE merges the lowest-ranked adjacent pair
//! first. Where llama.cpp sets `ignore_merges` (a piece that is itself a token is taken whole),
//! so does the `tokenizers` BPE option of the same name. A few pre-tokenizers (`gemma4`,
//! `sarvam-moe`, `whitespace`) keep pieces as UTF-8 and fall back to `<0xNN>` byte tokens.

use anyhow::{anyhow, bail, Result};
use tokenizers::models::bpe::{Vocab as BpeVocab, BPE};
use tokenizers::Model;

use super::packed::PackedBytes;
use super::pre_split::Splitter;
use super::pre_tokenizers::{self, PreTokenizer};
use super::vocab::{
    parse_byte_token, Vocab, TYPE_BYTE, TYPE_NORMAL, TYPE_UNKNOWN, TYPE_USER_DEFINED,
};

/// GPT-2's byte-to-unicode table: bytes `!`..`~`, `¡`..`¬` and `®`..`ÿ` stand for themselves;
/// the other 68 bytes map, in byte order, to U+0100 onwards.
pub(crate) fn byte_to_char() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for (b, slot) in table.iter_mut().enumerate() {
        let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
        let cp = if printable {
            b as u32
        } else {
            next += 1;
            next - 1
        };
        *slot = char::from_u32(cp).expect("code points below U+0200 are valid");
    }
    table
}

/// A byte-level BPE vocabulary ready to tokenize raw text: llama.cpp's split of
/// `tokenizer.ggml.pre`, then the `tokenizers` BPE on each piece.
pub(crate) struct ByteBpe {
    bpe: BPE,
    splitter: Splitter,
    pre: &'static PreTokenizer,
    /// GPT-2's byte alphabet, by byte.
    alphabet: [char; 256],
}

impl ByteBpe {
    /// The id of a token text (a later duplicate wins, as in llama.cpp).
    pub fn token_to_id(&self, text: &str) -> Option<u32> {
        self.bpe.token_to_id(text)
    }

    /// Tokenizes one raw-text fragment (no special tokens in it) as llama.cpp's
    /// `llm_tokenizer_bpe_session::tokenize`. Errors: the regex engine or the BPE fails.
    pub fn encode(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        let escaped;
        let text = if self.pre.escape_spaces {
            escaped = text.replace(' ', "\u{2581}");
            escaped.as_str()
        } else {
            text
        };
        let mut mapped = String::new();
        for piece in self.splitter.split(text)? {
            let word = if self.pre.byte_encode {
                mapped.clear();
                mapped.extend(piece.bytes().map(|b| self.alphabet[b as usize]));
                mapped.as_str()
            } else {
                piece
            };
            if self.pre.whole_newlines && word.bytes().all(|b| b == b'\n') {
                if let Some(id) = self.bpe.token_to_id(word) {
                    out.push(id);
                    continue;
                }
            }
            let toks = self
                .bpe
                .tokenize(word)
                .map_err(|e| anyhow!("BPE tokenization failed: {e}"))?;
            out.extend(toks.iter().map(|t| t.id));
        }
        Ok(())
    }
}

/// Builds the BPE of a byte-level vocabulary: `merges` are the `tokenizer.ggml.merges`
/// strings, `pre` the `tokenizer.ggml.pre` name (`None` when the key is absent: llama.cpp's
/// `default`).
///
/// Errors: a `pre` llama.cpp does not know, a merge string without a space (both named), or
/// `tokenizers` rejecting the model.
pub(crate) fn build(vocab: &Vocab, merges: &[&str], pre: Option<&str>) -> Result<ByteBpe> {
    let Some(pre_tok) = pre_tokenizers::find(pre) else {
        bail!(
            "tokenizer.ggml.pre '{}' is not supported (supported: {})",
            pre.unwrap_or_default(),
            pre_tokenizers::names().join(", ")
        );
    };
    let n = vocab.texts.len();
    // llama.cpp looks tokens up by text; a later duplicate wins.
    let mut ids = BpeVocab::with_capacity(n);
    for (i, t) in vocab.texts.iter().enumerate() {
        ids.insert(t.to_owned(), i as u32);
    }
    let mut pairs = Vec::with_capacity(merges.len());
    for (i, m) in merges.iter().enumerate() {
        // llama.cpp cuts at the first space after the first byte (a merge may start with one)
        let cut = m
            .char_indices()
            .skip(1)
            .find(|&(_, c)| c == ' ')
            .map(|(p, _)| p)
            .ok_or_else(|| anyhow!("tokenizer.ggml.merges[{i}] = {m:?} has no space"))?;
        let (a, b) = (&m[..cut], &m[cut + 1..]);
        // A merge whose parts or result are not tokens can never yield a token id: llama.cpp
        // falls back to the parts' bytes, which skipping the merge also gives.
        if ids.contains_key(a) && ids.contains_key(b) && ids.contains_key(&format!("{a}{b}")) {
            pairs.push((a.to_owned(), b.to_owned()));
        }
    }
    let bpe = BPE::builder()
        .vocab_and_merges(ids, pairs)
        .ignore_merges(pre_tok.ignore_merges)
        .byte_fallback(!pre_tok.byte_encode)
        .build()
        .map_err(|e| anyhow!("building the BPE model: {e}"))?;
    Ok(ByteBpe {
        bpe,
        splitter: Splitter::new(pre_tok.steps)?,
        pre: pre_tok,
        alphabet: byte_to_char(),
    })
}

/// Every token's bytes as llama.cpp's `token_to_piece(special = true)` gives them for a BPE
/// vocabulary: control, unknown and user-defined tokens as their text; normal tokens mapped
/// back through the byte alphabet (a character outside it becomes
/// `[UNK_BYTE_0x<its UTF-8 in hex><token text>]`, as llama.cpp writes it); byte tokens
/// (`<0xNN>`) one byte; other types nothing.
pub(crate) fn pieces(vocab: &Vocab) -> Result<PackedBytes> {
    let table = byte_to_char();
    let mut back = std::collections::HashMap::with_capacity(256);
    for (b, &c) in table.iter().enumerate() {
        back.insert(c, b as u8);
    }
    let n = vocab.texts.len();
    let mut out = PackedBytes::with_capacity(n, vocab.texts.total_bytes());
    let mut one = Vec::new();
    for id in 0..n {
        one.clear();
        let text = vocab.text(id);
        let a = vocab.attrs[id];
        if a.control || a.ty == TYPE_UNKNOWN || a.ty == TYPE_USER_DEFINED {
            one.extend_from_slice(text.as_bytes());
        } else if a.ty == TYPE_NORMAL {
            for c in text.chars() {
                match back.get(&c) {
                    Some(&b) => one.push(b),
                    None => {
                        let mut u = [0u8; 4];
                        let hex: String = c
                            .encode_utf8(&mut u)
                            .bytes()
                            .map(|b| format!("{b:02x}"))
                            .collect();
                        one.extend_from_slice(format!("[UNK_BYTE_0x{hex}{text}]").as_bytes());
                    }
                }
            }
        } else if a.ty == TYPE_BYTE {
            one.extend(parse_byte_token(text));
        }
        out.push(&one)?;
    }
    out.shrink_to_fit();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_alphabet_is_gpt2s() {
        let t = byte_to_char();
        assert_eq!((t[b'a' as usize], t[b'!' as usize]), ('a', '!'));
        // space is the 33rd non-printable byte (after 0..=31), so U+0100 + 32 = 'Ġ'
        assert_eq!(t[b' ' as usize], '\u{120}');
        assert_eq!(t[b'\n' as usize], '\u{10a}');
        assert_eq!(t[0], '\u{100}');
        assert_eq!(t[0xad], '\u{143}');
        let mut all: Vec<char> = t.to_vec();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 256);
    }
}
