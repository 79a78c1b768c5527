//! The heat file: how often each (layer, expert) was used, summed over runs, so that the next
//! run's cache starts out knowing which experts are hot.
//!
//! Format (JSON): `{"format": "deltafin-heat-1", "layers": L, "experts": E, "counts":
//! [[u64; E]; L]}`, where `counts[l][e]` is the number of forward passes (batches) that used
//! expert `e` of layer `l`.
//!
//! Saving ([`Heat::merge_into_file`]) holds an exclusive `flock` on `NAME.json.lock` beside the
//! file for the whole read-add-write, so concurrent runs on one model lose no counts; it writes
//! a temporary file of its own (`NAME.json.tmp-PID-N`, removed on failure) and renames it over
//! the file. A file that cannot be used (invalid JSON, another format, another model's shape,
//! larger than [`MAX_HEAT_FILE_BYTES`]) is never discarded: saving moves it aside to
//! `NAME.json.damaged-SECONDS` and says so on standard error. Reads are bounded and refuse
//! anything but a regular file.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::direct::{read_bounded, BoundedReadError};
use super::expert_cache::Key;

/// The largest starting use count a seed gives (the hottest expert of its layer).
pub const SEED_MAX: u64 = 8;

/// The largest heat file read, in bytes (a 61-layer, 256-expert model's file is ~0.3 MiB).
pub const MAX_HEAT_FILE_BYTES: u64 = 16 << 20;

/// Use counts per (layer, expert).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Heat {
    /// `counts[layer][expert]`: forward passes that used the expert.
    pub counts: Vec<Vec<u64>>,
}

/// What reading a heat file found.
enum Found {
    /// No file at the path.
    Missing,
    /// Counts of the expected shape.
    Counts(Heat),
    /// A regular file whose counts cannot be used, and why (a sentence naming the file).
    Unusable(String),
}

/// `path` with `suffix` appended to its file name (`heat.json` → `heat.json.lock`).
fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(suffix);
    PathBuf::from(s)
}

/// An io error whose message starts with the file's name.
fn named(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// Reads the heat file at `path` without following it into anything but a regular file of at
/// most [`MAX_HEAT_FILE_BYTES`].
///
/// Errors (naming the file): not a regular file (a FIFO or a device is opened without blocking
/// and never read), or unreadable.
fn read_file(path: &Path, layers: usize, experts: usize) -> io::Result<Found> {
    let name = path.display();
    let bytes = match read_bounded(path, MAX_HEAT_FILE_BYTES) {
        Ok(b) => b,
        Err(BoundedReadError::Io(e)) if e.kind() == io::ErrorKind::NotFound => {
            return Ok(Found::Missing)
        }
        Err(BoundedReadError::Io(e)) => return Err(named(path, e)),
        Err(BoundedReadError::NotRegular) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{name}: not a regular file"),
            ))
        }
        Err(BoundedReadError::TooLarge { len, grew: false }) => {
            return Ok(Found::Unusable(format!(
                "{name} is {len} bytes, more than a heat file's limit of {MAX_HEAT_FILE_BYTES}"
            )))
        }
        Err(BoundedReadError::TooLarge { grew: true, .. }) => {
            return Ok(Found::Unusable(format!(
                "{name} grew past a heat file's limit of {MAX_HEAT_FILE_BYTES} bytes"
            )))
        }
    };
    let v: serde_json::Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(e) => return Ok(Found::Unusable(format!("{name} is not valid JSON ({e})"))),
    };
    if v["format"] != "deltafin-heat-1" {
        return Ok(Found::Unusable(format!(
            "{name} is not a heat file (its \"format\" is not \"deltafin-heat-1\")"
        )));
    }
    let counts: Vec<Vec<u64>> = match serde_json::from_value(v["counts"].clone()) {
        Ok(c) => c,
        Err(e) => {
            return Ok(Found::Unusable(format!(
                "{name}: \"counts\" is not a list of lists of counts ({e})"
            )))
        }
    };
    if counts.len() != layers || counts.iter().any(|r| r.len() != experts) {
        let got_e = counts.first().map_or(0, |r| r.len());
        return Ok(Found::Unusable(format!(
            "{name} holds counts for {} layers of {got_e} experts, not this model's {layers} layers of {experts}",
            counts.len()
        )));
    }
    Ok(Found::Counts(Heat { counts }))
}

/// An exclusive `flock` on a lock file, released when dropped (the file is closed).
struct Locked(#[allow(dead_code)] File);

impl Locked {
    /// Opens (creating it) and locks `path`, waiting for other holders.
    fn acquire(path: &Path) -> io::Result<Self> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| named(path, e))?;
        loop {
            // SAFETY: flock on a descriptor this function owns.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(Self(f));
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(io::Error::new(
                    e.kind(),
                    format!("{}: could not lock: {e}", path.display()),
                ));
            }
        }
    }
}

