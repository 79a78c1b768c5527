//! Packs of tiny synthetic qwen3_moe checkpoints (`synth --preset tiny`: 3 layers, 16
//! experts, top-4), as a Hugging Face folder (BF16 experts of 12 KiB) and as a `qwen3moe` GGUF
//! file (Q4_0), and of the llama.cpp-converted `qwen3moe` (Q8_0) and Mixtral (`llama`, Q4_0)
//! GGUF fixtures, written on the fly into tempdirs standing for drives: logits bit-identical
//! to the source for both placements on 1, 2 and 3 drives with the source's bytes unchanged,
//! the GGUF metadata kept in the spine file, exact reads per drive file for a decode step,
//! resuming an interrupted pack, `--verify` naming a flipped expert, and failures (missing
//! drive folder or file, short file, checksum mismatch, file truncated mid-run) whose exact
//! messages name the drive, its file and the (layer, expert); families the registry does not
//! pack are refused by name. The other MoE families' packs: `tests/pack_families.rs`.

mod common;

use std::path::{Path, PathBuf};

use common::hf;
use common::pack::{bits, expert_in, flip, opts, pack_of, pack_opts, session, sha256, try_session};
use common::prompt_and_greedy_logits;
use deltafin::engine::Session;
use deltafin::models::Logits;
use deltafin::quant::GgmlType;
use deltafin::source::gguf::{GgufModel, Value};
use deltafin::source::pack::{open_gguf_pack, open_pack, Manifest};
use deltafin::store::{EngineChoice, PrefetchMode};
use deltafin::write::gguf_writer::GgufWriter;
use deltafin::write::pack::{verify_pack, write_pack, PackPlacement};
use deltafin::write::synth::qwen3_moe_gguf::write_qwen3moe_gguf;
use deltafin::write::synth::{presets, write_qwen3_moe};

const PROMPT: [u32; 10] = [17, 300, 42, 99, 5, 256, 411, 3, 77, 128];
const DECODE: usize = 4;

/// The synthetic source's format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Hf,
    Gguf,
}

impl Kind {
    /// A RAM budget that keeps the spine and head resident and reads every expert on demand.
    fn budget(self) -> u64 {
        match self {
            Kind::Hf => 800 << 10,
            Kind::Gguf => 384 << 10,
        }
    }
}

struct Packed {
    _tmp: tempfile::TempDir,
    src: PathBuf,
    pack: PathBuf,
    drives: Vec<PathBuf>,
}

fn source(tmp: &Path, kind: Kind) -> PathBuf {
    let shape = presets()[0].2.clone();
    match kind {
        Kind::Hf => {
            let src = tmp.join("src");
            std::fs::create_dir_all(&src).unwrap();
            write_qwen3_moe(&shape, &src, 200_000, 3, &mut |_, _| {}).unwrap();
            src
        }
        Kind::Gguf => {
            let src = tmp.join("src.gguf");
            write_qwen3moe_gguf(&shape, GgmlType::Q4_0, &src, 3, &mut |_, _| {}).unwrap();
            src
        }
    }
}

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gguf")
        .join(rel)
}

fn packed(kind: Kind, n: usize, placement: PackPlacement) -> Packed {
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path(), kind);
    let o = pack_opts(tmp.path(), n, placement);
    write_pack(&src, &o).unwrap();
    Packed {
        src,
        pack: o.out.clone(),
        drives: o.drives.clone(),
        _tmp: tmp,
    }
}

/// Prompt logits (every position) and `DECODE` greedy steps' logits.
fn logits(s: &mut Session) -> Vec<f32> {
    prompt_and_greedy_logits(s, &PROMPT, DECODE)
}

