//! Packs under faults, concurrency and hostile manifests (issue 11, "Packs"), on a tiny
//! synthetic qwen3_moe Hugging Face folder (`synth --preset tiny`: 3 layers, 16 experts):
//! `--verify-experts` with resident experts and copied files, `--verify` of copied files, one
//! writer per pack folder, drive files unique per pack and never another pack's, a finished
//! pack kept when a re-run fails or differs, manifests checked field by field (open and
//! `--verify` alike), the configuration checked before anything is written, and an
//! out-of-space manifest write naming its file.

mod common;

use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use common::pack::{flip, opts, pack_opts, sha256, try_session};
use deltafin::source::pack::{open_pack, Manifest};
use deltafin::write::pack::{verify_pack, write_pack, PackOptions, PackPlacement};
use deltafin::write::synth::{presets, write_qwen3_moe};

/// A tiny qwen3_moe Hugging Face folder in `tmp/src`.
fn source(tmp: &Path) -> PathBuf {
    let src = tmp.join("src");
    std::fs::create_dir_all(&src).unwrap();
    write_qwen3_moe(&presets()[0].2, &src, 200_000, 3, &mut |_, _| {}).unwrap();
    src
}

/// `deltafin ARGS`: (success, stdout, stderr).
fn deltafin(args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_deltafin"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn verify_experts_checks_resident_experts_and_copied_files_at_load() {
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path());
    let o = pack_opts(tmp.path(), 2, PackPlacement::Spread);
    write_pack(&src, &o).unwrap();
    let m = Manifest::read(&o.out).unwrap();
    // a flipped byte in every record: with every expert resident, the first is named at load
    for r in &m.experts {
        flip(&o.out, r.layer, r.expert);
    }
    let e = format!(
        "{:#}",
        try_session(&o.out, &opts(None, true)).err().unwrap()
    );
    assert_eq!(
        e,
        format!(
            "checksum mismatch in expert 0 of layer 0 read from {}",
            m.drive_label(m.experts[0].extents[0].drive)
        )
    );
    assert!(try_session(&o.out, &opts(None, false)).is_ok());
    // the CLI: run and bench fail (the default budget holds every expert of this model)
    let pack = o.out.to_str().unwrap();
    for cmd in [
        vec!["run", "-m", pack, "-p", "hi", "-n", "2", "--verify-experts"],
        vec!["bench", "-m", pack, "-n", "2", "--verify-experts"],
    ] {
        let (ok, _, err) = deltafin(&cmd);
        assert!(!ok, "{cmd:?}");
        assert!(
            err.contains(&format!(
                "checksum mismatch in expert 0 of layer 0 read from {}",
                m.drive_label(m.experts[0].extents[0].drive)
            )),
            "{cmd:?}: {err}"
        );
    }
    // a copied file that changed is named too
    let (_t2, o2) = {
        let t = tempfile::tempdir().unwrap();
        let o = pack_opts(t.path(), 1, PackPlacement::Stripe);
        write_pack(&src, &o).unwrap();
        (t, o)
    };
    let tok = o2.out.join("tokenizer_config.json");
    std::fs::write(&tok, b"{}").unwrap();
    let e = format!(
        "{:#}",
        try_session(&o2.out, &opts(None, true)).err().unwrap()
    );
    assert_eq!(
        e,
        format!(
            "{}: checksum mismatch (the file differs from the one packed)",
            tok.display()
        )
    );
    // a model that is not a pack has nothing to verify: the flag is refused
    let e = format!("{:#}", try_session(&src, &opts(None, true)).err().unwrap());
    assert_eq!(
        e,
        format!(
            "--verify-experts: {} is not part of a pack (only packs carry checksums to verify)",
            src.join("model-00001-of-00005.safetensors").display()
        )
    );
}

