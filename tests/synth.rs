//! `deltafin synth` beyond `qwen3_moe` BF16: the `tiny` presets of `deepseek_v3` (BF16, FP8
//! E4M3 with 128×128 block scales) and `gpt_oss` (MXFP4, BF16), and `qwen3_moe` GGUF Q4_K,
//! written into temporary folders and loaded by the regular loaders. Each test checks that the
//! written files have exactly the sizes [`plan`] computes without writing, that the config or
//! GGUF metadata reads back as the preset, that tensors have the requested types and per-expert
//! byte sizes, and that a forward pass gives finite logits.

use std::path::Path;

use deltafin::engine::Session;
use deltafin::models::{load_gguf, load_hf_model, LoadOptions, Logits};
use deltafin::quant::GgmlType;
use deltafin::source::gguf::GgufModel;
use deltafin::source::hf::HfModel;
use deltafin::write::synth::{catalog, plan, write, Encoding, Planned, Qwen3MoeShape, Shape};
use serde_json::json;

const PROMPT: [u32; 12] = [17, 300, 42, 99, 5, 256, 411, 3, 77, 128, 9, 480];

fn preset(arch: &str, name: &str) -> Shape {
    catalog()
        .into_iter()
        .find(|p| p.shape.arch() == arch && p.name == name)
        .unwrap()
        .shape
}

/// Writes `shape` in `enc` under `dir` (shards of ~100 kB), checks every file's size against
/// the plan, returns the plan.
fn write_checked(shape: &Shape, enc: Encoding, out: &Path) -> Planned {
    let planned = plan(shape, enc, 100_000).unwrap();
    let mut last = (0, 0);
    let got = write(shape, enc, out, 100_000, 11, &mut |w, t| last = (w, t)).unwrap();
    assert_eq!(got, planned);
    assert_eq!(last, (planned.tensor_bytes, planned.tensor_bytes));
    for (name, bytes) in &planned.files {
        let p = if name.is_empty() {
            out.to_path_buf()
        } else {
            out.join(name)
        };
        assert_eq!(std::fs::metadata(&p).unwrap().len(), *bytes, "{name}");
    }
    if out.is_dir() {
        assert_eq!(
            std::fs::read_dir(out).unwrap().count(),
            planned.files.len(),
            "no unplanned files"
        );
    }
    planned
}

/// Prefill of [`PROMPT`] then 3 greedy decode steps; every logit finite, not all equal.
fn forward_is_finite(mut s: Session) {
    let mut l = s.prefill(&PROMPT, Logits::All).unwrap();
    assert_eq!(l.len(), PROMPT.len() * 512);
    for _ in 0..3 {
        assert!(l.iter().all(|v| v.is_finite()));
        let (lo, hi) = l
            .iter()
            .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
        assert!(hi > lo, "constant logits");
        let last = &l[l.len() - 512..];
        let t = (0..512)
            .max_by(|&a, &b| last[a].total_cmp(&last[b]))
            .unwrap();
        l = s
            .model
            .forward(&mut s.store, &mut s.cache, &[t as u32], Logits::Last)
            .unwrap();
    }
}

fn hf_session(hf: &HfModel) -> Session {
    let opts = LoadOptions {
        n_ctx: 64,
        n_batch: 64,
        ..Default::default()
    };
    let (m, st) = load_hf_model(hf, &opts).unwrap();
    assert_eq!(m.vocab_size(), 512);
    Session::new(m, st, 64, 64)
}

/// The tensors whose names start with `prefix`: (dtype as GGML type, shape in GGML order).
fn tensors<'a>(hf: &'a HfModel, prefix: &str) -> Vec<&'a deltafin::source::tensor::TensorInfo> {
    hf.tensors
        .iter()
        .filter(|t| t.name.starts_with(prefix))
        .collect()
}

