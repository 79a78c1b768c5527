//! Entering the thread pool once per forward pass. A parallel product called from a thread
//! outside the rayon pool injects its job into the pool and blocks the caller on a futex until
//! the pool's threads finish it: two wake-ups per product, paid for every small matvec of a
//! decode step (some 30 per MoE layer). [`on_pool`] moves the whole pass onto one of the pool's
//! threads instead, so each product inside it is pushed onto that thread's own deque, computed
//! there and stolen by the other threads, with no hand-off of the caller. What runs where
//! changes; what is computed does not (products split by output rows, each output the same
//! dot), so results are bit-identical with or without it.
//!
//! [`for_each_task`] and [`for_each_chunk_mut`] are the parallel loops the kernels split their
//! work with (on the current rayon pool). A team of spinning pool threads per pass, claiming
//! tasks by compare-and-swap, was tried for issue 31 and measured on the device host (16 Xeon
//! cores under gVisor): decode fell to 0.38-0.54× llama.cpp from 4 threads up (BENCHMARKS.md,
//! issue 31), so the loops stay on rayon.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use rayon::prelude::*;

use super::numerics::Carried;

/// What the parallel loops ([`for_each_task`]) did since the process started: their count,
/// their tasks, their wall time on the calling thread and the time their tasks ran on any
/// thread. Between two snapshots ([`PoolStats::since`]) it tells how well a pass used the
/// pool: `busy_ns / (threads × wall_ns)` is the share of the pool's thread time inside the
/// regions that tasks used (the rest went to waking threads, stealing, waiting for the last
/// task), and a pass's time outside `wall_ns` ran on one thread (`--stats`, `bench`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Parallel regions (loops of two tasks or more).
    pub regions: u64,
    /// Tasks of those regions.
    pub tasks: u64,
    /// Nanoseconds from each region's start to its end, on the thread that entered it.
    pub wall_ns: u64,
    /// Nanoseconds the regions' tasks ran, summed over threads.
    pub busy_ns: u64,
}

static REGIONS: AtomicU64 = AtomicU64::new(0);
static TASKS: AtomicU64 = AtomicU64::new(0);
static WALL_NS: AtomicU64 = AtomicU64::new(0);
static BUSY_NS: AtomicU64 = AtomicU64::new(0);

impl PoolStats {
    /// The counters now (every thread's loops, of every pass in the process).
    pub fn now() -> Self {
        Self {
            regions: REGIONS.load(Ordering::Relaxed),
            tasks: TASKS.load(Ordering::Relaxed),
            wall_ns: WALL_NS.load(Ordering::Relaxed),
            busy_ns: BUSY_NS.load(Ordering::Relaxed),
        }
    }

    /// What happened between the snapshot `earlier` and this one.
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            regions: self.regions.saturating_sub(earlier.regions),
            tasks: self.tasks.saturating_sub(earlier.tasks),
            wall_ns: self.wall_ns.saturating_sub(earlier.wall_ns),
            busy_ns: self.busy_ns.saturating_sub(earlier.busy_ns),
        }
    }

    /// `busy_ns / (threads × wall_ns)` in percent (0 without regions).
    pub fn busy_pct(&self, threads: usize) -> f64 {
        let t = self.wall_ns as f64 * threads.max(1) as f64;
        if t > 0.0 {
            100.0 * self.busy_ns as f64 / t
        } else {
            0.0
        }
    }
}

/// Runs `f(i)` for every `i in 0..n` over the current rayon pool (in place when `n` is 1).
/// Each `f(i)` must not depend on which thread runs it. A panic in `f` propagates. A loop of
/// two tasks or more counts in [`PoolStats`] (two clock reads per task).
pub fn for_each_task(n: usize, f: impl Fn(usize) + Sync) {
    if n <= 1 {
        (0..n).for_each(f);
        return;
    }
    let t0 = Instant::now();
    (0..n).into_par_iter().for_each(|i| {
        let t = Instant::now();
        f(i);
        BUSY_NS.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    });
    WALL_NS.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
    TASKS.fetch_add(n as u64, Ordering::Relaxed);
    REGIONS.fetch_add(1, Ordering::Relaxed);
}