/// Moves the unusable file at `path` to `NAME.damaged-SECONDS` (with `-N` appended when that
/// name is taken) and returns the new name. Called with the lock held.
fn set_aside(path: &Path) -> io::Result<PathBuf> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let base = beside(path, &format!(".damaged-{secs}"));
    let mut to = base.clone();
    let mut n = 1;
    while std::fs::symlink_metadata(&to).is_ok() {
        to = beside(&base, &format!("-{n}"));
        n += 1;
    }
    std::fs::rename(path, &to).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "{}: could not move it aside to {}: {e}",
                path.display(),
                to.display()
            ),
        )
    })?;
    Ok(to)
}

/// Writes `text` to a temporary file of this process beside `path` and renames it over `path`;
/// the temporary file is removed when anything fails.
fn write_atomically(path: &Path, text: &str) -> io::Result<()> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let tmp = beside(path, &format!(".tmp-{}-{n}", std::process::id()));
    let write = || -> io::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        named(path, e)
    })
}

impl Heat {
    /// All zeros for `layers × experts`.
    pub fn zeros(layers: usize, experts: usize) -> Self {
        Self {
            counts: vec![vec![0; experts]; layers],
        }
    }

    /// Reads `path`; a missing file gives zeros, and so does one that cannot be used (not a
    /// regular file, unreadable, over [`MAX_HEAT_FILE_BYTES`], malformed or of another
    /// shape), with a warning naming it and why (the file is left as it is).
    pub fn load(path: &Path, layers: usize, experts: usize) -> Self {
        match read_file(path, layers, experts) {
            Ok(Found::Counts(h)) => return h,
            Ok(Found::Missing) => {}
            Ok(Found::Unusable(why)) => {
                tracing::warn!("ignoring the expert heat file: {why}")
            }
            Err(e) => tracing::warn!("ignoring the expert heat file: {e}"),
        }
        Self::zeros(layers, experts)
    }

