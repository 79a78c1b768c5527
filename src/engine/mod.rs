//! Sessions (owning a model's KV cache, [`crate::models::KvCache`]), the one generation loop
//! (`run`, `bench`, `chat` and `serve` go through it), sampling and stop conditions, the
//! conversation engine with prefix reuse, and speculative decoding (draft sources,
//! verification, rollback).
//!
//! Files:
//!
//! - `session.rs`: a session: prefill, what a generation is asked, why it ended, statistics.
//! - `generate.rs`: the generation loop `Session::generate_into` (prefill of the uncached
//!   prompt, plain or speculative steps, end-of-generation tokens, stop strings, `max_tokens`,
//!   a full context, cancellation, statistics) handing tokens and text to an `Output`;
//!   `Session::generate_with` (`run`, `bench`) writes text through a detokenizer.
//! - `conversation.rs`: the `Engine` of `chat` and `serve`: the cached conversation reused as
//!   a prefix, one request's `Params`, its reply as `Chunk`s (logprobs, tool-call section) and
//!   `Outcome`. `logprobs.rs`: `TokenLogprob`, the log-softmax and top alternatives.
//! - `slots.rs`: continuous batching (`serve`'s slots): `Slots`, N KV-cache slots (a split
//!   or a shared context, `SlotContext`) with per-slot prefix reuse; each step one
//!   `forward_batch` over every running request (a token per decoding slot, prompt chunks
//!   within `n_batch` rows), tokens handed out as in
//!   `generate.rs` (`Handout`) into the conversation's `Reply`.
//! - `stop.rs`: `StopMatcher`, stop strings over streamed text. `tools.rs`: the tool-call
//!   syntaxes (`ToolFormat`) and their parsing.
//! - `constrain.rs`: a request's `Steering` (logit bias, `ignore_eos`, a grammar): the
//!   `llguidance` matcher of JSON schemas and Lark grammars over the vocabulary's bytes
//!   (`Guide`), applied by the sampler.
//! - `sampler.rs`: penalties (repetition, presence, frequency), top-k, top-p, min-p and
//!   temperature, in llama.cpp's or transformers' order by the settings' source.
//! - `speculative.rs`: one verification pass of the last token plus the drafts, greedy and
//!   Leviathan/Chen accept/reject, KV rollback by `KvCache::truncate`. It re-exports the shared
//!   types of `spec_types.rs` (a leaf: `SpecConfig`, `SpecStats`, `check_rollback`, the refusal
//!   of recurrent states).
//! - `spec_policy.rs`: the draft length `Policy`: expected tokens per measured cost; plain passes
//!   when no length pays or acceptance is not yet measured; shadow drafts on plain passes within
//!   a probe budget (`PROBE_SHARE`); unmeasured lengths priced on the line through the nearest
//!   measured one; re-probes of dear timed costs within the same budget; for a streamed MoE with
//!   an expert cache, verifications charged their rejected drafts' reads (none at all with a
//!   resident spine: `Policy::no_gain`).
//! - `draft.rs`: the `DraftSource` trait, prompt lookup `LookupDraft`, the draft model
//!   `ModelDraft` with its own rolled-back cache. `draft_mtp.rs`: `MtpDraft`, the target's
//!   multi-token-prediction layer drafting from the target's hidden rows (`--draft mtp`),
//!   through `DraftSource::draft_for`.
//! - `report.rs`: the statistics report (`--stats` table and JSON).

pub mod constrain;
pub mod conversation;
pub mod draft;
pub mod draft_mtp;
pub mod generate;
pub mod logprobs;
pub mod report;
pub mod sampler;
mod sampler_select;
pub mod session;
pub mod slots;
pub mod spec_policy;
pub mod spec_types;
pub mod speculative;
pub mod stop;
pub mod tools;

pub use constrain::{GrammarSpec, Guide, Steering};
pub use conversation::{Chunk, Engine, FinishReason, Outcome, Params};
pub use generate::{Generated, Output};
pub use logprobs::TokenLogprob;
pub use sampler::{Sampler, SamplerConfig, SamplerOrder};
pub use session::{Finish, GenStats, GenerateOptions, Session};
pub use speculative::{SpecConfig, SpecStats, Speculator};
