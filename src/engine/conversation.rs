//! A conversation over one model (`deltafin serve` and `deltafin chat`): one [`Engine`] owns the
//! session and keeps the KV cache of the last conversation, so a prompt that extends it
//! prefills only its new tokens; [`Engine::generate`] runs one request through the generation
//! loop ([`Session::generate_into`]) with its sampling, stop strings, logprobs and tool-call
//! section, reporting text as it becomes final.

use std::sync::Arc;

use anyhow::Result;

use super::generate::Output;
use super::logprobs::{log_softmax, TokenLogprob};
use super::sampler::{Sampler, SamplerConfig, Steering};
use super::session::{Finish, GenerateOptions, Session};
use super::speculative::{SpecStats, Speculator};
use super::stop::StopMatcher;
use super::tools::{ToolCall, ToolFormat};
use crate::tokenizer::chat::ChatTemplate;
use crate::tokenizer::{ModelStreamDecoder, ModelTokenizer};

/// A loaded model ready to serve: session, tokenizer, chat template, default sampling, and
/// the token ids whose keys and values are in the KV cache.
pub struct Engine {
    /// The model, its weights and KV cache.
    pub session: Session,
    /// The model's tokenizer (shared with the HTTP handlers, which tokenize prompts).
    pub tok: Arc<ModelTokenizer>,
    /// The chat template, when the model has one.
    pub template: Option<Arc<ChatTemplate>>,
    /// Sampling when a request sets nothing: the `run` flags, else the model's
    /// `generation_config.json`, else Deltafin's defaults.
    pub defaults: SamplerConfig,
    /// `max_tokens` of requests that set none (`None`: until the context is full).
    pub default_max_tokens: Option<usize>,
    /// Speculative decoding (`--lookup`, `--draft-model`): every decode step is one
    /// [`Speculator::step_rows`]; `None`: plain decoding.
    pub spec: Option<Speculator>,
    /// Token ids held in the KV cache, in order (`cached.len() == session.cache.len`).
    cached: Vec<u32>,
}

/// What one request asks of the model.
#[derive(Clone, Debug)]
pub struct Params {
    /// Sampling settings (seed included).
    pub sampler: SamplerConfig,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Stop strings: the output ends before the first one.
    pub stop: Vec<String>,
    /// Report each token's log-probability and this many alternatives (`None`: no logprobs).
    pub logprobs: Option<usize>,
    /// Parse tool calls in this syntax (the request has tools).
    pub tools: Option<ToolFormat>,
    /// Logit bias, `ignore_eos` and a grammar, applied by the sampler; a request with a
    /// grammar is decoded plainly (no speculation).
    pub steering: Steering,
}

/// Text that became final, with the logprobs of the tokens generated since the last chunk.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Chunk {
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
}

/// Why a generation ended (OpenAI's `finish_reason`, plus cancellation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// End of turn or a stop string.
    Stop,
    /// `max_tokens`, or the context is full.
    Length,
    /// The output ended in tool calls.
    ToolCalls,
    /// The client went away (or the server is shutting down).
    Cancelled,
}

impl FinishReason {
    /// The `finish_reason` string.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop | FinishReason::Cancelled => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool_calls",
        }
    }
}

/// How a generation ended.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub finish: FinishReason,
    /// Calls parsed from the tool section (empty unless `finish` is `ToolCalls`).
    pub tool_calls: Vec<ToolCall>,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose KV came from the previous request (not recomputed).
    pub cached_tokens: usize,
    /// Seconds from the start to the first sampled token.
    pub ttft_s: f64,
    /// Seconds after the first token.
    pub decode_s: f64,
    /// What speculative decoding did in this generation, when the engine speculates.
    pub speculative: Option<SpecStats>,
}

