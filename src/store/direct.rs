//! Positional reads that bypass the page cache (`O_DIRECT`) into aligned buffers, with a
//! buffered fallback where the filesystem refuses `O_DIRECT` (tmpfs, some overlay mounts).

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::aligned::{round_down, round_up, AlignedBuf, IO_ALIGN};

/// A model file opened for reading, with `O_DIRECT` when the filesystem allows it.
pub struct DirectFile {
    file: File,
    path: PathBuf,
    len: u64,
    direct: bool,
    /// What error messages call the file, when more than its path says (set once).
    label: OnceLock<String>,
}

/// The byte range a direct read actually covers: `[start, start + len)` with both aligned to
/// [`IO_ALIGN`], enclosing the requested range; `skip` is where the requested bytes begin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AlignedSpan {
    pub start: u64,
    pub len: usize,
    pub skip: usize,
}

impl AlignedSpan {
    /// The aligned span enclosing `len` bytes at `offset`.
    pub fn covering(offset: u64, len: usize) -> Self {
        let start = round_down(offset, IO_ALIGN as u64);
        let skip = (offset - start) as usize;
        Self {
            start,
            len: round_up(skip + len, IO_ALIGN),
            skip,
        }
    }
}

/// What `path` is when it is there and not a regular file (following symbolic links), e.g.
/// `"a FIFO"`; `None` for a regular file or a path that cannot be looked at.
pub fn not_regular(path: &Path) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    let t = std::fs::metadata(path).ok()?.file_type();
    Some(if t.is_file() {
        return None;
    } else if t.is_dir() {
        "a folder"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else {
        "not a file"
    })
}

/// Checks, before `path` is opened, that it is a regular file ([`not_regular`]), so that a
/// FIFO or a device never blocks an open or feeds a read without end. A path that does not
/// exist (or cannot be looked at) passes: opening it reports that.
///
/// Errors: `PATH: not a regular file (a FIFO)` (or a folder, a socket, a device), of kind
/// `InvalidInput`.
pub fn check_regular(path: &Path) -> io::Result<()> {
    match not_regular(path) {
        None => Ok(()),
        Some(kind) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not a regular file ({kind})", path.display()),
        )),
    }
}

/// Why [`read_bounded`] returned no bytes.
#[derive(Debug)]
pub enum BoundedReadError {
    /// Opening, looking at or reading the file failed (the error as the OS gives it, without
    /// the path; `NotFound` when there is no file).
    Io(io::Error),
    /// The path is not a regular file (a FIFO, a device, a folder…); it was never read.
    NotRegular,
    /// The file holds `len` bytes, more than the limit; `grew`: it was within the limit when
    /// opened and grew past it while read (`len` is then the limit plus one).
    TooLarge { len: u64, grew: bool },
}

