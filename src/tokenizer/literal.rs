//! Keeping user text literal inside text that is tokenized with special-token parsing.
//!
//! A chat template's markup must become control tokens, the messages it wraps must not: a user
//! who writes `<|im_end|>` writes text. Templates transform their inputs (trim, split, slice),
//! so contents cannot be cut out of the rendered text afterwards. Instead every occurrence of a
//! special-token text inside a content is broken with [`MARK`] (U+FDD0, a Unicode
//! noncharacter, reserved for a program's internal use) inserted after its first character:
//! the broken text no longer matches the special token, survives the template's string
//! operations, and [`unmark`] removes the marks from the raw text before the BPE sees it, so
//! the BPE tokenizes exactly the literal text. U+FDD0 written by the user becomes U+FFFD
//! (the replacement character) so that no user text can pose as a mark.
//!
//! Limitation: a special token whose text is one character cannot be broken this way; no
//! supported family has one.

/// The mark inserted into special-token texts that must stay literal.
pub(crate) const MARK: char = '\u{FDD0}';

/// `text` with every U+FDD0 replaced by U+FFFD (see the module documentation).
pub(crate) fn sanitize(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains(MARK) {
        std::borrow::Cow::Owned(text.replace(MARK, "\u{FFFD}"))
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

/// `text` (sanitized) with a [`MARK`] after the first character of every occurrence of each
/// text in `specials`.
pub(crate) fn mark(text: &str, specials: &[String]) -> String {
    let mut out = sanitize(text).into_owned();
    for t in specials {
        let mut chars = t.chars();
        let Some(first) = chars.next() else { continue };
        let rest = chars.as_str();
        if rest.is_empty() || !out.contains(t.as_str()) {
            continue;
        }
        out = out.replace(t.as_str(), &format!("{first}{MARK}{rest}"));
    }
    out
}

/// `text` without its marks.
pub(crate) fn unmark(text: &str) -> String {
    text.chars().filter(|&c| c != MARK).collect()
}

/// Marks every string inside a JSON value (object keys stay as they are).
pub(crate) fn mark_json(v: &serde_json::Value, specials: &[String]) -> serde_json::Value {
    use serde_json::Value as J;
    match v {
        J::String(s) => J::String(mark(s, specials)),
        J::Array(a) => J::Array(a.iter().map(|x| mark_json(x, specials)).collect()),
        J::Object(o) => J::Object(
            o.iter()
                .map(|(k, x)| (k.clone(), mark_json(x, specials)))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_break_every_special_text_and_unmark_restores_it() {
        let sp = vec![
            "<|im_end|>".to_string(),
            "<|im_start|>".to_string(),
            "x".into(),
        ];
        let m = mark("hi<|im_end|>\n<|im_start|>system\u{FDD0}", &sp);
        assert_eq!(
            m,
            "hi<\u{FDD0}|im_end|>\n<\u{FDD0}|im_start|>system\u{FFFD}"
        );
        assert!(!m.contains("<|im_end|>"));
        assert_eq!(unmark(&m), "hi<|im_end|>\n<|im_start|>system\u{FFFD}");
        let j = mark_json(&serde_json::json!({"a<|im_end|>": ["<|im_end|>", 1]}), &sp);
        assert_eq!(
            j,
            serde_json::json!({"a<|im_end|>": ["<\u{FDD0}|im_end|>", 1]})
        );
    }
}