#[test]
fn verify_covers_every_copied_file() {
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path());
    let o = pack_opts(tmp.path(), 1, PackPlacement::Stripe);
    write_pack(&src, &o).unwrap();
    let m = Manifest::read(&o.out).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json", "config.json"] {
        assert!(m.copied_files.contains(&f.to_string()), "{f}");
        assert_eq!(
            m.file_sha256[f],
            deltafin::source::pack::hex(&sha256(&o.out.join(f)))
        );
    }
    let (n, bad) = verify_pack(&o.out).unwrap();
    assert!(bad.is_empty(), "{bad:?}");
    let tok = o.out.join("tokenizer.json");
    let mut b = std::fs::read(&tok).unwrap();
    b.push(b' ');
    std::fs::write(&tok, &b).unwrap();
    std::fs::remove_file(o.out.join("tokenizer_config.json")).unwrap();
    let (n2, bad) = verify_pack(&o.out).unwrap();
    assert_eq!(n2, n);
    assert_eq!(
        bad,
        vec![
            format!("{}: checksum mismatch", tok.display()),
            format!(
                "{}: No such file or directory (os error 2)",
                o.out.join("tokenizer_config.json").display()
            ),
        ]
    );
    let (ok, _, err) = deltafin(&["pack", "--verify", o.out.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.contains(&format!(
            "{}: 2 of {n} checksums do not match",
            o.out.display()
        )),
        "{err}"
    );
}

#[test]
fn a_second_writer_of_the_same_pack_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path());
    let o = pack_opts(tmp.path(), 2, PackPlacement::Stripe);
    std::fs::create_dir_all(&o.out).unwrap();
    // another writer holds the lock
    let held = std::fs::File::create(o.out.join("pack.lock")).unwrap();
    assert_eq!(
        unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
    let e = format!("{:#}", write_pack(&src, &o).unwrap_err());
    assert_eq!(
        e,
        format!(
            "{}: another `deltafin pack` is writing this pack (pack.lock is locked); wait for it to finish",
            o.out.display()
        )
    );
    // it wrote nothing: no plan, no journal, no drive file
    let mut names: Vec<String> = std::fs::read_dir(&o.out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, vec!["pack.lock".to_string()]);
    assert_eq!(std::fs::read_dir(&o.drives[0]).unwrap().count(), 0);
    drop(held);
    write_pack(&src, &o).unwrap();
    assert!(verify_pack(&o.out).unwrap().1.is_empty());
}

#[test]
fn packs_never_share_or_take_over_a_drive_file() {
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path());
    let drive = tmp.path().join("drive");
    std::fs::create_dir_all(&drive).unwrap();
    let opts_at = |dir: &str, placement| {
        let mut o = pack_opts(&tmp.path().join(dir), 1, placement);
        o.drives = vec![drive.clone()];
        o
    };
    // two packs named `pack` in different folders, on the same drive
    let a = opts_at("a", PackPlacement::Stripe);
    write_pack(&src, &a).unwrap();
    let ma = Manifest::read(&a.out).unwrap();
    let before = sha256(Path::new(&ma.drives[0].file));
    let b = opts_at("b", PackPlacement::Spread);
    write_pack(&src, &b).unwrap();
    let mb = Manifest::read(&b.out).unwrap();
    assert_ne!(ma.drives[0].file, mb.drives[0].file);
    assert_eq!(sha256(Path::new(&ma.drives[0].file)), before);
    assert!(verify_pack(&a.out).unwrap().1.is_empty());
    assert!(verify_pack(&b.out).unwrap().1.is_empty());
    // pack a moved away: its manifest still owns its drive file, which a new pack at a's old
    // place would be named after
    let moved = tmp.path().join("c");
    std::fs::rename(tmp.path().join("a"), &moved).unwrap();
    let e = format!("{:#}", write_pack(&src, &a).unwrap_err());
    assert_eq!(
        e,
        format!(
            "{}: the file exists but is not part of the pack in {} (another pack's manifest may own it); remove it or choose another --out",
            ma.drive_label(0),
            a.out.display()
        )
    );
    assert_eq!(sha256(Path::new(&ma.drives[0].file)), before);
    assert!(verify_pack(&moved.join("pack")).unwrap().1.is_empty());
}