/// Reads the whole regular file `path` if it holds at most `max` bytes: opened without
/// blocking (`O_NONBLOCK`, so a FIFO never hangs the open), checked through the open
/// descriptor to be a regular file of at most `max` bytes, and read no further than `max + 1`
/// bytes, so a file that grows while read cannot exhaust memory. For the small files Deltafin
/// keeps itself (pack manifests, heat files).
///
/// Errors: see [`BoundedReadError`].
pub fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>, BoundedReadError> {
    use std::io::Read;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(BoundedReadError::Io)?;
    let meta = f.metadata().map_err(BoundedReadError::Io)?;
    if !meta.is_file() {
        return Err(BoundedReadError::NotRegular);
    }
    if meta.len() > max {
        return Err(BoundedReadError::TooLarge {
            len: meta.len(),
            grew: false,
        });
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    f.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(BoundedReadError::Io)?;
    if bytes.len() as u64 > max {
        return Err(BoundedReadError::TooLarge {
            len: bytes.len() as u64,
            grew: true,
        });
    }
    Ok(bytes)
}

impl DirectFile {
    /// Opens `path`, trying `O_DIRECT` first unless `direct` is false.
    ///
    /// Errors: the path is not a regular file ([`check_regular`]); the file cannot be opened
    /// (the message names the path).
    pub fn open(path: &Path, direct: bool) -> io::Result<Self> {
        check_regular(path)?;
        let plain = || File::open(path);
        let (file, direct) = if direct {
            match std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
            {
                Ok(f) => (f, true),
                Err(_) => (plain()?, false),
            }
        } else {
            (plain()?, false)
        };
        let len = file.metadata()?.len();
        let mut f = Self {
            file,
            path: path.to_path_buf(),
            len,
            direct,
            label: OnceLock::new(),
        };
        if f.direct && f.probe().is_err() {
            // Some filesystems accept the flag at open and fail every read with EINVAL.
            f.file = plain()?;
            f.direct = false;
        }
        Ok(f)
    }

    fn probe(&self) -> io::Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        let mut b = AlignedBuf::new(IO_ALIGN);
        self.file.read_at(b.as_mut_slice(), 0).map(|_| ())
    }

    /// Whether reads bypass the page cache.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// File length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The open file (for reads issued elsewhere, e.g. through io_uring).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Names the file in error messages from now on (e.g. a pack's drive file as
    /// `drive 1 (/mnt/d1), file /mnt/d1/deltafin-pack-m-1.bin`); it can be set once, also
    /// while the file is shared with the read engine's threads. A second call is ignored.
    pub fn set_label(&self, label: String) {
        let _ = self.label.set(label);
    }

    /// What error messages call the file: its label ([`DirectFile::set_label`]), else its
    /// path.
    pub fn label(&self) -> String {
        match self.label.get() {
            Some(l) => l.clone(),
            None => self.path.display().to_string(),
        }
    }

    /// Reads `len` bytes at `offset` into `dst`, which must start at an [`IO_ALIGN`]-aligned
    /// address and hold at least `AlignedSpan::covering(offset, len).len` bytes. Returns the
    /// requested bytes' position in `dst` and the number of bytes read from the device (the
    /// aligned span, cut at the end of the file).
    ///
    /// Errors: the range lies beyond the end of the file, or the read fails; the message names
    /// the file and the range.
    pub fn read_into(&self, offset: u64, len: usize, dst: &mut [u8]) -> io::Result<(usize, u64)> {
        let end = offset.checked_add(len as u64).filter(|&e| e <= self.len).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{}: read of {len} bytes at offset {offset} goes past the end of the file ({} bytes)",
                    self.path.display(),
                    self.len
                ),
            )
        })?;
        let span = AlignedSpan::covering(offset, len);
        assert!(span.len <= dst.len(), "I/O buffer too small for the span");
        assert_eq!(
            dst.as_ptr() as usize % IO_ALIGN,
            0,
            "I/O buffer not aligned"
        );
        let dst = &mut dst[..span.len];
        let mut done = 0usize;
        let need = (end - span.start) as usize;
        while done < need {
            match self
                .file
                .read_at(&mut dst[done..], span.start + done as u64)
            {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!(
                            "{}: read of {} bytes at offset {} failed: {e}",
                            self.path.display(),
                            span.len,
                            span.start
                        ),
                    ))
                }
            }
            if !self.direct && done >= need {
                break;
            }
        }
        if done < need {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{}: short read at offset {} ({done} of {need} bytes)",
                    self.path.display(),
                    span.start
                ),
            ));
        }
        Ok((span.skip, done as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn span_covers_request() {
        assert_eq!(
            AlignedSpan::covering(0, 1),
            AlignedSpan {
                start: 0,
                len: 4096,
                skip: 0
            }
        );
        assert_eq!(
            AlignedSpan::covering(4095, 2),
            AlignedSpan {
                start: 0,
                len: 8192,
                skip: 4095
            }
        );
        assert_eq!(
            AlignedSpan::covering(8192, 4096),
            AlignedSpan {
                start: 8192,
                len: 4096,
                skip: 0
            }
        );
    }

    #[test]
    fn reads_unaligned_ranges_and_rejects_past_end() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.bin");
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::File::create(&p).unwrap().write_all(&data).unwrap();
        for direct in [true, false] {
            let f = DirectFile::open(&p, direct).unwrap();
            let mut buf = AlignedBuf::new(16384);
            for (off, len) in [(0u64, 10usize), (4000, 200), (9990, 10), (1, 9999)] {
                let (skip, _) = f.read_into(off, len, buf.as_mut_slice()).unwrap();
                assert_eq!(
                    &buf.as_slice()[skip..skip + len],
                    &data[off as usize..off as usize + len]
                );
            }
            let e = f.read_into(9995, 10, buf.as_mut_slice()).unwrap_err();
            assert!(
                e.to_string()
                    .contains("goes past the end of the file (10000 bytes)"),
                "{e}"
            );
        }
    }
}
