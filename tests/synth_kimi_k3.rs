//! Synthetic Kimi K3 (`deltafin synth --arch kimi_k3`): llama.cpp `kimi-k3` GGUF files with
//! MXFP4 routed experts, written into temporary folders, loaded by the `kimi_k3` family and
//! packed:
//! - the file has exactly the planned size, the metadata and tensor types of the layout, and
//!   one expert is 3 × latent × FFN × 17/32 bytes;
//! - logits with every routed expert read on demand (from the GGUF and from 1- and 2-drive
//!   packs) bit-identical to everything resident;
//! - one decode step reads exactly the router's chosen experts: `k` misses per MoE layer, none
//!   in the dense layer, exactly their bytes (from a pack their records' chunks, from the GGUF
//!   their three slices of the stacked tensors) and one read per chunk or slice;
//! - the CLI: `synth`, `run -m` on the file and on its pack (the same greedy text), and the
//!   full `kimi-k3` preset planned.

mod common;

use std::path::Path;

use common::gguf::load_path;
use common::pack::{bits, opts, pack_of, session};
use common::prompt_and_greedy_logits;
use deltafin::engine::Session;
use deltafin::models::Logits;
use deltafin::quant::GgmlType;
use deltafin::source::gguf::GgufModel;
use deltafin::source::pack::Manifest;
use deltafin::store::IO_ALIGN;
use deltafin::write::pack::PackPlacement;
use deltafin::write::synth::{plan, write, Encoding, KimiK3Shape, Shape};

const PROMPT: [u32; 8] = [17, 300, 42, 99, 5, 256, 3, 77];
const MXFP4: Encoding = Encoding::Gguf(GgmlType::MXFP4);

/// 3 layers (a dense KDA layer, a KDA MoE layer, an MLA MoE layer), 32 experts of latent 64 ×
/// FFN 64 (6,528 bytes: three slices of 2,176), top-4, 2 shared.
fn shape() -> KimiK3Shape {
    KimiK3Shape {
        hidden_size: 64,
        num_hidden_layers: 3,
        first_k_dense_replace: 1,
        intermediate_size: 64,
        num_heads: 4,
        kda_head_dim: 16,
        conv_kernel: 4,
        q_lora_rank: 32,
        kv_lora_rank: 32,
        qk_nope_head_dim: 16,
        qk_rope_head_dim: 8,
        v_head_dim: 16,
        n_routed_experts: 32,
        num_experts_per_tok: 4,
        n_shared_experts: 2,
        moe_intermediate_size: 64,
        latent: 64,
        mla_every: 4,
        attn_res_block_size: 2,
        vocab_size: 512,
    }
}

const EXPERT_BYTES: u64 = 3 * 64 * 64 / 32 * 17;

/// Writes [`shape`] to `dir/k3.gguf`, checking its size against the plan.
fn written(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("k3.gguf");
    let s = Shape::KimiK3(shape());
    let p = plan(&s, MXFP4, 0).unwrap();
    assert_eq!(write(&s, MXFP4, &path, 0, 5, &mut |_, _| {}).unwrap(), p);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), p.files[0].1);
    assert_eq!(p.expert_bytes, EXPERT_BYTES);
    assert_eq!((p.layers, p.moe_layers, p.experts), (3, 2, 32));
    path
}

/// A session under `budget` (`None`: everything resident), no expert cache.
fn sess(path: &Path, budget: Option<u64>) -> Session {
    session(path, &opts(budget, false))
}

/// The smallest budget (16 KiB steps) under which `path` loads with its experts on demand.
fn streamed_budget(path: &Path) -> u64 {
    let mut b = 16 << 10;
    loop {
        if let Ok((m, s)) = load_path(path, &opts(Some(b), false)) {
            assert!(s.experts().is_some(), "{}", m.placement().summary);
            return b;
        }
        b += 16 << 10;
        assert!(b < 64 << 20, "no budget works");
    }
}

