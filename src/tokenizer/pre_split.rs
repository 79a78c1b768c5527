//! Splitting raw text into pieces before the BPE, as llama.cpp does (`unicode_regex_split` in
//! `src/unicode.cpp`): each step splits every piece the steps before it left, a regex step
//! turning each match and each stretch of text between matches into a piece.
//!
//! llama.cpp runs most regexes with `std::regex` over a copy of the text in which every
//! non-ASCII character stands for its Unicode category (letter, number, punctuation, mark,
//! symbol; U+000B for spaces). Read that way `\p{Lu}`, `\p{Ll}`, `\p{Lt}`, `\p{Lm}` and `\p{Lo}`
//! all mean "any letter", and `\d` means ASCII digits. [`compile`] rewrites a regex so that
//! `fancy-regex`, which reads the text itself, matches the same pieces. Two splits are llama.cpp
//! code rather than regexes: `kimi-k2` ([`split_kimi_k2`]) and the digit grouping of `afmoe`
//! and `tiny_aya` ([`split_digit_groups`]).

use std::sync::OnceLock;

use anyhow::{anyhow, Result};
use fancy_regex::Regex;

use super::pre_tokenizers::Step;

/// A pre-tokenizer's steps, ready to run.
#[derive(Debug)]
pub(crate) struct Splitter {
    steps: Vec<Compiled>,
}

#[derive(Debug)]
enum Compiled {
    Regex(Regex),
    KimiK2,
    DigitGroups,
}

/// Compiles a llama.cpp split regex for `fancy-regex` (see the module documentation).
/// Errors: the regex does not compile (the message names it).
pub(crate) fn compile(pattern: &str) -> Result<Regex> {
    let mut p = pattern.to_string();
    for sub in ["Lu", "Ll", "Lt", "Lm", "Lo"] {
        p = p.replace(&format!(r"\p{{{sub}}}"), r"\p{L}");
    }
    let p = p.replace(r"\d", "[0-9]");
    Regex::new(&p).map_err(|e| anyhow!("pre-tokenizer regex {pattern:?}: {e}"))
}

impl Splitter {
    /// Compiles `steps`. Errors: a regex that does not compile.
    pub fn new(steps: &[Step]) -> Result<Splitter> {
        let steps = steps
            .iter()
            .map(|s| {
                Ok(match s {
                    Step::Regex(r) => Compiled::Regex(compile(r)?),
                    Step::KimiK2 => Compiled::KimiK2,
                    Step::DigitGroups => Compiled::DigitGroups,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Splitter { steps })
    }

    /// Splits `text` into non-empty pieces that concatenate back to it. Errors: the regex
    /// engine gives up (its backtrack limit).
    pub fn split<'a>(&self, text: &'a str) -> Result<Vec<&'a str>> {
        let mut pieces: Vec<&'a str> = if text.is_empty() { vec![] } else { vec![text] };
        for step in &self.steps {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            for piece in pieces {
                match step {
                    Compiled::Regex(re) => split_regex(re, piece, &mut next)?,
                    Compiled::KimiK2 => split_kimi_k2(piece, &mut next),
                    Compiled::DigitGroups => split_digit_groups(piece, &mut next),
                }
            }
            pieces = next;
        }
        Ok(pieces)
    }
}

/// Each match of `re` in `piece`, and each stretch between matches, as a piece (empty
/// matches only cut).
fn split_regex<'a>(re: &Regex, piece: &'a str, out: &mut Vec<&'a str>) -> Result<()> {
    let mut last = 0;
    for m in re.find_iter(piece) {
        let m = m.map_err(|e| anyhow!("pre-tokenizer regex failed: {e}"))?;
        if m.start() > last {
            out.push(&piece[last..m.start()]);
        }
        if m.end() > m.start() {
            out.push(m.as_str());
        }
        last = m.end();
    }
    if last < piece.len() {
        out.push(&piece[last..]);
    }
    Ok(())
}

