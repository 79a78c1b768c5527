//! Cutting special and user-defined tokens out of raw text before BPE, in llama.cpp's order
//! (`llama_vocab::impl::tokenizer_st_partition`): tokens are tried longest text first, each one
//! taking every non-overlapping occurrence (leftmost first) that lies wholly in text not yet
//! taken.

use std::collections::HashMap;

use super::vocab::Vocab;

/// One piece of partitioned input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fragment<'a> {
    /// Raw text for the BPE (never empty).
    Text(&'a str),
    /// A special or user-defined token matched in the text.
    Token(u32),
}

/// Finds special-token occurrences without scanning the text once per token.
#[derive(Clone, Debug)]
pub(crate) struct SpecialMatcher {
    /// Token text bytes → (id, priority). Lower priority is tried first.
    by_text: HashMap<Vec<u8>, (u32, u32, bool)>,
    /// For each first byte, the distinct lengths of special texts starting with it.
    lengths: Vec<Vec<usize>>,
}

impl SpecialMatcher {
    pub fn new(vocab: &Vocab) -> SpecialMatcher {
        let mut ids: Vec<u32> = (0..vocab.texts.len() as u32)
            .filter(|&i| {
                vocab.attrs[i as usize].is_special_cacheable()
                    && !vocab.texts[i as usize].is_empty()
            })
            .collect();
        // Longest first; equal lengths by id (llama.cpp's sort leaves their order unspecified).
        ids.sort_by(|&a, &b| {
            let (ta, tb) = (&vocab.texts[a as usize], &vocab.texts[b as usize]);
            tb.len().cmp(&ta.len()).then(a.cmp(&b))
        });
        let mut by_text = HashMap::with_capacity(ids.len());
        let mut lengths = vec![Vec::new(); 256];
        for (prio, &id) in ids.iter().enumerate() {
            let t = vocab.texts[id as usize].as_bytes();
            let parse_only = vocab.attrs[id as usize].needs_parse_special();
            // A duplicate text keeps its first (highest-priority) entry.
            by_text
                .entry(t.to_vec())
                .or_insert((id, prio as u32, parse_only));
            let l: &mut Vec<usize> = &mut lengths[t[0] as usize];
            if !l.contains(&t.len()) {
                l.push(t.len());
            }
        }
        SpecialMatcher { by_text, lengths }
    }

    /// Splits `text` into raw fragments and matched tokens. Control and unknown tokens are
    /// matched only when `parse_special`; user-defined tokens always.
    pub fn partition<'a>(&self, text: &'a str, parse_special: bool) -> Vec<Fragment<'a>> {
        let b = text.as_bytes();
        // Every occurrence: (priority, start, end, id).
        let mut occ: Vec<(u32, usize, usize, u32)> = Vec::new();
        for (start, &first) in b.iter().enumerate() {
            for &len in &self.lengths[first as usize] {
                let Some(slice) = b.get(start..start + len) else {
                    continue;
                };
                if let Some(&(id, prio, parse_only)) = self.by_text.get(slice) {
                    if parse_special || !parse_only {
                        occ.push((prio, start, start + len, id));
                    }
                }
            }
        }
        occ.sort_unstable();
        let mut taken = vec![false; b.len()];
        let mut chosen: Vec<(usize, usize, u32)> = Vec::new();
        let mut i = 0;
        while i < occ.len() {
            let prio = occ[i].0;
            let mut last_end = 0;
            while i < occ.len() && occ[i].0 == prio {
                let (_, s, e, id) = occ[i];
                if s >= last_end && !taken[s..e].iter().any(|&t| t) {
                    taken[s..e].iter_mut().for_each(|t| *t = true);
                    chosen.push((s, e, id));
                    last_end = e;
                }
                i += 1;
            }
        }
        chosen.sort_unstable();
        let mut out = Vec::with_capacity(2 * chosen.len() + 1);
        let mut pos = 0;
        for (s, e, id) in chosen {
            if s > pos {
                out.push(Fragment::Text(&text[pos..s]));
            }
            out.push(Fragment::Token(id));
            pos = e;
        }
        if pos < text.len() {
            out.push(Fragment::Text(&text[pos..]));
        }
        out
    }
}
