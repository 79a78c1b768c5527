//! DeepSeek V3 Hugging Face checkpoints against transformers 5.24 (float32, eager): the
//! committed fixtures `tests/fixtures/hf/deepseek_v3` (bf16) and `deepseek_v3_fp8` (FP8 E4M3
//! with 128×128 `weight_scale_inv`, referenced on the same dequantized values; see
//! tools/reference/README.md).
//!
//! Tolerance: both fixtures use the 1e-4 relative bound of the other HF families. The FP8
//! reference runs transformers on exactly the values `f32(e4m3) · scale` that Deltafin decodes
//! (one f32 rounding each, the same on both sides), so FP8 adds no error of its own; what is
//! left is f32 summation order, including the latent (absorbed) attention.

mod common;

use common::hf::*;
use deltafin::models::Logits;
use serde_json::Value;

/// What the fixtures meet besides the suite-wide 1e-4 ([`REL_TOL`]): f32 summation order only.
const TIGHT: f32 = 5e-6;

#[test]
fn bf16_logits_match_transformers() {
    let (_, last, worst) = check_logits("deepseek_v3", None);
    eprintln!("deepseek_v3: last rel {last:e}, top-10 worst rel {worst:e}");
    // measured 5.5e-7 (last, full vocabulary) and 7.0e-7 (worst top-10 of 37 positions)
    assert!(last < TIGHT && worst < TIGHT, "{last} {worst}");
}

#[test]
fn fp8_logits_match_transformers() {
    let (_, last, worst) = check_logits("deepseek_v3_fp8", None);
    eprintln!("deepseek_v3_fp8: last rel {last:e}, top-10 worst rel {worst:e}");
    // measured 4.9e-7 (last) and 6.7e-7 (worst top-10)
    assert!(last < TIGHT && worst < TIGHT, "{last} {worst}");
}

#[test]
fn greedy_continuations_match() {
    greedy("deepseek_v3");
    greedy("deepseek_v3_fp8");
}

#[test]
fn streaming_everything_gives_identical_logits() {
    for name in ["deepseek_v3", "deepseek_v3_fp8"] {
        let (resident, _, _) = check_logits(name, None);
        let b = smallest_budget(name);
        let (streamed, _, _) = check_logits(name, Some(b));
        assert!(resident == streamed, "{name}: streamed logits differ");
    }
}

#[test]
fn token_by_token_equals_one_batch() {
    for name in ["deepseek_v3", "deepseek_v3_fp8"] {
        let ids = u32s(&reference(name)["prompt_ids"]);
        let all = session(name, None).prefill(&ids, Logits::All).unwrap();
        let vocab = all.len() / ids.len();
        let mut s = session(name, None);
        for (i, &t) in ids.iter().enumerate() {
            let l = s
                .model
                .forward(&mut s.store, &mut s.cache, &[t], Logits::Last)
                .unwrap();
            assert!(
                l[..] == all[i * vocab..(i + 1) * vocab],
                "{name}: position {i} differs"
            );
        }
        let mut s = session(name, None);
        s.n_batch = 5;
        let chunked = s.prefill(&ids, Logits::Last).unwrap();
        assert!(chunked[..] == all[all.len() - vocab..], "{name}: chunked");
    }
}

#[test]
fn the_cache_holds_the_compressed_latent() {
    let mut s = session("deepseek_v3", None);
    // 3 layers × (kv_lora_rank 16 + qk_rope_head_dim 8) floats a position, no V; memory for
    // the positions written (128 at most), none before the first pass
    assert_eq!(s.cache.kv_dim, 24);
    assert_eq!(s.cache.k.len(), 3);
    assert!(s.cache.k.iter().all(|k| k.is_empty()));
    s.prefill(&[1, 2, 3, 4, 5], Logits::Last).unwrap();
    assert!(s.cache.k.iter().all(|k| k.len() == 5 * 24));
    assert!(s.cache.v.iter().all(|v| v.is_empty()));
    assert_eq!(s.model.placement().kv_bytes, 3 * 128 * 24 * 4);
}