/// Raw pointer to the elements of a slice that tasks split into disjoint chunks.
struct SlicePtr<T>(*mut T);
// SAFETY: tasks touch disjoint chunks (see `for_each_chunk_mut`), and the slice outlives them.
unsafe impl<T: Send> Sync for SlicePtr<T> {}

/// Runs `f(i, chunk)` for the chunks of `per` elements of `y` (the last one shorter), as
/// [`for_each_task`] runs tasks.
pub fn for_each_chunk_mut<T: Send>(y: &mut [T], per: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let (len, per) = (y.len(), per.max(1));
    let p = SlicePtr(y.as_mut_ptr());
    let p = &p;
    for_each_task(len.div_ceil(per), |i| {
        let start = i * per;
        let n = per.min(len - start);
        // SAFETY: chunk `i` covers `start .. start + n` inside `y`, disjoint from every other
        // task's chunk, and `y` is borrowed mutably until all tasks are done.
        let chunk = unsafe { std::slice::from_raw_parts_mut(p.0.add(start), n) };
        f(i, chunk)
    });
}

/// Runs `f` on a thread of the current rayon pool (the global one outside any pool) and
/// returns its result; runs it right here when the caller already is a pool thread. The
/// caller's numerics ([`super::with_numerics`]) hold inside `f`.
/// A panic in `f` propagates to the caller.
pub fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        return f();
    }
    let carried = Carried::here();
    rayon::scope(move |_| carried.run(f))
}

/// The threads a forward pass splits its work over (the global pool's size): families size
/// their per-thread scratch with it.
pub fn threads() -> usize {
    rayon::current_num_threads()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::{numerics, with_numerics, Numerics};

    #[test]
    fn loops_count_their_regions_tasks_and_times() {
        let a = PoolStats::now();
        for_each_task(1, |_| {});
        let one = PoolStats::now().since(&a);
        for_each_task(7, |_| {
            std::thread::sleep(std::time::Duration::from_millis(2))
        });
        let b = PoolStats::now().since(&a);
        // other tests' loops may count too, so: at least what these did
        assert!(b.regions > one.regions, "{one:?} then {b:?}");
        assert!(b.tasks >= one.tasks + 7, "{one:?} then {b:?}");
        assert!(b.busy_ns >= 14_000_000, "7 tasks of 2 ms: {b:?}");
        assert!(b.wall_ns >= 2_000_000, "{b:?}");
        let s = PoolStats {
            regions: 1,
            tasks: 4,
            wall_ns: 100,
            busy_ns: 150,
        };
        assert_eq!(s.busy_pct(2), 75.0);
        assert_eq!(PoolStats::default().busy_pct(16), 0.0);
        assert_eq!(s.since(&s), PoolStats::default());
    }

    #[test]
    fn runs_on_a_pool_thread_with_the_callers_numerics() {
        assert_eq!(rayon::current_thread_index(), None);
        let (idx, n) = with_numerics(Numerics::Q8, || {
            on_pool(|| (rayon::current_thread_index(), numerics::current()))
        });
        assert!(idx.is_some(), "not on a pool thread");
        assert_eq!(n, Numerics::Q8);
        // the pool thread's own state is restored afterwards
        assert_eq!(on_pool(numerics::current), Numerics::Exact);
        // nested: already on the pool, runs in place
        let same = on_pool(|| {
            let i = rayon::current_thread_index();
            on_pool(rayon::current_thread_index) == i
        });
        assert!(same);
    }

    /// Every task runs exactly once whatever the pool's size; chunks cover the slice.
    #[test]
    fn every_task_runs_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                for n in [0usize, 1, 2, 7, 1000] {
                    let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                    for_each_task(n, |i| {
                        hits[i].fetch_add(1, Ordering::Relaxed);
                    });
                    assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "n {n}");
                }
                let mut y = vec![0usize; 103];
                for_each_chunk_mut(&mut y, 10, |i, c| {
                    c.iter_mut().enumerate().for_each(|(j, v)| *v = i * 10 + j)
                });
                assert_eq!(y, (0..103).collect::<Vec<_>>());
            });
        }
    }
}