#[test]
fn kimi_k3_synth_is_the_kimi_k3_layout_with_mxfp4_experts() {
    let dir = tempfile::tempdir().unwrap();
    let path = written(dir.path());
    let g = GgufModel::open(&path).unwrap();
    assert_eq!(g.architecture().unwrap(), "kimi-k3");
    for (k, v) in [
        ("kimi-k3.block_count", 3),
        ("kimi-k3.expert_count", 32),
        ("kimi-k3.expert_used_count", 4),
        ("kimi-k3.expert_latent_length", 64),
        ("kimi-k3.leading_dense_block_count", 1),
        ("general.file_type", 38),
    ] {
        assert_eq!(g.get_u64(k).unwrap(), v, "{k}");
    }
    let t = g.tensor("blk.1.ffn_down_exps.weight").unwrap();
    assert_eq!((t.ty, t.shape.clone()), (GgmlType::MXFP4, vec![64, 64, 32]));
    assert_eq!(t.n_bytes, 32 * 64 * 2 * 17);
    // layer 1 KDA, layer 2 (the last) MLA with its output gate
    assert!(g.tensor("blk.1.ssm_g.weight").is_some());
    assert_eq!(
        g.tensor("blk.2.attn_gate.weight").unwrap().ty,
        GgmlType::BF16
    );
    assert_eq!(
        g.tensor("blk.1.ffn_gate_inp.weight").unwrap().ty,
        GgmlType::F32
    );
    assert_eq!(
        g.total_tensor_bytes(),
        plan(&Shape::KimiK3(shape()), MXFP4, 0)
            .unwrap()
            .tensor_bytes
    );
}

#[test]
fn kimi_k3_mxfp4_experts_streamed_and_packed_equal_resident_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let path = written(dir.path());
    let want = bits(&prompt_and_greedy_logits(
        &mut sess(&path, None),
        &PROMPT,
        3,
    ));
    assert!(want.iter().all(|b| f32::from_bits(*b).is_finite()));
    let b = streamed_budget(&path);
    let got = bits(&prompt_and_greedy_logits(
        &mut sess(&path, Some(b)),
        &PROMPT,
        3,
    ));
    assert!(got == want, "GGUF streamed differs");
    for (n, placement) in [
        (1, PackPlacement::Stripe),
        (2, PackPlacement::Stripe),
        (2, PackPlacement::Spread),
    ] {
        let (_t, o) = pack_of(&path, n, placement);
        let resident = bits(&prompt_and_greedy_logits(
            &mut sess(&o.out, None),
            &PROMPT,
            3,
        ));
        assert!(
            resident == want,
            "pack on {n} drives ({placement:?}), resident, differs"
        );
        let b = streamed_budget(&o.out);
        let got = bits(&prompt_and_greedy_logits(
            &mut sess(&o.out, Some(b)),
            &PROMPT,
            3,
        ));
        assert!(
            got == want,
            "pack on {n} drives ({placement:?}), streamed, differs"
        );
    }
}

/// One decode step after the prompt, with no cache: per layer the experts whose use count
/// grew (the router's choices), and the store's counters' growth.
fn decode_step(s: &mut Session) -> (Vec<Vec<usize>>, deltafin::store::ExpertCounters) {
    s.prefill(&PROMPT, Logits::Last).unwrap();
    let es = s.store.experts().unwrap();
    let (h0, c0) = (es.heat().counts.clone(), es.counters());
    s.model
        .forward(&mut s.store, &mut s.cache, &[7], Logits::Last)
        .unwrap();
    let es = s.store.experts().unwrap();
    let (h1, c1) = (es.heat().counts.clone(), es.counters());
    let chosen = (0..h1.len())
        .map(|l| {
            assert!(
                h1[l].iter().zip(&h0[l]).all(|(a, b)| a - b <= 1),
                "layer {l}: an expert used twice"
            );
            (0..h1[l].len()).filter(|&e| h1[l][e] > h0[l][e]).collect()
        })
        .collect();
    let d = deltafin::store::ExpertCounters {
        hits: c1.hits - c0.hits,
        misses: c1.misses - c0.misses,
        bytes: c1.bytes - c0.bytes,
        reads: c1.reads - c0.reads,
        ..Default::default()
    };
    (chosen, d)
}

