//! A session: one model, its weight store and KV cache; prefill, what a generation is asked
//! ([`GenerateOptions`]), why it ended and its statistics. The generation loop is
//! `generate.rs`.

use anyhow::Result;

use super::spec_types::SpecStats;
use crate::backend::cpu::pool::PoolStats;
use crate::models::KvCache;
use crate::models::{Logits, Model};
use crate::store::telemetry::ExpertRunStats;
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
    /// [`GenerateOptions::cancel`] asked to stop (Ctrl-C in `deltafin run` or `chat`, a
    /// client gone or a shutdown in `deltafin serve`).
    Interrupted,
}

impl Finish {
    /// OpenAI's `finish_reason` word, the one spelling of every output (`--stats`,
    /// `--stats-json`, `bench`, `chat`'s JSONL, the server): `stop` for an end-of-generation
    /// token or a stop string, `length` for `max_tokens` and for a full context (as
    /// llama-server reports both; [`Finish::detail`] tells them apart in text), and
    /// `interrupted` for a generation Ctrl-C stopped (OpenAI has no word for it).
    pub fn as_str(&self) -> &'static str {
        match self {
            Finish::Eos | Finish::Stop(_) => "stop",
            Finish::Length | Finish::ContextFull => "length",
            Finish::Interrupted => "interrupted",
        }
    }

    /// What `--stats` adds after the word: which of the two causes of `stop` or `length`.
    pub fn detail(&self) -> &'static str {
        match self {
            Finish::Eos => "end-of-generation token",
            Finish::Stop(_) => "stop string",
            Finish::Length => "max tokens",
            Finish::ContextFull => "context full",
            Finish::Interrupted => "Ctrl-C",
        }
    }
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
    /// Seconds the weight streamer's I/O thread spent inside reads during decode (the
    /// streamed spine or dense layers; the expert store's reads are timed per drive in
    /// `experts`).
    pub decode_read_busy_s: f64,
    /// Peak resident set size of the process, in bytes (`VmHWM`).
    pub peak_rss: u64,
    /// The expert store's statistics, when the model's experts are read on demand.
    pub experts: Option<ExpertRunStats>,
    /// Speculative decoding's counters, when it ran.
    pub speculative: Option<SpecStats>,
    /// The CPU pool's parallel loops during prefill (to the first token) and during decode
    /// (after it), every thread of the process counted.
    pub pool_prefill: PoolStats,
    pub pool_decode: PoolStats,
    /// Threads of the CPU pool.
    pub threads: usize,
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

/// What a generation does besides sampling.
pub struct GenerateOptions<'a> {
    pub max_tokens: usize,
    /// Text that ends generation; the output stops before it.
    pub stop: &'a [String],
    /// Whether a token ends generation (EOS, end of turn).
    pub is_eog: &'a dyn Fn(u32) -> bool,
    /// Asked before every token (the first included): `true` ends the generation there
    /// ([`Finish::Interrupted`]), with the text and statistics so far. `None`: never.
    pub cancel: Option<&'a dyn Fn() -> bool>,
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
}
