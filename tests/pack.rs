//! Packs of a tiny synthetic qwen3_moe checkpoint (`synth --preset tiny`: 3 layers, 16
//! experts of 12 KiB, top-4), written on the fly into tempdirs standing for drives: logits
//! bit-identical to the source for both placements on 1 and 3 drives, exact reads per drive
//! file for a decode step, resuming an interrupted pack, `--verify` naming a flipped expert,
//! and failures (missing drive file, short file, checksum mismatch, I/O error mid-run) that
//! name the drive file and the (layer, expert).

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use deltafin::engine::Session;
use deltafin::models::{load_hf_model, LoadOptions, Logits};
use deltafin::source::hf::HfModel;
use deltafin::source::pack::{open_pack, Manifest};
use deltafin::source::pack_write::{verify_pack, write_pack, PackOptions, PackPlacement};
use deltafin::source::synth::{presets, write_qwen3_moe};
use deltafin::store::{CachePolicy, EngineChoice, ExpertStoreOptions, IoOptions};

const PROMPT: [u32; 10] = [17, 300, 42, 99, 5, 256, 411, 3, 77, 128];
const DECODE: usize = 4;
/// Spine and head resident, experts through the store.
const BUDGET: u64 = 800 << 10;

struct Packed {
    _tmp: tempfile::TempDir,
    src: PathBuf,
    pack: PathBuf,
    drives: Vec<PathBuf>,
}

fn source(tmp: &Path) -> PathBuf {
    let src = tmp.join("src");
    std::fs::create_dir_all(&src).unwrap();
    write_qwen3_moe(&presets()[0].2.clone(), &src, 200_000, 3, &mut |_, _| {}).unwrap();
    src
}

fn pack_opts(tmp: &Path, n: usize, placement: PackPlacement) -> PackOptions {
    let drives: Vec<PathBuf> = (0..n).map(|d| tmp.join(format!("drive{d}"))).collect();
    for d in &drives {
        std::fs::create_dir_all(d).unwrap();
    }
    PackOptions {
        out: tmp.join("pack"),
        drives,
        placement,
        heat_file: None,
        progress: false,
        stop_after: None,
    }
}

fn packed(n: usize, placement: PackPlacement) -> Packed {
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path());
    let o = pack_opts(tmp.path(), n, placement);
    write_pack(&src, &o).unwrap();
    Packed {
        src,
        pack: o.out.clone(),
        drives: o.drives.clone(),
        _tmp: tmp,
    }
}

fn opts(budget: Option<u64>, verify: bool) -> LoadOptions {
    LoadOptions {
        ram_budget: budget,
        n_ctx: 64,
        n_batch: 64,
        direct_io: true,
        experts: ExpertStoreOptions {
            cache: CachePolicy::None,
            io: IoOptions {
                engine: EngineChoice::Auto,
                depth: 8,
                request_bytes: 1 << 20,
                ..IoOptions::default()
            },
            heat_file: None,
            verify,
            ..ExpertStoreOptions::default()
        },
    }
}

fn session(hf: &HfModel, o: &LoadOptions) -> Session {
    let (m, s) = load_hf_model(hf, o).unwrap();
    Session::new(m, s, 64, 64)
}

fn argmax(l: &[f32]) -> u32 {
    let mut b = 0;
    for (i, &v) in l.iter().enumerate() {
        if v > l[b] {
            b = i;
        }
    }
    b as u32
}

