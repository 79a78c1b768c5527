//! Stop strings over streamed text: text is released only when no stop string can still start
//! inside it, so a stop string split across tokens (or across the bytes of one character) is
//! never emitted, not even partly.

/// Finds the first of several stop strings in text that arrives piece by piece.
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

/// What one [`StopMatcher::push`] gives back.
#[derive(Debug, PartialEq, Eq)]
pub struct Released {
    /// Text that is final: it holds no stop string and cannot start one.
    pub text: String,
    /// The stop string found, if any; the text ends right before it.
    pub stop: Option<String>,
    /// With a stop string, the text that followed it (empty otherwise).
    pub after: String,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            pending: String::new(),
        }
    }

    /// Adds `piece` (whole characters); returns the text now final, and the stop string when
    /// one is complete (later text is then irrelevant).
    pub fn push(&mut self, piece: &str) -> Released {
        self.pending.push_str(piece);
        if let Some((pos, s)) = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()).map(|p| (p, s)))
            .min_by_key(|x| x.0)
        {
            let text = self.pending[..pos].to_string();
            let after = self.pending[pos + s.len()..].to_string();
            let stop = Some(s.clone());
            self.pending.clear();
            return Released { text, stop, after };
        }
        // hold back the longest suffix that is a proper prefix of a stop string
        let keep = self
            .pending
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let tail = &self.pending[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.pending.len());
        let text = self.pending[..keep].to_string();
        self.pending.drain(..keep);
        Released {
            text,
            stop: None,
            after: String::new(),
        }
    }

    /// The held-back text, at the end of generation (no stop string followed).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_only_what_could_start_a_stop() {
        let mut m = StopMatcher::new(&["END".into(), "é!".into()]);
        assert_eq!(m.push("abE").text, "ab");
        assert_eq!(m.push("x").text, "Ex");
        assert_eq!(m.push("é").text, "");
        let r = m.push("!tail");
        assert_eq!(
            r,
            Released {
                text: String::new(),
                stop: Some("é!".into()),
                after: "tail".into(),
            }
        );
        let mut m = StopMatcher::new(&["EN".into()]);
        assert_eq!(m.push("aE").text, "a");
        assert_eq!(m.finish(), "E");
        // the earliest stop wins
        let mut m = StopMatcher::new(&["cd".into(), "b".into()]);
        assert_eq!(m.push("abcd").stop.as_deref(), Some("b"));
    }
}
