//! What a request asks of the logits besides sampling ([`Steering`]): a bias per token
//! (OpenAI's `logit_bias`), end-of-generation tokens banned (`ignore_eos`), and constrained
//! output: a JSON schema, any JSON object, or a Lark grammar, matched by the `llguidance`
//! crate ([`Guide`] compiles, [`Grammar`] is one request's matcher). The sampler applies the
//! steering ([`super::sampler::Sampler::steered`]); the generation loop does not know about it.
//!
//! A grammar sees the bytes of the tokens ([`crate::tokenizer::TokenBytes`]); at each step it
//! allows the tokens that keep the text a prefix of its language, and the end-of-generation
//! tokens once the text is complete. A finished grammar allows nothing else, so the
//! generation ends there with an end-of-generation token (`finish_reason` `stop`).

use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};

use crate::tokenizer::ModelTokenizer;

/// Whitespace allowed between two JSON tokens when a schema does not set its own
/// (`x-guidance`): at most 20 characters, so a model cannot fill its output with blanks
/// (llama.cpp's JSON grammars bound it the same way).
pub const JSON_WHITESPACE: &str = r"[\x20\x0A\x0D\x09]{1,20}";

/// What output a request constrains to.
#[derive(Clone, Debug, PartialEq)]
pub enum GrammarSpec {
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// Text valid under a JSON schema (`json_schema`).
    JsonSchema(serde_json::Value),
    /// llguidance's Lark dialect (llama-server's `grammar`: Lark as given, or GBNF as `serve::gbnf` translates it).
    Lark(String),
}

/// The token environment and grammar compiler of one model's vocabulary, built once (it
/// indexes every token's bytes) and shared by the requests.
pub struct Guide {
    factory: ParserFactory,
    eog: Vec<u32>,
}

/// The vocabulary as llguidance reads it: a trie of the tokens' bytes; text is tokenized by
/// the trie's greedy rule, which is not the model's own tokenization, so llguidance never
/// forces tokens of its choosing (the model picks among the allowed ones).
struct Env {
    trie: TokTrie,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

impl Guide {
    /// The guide of `tok`'s vocabulary: every token's bytes, special tokens marked, the
    /// end-of-generation ids as the grammar's end.
    ///
    /// Errors: the tokenizer's bytes cannot be known ([`ModelTokenizer::token_bytes`]); the
    /// model has no end-of-generation token; llguidance refuses the vocabulary.
    pub fn new(tok: &ModelTokenizer) -> Result<Guide> {
        let words: Vec<Vec<u8>> = tok
            .token_bytes()?
            .into_iter()
            .map(|t| {
                if t.special && !t.bytes.is_empty() {
                    let mut b = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    b.extend_from_slice(&t.bytes);
                    b
                } else {
                    t.bytes
                }
            })
            .collect();
        let n = words.len();
        let eog: Vec<u32> = tok
            .eog_ids()
            .iter()
            .copied()
            .filter(|&e| (e as usize) < n)
            .collect();
        let Some(&first) = eog.first() else {
            bail!("the model has no end-of-generation token, which constrained output needs");
        };
        let info = TokRxInfo::new(n as u32, first);
        let trie = std::panic::catch_unwind(|| TokTrie::from(&info, &words).with_eos_tokens(&eog))
            .map_err(|_| anyhow!("llguidance could not index the vocabulary"))?;
        let env: TokEnv = Arc::new(Env { trie });
        let mut factory = ParserFactory::new_simple(&env)?;
        factory.quiet();
        Ok(Guide { factory, eog })
    }

    /// The end-of-generation ids the grammars end with, ascending.
    pub fn eog(&self) -> &[u32] {
        &self.eog
    }

    /// Compiles `spec` into a matcher at the start of its text.
    ///
    /// Errors: llguidance's message for a schema or grammar it cannot compile (an unknown
    /// rule, a syntax error, an unsupported schema keyword).
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Grammar> {
        // llguidance walks a grammar's rules recursively: a chain of a few hundred rules (or
        // of a schema's `$ref`s) overflowed a 2 MiB thread's stack and aborted the process,
        // so the compilation runs on a thread of its own with room for the longest chain the
        // size bounds let through (the stack is reserved, and only what is used is touched)
        std::thread::scope(|sc| {
            std::thread::Builder::new()
                .name("grammar".into())
                .stack_size(GRAMMAR_STACK)
                .spawn_scoped(sc, || self.compile_here(spec))
                .map_err(|e| anyhow::anyhow!("cannot start the grammar's thread: {e}"))?
                .join()
                .map_err(|_| anyhow::anyhow!("the grammar's compilation panicked"))?
        })
    }

