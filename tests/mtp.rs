//! Multi-token prediction (`--draft mtp`; src/models/mtp_layer.rs, src/models/mtp_decoder.rs,
//! src/engine/draft_mtp.rs) on the `deepseek_v3_mtp` fixture (tools/reference/hf_fixtures.py:
//! the `deepseek_v3` target plus a layer 3 written by the script, with a torch reference of its
//! forward pass): the layer's logits equal the reference, resident and streamed; greedy
//! decoding with `--draft mtp` equals plain decoding token for token, resident and streamed, in
//! the library and the CLI, which reports the source's statistics; a layer without its own
//! `shared_head.head` or `embed_tokens` uses the target's LM head or embeddings; a model without
//! the layer is refused with a clear error.

mod common;

use common::hf::{f32s, fixture, reference, rel_diff, u32s, REL_TOL};
use deltafin::engine::draft_mtp::MtpDraft;
use deltafin::engine::{GenerateOptions, Sampler, SamplerConfig, Session, SpecConfig, Speculator};
use deltafin::models::{load_hf, LoadOptions, Logits};
use std::path::Path;

const NAME: &str = "deepseek_v3_mtp";

fn opts(ram_budget: Option<u64>, mtp: bool) -> LoadOptions {
    LoadOptions {
        ram_budget,
        n_ctx: 128,
        n_batch: 128,
        direct_io: true,
        mtp,
        ..Default::default()
    }
}

fn session(ram_budget: Option<u64>, mtp: bool) -> Session {
    session_of(&fixture(NAME), ram_budget, mtp)
}

/// [`session`] over the checkpoint folder `dir`.
fn session_of(dir: &Path, ram_budget: Option<u64>, mtp: bool) -> Session {
    let (m, s) = load_hf(dir, &opts(ram_budget, mtp)).unwrap();
    Session::new(m, s, 128, 128)
}

/// The smallest budget (4 KiB steps) under which the model with its MTP layer loads: every
/// spine unit and expert streamed.
fn smallest_budget() -> u64 {
    smallest_budget_of(&fixture(NAME))
}

/// [`smallest_budget`] of the checkpoint folder `dir`.
fn smallest_budget_of(dir: &Path) -> u64 {
    let mut b = 4 << 10;
    loop {
        match load_hf(dir, &opts(Some(b), true)) {
            Ok((m, _)) => {
                let p = m.placement();
                assert_eq!(p.resident_bytes, 0, "{}", p.summary);
                return b;
            }
            Err(e) => assert!(e.to_string().contains("is too small"), "{e}"),
        }
        b += 4 << 10;
        assert!(b < 64 << 20, "no budget works");
    }
}

fn greedy() -> SamplerConfig {
    SamplerConfig {
        temperature: 0.0,
        ..Default::default()
    }
}

