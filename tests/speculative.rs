//! Speculative decoding (src/engine/speculative.rs, src/engine/draft.rs): greedy output equal
//! token for token to plain decoding on the demo model and the MoE fixtures, with prompt
//! lookup and with a draft model, streamed and resident; the KV cache after a rejection equals
//! the cache of the accepted prefix; sampled speculation follows the target's distribution
//! (chi-squared); seeded runs repeat; models that cannot roll back are refused; the adaptive
//! policy reads no byte over plain decoding where speculation cannot pay (a never-accepted
//! source, a cached MoE with a resident spine). The command-line tests are `speculative_cli.rs`.

mod common;

use std::path::Path;

use common::gguf::{gguf_path, reference, session_at, smallest_budget};
use common::hf::u32s;
use common::spec::{fixed, gen, greedy, lookup, repeated_prompt};
use deltafin::engine::draft::{Draft, DraftSource, LookupDraft, ModelDraft};
use deltafin::engine::speculative::{check_rollback, verify};
use deltafin::engine::{GenerateOptions, Sampler, SamplerConfig, SpecConfig, Speculator};
use deltafin::models::Logits;

/// (family, sibling variant used as draft model) of every MoE fixture that can roll back.
const MOE: &[(&str, &str)] = &[
    ("qwen3_moe", "q8_0"),
    ("mixtral", "q8_0"),
    ("deepseek_v3", "q8_0"),
    ("gpt_oss", "mxfp4_moe"),
];

#[test]
fn greedy_speculation_equals_plain_decoding_on_every_moe_fixture() {
    for &(family, sibling) in MOE {
        let path = gguf_path(family, "f32");
        let prompt = repeated_prompt(family);
        let want = gen(&mut session_at(&path, None), &prompt, 32, &greedy(), None).0;
        for budget in [None, Some(smallest_budget(&path))] {
            let label = format!("{family} budget {budget:?}");
            let mut s = session_at(&path, budget);
            // a fixed draft length: random weights rarely repeat the prompt, so the adaptive
            // policy may never verify
            let mut sp = Speculator::new(Box::new(LookupDraft::default()), fixed(4));
            let (got, st) = gen(&mut s, &prompt, 32, &greedy(), Some(&mut sp));
            assert_eq!(got, want, "{label}: lookup");
            let sst = st.speculative.unwrap();
            assert!(sst.drafted > 0 && sst.verify_passes > 0, "{label}: {sst:?}");
            assert_eq!(
                sst.verify_tokens + sst.plain_passes,
                31,
                "{label}: every token after the first from one pass kind: {sst:?}"
            );
            if budget.is_some() {
                assert!(sst.verify_bytes > 0, "{label}: streamed: {sst:?}");
            }
            for draft in ["f32", sibling] {
                let d = session_at(&gguf_path(family, draft), None);
                let md = ModelDraft::new(d, &greedy()).unwrap();
                // a fixed draft length: the adaptive policy (resident, timed) may not verify
                let mut sp = Speculator::new(Box::new(md), fixed(4));
                let mut s = session_at(&path, budget);
                let (got, st) = gen(&mut s, &prompt, 32, &greedy(), Some(&mut sp));
                assert_eq!(got, want, "{label}: draft model {draft}");
                let sst = st.speculative.unwrap();
                assert!(sst.drafted > 0, "{label} {draft}: {sst:?}");
                if draft == "f32" {
                    // the model drafting for itself: every draft is the target's argmax
                    assert_eq!(sst.accepted, sst.drafted, "{label}: self-draft {sst:?}");
                }
            }
        }
    }
}

#[test]
fn greedy_lookup_equals_plain_decoding_on_the_demo_model() {
    let g = common::demo_model();
    let tok = deltafin::tokenizer::Tokenizer::from_gguf(&g).unwrap();
    let text = "Repeat this list exactly: apple, banana, cherry, date, elderberry, fig, grape. \
                Again: apple, banana, cherry, date, elderberry, fig, grape. Again:";
    let prompt = tok.encode(text, true, true).unwrap();
    let n_ctx = prompt.len() + 40;
    let mut plain = common::demo_session(&g, None, n_ctx, 64);
    let (want, _) = gen(&mut plain, &prompt, 40, &greedy(), None);
    for budget in [None, Some(96 << 20)] {
        let mut s = common::demo_session(&g, budget, n_ctx, 64);
        // resident, the adaptive policy times passes: one slow verification on a busy machine
        // may hold it to plain passes, so a fixed length there; streamed, it counts bytes
        let mut sp = match budget {
            None => Speculator::new(Box::new(LookupDraft::default()), fixed(4)),
            Some(_) => lookup(),
        };
        let (got, st) = gen(&mut s, &prompt, 40, &greedy(), Some(&mut sp));
        assert_eq!(got, want, "budget {budget:?}");
        let sst = st.speculative.unwrap();
        // the list repeats: most drafts are accepted and passes are few
        assert!(sst.accepted * 10 >= sst.drafted * 8, "{sst:?}");
        assert!(sst.target_passes() <= 12, "{sst:?}");
    }
}