/// Character classes as llama.cpp's tables give them (`unicode_cpt_flags`).
struct Classes {
    letter: regex::Regex,
    number: regex::Regex,
    unassigned: regex::Regex,
}

fn classes() -> &'static Classes {
    static C: OnceLock<Classes> = OnceLock::new();
    C.get_or_init(|| Classes {
        letter: regex::Regex::new(r"^\p{L}$").expect("static regex"),
        number: regex::Regex::new(r"^\p{N}$").expect("static regex"),
        unassigned: regex::Regex::new(r"^\p{Cn}$").expect("static regex"),
    })
}

/// One character's flags: letter, number, whitespace, or none of them but assigned.
#[derive(Clone, Copy, Default)]
struct Flags {
    letter: bool,
    number: bool,
    space: bool,
    /// Any category at all (unassigned code points have none).
    any: bool,
}

fn flags(c: Option<char>) -> Flags {
    let Some(c) = c else {
        return Flags::default();
    };
    if c.is_ascii() {
        return Flags {
            letter: c.is_ascii_alphabetic(),
            number: c.is_ascii_digit(),
            space: matches!(c, '\t' | '\n' | '\x0B' | '\x0C' | '\r' | ' '),
            any: true,
        };
    }
    let k = classes();
    let mut buf = [0u8; 4];
    let s: &str = c.encode_utf8(&mut buf);
    Flags {
        letter: k.letter.is_match(s),
        number: k.number.is_match(s),
        space: c.is_whitespace(),
        any: !k.unassigned.is_match(s),
    }
}

/// The Han ranges llama.cpp's `kimi-k2` splitter uses (`unicode_cpt_is_han`): CJK unified
/// ideographs with extensions A-F and the compatibility ideographs.
fn is_han(c: Option<char>) -> bool {
    let Some(c) = c else { return false };
    matches!(c as u32,
        0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0x20000..=0x2A6DF | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F | 0x2B820..=0x2CEAF | 0x2CEB0..=0x2EBEF | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}

/// llama.cpp's `kimi-k2` split, its hand-written reading of Kimi's pattern
/// (`[\p{Han}]+ | letter words with an optional leading non-letter and contraction | \p{N}{1,3}
/// | ` ?[^\s\p{L}\p{N}]+[\r\n]*` | `\s*[\r\n]+` | `\s+(?!\S)` | `\s+``). Where it reads the
/// pattern differently llama.cpp is followed: letter runs stop at marks (`\p{M}`), a
/// contraction may follow any letter run, and a character matching nothing is a piece alone.
pub(crate) fn split_kimi_k2<'a>(piece: &'a str, out: &mut Vec<&'a str>) {
    let starts: Vec<usize> = piece.char_indices().map(|(i, _)| i).collect();
    let chars: Vec<char> = piece.chars().collect();
    let n = chars.len();
    let at = |i: usize| chars.get(i).copied();
    let byte = |i: usize| if i >= n { piece.len() } else { starts[i] };
    let letter_not_han = |i: usize| flags(at(i)).letter && !is_han(at(i));
    let cut = |from: usize, to: usize, out: &mut Vec<&'a str>| {
        if to > from {
            out.push(&piece[byte(from)..byte(to)]);
        }
    };
    let mut prev = 0; // start of the piece being built
    let mut pos = 0;
    while pos < n {
        let c = chars[pos];
        let f = flags(Some(c));
        if is_han(Some(c)) {
            while is_han(at(pos)) {
                pos += 1;
            }
            cut(prev, pos, out);
            prev = pos;
            continue;
        }
        let lead_ok = !(c == '\r' || c == '\n' || f.letter || f.number);
        if (f.letter && !is_han(Some(c))) || (lead_ok && letter_not_han(pos + 1)) {
            let mut p = pos + usize::from(lead_ok);
            while letter_not_han(p) {
                p += 1;
            }
            // p > pos + lead: at least one letter (the condition above guarantees it)
            if at(p) == Some('\'') && p + 1 < n {
                let l1 = at(p + 1).map(|c| c.to_lowercase().next().unwrap_or(c));
                let l2 = at(p + 2).map(|c| c.to_lowercase().next().unwrap_or(c));
                if matches!(l1, Some('s' | 't' | 'm' | 'd')) {
                    p += 2;
                } else if p + 2 < n
                    && matches!(
                        (l1, l2),
                        (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l'))
                    )
                {
                    p += 3;
                }
            }
            pos = p;
            cut(prev, pos, out);
            prev = pos;
            continue;
        }
        if f.number {
            let mut run = 0;
            while flags(at(pos)).number {
                pos += 1;
                run += 1;
                if run == 3 {
                    cut(prev, pos, out);
                    prev = pos;
                    run = 0;
                }
            }
            cut(prev, pos, out);
            prev = pos;
            continue;
        }
        let f2 = if c == ' ' { flags(at(pos + 1)) } else { f };
        let punct = |f: Flags| f.any && !(f.space || f.letter || f.number);
        if punct(f2) {
            if c == ' ' {
                pos += 1;
            }
            while punct(flags(at(pos))) {
                pos += 1;
            }
            while matches!(at(pos), Some('\r' | '\n')) {
                pos += 1;
            }
            cut(prev, pos, out);
            prev = pos;
            continue;
        }
        let mut spaces = 0;
        let mut last_newline_end = None;
        while flags(at(pos + spaces)).space {
            if matches!(at(pos + spaces), Some('\r' | '\n')) {
                last_newline_end = Some(pos + spaces + 1);
            }
            spaces += 1;
        }
        if let Some(e) = last_newline_end {
            pos = e;
        } else if spaces > 1 && pos + spaces < n {
            pos += spaces - 1;
        } else if spaces > 0 {
            pos += spaces;
        } else {
            pos += 1;
        }
        cut(prev, pos, out);
        prev = pos;
    }
}