#[test]
fn one_streamed_decode_step_reads_only_the_chosen_experts() {
    // bf16 expert: 3 tensors of 64 × 32 bf16 = 4 KiB each, adjacent in the file: one range of
    // 12 KiB whose aligned span is 12-16 KiB. fp8 expert: 3 × 2 KiB E4M3 weights, adjacent, and
    // their 3 f32 scales, adjacent elsewhere (safetensors groups tensors by dtype): two ranges,
    // aligned spans of 8-12 KiB and 4-8 KiB.
    for (name, ranges, min_expert) in [("deepseek_v3", 1, 12288u64), ("deepseek_v3_fp8", 2, 12288)]
    {
        let r = reference(name);
        let ids = u32s(&r["prompt_ids"]);
        let mut s = session(name, Some(smallest_budget(name)));
        s.prefill(&ids, Logits::Last).unwrap();
        let before = s.store.stats().snapshot();
        let t = u32s(&r["continuation_ids"])[0];
        s.model
            .forward(&mut s.store, &mut s.cache, &[t], Logits::Last)
            .unwrap();
        let after = s.store.stats().snapshot();
        let (read, reads) = (after.0 - before.0, after.1 - before.1);
        let all: u64 = (0..s.store.len())
            .filter(|&i| !s.store.is_resident(i))
            .map(|i| s.store.unit(i).buffer_bytes() as u64)
            .sum();
        // 2 MoE layers × 8 experts, top-2: 12 expert reads skipped
        assert!(
            read > 0 && read + 12 * min_expert <= all,
            "{name}: read {read} of {all}"
        );
        // units: 3 spine units, 16 experts (3..19), then the LM head chunks
        assert!(
            (3..19).all(|u| s.store.unit(u).ranges.len() == ranges),
            "{name}"
        );
        // reads issued: 1 embedding row, one per range of the 3 spine units (byte-adjacent
        // tensors merged), one per range of 2 experts in each of 2 layers (the expert store
        // reads each range at once), the LM head chunks
        let spine: u64 = (0..3).map(|u| s.store.unit(u).ranges.len() as u64).sum();
        let head_chunks = (s.store.len() - 19) as u64;
        assert_eq!(
            reads,
            1 + spine + 4 * ranges as u64 + head_chunks,
            "{name}: reads"
        );
        // the spine's tensors (8 matrices in the dense layer, 9 with the router in the MoE
        // layers; FP8 ones with their scales) lie in a few runs of the file, not one each
        let tensors = if name.ends_with("fp8") {
            2 * 8 + (2 * 8 + 1) * 2
        } else {
            8 + 9 * 2
        };
        assert!(
            spine < tensors / 2,
            "{name}: {spine} spine reads for {tensors} tensors"
        );
    }
}

#[test]
fn fp8_weights_stay_in_their_stored_size() {
    use deltafin::quant::GgmlType;
    let s = session("deepseek_v3_fp8", None);
    let hf = deltafin::source::hf::HfModel::open(&fixture("deepseek_v3_fp8")).unwrap();
    let of = |ty: GgmlType| hf.tensors.iter().filter(move |t| t.ty == ty);
    // stored: E4M3 bytes + f32 block scales
    let fp8: u64 = of(GgmlType::F8_E4M3).map(|t| t.n_bytes).sum();
    let scales: u64 = hf
        .tensors
        .iter()
        .filter(|t| t.name.ends_with("weight_scale_inv"))
        .map(|t| t.n_bytes)
        .sum();
    // repacked: one f32 per row and 128-column block (here every matrix has <= 128 columns:
    // 4 bytes per row, 6.3% on 64 columns; 3.1% on real DeepSeek V3 shapes)
    let packed: u64 = of(GgmlType::F8_E4M3)
        .map(|t| t.shape[1] * (t.shape[0] + 4 * t.shape[0].div_ceil(128)))
        .sum();
    assert_eq!((fp8, scales, packed), (225_792, 324, 244_384));
    // resident: the repacked matrices plus the bf16 tensors of the units (embeddings, LM
    // head, 2 routers; norms are held apart), each of the 21 units rounded up to 4 KiB
    let plain: u64 = 2 * 512 * 64 * 2 + 2 * 8 * 64 * 2;
    let r = s.model.placement().resident_bytes as u64;
    assert!(
        r >= packed + plain && r <= packed + plain + 21 * 4096,
        "resident {r}"
    );
}

