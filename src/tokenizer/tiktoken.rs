//! Kimi's tiktoken tokenizer (Kimi K2, K3, Kimi Linear): a Hugging Face folder with
//! `tiktoken.model` and `tokenizer_config.json` instead of `tokenizer.json`, read as the
//! `tokenizers` pipeline that gives tiktoken's ids.
//!
//! Format (Moonshot's `tokenization_kimi.py` over OpenAI's `tiktoken`): `tiktoken.model` has
//! one `BASE64(token bytes) RANK` line per token, the rank being the token id. Text is split by
//! Kimi's pattern ([`KIMI_PATTERN`]); a piece that is a token is taken whole, otherwise its
//! bytes are merged pair by pair, always the adjacent pair whose concatenation has the lowest
//! rank. That is a byte-level BPE whose merge for each multi-byte token is the last step of
//! merging its own bytes under the ranks below its own (the reading transformers'
//! `TikTokenConverter` and llama.cpp's converter use), with `ignore_merges`. The 256 ids after
//! the ranks are special tokens: those named in `tokenizer_config.json`'s
//! `added_tokens_decoder`, the others `<|reserved_token_ID|>`. Not reproduced: Moonshot's
//! cutting of inputs into chunks of at most 400,000 characters and of runs of more than
//! 25,000 spaces or non-spaces before encoding (it only matters for such runs).

use std::collections::HashMap;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use base64::Engine as _;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab as BpeVocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

use super::byte_bpe::byte_to_char;
use crate::source::hf::read_json;

/// Kimi's split pattern (`pat_str` of `tokenization_kimi.py`): Han runs, letter words with
/// Han excluded and an optional contraction, up to three digits, punctuation runs, newlines,
/// spaces. `&&` is a class intersection (as `fancy-regex`, the engine of tiktoken itself,
/// reads it).
pub const KIMI_PATTERN: &str = r"[\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Special-token ids reserved after the ranks (`num_reserved_special_tokens`).
const RESERVED_SPECIAL: u32 = 256;

/// Reads `dir/tiktoken.model` (ranks) and `dir/tokenizer_config.json` (special tokens).
///
/// Errors (naming the file and line): a line that is not `BASE64 RANK`, bad base64, a
/// repeated token or rank, ranks that are not `0..n`; a missing or invalid
/// `tokenizer_config.json`; an `added_tokens_decoder` id outside the reserved range.
pub(crate) fn from_folder(dir: &Path) -> Result<tokenizers::Tokenizer> {
    let path = dir.join("tiktoken.model");
    crate::source::check_regular(&path)?;
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("{}: cannot read", path.display()))?;
    let ranks = parse_ranks(&text).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    let cfg_path = dir.join("tokenizer_config.json");
    crate::source::check_regular(&cfg_path)?;
    let cfg = read_json(&cfg_path)?;
    build(&ranks, &cfg).map_err(|e| anyhow!("{}: {e}", dir.display()))
}

/// Token bytes by rank (= id).
fn parse_ranks(text: &str) -> Result<Vec<Vec<u8>>> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut by_rank: Vec<Option<Vec<u8>>> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let mut parts = line.split_whitespace();
        let (Some(tok), Some(rank), None) = (parts.next(), parts.next(), parts.next()) else {
            bail!("line {}: expected `BASE64 RANK`", i + 1);
        };
        let bytes = b64
            .decode(tok)
            .map_err(|e| anyhow!("line {}: bad base64: {e}", i + 1))?;
        let rank: usize = rank
            .parse()
            .map_err(|_| anyhow!("line {}: rank {rank:?} is not a number", i + 1))?;
        if rank >= 1 << 24 {
            bail!("line {}: rank {rank} is too large", i + 1);
        }
        if !seen.insert(bytes.clone()) {
            bail!("line {}: token listed twice", i + 1);
        }
        if by_rank.len() <= rank {
            by_rank.resize(rank + 1, None);
        }
        if by_rank[rank].replace(bytes).is_some() {
            bail!("line {}: rank {rank} listed twice", i + 1);
        }
    }
    by_rank
        .into_iter()
        .enumerate()
        .map(|(r, t)| t.ok_or_else(|| anyhow!("no token has rank {r} (ranks must be 0..n)")))
        .collect()
}