#[test]
fn a_finished_pack_survives_a_failed_or_different_rerun() {
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path());
    let mut o = pack_opts(tmp.path(), 2, PackPlacement::Stripe);
    write_pack(&src, &o).unwrap();
    let manifest = o.out.join("manifest.json");
    let before = std::fs::read(&manifest).unwrap();
    // a mistyped drive
    let mut typo = o.clone();
    typo.drives[1] = tmp.path().join("drvie1");
    let e = format!("{:#}", write_pack(&src, &typo).unwrap_err());
    assert_eq!(
        e,
        format!("drive {}: not a folder", typo.drives[1].display())
    );
    assert_eq!(std::fs::read(&manifest).unwrap(), before);
    // other settings: refused, the pack untouched
    let mut spread = o.clone();
    spread.placement = PackPlacement::Spread;
    let e = format!("{:#}", write_pack(&src, &spread).unwrap_err());
    let m = Manifest::read(&o.out).unwrap();
    assert_eq!(
        e,
        format!(
            "{}: holds a finished pack made with other settings or from another source (placement stripe, 2 drives: {}, {}); pass --overwrite to replace it",
            o.out.display(),
            m.drives[0].path,
            m.drives[1].path
        )
    );
    assert_eq!(std::fs::read(&manifest).unwrap(), before);
    assert!(open_pack(&o.out).is_ok());
    assert!(verify_pack(&o.out).unwrap().1.is_empty());
    // the same settings: nothing to do, nothing changed
    let rep = write_pack(&src, &o).unwrap();
    assert_eq!(rep.written, 0);
    assert_eq!(std::fs::read(&manifest).unwrap(), before);
    // asked for: replaced
    spread.overwrite = true;
    write_pack(&src, &spread).unwrap();
    assert_eq!(Manifest::read(&o.out).unwrap().placement, "spread");
    assert!(verify_pack(&o.out).unwrap().1.is_empty());
    o.overwrite = false;
    assert!(write_pack(&src, &o).is_err());
}

/// An edit of a manifest's JSON.
type Edit = dyn Fn(&mut serde_json::Value);

