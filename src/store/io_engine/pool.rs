//! The pread thread-pool backend of the read engine: `depth` threads each doing blocking
//! `pread(2)`, for where io_uring is unavailable or when forced (`--io-engine pool`).

use std::io;
use std::os::unix::fs::FileExt;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::{begin, end, read_error, short_read, Counters, DirectFile, Done, Req};

/// Blocking read of one request (pool threads), retrying partial reads.
fn pread_req(files: &[DirectFile], r: &Req) -> io::Result<u64> {
    let f = files[r.file].file();
    // SAFETY: the caller guarantees dst is valid for len bytes until completion.
    let dst = unsafe { std::slice::from_raw_parts_mut(r.dst, r.len) };
    let mut done = 0usize;
    while done < r.need {
        match f.read_at(&mut dst[done..], r.offset + done as u64) {
            Ok(0) => return Err(short_read(files, r, done)),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(read_error(files, r, e)),
        }
    }
    Ok(done as u64)
}

pub(super) struct Pool {
    pub(super) jobs: Option<Sender<Req>>,
    pub(super) done: Receiver<Done>,
    /// A sender of `done`, for the fetcher of a pack on object storage.
    pub(super) done_tx: Sender<Done>,
    threads: Vec<JoinHandle<()>>,
}

impl Pool {
    /// Starts `n` threads.
    ///
    /// Errors: a thread cannot be started (the message names `--io-depth`); the threads
    /// started before it are stopped.
    pub(super) fn new(
        files: Arc<Vec<DirectFile>>,
        counters: Counters,
        n: usize,
    ) -> io::Result<Self> {
        let (jtx, jrx) = channel::<Req>();
        let jrx = Arc::new(Mutex::new(jrx));
        let (dtx, drx) = channel::<Done>();
        let n = n.max(1);
        let mut pool = Self {
            jobs: Some(jtx),
            done: drx,
            done_tx: dtx.clone(),
            threads: Vec::with_capacity(n),
        };
        for i in 0..n {
            let (jrx, dtx, files, counters) =
                (jrx.clone(), dtx.clone(), files.clone(), counters.clone());
            let t = std::thread::Builder::new()
                .name(format!("deltafin-pread-{i}"))
                .spawn(move || loop {
                    let job = jrx.lock().unwrap().recv();
                    let Ok(r) = job else { return };
                    begin(&counters, r.file);
                    let res = pread_req(&files, &r);
                    end(&counters, r.file, *res.as_ref().unwrap_or(&0));
                    if dtx
                        .send(Done {
                            tag: r.tag,
                            file: r.file,
                            result: res,
                        })
                        .is_err()
                    {
                        return;
                    }
                })
                .map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!(
                            "--io-depth {n}: cannot start pread thread {} of {n}: {e}",
                            i + 1
                        ),
                    )
                })?;
            pool.threads.push(t);
        }
        Ok(pool)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.jobs.take();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
