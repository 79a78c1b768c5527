//! A SentencePiece vocabulary as a `tokenizers` BPE.
//!
//! llama.cpp's SentencePiece BPE (`llm_tokenizer_spm_session` in `src/llama-vocab.cpp`)
//! merges, among adjacent symbols whose concatenation is a token, the one whose token has the
//! highest score (leftmost on ties). In BPE terms every split of a token into two tokens is a
//! merge, ranked by the merged token's score; spaces become `▁` (a normalizer) and characters
//! outside the vocabulary fall back to the `<0xNN>` byte tokens.
//!
//! Memory: `tokenizers` keeps the vocabulary twice (text → id and id → text, one heap string
//! per entry) and a pair → merge map; for Gemma 3 (262,144 tokens, 514,847 merges) that is about
//! 66 MB, and its builder takes the merges as a `Vec<(String, String)>` (~58 MB while it runs).
//! Everything else here is kept small and freed before the next large structure is built.

use std::cmp::Ordering;

use anyhow::{anyhow, Result};
use rayon::prelude::*;
use tokenizers::models::bpe::{Vocab as BpeVocab, BPE};
use tokenizers::normalizers::Replace;

use super::vocab::Vocab;

/// Builds the BPE tokenizer of a SentencePiece (`llama`) vocabulary. `scores` are
/// `tokenizer.ggml.scores` by id (consumed: freed as soon as the merges are ranked).
///
/// Errors when `tokenizers` rejects the model (it should not: every merge is built from
/// vocabulary texts).
pub(crate) fn build(vocab: &Vocab, scores: Vec<f32>) -> Result<tokenizers::Tokenizer> {
    let n = vocab.texts.len();
    // llama.cpp looks tokens up by text; a later duplicate wins (`token_to_id[word] = i`).
    // This map becomes the BPE's own vocabulary, so it is built once and also serves the
    // lookups below.
    let mut ids = BpeVocab::with_capacity(n);
    for (i, t) in vocab.texts.iter().enumerate() {
        ids.insert(t.to_owned(), i as u32);
    }

    // Every split of a token into two tokens, as (token id, byte offset of the cut): 8 bytes
    // per merge until the ranking is known.
    let mut splits: Vec<(u32, u32)> = (0..n as u32)
        .into_par_iter()
        .flat_map_iter(|id| {
            let t = vocab.text(id as usize);
            let ids = &ids;
            let live = ids.get(t) == Some(&id);
            t.char_indices()
                .skip(1)
                .filter(move |&(cut, _)| {
                    live && ids.contains_key(&t[..cut]) && ids.contains_key(&t[cut..])
                })
                // Cuts fit in u32: all texts together are under 4 GiB (packed offsets).
                .map(move |(cut, _)| (id, cut as u32))
        })
        .collect();
    // Rank: higher score of the merged token first; then lower id, then earlier cut.
    splits.par_sort_unstable_by(|a, b| {
        let (sa, sb) = (scores[a.0 as usize], scores[b.0 as usize]);
        sb.partial_cmp(&sa)
            .unwrap_or(Ordering::Equal)
            .then(a.cmp(b))
    });
    drop(scores);

    let mut merges = Vec::with_capacity(splits.len());
    for &(id, cut) in &splits {
        let (a, b) = vocab.text(id as usize).split_at(cut as usize);
        merges.push((a.to_owned(), b.to_owned()));
    }
    drop(splits);

    // No cache: without a pre-tokenizer every raw fragment is one "word", so the cache would
    // only hold whole prompts (up to 10,000 of them) and rarely hit.
    let bpe = BPE::builder()
        .vocab_and_merges(ids, merges)
        .byte_fallback(true)
        .cache_capacity(0)
        .build()
        .map_err(|e| anyhow!("building the BPE model: {e}"))?;
    let mut tk = tokenizers::Tokenizer::new(bpe);
    let escape = Replace::new(" ", "\u{2581}").map_err(|e| anyhow!("{e}"))?;
    tk.with_normalizer(Some(escape));
    Ok(tk)
}
