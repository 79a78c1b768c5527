//! A GGUF byte-level BPE vocabulary (`tokenizer.ggml.model = "gpt2"`) as a `tokenizers` BPE.
//!
//! Token texts are stored in GPT-2's byte-to-unicode alphabet (every byte one printable
//! character, Radford et al. 2019, `encoder.py` of the GPT-2 release); `tokenizer.ggml.merges`
//! lists the merges as `"left right"` in rank order. Raw text is split by the pre-tokenizer
//! regex that llama.cpp associates with `tokenizer.ggml.pre` (`llm_tokenizer_bpe` in
//! `src/llama-vocab.cpp`), each piece's bytes are mapped to the alphabet, and the BPE merges the
//! lowest-ranked adjacent pair first. For the Llama 3 pre-tokenizer llama.cpp sets
//! `ignore_merges` (a piece that is itself a token is taken whole), as does the `tokenizers`
//! BPE option of the same name.

use anyhow::{anyhow, bail, Result};
use tokenizers::models::bpe::{Vocab as BpeVocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{PreTokenizerWrapper, SplitDelimiterBehavior};

use super::packed::PackedBytes;
use super::pre_tokenizers::PRE_TOKENIZERS;
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

/// Builds the BPE tokenizer of a byte-level vocabulary: `merges` are the
/// `tokenizer.ggml.merges` strings, `pre` the `tokenizer.ggml.pre` name.
///
/// Errors: a `pre` without an implemented pre-tokenizer, a merge string without a space
/// (both named), or `tokenizers` rejecting the model.
pub(crate) fn build(vocab: &Vocab, merges: &[&str], pre: &str) -> Result<tokenizers::Tokenizer> {
    let Some(&(_, pattern, ignore_merges)) = PRE_TOKENIZERS.iter().find(|p| p.0.contains(&pre))
    else {
        let known: Vec<&str> = PRE_TOKENIZERS
            .iter()
            .flat_map(|p| p.0.iter().copied())
            .collect();
        bail!(
            "tokenizer.ggml.pre '{pre}' is not supported (supported: {})",
            known.join(", ")
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
        .ignore_merges(ignore_merges)
        .build()
        .map_err(|e| anyhow!("building the BPE model: {e}"))?;
    let split = Split::new(
        SplitPattern::Regex(pattern.to_string()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| anyhow!("pre-tokenizer regex: {e}"))?;
    let mut tk = tokenizers::Tokenizer::new(bpe);
    tk.with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(Sequence::new(vec![
        PreTokenizerWrapper::Split(split),
        PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false)),
    ]))));
    Ok(tk)
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
