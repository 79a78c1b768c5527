//! Helpers of the speculative decoding tests (`speculative.rs`, `speculative_cli.rs`):
//! greedy sampling, generation with statistics, fixed and default speculators.

use deltafin::engine::draft::LookupDraft;
use deltafin::engine::{
    GenStats, GenerateOptions, Sampler, SamplerConfig, Session, SpecConfig, Speculator,
};

use super::gguf::reference;
use super::hf::u32s;

/// Greedy sampling (temperature 0).
pub fn greedy() -> SamplerConfig {
    SamplerConfig {
        temperature: 0.0,
        ..Default::default()
    }
}

/// Generates `n` tokens (end-of-generation ignored), speculating through `spec` when given.
pub fn gen(
    s: &mut Session,
    prompt: &[u32],
    n: usize,
    cfg: &SamplerConfig,
    spec: Option<&mut Speculator>,
) -> (Vec<u32>, GenStats) {
    let never = |_: u32| false;
    let o = GenerateOptions {
        max_tokens: n,
        stop: &[],
        is_eog: &never,
        cancel: None,
    };
    let mut sampler = Sampler::new(cfg.clone());
    let (ids, _, st) = s
        .generate_with(
            prompt,
            &mut sampler,
            &o,
            spec,
            &mut |_| String::new(),
            &mut |_| {},
        )
        .unwrap();
    assert_eq!(ids.len(), n);
    (ids, st)
}

/// A fixed draft length of `k` (`--draft-fixed`), for tests that need verifications.
pub fn fixed(k: usize) -> SpecConfig {
    SpecConfig {
        draft_max: k,
        draft_min: 1,
        adaptive: false,
    }
}

/// Prompt lookup with the default (adaptive) settings.
pub fn lookup() -> Speculator {
    Speculator::new(Box::new(LookupDraft::default()), SpecConfig::default())
}

/// The first 20 prompt ids of a fixture, twice (so prompt lookup finds matches).
pub fn repeated_prompt(family: &str) -> Vec<u32> {
    let ids = u32s(&reference(family)["prompt_ids"]);
    let mut p = ids[..20].to_vec();
    p.extend_from_slice(&ids[..20]);
    p
}
