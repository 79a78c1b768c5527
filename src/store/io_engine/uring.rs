//! The io_uring backend of the read engine (`io-uring` crate, `IORING_OP_READ`): one ring owned
//! by the calling thread, at most `depth` reads in the kernel, queued reads handed over
//! round-robin over drives, partial reads continued.

use std::collections::VecDeque;
use std::io;
use std::os::unix::io::AsRawFd;
use std::sync::Arc;

use super::{begin, end, read_error, short_read, Counters, DirectFile, Done, Req};

/// Requests not yet handed to the kernel, one queue per drive, with the bytes earlier partial
/// reads of the same request already brought in; taken round-robin over drives.
pub(super) struct DriveQueues {
    q: Vec<VecDeque<(Req, usize)>>,
    drive_of: Arc<Vec<usize>>,
    next: usize,
}

impl DriveQueues {
    pub(super) fn new(drive_of: Arc<Vec<usize>>) -> Self {
        let n = drive_of.iter().max().map_or(1, |m| m + 1);
        Self {
            q: (0..n).map(|_| VecDeque::new()).collect(),
            drive_of,
            next: 0,
        }
    }

    pub(super) fn push_back(&mut self, r: (Req, usize)) {
        self.q[self.drive_of[r.0.file]].push_back(r);
    }

    pub(super) fn push_front(&mut self, r: (Req, usize)) {
        self.q[self.drive_of[r.0.file]].push_front(r);
    }

    /// The oldest request of the next drive (round-robin) that has one.
    pub(super) fn pop_front(&mut self) -> Option<(Req, usize)> {
        let n = self.q.len();
        for i in 0..n {
            let d = (self.next + i) % n;
            if let Some(r) = self.q[d].pop_front() {
                self.next = (d + 1) % n;
                return Some(r);
            }
        }
        None
    }
}

pub(super) struct Uring {
    ring: io_uring::IoUring,
    pub(super) queued: DriveQueues,
    /// Requests in the kernel, by slot (the SQE's user data).
    slots: Vec<Option<(Req, usize)>>,
    free: Vec<usize>,
    depth: usize,
}

impl Uring {
    pub(super) fn new(depth: usize, drive_of: Arc<Vec<usize>>) -> io::Result<Self> {
        let ring = io_uring::IoUring::new(depth.next_power_of_two() as u32)?;
        Ok(Self {
            ring,
            queued: DriveQueues::new(drive_of),
            slots: (0..depth).map(|_| None).collect(),
            free: (0..depth).rev().collect(),
            depth,
        })
    }

    /// Hands queued requests to the kernel while slots are free.
    pub(super) fn fill(&mut self, files: &[DirectFile], counters: &Counters) -> io::Result<()> {
        let mut pushed = false;
        while !self.free.is_empty() {
            let Some((r, before)) = self.queued.pop_front() else {
                break;
            };
            let slot = self.free.pop().unwrap();
            let e = io_uring::opcode::Read::new(
                io_uring::types::Fd(files[r.file].file().as_raw_fd()),
                r.dst,
                r.len as u32,
            )
            .offset(r.offset)
            .build()
            .user_data(slot as u64);
            // SAFETY: dst stays valid until the completion is reaped (see Req).
            unsafe {
                self.ring
                    .submission()
                    .push(&e)
                    .map_err(|_| io::Error::other("io_uring submission queue full"))?;
            }
            begin(counters, r.file);
            self.slots[slot] = Some((r, before));
            pushed = true;
        }
        if pushed {
            loop {
                match self.ring.submit() {
                    Ok(_) => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    pub(super) fn in_kernel(&self) -> usize {
        self.depth - self.free.len()
    }

    pub(super) fn wait(&mut self, files: &[DirectFile], counters: &Counters) -> Done {
        loop {
            let cqe = self.ring.completion().next();
            let Some(cqe) = cqe else {
                match self.ring.submit_and_wait(1) {
                    Ok(_) => continue,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => panic!("io_uring wait failed: {e}"),
                }
            };
            let slot = cqe.user_data() as usize;
            let (r, before) = self.slots[slot]
                .take()
                .expect("completion of a live request");
            self.free.push(slot);
            let res = cqe.result();
            if res < 0 {
                end(counters, r.file, 0);
                let e = io::Error::from_raw_os_error(-res);
                return Done {
                    tag: r.tag,
                    file: r.file,
                    result: Err(read_error(files, &r, e)),
                };
            }
            let n = res as usize;
            end(counters, r.file, n as u64);
            if n >= r.need {
                return Done {
                    tag: r.tag,
                    file: r.file,
                    result: Ok((before + n) as u64),
                };
            }
            if n == 0 {
                return Done {
                    tag: r.tag,
                    file: r.file,
                    result: Err(short_read(files, &r, before)),
                };
            }
            // a partial read: the rest goes to the front of the queue
            let rest = Req {
                offset: r.offset + n as u64,
                len: r.len - n,
                need: r.need - n,
                // SAFETY: n < len, inside the same buffer.
                dst: unsafe { r.dst.add(n) },
                ..r
            };
            self.queued.push_front((rest, before + n));
            if let Err(e) = self.fill(files, counters) {
                return Done {
                    tag: r.tag,
                    file: r.file,
                    result: Err(e),
                };
            }
        }
    }
}
