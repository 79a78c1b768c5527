//! Packs of every MoE family besides Qwen3 (whose packs `tests/pack.rs` tests): DeepSeek V3
//! from Hugging Face (BF16, and FP8 with `weight_scale_inv` block scales) and from a
//! `deepseek2` GGUF (Q8_0), Kimi Linear from Hugging Face (BF16) and from a `kimi-linear` GGUF (F32), Kimi K3 from a `kimi-k3` GGUF (F32), GPT-OSS from Hugging Face (stacked BF16 experts, and stacked MXFP4
//! blocks and scales) and from a `gpt-oss` GGUF (MXFP4, stacked biases), all tiny fixtures
//! under `tests/fixtures`. Each is packed into tempdirs standing for drives (`stripe` and
//! `spread`, 1 to 3 drives): logits bit-identical to the source's with every expert resident
//! and with every expert read on demand (checked or not, prefetch on or off), the source's
//! bytes unchanged,
//! records in the stored encodings with stacked experts listed per expert, `--verify` clean;
//! and the failures `tests/pack.rs` tests for Qwen3 (a flipped byte named by `--verify` and,
//! with `--verify-experts`, by the run; a missing drive folder or file and a short file named
//! at load).

mod common;

use std::path::{Path, PathBuf};

use common::pack::{bits, expert_in, flip, opts, pack_of, pack_opts, session, sha256, try_session};
use common::prompt_and_greedy_logits;
use deltafin::engine::Session;
use deltafin::models::Logits;
use deltafin::source::pack::{Manifest, PackTensor};
use deltafin::store::PrefetchMode;
use deltafin::write::pack::{verify_pack, PackPlacement};

const PROMPT: [u32; 8] = [17, 300, 42, 99, 5, 256, 3, 77];
const DECODE: usize = 3;

/// One source to pack.
struct Case {
    /// Under `tests/fixtures`.
    rel: &'static str,
    /// Expert records: layers with routed experts × experts.
    records: usize,
    /// Items `--verify` checks: the GGUF header (GGUF sources), spine tensors, records, and
    /// the five files copied from Hugging Face folders.
    checked: usize,
    /// The first layer with routed experts.
    moe_layer: usize,
}

const CASES: [Case; 9] = [
    Case {
        rel: "hf/deepseek_v3",
        records: 2 * 8,
        checked: 64,
        moe_layer: 1,
    },
    Case {
        rel: "hf/deepseek_v3_fp8",
        records: 2 * 8,
        checked: 88,
        moe_layer: 1,
    },
    Case {
        rel: "hf/gpt_oss",
        records: 2 * 8,
        checked: 50,
        moe_layer: 0,
    },
    Case {
        rel: "hf/gpt_oss_mxfp4",
        records: 2 * 8,
        checked: 50,
        moe_layer: 0,
    },
    Case {
        rel: "gguf/deepseek_v3/deepseek_v3-q8_0.gguf",
        records: 2 * 8,
        checked: 63,
        moe_layer: 1,
    },
    Case {
        rel: "gguf/gpt_oss/gpt_oss-mxfp4_moe.gguf",
        records: 2 * 8,
        checked: 46,
        moe_layer: 0,
    },
    // KDA + MLA hybrid: 79 spine tensors, 3 MoE layers
    Case {
        rel: "hf/kimi_linear",
        records: 3 * 8,
        checked: 108,
        moe_layer: 1,
    },
    // the same from a `kimi-linear` GGUF (F32, stacked experts): the header, 80 spine tensors
    Case {
        rel: "gguf/kimi_linear/kimi_linear-f32.gguf",
        records: 3 * 8,
        checked: 105,
        moe_layer: 1,
    },
    // Kimi K3's `kimi-k3` GGUF (F32; latent MoE with tail units, attention residuals): the
    // header, 93 spine tensors
    Case {
        rel: "gguf/kimi_k3/kimi_k3-f32.gguf",
        records: 3 * 8,
        checked: 118,
        moe_layer: 1,
    },
];

impl Case {
    fn src(&self) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(self.rel)
    }
}

