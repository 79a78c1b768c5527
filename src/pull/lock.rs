//! An exclusive advisory lock on a file (`flock(2)`, `LOCK_EX`), held while a model is
//! pulled so that concurrent pulls (threads or processes) of one model run one at a time.
//! The kernel drops the lock when the file descriptor closes, also when the process dies.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// A held lock; released on drop.
#[derive(Debug)]
pub struct FileLock {
    _file: File,
    path: PathBuf,
}

fn open(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .with_context(|| format!("opening lock file {}", path.display()))
}

fn flock(file: &File, op: libc::c_int) -> std::io::Result<()> {
    loop {
        // SAFETY: flock on a file descriptor owned by `file`, which outlives the call.
        let rc = unsafe { libc::flock(file.as_raw_fd(), op) };
        if rc == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

impl FileLock {
    /// Takes the lock without waiting; `Ok(None)` when another holder has it.
    ///
    /// Errors: the lock file cannot be opened or created, or `flock` fails otherwise.
    pub fn try_acquire(path: &Path) -> Result<Option<Self>> {
        let file = open(path)?;
        match flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
            Ok(()) => Ok(Some(Self {
                _file: file,
                path: path.to_path_buf(),
            })),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e).with_context(|| format!("locking {}", path.display())),
        }
    }

    /// Takes the lock, waiting as long as another holder keeps it.
    pub fn acquire(path: &Path) -> Result<Self> {
        let file = open(path)?;
        flock(&file, libc::LOCK_EX).with_context(|| format!("locking {}", path.display()))?;
        Ok(Self {
            _file: file,
            path: path.to_path_buf(),
        })
    }

    /// Path of the lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn second_holder_waits_for_first() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.lock");
        let first = FileLock::try_acquire(&p).unwrap().expect("free lock");
        // flock locks belong to the open file description, so a second open conflicts even
        // within one process.
        assert!(FileLock::try_acquire(&p).unwrap().is_none());

        let (tx, rx) = mpsc::channel();
        let p2 = p.clone();
        let waiter = std::thread::spawn(move || {
            let l = FileLock::acquire(&p2).unwrap();
            tx.send(()).unwrap();
            drop(l);
        });
        // The waiter cannot get the lock while `first` is held.
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
        drop(first);
        rx.recv_timeout(Duration::from_secs(30))
            .expect("waiter got the lock after release");
        waiter.join().unwrap();
        assert!(FileLock::try_acquire(&p).unwrap().is_some());
    }
}
