//! Helpers for the pack suites (`tests/pack.rs`, `tests/pack_families.rs`): packing a source
//! into tempdirs standing for drives, loading a source or a pack as `deltafin run` does, the
//! logits to compare, and damaging a pack.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use deltafin::engine::Session;
use deltafin::models::LoadOptions;
use deltafin::source::pack::Manifest;
use deltafin::store::{CachePolicy, EngineChoice, ExpertStoreOptions, IoOptions};
use deltafin::write::pack::{write_pack, PackOptions, PackPlacement};
use sha2::{Digest, Sha256};

/// Options packing into `tmp/pack` with `n` drive folders `tmp/driveD` (created).
pub fn pack_opts(tmp: &Path, n: usize, placement: PackPlacement) -> PackOptions {
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
        overwrite: false,
        stop_after: None,
    }
}

/// Packs `src` into a fresh tempdir.
pub fn pack_of(src: &Path, n: usize, placement: PackPlacement) -> (tempfile::TempDir, PackOptions) {
    let tmp = tempfile::tempdir().unwrap();
    let o = pack_opts(tmp.path(), n, placement);
    write_pack(src, &o).unwrap();
    (tmp, o)
}

/// Load options under `budget` (`None`: everything resident), no expert cache, checking
/// every expert read against its checksum when `verify`.
pub fn opts(budget: Option<u64>, verify: bool) -> LoadOptions {
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
        mtp: false,
        numerics: Default::default(),
        device: Default::default(),
    }
}

/// Loads the model at `path` (a source or a pack, of either format) as `deltafin run` does.
pub fn try_session(path: &Path, o: &LoadOptions) -> anyhow::Result<Session> {
    let (m, s) = super::gguf::load_path(path, o)?;
    Ok(Session::new(m, s, 64, 64))
}

/// [`try_session`], which must succeed.
pub fn session(path: &Path, o: &LoadOptions) -> Session {
    try_session(path, o).unwrap()
}

/// The bits of `v`, to compare logits exactly.
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// SHA-256 of the file `p`.
pub fn sha256(p: &Path) -> Vec<u8> {
    Sha256::digest(std::fs::read(p).unwrap()).to_vec()
}

/// Flips one byte (byte 100) of expert `e` of layer `l` of the pack in `pack`, in its first
/// extent; returns the drive file changed.
pub fn flip(pack: &Path, l: usize, e: usize) -> PathBuf {
    let m = Manifest::read(pack).unwrap();
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

/// The expert id in a message `... (expert E of layer L)` or `... in expert E of layer L ...`.
pub fn expert_in(msg: &str) -> usize {
    let i = msg.rfind("expert ").unwrap() + "expert ".len();
    msg[i..].split(' ').next().unwrap().parse().unwrap()
}