    /// Adds `other` (same shape) to these counts.
    pub fn add(&mut self, other: &Heat) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            for (x, y) in a.iter_mut().zip(b) {
                *x = x.saturating_add(*y);
            }
        }
    }

    /// Starting use counts for the cache: per layer, `count × SEED_MAX / max count` (so the
    /// hottest expert of each layer starts at [`SEED_MAX`]); zeros are left out.
    pub fn seed(&self) -> HashMap<Key, u64> {
        let mut m = HashMap::new();
        for (l, row) in self.counts.iter().enumerate() {
            let max = row.iter().copied().max().unwrap_or(0);
            if max == 0 {
                continue;
            }
            for (e, &c) in row.iter().enumerate() {
                let s = (c as u128 * SEED_MAX as u128 / max as u128) as u64;
                if s > 0 {
                    m.insert((l as u32, e as u32), s);
                }
            }
        }
        m
    }

    /// Adds `run` to the counts stored at `path` and writes the sum back, holding an exclusive
    /// lock on `NAME.lock` beside it from the read to the rename (see the module header).
    /// A file there that cannot be used is moved aside first (with a warning); returns its
    /// new name then, `None` otherwise.
    ///
    /// Errors (each naming the file): its folder or lock file cannot be created, the path is
    /// not a regular file, it cannot be read, moved aside or written.
    pub fn merge_into_file(run: &Heat, path: &Path) -> io::Result<Option<PathBuf>> {
        let layers = run.counts.len();
        let experts = run.counts.first().map_or(0, |r| r.len());
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| named(dir, e))?;
        }
        let _lock = Locked::acquire(&beside(path, ".lock"))?;
        let (mut total, aside) = match read_file(path, layers, experts)? {
            Found::Missing => (Self::zeros(layers, experts), None),
            Found::Counts(h) => (h, None),
            Found::Unusable(why) => {
                let to = set_aside(path)?;
                tracing::warn!(
                    "{why}; moved it aside to {} and started the expert heat file afresh",
                    to.display()
                );
                (Self::zeros(layers, experts), Some(to))
            }
        };
        total.add(run);
        let v = serde_json::json!({
            "format": "deltafin-heat-1",
            "layers": layers,
            "experts": experts,
            "counts": total.counts,
        });
        write_atomically(path, &v.to_string())?;
        Ok(aside)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_add_up_and_seed_scales_per_layer() {
        let dir = tempfile::tempdir().unwrap();
        // the folder is created on the first save
        let p = dir.path().join("sub").join("heat.json");
        let mut run = Heat::zeros(2, 3);
        run.counts[0] = vec![4, 1, 0];
        run.counts[1] = vec![0, 0, 2];
        Heat::merge_into_file(&run, &p).unwrap();
        Heat::merge_into_file(&run, &p).unwrap();
        let h = Heat::load(&p, 2, 3);
        assert_eq!(h.counts, vec![vec![8, 2, 0], vec![0, 0, 4]]);
        let s = h.seed();
        assert_eq!(s.get(&(0, 0)), Some(&8));
        assert_eq!(s.get(&(0, 1)), Some(&2));
        assert_eq!(s.get(&(0, 2)), None);
        assert_eq!(s.get(&(1, 2)), Some(&8));
        // another model's shape is ignored
        assert_eq!(Heat::load(&p, 3, 3), Heat::zeros(3, 3));
    }

    /// The names in `dir`, sorted.
    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn concurrent_merges_lose_no_count() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("heat.json");
        let (threads, rounds) = (8u64, 25u64);
        std::thread::scope(|s| {
            for t in 0..threads {
                let p = &p;
                s.spawn(move || {
                    let mut run = Heat::zeros(2, 3);
                    run.counts[0] = vec![1, t, 0];
                    run.counts[1] = vec![0, 0, 2];
                    for _ in 0..rounds {
                        assert_eq!(Heat::merge_into_file(&run, p).unwrap(), None);
                    }
                });
            }
        });
        let sum_t: u64 = (0..threads).sum();
        let h = Heat::load(&p, 2, 3);
        assert_eq!(
            h.counts,
            vec![
                vec![threads * rounds, sum_t * rounds, 0],
                vec![0, 0, 2 * threads * rounds]
            ]
        );
        // no temporary file is left behind; the lock file stays
        assert_eq!(names(dir.path()), ["heat.json", "heat.json.lock"]);
    }

    #[test]
    fn a_damaged_file_is_moved_aside_not_reset() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("heat.json");
        let mut run = Heat::zeros(1, 2);
        run.counts[0] = vec![3, 4];
        let bad = [
            r#"{"format": "deltafin-heat-1", "counts": [[1, 2"#,
            r#"{"format": "other", "counts": [[1, 2]]}"#,
            r#"{"format": "deltafin-heat-1", "counts": [[1, 2, 5]]}"#,
        ];
        for (i, text) in bad.iter().enumerate() {
            std::fs::write(&p, text).unwrap();
            // reading for a seed gives zeros and leaves the file alone
            assert_eq!(Heat::load(&p, 1, 2), Heat::zeros(1, 2));
            assert_eq!(std::fs::read_to_string(&p).unwrap(), *text);
            let aside = Heat::merge_into_file(&run, &p).unwrap().unwrap();
            assert_eq!(std::fs::read_to_string(&aside).unwrap(), *text, "case {i}");
            let name = aside.file_name().unwrap().to_string_lossy().into_owned();
            assert!(name.starts_with("heat.json.damaged-"), "{name}");
            assert_eq!(Heat::load(&p, 1, 2).counts, vec![vec![3, 4]]);
        }
        let kept = names(dir.path())
            .into_iter()
            .filter(|n| n.starts_with("heat.json.damaged-"))
            .count();
        assert_eq!(kept, 3);
    }

    #[test]
    fn reads_are_bounded_and_only_of_regular_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("heat.json");
        // a (sparse) file over the limit is not read, and saving keeps it aside
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(MAX_HEAT_FILE_BYTES + 1).unwrap();
        drop(f);
        assert_eq!(Heat::load(&p, 1, 1), Heat::zeros(1, 1));
        let aside = Heat::merge_into_file(&Heat::zeros(1, 1), &p)
            .unwrap()
            .unwrap();
        assert_eq!(
            std::fs::metadata(&aside).unwrap().len(),
            MAX_HEAT_FILE_BYTES + 1
        );
        // a device is neither read without end nor written over
        let zero = Path::new("/dev/zero");
        assert_eq!(Heat::load(zero, 1, 1), Heat::zeros(1, 1));
        let e = Heat::merge_into_file(&Heat::zeros(1, 1), zero).unwrap_err();
        assert_eq!(e.to_string(), "/dev/zero: not a regular file");
    }

    #[test]
    fn a_failed_save_names_the_file_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        // the heat file's path is a folder (with a file in it, so no rename can replace it)
        let p = dir.path().join("heat.json");
        std::fs::create_dir(&p).unwrap();
        std::fs::write(p.join("x"), "x").unwrap();
        let e = Heat::merge_into_file(&Heat::zeros(1, 1), &p).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("{}: not a regular file", p.display())
        );
        assert_eq!(names(dir.path()), ["heat.json", "heat.json.lock"]);
        // a rename that fails after the temporary file is written removes it
        let e = write_atomically(&p, "{}").unwrap_err();
        assert!(
            e.to_string().starts_with(&format!("{}: ", p.display())),
            "{e}"
        );
        assert_eq!(names(dir.path()), ["heat.json", "heat.json.lock"]);
    }
}