#[test]
fn the_cache_after_a_rejection_equals_the_cache_of_the_accepted_prefix() {
    let path = gguf_path("mixtral", "f32");
    let prompt = u32s(&reference("mixtral")["prompt_ids"]);
    // plain: single-token passes
    let mut b = session_at(&path, None);
    let mut l = b.prefill(&prompt, Logits::Last).unwrap();
    let mut truth = Vec::new();
    let mut rows = Vec::new();
    for _ in 0..4 {
        let t = deltafin::engine::sampler::argmax(&l) as u32;
        truth.push(t);
        l = b
            .model
            .forward(&mut b.store, &mut b.cache, &[t], Logits::Last)
            .unwrap();
        rows.push(l.clone());
    }
    // speculative: the right first draft, a wrong second one, then two more
    let v = b.model.vocab_size() as u32;
    let wrong = (truth[1] + 1) % v;
    let mut a = session_at(&path, Some(smallest_budget(&path)));
    a.prefill(&prompt, Logits::Last).unwrap();
    let mut sampler = Sampler::new(greedy());
    let mut h = prompt.clone();
    h.push(truth[0]);
    let d = Draft {
        tokens: vec![truth[1], wrong, truth[2], truth[3]],
        q: None,
    };
    let verdict = verify(&mut a, &mut sampler, &h, &d).unwrap();
    assert_eq!((verdict.accepted, verdict.next), (1, truth[2]));
    assert_eq!(
        a.cache.len,
        prompt.len() + 2,
        "rolled back past the rejection"
    );
    // the next pass sees the accepted prefix only: the same logits, bit for bit
    let next = a
        .model
        .forward(&mut a.store, &mut a.cache, &[truth[2]], Logits::Last)
        .unwrap();
    assert_eq!(next, rows[2]);
    for l in 0..a.cache.k.len() {
        let n = a.cache.len * a.cache.kv_dim;
        assert_eq!(a.cache.k[l][..n], b.cache.k[l][..n], "layer {l} keys");
        assert_eq!(a.cache.v[l][..n], b.cache.v[l][..n], "layer {l} values");
    }
}

#[test]
fn a_seeded_sampled_run_repeats() {
    let path = gguf_path("qwen3_moe", "f32");
    let prompt = repeated_prompt("qwen3_moe");
    let cfg = SamplerConfig {
        temperature: 0.9,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: 7,
        ..Default::default()
    };
    let run = || {
        let mut s = session_at(&path, None);
        let md = ModelDraft::new(session_at(&gguf_path("qwen3_moe", "q8_0"), None), &cfg).unwrap();
        let mut sp = Speculator::new(Box::new(md), SpecConfig::default());
        let (ids, st) = gen(&mut s, &prompt, 24, &cfg, Some(&mut sp));
        (ids, st.speculative.unwrap())
    };
    let (a, sa) = run();
    let (b, sb) = run();
    assert_eq!(a, b);
    assert_eq!(sa, sb);
    assert!(sa.drafted > 0);
}

#[test]
fn models_that_cannot_roll_back_are_refused() {
    let s = session_at(Path::new(&gguf_path("kimi_linear", "f32")), None);
    let e = check_rollback(&s.cache).unwrap_err().to_string();
    assert!(
        e.contains("recurrent state (Kimi Delta Attention layers)"),
        "{e}"
    );
    let mut s = s;
    let never = |_: u32| false;
    let o = GenerateOptions {
        max_tokens: 4,
        stop: &[],
        is_eog: &never,
        cancel: None,
    };
    let mut sp = lookup();
    let r = s.generate_with(
        &[1, 2, 3],
        &mut Sampler::new(greedy()),
        &o,
        Some(&mut sp),
        &mut |_| String::new(),
        &mut |_| {},
    );
    assert!(r.unwrap_err().to_string().contains("cannot be"));
}

/// Chi-squared statistic of `counts` (of `n` draws) against probabilities `p` per cell; a
/// draw in a cell of probability 0 makes it infinite.
fn chi2(
    counts: &std::collections::HashMap<(u32, u32), u32>,
    p: &[((u32, u32), f64)],
    n: u32,
) -> f64 {
    let mut x = 0.0;
    for (cell, &c) in counts {
        if !p.iter().any(|e| e.0 == *cell) {
            assert!(c == 0, "draws in {cell:?}, a cell of probability 0");
        }
    }
    for &(cell, pi) in p {
        let e = pi * n as f64;
        let o = *counts.get(&cell).unwrap_or(&0) as f64;
        x += (o - e) * (o - e) / e;
    }
    x
}

