//! The types speculative decoding shares between its files and with the session: the settings
//! ([`SpecConfig`]), the counters ([`SpecStats`]) and the rollback check ([`check_rollback`]).
//! A leaf of `engine/` (it imports no other engine file), so that the session, the policy, the
//! draft sources and the verifier can all use them without importing one another back.

use anyhow::Result;
use serde::Serialize;

use crate::models::KvCache;

/// Refuses speculation over a cache holding a recurrent state (Kimi Delta Attention): that
/// state cannot be rolled back past rejected drafts ([`KvCache::truncate`] clears it).
///
/// Errors: the cache has a recurrent state.
pub fn check_rollback(cache: &KvCache) -> Result<()> {
    if cache.state.iter().any(|s| !s.is_empty()) {
        anyhow::bail!(
            "speculative decoding (--lookup, --draft-model, --draft mtp) needs a KV cache that can be rolled back past rejected drafts, \
             but this model keeps a recurrent state (Kimi Delta Attention layers) that cannot be; run it without speculation"
        );
    }
    Ok(())
}

/// Settings of speculative decoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecConfig {
    /// Most tokens drafted per verification pass (llama.cpp's `--draft-max`).
    pub draft_max: usize,
    /// Fewest drafted tokens worth a verification pass; with fewer, the step is a plain pass
    /// (llama.cpp's `--draft-min`).
    pub draft_min: usize,
    /// Adapt the draft length to recent acceptance and fall back to plain passes while
    /// verification is not expected to pay ([`Policy`](super::spec_policy::Policy)); else always draft `draft_max`.
    pub adaptive: bool,
}

impl Default for SpecConfig {
    /// Up to 8 drafts, at least 1, adaptive.
    fn default() -> Self {
        Self {
            draft_max: 8,
            draft_min: 1,
            adaptive: true,
        }
    }
}

/// What speculation did in one generation. Bytes are bytes the target read from disk
/// (aligned spans; 0 when every weight is resident).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct SpecStats {
    /// The draft source (`lookup`, `draft-model`).
    pub source: String,
    /// Tokens drafted and sent to verification.
    pub drafted: u64,
    /// Drafted tokens accepted.
    pub accepted: u64,
    /// Verification passes of the target.
    pub verify_passes: u64,
    /// Plain (one-token) passes of the target: no draft, or fallback.
    pub plain_passes: u64,
    /// Tokens the verification passes yielded (accepted drafts plus one each).
    pub verify_tokens: u64,
    /// Bytes read by verification passes.
    pub verify_bytes: u64,
    /// Bytes read by plain passes.
    pub plain_bytes: u64,
    /// Drafts made on steps without a verification (shadow drafts, judged against the plain
    /// pass's token, and drafts too short to verify).
    pub shadow_drafts: u64,
    /// Bytes read making those drafts (the multi-token-prediction layer's streamed experts;
    /// 0 for prompt lookup and resident draft models).
    pub shadow_bytes: u64,
    /// Times the policy switched to plain passes because verification was not expected to pay
    /// (acceptance too low for its measured cost).
    pub fallbacks: u64,
    /// RAM the draft model holds (weights, KV cache, activations), taken out of the RAM
    /// budget before the target was placed; 0 for prompt lookup.
    pub draft_bytes: u64,
    /// Tokens the last step yielded after the generation stopped (a stop string or an
    /// end-of-generation token among accepted drafts): counted in `accepted` and
    /// `verify_tokens`, not output. So `1 + plain_passes + verify_tokens − discarded` is the
    /// number of generated tokens.
    pub discarded: u64,
}

impl SpecStats {
    /// Accepted ÷ drafted (0 with no draft).
    pub fn acceptance_rate(&self) -> f64 {
        ratio(self.accepted, self.drafted)
    }
    /// Accepted drafts per verification pass.
    pub fn mean_accepted(&self) -> f64 {
        ratio(self.accepted, self.verify_passes)
    }
    /// Target forward passes after the prompt.
    pub fn target_passes(&self) -> u64 {
        self.verify_passes + self.plain_passes
    }
    /// Bytes per token yielded by verification passes.
    pub fn verify_bytes_per_token(&self) -> f64 {
        ratio(self.verify_bytes, self.verify_tokens)
    }
    /// Bytes per token of plain passes (one token each).
    pub fn plain_bytes_per_token(&self) -> f64 {
        ratio(self.plain_bytes, self.plain_passes)
    }
    /// The `--stats` lines.
    pub fn table(&self) -> String {
        format!(
            "--- speculative ---\n\
             source               {}\n\
             drafted / accepted   {} / {} ({:.1}% accepted, {:.2} per verification)\n\
             target passes        {} ({} verification, {} plain; {} fallbacks; {} tokens past the stop)\n\
             bytes / token        {:.1} KiB verified, {:.1} KiB plain\n\
             shadow drafts        {} ({:.1} KiB read)\n\
             draft model RAM      {:.1} MiB\n",
            self.source,
            self.drafted,
            self.accepted,
            100.0 * self.acceptance_rate(),
            self.mean_accepted(),
            self.target_passes(),
            self.verify_passes,
            self.plain_passes,
            self.fallbacks,
            self.discarded,
            self.verify_bytes_per_token() / 1024.0,
            self.plain_bytes_per_token() / 1024.0,
            self.shadow_drafts,
            self.shadow_bytes as f64 / 1024.0,
            self.draft_bytes as f64 / 1048576.0,
        )
    }
    /// The `--stats-json` object: the counters and the ratios.
    pub fn json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).expect("serializable");
        v["acceptance_rate"] = self.acceptance_rate().into();
        v["mean_accepted"] = self.mean_accepted().into();
        v["target_passes"] = self.target_passes().into();
        v["verify_bytes_per_token"] = self.verify_bytes_per_token().into();
        v["plain_bytes_per_token"] = self.plain_bytes_per_token().into();
        v
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}