#[test]
fn mtp_logits_match_the_reference() {
    let r = &reference(NAME)["mtp_reference"];
    let ids = u32s(&r["ids"]);
    let t = ids.len();
    for budget in [None, Some(smallest_budget())] {
        let mut s = session(budget, true);
        let p = s.model.placement().summary.clone();
        // the MTP block, its head and its embeddings: three more spine-class units, 8 experts
        assert!(
            p.contains("6/6 layers and 24/24 experts resident") || budget.is_some(),
            "{p}"
        );
        assert!(p.contains(", multi-token-prediction layer loaded"), "{p}");
        s.prefill(&ids, Logits::Last).unwrap();
        // the target's hidden states before the final norm, every position
        let hid = &s.cache.hidden;
        assert_eq!((hid.pos0, hid.len()), (0, t), "{budget:?}");
        let last = f32s(&r["hidden_last"]);
        assert!(rel_diff(hid.row(t - 1).unwrap(), &last) < REL_TOL);
        let rows = hid.rows[..(t - 1) * 64].to_vec();
        let mtp = s.model.mtp().expect("loaded with its MTP layer");
        let mut cache = mtp.new_mtp_cache(128);
        let out = mtp
            .forward_mtp(&mut s.store, &mut cache, &rows, &ids[1..], Logits::All)
            .unwrap();
        let v = 512;
        assert_eq!(
            (out.logits.len(), out.hidden.len(), cache.len),
            ((t - 1) * v, (t - 1) * 64, t - 1)
        );
        let mut worst = 0f32;
        for (i, pos) in r["positions"].as_array().unwrap().iter().enumerate() {
            let (top, want) = (u32s(&pos["ids"]), f32s(&pos["logits"]));
            let got: Vec<f32> = top
                .iter()
                .map(|&id| out.logits[i * v + id as usize])
                .collect();
            worst = worst.max(rel_diff(&got, &want));
            assert_eq!(
                common::hf::argmax(&out.logits[i * v..(i + 1) * v]),
                top[0],
                "row {i}"
            );
        }
        for (i, row) in r["full_rows"].as_object().unwrap() {
            let i: usize = i.parse().unwrap();
            worst = worst.max(rel_diff(&out.logits[i * v..(i + 1) * v], &f32s(row)));
        }
        assert!(worst < REL_TOL, "{budget:?}: {worst}");
        // one chained step: the layer's own hidden state with its own draft
        let tok = r["chain"]["token"].as_u64().unwrap() as u32;
        assert_eq!(common::hf::argmax(&out.logits[(t - 2) * v..]), tok);
        let h = &out.hidden[(t - 2) * 64..];
        let o2 = mtp
            .forward_mtp(&mut s.store, &mut cache, h, &[tok], Logits::Last)
            .unwrap();
        let d = rel_diff(&o2.logits, &f32s(&r["chain"]["logits"]));
        assert!(d < REL_TOL, "{budget:?}: chained step {d}");
    }
}

/// `n` greedy tokens after `prompt`, through `spec` when given.
fn gen(s: &mut Session, prompt: &[u32], n: usize, spec: Option<&mut Speculator>) -> Vec<u32> {
    gen_stats(s, prompt, n, spec).0
}

/// [`gen`] with the generation's statistics.
fn gen_stats(
    s: &mut Session,
    prompt: &[u32],
    n: usize,
    spec: Option<&mut Speculator>,
) -> (Vec<u32>, deltafin::engine::GenStats) {
    let never = |_: u32| false;
    let o = GenerateOptions {
        max_tokens: n,
        stop: &[],
        is_eog: &never,
        cancel: None,
    };
    let mut sampler = Sampler::new(greedy());
    s.cache.clear();
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
    (ids, st)
}

/// The adaptive policy on a streamed target whose MTP drafts are (nearly) never right (random
/// weights): the layer's experts stream, so each shadow draft costs bytes, and the policy makes
/// them only within its probe budget (`spec_policy::PROBE_SHARE` of the bytes read so far,
/// plus the first draft's). The byte counts are deterministic.
#[test]
fn adaptive_mtp_on_a_streamed_target_stays_within_the_probe_budget() {
    let prompt = u32s(&reference(NAME)["prompt_ids"]);
    let n = 64;
    let b = smallest_budget();
    let (plain, ps) = gen_stats(&mut session(Some(b), true), &prompt, n, None);
    let mut s = session(Some(b), true);
    let mut sp = Speculator::new(
        Box::new(MtpDraft::new(&s, &greedy()).unwrap()),
        SpecConfig::default(),
    );
    let (got, st) = gen_stats(&mut s, &prompt, n, Some(&mut sp));
    assert_eq!(got, plain);
    let sp = st.speculative.unwrap();
    assert_eq!(st.prefill_bytes, ps.prefill_bytes);
    let extra = st.decode_bytes - ps.decode_bytes;
    let first = sp.shadow_bytes / sp.shadow_drafts.max(1);
    assert!(
        extra as f64 <= 0.02 * st.decode_bytes as f64 + first as f64,
        "{extra} extra bytes over {}: {sp:?}",
        ps.decode_bytes
    );
    // one shadow draft, the first (its catch-up pass over the prompt streams the layer's
    // spine, head and experts: 2.7 MiB here, where nothing is resident); no verification
    assert_eq!(
        (sp.verify_passes, sp.plain_passes, sp.shadow_drafts),
        (0, 63, 1)
    );
    assert_eq!(
        sp.plain_bytes, ps.decode_bytes,
        "plain passes read what plain decoding reads"
    );
    assert_eq!(
        (ps.decode_bytes, extra, sp.shadow_bytes),
        (19353600, 2858336, 2858336)
    );
}

