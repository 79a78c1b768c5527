//! A session: one model, its weight store and KV cache; prefill, decode and the generation loop
//! with stop conditions and statistics.

use std::time::Instant;

use anyhow::Result;

use super::sampler::Sampler;
use super::speculative::{SpecStats, Speculator};
use crate::models::KvCache;
use crate::models::{Logits, Model};
use crate::store::telemetry::{ExpertRunStats, Snapshot, TokenIo};
use crate::store::WeightStore;

/// A model with its weights and KV cache.
pub struct Session {
    pub model: Box<dyn Model>,
    pub store: WeightStore,
    pub cache: KvCache,
    /// Largest number of prompt tokens one forward pass takes.
    pub n_batch: usize,
}

/// Why generation ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-generation token (EOS, end of turn) was produced.
    Eos,
    /// A `--stop` string appeared; the text ends before it.
    Stop(String),
    /// `max_tokens` tokens were generated.
    Length,
    /// The KV cache (`--ctx-size`, at most the model's context) is full.
    ContextFull,
}

/// Measurements of one generation. Bytes are bytes read from disk (aligned spans).
#[derive(Clone, Debug, Default)]
pub struct GenStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// Seconds from the start of prefill to the first sampled token.
    pub ttft_s: f64,
    /// Seconds spent after the first token (decode of the remaining tokens).
    pub decode_s: f64,
    pub prefill_bytes: u64,
    pub decode_bytes: u64,
    pub reads: u64,
    /// Seconds compute waited for streamed weights.
    pub io_wait_s: f64,
    /// Peak resident set size of the process, in bytes (`VmHWM`).
    pub peak_rss: u64,
    /// The expert store's statistics, when the model's experts are read on demand.
    pub experts: Option<ExpertRunStats>,
    /// Speculative decoding's counters, when it ran.
    pub speculative: Option<SpecStats>,
}

impl GenStats {
    /// Decode speed in tokens per second over the tokens after the first one.
    pub fn decode_tok_s(&self) -> f64 {
        let n = self.generated_tokens.saturating_sub(1);
        if n == 0 || self.decode_s <= 0.0 {
            0.0
        } else {
            n as f64 / self.decode_s
        }
    }

    /// Bytes read from disk per decoded token (after the first).
    pub fn decode_bytes_per_token(&self) -> f64 {
        let n = self.generated_tokens.saturating_sub(1);
        if n == 0 {
            0.0
        } else {
            self.decode_bytes as f64 / n as f64
        }
    }
}

/// Peak resident set size of this process in bytes (`VmHWM` from `/proc/self/status`; 0 where
/// unavailable).
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
            })
        })
        .map_or(0, |kb| kb * 1024)
}

/// The text side of a generation: detokenizes each new token, holds back a tail that could
/// still start a stop string, and emits the rest as it becomes final.
pub(crate) struct TextOut<'a> {
    pending: String,
    hold: usize,
    stop: &'a [String],
}

impl<'a> TextOut<'a> {
    /// Text output watching for the strings of `stop`.
    pub(crate) fn new(stop: &'a [String]) -> Self {
        Self {
            pending: String::new(),
            hold: stop.iter().map(|s| s.len()).max().unwrap_or(0),
            stop,
        }
    }

    /// Takes one generated token: `Some(why)` when it ends generation (an end-of-generation
    /// token, or a stop string, whose text and what follows are not emitted).
    pub(crate) fn push(
        &mut self,
        tok: u32,
        opts: &GenerateOptions,
        detok: &mut dyn FnMut(u32) -> String,
        emit: &mut dyn FnMut(&str),
    ) -> Option<Finish> {
        if (opts.is_eog)(tok) {
            return Some(Finish::Eos);
        }
        let pending = &mut self.pending;
        pending.push_str(&detok(tok));
        if let Some((pos, s)) = self
            .stop
            .iter()
            .filter_map(|s| pending.find(s.as_str()).map(|p| (p, s)))
            .min_by_key(|x| x.0)
        {
            emit(&pending[..pos]);
            pending.clear();
            return Some(Finish::Stop(s.clone()));
        }
        // emit all but a tail that could still start a stop string
        let mut cut = pending.len().saturating_sub(self.hold.saturating_sub(1));
        while !pending.is_char_boundary(cut) {
            cut -= 1;
        }
        if cut > 0 {
            emit(&pending[..cut]);
            pending.drain(..cut);
        }
        None
    }

    /// Emits the text still held.
    pub(crate) fn finish(self, emit: &mut dyn FnMut(&str)) {
        if !self.pending.is_empty() {
            emit(&self.pending);
        }
    }
}

/// What a generation does besides sampling.
pub struct GenerateOptions<'a> {
    pub max_tokens: usize,
    /// Text that ends generation; the output stops before it.
    pub stop: &'a [String],
    /// Whether a token ends generation (EOS, end of turn).
    pub is_eog: &'a dyn Fn(u32) -> bool,
}

