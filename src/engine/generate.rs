//! The generation loop, the one `run`, `bench`, `chat` and `serve` go through
//! ([`Session::generate_into`]): prefill of the prompt's tokens not yet in the KV cache, then one
//! plain or speculative decode step at a time; end-of-generation tokens, stop strings
//! ([`StopMatcher`]), `max_tokens`, a full context and cancellation; the statistics. What the
//! tokens become is the caller's [`Output`]: text on standard output ([`Session::generate_with`],
//! for `run` and `bench`), or a conversation's reply with logprobs and tool calls
//! ([`super::conversation::Engine`], for `chat` and `serve`).
//! Apart from `session.rs` so that the session does not import speculative decoding, which
//! imports the session.

use std::time::Instant;

use anyhow::Result;

use super::sampler::Sampler;
use super::session::{peak_rss_bytes, Finish, GenStats, GenerateOptions, Session};
use super::spec_types::check_rollback;
use super::speculative::Speculator;
use super::stop::StopMatcher;
use crate::backend::cpu::pool::PoolStats;
use crate::models::Logits;
use crate::store::telemetry::{ExpertRunStats, Snapshot, TokenIo};

/// Where the generation loop hands what it generates. Per token handed out (an
/// end-of-generation token is not): [`Output::token`], then [`Output::piece`] for its text,
/// then [`Output::text`] with what became final.
pub trait Output {
    /// The text token `id` completes (a streaming detokenizer's step; possibly empty).
    fn piece(&mut self, id: u32) -> String;

    /// Whether [`Output::token`] gets each token's logits row. False by default.
    fn rows(&self) -> bool {
        false
    }

    /// A token handed out, before its text, with the target model's logits for it as the
    /// model produced them (before penalties and filters; vocabulary-size floats) when
    /// [`Output::rows`] asks. Nothing by default.
    fn token(&mut self, _id: u32, _row: Option<&[f32]>) {}

    /// Text that became final, in order: it holds no stop string and cannot start one (the
    /// text of a stop string and what follows it never arrive). May be empty.
    fn text(&mut self, text: String);

    /// The text the detokenizer still holds when generation ends without a stop string (it
    /// goes through stop matching too). Empty by default.
    fn flush(&mut self) -> String {
        String::new()
    }
}

/// What one pass of the generation loop produced.
#[derive(Clone, Debug)]
pub struct Generated {
    /// The tokens handed out, an ending end-of-generation token included.
    pub tokens: Vec<u32>,
    /// Tokens the last step yielded past the end (accepted drafts after a stop, `max_tokens`
    /// or a cancellation): not handed out, but possibly in the KV cache.
    pub unused: Vec<u32>,
    /// Why generation ended.
    pub finish: Finish,
    /// The measurements.
    pub stats: GenStats,
}

/// What the generation loop keeps of one sequence while handing out its tokens, the same for
/// a sequence alone ([`Session::generate_into`]) and for each sequence of a batch
/// ([`super::slots::Slots`]): the tokens handed out, the history they extend (prompt, then
/// tokens), the stop-string watch over their text, and why the sequence ended.
pub(crate) struct Handout {
    /// The tokens handed out, an ending end-of-generation token included.
    pub tokens: Vec<u32>,
    /// The prompt, then `tokens` (what penalties look back over).
    pub history: Vec<u32>,
    stops: StopMatcher,
    max_tokens: usize,
    finish: Option<Finish>,
}

impl Handout {
    /// Nothing handed out yet after `prompt`; stops at a string of `stop` or after
    /// `max_tokens` tokens.
    pub fn new(prompt: &[u32], stop: &[String], max_tokens: usize) -> Self {
        Self {
            tokens: Vec::new(),
            history: prompt.to_vec(),
            stops: StopMatcher::new(stop),
            max_tokens,
            finish: None,
        }
    }

    /// Hands out token `id` (with its logits `row` when the output asks): it joins the tokens
    /// and history; an end-of-generation token (`is_eog`) ends the sequence there, unseen by
    /// `out`; else `out` gets the token and its text, and a stop string or the `max_tokens`-th
    /// token ends the sequence. Returns whether the sequence goes on.
    pub fn push(
        &mut self,
        id: u32,
        row: Option<&[f32]>,
        is_eog: &dyn Fn(u32) -> bool,
        out: &mut dyn Output,
    ) -> bool {
        self.tokens.push(id);
        self.history.push(id);
        if is_eog(id) {
            self.finish = Some(Finish::Eos);
            return false;
        }
        out.token(id, row);
        let r = self.stops.push(&out.piece(id));
        out.text(r.text);
        if let Some(s) = r.stop {
            self.finish = Some(Finish::Stop(s));
            return false;
        }
        if self.tokens.len() >= self.max_tokens {
            self.finish = Some(Finish::Length);
            return false;
        }
        true
    }