#[test]
fn logits_from_packs_are_bit_identical_to_the_source() {
    for placement in [PackPlacement::Stripe, PackPlacement::Spread] {
        for n in [1, 3] {
            let p = packed(Kind::Hf, n, placement);
            let want = bits(&logits(&mut session(
                &p.src,
                &opts(Some(Kind::Hf.budget()), false),
            )));
            assert_eq!(want.len(), (PROMPT.len() + DECODE) * 512);
            for (budget, verify) in [
                (Some(Kind::Hf.budget()), true),
                (Some(Kind::Hf.budget()), false),
                (None, false),
            ] {
                let got = bits(&logits(&mut session(&p.pack, &opts(budget, verify))));
                assert!(
                    got == want,
                    "{placement:?} on {n} drives, budget {budget:?}"
                );
            }
        }
    }
}

#[test]
fn gguf_packs_give_the_sources_logits_bit_for_bit_and_leave_the_source_untouched() {
    let tmp = tempfile::tempdir().unwrap();
    let sources = [
        source(tmp.path(), Kind::Gguf),
        fixture("qwen3_moe/qwen3_moe-q8_0.gguf"),
        fixture("mixtral/mixtral-q4_0.gguf"),
    ];
    for src in &sources {
        let before = sha256(src);
        let g = GgufModel::open(src).unwrap();
        let arch = g.architecture().unwrap().to_string();
        let n_layers = g.get_u64(&format!("{arch}.block_count")).unwrap() as usize;
        let n_exp = g.get_u64(&format!("{arch}.expert_count")).unwrap() as usize;
        // every layer is sparse: three stacked expert tensors per layer, the rest is spine
        let n_spine = g.tensors.len() - 3 * n_layers;
        let want = bits(&logits(&mut session(src, &opts(None, false))));
        let vocab = g.tensor("token_embd.weight").unwrap().shape[1] as usize;
        assert_eq!(want.len(), (PROMPT.len() + DECODE) * vocab);
        for (n, placement) in [
            (1, PackPlacement::Stripe),
            (2, PackPlacement::Stripe),
            (1, PackPlacement::Spread),
            (2, PackPlacement::Spread),
        ] {
            let (_t, o) = pack_of(src, n, placement);
            let m = Manifest::read(&o.out).unwrap();
            assert_eq!(
                (m.source.format.as_str(), m.source.architecture.as_str()),
                ("gguf", arch.as_str())
            );
            assert_eq!(m.experts.len(), n_layers * n_exp);
            // a record is expert E's gate, up and down slices, each at a 4 KiB boundary
            let t = |name: &str| m.tensors.iter().find(|t| t.name == name).unwrap();
            let (gate, up, down) = (
                t("blk.1.ffn_gate_exps.weight[5]"),
                t("blk.1.ffn_up_exps.weight[5]"),
                t("blk.1.ffn_down_exps.weight[5]"),
            );
            let stacked = g.tensor("blk.1.ffn_gate_exps.weight").unwrap();
            assert_eq!(gate.n_bytes, stacked.n_bytes / n_exp as u64);
            assert_eq!(gate.shape, stacked.shape[..2].to_vec());
            assert_eq!(up.offset, gate.offset + gate.n_bytes.next_multiple_of(4096));
            assert_eq!(down.offset, up.offset + up.n_bytes.next_multiple_of(4096));
            let r = &m.experts[n_exp + 5];
            assert_eq!(
                (r.layer, r.expert, r.len),
                (1, 5, down.offset + down.n_bytes - gate.offset)
            );
            // the spine file is a GGUF file with the source's metadata and the spine tensors
            let spine = GgufModel::open(&o.out.join("spine.bin")).unwrap();
            assert_eq!(spine.metadata, g.metadata);
            assert_eq!(spine.tensors.len(), n_spine);
            for (budget, verify, prefetch) in [
                (Some(384 << 10), true, PrefetchMode::Off),
                (Some(384 << 10), false, PrefetchMode::On),
                (Some(640 << 10), false, PrefetchMode::Auto),
                (None, false, PrefetchMode::Off),
            ] {
                let mut lo = opts(budget, verify);
                lo.experts.prefetch = prefetch;
                let mut s = session(&o.out, &lo);
                // 384 KiB: every expert read on demand, 640 KiB: some models hold them all
                if budget != Some(640 << 10) {
                    assert_eq!(s.store.experts().is_some(), budget.is_some());
                }
                assert!(
                    bits(&logits(&mut s)) == want,
                    "{src:?}: {placement:?} on {n} drives, budget {budget:?}, prefetch {prefetch}"
                );
                if prefetch == PrefetchMode::On {
                    assert!(s.store.experts().unwrap().counters().prefetch_reads > 0);
                }
            }
            let (count, bad) = verify_pack(&o.out).unwrap();
            assert_eq!(
                (count, bad.len()),
                (1 + n_spine + n_layers * n_exp, 0),
                "{bad:?}"
            );
        }
        assert_eq!(sha256(src), before, "{src:?} changed");
    }
}