/// llama.cpp's digit grouping (`afmoe`, `tiny_aya`): a run of `k` digits becomes a group of
/// `k % 3` digits (when not zero) and groups of three; the text before a run is emitted with
/// the run's first group, the text after the last run as one piece.
pub(crate) fn split_digit_groups<'a>(piece: &'a str, out: &mut Vec<&'a str>) {
    let chars: Vec<(usize, char)> = piece.char_indices().collect();
    let byte = |i: usize| chars.get(i).map_or(piece.len(), |c| c.0);
    let mut prev = 0;
    let mut pos = 0;
    while pos < chars.len() {
        if !flags(Some(chars[pos].1)).number {
            pos += 1;
            continue;
        }
        let start = pos;
        while pos < chars.len() && flags(Some(chars[pos].1)).number {
            pos += 1;
        }
        let mut cut_at = start + (pos - start) % 3;
        if cut_at == start {
            cut_at += 3;
        }
        while cut_at <= pos {
            out.push(&piece[byte(prev)..byte(cut_at)]);
            prev = cut_at;
            cut_at += 3;
        }
    }
    if prev < chars.len() {
        out.push(&piece[byte(prev)..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::pre_tokenizers::find;

    fn split(pre: &str, text: &str) -> Vec<String> {
        let s = Splitter::new(find(Some(pre)).unwrap().steps).unwrap();
        s.split(text)
            .unwrap()
            .into_iter()
            .map(String::from)
            .collect()
    }

    #[test]
    fn steps_split_each_others_pieces() {
        assert_eq!(
            split("gpt-2", "Hello  world's 12"),
            ["Hello", " ", " world", "'s", " 12"]
        );
        assert_eq!(split("superbpe", "x1234567"), ["x", "1", "234", "567"]);
        assert_eq!(split("afmoe", "ab1234 5"), ["ab", "1", "234", " ", "5"]);
        assert_eq!(
            split("kimi-k2", "I'm 中文abc 12345\n\n  x"),
            ["I'm", " ", "中文", "abc", " ", "123", "45", "\n\n", " ", " x"]
        );
    }
}