#[test]
fn greedy_mtp_equals_plain_decoding() {
    let r = reference(NAME);
    let prompt = u32s(&r["prompt_ids"]);
    let want = u32s(&r["continuation_ids"]);
    let n = 24;
    // the target without its MTP layer: the reference continuation
    let plain = gen(&mut session(None, false), &prompt, n, None);
    assert_eq!(plain[..want.len()], want[..]);
    for budget in [None, Some(smallest_budget())] {
        let mut s = session(budget, true);
        assert_eq!(
            gen(&mut s, &prompt, n, None),
            plain,
            "{budget:?}: plain with the MTP layer"
        );
        for cfg in [
            SpecConfig::default(),
            SpecConfig {
                draft_max: 3,
                draft_min: 1,
                adaptive: false,
            },
        ] {
            let mut sp =
                Speculator::new(Box::new(MtpDraft::new(&s, &greedy()).unwrap()), cfg.clone());
            let got = gen(&mut s, &prompt, n, Some(&mut sp));
            assert_eq!(got, plain, "{budget:?} {cfg:?}");
            let st = &sp.stats;
            assert_eq!(st.source, "mtp");
            assert!(st.accepted <= st.drafted, "{st:?}");
            if !cfg.adaptive {
                assert!(st.drafted > 0 && st.verify_passes > 0, "{st:?}");
            }
            assert_eq!(st.verify_tokens + st.plain_passes, n as u64 - 1, "{st:?}");
            if !cfg.adaptive {
                // every step verifies but the last, which has one token left to make
                assert_eq!(st.plain_passes, 1, "{st:?}");
            }
        }
    }
}

fn deltafin(args: &[&str]) -> std::process::Output {
    common::output_or_kill(std::process::Command::new(env!("CARGO_BIN_EXE_deltafin")).args(args))
}