impl Outcome {
    /// How a generation of `completion_tokens` tokens after a prompt of `prompt_tokens` ended
    /// with `finish` and the parsed `tool_calls` (then [`FinishReason::ToolCalls`], unless
    /// cancelled); no timings, nothing cached.
    pub(crate) fn of(
        finish: &Finish,
        tool_calls: Vec<ToolCall>,
        prompt_tokens: usize,
        completion_tokens: usize,
    ) -> Self {
        let mut finish = match finish {
            Finish::Eos | Finish::Stop(_) => FinishReason::Stop,
            Finish::Length | Finish::ContextFull => FinishReason::Length,
            Finish::Interrupted => FinishReason::Cancelled,
        };
        if !tool_calls.is_empty() && finish != FinishReason::Cancelled {
            finish = FinishReason::ToolCalls;
        }
        Outcome {
            finish,
            tool_calls,
            prompt_tokens,
            completion_tokens,
            cached_tokens: 0,
            ttft_s: 0.0,
            decode_s: 0.0,
            speculative: None,
        }
    }
}

impl Engine {
    /// An engine over `session` with an empty conversation.
    pub fn new(
        session: Session,
        tok: Arc<ModelTokenizer>,
        template: Option<Arc<ChatTemplate>>,
        defaults: SamplerConfig,
    ) -> Self {
        Self {
            session,
            tok,
            template,
            defaults,
            default_max_tokens: None,
            spec: None,
            cached: Vec::new(),
        }
    }

    /// KV cache capacity in tokens.
    pub fn n_ctx(&self) -> usize {
        self.session.cache.n_ctx
    }

    /// Forgets the kept conversation.
    pub fn reset(&mut self) {
        self.cached.clear();
        self.session.cache.clear();
    }

    /// Generates from `prompt`: reuses the cached prefix it shares with the previous request,
    /// prefills the rest, then samples until an end-of-generation token, a stop string,
    /// `max_tokens`, a full context, or `cancelled()` (checked before every token), through
    /// the one generation loop ([`Session::generate_into`]). `emit` receives final text in
    /// order; the tool section (from the format's marker on) is held and returned parsed in
    /// [`Outcome::tool_calls`] (or emitted as text when it does not parse).
    ///
    /// Errors: the prompt is empty or does not fit the context with one more token; a forward
    /// pass failed (the kept conversation is then dropped).
    pub fn generate(
        &mut self,
        prompt: &[u32],
        p: &Params,
        emit: &mut dyn FnMut(Chunk),
        cancelled: &dyn Fn() -> bool,
    ) -> Result<Outcome> {
        if prompt.is_empty() {
            anyhow::bail!("the prompt is empty");
        }
        if prompt.len() + 1 > self.n_ctx() {
            anyhow::bail!(
                "the prompt has {} tokens but the context holds {}",
                prompt.len(),
                self.n_ctx()
            );
        }
        let shared = self
            .cached
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        let keep = shared.min(prompt.len() - 1);
        let keep = self.session.cache.truncate(keep);
        self.cached.truncate(keep);
        if let Some(sp) = self.spec.as_mut() {
            sp.begin(&p.sampler);
        }
        let tok = Arc::clone(&self.tok);
        let mut reply = Reply::new(&tok, p, Box::new(emit));
        let mut sampler = Sampler::steered(p.sampler.clone(), p.steering.clone());
        let is_eog = |t: u32| tok.is_eog(t);
        let opts = GenerateOptions {
            max_tokens: p.max_tokens,
            stop: &p.stop,
            is_eog: &is_eog,
            cancel: Some(cancelled),
        };
        let r = self.session.generate_into(
            prompt,
            keep,
            &mut sampler,
            &opts,
            self.spec.as_mut().filter(|_| p.steering.grammar.is_none()),
            &mut reply,
        );
        let g = match r {
            Ok(g) => g,
            Err(e) => {
                self.reset();
                return Err(e);
            }
        };
        // the cache holds the prompt, then what the steps yielded, as far as it was forwarded
        let held = self.session.cache.len;
        let all = prompt.iter().chain(&g.tokens).chain(&g.unused);
        self.cached = all.copied().take(held).collect();
        debug_assert_eq!(self.cached.len(), held);
        let tool_calls = reply.finish();
        Ok(Outcome {
            cached_tokens: keep,
            ttft_s: g.stats.ttft_s,
            decode_s: g.stats.decode_s,
            speculative: g.stats.speculative,
            ..Outcome::of(&g.finish, tool_calls, prompt.len(), g.tokens.len())
        })
    }
}