#[test]
fn the_cli_packs_a_gguf_file_and_runs_the_pack_as_it_runs_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path(), Kind::Gguf);
    let o = pack_opts(tmp.path(), 2, PackPlacement::Spread);
    let deltafin = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_deltafin"))
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{args:?}: {err}");
        String::from_utf8(out.stdout).unwrap()
    };
    let drives = format!("{},{}", o.drives[0].display(), o.drives[1].display());
    let pack = o.out.to_str().unwrap();
    deltafin(&[
        "pack",
        "-m",
        src.to_str().unwrap(),
        "--out",
        pack,
        "--drives",
        &drives,
        "--placement",
        "spread",
    ]);
    let n = 1 + (3 * 9 + 3) + 48;
    assert_eq!(
        deltafin(&["pack", "--verify", pack]),
        format!("{pack}: all {n} checksums match\n")
    );
    let run = |m: &str| {
        deltafin(&[
            "run",
            "-m",
            m,
            "-p",
            "hello world",
            "-n",
            "12",
            "--temp",
            "0",
            "--ram-budget",
            "384K",
        ])
    };
    let want = run(src.to_str().unwrap());
    assert!(
        want.starts_with("hello world") && want.len() > "hello world".len(),
        "{want}"
    );
    assert_eq!(run(pack), want);
}

/// Per-file (bytes, reads) of the store's files during one decode step.
fn decode_step_reads(p: &Packed, kind: Kind) -> Vec<(u64, u64)> {
    let mut s = session(&p.pack, &opts(Some(kind.budget()), false));
    let l = s.prefill(&PROMPT, Logits::Last).unwrap();
    let before = s.store.experts().unwrap().file_counters();
    s.model
        .forward(&mut s.store, &mut s.cache, &[hf::argmax(&l)], Logits::Last)
        .unwrap();
    let after = s.store.experts().unwrap().file_counters();
    before
        .iter()
        .zip(&after)
        .map(|(b, a)| (a.bytes - b.bytes, a.reads - b.reads))
        .collect()
}

#[test]
fn a_decode_step_reads_every_drive_once_per_expert_with_stripe() {
    for kind in [Kind::Hf, Kind::Gguf] {
        let p = packed(kind, 3, PackPlacement::Stripe);
        let m = Manifest::read(&p.pack).unwrap();
        let chunk = m.stripe_chunk.unwrap();
        // a record: gate, up and down, each 4 KiB-aligned (BF16: 4 KiB each; Q4_0: 1152 bytes)
        let rec = m.experts[0].len;
        assert_eq!(
            rec,
            if kind == Kind::Hf {
                3 * 4096
            } else {
                2 * 4096 + 1152
            }
        );
        assert_eq!(chunk, (rec.div_ceil(3)).div_ceil(4096) * 4096);
        let last = (rec - 2 * chunk).div_ceil(4096) * 4096;
        let got = decode_step_reads(&p, kind);
        // file 0 is the spine (resident): no expert reads; 3 layers × top-4 = 12 experts
        assert_eq!(
            got,
            vec![(0, 0), (12 * chunk, 12), (12 * chunk, 12), (12 * last, 12)],
            "{kind:?}"
        );
    }
}