/// Prompt logits (every position) and `DECODE` greedy steps' logits.
fn logits(s: &mut Session) -> Vec<f32> {
    let mut all = s.prefill(&PROMPT, Logits::All).unwrap();
    let v = s.model.vocab_size();
    let mut last = all[all.len() - v..].to_vec();
    for _ in 0..DECODE {
        last = s
            .model
            .forward(&mut s.store, &mut s.cache, &[argmax(&last)], Logits::Last)
            .unwrap();
        all.extend_from_slice(&last);
    }
    all
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn logits_from_packs_are_bit_identical_to_the_source() {
    for placement in [PackPlacement::Stripe, PackPlacement::Spread] {
        for n in [1, 3] {
            let p = packed(n, placement);
            let want = bits(&logits(&mut session(
                &HfModel::open(&p.src).unwrap(),
                &opts(Some(BUDGET), false),
            )));
            assert_eq!(want.len(), (PROMPT.len() + DECODE) * 512);
            let hf = open_pack(&p.pack).unwrap();
            for (budget, verify) in [(Some(BUDGET), true), (Some(BUDGET), false), (None, false)] {
                let got = bits(&logits(&mut session(&hf, &opts(budget, verify))));
                assert!(
                    got == want,
                    "{placement:?} on {n} drives, budget {budget:?}"
                );
            }
        }
    }
}

/// Per-file (bytes, reads) of the store's files during one decode step.
fn decode_step_reads(p: &Packed) -> Vec<(u64, u64)> {
    let hf = open_pack(&p.pack).unwrap();
    let mut s = session(&hf, &opts(Some(BUDGET), false));
    let l = s.prefill(&PROMPT, Logits::Last).unwrap();
    let before = s.store.experts().unwrap().file_counters();
    s.model
        .forward(&mut s.store, &mut s.cache, &[argmax(&l)], Logits::Last)
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
    let p = packed(3, PackPlacement::Stripe);
    let m = Manifest::read(&p.pack).unwrap();
    let chunk = m.stripe_chunk.unwrap();
    // a record: gate, up (12 KiB... each 4 KiB-aligned) and down
    let rec = m.experts[0].len;
    assert_eq!(chunk, (rec.div_ceil(3)).div_ceil(4096) * 4096);
    let last = (rec - 2 * chunk).div_ceil(4096) * 4096;
    let got = decode_step_reads(&p);
    // file 0 is the spine (resident): no expert reads; 3 layers × top-4 = 12 experts
    assert_eq!(
        got,
        vec![(0, 0), (12 * chunk, 12), (12 * chunk, 12), (12 * last, 12)]
    );
}

#[test]
fn a_decode_step_reads_one_drive_per_expert_with_spread() {
    let p = packed(3, PackPlacement::Spread);
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
    let got = decode_step_reads(&p);
    assert_eq!(got[0], (0, 0));
    let reads: u64 = got.iter().map(|x| x.1).sum();
    assert_eq!(reads, 12, "{got:?}");
    for (b, r) in &got[1..] {
        assert_eq!(*b, r * rec, "{got:?}");
    }
}

#[test]
fn an_interrupted_pack_is_refused_and_resumes_where_it_stopped() {
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path());
    let mut o = pack_opts(tmp.path(), 2, PackPlacement::Stripe);
    o.stop_after = Some(20);
    let e = format!("{:#}", write_pack(&src, &o).unwrap_err());
    assert!(e.contains("interrupted after 20 expert records"), "{e}");
    let e = format!("{:#}", open_pack(&o.out).unwrap_err());
    assert!(e.contains("the pack was not finished"), "{e}");
    o.stop_after = None;
    let rep = write_pack(&src, &o).unwrap();
    let n_spine = Manifest::read(&o.out)
        .unwrap()
        .tensors
        .iter()
        .filter(|t| t.file == 0)
        .count();
    // 48 experts: 20 done before, 28 now; the spine tensors were done too
    assert_eq!(rep.skipped, 20 + n_spine);
    assert_eq!(rep.written, 28);
    let (n, bad) = verify_pack(&o.out).unwrap();
    assert_eq!((n, bad.len()), (48 + n_spine, 0));
    let want = bits(&logits(&mut session(
        &HfModel::open(&src).unwrap(),
        &opts(Some(BUDGET), false),
    )));
    let got = bits(&logits(&mut session(
        &open_pack(&o.out).unwrap(),
        &opts(Some(BUDGET), true),
    )));
    assert!(got == want);
    // a third run finds everything done (the manifest's checksums, read back)
    let rep = write_pack(&src, &o).unwrap();
    assert_eq!((rep.written, rep.skipped), (0, 48 + n_spine));
    assert!(open_pack(&o.out).is_ok());
}