#[test]
fn load_errors_name_the_tensor_or_field() {
    // a config field out of range
    let d = edited_copy("deepseek_v3", |c| c["n_group"] = 3.into());
    assert_eq!(
        load_err(d.path()),
        format!(
            "{}: 'n_routed_experts' = 8 is not a multiple of 'n_group' = 3",
            d.path().join("config.json").display()
        )
    );
    // a wrong shape
    let d = edited_copy("deepseek_v3", |c| c["kv_lora_rank"] = 32.into());
    assert_eq!(
        load_err(d.path()),
        format!(
            "{}: tensor 'model.layers.0.self_attn.kv_a_proj_with_mqa.weight' has shape [24, 64], expected [40, 64]",
            d.path().display()
        )
    );
    // q_lora_rank null: q_proj expected
    let d = edited_copy("deepseek_v3", |c| c["q_lora_rank"] = Value::Null);
    assert_eq!(
        load_err(d.path()),
        format!(
            "{}: tensor 'model.layers.0.self_attn.q_proj.weight' is missing",
            d.path().display()
        )
    );
    // a removed tensor, and an FP8 weight without its scales
    for (name, gone, msg) in [
        (
            "deepseek_v3",
            "model.layers.2.mlp.experts.5.up_proj.weight",
            "tensor 'model.layers.2.mlp.experts.5.up_proj.weight' is missing",
        ),
        (
            "deepseek_v3_fp8",
            "model.layers.1.self_attn.kv_b_proj.weight_scale_inv",
            "tensor 'model.layers.1.self_attn.kv_b_proj.weight_scale_inv' is missing (FP8 weight 'model.layers.1.self_attn.kv_b_proj.weight' needs its block scales)",
        ),
    ] {
        let d = edited_copy(name, |_| {});
        let p = d.path().join("model.safetensors");
        let bytes = std::fs::read(&p).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let kept: Vec<(String, safetensors::tensor::TensorView)> = st
            .tensors()
            .into_iter()
            .filter(|(n, _)| n != gone)
            .collect();
        std::fs::write(&p, safetensors::serialize(kept, None).unwrap()).unwrap();
        assert_eq!(load_err(d.path()), format!("{}: {msg}", d.path().display()));
    }
    // an unsupported quantization
    let d = edited_copy("deepseek_v3_fp8", |c| {
        c["quantization_config"]["weight_block_size"] = serde_json::json!([64, 64])
    });
    let e = load_err(d.path());
    assert!(
        e.contains("'quantization_config'") && e.contains("weight_block_size [128, 128]"),
        "{e}"
    );
}

#[test]
fn cli_run_and_inspect() {
    let run = |args: &[&str]| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_deltafin"))
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    // the fixture's user message through the chat template; greedy: the reference's first 8
    // tokens (the FP8 ones all lie inside the tokenizer's 493 tokens; the bf16 continuation
    // holds padded-vocabulary ids, which have no text)
    let small = smallest_budget("deepseek_v3_fp8").to_string();
    for (name, budget) in [
        ("deepseek_v3_fp8", None),
        ("deepseek_v3_fp8", Some(small.as_str())),
    ] {
        let r = reference(name);
        let model = fixture(name);
        let mut args = vec![
            "run",
            "-m",
            model.to_str().unwrap(),
            "--chat",
            "-p",
            "Which experts does the router keep for café? Answer in 3 words.",
            "-n",
            "8",
            "--temp",
            "0",
        ];
        if let Some(b) = budget {
            args.extend_from_slice(&["--ram-budget", b]);
        }
        let text = run(&args);
        let tok = tokenizers::Tokenizer::from_file(model.join("tokenizer.json")).unwrap();
        let want = tok
            .decode(&u32s(&r["continuation_ids"])[..8], false)
            .unwrap();
        assert_eq!(text, format!("{want}\n"), "{name} {budget:?}");
    }
    let model = fixture("deepseek_v3");
    run(&[
        "run",
        "-m",
        model.to_str().unwrap(),
        "-p",
        "café",
        "-n",
        "8",
        "--temp",
        "0",
    ]);
    let out = run(&["inspect", "-m", model.to_str().unwrap()]);
    assert!(out.contains("architecture: deepseek_v3"), "{out}");
    // 2 MoE layers × 8 experts × 3 × 64 × 32 × 2 bytes
    assert!(out.contains("experts:      196608 bytes"), "{out}");
    assert!(
        out.contains("per expert:   12288 bytes (0.0 MiB) (8 experts in each of 2 MoE layers)"),
        "{out}"
    );
}