/// Edits the manifest of the pack in `dir` with `f`.
fn edit_manifest(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("manifest.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, serde_json::to_vec(&v).unwrap()).unwrap();
}

#[test]
fn hostile_manifests_are_refused_by_field_when_opened_and_verified() {
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path());
    let o = pack_opts(tmp.path(), 3, PackPlacement::Stripe);
    write_pack(&src, &o).unwrap();
    let good = std::fs::read(o.out.join("manifest.json")).unwrap();
    let mp = o.out.join("manifest.json").display().to_string();
    let n_tensors = Manifest::read(&o.out).unwrap().tensors.len();
    let cases: Vec<(Box<Edit>, String)> = vec![
        (
            Box::new(|v| v["stripe_chunk"] = 0.into()),
            format!("{mp}: stripe_chunk = 0 is not a positive multiple of 4096"),
        ),
        (
            Box::new(|v| v["experts"][0]["layer"] = 1_000_000_000_000u64.into()),
            format!(
                "{mp}: experts[0].layer = 1000000000000 is outside 0..{n_tensors} (the manifest lists {n_tensors} tensors)"
            ),
        ),
        (
            Box::new(|v| v["experts"][3]["expert"] = 4_000_000_000u64.into()),
            format!("{mp}: experts[3].expert = 4000000000 is outside 0..16 (layer 0 has 16 records)"),
        ),
        (
            Box::new(|v| v["experts"][3]["extents"][0]["drive"] = 9.into()),
            format!("{mp}: experts[3].extents[0].drive = 9 is outside 0..3"),
        ),
        (
            // record 3 of a 3-drive stripe of 4 KiB chunks: chunk 0 at 3 × 4096 on drive 0
            Box::new(|v| v["experts"][3]["extents"][0]["len"] = u64::MAX.into()),
            format!(
                "{mp}: experts[3].extents[0]: offset 12288 + len 18446744073709551615 is past drives[0].len = 196608"
            ),
        ),
        (
            Box::new(|v| v["tensors"][0]["ggml_type"] = 999.into()),
            format!("{mp}: tensors[0] ('model.embed_tokens.weight').ggml_type = 999 is not a known type"),
        ),
        (
            Box::new(|v| v["spine_file"] = "../../etc/passwd".into()),
            format!(
                "{mp}: spine_file = \"../../etc/passwd\" is not a file name inside the pack folder"
            ),
        ),
    ];
    for (edit, want) in cases {
        std::fs::write(o.out.join("manifest.json"), &good).unwrap();
        edit_manifest(&o.out, edit);
        let e = format!("{:#}", open_pack(&o.out).unwrap_err());
        assert_eq!(e, want);
        let e = format!("{:#}", verify_pack(&o.out).unwrap_err());
        assert_eq!(e, want);
    }
    // a manifest too large to be one (sparse: nothing is read), and a FIFO (no hang)
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(o.out.join("manifest.json"))
        .unwrap();
    f.set_len(300 << 20).unwrap();
    let e = format!("{:#}", open_pack(&o.out).unwrap_err());
    assert_eq!(
        e,
        format!("{mp}: 314572800 bytes, more than a manifest may hold (268435456)")
    );
    std::fs::remove_file(o.out.join("manifest.json")).unwrap();
    let c = std::ffi::CString::new(mp.as_bytes()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let e = format!("{:#}", verify_pack(&o.out).unwrap_err());
    assert_eq!(e, format!("{mp}: not a regular file"));
}

#[test]
fn an_invalid_config_is_refused_before_anything_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path());
    let cp = src.join("config.json");
    let c = std::fs::read_to_string(&cp).unwrap();
    assert!(c.contains("\"silu\""));
    std::fs::write(&cp, c.replace("\"silu\"", "\"gelu\"")).unwrap();
    let o = pack_opts(tmp.path(), 2, PackPlacement::Stripe);
    let e = format!("{:#}", write_pack(&src, &o).unwrap_err());
    assert_eq!(
        e,
        format!(
            "{}: hidden_act 'gelu' is not supported (only silu)",
            cp.display()
        )
    );
    assert!(!o.out.exists());
    assert_eq!(std::fs::read_dir(&o.drives[0]).unwrap().count(), 0);
}

/// `file` with the one occurrence of `from` replaced by `to` (same length: a tensor renamed in
/// a safetensors or GGUF header, its data untouched).
fn rename_in_header(file: &Path, from: &str, to: &str) {
    assert_eq!(from.len(), to.len());
    let b = std::fs::read(file).unwrap();
    let at = b
        .windows(from.len())
        .position(|w| w == from.as_bytes())
        .unwrap();
    assert!(!b[at + 1..]
        .windows(from.len())
        .any(|w| w == from.as_bytes()));
    let mut b = b;
    b[at..at + to.len()].copy_from_slice(to.as_bytes());
    std::fs::write(file, b).unwrap();
}

/// A source whose every tensor loading needs is present except one is refused by name before
/// anything is written (it used to pack and verify, and fail only at `run`): a spine tensor of a
/// Hugging Face folder, a stacked expert tensor of a GGUF file.
#[test]
fn a_missing_tensor_is_refused_before_anything_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path());
    let (name, other) = (
        "model.layers.1.self_attn.q_norm.weight",
        "model.layers.1.self_attn.q_nxrm.weight",
    );
    let ip = src.join("model.safetensors.index.json");
    let mut index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&ip).unwrap()).unwrap();
    let map = index["weight_map"].as_object_mut().unwrap();
    let shard = map.remove(name).unwrap();
    rename_in_header(&src.join(shard.as_str().unwrap()), name, other);
    map.insert(other.into(), shard);
    std::fs::write(&ip, serde_json::to_vec(&index).unwrap()).unwrap();
    let o = pack_opts(tmp.path(), 2, PackPlacement::Stripe);
    let e = format!("{:#}", write_pack(&src, &o).unwrap_err());
    assert_eq!(
        e,
        format!(
            "{}: tensor 'model.layers.1.self_attn.q_norm.weight' is missing",
            src.display()
        )
    );
    assert!(!o.out.exists());
    assert_eq!(std::fs::read_dir(&o.drives[0]).unwrap().count(), 0);

    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf/qwen3_moe");
    let g = tmp.path().join("m.gguf");
    std::fs::copy(fixtures.join("qwen3_moe-q8_0.gguf"), &g).unwrap();
    rename_in_header(
        &g,
        "blk.1.ffn_down_exps.weight",
        "blk.1.ffn_dxwn_exps.weight",
    );
    let (ok, _, err) = deltafin(&[
        "pack",
        "-m",
        g.to_str().unwrap(),
        "--out",
        o.out.to_str().unwrap(),
        "--drives",
        o.drives[0].to_str().unwrap(),
    ]);
    assert!(!ok);
    assert_eq!(
        err.trim(),
        format!(
            "error: {}: tensor 'blk.1.ffn_down_exps.weight' is missing",
            g.display()
        )
    );
    assert!(!o.out.exists());
    assert_eq!(std::fs::read_dir(&o.drives[0]).unwrap().count(), 0);
}

