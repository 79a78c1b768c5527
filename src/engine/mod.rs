//! Sessions (owning a model's KV cache, [`crate::models::KvCache`]), prefill and decode, sampling and stop conditions,
//! and speculative decoding (draft sources, verification, rollback).
//!
//! Files:
//!
//! - `session.rs`: a session: prefill, stop conditions, statistics. `generate.rs`: the
//!   generation loop, whose `generate_with` decodes speculatively.
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

pub mod draft;
pub mod draft_mtp;
mod generate;
pub mod report;
pub mod sampler;
pub mod session;
pub mod spec_policy;
pub mod spec_types;
pub mod speculative;

pub use sampler::{Sampler, SamplerConfig, SamplerOrder};
pub use session::{Finish, GenStats, GenerateOptions, Session};
pub use speculative::{SpecConfig, SpecStats, Speculator};