#[test]
fn kimi_k3_decode_step_reads_only_the_chosen_experts() {
    let dir = tempfile::tempdir().unwrap();
    let path = written(dir.path());
    let a = IO_ALIGN as u64;

    // a 2-drive striped pack: each expert one record (gate, up, down each 4 KiB-aligned:
    // 4096 + 4096 + 2176 bytes), cut into an 8 KiB chunk on drive 0 and the rest on drive 1,
    // each chunk read as its 4 KiB-aligned span (cut at the end of the drive's file)
    let (_t, o) = pack_of(&path, 2, PackPlacement::Stripe);
    let m = Manifest::read(&o.out).unwrap();
    let mut s = sess(&o.out, Some(streamed_budget(&o.out)));
    let (chosen, d) = decode_step(&mut s);
    let n: Vec<usize> = chosen.iter().map(|c| c.len()).collect();
    assert_eq!(
        n,
        [0, 4, 4],
        "k = 4 experts in each MoE layer, none in the dense one"
    );
    assert_eq!((d.misses, d.hits), (8, 0));
    let (mut want, mut reads) = (0, 0);
    for (l, ids) in chosen.iter().enumerate() {
        for &e in ids {
            let r = m
                .experts
                .iter()
                .find(|r| (r.layer, r.expert) == (l, e))
                .unwrap();
            assert_eq!(r.len, 2 * 4096 + EXPERT_BYTES / 3);
            for x in &r.extents {
                let end = (x.offset + x.len).div_ceil(a) * a;
                want += end.min(m.drives[x.drive].len) - x.offset / a * a;
                reads += 1;
            }
            assert_eq!(r.extents.len(), 2);
        }
    }
    assert_eq!(d.bytes, want);
    assert!(want <= 8 * 12288 && want > 8 * 12288 - 4096, "{want}");
    assert_eq!(d.reads, reads);

    // the GGUF itself: each expert's three slices of the stacked tensors (2,176 bytes each),
    // each read as its 4 KiB-aligned span
    let mut s = sess(&path, Some(streamed_budget(&path)));
    let (chosen_gguf, d) = decode_step(&mut s);
    assert_eq!(
        chosen_gguf, chosen,
        "the same choices from the file and its pack"
    );
    assert_eq!((d.misses, d.hits), (8, 0));
    let g = GgufModel::open(&path).unwrap();
    let mut want = 0;
    let mut reads = 0;
    for (l, ids) in chosen.iter().enumerate() {
        for x in ["gate", "up", "down"] {
            let t = g.tensor(&format!("blk.{l}.ffn_{x}_exps.weight"));
            for &e in ids {
                let t = t.unwrap().slice_outer(e, 32);
                assert_eq!(t.n_bytes, EXPERT_BYTES / 3);
                want += (t.offset + t.n_bytes).div_ceil(a) * a - t.offset / a * a;
                reads += 1;
            }
        }
    }
    assert_eq!(d.bytes, want);
    assert_eq!(d.reads, reads);
}

