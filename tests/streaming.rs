//! Streaming never changes the numbers: the demo model's logits are bit-identical whether every
//! weight is resident, some layers are, or everything (LM head included) is read from disk on
//! every forward pass; and a prompt batch gives the same logits as token-by-token decode.

mod common;

use deltafin::models::Logits;

const PROMPT: [u32; 10] = [2, 818, 94648, 25822, 563, 5628, 528, 506, 3207, 529];
const VOCAB: usize = 262144;

/// Logits of every prompt position (one batch), then of three greedy decode steps.
fn run(budget: Option<u64>, n_batch: usize) -> (Vec<f32>, Vec<u32>, String, u64) {
    let g = common::demo_model();
    let mut s = common::demo_session(&g, budget, 16, n_batch);
    let placement = s.model.placement().summary.clone();
    let mut all = s.prefill(&PROMPT, Logits::All).unwrap();
    let mut toks = Vec::new();
    for _ in 0..3 {
        let last = &all[all.len() - VOCAB..];
        let t = deltafin::engine::sampler::argmax(last) as u32;
        toks.push(t);
        let l = s
            .model
            .forward(&mut s.store, &mut s.cache, &[t], Logits::Last)
            .unwrap();
        all.extend_from_slice(&l);
    }
    let bytes = s.store.stats().snapshot().0;
    (all, toks, placement, bytes)
}

#[test]
fn logits_are_bit_identical_for_every_budget_and_batching() {
    let (resident, toks, p0, b0) = run(None, 16);
    assert_eq!(
        p0,
        "18/18 layers resident, LM head resident (tied to embeddings); device cpu"
    );
    // " Paris," is 9079, 236764 and the greedy continuation goes on with " France".
    assert_eq!(toks, vec![9079, 236764, 7001]);
    assert_eq!(b0 % 4096, 0);
    let resident_load = b0;

    // 12 MiB: room for the KV cache, activations and two stream buffers only.
    let (streamed, _, p1, b1) = run(Some(12 << 20), 16);
    assert_eq!(
        p1,
        "0/18 layers resident, LM head streamed (tied to embeddings); device cpu"
    );
    // 1 prompt pass + 3 decode passes, each reading every weight (~235 MiB)
    assert!(b1 > (4 * 230) << 20, "streamed only {b1} bytes");
    assert!(b1 < resident_load * 5, "streamed {b1} bytes");

    // 64 MiB: some layers resident, the LM head streamed.
    let (partial, _, p2, _) = run(Some(64 << 20), 16);
    assert_eq!(
        p2,
        "15/18 layers resident, LM head streamed (tied to embeddings); device cpu"
    );

    // prompt fed one token per forward pass
    let (one_by_one, _, _, _) = run(Some(64 << 20), 1);

    for (name, other) in [
        ("streamed", &streamed),
        ("partial", &partial),
        ("batch of 1", &one_by_one),
    ] {
        assert_eq!(other.len(), resident.len());
        let diff = resident
            .iter()
            .zip(other.iter())
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(
            diff, 0,
            "{name}: {diff} logits differ from the all-resident run"
        );
    }
}

#[test]
fn a_read_error_mid_run_ends_the_pass_with_the_file_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    std::fs::copy(common::demo_gguf(), &path).unwrap();
    let g = deltafin::source::gguf::GgufModel::open(&path).unwrap();
    let mut s = common::demo_session(&g, Some(12 << 20), 16, 16);
    s.prefill(&PROMPT[..4], Logits::Last).unwrap();
    // the file loses its tail (the last layers) while the session runs
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(200 << 20).unwrap();
    let e = s.prefill(&PROMPT[4..], Logits::Last).unwrap_err();
    let msg = format!("{e:#}");
    assert!(
        msg.contains("model.gguf") && msg.contains("short read"),
        "{msg}"
    );
    // the session stays sound: the next pass fails the same way instead of hanging
    let e = s.prefill(&PROMPT[4..], Logits::Last).unwrap_err();
    assert!(format!("{e:#}").contains("model.gguf"), "{e:#}");
}