/// A session over the model at `path` that reads every routed expert on demand: under the
/// smallest RAM budget (in steps of 16 KiB, found by bisection: a larger budget always loads)
/// it loads with, as what the budget must hold besides the experts depends on the thread
/// count; expert reads checked when `verify`.
fn streamed(path: &Path, verify: bool, prefetch: PrefetchMode) -> Session {
    // the budget is found without verification: with it, a damaged pack fails to load
    // whenever its experts are resident
    let mut o = opts(None, false);
    o.experts.prefetch = prefetch;
    let mut load = |k: u64| {
        o.ram_budget = Some(k << 14);
        try_session(path, &o)
    };
    // loads at `hi` (4 MiB), not at `lo` (128 KiB)
    let (mut lo, mut hi) = (8, 256);
    if let Err(e) = load(hi) {
        panic!("{path:?} loads under no budget up to 4 MiB: {e:#}");
    }
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        match load(mid) {
            Ok(_) => hi = mid,
            Err(_) => lo = mid,
        }
    }
    o.ram_budget = Some(hi << 14);
    o.experts.verify = verify;
    let s = try_session(path, &o).unwrap();
    assert!(
        s.store.experts().is_some(),
        "{path:?}: no budget streams the experts"
    );
    s
}

/// Prompt logits (every position) and `DECODE` greedy steps' logits of `s`.
fn logits(s: &mut Session) -> Vec<u32> {
    bits(&prompt_and_greedy_logits(s, &PROMPT, DECODE))
}

#[test]
fn every_moe_family_packs_with_logits_bit_identical_to_the_source() {
    for c in &CASES {
        let src = c.src();
        let before = sha256_of(&src);
        // streamed or resident, the source's logits are the same bits
        let want = logits(&mut session(&src, &opts(None, false)));
        assert!(logits(&mut streamed(&src, false, PrefetchMode::Off)) == want);
        for (n, placement) in [
            (1, PackPlacement::Stripe),
            (3, PackPlacement::Stripe),
            (1, PackPlacement::Spread),
            (2, PackPlacement::Spread),
        ] {
            let (_t, o) = pack_of(&src, n, placement);
            let m = Manifest::read(&o.out).unwrap();
            assert_eq!(m.experts.len(), c.records, "{}", c.rel);
            let at = format!("{}: {placement:?} on {n} drives", c.rel);
            let mut s = session(&o.out, &opts(None, false));
            assert!(
                s.store.experts().is_none() && logits(&mut s) == want,
                "{at}"
            );
            for (verify, prefetch) in [(true, PrefetchMode::Off), (false, PrefetchMode::On)] {
                let got = logits(&mut streamed(&o.out, verify, prefetch));
                assert!(got == want, "{at}, streamed, verify {verify}");
            }
            let (count, bad) = verify_pack(&o.out).unwrap();
            assert_eq!((count, bad.len()), (c.checked, 0), "{at}: {bad:?}");
        }
        assert_eq!(sha256_of(&src), before, "{} changed", c.rel);
    }
}