#[test]
fn sampled_speculation_follows_the_target_distribution() {
    use deltafin::engine::sampler::Rng;
    use std::collections::HashMap;
    let path = gguf_path("qwen3_moe", "f32");
    let prompt = u32s(&reference("qwen3_moe")["prompt_ids"]);
    let n = prompt.len();
    let cfg = SamplerConfig {
        temperature: 1.0,
        top_k: 4,
        top_p: 1.0,
        min_p: 0.0,
        ..Default::default()
    };
    let mut s = session_at(&path, None);
    let probe = Sampler::new(cfg.clone());
    // the exact joint distribution of the first two tokens: p1(a) p2(b | a), 16 cells
    let l0 = s.prefill(&prompt, Logits::Last).unwrap();
    let p1 = probe.distribution(&l0);
    assert_eq!(p1.len(), 4);
    let mut p2 = HashMap::new();
    let mut joint = Vec::new();
    for &(a, pa) in &p1 {
        s.cache.truncate(n);
        let l = s
            .model
            .forward(&mut s.store, &mut s.cache, &[a], Logits::Last)
            .unwrap();
        let d = probe.distribution(&l);
        for &(b, pb) in &d {
            joint.push(((a, b), pa * pb));
        }
        p2.insert(a, d);
    }
    assert_eq!(joint.len(), 16);
    // verification runs the last prompt token with the drafts: keep the rest cached
    s.cache.truncate(n - 1);
    // an off-support token for the sampled drafts' q
    let extra = (0..).find(|t| !p1.iter().any(|e| e.0 == *t)).unwrap();
    let uniform = |d: &[(u32, f64)]| -> Vec<(u32, f64)> {
        let mut q: Vec<(u32, f64)> = d.iter().map(|e| (e.0, 0.2)).collect();
        q.push((extra, 0.2));
        q
    };
    let draws = 3000u32;
    for sampled_q in [false, true] {
        let mut counts: HashMap<(u32, u32), u32> = HashMap::new();
        let mut proposals: HashMap<(u32, u32), u32> = HashMap::new();
        for i in 0..draws {
            let mut sampler = Sampler::new(SamplerConfig {
                seed: i as u64,
                ..cfg.clone()
            });
            let mut rng = Rng::new(1_000_000 + i as u64);
            let pick = |q: &[(u32, f64)], rng: &mut Rng| {
                let r = rng.next_f64();
                let mut acc = 0.0;
                for &(id, p) in q {
                    acc += p;
                    if r < acc {
                        return id;
                    }
                }
                q[q.len() - 1].0
            };
            let draft = if sampled_q {
                let q1 = uniform(&p1);
                let d1 = pick(&q1, &mut rng);
                let q2 = uniform(p2.get(&d1).map_or(&p1, |d| d));
                let d2 = pick(&q2, &mut rng);
                Draft {
                    tokens: vec![d1, d2],
                    q: Some(vec![q1, q2]),
                }
            } else {
                // the second most likely first token, then its most likely follower
                let d1 = p1[1].0;
                Draft {
                    tokens: vec![d1, p2[&d1][0].0],
                    q: None,
                }
            };
            *proposals
                .entry((draft.tokens[0], draft.tokens[1]))
                .or_default() += 1;
            s.cache.truncate(n - 1);
            let v = verify(&mut s, &mut sampler, &prompt, &draft).unwrap();
            let pair = match v.accepted {
                2 => (draft.tokens[0], draft.tokens[1]),
                1 => (draft.tokens[0], v.next),
                _ => {
                    let mut h = prompt.clone();
                    h.push(v.next);
                    let mut l = s
                        .model
                        .forward(&mut s.store, &mut s.cache, &[v.next], Logits::Last)
                        .unwrap();
                    (v.next, sampler.sample(&mut l, &h))
                }
            };
            *counts.entry(pair).or_default() += 1;
        }
        // 15 degrees of freedom: P(chi2 > 37.7) = 0.001
        let x = chi2(&counts, &joint, draws);
        eprintln!("sampled q {sampled_q}: chi2 {x:.2} over 16 cells");
        assert!(
            x < 37.7,
            "sampled q {sampled_q}: chi2 {x}, counts {counts:?}, p {joint:?}"
        );
        if sampled_q {
            // the test has power: the drafts' own distribution is far from the target's
            let mut off = proposals.clone();
            off.retain(|c, _| joint.iter().any(|e| e.0 == *c));
            let covered: u32 = off.values().sum();
            let y = chi2(&off, &joint, covered);
            assert!(y > 100.0, "drafts alone: chi2 {y}");
        }
    }
}

/// A draft source that always proposes `token`, free (like prompt lookup) or not (like a
/// draft model).
struct Always {
    token: u32,
    free: bool,
}