#[test]
fn out_of_space_while_writing_the_manifest_names_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path());
    let o = pack_opts(tmp.path(), 1, PackPlacement::Stripe);
    std::fs::create_dir_all(&o.out).unwrap();
    let tmp_manifest = o.out.join("manifest.json.tmp");
    std::os::unix::fs::symlink("/dev/full", &tmp_manifest).unwrap();
    let e = format!("{:#}", write_pack(&src, &o).unwrap_err());
    assert_eq!(
        e,
        format!(
            "{}: writing the pack's manifest: No space left on device (os error 28)",
            tmp_manifest.display()
        )
    );
    assert!(!o.out.join("manifest.json").exists());
    // the next run finds every record done and finishes the pack
    let rep = write_pack(&src, &o).unwrap();
    assert_eq!(rep.written, 0);
    assert!(verify_pack(&o.out).unwrap().1.is_empty());
}

/// Expert records are checked by default, with the XXH3-128 the manifest records beside each
/// SHA-256; `--no-verify-experts` opts out; a manifest written before XXH3-128 was recorded
/// still loads and is checked with SHA-256, as the placement line says.
#[test]
fn expert_reads_are_checked_by_default_with_xxh3() {
    use deltafin::store::checksum::xxh3_128;
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path());
    let o = pack_opts(tmp.path(), 1, PackPlacement::Stripe);
    write_pack(&src, &o).unwrap();
    let m = Manifest::read(&o.out).unwrap();
    let drive = std::fs::read(&m.drives[0].file).unwrap();
    for r in &m.experts {
        // one drive: the record is its one extent
        let x = &r.extents[0];
        let b = &drive[x.offset as usize..(x.offset + r.len) as usize];
        assert_eq!(
            r.xxh3.as_deref(),
            Some(deltafin::source::pack::hex(&xxh3_128(b)).as_str())
        );
    }
    let pack = o.out.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut a = vec![
            "run", "-m", pack, "-p", "hi", "-n", "2", "--temp", "0", "--stats",
        ];
        a.extend_from_slice(extra);
        deltafin(&a)
    };
    let (ok, good, err) = run(&[]);
    assert!(ok, "{err}");
    assert!(
        err.contains("; expert records checked with xxh3-128"),
        "{err}"
    );
    flip(&o.out, 1, 3);
    let (ok, _, err) = run(&[]);
    assert!(!ok);
    assert!(
        err.contains("checksum mismatch in expert 3 of layer 1 read from"),
        "{err}"
    );
    let (ok, _, err) = run(&["--no-verify-experts"]);
    assert!(ok, "{err}");
    assert!(
        err.contains("; expert records and spine not checked (--no-verify-experts)"),
        "{err}"
    );
    // the manifest of an older pack: no xxh3; still loads, checked with SHA-256
    flip(&o.out, 1, 3);
    let path = o.out.join("manifest.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    for r in v["experts"].as_array_mut().unwrap() {
        r.as_object_mut().unwrap().remove("xxh3").unwrap();
    }
    std::fs::write(&path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    let (ok, old, err) = run(&[]);
    assert!(ok, "{err}");
    assert_eq!(old, good);
    assert!(
        err.contains(
            "; expert records checked with SHA-256 (the manifest predates xxh3-128: pack again \
             for the faster check)"
        ),
        "{err}"
    );
    flip(&o.out, 1, 3);
    let (ok, _, err) = run(&[]);
    assert!(
        !ok && err.contains("checksum mismatch in expert 3 of layer 1"),
        "{err}"
    );
}

