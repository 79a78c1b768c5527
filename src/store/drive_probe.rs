//! A short, bounded random-read probe of one drive, as the expert store reads it: a temporary
//! file written in a folder of the drive, read back at random request-aligned offsets through
//! the store's read engine ([`IoEngine`]: io_uring where the kernel allows it, `O_DIRECT`
//! where the file system does), `depth` reads in flight, for a fixed time. The file is removed
//! afterwards, also when the probe fails. Used by `deltafin doctor` and `deltafin plan
//! --drives`.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::aligned::AlignedBuf;
use super::direct::DirectFile;
use super::io_engine::{
    EngineChoice, IoEngine, IoOptions, Req, DEFAULT_DEPTH, DEFAULT_REQUEST_BYTES,
};

/// What the probe does.
#[derive(Clone, Debug)]
pub struct ProbeOptions {
    /// Bytes of the temporary file (rounded down to whole requests, at least one).
    pub file_bytes: u64,
    /// Seconds of random reads.
    pub seconds: f64,
    /// Bytes of each read (a multiple of 4 KiB): the store's request size by default.
    pub request_bytes: usize,
    /// Reads in flight: the store's depth by default.
    pub depth: usize,
}

impl Default for ProbeOptions {
    /// A 256 MiB file read for 2 seconds at the store's defaults (1 MiB, depth 32).
    fn default() -> Self {
        Self {
            file_bytes: 256 << 20,
            seconds: 2.0,
            request_bytes: DEFAULT_REQUEST_BYTES,
            depth: DEFAULT_DEPTH,
        }
    }
}

/// What the probe measured.
#[derive(Clone, Debug, PartialEq)]
pub struct DriveProbe {
    /// Whether the file system took `O_DIRECT` reads (else they went through the page cache,
    /// dropped before reading, and the bandwidth may overstate the drive).
    pub direct: bool,
    /// Whether io_uring could be set up and read the file.
    pub io_uring: bool,
    /// The engine that read (`io_uring` or `pread-pool`).
    pub engine: &'static str,
    /// Bytes read and the seconds they took.
    pub bytes: u64,
    pub seconds: f64,
    /// Read bandwidth in bytes per second.
    pub bytes_per_s: f64,
    pub request_bytes: usize,
    pub depth: usize,
}

/// Removes the probe file when dropped.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Probes the drive holding the folder `dir` (see the module header).
///
/// Errors: `dir` is not a folder; the temporary file cannot be written (no space, no
/// permission) or read; a request size that is not a positive multiple of 4 KiB. Each message
/// names the folder or the file.
pub fn probe_drive(dir: &Path, o: &ProbeOptions) -> io::Result<DriveProbe> {
    if !dir.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{}: not a folder", dir.display()),
        ));
    }
    if o.request_bytes == 0 || !o.request_bytes.is_multiple_of(super::IO_ALIGN) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "probe request size {} is not a positive multiple of 4 KiB",
                o.request_bytes
            ),
        ));
    }
    let req = o.request_bytes as u64;
    let n_req = (o.file_bytes / req).max(1);
    let path = dir.join(format!(".deltafin-probe-{}.tmp", std::process::id()));
    let named = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(named)?;
    let _guard = TempFile(path.clone());
    // pseudo-random contents (a file of zeros could be stored sparsely or compressed)
    let mut chunk = vec![0u8; 8 << 20];
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ std::process::id() as u64;
    for w in chunk.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        w.copy_from_slice(&x.to_le_bytes());
    }
    let mut left = n_req * req;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n]).map_err(named)?;
        left -= n as u64;
    }
    f.sync_all().map_err(named)?;
    // SAFETY: a valid open descriptor; the advice only drops clean cached pages.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    drop(f);
    let file = DirectFile::open(&path, true)?;
    let direct = file.is_direct();
    let opts = |engine| IoOptions {
        engine,
        depth: o.depth.max(1),
        request_bytes: o.request_bytes,
        ..IoOptions::default()
    };
    let (mut eng, io_uring) = match IoEngine::new(vec![file], &opts(EngineChoice::Uring)) {
        Ok(e) => (e, true),
        Err(_) => (
            IoEngine::new(
                vec![DirectFile::open(&path, true)?],
                &opts(EngineChoice::Pool),
            )?,
            false,
        ),
    };
    let depth = o.depth.max(1);
    let mut bufs: Vec<AlignedBuf> = (0..depth)
        .map(|_| AlignedBuf::new(o.request_bytes))
        .collect();
    let mut rng = x | 1;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % n_req) * req
    };
    let start = Instant::now();
    let submit = |eng: &mut IoEngine, bufs: &mut [AlignedBuf], i: usize, off: u64| {
        eng.submit(Req {
            file: 0,
            offset: off,
            len: o.request_bytes,
            need: o.request_bytes,
            dst: bufs[i].as_mut_slice().as_mut_ptr(),
            tag: i,
        })
    };
    for i in 0..depth {
        let off = next();
        submit(&mut eng, &mut bufs, i, off);
    }
    let mut bytes = 0u64;
    let mut failed = None;
    while eng.outstanding() > 0 {
        let d = eng.wait();
        match d.result {
            Ok(b) => bytes += b,
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
        if failed.is_none() && start.elapsed().as_secs_f64() < o.seconds {
            let off = next();
            submit(&mut eng, &mut bufs, d.tag, off);
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    let seconds = start.elapsed().as_secs_f64();
    Ok(DriveProbe {
        direct,
        io_uring,
        engine: eng.backend_name(),
        bytes,
        seconds,
        bytes_per_s: bytes as f64 / seconds.max(1e-9),
        request_bytes: o.request_bytes,
        depth,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_reads_and_removes_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let o = ProbeOptions {
            file_bytes: 4 << 20,
            seconds: 0.05,
            request_bytes: 64 << 10,
            depth: 4,
        };
        let p = probe_drive(dir.path(), &o).unwrap();
        assert!(p.bytes >= 4 * (64 << 10) && p.bytes.is_multiple_of(64 << 10));
        assert_eq!((p.request_bytes, p.depth), (64 << 10, 4));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        let e = probe_drive(&dir.path().join("nope"), &o).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("{}: not a folder", dir.path().join("nope").display())
        );
        let bad = ProbeOptions {
            request_bytes: 1000,
            ..o
        };
        assert_eq!(
            probe_drive(dir.path(), &bad).unwrap_err().to_string(),
            "probe request size 1000 is not a positive multiple of 4 KiB"
        );
    }
}
