//! What [`super::write_pack`] settles before it writes a byte: one writer per pack folder (a
//! lock), no drive file of another pack touched, room on every file system, and the small
//! files to copy with their checksums.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use crate::source::pack::{hex, Manifest};
#[cfg(doc)]
use crate::write::space::free_bytes;

/// The lock file in a pack folder, held (`flock`, exclusive) while a `pack` writes it.
pub(super) const LOCK: &str = "pack.lock";

/// An exclusive lock on a pack folder, released when dropped (or when the process ends).
pub(super) struct OutLock(#[allow(dead_code)] File);

/// Locks the pack folder `out` for this writer ([`LOCK`], `flock` without waiting).
///
/// Errors: the lock file cannot be created, or another process holds the lock (the message
/// names the folder).
pub(super) fn lock_out(out: &Path) -> Result<OutLock> {
    let p = out.join(LOCK);
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&p)
        .with_context(|| format!("{}", p.display()))?;
    // SAFETY: `f` is an open file descriptor owned by this function's caller from here on.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            bail!(
                "{}: another `deltafin pack` is writing this pack ({LOCK} is locked); wait for it to finish",
                out.display()
            );
        }
        bail!("{}: locking: {e}", p.display());
    }
    Ok(OutLock(f))
}

/// Checks that every drive data file of the plan `m` for the pack folder `out` is new or
/// already this pack's: listed by `ours` (the drive files of the finished manifest or the plan
/// found in `out`).
///
/// Errors: a data file exists that this pack does not list (another pack's manifest may own
/// it: the message names the drive, the file and `out`).
pub(super) fn check_owned(m: &Manifest, out: &Path, ours: &[String]) -> Result<()> {
    for (d, x) in m.drives.iter().enumerate() {
        if Path::new(&x.file).symlink_metadata().is_ok() && !ours.contains(&x.file) {
            bail!(
                "{}: the file exists but is not part of the pack in {} (another pack's manifest may own it); remove it or choose another --out",
                m.drive_label(d),
                out.display()
            );
        }
    }
    Ok(())
}

/// The shortfall message when a file system (named by `dir`) lacks room: `need` bytes still
/// to write on it, `free` bytes free there (`None`: unknown, which passes).
pub(super) fn shortfall(dir: &Path, need: u64, free: Option<u64>) -> Option<String> {
    match free {
        Some(f) if need > f => Some(format!(
            "{}: the pack needs {need} more bytes ({:.2} GB) on this file system but it has {f} bytes ({:.2} GB) free",
            dir.display(),
            need as f64 / 1e9,
            f as f64 / 1e9
        )),
        _ => None,
    }
}

/// Checks that the file systems of the pack folder `out` and of every drive have room for
/// what the plan `m` still has to write (each file's planned length less the bytes already
/// allocated to it, which a resumed pack has) and for the `copied` bytes of small files;
/// `free` gives a folder's free bytes ([`free_bytes`] when packing).
///
/// Errors: a file system has too little free space ([`shortfall`]'s message).
pub(super) fn check_space(
    m: &Manifest,
    out: &Path,
    copied: u64,
    free: &dyn Fn(&Path) -> Option<u64>,
) -> Result<()> {
    // (device) → (a folder on it, bytes to write)
    let mut need: BTreeMap<u64, (PathBuf, u64)> = BTreeMap::new();
    let mut add = |dir: &Path, file: &Path, len: u64| -> Result<()> {
        let dev = std::fs::metadata(dir)
            .with_context(|| format!("{}", dir.display()))?
            .dev();
        let have = std::fs::metadata(file)
            .map(|x| x.blocks() * 512)
            .unwrap_or(0);
        let e = need.entry(dev).or_insert_with(|| (dir.to_path_buf(), 0));
        e.1 = e.1.saturating_add(len.saturating_sub(have));
        Ok(())
    };
    add(
        out,
        &out.join(&m.spine_file),
        m.spine_len.saturating_add(copied),
    )?;
    for x in &m.drives {
        add(Path::new(&x.path), Path::new(&x.file), x.len)?;
    }
    for (dir, n) in need.values() {
        if let Some(msg) = shortfall(dir, *n, free(dir)) {
            bail!("{msg}");
        }
    }
    Ok(())
}

/// A small file of the source folder to copy into the pack.
pub(super) struct SmallFile {
    pub name: String,
    pub path: PathBuf,
    /// SHA-256 (hex) of its bytes when planned.
    pub sha256: String,
    pub len: u64,
}