impl DraftSource for Always {
    fn name(&self) -> &'static str {
        "always"
    }
    fn draft(&mut self, _history: &[u32], k: usize) -> anyhow::Result<Draft> {
        Ok(Draft {
            tokens: vec![self.token; k],
            q: None,
        })
    }
    fn free(&self) -> bool {
        self.free
    }
}

/// "Never slower": on a streamed MoE target (every expert read on demand, so a verification
/// reads the union of its rows' experts), a source whose drafts are never accepted costs the
/// adaptive policy no verification and no byte over plain decoding, whether it drafts for
/// free or not (drafting reads nothing here), while a fixed draft length pays for every
/// rejected verification.
#[test]
fn adaptive_speculation_with_a_never_accepted_source_reads_what_plain_decoding_reads() {
    let path = gguf_path("qwen3_moe", "f32");
    let budget = Some(smallest_budget(&path));
    let prompt = repeated_prompt("qwen3_moe");
    let (want, ps) = gen(&mut session_at(&path, budget), &prompt, 32, &greedy(), None);
    // a token plain decoding never chooses: greedy, its drafts are never accepted
    let token = (0..).find(|t| !want.contains(t)).unwrap();
    for free in [true, false] {
        let src = Always { token, free };
        let mut sp = Speculator::new(Box::new(src), SpecConfig::default());
        let (got, st) = gen(
            &mut session_at(&path, budget),
            &prompt,
            32,
            &greedy(),
            Some(&mut sp),
        );
        assert_eq!(got, want, "free {free}");
        let sst = st.speculative.unwrap();
        assert_eq!(
            (
                sst.verify_passes,
                sst.plain_passes,
                sst.shadow_drafts,
                sst.shadow_bytes
            ),
            (0, 31, if free { 30 } else { 29 }, 0),
            "free {free}: every plain pass but the last shadow-drafts (the first, the baseline, \
             only for free): {sst:?}"
        );
        assert_eq!(st.decode_bytes, ps.decode_bytes, "free {free}");
    }
    let src = Always { token, free: true };
    let mut sp = Speculator::new(Box::new(src), fixed(2));
    let (got, st) = gen(
        &mut session_at(&path, budget),
        &prompt,
        32,
        &greedy(),
        Some(&mut sp),
    );
    assert_eq!(got, want);
    let sst = st.speculative.unwrap();
    assert_eq!((sst.verify_passes, sst.accepted), (30, 0), "{sst:?}");
    assert!(
        st.decode_bytes > ps.decode_bytes,
        "{} vs {}",
        st.decode_bytes,
        ps.decode_bytes
    );
}

/// A streamed MoE target with an expert cache and a resident spine: a verification cannot read
/// less than plain decoding for its tokens (an accepted draft's experts are its own plain
/// pass's misses, the rows' shared experts plain decoding's cache hits), so the adaptive
/// policy verifies nothing and reads exactly plain decoding's bytes, lookup's free shadow
/// drafts still judged; `--draft-fixed` still verifies, with the same output.
#[test]
fn adaptive_speculation_on_a_cached_moe_with_a_resident_spine_reads_what_plain_decoding_reads() {
    let path = gguf_path("qwen3_moe", "f32");
    let prompt = repeated_prompt("qwen3_moe");
    let mut budget = smallest_budget(&path);
    let (budget, cache) = loop {
        let s = session_at(&path, Some(budget));
        let cache = s.store.experts().map_or(0, |e| e.cache().budget());
        if s.model.placement().spine_streamed_bytes == 0 && cache > 0 {
            break (budget, cache);
        }
        budget += 64 << 10;
        assert!(
            budget < 64 << 20,
            "no budget with a resident spine and a cache"
        );
    };
    assert!(cache > 0, "{budget}");
    let (want, ps) = gen(
        &mut session_at(&path, Some(budget)),
        &prompt,
        32,
        &greedy(),
        None,
    );
    assert!(ps.decode_bytes > 0, "experts stream at {budget}");
    let mut sp = lookup();
    let (got, st) = gen(
        &mut session_at(&path, Some(budget)),
        &prompt,
        32,
        &greedy(),
        Some(&mut sp),
    );
    assert_eq!(got, want);
    let sst = st.speculative.unwrap();
    assert_eq!(st.decode_bytes, ps.decode_bytes, "{sst:?}");
    assert_eq!((sst.verify_passes, sst.plain_passes), (0, 31), "{sst:?}");
    assert!(
        sst.shadow_drafts > 0,
        "lookup's drafts are still judged: {sst:?}"
    );
    let mut sp = Speculator::new(Box::new(LookupDraft::default()), fixed(4));
    let (got, st) = gen(
        &mut session_at(&path, Some(budget)),
        &prompt,
        32,
        &greedy(),
        Some(&mut sp),
    );
    assert_eq!(got, want);
    assert!(st.speculative.unwrap().verify_passes > 0);
}