/// SHA-256 of every file of a source (the folder's, or the GGUF file).
fn sha256_of(src: &Path) -> Vec<Vec<u8>> {
    if src.is_file() {
        return vec![sha256(src)];
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files.iter().map(|p| sha256(p)).collect()
}

/// The tensors of expert `e` of `layer`'s record, in record order, with their offsets from
/// the record's start.
fn record(m: &Manifest, layer: usize, e: usize) -> Vec<(String, String, u64)> {
    let r = m
        .experts
        .iter()
        .position(|r| r.layer == layer && r.expert == e)
        .unwrap();
    let mut ts: Vec<&PackTensor> = m
        .tensors
        .iter()
        .filter(|t| t.file != 0 && owner(m, t) == Some(r))
        .collect();
    ts.sort_by_key(|t| t.offset);
    let base = ts[0].offset;
    ts.iter()
        .map(|t| (t.name.clone(), t.dtype.clone(), t.offset - base))
        .collect()
}

/// The record holding pack tensor `t` (spread placement: drive and byte range).
fn owner(m: &Manifest, t: &PackTensor) -> Option<usize> {
    m.experts.iter().position(|r| {
        let x = &r.extents[0];
        t.file == 1 + x.drive && t.offset >= x.offset && t.offset < x.offset + r.len
    })
}

#[test]
fn records_keep_the_stored_encodings_with_stacked_experts_listed_per_expert() {
    let names = |rel: &str, layer: usize, e: usize| {
        let c = CASES.iter().find(|c| c.rel == rel).unwrap();
        let (_t, o) = pack_of(&c.src(), 1, PackPlacement::Spread);
        let m = Manifest::read(&o.out).unwrap();
        // stacked tensors are listed per expert only
        assert!(
            m.tensors
                .iter()
                .all(|t| t.file == 0 || t.name.ends_with(']') || t.name.contains(".experts.")),
            "{rel}"
        );
        record(&m, layer, e)
    };
    let row = |n: &str, d: &str, off: u64| (n.to_string(), d.to_string(), off);
    let p = "model.layers.2.mlp.experts.5.";
    assert_eq!(
        names("hf/deepseek_v3_fp8", 2, 5),
        vec![
            row(&format!("{p}gate_proj.weight"), "F8_E4M3", 0),
            row(&format!("{p}gate_proj.weight_scale_inv"), "F32", 4096),
            row(&format!("{p}up_proj.weight"), "F8_E4M3", 2 * 4096),
            row(&format!("{p}up_proj.weight_scale_inv"), "F32", 3 * 4096),
            row(&format!("{p}down_proj.weight"), "F8_E4M3", 4 * 4096),
            row(&format!("{p}down_proj.weight_scale_inv"), "F32", 5 * 4096),
        ]
    );
    let p = "model.layers.1.mlp.experts.";
    assert_eq!(
        names("hf/gpt_oss_mxfp4", 1, 3),
        vec![
            row(&format!("{p}gate_up_proj_bias[3]"), "BF16", 0),
            row(&format!("{p}gate_up_proj_blocks[3]"), "I8", 4096),
            row(&format!("{p}gate_up_proj_scales[3]"), "I8", 2 * 4096),
            row(&format!("{p}down_proj_bias[3]"), "BF16", 3 * 4096),
            row(&format!("{p}down_proj_blocks[3]"), "I8", 4 * 4096),
            row(&format!("{p}down_proj_scales[3]"), "I8", 5 * 4096),
        ]
    );
    assert_eq!(
        names("hf/gpt_oss", 0, 7),
        vec![
            row("model.layers.0.mlp.experts.gate_up_proj[7]", "BF16", 0),
            row(
                "model.layers.0.mlp.experts.gate_up_proj_bias[7]",
                "BF16",
                4 * 4096
            ),
            row("model.layers.0.mlp.experts.down_proj[7]", "BF16", 5 * 4096),
            row(
                "model.layers.0.mlp.experts.down_proj_bias[7]",
                "BF16",
                7 * 4096
            ),
        ]
    );
    let p = "blk.1.ffn_";
    assert_eq!(
        names("gguf/gpt_oss/gpt_oss-mxfp4_moe.gguf", 1, 2),
        vec![
            row(&format!("{p}gate_exps.bias[2]"), "F32", 0),
            row(&format!("{p}gate_exps.weight[2]"), "MXFP4", 4096),
            row(&format!("{p}up_exps.bias[2]"), "F32", 2 * 4096),
            row(&format!("{p}up_exps.weight[2]"), "MXFP4", 3 * 4096),
            row(&format!("{p}down_exps.bias[2]"), "F32", 4 * 4096),
            row(&format!("{p}down_exps.weight[2]"), "MXFP4", 5 * 4096),
        ]
    );
    assert_eq!(
        names("gguf/deepseek_v3/deepseek_v3-q8_0.gguf", 2, 0),
        vec![
            row("blk.2.ffn_gate_exps.weight[0]", "Q8_0", 0),
            row("blk.2.ffn_up_exps.weight[0]", "Q8_0", 4096),
            row("blk.2.ffn_down_exps.weight[0]", "Q8_0", 2 * 4096),
        ]
    );
}

#[test]
fn verify_and_verified_runs_name_the_expert_with_a_flipped_byte() {
    for c in &CASES {
        let (_t, o) = pack_of(&c.src(), 3, PackPlacement::Spread);
        let m = Manifest::read(&o.out).unwrap();
        let l = c.moe_layer;
        let file = flip(&o.out, l + 1, 5);
        let (_, bad) = verify_pack(&o.out).unwrap();
        let r = m
            .experts
            .iter()
            .find(|r| r.layer == l + 1 && r.expert == 5)
            .unwrap();
        let d = r.extents[0].drive;
        assert_eq!(m.drives[d].file, file.display().to_string());
        assert_eq!(
            bad,
            vec![format!(
                "expert 5 of layer {} on drive {d} ({}), file {}: checksum mismatch",
                l + 1,
                m.drives[d].path,
                m.drives[d].file
            )],
            "{}",
            c.rel
        );
        // every expert of the first MoE layer damaged, so whichever the router picks fails
        for e in 0..8 {
            flip(&o.out, l, e);
        }
        let mut s = streamed(&o.out, true, PrefetchMode::Off);
        let err = format!("{:#}", s.prefill(&PROMPT, Logits::Last).unwrap_err());
        let x = expert_in(&err);
        let r = m
            .experts
            .iter()
            .find(|r| r.layer == l && r.expert == x)
            .unwrap();
        assert_eq!(
            err,
            format!(
                "checksum mismatch in expert {x} of layer {l} read from {}",
                m.drive_label(r.extents[0].drive)
            ),
            "{}",
            c.rel
        );
        // with every expert resident, the first damaged one is named at load
        let e = format!(
            "{:#}",
            try_session(&o.out, &opts(None, true)).err().unwrap()
        );
        let r = m
            .experts
            .iter()
            .find(|r| r.layer == l && r.expert == 0)
            .unwrap();
        assert_eq!(
            e,
            format!(
                "checksum mismatch in expert 0 of layer {l} read from {}",
                m.drive_label(r.extents[0].drive)
            ),
            "{}",
            c.rel
        );
    }
}

#[test]
fn a_missing_drive_folder_or_file_and_a_short_file_are_named_at_load() {
    for c in &CASES {
        let (_t, o) = pack_of(&c.src(), 3, PackPlacement::Stripe);
        let m = Manifest::read(&o.out).unwrap();
        let label = m.drive_label(1);
        assert_eq!(
            label,
            format!("drive 1 ({}), file {}", m.drives[1].path, m.drives[1].file)
        );
        // drive 2 cut inside the last record with a chunk on it: that chunk lies past the end
        let (r, x) = m
            .experts
            .iter()
            .rev()
            .find_map(|r| r.extents.iter().find(|x| x.drive == 2).map(|x| (r, x)))
            .unwrap();
        let cut = x.offset + 10;
        std::fs::OpenOptions::new()
            .write(true)
            .open(&m.drives[2].file)
            .unwrap()
            .set_len(cut)
            .unwrap();
        let err = |o: &Path| format!("{:#}", try_session(o, &opts(None, false)).err().unwrap());
        assert_eq!(
            err(&o.out),
            format!(
                "{}: the file is {cut} bytes but the manifest says {} (expert {} of layer {} lies past its end)",
                m.drive_label(2),
                m.drives[2].len,
                r.expert,
                r.layer
            ),
            "{}",
            c.rel
        );
        // drive 1 (checked before drive 2) loses its file, then its folder
        std::fs::remove_file(&m.drives[1].file).unwrap();
        assert_eq!(
            err(&o.out),
            format!("{label}: No such file or directory (os error 2) (the drive's data file is missing)"),
            "{}",
            c.rel
        );
        std::fs::remove_dir_all(&o.drives[1]).unwrap();
        assert_eq!(
            err(&o.out),
            format!("{label}: the drive's folder is missing (is the drive mounted?)"),
            "{}",
            c.rel
        );
        // verify checks the pack as opening it does
        let e = format!("{:#}", verify_pack(&o.out).unwrap_err());
        assert_eq!(
            e,
            format!("{label}: the drive's folder is missing (is the drive mounted?)")
        );
    }
}

#[test]
fn the_cli_packs_verifies_and_runs_fp8_and_mxfp4_packs_as_it_runs_their_sources() {
    let deltafin = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_deltafin"))
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{args:?}: {err}");
        String::from_utf8(out.stdout).unwrap()
    };
    for c in [&CASES[1], &CASES[5]] {
        let tmp = tempfile::tempdir().unwrap();
        let o = pack_opts(tmp.path(), 2, PackPlacement::Spread);
        let drives = format!("{},{}", o.drives[0].display(), o.drives[1].display());
        let (src, pack) = (c.src(), o.out.to_str().unwrap());
        let src = src.to_str().unwrap();
        deltafin(&[
            "pack",
            "-m",
            src,
            "--out",
            pack,
            "--drives",
            &drives,
            "--placement",
            "spread",
        ]);
        assert_eq!(
            deltafin(&["pack", "--verify", pack]),
            format!("{pack}: all {} checksums match\n", c.checked)
        );
        let run = |m: &str| {
            deltafin(&[
                "run",
                "-m",
                m,
                "-p",
                "hello world",
                "-n",
                "8",
                "--temp",
                "0",
            ])
        };
        let want = run(src);
        assert!(want.starts_with("hello world"), "{}: {want}", c.rel);
        assert_eq!(run(pack), want, "{}", c.rel);
    }
}