impl Session {
    /// A session over a loaded model with a KV cache of `n_ctx` tokens.
    pub fn new(model: Box<dyn Model>, store: WeightStore, n_ctx: usize, n_batch: usize) -> Self {
        let cache = model.new_cache(n_ctx);
        Self {
            model,
            store,
            cache,
            n_batch: n_batch.max(1),
        }
    }

    /// Runs `tokens` through the model in batches of at most `n_batch`, returning the logits of
    /// the last token (or of every token with [`Logits::All`]).
    ///
    /// Errors: see [`Model::forward`].
    pub fn prefill(&mut self, tokens: &[u32], logits: Logits) -> Result<Vec<f32>> {
        let mut out = Vec::new();
        for chunk in tokens.chunks(self.n_batch) {
            let l = self
                .model
                .forward(&mut self.store, &mut self.cache, chunk, logits)?;
            if logits == Logits::All {
                out.extend_from_slice(&l);
            } else {
                out = l;
            }
        }
        Ok(out)
    }

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
    /// after the first token is one [`Speculator::step`] (a verification pass of drafted
    /// tokens, or a plain pass), which may yield several tokens. The speculation's counters
    /// are returned in [`GenStats::speculative`].
    ///
    /// Errors: as [`Session::generate`]; and speculation over a cache that cannot be rolled
    /// back ([`super::speculative::check_rollback`]).
    pub fn generate_with(
        &mut self,
        prompt: &[u32],
        sampler: &mut Sampler,
        opts: &GenerateOptions,
        mut spec: Option<&mut Speculator>,
        detok: &mut dyn FnMut(u32) -> String,
        emit: &mut dyn FnMut(&str),
    ) -> Result<(Vec<u32>, Finish, GenStats)> {
        if spec.is_some() {
            super::speculative::check_rollback(&self.cache)?;
        }
        let io0 = self.store.stats().snapshot();
        let snap = |s: &Self| s.store.experts().map(Snapshot::of);
        let es0 = snap(self);
        let mut per_token = Vec::new();
        let t0 = Instant::now();
        let mut history = prompt.to_vec();
        let mut stats = GenStats {
            prompt_tokens: prompt.len(),
            ..Default::default()
        };
        let mut logits = self.prefill(prompt, Logits::Last)?;
        let mut es_prev = snap(self);
        if let (Some(a), Some(b)) = (&es0, &es_prev) {
            per_token.push(TokenIo::between("prefill", a, b));
        }
        let es_first = es_prev.clone();
        let mut out = Vec::new();
        let mut text = TextOut::new(opts.stop);

        let mut finish = Finish::Length;
        let mut next = Vec::new();
        if opts.max_tokens > 0 {
            next.push(sampler.sample(&mut logits, &history));
        }
        let t_first = Instant::now();
        let io_first = self.store.stats().snapshot();
        'gen: while out.len() < opts.max_tokens {
            for tok in next.drain(..) {
                out.push(tok);
                history.push(tok);
                if let Some(f) = text.push(tok, opts, detok, emit) {
                    finish = f;
                    break 'gen;
                }
                if out.len() >= opts.max_tokens {
                    break 'gen;
                }
            }
            if self.cache.len >= self.cache.n_ctx {
                finish = Finish::ContextFull;
                break;
            }
            match spec.as_deref_mut() {
                Some(sp) => next = sp.step(self, sampler, &history, opts.max_tokens - out.len())?,
                None => {
                    let tok = *history.last().expect("a token was generated");
                    let mut l = self.model.forward(
                        &mut self.store,
                        &mut self.cache,
                        &[tok],
                        Logits::Last,
                    )?;
                    next.push(sampler.sample(&mut l, &history));
                }
            }
            let now = snap(self);
            if let (Some(a), Some(b)) = (&es_prev, &now) {
                per_token.push(TokenIo::between("decode", a, b));
            }
            es_prev = now;
        }
        text.finish(emit);
        let t_end = Instant::now();
        let io_end = self.store.stats().snapshot();
        stats.speculative = spec.map(|sp| sp.stats.clone());
        stats.generated_tokens = out.len();
        stats.ttft_s = (t_first - t0).as_secs_f64();
        stats.decode_s = (t_end - t_first).as_secs_f64();
        stats.prefill_bytes = io_first.0 - io0.0;
        stats.decode_bytes = io_end.0 - io_first.0;
        stats.reads = io_end.1 - io0.1;
        stats.io_wait_s = (io_end.3 - io0.3) as f64 / 1e9;
        stats.peak_rss = peak_rss_bytes();
        if let (Some(es), Some(a), Some(f), Some(e)) =
            (self.store.experts(), &es0, &es_first, &es_prev)
        {
            stats.experts = Some(ExpertRunStats::new(es, a, f, e, per_token));
        }
        Ok((out, finish, stats))
    }
}