/// The last merge tiktoken makes when it encodes `token` with only the ranks below
/// `max_rank`: `Some((left, right))` when merging ends in exactly two parts.
fn last_merge<'a>(
    token: &'a [u8],
    max_rank: u32,
    rank_of: &HashMap<&[u8], u32>,
) -> Option<(&'a [u8], &'a [u8])> {
    // part boundaries (start offsets), merged pairwise by lowest rank
    let mut starts: Vec<usize> = (0..token.len()).collect();
    let end = |starts: &Vec<usize>, i: usize| starts.get(i + 1).copied().unwrap_or(token.len());
    loop {
        let mut best: Option<(u32, usize)> = None;
        for i in 0..starts.len().saturating_sub(1) {
            let pair = &token[starts[i]..end(&starts, i + 1)];
            if let Some(&r) = rank_of.get(pair) {
                if r < max_rank && best.is_none_or(|(br, _)| r < br) {
                    best = Some((r, i));
                }
            }
        }
        let Some((_, i)) = best else { break };
        starts.remove(i + 1);
    }
    (starts.len() == 2).then(|| (&token[..starts[1]], &token[starts[1]..]))
}

/// Builds the tokenizer from ranks and `tokenizer_config.json`.
fn build(ranks: &[Vec<u8>], cfg: &serde_json::Value) -> Result<tokenizers::Tokenizer> {
    let alphabet = byte_to_char();
    let enc = |b: &[u8]| -> String { b.iter().map(|&x| alphabet[x as usize]).collect() };
    let rank_of: HashMap<&[u8], u32> = ranks
        .iter()
        .enumerate()
        .map(|(r, t)| (t.as_slice(), r as u32))
        .collect();
    let mut vocab = BpeVocab::with_capacity(ranks.len());
    for (r, t) in ranks.iter().enumerate() {
        vocab.insert(enc(t), r as u32);
    }
    let mut merges = Vec::new();
    for (r, t) in ranks.iter().enumerate() {
        if t.len() < 2 {
            continue;
        }
        if let Some((a, b)) = last_merge(t, r as u32, &rank_of) {
            merges.push((enc(a), enc(b)));
        }
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(true)
        .build()
        .map_err(|e| anyhow!("building the BPE model: {e}"))?;
    let split = Split::new(
        SplitPattern::Regex(KIMI_PATTERN.to_string()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| anyhow!("Kimi split pattern: {e}"))?;
    let mut tk = tokenizers::Tokenizer::new(bpe);
    tk.with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(Sequence::new(vec![
        PreTokenizerWrapper::Split(split),
        PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false)),
    ]))));
    tk.with_decoder(Some(ByteLevelDecoder::default()));

    let n = ranks.len() as u32;
    let mut named: HashMap<u32, (String, bool)> = HashMap::new();
    if let Some(dec) = cfg.get("added_tokens_decoder").and_then(|d| d.as_object()) {
        for (k, v) in dec {
            let id: u32 = k
                .parse()
                .map_err(|_| anyhow!("added_tokens_decoder key {k:?} is not an id"))?;
            if !(n..n + RESERVED_SPECIAL).contains(&id) {
                bail!(
                    "added_tokens_decoder id {id} is outside the special range {n}..{}",
                    n + RESERVED_SPECIAL
                );
            }
            let content = v
                .get("content")
                .and_then(|c| c.as_str())
                .ok_or_else(|| anyhow!("added_tokens_decoder[{id}] has no content"))?;
            let special = v.get("special").and_then(|s| s.as_bool()).unwrap_or(true);
            named.insert(id, (content.to_string(), special));
        }
    }
    for id in n..n + RESERVED_SPECIAL {
        let (content, special) = named
            .remove(&id)
            .unwrap_or_else(|| (format!("<|reserved_token_{id}|>"), true));
        let tok = AddedToken::from(content.clone(), special).normalized(false);
        if special {
            tk.add_special_tokens(&[tok]);
        } else {
            tk.add_tokens(&[tok]);
        }
        if tk.token_to_id(&content) != Some(id) {
            bail!("special token {content:?} does not get id {id}");
        }
    }
    Ok(tk)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_follow_ranks() {
        let ranks: Vec<Vec<u8>> = vec![
            b"a".to_vec(),
            b"b".to_vec(),
            b"ab".to_vec(),
            b"abb".to_vec(),
        ];
        let rank_of: HashMap<&[u8], u32> = ranks
            .iter()
            .enumerate()
            .map(|(r, t)| (t.as_slice(), r as u32))
            .collect();
        assert_eq!(last_merge(b"ab", 2, &rank_of), Some((&b"a"[..], &b"b"[..])));
        assert_eq!(
            last_merge(b"abb", 3, &rank_of),
            Some((&b"ab"[..], &b"b"[..]))
        );
        assert!(parse_ranks("YQ== 0\nYg== 2\n")
            .unwrap_err()
            .to_string()
            .contains("rank 1"));
        assert!(parse_ranks("YQ== 0\nYQ== 1\n")
            .unwrap_err()
            .to_string()
            .contains("twice"));
    }
}
