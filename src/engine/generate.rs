//! The generation loop ([`Session::generate`], [`Session::generate_with`]): prefill, then one
//! plain or speculative decode step at a time until a stop condition, with the statistics.
//! Apart from `session.rs` so that the session does not import speculative decoding, which
//! imports the session.

use std::time::Instant;

use anyhow::Result;

use super::sampler::Sampler;
use super::session::{peak_rss_bytes, Finish, GenStats, GenerateOptions, Session, TextOut};
use super::spec_types::check_rollback;
use super::speculative::Speculator;
use crate::models::Logits;
use crate::store::telemetry::{ExpertRunStats, Snapshot, TokenIo};

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
    /// after the first token is one [`Speculator::step`] (a verification pass of drafted
    /// tokens, or a plain pass), which may yield several tokens. The speculation's counters
    /// are returned in [`GenStats::speculative`].
    ///
    /// Errors: as [`Session::generate`]; and speculation over a cache that cannot be rolled
    /// back ([`check_rollback`]).
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
            check_rollback(&self.cache)?;
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
        // tokens a step yielded past the stop (accepted drafts after a stop string or an
        // end-of-generation token), not output
        let mut discarded = 0;
        'gen: while out.len() < opts.max_tokens {
            let n = next.len();
            for (i, tok) in next.drain(..).enumerate() {
                out.push(tok);
                history.push(tok);
                if let Some(f) = text.push(tok, opts, detok, emit) {
                    finish = f;
                    discarded = n - i - 1;
                    break 'gen;
                }
                if out.len() >= opts.max_tokens {
                    discarded = n - i - 1;
                    break 'gen;
                }
            }
            if self.cache.len >= self.cache.n_ctx {
                finish = Finish::ContextFull;
                break;
            }
            if opts.cancel.is_some_and(|c| c()) {
                finish = Finish::Interrupted;
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
        stats.speculative = spec.map(|sp| crate::engine::SpecStats {
            discarded: discarded as u64,
            ..sp.stats.clone()
        });
        stats.generated_tokens = out.len();
        stats.ttft_s = (t_first - t0).as_secs_f64();
        stats.decode_s = (t_end - t_first).as_secs_f64();
        stats.prefill_bytes = io_first.0 - io0.0;
        stats.decode_bytes = io_end.0 - io_first.0;
        stats.reads = io_end.1 - io0.1;
        stats.io_wait_s = (io_end.3 - io0.3) as f64 / 1e9;
        stats.decode_read_busy_s = (io_end.2 - io_first.2) as f64 / 1e9;
        stats.peak_rss = peak_rss_bytes();
        if let (Some(es), Some(a), Some(f), Some(e)) =
            (self.store.experts(), &es0, &es_first, &es_prev)
        {
            stats.experts = Some(ExpertRunStats::new(es, a, f, e, per_token));
        }
        Ok((out, finish, stats))
    }
}