/// The small files of the Hugging Face folder `src` (config, tokenizer, generation config:
/// every plain file of at most 64 MiB but the safetensors and their index, links followed as
/// in a Hugging Face cache snapshot), sorted by name, with their checksums.
///
/// Errors: the folder cannot be listed or a file read (the message names it).
pub(super) fn small_files(src: &Path) -> Result<Vec<SmallFile>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(src).with_context(|| format!("{}", src.display()))? {
        let e = e.with_context(|| format!("{}", src.display()))?;
        let name = e.file_name().to_string_lossy().into_owned();
        // followed: the files of a Hugging Face cache snapshot are links into its blobs
        let meta =
            std::fs::metadata(e.path()).with_context(|| format!("{}", e.path().display()))?;
        if !meta.is_file()
            || name.ends_with(".safetensors")
            || name == "model.safetensors.index.json"
        {
            continue;
        }
        let len = meta.len();
        if len > 64 << 20 {
            continue;
        }
        let b = std::fs::read(e.path()).with_context(|| format!("{}", e.path().display()))?;
        out.push(SmallFile {
            name,
            path: e.path(),
            sha256: hex(&Sha256::digest(&b)),
            len: b.len() as u64,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Copies `f` into the pack folder `out`, checking that its bytes are still those planned.
///
/// Errors: it cannot be read or written (the message names it), or it changed since.
pub(super) fn copy_small_file(f: &SmallFile, out: &Path) -> Result<()> {
    let b = std::fs::read(&f.path).with_context(|| format!("{}", f.path.display()))?;
    if hex(&Sha256::digest(&b)) != f.sha256 {
        bail!("{}: the file changed while it was packed", f.path.display());
    }
    let to = out.join(&f.name);
    std::fs::write(&to, &b)
        .with_context(|| format!("copying {} to {}", f.path.display(), to.display()))
}

/// Whether the file `name` in `out` holds the bytes whose SHA-256 is `sha256`.
pub(super) fn file_matches(out: &Path, name: &str, sha256: &str) -> bool {
    std::fs::read(out.join(name)).is_ok_and(|b| hex(&Sha256::digest(&b)) == sha256)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A manifest of a spine of `spine` bytes and one drive file of `drive` bytes in `dir`.
    fn manifest(dir: &Path, spine: u64, drive: u64) -> Manifest {
        let d = dir.display().to_string();
        serde_json::from_value(serde_json::json!({
            "format_version": 1,
            "source": {"path": "/m", "format": "hf", "architecture": "qwen3_moe", "headers_sha256": ""},
            "placement": "spread",
            "config": {},
            "copied_files": [],
            "spine_file": "spine.bin",
            "spine_len": spine,
            "drives": [{"path": d, "file": format!("{d}/data.bin"), "len": drive}],
            "tensors": [],
            "experts": []
        }))
        .unwrap()
    }

    #[test]
    fn free_space_is_checked_per_file_system_for_what_is_left_to_write() {
        let t = tempfile::tempdir().unwrap();
        let m = manifest(t.path(), 8192, 1 << 20);
        // one file system: spine, copied files and drive file together
        let need = 8192 + 100 + (1 << 20);
        let free = |n: u64| move |_: &Path| Some(n);
        assert!(check_space(&m, t.path(), 100, &free(need)).is_ok());
        let e = check_space(&m, t.path(), 100, &free(need - 1)).unwrap_err();
        assert_eq!(
            e.to_string(),
            shortfall(t.path(), need, Some(need - 1)).unwrap()
        );
        // a drive file already written (a resumed pack) needs no more room
        std::fs::write(t.path().join("data.bin"), vec![1u8; 1 << 20]).unwrap();
        assert!(check_space(&m, t.path(), 100, &free(8192 + 100)).is_ok());
        assert!(check_space(&m, t.path(), 100, &free(8192 + 99)).is_err());
    }

    #[test]
    fn a_file_system_without_room_is_named_with_what_it_lacks() {
        let p = Path::new("/d0");
        assert_eq!(shortfall(p, 10, Some(10)), None);
        assert_eq!(shortfall(p, 10, None), None);
        assert_eq!(
            shortfall(p, 2_500_000_000, Some(1_000_000_000)).unwrap(),
            "/d0: the pack needs 2500000000 more bytes (2.50 GB) on this file system but it has 1000000000 bytes (1.00 GB) free"
        );
    }
}