fn deltafin(args: &[&str]) -> std::process::Output {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_deltafin"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

#[test]
fn kimi_k3_cli_synth_run_and_pack() {
    let dir = tempfile::tempdir().unwrap();
    let p = |x: &str| dir.path().join(x).to_str().unwrap().to_string();
    let o = deltafin(&[
        "synth",
        "--arch",
        "kimi_k3",
        "--preset",
        "kimi-k3",
        "--format",
        "gguf",
        "--dry-run",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("93 layers (1 dense + 92 MoE × 896 experts of 16.73 MiB), gguf mxfp4"),
        "{out}"
    );
    let o = deltafin(&[
        "synth",
        "--arch",
        "kimi_k3",
        "--preset",
        "kimi-k3",
        "--format",
        "gguf",
        "--layers",
        "2",
        "--dense-layers",
        "0",
        "--experts",
        "32",
        "--dry-run",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("2 layers (2 MoE × 32 experts of 16.73 MiB), gguf mxfp4"),
        "{out}"
    );
    deltafin(&[
        "synth",
        "--arch",
        "kimi_k3",
        "--preset",
        "tiny",
        "--format",
        "gguf",
        "--out",
        &p("t.gguf"),
    ]);
    for d in ["d0", "d1"] {
        std::fs::create_dir(p(d)).unwrap();
    }
    deltafin(&[
        "pack",
        "-m",
        &p("t.gguf"),
        "--out",
        &p("pack"),
        "--drives",
        &format!("{},{}", p("d0"), p("d1")),
    ]);
    let run = |m: &str| {
        let o = deltafin(&[
            "run",
            "-m",
            m,
            "-p",
            "hello",
            "-n",
            "6",
            "--temp",
            "0",
            "--ram-budget",
            "1M",
        ]);
        String::from_utf8_lossy(&o.stdout).to_string()
    };
    let (file, pack) = (run(&p("t.gguf")), run(&p("pack")));
    assert!(
        file.starts_with("hello") && file.len() > "hello".len(),
        "{file:?}"
    );
    assert_eq!(file, pack);
}

/// [`shape`] as a Hugging Face folder (compressed-tensors MXFP4 experts) in `dir/hf`.
fn written_hf(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("hf");
    let s = Shape::KimiK3(shape());
    let p = plan(&s, Encoding::Mxfp4, 1 << 30).unwrap();
    std::fs::create_dir(&path).unwrap();
    assert_eq!(
        write(&s, Encoding::Mxfp4, &path, 1 << 30, 5, &mut |_, _| {}).unwrap(),
        p
    );
    assert_eq!(
        p.expert_bytes, EXPERT_BYTES,
        "the same expert bytes as the GGUF form"
    );
    assert_eq!((p.layers, p.moe_layers, p.experts), (3, 2, 32));
    for (name, bytes) in &p.files {
        assert_eq!(
            std::fs::metadata(path.join(name)).unwrap().len(),
            *bytes,
            "{name}"
        );
    }
    path
}

#[test]
fn kimi_k3_hf_synth_streams_packs_and_reads_only_the_chosen_experts() {
    let dir = tempfile::tempdir().unwrap();
    let path = written_hf(dir.path());
    let h = deltafin::source::hf::HfModel::open(&path).unwrap();
    assert_eq!(h.model_type().unwrap(), "kimi_k3");
    let t = h
        .tensors
        .iter()
        .find(|t| t.name == "model.layers.1.block_sparse_moe.experts.3.w2.weight_packed")
        .expect("the text model's tensors without the language_model. prefix");
    assert_eq!((t.ty, t.shape.clone()), (GgmlType::I8, vec![32, 64]));
    let want = bits(&prompt_and_greedy_logits(
        &mut sess(&path, None),
        &PROMPT,
        3,
    ));
    assert!(want.iter().all(|b| f32::from_bits(*b).is_finite()));
    let got = bits(&prompt_and_greedy_logits(
        &mut sess(&path, Some(streamed_budget(&path))),
        &PROMPT,
        3,
    ));
    assert!(got == want, "HF streamed differs");
    let (_t, o) = pack_of(&path, 2, PackPlacement::Stripe);
    for budget in [None, Some(streamed_budget(&o.out))] {
        let got = bits(&prompt_and_greedy_logits(
            &mut sess(&o.out, budget),
            &PROMPT,
            3,
        ));
        assert!(got == want, "pack ({budget:?}) differs");
    }
    // one decode step from the folder: the chosen experts only, each one read of its six
    // contiguous tensors (packed and scale of w1, w2, w3) as their 4 KiB-aligned span
    let mut s = sess(&path, Some(streamed_budget(&path)));
    let (chosen, d) = decode_step(&mut s);
    assert_eq!(chosen.iter().map(Vec::len).collect::<Vec<_>>(), [0, 4, 4]);
    assert_eq!((d.misses, d.hits, d.reads), (8, 0, 8));
    let a = IO_ALIGN as u64;
    let mut want_bytes = 0;
    for (l, ids) in chosen.iter().enumerate() {
        for &e in ids {
            let pre = format!("model.layers.{l}.block_sparse_moe.experts.{e}.");
            let ts: Vec<_> = h
                .tensors
                .iter()
                .filter(|t| t.name.starts_with(&pre))
                .collect();
            assert_eq!(ts.len(), 6);
            let (lo, hi) = (
                ts.iter().map(|t| t.offset).min().unwrap(),
                ts.iter().map(|t| t.offset + t.n_bytes).max().unwrap(),
            );
            assert_eq!(hi - lo, EXPERT_BYTES, "contiguous");
            want_bytes += hi.div_ceil(a) * a - lo / a * a;
        }
    }
    assert_eq!(d.bytes, want_bytes);
}