/// Rewrites `model.safetensors` of a fixture copy: `edit` may change each tensor's bytes (by
/// name and row length in bytes); `extra` tensors are added.
fn rewrite(
    dir: &std::path::Path,
    edit: impl Fn(&str, usize, &mut Vec<u8>),
    extra: &[(&str, Vec<usize>, Vec<u8>)],
) {
    use safetensors::tensor::TensorView;
    let p = dir.join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut owned: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, t)| {
            let mut b = t.data().to_vec();
            let row = b.len() / t.shape()[0];
            edit(&n, row, &mut b);
            (n, t.dtype(), t.shape().to_vec(), b)
        })
        .collect();
    for (n, s, b) in extra {
        owned.push((
            n.to_string(),
            safetensors::Dtype::BF16,
            s.clone(),
            b.clone(),
        ));
    }
    let views: Vec<(String, TensorView)> = owned
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    std::fs::write(&p, safetensors::serialize(views, None).unwrap()).unwrap();
}

#[test]
fn neox_rope_layout_equals_interleaved_with_permuted_rows() {
    // With `rope_interleave: false` the rotary pairs are (i, i + 4) instead of (2i, 2i + 1);
    // moving rotary row 2i to i and 2i + 1 to 4 + i in q_b_proj (per head: rows 16..24 of
    // 24) and kv_a_proj_with_mqa (rows 16..24) gives the same model, bit for bit.
    let name = "deepseek_v3";
    let ids = u32s(&reference(name)["prompt_ids"]);
    let want = session(name, None).prefill(&ids, Logits::All).unwrap();
    let d = edited_copy(name, |c| c["rope_interleave"] = Value::Bool(false));
    let permute = |b: &mut Vec<u8>, row: usize, first: usize| {
        let old = b.clone();
        for i in 0..4 {
            for (to, from) in [
                (first + i, first + 2 * i),
                (first + 4 + i, first + 2 * i + 1),
            ] {
                b[to * row..(to + 1) * row].copy_from_slice(&old[from * row..(from + 1) * row]);
            }
        }
    };
    rewrite(
        d.path(),
        |n, row, b| {
            if n.ends_with("q_b_proj.weight") {
                (0..4).for_each(|h| permute(b, row, 24 * h + 16));
            } else if n.ends_with("kv_a_proj_with_mqa.weight") {
                permute(b, row, 16);
            }
        },
        &[],
    );
    let opts = deltafin::models::LoadOptions {
        ram_budget: None,
        n_ctx: 128,
        n_batch: 128,
        direct_io: true,
        ..Default::default()
    };
    let (m, st) = deltafin::models::load_hf(d.path(), &opts).unwrap();
    let mut s = deltafin::engine::Session::new(m, st, 128, 128);
    let got = s.prefill(&ids, Logits::All).unwrap();
    assert!(got == want, "neox layout differs");
}

#[test]
fn multi_token_prediction_layers_are_ignored_and_reported() {
    let name = "deepseek_v3";
    let ids = u32s(&reference(name)["prompt_ids"]);
    let want = session(name, None).prefill(&ids, Logits::Last).unwrap();
    let d = edited_copy(name, |_| {});
    // a layer 3 (num_nextn_predict_layers = 1) as published checkpoints store it
    rewrite(
        d.path(),
        |_, _, _| {},
        &[
            ("model.layers.3.enorm.weight", vec![64], vec![0; 128]),
            (
                "model.layers.3.eh_proj.weight",
                vec![64, 128],
                vec![0; 16384],
            ),
        ],
    );
    let opts = deltafin::models::LoadOptions {
        ram_budget: None,
        n_ctx: 128,
        n_batch: 128,
        direct_io: true,
        ..Default::default()
    };
    let (m, st) = deltafin::models::load_hf(d.path(), &opts).unwrap();
    assert_eq!(
        m.placement().summary,
        "3/3 layers and 16/16 experts resident, LM head resident, 1 multi-token-prediction layer(s) ignored; device cpu"
    );
    let mut s = deltafin::engine::Session::new(m, st, 128, 128);
    assert!(s.prefill(&ids, Logits::Last).unwrap() == want);
}