#[test]
fn a_decode_step_reads_one_drive_per_expert_with_spread() {
    for kind in [Kind::Hf, Kind::Gguf] {
        let p = packed(kind, 3, PackPlacement::Spread);
        let m = Manifest::read(&p.pack).unwrap();
        let rec = m.experts[0].len.div_ceil(4096) * 4096;
        // each layer's 16 experts dealt 0,1,2, 2,1,0, 0,1,2, 2,1,0, 0,1,2, 2: 5, 5, 6 per drive
        let per_drive: Vec<usize> = (0..3)
            .map(|d| {
                m.experts
                    .iter()
                    .filter(|r| r.layer == 0 && r.extents[0].drive == d)
                    .count()
            })
            .collect();
        assert_eq!(per_drive, vec![5, 5, 6]);
        assert!(m.experts.iter().all(|r| r.extents.len() == 1));
        let got = decode_step_reads(&p, kind);
        assert_eq!(got[0], (0, 0));
        let reads: u64 = got.iter().map(|x| x.1).sum();
        assert_eq!(reads, 12, "{kind:?} {got:?}");
        for (b, r) in &got[1..] {
            assert_eq!(*b, r * rec, "{kind:?} {got:?}");
        }
    }
}

#[test]
fn an_interrupted_pack_is_refused_and_resumes_where_it_stopped() {
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path(), Kind::Hf);
    let mut o = pack_opts(tmp.path(), 2, PackPlacement::Stripe);
    o.stop_after = Some(20);
    let e = format!("{:#}", write_pack(&src, &o).unwrap_err());
    assert!(e.contains("interrupted after 20 expert records"), "{e}");
    let e = format!("{:#}", open_pack(&o.out).unwrap_err());
    assert!(e.contains("the pack was not finished"), "{e}");
    o.stop_after = None;
    let rep = write_pack(&src, &o).unwrap();
    let done = Manifest::read(&o.out).unwrap();
    let n_spine = done.tensors.iter().filter(|t| t.file == 0).count();
    // the copied files are verified too, each against its recorded checksum
    let n_copied = done.copied_files.len();
    assert_eq!(
        done.file_sha256.keys().collect::<Vec<_>>(),
        done.copied_files.iter().collect::<Vec<_>>()
    );
    assert!(done.copied_files.contains(&"tokenizer.json".to_string()));
    // 48 experts: 20 done before, 28 now; the spine tensors were done too
    assert_eq!(rep.skipped, 20 + n_spine);
    assert_eq!(rep.written, 28);
    let (n, bad) = verify_pack(&o.out).unwrap();
    assert_eq!((n, bad.len()), (48 + n_spine + n_copied, 0));
    let want = bits(&logits(&mut session(
        &src,
        &opts(Some(Kind::Hf.budget()), false),
    )));
    let got = bits(&logits(&mut session(
        &o.out,
        &opts(Some(Kind::Hf.budget()), true),
    )));
    assert!(got == want);
    // a third run finds everything done (the manifest's checksums, read back)
    let rep = write_pack(&src, &o).unwrap();
    assert_eq!((rep.written, rep.skipped), (0, 48 + n_spine));
    assert!(open_pack(&o.out).is_ok());
    // a pack opens only as the kind of model it was made of
    let e = format!("{:#}", open_gguf_pack(&o.out).unwrap_err());
    assert_eq!(
        e,
        format!(
            "{}: a pack of a 'hf' model, not of a 'gguf' one",
            o.out.display()
        )
    );
}

#[test]
fn verify_names_the_expert_with_a_flipped_byte() {
    for kind in [Kind::Hf, Kind::Gguf] {
        let p = packed(kind, 3, PackPlacement::Spread);
        let m = Manifest::read(&p.pack).unwrap();
        let file = flip(&p.pack, 1, 5);
        let (n, bad) = verify_pack(&p.pack).unwrap();
        assert!(n > 48);
        let d = m.experts[16 + 5].extents[0].drive;
        assert_eq!(m.drives[d].file, file.display().to_string());
        assert_eq!(
            bad,
            vec![format!(
                "expert 5 of layer 1 on drive {d} ({}), file {}: checksum mismatch",
                m.drives[d].path, m.drives[d].file
            )],
            "{kind:?}"
        );
    }
}