#[test]
fn cli_draft_mtp_keeps_the_output_and_reports_the_source() {
    let dir = tempfile::tempdir().unwrap();
    let model = fixture(NAME);
    let text = reference(NAME)["prompt_text"].as_str().unwrap().to_string();
    let budget = smallest_budget().to_string();
    for b in [None, Some(budget.as_str())] {
        let mut base = vec![
            "run",
            "-m",
            model.to_str().unwrap(),
            "-p",
            &text,
            "-n",
            "20",
            "--temp",
            "0",
        ];
        if let Some(b) = b {
            base.extend(["--ram-budget", b]);
        }
        let plain = deltafin(&base);
        assert!(
            plain.status.success(),
            "{}",
            String::from_utf8_lossy(&plain.stderr)
        );
        let json = dir.path().join("mtp.json");
        let mut args = base.clone();
        args.extend(["--draft", "mtp", "--draft-max", "2", "--draft-fixed"]);
        args.extend(["--stats-json", json.to_str().unwrap()]);
        let o = deltafin(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(o.stdout, plain.stdout, "{b:?}");
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let sp = &v["speculative"];
        assert_eq!(sp["source"], "mtp", "{sp}");
        let (drafted, accepted, passes) = (
            sp["drafted"].as_u64().unwrap(),
            sp["accepted"].as_u64().unwrap(),
            sp["verify_passes"].as_u64().unwrap(),
        );
        let gen = v["generated_tokens"].as_u64().unwrap();
        assert!(accepted <= drafted && passes > 0, "{sp}");
        let plain_passes = sp["plain_passes"].as_u64().unwrap();
        assert_eq!(
            sp["verify_tokens"].as_u64().unwrap() + plain_passes,
            gen - 1,
            "{sp}"
        );
        // two drafts per verification but where fewer tokens were left to generate
        assert!(drafted <= 2 * passes && drafted + 1 >= 2 * passes, "{sp}");
        if b.is_some() {
            assert!(sp["verify_bytes"].as_u64().unwrap() > 0, "streamed: {sp}");
        }
    }
}

#[test]
fn draft_mtp_on_a_model_without_the_layer_is_refused() {
    // `deepseek_v3` says num_nextn_predict_layers = 1 but ships no layer 3 (transformers drops
    // it); `llama` has no such layer at all
    for name in ["deepseek_v3", "llama"] {
        let m = fixture(name);
        let o = deltafin(&[
            "run",
            "-m",
            m.to_str().unwrap(),
            "-p",
            "hi",
            "-n",
            "2",
            "--draft",
            "mtp",
        ]);
        assert!(!o.status.success(), "{name}");
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(
            e.contains("error: --draft mtp needs a model with a multi-token-prediction layer")
                && e.contains("but this model has none; use --lookup or --draft-model instead"),
            "{name}: {e}"
        );
    }
    let o = deltafin(&["run", "-m", "x", "-p", "hi", "--draft", "mtp", "--lookup"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot be used with"));
}

const HEAD: &str = "model.layers.3.shared_head.head.weight";
const EMBED: &str = "model.layers.3.embed_tokens.weight";

/// What a copy of the fixture ([`variant`]) holds as one of the MTP layer's own tensors.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Own {
    /// The fixture's own tensor.
    Kept,
    /// The target's counterpart under the layer's name (`lm_head.weight` as `shared_head.head`,
    /// `model.embed_tokens.weight` as `embed_tokens`).
    Target,
    /// None: the layer falls back to the target's.
    Absent,
}

/// A copy of the fixture whose MTP layer's `shared_head.head` and `embed_tokens` are as
/// `head` and `embed` say (the file rewritten with the `safetensors` crate; the rest as is).
fn variant(head: Own, embed: Own) -> tempfile::TempDir {
    let dir = common::hf::edited_copy(NAME, |_| {});
    let p = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut out = Vec::new();
    for (name, view) in st.tensors() {
        let (which, target) = match name.as_str() {
            HEAD => (head, "lm_head.weight"),
            EMBED => (embed, "model.embed_tokens.weight"),
            _ => {
                out.push((name, view));
                continue;
            }
        };
        match which {
            Own::Kept => out.push((name, view)),
            Own::Target => out.push((name, st.tensor(target).unwrap())),
            Own::Absent => {}
        }
    }
    let n = out.len();
    std::fs::write(&p, safetensors::serialize(out, None).unwrap()).unwrap();
    let absent = [head, embed].iter().filter(|&&o| o == Own::Absent).count();
    assert_eq!(n + absent, st.len());
    dir
}

/// The MTP layer's logits (bits) over the reference ids (`Logits::All`, entry `i` from the
/// target's `h_i` and token `i + 1`), then those of one chained step (its own last hidden
/// state and its own draft), with the model's placement summary.
fn mtp_logit_bits(dir: &Path, budget: Option<u64>) -> (Vec<u32>, String) {
    let ids = u32s(&reference(NAME)["mtp_reference"]["ids"]);
    let t = ids.len();
    let mut s = session_of(dir, budget, true);
    s.prefill(&ids, Logits::Last).unwrap();
    let rows = s.cache.hidden.rows[..(t - 1) * 64].to_vec();
    let mtp = s.model.mtp().expect("loaded with its MTP layer");
    let mut cache = mtp.new_mtp_cache(128);
    let out = mtp
        .forward_mtp(&mut s.store, &mut cache, &rows, &ids[1..], Logits::All)
        .unwrap();
    let v = 512;
    let tok = common::hf::argmax(&out.logits[(t - 2) * v..]);
    let h = &out.hidden[(t - 2) * 64..];
    let chained = mtp
        .forward_mtp(&mut s.store, &mut cache, h, &[tok], Logits::Last)
        .unwrap();
    let bits = out.logits.iter().chain(&chained.logits);
    (
        bits.map(|x| x.to_bits()).collect(),
        s.model.placement().summary.clone(),
    )
}

/// A layer without its own `shared_head.head` uses the target's LM head, one without its own
/// `embed_tokens` the target's embeddings: its logits are bit for bit those of a layer that
/// carries copies of the target's tensors under its own names (loaded as its own units),
/// resident and streamed (each fallback plans and reads the target's units), and differ from
/// the fixture's (whose own tensors are not the target's).
#[test]
fn mtp_head_and_embeddings_fall_back_to_the_targets() {
    use Own::*;
    let (own, own_summary) = mtp_logit_bits(&fixture(NAME), None);
    for (head, embed) in [(Target, Kept), (Kept, Target), (Target, Target)] {
        let drop = |o: Own| if o == Target { Absent } else { o };
        let copies = variant(head, embed);
        let fallback = variant(drop(head), drop(embed));
        // spine-class units: the 3 layers, the MTP block, and its own head and embeddings
        // (one chunk each) where the checkpoint has them
        let units = 4 + [drop(head), drop(embed)]
            .iter()
            .filter(|&&o| o != Absent)
            .count();
        for streamed in [false, true] {
            let at = |d: &Path| streamed.then(|| smallest_budget_of(d));
            let (want, s1) = mtp_logit_bits(copies.path(), at(copies.path()));
            let (got, s2) = mtp_logit_bits(fallback.path(), at(fallback.path()));
            assert_eq!(got.len(), 52 * 512 + 512);
            assert!(got == want, "{head:?} {embed:?} streamed {streamed}");
            assert!(
                got != own,
                "{head:?} {embed:?}: the fixture's own tensors differ"
            );
            let (k, m) = if streamed { (0, 0) } else { (1, 24) };
            let head1 = format!("{}/6 layers and {m}/24 experts resident", 6 * k);
            let head2 = format!("{}/{units} layers and {m}/24 experts resident", units * k);
            assert!(s1.starts_with(&head1), "{s1}");
            assert!(s2.starts_with(&head2), "{s2}");
            assert!(s2.contains("multi-token-prediction layer loaded"), "{s2}");
        }
    }
    assert!(own_summary.starts_with("6/6 layers"), "{own_summary}");
}

/// Greedy `--draft mtp` (3 drafts per verification) on the fallback variants equals plain
/// decoding (the reference continuation), resident and streamed.
#[test]
fn greedy_mtp_with_fallback_head_or_embeddings_equals_plain_decoding() {
    use Own::*;
    let r = reference(NAME);
    let prompt = u32s(&r["prompt_ids"]);
    let want = u32s(&r["continuation_ids"]);
    let n = want.len();
    let cfg = SpecConfig {
        draft_max: 3,
        draft_min: 1,
        adaptive: false,
    };
    for (head, embed) in [(Absent, Kept), (Kept, Absent), (Absent, Absent)] {
        let dir = variant(head, embed);
        for budget in [None, Some(smallest_budget_of(dir.path()))] {
            let mut s = session_of(dir.path(), budget, true);
            let mut sp =
                Speculator::new(Box::new(MtpDraft::new(&s, &greedy()).unwrap()), cfg.clone());
            let got = gen(&mut s, &prompt, n, Some(&mut sp));
            assert_eq!(got, want, "{head:?} {embed:?} {budget:?}");
            let st = &sp.stats;
            assert_eq!(st.source, "mtp");
            // 16 tokens: the first from the prompt, 14 verifications of 3 drafts but the
            // last (2 left), none accepted (random weights), then one plain pass
            assert_eq!(
                (st.drafted, st.accepted, st.verify_passes, st.plain_passes),
                (39, 0, 14, 1),
                "{head:?} {embed:?} {budget:?}"
            );
        }
    }
}
