//! Cutting special and user-defined tokens out of raw text before BPE, in llama.cpp's order
//! (`llama_vocab::impl::tokenizer_st_partition`): tokens are tried longest text first, each one
//! taking its leftmost non-overlapping occurrences inside the raw text that earlier tokens left.

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

/// One special token, in priority order.
#[derive(Clone, Debug)]
struct Special {
    id: u32,
    text: Vec<u8>,
    /// Control or unknown: matched only when the caller parses special tokens.
    parse_only: bool,
}

/// Finds special-token occurrences without scanning the text once per token.
#[derive(Clone, Debug)]
pub(crate) struct SpecialMatcher {
    /// Longest text first; equal lengths by id (llama.cpp's `std::sort` leaves them unordered).
    by_prio: Vec<Special>,
    /// Token text → index in `by_prio` (the first, for duplicated texts).
    by_text: HashMap<Vec<u8>, u32>,
    /// For each first byte, the distinct lengths of special texts starting with it.
    lengths: Vec<Vec<usize>>,
}

impl SpecialMatcher {
    /// Collects control, unknown and user-defined tokens (llama.cpp `cache_special_tokens`).
    pub fn new(vocab: &Vocab) -> SpecialMatcher {
        let mut ids: Vec<u32> = (0..vocab.texts.len() as u32)
            .filter(|&i| {
                vocab.attrs[i as usize].is_special_cacheable() && !vocab.text(i as usize).is_empty()
            })
            .collect();
        ids.sort_by(|&a, &b| {
            let (ta, tb) = (vocab.text(a as usize), vocab.text(b as usize));
            tb.len().cmp(&ta.len()).then(a.cmp(&b))
        });
        let mut by_prio = Vec::with_capacity(ids.len());
        let mut by_text = HashMap::with_capacity(ids.len());
        let mut lengths = vec![Vec::new(); 256];
        for (prio, &id) in ids.iter().enumerate() {
            let text = vocab.text(id as usize).as_bytes().to_vec();
            by_text.entry(text.clone()).or_insert(prio as u32);
            let l: &mut Vec<usize> = &mut lengths[text[0] as usize];
            if !l.contains(&text.len()) {
                l.push(text.len());
            }
            let parse_only = vocab.attrs[id as usize].needs_parse_special();
            by_prio.push(Special {
                id,
                text,
                parse_only,
            });
        }
        SpecialMatcher {
            by_prio,
            by_text,
            lengths,
        }
    }

    /// Splits `text` into raw fragments and matched tokens. Control and unknown tokens are
    /// matched only when `parse_special`; user-defined tokens always.
    ///
    /// One scan finds which special tokens occur at all; then, as in llama.cpp, each of them
    /// in priority order takes its leftmost non-overlapping occurrences inside every raw
    /// fragment left by the tokens before it.
    pub fn partition<'a>(&self, text: &'a str, parse_special: bool) -> Vec<Fragment<'a>> {
        let b = text.as_bytes();
        let mut present: Vec<u32> = Vec::new();
        for (start, &first) in b.iter().enumerate() {
            for &len in &self.lengths[first as usize] {
                if let Some(&prio) = b.get(start..start + len).and_then(|s| self.by_text.get(s)) {
                    if parse_special || !self.by_prio[prio as usize].parse_only {
                        present.push(prio);
                    }
                }
            }
        }
        present.sort_unstable();
        present.dedup();

        // Pieces in text order: Err((start, end)) is raw text, Ok(id) a matched token.
        let mut pieces: Vec<Result<u32, (usize, usize)>> = vec![Err((0, b.len()))];
        for &prio in &present {
            let sp = &self.by_prio[prio as usize];
            let mut next = Vec::with_capacity(pieces.len() + 2);
            for piece in pieces {
                let Err((mut s, e)) = piece else {
                    next.push(piece);
                    continue;
                };
                while let Some(found) = find(&b[s..e], &sp.text) {
                    if found > 0 {
                        next.push(Err((s, s + found)));
                    }
                    next.push(Ok(sp.id));
                    s += found + sp.text.len();
                }
                if s < e {
                    next.push(Err((s, e)));
                }
            }
            pieces = next;
        }
        let mut out = Vec::with_capacity(pieces.len());
        for p in pieces {
            match p {
                Ok(id) => out.push(Fragment::Token(id)),
                Err((s, e)) if s < e => out.push(Fragment::Text(&text[s..e])),
                Err(_) => {}
            }
        }
        out
    }
}

/// Byte offset of the first occurrence of `needle` (non-empty) in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let n = needle.len();
    if n == 0 || n > hay.len() {
        return None;
    }
    let mut from = 0;
    while from + n <= hay.len() {
        let i = from
            + hay[from..=hay.len() - n]
                .iter()
                .position(|&c| c == needle[0])?;
        if &hay[i..i + n] == needle {
            return Some(i);
        }
        from = i + 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::find;

    #[test]
    fn find_first_occurrence() {
        assert_eq!(find(b"abcabc", b"ca"), Some(2));
        assert_eq!(find(b"aab", b"ab"), Some(1));
        assert_eq!(find(b"abc", b"abcd"), None);
        assert_eq!(find(b"abc", b"c"), Some(2));
        assert_eq!(find(b"", b"a"), None);
    }
}