#[test]
fn a_checksum_mismatch_ends_the_generation_when_verification_is_on() {
    for (kind, placement) in [
        (Kind::Hf, PackPlacement::Stripe),
        (Kind::Hf, PackPlacement::Spread),
        (Kind::Gguf, PackPlacement::Spread),
    ] {
        let p = packed(kind, 3, placement);
        let m = Manifest::read(&p.pack).unwrap();
        // every expert of layer 0 damaged, so whichever the router picks fails
        for e in 0..16 {
            flip(&p.pack, 0, e);
        }
        let mut s = session(&p.pack, &opts(Some(kind.budget()), true));
        let e = format!("{:#}", s.prefill(&PROMPT, Logits::Last).unwrap_err());
        let x = expert_in(&e);
        let drives: Vec<String> = m.experts[x]
            .extents
            .iter()
            .map(|d| m.drive_label(d.drive))
            .collect();
        assert_eq!(
            e,
            format!(
                "checksum mismatch in expert {x} of layer 0 read from {}",
                drives.join("; ")
            ),
            "{kind:?} {placement:?}"
        );
        // the label names the drive by its index and folder, then the file
        assert_eq!(
            m.drive_label(0),
            format!(
                "drive 0 ({}), file {}",
                p.drives[0].canonicalize().unwrap().display(),
                m.drives[0].file
            )
        );
        // off by default: the damaged bytes are used as they are
        let mut s = session(&p.pack, &opts(Some(kind.budget()), false));
        s.prefill(&PROMPT, Logits::Last).unwrap();
    }
}

#[test]
fn a_missing_drive_folder_or_file_is_named_at_load() {
    for kind in [Kind::Hf, Kind::Gguf] {
        let p = packed(kind, 3, PackPlacement::Stripe);
        let m = Manifest::read(&p.pack).unwrap();
        let label = format!("drive 1 ({}), file {}", m.drives[1].path, m.drives[1].file);
        assert_eq!(m.drive_label(1), label);
        std::fs::remove_file(&m.drives[1].file).unwrap();
        let e = format!(
            "{:#}",
            try_session(&p.pack, &opts(None, false)).err().unwrap()
        );
        assert_eq!(
            e,
            format!("{label}: No such file or directory (os error 2) (the drive's data file is missing)")
        );
        std::fs::remove_dir_all(&p.drives[1]).unwrap();
        let e = format!(
            "{:#}",
            try_session(&p.pack, &opts(None, false)).err().unwrap()
        );
        assert_eq!(
            e,
            format!("{label}: the drive's folder is missing (is the drive mounted?)"),
            "{kind:?}"
        );
        // verify checks the pack as opening it does
        let e = format!("{:#}", verify_pack(&p.pack).unwrap_err());
        assert_eq!(
            e,
            format!("{label}: the drive's folder is missing (is the drive mounted?)")
        );
    }
}

#[test]
fn a_short_drive_file_names_the_drive_and_the_first_expert_cut_off() {
    let p = packed(Kind::Gguf, 2, PackPlacement::Spread);
    let m = Manifest::read(&p.pack).unwrap();
    let f = &m.drives[0].file;
    // cut drive 0 inside its record of expert 4 of layer 2 (its last but one record)
    let r = m
        .experts
        .iter()
        .find(|r| r.layer == 2 && r.expert == 4)
        .unwrap();
    assert_eq!(r.extents[0].drive, 0);
    let cut = r.extents[0].offset + 10;
    std::fs::OpenOptions::new()
        .write(true)
        .open(f)
        .unwrap()
        .set_len(cut)
        .unwrap();
    let e = format!(
        "{:#}",
        try_session(&p.pack, &opts(None, false)).err().unwrap()
    );
    assert_eq!(
        e,
        format!(
            "{}: the file is {cut} bytes but the manifest says {} (expert 4 of layer 2 lies past its end)",
            m.drive_label(0),
            m.drives[0].len
        )
    );
}