    /// Whether `max_tokens` tokens were handed out.
    pub fn done(&self) -> bool {
        self.tokens.len() >= self.max_tokens
    }

    /// Ends the sequence: why it ended (what [`Handout::push`] saw, else `ended`, else
    /// `max_tokens`), after sending `out` the text still held when no stop string ended it.
    pub fn end(&mut self, ended: Option<Finish>, out: &mut dyn Output) -> Finish {
        let finish = self.finish.take().or(ended).unwrap_or(Finish::Length);
        if !matches!(finish, Finish::Stop(_)) {
            let r = self.stops.push(&out.flush());
            out.text(r.text);
            if r.stop.is_none() {
                out.text(self.stops.finish());
            }
        }
        finish
    }
}

/// [`Output`] for [`Session::generate_with`]: text through the caller's detokenizer and
/// emitter.
struct TextSink<'a> {
    detok: &'a mut dyn FnMut(u32) -> String,
    emit: &'a mut dyn FnMut(&str),
}

impl Output for TextSink<'_> {
    fn piece(&mut self, id: u32) -> String {
        (self.detok)(id)
    }

    fn text(&mut self, text: String) {
        if !text.is_empty() {
            (self.emit)(&text);
        }
    }
}

impl Session {
    /// Generates from `prompt`, calling `detok` with each new token id (it returns the text the
    /// token completes, possibly empty) and `emit` with text as it becomes final. Returns the
    /// generated ids, why it stopped, and the statistics.
    ///
    /// Errors: a forward pass failed (I/O error, context full); generation ends there.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        sampler: &mut Sampler,
        opts: &GenerateOptions,
        detok: &mut dyn FnMut(u32) -> String,
        emit: &mut dyn FnMut(&str),
    ) -> Result<(Vec<u32>, Finish, GenStats)> {
        self.generate_with(prompt, sampler, opts, None, detok, emit)
    }

    /// [`Session::generate`], decoding speculatively through `spec` when given: each step
    /// after the first token is one [`Speculator::step_rows`] (a verification pass of drafted
    /// tokens, or a plain pass), which may yield several tokens. The speculation's counters
    /// are returned in [`GenStats::speculative`]. All of `prompt` is prefilled, after what
    /// the KV cache already holds ([`Session::generate_into`] with nothing cached).
    ///
    /// Errors: as [`Session::generate_into`].
    pub fn generate_with(
        &mut self,
        prompt: &[u32],
        sampler: &mut Sampler,
        opts: &GenerateOptions,
        spec: Option<&mut Speculator>,
        detok: &mut dyn FnMut(u32) -> String,
        emit: &mut dyn FnMut(&str),
    ) -> Result<(Vec<u32>, Finish, GenStats)> {
        let mut out = TextSink { detok, emit };
        let g = self.generate_into(prompt, 0, sampler, opts, spec, &mut out)?;
        Ok((g.tokens, g.finish, g.stats))
    }

    /// The generation loop. Prefills `prompt[cached..]` (the first `cached` tokens are taken
    /// to be the last ones in the KV cache already), then samples until an end-of-generation
    /// token (`opts.is_eog`), a stop string of `opts.stop`, `opts.max_tokens` tokens, a full
    /// context, or `opts.cancel` (asked before every token, the first included: the tokens
    /// a speculative step yielded after it are [`Generated::unused`]). Each step after the
    /// first token is a plain pass, or one [`Speculator::step_rows`] through `spec`. Tokens
    /// and text go to `out`; the statistics cover the prefill of `prompt[cached..]` and the
    /// decoding (`prompt_tokens` counts all of `prompt`).
    ///
    /// Errors: `cached` leaves nothing to prefill; a forward pass failed (I/O error, context
    /// full), generation ends there; speculation over a cache that cannot be rolled back
    /// ([`check_rollback`]).
    pub fn generate_into(
        &mut self,
        prompt: &[u32],
        cached: usize,
        sampler: &mut Sampler,
        opts: &GenerateOptions,
        mut spec: Option<&mut Speculator>,
        out: &mut dyn Output,
    ) -> Result<Generated> {
        if cached >= prompt.len() {
            anyhow::bail!("the prompt has no token to prefill");
        }
        if spec.is_some() {
            check_rollback(&self.cache)?;
        }
        let io0 = self.store.stats().snapshot();
        let snap = |s: &Self| s.store.experts().map(Snapshot::of);
        let es0 = snap(self);
        let mut per_token = Vec::new();
        let t0 = Instant::now();
        let pool0 = PoolStats::now();
        let mut stats = GenStats {
            prompt_tokens: prompt.len(),
            ..Default::default()
        };
        let mut logits = self.prefill(&prompt[cached..], Logits::Last)?;
        let mut es_prev = snap(self);
        if let (Some(a), Some(b)) = (&es0, &es_prev) {
            per_token.push(TokenIo::between("prefill", a, b));
        }
        let es_first = es_prev.clone();
        let want_rows = out.rows();
        let vocab = self.model.vocab_size();
        let mut h = Handout::new(prompt, opts.stop, opts.max_tokens);
        let mut ended = None;
        let mut first = None;
        let mut pool_first = PoolStats::now();
        // the tokens of the last step and their logits (with `want_rows`); `at` of them handed out
        let mut step: Vec<u32> = Vec::new();
        let mut rows: Vec<f32> = Vec::new();
        let mut at = 0usize;
        while h.tokens.len() < opts.max_tokens {
            if opts.cancel.is_some_and(|c| c()) {
                ended = Some(Finish::Interrupted);
                break;
            }
            if at == step.len() {
                at = 0;
                step.clear();
                if h.tokens.is_empty() {
                    // the first token, from the prompt's logits
                    rows = if want_rows {
                        logits.clone()
                    } else {
                        Vec::new()
                    };
                    step.push(sampler.sample(&mut logits, &h.history));
                    first = Some((Instant::now(), self.store.stats().snapshot()));
                    pool_first = PoolStats::now();
                } else {
                    // one decode step after `history`, whose last token is not yet in the cache
                    let left = opts.max_tokens - h.tokens.len();
                    match spec.as_deref_mut() {
                        Some(sp) => {
                            (step, rows) =
                                sp.step_rows(self, sampler, &h.history, left, want_rows)?
                        }
                        None => {
                            let last = *h.history.last().expect("a token was generated");
                            let mut l = self.model.forward(
                                &mut self.store,
                                &mut self.cache,
                                &[last],
                                Logits::Last,
                            )?;
                            rows = if want_rows { l.clone() } else { Vec::new() };
                            step.push(sampler.sample(&mut l, &h.history));
                        }
                    }
                    let now = snap(self);
                    if let (Some(a), Some(b)) = (&es_prev, &now) {
                        per_token.push(TokenIo::between("decode", a, b));
                    }
                    es_prev = now;
                }
            }
            let id = step[at];
            let row = want_rows.then(|| &rows[at * vocab..(at + 1) * vocab]);
            at += 1;
            if !h.push(id, row, opts.is_eog, out) {
                break;
            }
            if at == step.len() && self.cache.len >= self.cache.n_ctx {
                ended = Some(Finish::ContextFull);
                break;
            }
        }
        let finish = h.end(ended, out);
        let tokens = std::mem::take(&mut h.tokens);
        let t_end = Instant::now();
        let pool_end = PoolStats::now();
        let io_end = self.store.stats().snapshot();
        let (t_first, io_first) = first.unwrap_or((t_end, io_end));
        let unused = step[at..].to_vec();
        stats.speculative = spec.map(|sp| crate::engine::SpecStats {
            discarded: unused.len() as u64,
            ..sp.stats.clone()
        });
        stats.generated_tokens = tokens.len();
        stats.ttft_s = (t_first - t0).as_secs_f64();
        stats.decode_s = (t_end - t_first).as_secs_f64();
        stats.prefill_bytes = io_first.0 - io0.0;
        stats.decode_bytes = io_end.0 - io_first.0;
        stats.reads = io_end.1 - io0.1;
        stats.io_wait_s = (io_end.3 - io0.3) as f64 / 1e9;
        stats.decode_read_busy_s = (io_end.2 - io_first.2) as f64 / 1e9;
        stats.peak_rss = peak_rss_bytes();
        stats.pool_prefill = pool_first.since(&pool0);
        stats.pool_decode = pool_end.since(&pool_first);
        stats.threads = crate::backend::cpu::pool::threads();
        if let (Some(es), Some(a), Some(f), Some(e)) =
            (self.store.experts(), &es0, &es_first, &es_prev)
        {
            stats.experts = Some(ExpertRunStats::new(es, a, f, e, per_token));
        }
        Ok(Generated {
            tokens,
            unused,
            finish,
            stats,
        })
    }
}