#[test]
fn deepseek_v3_tiny_in_bf16_and_fp8_loads_and_runs() {
    for enc in [Encoding::Bf16, Encoding::Fp8] {
        let dir = tempfile::tempdir().unwrap();
        let shape = preset("deepseek_v3", "tiny");
        let p = write_checked(&shape, enc, dir.path());
        let hf = HfModel::open(dir.path()).unwrap();
        // several ~100 kB shards, expert tensors never split
        assert!(hf.files.len() >= 4, "{}", hf.files.len());
        let c = &hf.config;
        for (k, v) in [
            ("model_type", json!("deepseek_v3")),
            ("hidden_size", json!(64)),
            ("num_hidden_layers", json!(3)),
            ("first_k_dense_replace", json!(1)),
            ("n_routed_experts", json!(8)),
            ("num_experts_per_tok", json!(2)),
            ("n_group", json!(4)),
            ("topk_group", json!(2)),
            ("n_shared_experts", json!(1)),
            ("q_lora_rank", json!(32)),
            ("kv_lora_rank", json!(16)),
            ("qk_nope_head_dim", json!(16)),
            ("qk_rope_head_dim", json!(8)),
            ("v_head_dim", json!(16)),
            ("moe_intermediate_size", json!(32)),
            ("scoring_func", json!("sigmoid")),
            ("topk_method", json!("noaux_tc")),
        ] {
            assert_eq!(c[k], v, "{k}");
        }
        assert_eq!((p.layers, p.moe_layers, p.experts), (3, 2, 8));
        let expert = tensors(&hf, "model.layers.2.mlp.experts.7.");
        let bytes: u64 = expert.iter().map(|t| t.n_bytes).sum();
        assert_eq!(bytes, p.expert_bytes);
        assert!(tensors(&hf, "model.layers.0.mlp.experts.").is_empty());
        let bias = &tensors(&hf, "model.layers.1.mlp.gate.e_score_correction_bias")[0];
        assert_eq!((bias.ty, bias.shape.clone()), (GgmlType::F32, vec![8]));
        if enc == Encoding::Fp8 {
            assert_eq!(
                c["quantization_config"],
                json!({"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]})
            );
            // 3 × (32 × 64 E4M3 bytes + one F32 scale)
            assert_eq!(p.expert_bytes, 3 * (32 * 64 + 4));
            assert_eq!(expert.len(), 6);
            for t in &expert {
                match t.name.ends_with("weight_scale_inv") {
                    true => assert_eq!((t.ty, t.shape.clone()), (GgmlType::F32, vec![1, 1])),
                    false => assert_eq!(t.ty, GgmlType::F8_E4M3),
                }
            }
            // q_b_proj: 8 heads × 24 = 192 rows of 32: scales [2, 1] (GGML order [1, 2])
            let qb = tensors(&hf, "model.layers.0.self_attn.q_b_proj.weight_scale_inv");
            assert_eq!(qb[0].shape, vec![1, 2]);
            let head = &tensors(&hf, "lm_head.weight")[0];
            assert_eq!(head.ty, GgmlType::BF16);
        } else {
            assert!(c.get("quantization_config").is_none());
            assert_eq!(p.expert_bytes, 3 * 32 * 64 * 2);
            assert!(expert.iter().all(|t| t.ty == GgmlType::BF16));
        }
        forward_is_finite(hf_session(&hf));
    }
}

#[test]
fn gpt_oss_tiny_in_mxfp4_and_bf16_loads_and_runs() {
    for enc in [Encoding::Mxfp4, Encoding::Bf16] {
        let dir = tempfile::tempdir().unwrap();
        let shape = preset("gpt_oss", "tiny");
        let p = write_checked(&shape, enc, dir.path());
        let hf = HfModel::open(dir.path()).unwrap();
        let c = &hf.config;
        for (k, v) in [
            ("model_type", json!("gpt_oss")),
            ("hidden_size", json!(64)),
            ("intermediate_size", json!(64)),
            ("num_hidden_layers", json!(2)),
            ("num_local_experts", json!(8)),
            ("num_experts_per_tok", json!(2)),
            ("sliding_window", json!(8)),
            (
                "layer_types",
                json!(["sliding_attention", "full_attention"]),
            ),
        ] {
            assert_eq!(c[k], v, "{k}");
        }
        assert_eq!((p.layers, p.moe_layers, p.experts), (2, 2, 8));
        let x = |s: &str| {
            let n = format!("model.layers.1.mlp.experts.{s}");
            let t = hf.tensors.iter().find(|t| t.name == n).unwrap();
            (t.ty, t.shape.clone())
        };
        let sinks = &tensors(&hf, "model.layers.1.self_attn.sinks")[0];
        assert_eq!((sinks.ty, sinks.shape.clone()), (GgmlType::BF16, vec![4]));
        assert_eq!(x("gate_up_proj_bias"), (GgmlType::BF16, vec![128, 8]));
        let all: u64 = tensors(&hf, "model.layers.1.mlp.experts.")
            .iter()
            .map(|t| t.n_bytes)
            .sum();
        assert_eq!(all, 8 * p.expert_bytes);
        if enc == Encoding::Mxfp4 {
            assert_eq!(c["quantization_config"]["quant_method"], "mxfp4");
            // U8 safetensors tensors index as I8; GGML order reverses PyTorch's
            assert_eq!(
                x("gate_up_proj_blocks"),
                (GgmlType::I8, vec![16, 2, 128, 8])
            );
            assert_eq!(x("gate_up_proj_scales"), (GgmlType::I8, vec![2, 128, 8]));
            assert_eq!(x("down_proj_blocks"), (GgmlType::I8, vec![16, 2, 64, 8]));
            assert_eq!(x("down_proj_scales"), (GgmlType::I8, vec![2, 64, 8]));
            // (128 + 64) rows × 2 blocks × 17 bytes, BF16 biases of 128 + 64
            assert_eq!(p.expert_bytes, 192 * 2 * 17 + 192 * 2);
            // E8M0 exponents 120..=123 (fan-in 64)
            let t = tensors(&hf, "model.layers.0.mlp.experts.gate_up_proj_scales")[0];
            let f = std::fs::read(&hf.files[t.file]).unwrap();
            let sc = &f[t.offset as usize..(t.offset + t.n_bytes) as usize];
            assert!(sc.iter().all(|e| (120..=123).contains(e)));
            assert!((120..=123).all(|e| sc.contains(&e)));
        } else {
            assert!(c.get("quantization_config").is_none());
            assert_eq!(x("gate_up_proj"), (GgmlType::BF16, vec![128, 64, 8]));
            assert_eq!(x("down_proj"), (GgmlType::BF16, vec![64, 64, 8]));
            assert_eq!(p.expert_bytes, (64 * 128 + 64 * 64 + 192) * 2);
        }
        forward_is_finite(hf_session(&hf));
    }
}

#[test]
fn qwen3_moe_gguf_q4_k_loads_and_runs_with_q5_0_fallback() {
    // every expert row a whole 256-element super-block; attn_output rows (4 heads × 16 = 64)
    // are not and fall back to Q5_0
    let s = Qwen3MoeShape {
        hidden_size: 256,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 16,
        num_experts: 8,
        num_experts_per_tok: 2,
        moe_intermediate_size: 256,
        vocab_size: 512,
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q4k.gguf");
    let enc = Encoding::Gguf(GgmlType::Q4_K);
    let p = write_checked(&Shape::Qwen3Moe(s), enc, &path);
    // 3 matrices of 256 rows × one 144-byte block
    assert_eq!(p.expert_bytes, 3 * 256 * 144);
    let g = GgufModel::open(&path).unwrap();
    assert_eq!(g.total_tensor_bytes(), p.tensor_bytes);
    for (k, v) in [
        ("qwen3moe.block_count", 2),
        ("qwen3moe.embedding_length", 256),
        ("qwen3moe.expert_count", 8),
        ("qwen3moe.expert_used_count", 2),
        ("qwen3moe.expert_feed_forward_length", 256),
        ("qwen3moe.attention.head_count", 4),
        ("qwen3moe.attention.head_count_kv", 2),
        ("general.file_type", 14),
    ] {
        assert_eq!(g.get_u64(k).unwrap(), v, "{k}");
    }
    let ty = |n: &str| g.tensor(n).unwrap().ty;
    for n in [
        "ffn_gate_exps",
        "ffn_up_exps",
        "ffn_down_exps",
        "attn_q",
        "attn_k",
    ] {
        assert_eq!(ty(&format!("blk.1.{n}.weight")), GgmlType::Q4_K, "{n}");
    }
    assert_eq!(ty("blk.1.attn_output.weight"), GgmlType::Q5_0);
    assert_eq!(ty("blk.1.ffn_gate_inp.weight"), GgmlType::F32);
    assert_eq!(ty("output.weight"), GgmlType::Q4_K);
    let t = g.tensor("blk.0.ffn_down_exps.weight").unwrap();
    assert_eq!(t.n_bytes, 8 * 256 * 144);
    let opts = LoadOptions {
        n_ctx: 64,
        n_batch: 64,
        ..Default::default()
    };
    let (m, st) = load_gguf(&g, &opts).unwrap();
    forward_is_finite(Session::new(m, st, 64, 64));

    // the tiny preset's rows (64 and 32) all fall back; qwen3-30b-a3b's (2048, 768, 4096) none
    let tiny = plan(&preset("qwen3_moe", "tiny"), enc, 0).unwrap();
    assert_eq!(tiny.expert_bytes, 2 * 32 * (2 * 22) + 64 * 22);
    let real = plan(&preset("qwen3_moe", "qwen3-30b-a3b"), enc, 0).unwrap();
    assert_eq!(real.expert_bytes, 3 * 768 * 8 * 144);
    assert_eq!(real.expert_bytes, 2_654_208);
}

fn deltafin(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_deltafin"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn cli_lists_plans_writes_and_runs_the_new_architectures() {
    let o = deltafin(&["synth", "--help"]);
    let help = String::from_utf8_lossy(&o.stdout);
    for w in [
        "deepseek_v3",
        "gpt_oss",
        "qwen3_moe",
        "deepseek-v3",
        "gpt-oss-20b",
        "qwen3-30b-a3b",
        "fp8",
        "mxfp4",
        "q4_k",
        "--dense-layers",
        "--dry-run",
    ] {
        assert!(help.contains(w), "{w} missing from:\n{help}");
    }
    let o = deltafin(&[
        "synth",
        "--arch",
        "deepseek_v3",
        "--preset",
        "deepseek-v3",
        "--layers",
        "4",
        "--quant",
        "fp8",
        "--dry-run",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        out.contains("4 layers (3 dense + 1 MoE × 256 experts of 42.01 MiB), hf fp8"),
        "{out}"
    );
    let o = deltafin(&[
        "synth",
        "--arch",
        "gpt_oss",
        "--preset",
        "gpt-oss-20b",
        "--dry-run",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("24 layers (24 MoE × 32 experts of 12.62 MiB), hf mxfp4"),
        "{out}"
    );
    let o = deltafin(&["synth", "--arch", "gpt_oss", "--preset", "deepseek-v3"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("unknown gpt_oss preset 'deepseek-v3' (known: tiny, gpt-oss-20b)"),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ds");
    let o = deltafin(&[
        "synth",
        "--arch",
        "deepseek_v3",
        "--preset",
        "tiny",
        "--quant",
        "fp8",
        "--out",
        out.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("3 layers (1 dense + 2 MoE × 8 experts of 0.01 MiB), hf fp8"),
        "{err}"
    );
    let o = deltafin(&[
        "run",
        "-m",
        out.to_str().unwrap(),
        "-p",
        "Hello",
        "-n",
        "4",
        "--temp",
        "0",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn kimi_linear_tiny_loads_and_runs_and_the_48b_shape_plans() {
    let dir = tempfile::tempdir().unwrap();
    let shape = preset("kimi_linear", "tiny");
    let p = write_checked(&shape, Encoding::Bf16, dir.path());
    let hf = HfModel::open(dir.path()).unwrap();
    let c = &hf.config;
    assert_eq!(c["model_type"], "kimi_linear");
    assert_eq!(c["linear_attn_config"]["full_attn_layers"], json!([4]));
    assert_eq!(c["linear_attn_config"]["kda_layers"], json!([1, 2, 3]));
    assert_eq!((p.layers, p.moe_layers, p.experts), (4, 3, 8));
    assert_eq!(p.expert_bytes, 3 * 32 * 64 * 2);
    let conv = &tensors(&hf, "model.layers.0.self_attn.q_conv1d.weight")[0];
    assert_eq!(
        (conv.ty, conv.shape.clone()),
        (GgmlType::BF16, vec![4, 1, 64])
    );
    forward_is_finite(hf_session(&hf));
    let o = deltafin(&[
        "synth",
        "--arch",
        "kimi_linear",
        "--preset",
        "kimi-linear-48b-a3b",
        "--dry-run",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        out.contains("27 layers (1 dense + 26 MoE × 256 experts of 13.50 MiB), hf bf16"),
        "{out}"
    );
}

/// Every low-bit encoding (`quant::EXT_TYPES`): the synthetic `qwen3_moe` GGUF is written in
/// it (256-element rows; the 64-element `attn_output` rows fall back as llama.cpp's quantizer
/// does), loads, and runs with finite logits, through the expert store.
#[test]
fn qwen3_moe_gguf_in_every_low_bit_type_loads_and_runs() {
    let s = Qwen3MoeShape {
        hidden_size: 256,
        num_hidden_layers: 1,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 16,
        num_experts: 4,
        num_experts_per_tok: 2,
        moe_intermediate_size: 256,
        vocab_size: 512,
    };
    // (type, llama_ftype, attn_output fallback, block bytes)
    let cases = [
        (GgmlType::Q4_1, 3, GgmlType::Q4_1, 20),
        (GgmlType::Q5_1, 9, GgmlType::Q5_1, 24),
        (GgmlType::Q2_K, 10, GgmlType::Q4_0, 84),
        (GgmlType::Q3_K, 11, GgmlType::Q4_0, 110),
        (GgmlType::Q5_K, 16, GgmlType::Q5_1, 176),
        (GgmlType::IQ1_S, 24, GgmlType::IQ4_NL, 50),
        (GgmlType::IQ1_M, 31, GgmlType::IQ4_NL, 56),
        (GgmlType::IQ2_XXS, 19, GgmlType::IQ4_NL, 66),
        (GgmlType::IQ2_XS, 20, GgmlType::IQ4_NL, 74),
        (GgmlType::IQ2_S, 28, GgmlType::IQ4_NL, 82),
        (GgmlType::IQ3_XXS, 23, GgmlType::IQ4_NL, 98),
        (GgmlType::IQ3_S, 26, GgmlType::IQ4_NL, 110),
        (GgmlType::IQ4_NL, 25, GgmlType::IQ4_NL, 18),
        (GgmlType::IQ4_XS, 30, GgmlType::IQ4_NL, 136),
        (GgmlType::TQ1_0, 36, GgmlType::Q4_0, 54),
        (GgmlType::TQ2_0, 37, GgmlType::Q4_0, 66),
    ];
    assert_eq!(cases.len(), deltafin::quant::EXT_TYPES.len());
    let dir = tempfile::tempdir().unwrap();
    for (q, ftype, fallback, bb) in cases {
        let name = q.name().to_lowercase();
        let shape = Shape::Qwen3Moe(s.clone());
        let enc = Encoding::parse(&shape, "gguf", Some(&name)).unwrap();
        assert_eq!(enc, Encoding::Gguf(q));
        let path = dir.path().join(format!("{name}.gguf"));
        let p = write_checked(&shape, enc, &path);
        // gate, up, down: 256 rows of 256 elements per expert (one layer)
        let per_row = bb * 256 / q.block_elems() as u64;
        assert_eq!(p.expert_bytes, 3 * 256 * per_row, "{q}");
        let g = GgufModel::open(&path).unwrap();
        assert_eq!(g.get_u64("general.file_type").unwrap(), ftype, "{q}");
        let ty = |n: &str| g.tensor(n).unwrap().ty;
        assert_eq!(ty("blk.0.ffn_down_exps.weight"), q);
        assert_eq!(ty("blk.0.attn_q.weight"), q);
        assert_eq!(ty("blk.0.attn_output.weight"), fallback, "{q}");
        let opts = LoadOptions {
            n_ctx: 64,
            n_batch: 64,
            ..Default::default()
        };
        let (m, st) = load_gguf(&g, &opts).unwrap();
        forward_is_finite(Session::new(m, st, 64, 64));
        std::fs::remove_file(&path).unwrap();
    }
}

/// A piped `synth` (standard error not a terminal) prints a plain line each time it passes
/// another tenth of the bytes (one line when a tensor passes several), then its summary.
#[test]
fn piped_synth_prints_a_line_every_tenth() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.gguf");
    let o = deltafin(&[
        "synth",
        "--preset",
        "tiny",
        "--format",
        "gguf",
        "--out",
        out.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(
        lines[..lines.len() - 1],
        [
            "synth: 25.0 KiB of 232.4 KiB written (10%)",
            "synth: 47.4 KiB of 232.4 KiB written (20%)",
            "synth: 83.4 KiB of 232.4 KiB written (35%)",
            "synth: 94.8 KiB of 232.4 KiB written (40%)",
            "synth: 130.8 KiB of 232.4 KiB written (56%)",
            "synth: 148.8 KiB of 232.4 KiB written (64%)",
            "synth: 178.1 KiB of 232.4 KiB written (76%)",
            "synth: 196.1 KiB of 232.4 KiB written (84%)",
            "synth: 214.1 KiB of 232.4 KiB written (92%)",
            "synth: 232.4 KiB of 232.4 KiB written (100%)",
        ],
        "{err}"
    );
    assert!(
        lines[lines.len() - 1].starts_with(&format!("wrote {} (", out.display())),
        "{err}"
    );
}