#[test]
fn a_file_truncated_mid_run_ends_the_pass_naming_the_drive_file_and_expert() {
    for (kind, engine) in [
        (Kind::Hf, EngineChoice::Auto),
        (Kind::Hf, EngineChoice::Pool),
        (Kind::Gguf, EngineChoice::Auto),
        (Kind::Gguf, EngineChoice::Pool),
    ] {
        let p = packed(kind, 3, PackPlacement::Stripe);
        let mut o = opts(Some(kind.budget()), false);
        o.experts.io.engine = engine;
        let mut s = session(&p.pack, &o);
        s.prefill(&PROMPT[..3], Logits::Last).unwrap();
        // drive 2's file loses every record while the session runs
        let m = Manifest::read(&p.pack).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&m.drives[2].file)
            .unwrap()
            .set_len(0)
            .unwrap();
        for _ in 0..2 {
            let e = format!("{:#}", s.prefill(&PROMPT[3..], Logits::Last).unwrap_err());
            // expert x of layer 0 is record x; its chunk on drive 2 is its third extent
            let x = expert_in(&e);
            let ext = &m.experts[x].extents[2];
            assert_eq!(
                e,
                format!(
                    "{}: short read at offset {} (0 of {} bytes; the file is 0 bytes) (expert {x} of layer 0)",
                    m.drive_label(2),
                    ext.offset,
                    ext.len
                ),
                "{kind:?} {engine:?}"
            );
        }
        assert_eq!(s.store.experts().unwrap().engine().outstanding(), 0);
    }
}

#[test]
fn other_architectures_are_refused_by_name_and_a_pack_opens_as_its_source_kind() {
    let tmp = tempfile::tempdir().unwrap();
    // a dense family the registry does not pack (Gemma 3), and a model_type no family loads
    let gemma = tmp.path().join("gemma3.gguf");
    let mut w = GgufWriter::new();
    w.add("general.architecture", Value::String("gemma3".into()))
        .add_f32_tensor("token_embd.weight", &[2, 1], &[1.0, 2.0]);
    w.write(&gemma).unwrap();
    let other = tmp.path().join("bert");
    std::fs::create_dir_all(&other).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(hf::fixture("qwen3").join(f), other.join(f)).unwrap();
    }
    let config = std::fs::read_to_string(other.join("config.json")).unwrap();
    let config = config.replace("\"qwen3\"", "\"bert\"");
    std::fs::write(other.join("config.json"), config).unwrap();
    for (src, want) in [
        (
            gemma,
            "packing GGUF architecture 'gemma3' is not supported yet (supported: qwen3moe, qwen3, llama, gpt-oss, deepseek2, kimi-linear, kimi-k3)",
        ),
        (
            other,
            "packing model_type 'bert' is not supported yet (supported: qwen3, qwen3_moe, llama, mixtral, gpt_oss, deepseek_v3, kimi_k2, kimi_linear, kimi_k3)",
        ),
    ] {
        let o = pack_opts(tmp.path(), 1, PackPlacement::Stripe);
        let e = format!("{:#}", write_pack(&src, &o).unwrap_err());
        assert_eq!(e, format!("{}: {want}", src.display()));
    }
    let p = packed(Kind::Gguf, 1, PackPlacement::Stripe);
    let e = format!("{:#}", open_pack(&p.pack).unwrap_err());
    assert_eq!(
        e,
        format!(
            "{}: a pack of a 'gguf' model, not of a 'hf' one",
            p.pack.display()
        )
    );
    assert!(open_gguf_pack(&p.pack).unwrap().pack.is_some());
}
