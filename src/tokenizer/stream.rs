//! Incremental detokenization: token ids in, completed text out, never splitting a UTF-8
//! character. Byte-fallback tokens (`<0xNN>`) may carry a fraction of a character; those bytes
//! wait until the character is complete.

use super::Tokenizer;

/// Turns a stream of ids into text, piece by piece, with the rules of
/// [`Tokenizer::decode`] (llama.cpp `llama_detokenize`): the concatenation of everything
/// returned by [`push`](Self::push) and [`finish`](Self::finish) equals `decode(all ids)`
/// (except that a trailing EOS under `add_eos_token` is only dropped by `decode`).
///
/// Leading space (SentencePiece `add_space_prefix` models): the first piece loses one leading
/// space, unless the first id is a BOS that `skip_special` removes, as in llama.cpp.
#[derive(Debug)]
pub struct StreamDecoder<'t> {
    tok: &'t Tokenizer,
    skip_special: bool,
    /// Ids seen so far.
    n_seen: usize,
    /// Bytes not yet returned: an incomplete UTF-8 sequence at the end of the output.
    pending: Vec<u8>,
}

impl<'t> StreamDecoder<'t> {
    /// A decoder for one generation. `skip_special` as in [`Tokenizer::decode`].
    pub fn new(tok: &'t Tokenizer, skip_special: bool) -> StreamDecoder<'t> {
        StreamDecoder {
            tok,
            skip_special,
            n_seen: 0,
            pending: Vec::new(),
        }
    }

    /// Adds one id; returns the text it completes (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        let v = self.tok.vocab();
        let first = self.n_seen == 0;
        self.n_seen += 1;
        if first && self.skip_special && v.add_bos && Some(id) == v.bos {
            return String::new();
        }
        let mut piece = self.tok.token_to_piece(id, !self.skip_special);
        if first && v.add_space_prefix {
            piece = piece.strip_prefix(b" ").unwrap_or(piece);
        }
        self.pending.extend_from_slice(piece);
        self.drain(false)
    }

    /// Returns whatever is still held back (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        self.drain(true)
    }

    /// Emits the longest prefix of `pending` that no later byte can change.
    fn drain(&mut self, all: bool) -> String {
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    // SAFETY-free: the prefix was just validated.
                    out.push_str(std::str::from_utf8(&rest[..good]).unwrap_or_default());
                    match e.error_len() {
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            rest = &rest[good + bad..];
                        }
                        None if all => {
                            out.push('\u{FFFD}');
                            rest = &[];
                            break;
                        }
                        None => {
                            rest = &rest[good..];
                            break;
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        out
    }
}