/// The tensor `name` of the pack in `pack`: (spine file, offset, bytes).
fn spine_tensor(pack: &Path, name: &str) -> (PathBuf, u64, u64) {
    let m = Manifest::read(pack).unwrap();
    let t = m.tensors.iter().find(|t| t.name == name).unwrap();
    assert_eq!(t.file, 0);
    (pack.join(&m.spine_file), t.offset, t.n_bytes)
}

/// XORs byte `at` of `file` with `x`; returns the XXH3-128 (hex) of `len` bytes at `offset`
/// after the change.
fn xor_byte(file: &Path, at: u64, x: u8, offset: u64, len: u64) -> String {
    let mut b = std::fs::read(file).unwrap();
    b[at as usize] ^= x;
    std::fs::write(file, &b).unwrap();
    let t = &b[offset as usize..(offset + len) as usize];
    deltafin::source::pack::hex(&deltafin::store::checksum::xxh3_128(t))
}

/// Every spine read is checked by default with the XXH3-128 the manifest records beside each
/// spine tensor's SHA-256: a flipped byte before load is a load error, a byte changed under a
/// streamed layer between passes is the next pass's error; `--no-verify-experts` covers the
/// spine too; a manifest written before spine XXH3-128s were recorded is checked with the
/// SHA-256.
#[test]
fn spine_reads_are_checked_by_default() {
    use deltafin::models::Logits;
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path());
    let o = pack_opts(tmp.path(), 1, PackPlacement::Stripe);
    write_pack(&src, &o).unwrap();
    let m = Manifest::read(&o.out).unwrap();
    let spine = std::fs::read(o.out.join(&m.spine_file)).unwrap();
    for t in m.tensors.iter().filter(|t| t.file == 0) {
        let b = &spine[t.offset as usize..(t.offset + t.n_bytes) as usize];
        assert_eq!(
            t.xxh3.as_deref(),
            Some(deltafin::source::pack::hex(&deltafin::store::checksum::xxh3_128(b)).as_str())
        );
    }
    // (a) a flipped byte of the final norm before load: every load refuses, naming both sums
    let (file, off, len) = spine_tensor(&o.out, "model.norm.weight");
    let want = m
        .tensors
        .iter()
        .find(|t| t.name == "model.norm.weight")
        .unwrap()
        .xxh3
        .clone()
        .unwrap();
    let got = xor_byte(&file, off + 11, 0x40, off, len);
    let msg = format!(
        "{}: spine tensor 'model.norm.weight' (bytes {off}..{}): checksum mismatch: xxh3-128 \
         {got} read, {want} in the manifest (the file differs from the one packed)",
        file.display(),
        off + len
    );
    let e = format!(
        "{:#}",
        try_session(&o.out, &opts(None, true)).err().unwrap()
    );
    assert_eq!(e, format!("reading tensor 'model.norm.weight': {msg}"));
    let pack = o.out.to_str().unwrap();
    let (ok, _, err) = deltafin(&["run", "-m", pack, "-p", "hi", "-n", "2"]);
    assert!(!ok);
    assert!(err.contains(&msg), "{err}");
    // opting out serves the pack as it is
    assert!(try_session(&o.out, &opts(None, false)).is_ok());
    let (ok, _, err) = deltafin(&[
        "run",
        "-m",
        pack,
        "-p",
        "hi",
        "-n",
        "2",
        "--stats",
        "--no-verify-experts",
    ]);
    assert!(ok, "{err}");
    assert!(
        err.contains("; expert records and spine not checked (--no-verify-experts)"),
        "{err}"
    );
    xor_byte(&file, off + 11, 0x40, off, len);
    let (ok, good, err) = deltafin(&[
        "run", "-m", pack, "-p", "hi", "-n", "2", "--temp", "0", "--stats",
    ]);
    assert!(ok, "{err}");
    assert!(
        err.contains("; expert records checked with xxh3-128; spine checked with xxh3-128"),
        "{err}"
    );
    // (b) layers streamed from the spine file: a byte changed between passes fails the next
    // pass, naming the tensor; restored, the pass runs again with the same logits
    // (the qwen3_moe fixture, whose layers this budget streams: 366.6 KiB go to the KV cache,
    // activations and buffers)
    let fx = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/qwen3_moe");
    let o2 = PackOptions {
        out: tmp.path().join("fixture.pack"),
        ..pack_opts(tmp.path(), 1, PackPlacement::Stripe)
    };
    write_pack(&fx, &o2).unwrap();
    let m = Manifest::read(&o2.out).unwrap();
    let prompt = [17u32, 30, 42, 99];
    let name = "model.layers.1.self_attn.q_proj.weight";
    let (file, off, len) = spine_tensor(&o2.out, name);
    let mut s = try_session(&o2.out, &opts(Some(STREAMED_BUDGET), true)).unwrap();
    assert!(
        s.model
            .placement()
            .summary
            .starts_with("0/3 layers and 0/16 experts resident"),
        "{}",
        s.model.placement().summary
    );
    let first = s.prefill(&prompt, Logits::Last).unwrap();
    s.cache.clear();
    let got = xor_byte(&file, off + 100, 0x40, off, len);
    let want = m
        .tensors
        .iter()
        .find(|t| t.name == name)
        .unwrap()
        .xxh3
        .clone()
        .unwrap();
    let e = format!("{:#}", s.prefill(&prompt, Logits::Last).unwrap_err());
    assert_eq!(
        e,
        format!(
            "{}: spine tensor '{name}' (bytes {off}..{}): checksum mismatch: xxh3-128 {got} \
             read, {want} in the manifest (the file differs from the one packed)",
            file.display(),
            off + len
        )
    );
    s.cache.clear();
    let mut u = try_session(&o2.out, &opts(Some(STREAMED_BUDGET), false)).unwrap();
    u.prefill(&prompt, Logits::Last).unwrap();
    xor_byte(&file, off + 100, 0x40, off, len);
    assert_eq!(s.prefill(&prompt, Logits::Last).unwrap(), first);
    // an older manifest (no spine xxh3): still loads, checked with SHA-256
    let path = o.out.join("manifest.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    for t in v["tensors"].as_array_mut().unwrap() {
        t.as_object_mut().unwrap().remove("xxh3");
    }
    std::fs::write(&path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    let (ok, old, err) = deltafin(&[
        "run", "-m", pack, "-p", "hi", "-n", "2", "--temp", "0", "--stats",
    ]);
    assert!(ok, "{err}");
    assert_eq!(old, good);
    assert!(
        err.contains(
            "; spine checked with SHA-256 (the manifest predates xxh3-128 for spine tensors: \
             pack again for the faster check)"
        ),
        "{err}"
    );
    let (file, off, len) = spine_tensor(&o.out, "model.norm.weight");
    xor_byte(&file, off + 11, 0x40, off, len);
    let e = format!(
        "{:#}",
        try_session(&o.out, &opts(None, true)).err().unwrap()
    );
    assert!(
        e.starts_with(&format!(
            "reading tensor 'model.norm.weight': {}: spine tensor 'model.norm.weight' (bytes \
             {off}..{}): checksum mismatch: SHA-256 ",
            file.display(),
            off + len
        )),
        "{e}"
    );
}

/// A RAM budget under which the qwen3_moe fixture's layers are streamed from the spine file
/// (64 tokens of context).
const STREAMED_BUDGET: u64 = 372 << 10;
