//! The model side of the server (and of `deltafin chat`): one [`Engine`] owns the session and
//! keeps the KV cache of the last conversation, so a prompt that extends it prefills only its
//! new tokens; [`Engine::generate`] runs one request with its sampling, stop strings,
//! logprobs and tool-call section, reporting text as it becomes final.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;

use super::stop::StopMatcher;
use super::tools::{ToolCall, ToolFormat};
use crate::engine::{Sampler, SamplerConfig, Session, SpecStats, Speculator};
use crate::models::Logits;
use crate::tokenizer::chat::ChatTemplate;
use crate::tokenizer::ModelTokenizer;

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
}

/// One token's log-probability (natural log, over the model's distribution before sampling
/// filters and temperature) with its text and UTF-8 bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// The token's text (special tokens as their text; part of a character as U+FFFD).
    pub token: String,
    /// Its bytes (what the model's vocabulary holds for it when it is a whole piece).
    pub bytes: Vec<u8>,
    /// log p(token).
    pub logprob: f32,
    /// The most likely tokens at this step, most likely first (ties by id).
    pub top: Vec<(String, Vec<u8>, f32)>,
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

/// Natural-log softmax of `x` (f64 accumulation).
fn log_softmax(x: &[f32]) -> Vec<f32> {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let s: f64 = x.iter().map(|&v| (v as f64 - m).exp()).sum();
    let ls = m + s.ln();
    x.iter().map(|&v| (v as f64 - ls) as f32).collect()
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

    fn entry(&self, lp: &[f32], id: u32, top: usize) -> TokenLogprob {
        let text = |t: u32| {
            let s = self.tok.token_text(t);
            let b = s.as_bytes().to_vec();
            (s, b)
        };
        let mut order: Vec<u32> = Vec::new();
        if top > 0 {
            let mut idx: Vec<u32> = (0..lp.len() as u32).collect();
            let k = top.min(idx.len());
            idx.select_nth_unstable_by(k - 1, |a, b| {
                lp[*b as usize].total_cmp(&lp[*a as usize]).then(a.cmp(b))
            });
            idx.truncate(k);
            idx.sort_by(|a, b| lp[*b as usize].total_cmp(&lp[*a as usize]).then(a.cmp(b)));
            order = idx;
        }
        let (token, bytes) = text(id);
        TokenLogprob {
            token,
            bytes,
            logprob: lp[id as usize],
            top: order
                .into_iter()
                .map(|t| {
                    let (s, b) = text(t);
                    (s, b, lp[t as usize])
                })
                .collect(),
        }
    }

    /// Generates from `prompt`: reuses the cached prefix it shares with the previous request,
    /// prefills the rest, then samples until an end-of-generation token, a stop string,
    /// `max_tokens`, a full context, or `cancelled()` (checked before every decode step).
    /// `emit` receives final text in order; the tool section (from the format's marker on)
    /// is held and returned parsed in [`Outcome::tool_calls`] (or emitted as text when it does
    /// not parse).
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
        let t0 = Instant::now();
        let shared = self
            .cached
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        let keep = shared.min(prompt.len() - 1);
        let keep = self.session.cache.truncate(keep);
        self.cached.truncate(keep);
        let r = self.run(prompt, keep, p, emit, cancelled, t0);
        if r.is_err() {
            self.reset();
        }
        r
    }

    fn run(
        &mut self,
        prompt: &[u32],
        keep: usize,
        p: &Params,
        emit: &mut dyn FnMut(Chunk),
        cancelled: &dyn Fn() -> bool,
        t0: Instant,
    ) -> Result<Outcome> {
        let mut logits = self.session.prefill(&prompt[keep..], Logits::Last)?;
        self.cached.extend_from_slice(&prompt[keep..]);
        let tok = Arc::clone(&self.tok);
        let mut sampler = Sampler::new(p.sampler.clone());
        let mut dec = match p.tools {
            Some(_) => tok.decoder_with_special(),
            None => tok.decoder(),
        };
        let mut stops = StopMatcher::new(&p.stop);
        let marker = p.tools.map(|f| vec![f.marker().to_string()]);
        let mut tool_m = marker.as_deref().map(StopMatcher::new);
        let mut section: Option<String> = None;
        let mut lps: Vec<TokenLogprob> = Vec::new();
        let mut history = prompt.to_vec();
        let mut n = 0usize;
        let mut t_first = None;
        let mut finish = FinishReason::Length;
        let mut stop_hit = false;
        // routes final text: content, or the held tool section
        let mut route = |text: String,
                         lps: &mut Vec<TokenLogprob>,
                         section: &mut Option<String>,
                         emit: &mut dyn FnMut(Chunk)| {
            let mut content = String::new();
            match (section.as_mut(), tool_m.as_mut()) {
                (Some(s), _) => s.push_str(&text),
                (None, Some(m)) => {
                    let r = m.push(&text);
                    content = r.text;
                    if let Some(mk) = r.stop {
                        *section = Some(mk + &r.after);
                    }
                }
                (None, None) => content = text,
            }
            if !content.is_empty() {
                emit(Chunk {
                    text: content,
                    logprobs: std::mem::take(lps),
                });
            }
        };
        let v = self.session.model.vocab_size();
        let want_lp = p.logprobs.is_some();
        if let Some(sp) = self.spec.as_mut() {
            sp.begin(&p.sampler);
        }
        // tokens of the last decode step not yet handled, and their raw logits (with logprobs)
        let mut step: Vec<u32> = Vec::new();
        let mut rows: Vec<f32> = Vec::new();
        let mut at = 0usize;
        while n < p.max_tokens {
            if cancelled() {
                finish = FinishReason::Cancelled;
                break;
            }
            if at == step.len() {
                at = 0;
                step.clear();
                if n == 0 {
                    // the first token, from the prompt's logits
                    rows = if want_lp { logits.clone() } else { Vec::new() };
                    step.push(sampler.sample(&mut logits, &history));
                } else {
                    // one decode step after `history`, whose last token is not yet in the cache
                    let last = *history.last().expect("a generated token");
                    match self.spec.as_mut() {
                        Some(sp) => {
                            let (t, r) = sp.step_rows(
                                &mut self.session,
                                &mut sampler,
                                &history,
                                p.max_tokens - n,
                                want_lp,
                            )?;
                            // the cache now holds `last` and the accepted drafts
                            self.cached.push(last);
                            self.cached.extend_from_slice(&t[..t.len() - 1]);
                            (step, rows) = (t, r);
                        }
                        None => {
                            let mut l = self.session.model.forward(
                                &mut self.session.store,
                                &mut self.session.cache,
                                &[last],
                                Logits::Last,
                            )?;
                            self.cached.push(last);
                            rows = if want_lp { l.clone() } else { Vec::new() };
                            step.push(sampler.sample(&mut l, &history));
                        }
                    }
                    debug_assert_eq!(self.cached.len(), self.session.cache.len);
                }
            }
            let lp = want_lp.then(|| log_softmax(&rows[at * v..(at + 1) * v]));
            let id = step[at];
            at += 1;
            t_first.get_or_insert_with(Instant::now);
            n += 1;
            history.push(id);
            if tok.is_eog(id) {
                finish = FinishReason::Stop;
                break;
            }
            if let (Some(lp), Some(top)) = (&lp, p.logprobs) {
                lps.push(self.entry(lp, id, top));
            }
            let r = stops.push(&dec.push(id));
            route(r.text, &mut lps, &mut section, &mut *emit);
            if r.stop.is_some() {
                finish = FinishReason::Stop;
                stop_hit = true;
                break;
            }
            if n >= p.max_tokens
                || (at == step.len() && self.session.cache.len >= self.session.cache.n_ctx)
            {
                break;
            }
        }
        if !stop_hit {
            let r = stops.push(&dec.finish());
            route(r.text, &mut lps, &mut section, &mut *emit);
            if r.stop.is_none() {
                route(stops.finish(), &mut lps, &mut section, &mut *emit);
            }
        }
        if section.is_none() {
            if let Some(m) = tool_m.as_mut() {
                let rest = m.finish();
                if !rest.is_empty() {
                    emit(Chunk {
                        text: rest,
                        logprobs: std::mem::take(&mut lps),
                    });
                }
            }
        }
        let mut tool_calls = Vec::new();
        if let (Some(s), Some(f)) = (section, p.tools) {
            match f.parse(&s) {
                Some(calls) => {
                    tool_calls = calls;
                    if finish != FinishReason::Cancelled {
                        finish = FinishReason::ToolCalls;
                    }
                }
                None => emit(Chunk {
                    text: s,
                    logprobs: std::mem::take(&mut lps),
                }),
            }
        }
        if !lps.is_empty() {
            emit(Chunk {
                text: String::new(),
                logprobs: lps,
            });
        }
        let t_end = Instant::now();
        let t_first = t_first.unwrap_or(t_end);
        Ok(Outcome {
            finish,
            tool_calls,
            prompt_tokens: prompt.len(),
            completion_tokens: n,
            cached_tokens: keep,
            ttft_s: (t_first - t0).as_secs_f64(),
            decode_s: (t_end - t_first).as_secs_f64(),
            speculative: self.spec.as_ref().map(|sp| SpecStats {
                // what the last step yielded past the stop or the cancellation
                discarded: (step.len() - at) as u64,
                ..sp.stats.clone()
            }),
        })
    }
}