/// Flips one byte of expert `e` of layer `l` in its first extent.
fn flip(p: &Packed, l: usize, e: usize) -> PathBuf {
    let m = Manifest::read(&p.pack).unwrap();
    let r = m
        .experts
        .iter()
        .find(|r| r.layer == l && r.expert == e)
        .unwrap();
    let x = &r.extents[0];
    let file = PathBuf::from(&m.drives[x.drive].file);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&file)
        .unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, x.offset + 100).unwrap();
    f.write_all_at(&[b[0] ^ 0x10], x.offset + 100).unwrap();
    file
}

#[test]
fn verify_names_the_expert_with_a_flipped_byte() {
    let p = packed(3, PackPlacement::Spread);
    let file = flip(&p, 1, 5);
    let (n, bad) = verify_pack(&p.pack).unwrap();
    assert!(n > 48);
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(
        bad[0].contains("expert 5 of layer 1")
            && bad[0].contains(&file.display().to_string())
            && bad[0].contains("checksum mismatch"),
        "{}",
        bad[0]
    );
}

#[test]
fn a_checksum_mismatch_ends_the_generation_when_verification_is_on() {
    for placement in [PackPlacement::Stripe, PackPlacement::Spread] {
        let p = packed(3, placement);
        // every expert of layer 0 damaged, so whichever the router picks fails
        let files: Vec<PathBuf> = (0..16).map(|e| flip(&p, 0, e)).collect();
        let hf = open_pack(&p.pack).unwrap();
        let mut s = session(&hf, &opts(Some(BUDGET), true));
        let e = format!("{:#}", s.prefill(&PROMPT, Logits::Last).unwrap_err());
        assert!(
            e.contains("checksum mismatch in expert")
                && e.contains("of layer 0 read from")
                && files.iter().any(|f| e.contains(&f.display().to_string())),
            "{placement:?}: {e}"
        );
        // off by default: the damaged bytes are used as they are
        let mut s = session(&hf, &opts(Some(BUDGET), false));
        s.prefill(&PROMPT, Logits::Last).unwrap();
    }
}

#[test]
fn a_missing_drive_file_is_named_at_load() {
    let p = packed(3, PackPlacement::Stripe);
    let m = Manifest::read(&p.pack).unwrap();
    std::fs::remove_file(&m.drives[1].file).unwrap();
    let e = format!("{:#}", open_pack(&p.pack).unwrap_err());
    assert!(
        e.contains(&format!("drive 1 ({})", p.drives[1].display()))
            && e.contains(&m.drives[1].file)
            && e.contains("the drive's data file is missing"),
        "{e}"
    );
}

#[test]
fn a_short_drive_file_names_the_drive_and_the_first_expert_cut_off() {
    let p = packed(2, PackPlacement::Spread);
    let m = Manifest::read(&p.pack).unwrap();
    let f = &m.drives[0].file;
    // cut drive 0 inside its record of expert 4 of layer 2 (its last but one record)
    let r = m
        .experts
        .iter()
        .find(|r| r.layer == 2 && r.expert == 4)
        .unwrap();
    assert_eq!(r.extents[0].drive, 0);
    std::fs::OpenOptions::new()
        .write(true)
        .open(f)
        .unwrap()
        .set_len(r.extents[0].offset + 10)
        .unwrap();
    let e = format!("{:#}", open_pack(&p.pack).unwrap_err());
    assert!(
        e.contains("drive 0 (")
            && e.contains(f)
            && e.contains("expert 4 of layer 2 lies past its end"),
        "{e}"
    );
}

#[test]
fn an_io_error_mid_run_ends_the_pass_naming_the_drive_file_and_expert() {
    for engine in [EngineChoice::Auto, EngineChoice::Pool] {
        let p = packed(3, PackPlacement::Stripe);
        let hf = open_pack(&p.pack).unwrap();
        let mut o = opts(Some(BUDGET), false);
        o.experts.io.engine = engine;
        let mut s = session(&hf, &o);
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
            assert!(
                e.contains(&m.drives[2].file)
                    && e.contains("short read")
                    && e.contains("of layer 0"),
                "{engine:?}: {e}"
            );
        }
        assert_eq!(s.store.experts().unwrap().engine().outstanding(), 0);
    }
}