/// A reply as the generation loop makes it ([`Output`]): each token's logprobs when asked,
/// its text through the detokenizer, final text as content until the tool section's marker,
/// the section held from there on.
pub(crate) struct Reply<'a> {
    tok: &'a ModelTokenizer,
    dec: ModelStreamDecoder<'a>,
    /// Alternatives per logprob entry (`None`: no logprobs).
    logprobs: Option<usize>,
    /// Entries not yet sent with a chunk.
    lps: Vec<TokenLogprob>,
    tools: Option<ToolFormat>,
    /// Watches content for the tool section's marker.
    marker: Option<StopMatcher>,
    /// The tool section, from its marker on.
    section: Option<String>,
    emit: Box<dyn FnMut(Chunk) + 'a>,
}

impl<'a> Reply<'a> {
    /// The reply to a request asking `p`, its chunks sent to `emit`.
    pub(crate) fn new(
        tok: &'a ModelTokenizer,
        p: &Params,
        emit: Box<dyn FnMut(Chunk) + 'a>,
    ) -> Self {
        Self {
            tok,
            dec: match p.tools {
                Some(_) => tok.decoder_with_special(),
                None => tok.decoder(),
            },
            logprobs: p.logprobs,
            lps: Vec::new(),
            tools: p.tools,
            marker: p.tools.map(|f| StopMatcher::new(&[f.marker().to_string()])),
            section: None,
            emit,
        }
    }

    /// Sends what is still held: content the marker watch kept, the tool section when it does
    /// not parse (as content), the last logprobs. Returns the parsed tool calls.
    pub(crate) fn finish(mut self) -> Vec<ToolCall> {
        if self.section.is_none() {
            if let Some(m) = self.marker.as_mut() {
                let rest = m.finish();
                if !rest.is_empty() {
                    (self.emit)(Chunk {
                        text: rest,
                        logprobs: std::mem::take(&mut self.lps),
                    });
                }
            }
        }
        let mut tool_calls = Vec::new();
        if let (Some(s), Some(f)) = (self.section.take(), self.tools) {
            match f.parse(&s) {
                Some(calls) => tool_calls = calls,
                None => (self.emit)(Chunk {
                    text: s,
                    logprobs: std::mem::take(&mut self.lps),
                }),
            }
        }
        if !self.lps.is_empty() {
            (self.emit)(Chunk {
                text: String::new(),
                logprobs: std::mem::take(&mut self.lps),
            });
        }
        tool_calls
    }
}

impl Output for Reply<'_> {
    fn piece(&mut self, id: u32) -> String {
        self.dec.push(id)
    }

    fn rows(&self) -> bool {
        self.logprobs.is_some()
    }

    fn token(&mut self, id: u32, row: Option<&[f32]>) {
        if let (Some(row), Some(top)) = (row, self.logprobs) {
            let lp = log_softmax(row);
            self.lps.push(TokenLogprob::new(self.tok, &lp, id, top));
        }
    }

    /// Routes final text: content, or the held tool section.
    fn text(&mut self, text: String) {
        let mut content = String::new();
        match (self.section.as_mut(), self.marker.as_mut()) {
            (Some(s), _) => s.push_str(&text),
            (None, Some(m)) => {
                let r = m.push(&text);
                content = r.text;
                if let Some(mk) = r.stop {
                    self.section = Some(mk + &r.after);
                }
            }
            (None, None) => content = text,
        }
        if !content.is_empty() {
            (self.emit)(Chunk {
                text: content,
                logprobs: std::mem::take(&mut self.lps),
            });
        }
    }

    fn flush(&mut self) -> String {
        self.dec.finish()
    }
}