    fn compile_here(&self, spec: &GrammarSpec) -> Result<Grammar> {
        let with_whitespace = |mut schema: serde_json::Value| {
            if let Some(o) = schema.as_object_mut() {
                if !o.contains_key("x-guidance") {
                    o.insert(
                        "x-guidance".into(),
                        serde_json::json!({ "whitespace_pattern": JSON_WHITESPACE }),
                    );
                }
            }
            schema
        };
        let g = match spec {
            GrammarSpec::JsonObject => {
                TopLevelGrammar::from_json_schema(with_whitespace(serde_json::json!({
                    "type": "object"
                })))
            }
            GrammarSpec::JsonSchema(s) => {
                TopLevelGrammar::from_json_schema(with_whitespace(s.clone()))
            }
            GrammarSpec::Lark(s) => TopLevelGrammar::from_lark(s.clone()),
        };
        let parser = self.factory.create_parser(g)?;
        let m = Matcher::new(Ok(parser));
        if let Some(e) = m.get_error() {
            bail!("{e}");
        }
        // a grammar that allows no text at all (`root ::= []`) would end every request at
        // once with an empty "stop": refused here instead
        let mut probe = m.deep_clone();
        let none = probe.compute_mask().map_or(true, |v| v.is_zero());
        if none && !probe.is_accepting().unwrap_or(false) {
            bail!("the grammar allows no text: no token can start it and it does not accept the empty text");
        }
        Ok(Grammar { matcher: m })
    }
}

/// Stack of the thread a grammar is compiled on ([`Guide::compile`]), bytes: 256 MiB.
pub const GRAMMAR_STACK: usize = 256 << 20;

/// One request's grammar, at the start of its text (cloned into the request's sampler, where
/// it advances token by token).
#[derive(Clone)]
pub struct Grammar {
    matcher: Matcher,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar")
            .field("stopped", &self.matcher.is_stopped())
            .finish_non_exhaustive()
    }
}

/// What a request does to the logits before the sampler's penalties and filters.
#[derive(Clone, Debug, Default)]
pub struct Steering {
    /// Added to the logits of these ids (OpenAI's `logit_bias`); `f32::NEG_INFINITY` bans.
    pub bias: Vec<(u32, f32)>,
    /// Ban the end-of-generation ids [`Steering::eog`] (`ignore_eos`): generation ends at
    /// `max_tokens`, a stop string or a full context, or where a grammar is complete.
    pub ignore_eos: bool,
    /// The model's end-of-generation ids (what `ignore_eos` bans and what ends a generation
    /// whose grammar is complete).
    pub eog: Vec<u32>,
    /// The grammar the output must follow.
    pub grammar: Option<Grammar>,
}

impl Steering {
    /// Whether the steering changes nothing.
    pub fn is_none(&self) -> bool {
        self.bias.is_empty() && !self.ignore_eos && self.grammar.is_none()
    }

    /// Adds the bias and bans the end-of-generation ids under `ignore_eos`: what does not
    /// depend on the text so far, so speculative verification applies it too.
    pub fn bias(&self, logits: &mut [f32]) {
        for &(id, b) in &self.bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += b;
            }
        }
        if self.ignore_eos {
            for &e in &self.eog {
                if let Some(l) = logits.get_mut(e as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }

    /// Sets the logits of the tokens the grammar does not allow next to −∞. When no allowed
    /// token is left with a finite logit (the grammar is complete under `ignore_eos`, or the
    /// bias banned all it allows), the end-of-generation ids get logit 0: the generation
    /// ends. No grammar: nothing changes.
    pub fn mask(&mut self, logits: &mut [f32]) {
        let Some(g) = self.grammar.as_mut() else {
            return;
        };
        match g.matcher.compute_mask_or_eos() {
            Ok(allowed) => {
                let mut any = false;
                for (i, l) in logits.iter_mut().enumerate() {
                    if i >= allowed.len() || !allowed.is_allowed(i as u32) {
                        *l = f32::NEG_INFINITY;
                    } else if l.is_finite() {
                        any = true;
                    }
                }
                if !any {
                    self.end(logits);
                }
            }
            Err(e) => {
                tracing::warn!("constrained output stopped: {e}");
                logits.fill(f32::NEG_INFINITY);
                self.end(logits);
            }
        }
    }

    fn end(&self, logits: &mut [f32]) {
        for &e in &self.eog {
            if let Some(l) = logits.get_mut(e as usize) {
                *l = 0.0;
            }
        }
    }

    /// Advances the grammar over the chosen token `id`. A token the grammar refuses (only
    /// an end-of-generation token forced by [`Steering::mask`]) leaves it in error; the
    /// generation ends there.
    pub fn commit(&mut self, id: u32) {
        if let Some(g) = self.grammar.as_mut() {
            if !g.matcher.is_stopped() {
                if let Err(e) = g.matcher.consume_token(id) {
                    if !self.eog.contains(&id) {
                        tracing::warn!("constrained output: token {id} refused: {e}");
                    }
                }
            }
        }
    }

    /// Whether the grammar has reached an end (complete, or failed): nothing but an
    /// end-of-generation token can follow.
    pub fn finished(&self) -> bool {
        self.grammar
            .as_ref()
            .is_some_and(|g| g.matcher.is_stopped())
    }
}
