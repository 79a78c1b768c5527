//! Entering the thread pool once per forward pass, and the pass's team of spinning threads.
//!
//! A parallel product called from a thread outside the rayon pool injects its job into the
//! pool and blocks the caller on a futex until the pool's threads finish it. [`on_pool`]
//! moves the whole pass onto one of the pool's threads (the *driver*) and enlists the pool's
//! other threads as a [`Team`] for the pass's duration: each runs a loop that waits for the
//! driver's next parallel region by spinning on one atomic word (then parking after
//! [`SPIN`] without work, so a pass waiting on a drive does not burn the cores).
//!
//! A decode step of a MoE model is a few hundred small parallel regions (q/k/v, attention,
//! output, router, each expert's gate/up and down, the head). Through rayon each region
//! split its work by recursive `join`s and woke sleeping threads one futex at a time, a few
//! microseconds per region per thread, more under a sandboxed kernel (gVisor's futexes): at
//! 16 threads that cost was a large part of a decode step (BENCHMARKS.md, issue 31). Through
//! the team a region is one store of the job and one compare-and-swap per task claimed.
//!
//! [`for_each_task`] runs `f(i)` for `i in 0..n` on the team when the calling thread drives
//! one, else on the current rayon pool. Which thread computes which task changes; what each
//! task computes does not (products split by output rows, each output the same dot), so
//! results are bit-identical whatever the team, the pool or the thread count.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use rayon::prelude::*;

use super::numerics::Carried;

/// How long an idle team thread polls for the next region before it parks.
const SPIN: Duration = Duration::from_micros(500);
/// How long of that it spins without yielding its core (the gap between two regions of a
/// decode step is usually shorter).
const SPIN_ALONE: Duration = Duration::from_micros(30);

/// Most tasks one region counts (16 bits of the state word); [`for_each_task`] groups more.
pub const MAX_TASKS: usize = u16::MAX as usize;

/// A region's work: `f(i)` for each task `i`. Lives on the driver's stack while the region
/// runs; team threads reach it only through a claimed task.
type TaskFn<'a> = dyn Fn(usize) + Sync + 'a;

/// The threads of one pass: the driver publishes a region in `state` (epoch in the high 32
/// bits, task count in bits 16..32, next unclaimed task in bits 0..16), every member claims
/// tasks by compare-and-swap and counts them done.
pub struct Team {
    state: AtomicU64,
    /// The region's work (a fat pointer to a `TaskFn` on the driver's stack), written before
    /// the region's epoch is published and read only after a task of it was claimed.
    job: AtomicPtr<&'static TaskFn<'static>>,
    /// Tasks of the current region finished (by any member).
    done: AtomicUsize,
    /// Set when the pass ends: members leave their loop.
    stop: AtomicBool,
    /// Members parked on `wake`; the driver notifies only when some are.
    parked: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    /// A task's panic, re-raised by the driver after its region.
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
}

thread_local! {
    /// The team this thread drives or serves (null when none).
    static TEAM: Cell<*const Team> = const { Cell::new(std::ptr::null()) };
    /// Whether this thread is a member serving a team (not its driver).
    static MEMBER: Cell<bool> = const { Cell::new(false) };
}

impl Team {
    fn new() -> Self {
        Self {
            state: AtomicU64::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            done: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            parked: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            panic: Mutex::new(None),
        }
    }

    /// Claims the next task of the region `s` was read from: its index, or `None` when every
    /// task of that region is claimed or a newer region replaced it.
    fn claim(&self, mut s: u64) -> Option<usize> {
        loop {
            let (n, i) = ((s >> 16) & 0xffff, s & 0xffff);
            if i >= n {
                return None;
            }
            match self
                .state
                .compare_exchange_weak(s, s + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(i as usize),
                Err(now) if now >> 32 == s >> 32 => s = now,
                Err(_) => return None,
            }
        }
    }

    /// Runs claimed task `i` of the current region and counts it done (a panic is kept for
    /// the driver).
    fn run_task(&self, i: usize) {
        // SAFETY: a task of the current region is claimed and not yet counted done, so the
        // driver is still inside `run` and the job it points to is alive.
        let f: &TaskFn = unsafe { *self.job.load(Ordering::Acquire) };
        if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(i))) {
            *self.panic.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
        }
        self.done.fetch_add(1, Ordering::Release);
    }

    /// A member's loop: claim and run tasks of each region until the pass ends.
    fn serve(&self) {
        let mut idle = Instant::now();
        let mut spins = 0u32;
        while !self.stop.load(Ordering::Acquire) {
            let s = self.state.load(Ordering::Acquire);
            if let Some(i) = self.claim(s) {
                self.run_task(i);
                spins = 0;
                continue;
            }
            spins += 1;
            if !spins.is_multiple_of(64) {
                std::hint::spin_loop();
                continue;
            }
            if spins == 64 {
                idle = Instant::now();
            }
            // work of the pool outside the team (a product not yet on it, another caller)
            if rayon::yield_now() == Some(rayon::Yield::Executed) {
                spins = 0;
                continue;
            }
            let waited = idle.elapsed();
            if waited < SPIN {
                // past the first microseconds, give the core to any other runnable thread
                // between polls (on a busy machine the driver may be waiting for it)
                if waited > SPIN_ALONE {
                    std::thread::yield_now();
                }
                continue;
            }
            let g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.parked.fetch_add(1, Ordering::SeqCst);
            // re-check under the lock: the driver publishes, then notifies under it
            let s2 = self.state.load(Ordering::SeqCst);
            let pending = (s2 & 0xffff) < ((s2 >> 16) & 0xffff);
            if !pending && !self.stop.load(Ordering::SeqCst) {
                let _ = self.wake.wait_timeout(g, Duration::from_millis(50));
            }
            self.parked.fetch_sub(1, Ordering::SeqCst);
            spins = 0;
        }
    }

    /// The driver's side of one region: publishes `n` tasks of `f`, works on them itself and
    /// returns when all are done; re-raises a task's panic.
    fn run(&self, n: usize, f: &TaskFn) {
        assert!(n <= MAX_TASKS, "{n} tasks in one region");
        // SAFETY: the pointer is only dereferenced for a claimed, unfinished task of this
        // region, and this function returns only after every task is done.
        let fat: &'static TaskFn<'static> = unsafe { std::mem::transmute(f) };
        let mut slot = fat;
        self.job.store(&mut slot, Ordering::Release);
        self.done.store(0, Ordering::Relaxed);
        let epoch = (self.state.load(Ordering::Relaxed) >> 32) + 1;
        self.state
            .store((epoch << 32) | ((n as u64) << 16), Ordering::SeqCst);
        if self.parked.load(Ordering::SeqCst) > 0 {
            let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.wake.notify_all();
        }
        loop {
            let s = self.state.load(Ordering::Acquire);
            match self.claim(s) {
                Some(i) => self.run_task(i),
                None => break,
            }
        }
        while self.done.load(Ordering::Acquire) < n {
            std::hint::spin_loop();
        }
        if let Some(p) = self.panic.lock().unwrap_or_else(|e| e.into_inner()).take() {
            std::panic::resume_unwind(p);
        }
    }

    /// Ends the pass: members leave their loops.
    fn finish(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.wake.notify_all();
    }
}

/// Runs `f(i)` for every `i in 0..n`: on the pass's team when this thread drives one
/// ([`on_pool`]), else split over the current rayon pool (one task at a time when `n` is 1).
/// Each `f(i)` must not depend on which thread runs it. A panic in `f` propagates.
pub fn for_each_task(n: usize, f: impl Fn(usize) + Sync) {
    if n <= 1 {
        (0..n).for_each(f);
        return;
    }
    let team = TEAM.with(Cell::get);
    if !team.is_null() && !MEMBER.with(Cell::get) {
        // SAFETY: the pointer is set only while `on_pool`'s team lives (it is cleared before
        // the team is dropped).
        let team = unsafe { &*team };
        if n <= MAX_TASKS {
            return team.run(n, &f);
        }
        // more tasks than a region counts: consecutive ones grouped
        let per = n.div_ceil(MAX_TASKS);
        return team.run(n.div_ceil(per), &|i: usize| {
            (i * per..((i + 1) * per).min(n)).for_each(&f)
        });
    }
    (0..n).into_par_iter().for_each(&f);
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

/// Clears the thread's team pointer when the pass ends (also on a panic) and stops the team.
struct Driving<'a>(&'a Team);
impl Drop for Driving<'_> {
    fn drop(&mut self) {
        TEAM.with(|t| t.set(std::ptr::null()));
        self.0.finish();
    }
}

/// Runs `f` on a thread of the current rayon pool (the global one outside any pool), with the
/// pool's other threads enlisted as its team ([`for_each_task`]) until `f` returns, and
/// returns its result; runs it right here when this thread already drives or serves a team.
/// The caller's numerics ([`super::with_numerics`]) hold inside `f`. A panic in `f`
/// propagates to the caller.
pub fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if !TEAM.with(Cell::get).is_null() || MEMBER.with(Cell::get) {
        return f();
    }
    let carried = Carried::here();
    let drive = move || {
        let team = Team::new();
        let members = rayon::current_num_threads().saturating_sub(1);
        rayon::in_place_scope(|s| {
            for _ in 0..members {
                let team = &team;
                s.spawn(move |_| {
                    // the driver itself (waiting inside the scope) or a member of any team
                    // does not serve: it would never return to its own work
                    if !TEAM.with(Cell::get).is_null() || MEMBER.with(Cell::get) {
                        return;
                    }
                    MEMBER.with(|m| m.set(true));
                    TEAM.with(|t| t.set(team));
                    team.serve();
                    TEAM.with(|t| t.set(std::ptr::null()));
                    MEMBER.with(|m| m.set(false));
                });
            }
            TEAM.with(|t| t.set(&team));
            let _driving = Driving(&team);
            carried.run(f)
        })
    };
    if rayon::current_thread_index().is_some() {
        drive()
    } else {
        rayon::scope(move |_| drive())
    }
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

    /// Every task of every region runs exactly once, whatever the pool's size, inside a pass
    /// and outside one; chunks cover the slice; a task's panic reaches the caller and the
    /// team still serves the next pass.
    #[test]
    fn the_team_runs_every_task_once() {
        for threads in [1, 2, 3, 8] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                let check = || {
                    for n in [0usize, 1, 2, 7, 64, 1000, MAX_TASKS + 3] {
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
                };
                check();
                on_pool(|| (0..50).for_each(|_| check()));
                let r = std::panic::catch_unwind(|| {
                    on_pool(|| {
                        for_each_task(16, |i| assert!(i != 11, "task 11 fails"));
                    })
                });
                assert!(r.is_err(), "{threads} threads");
                on_pool(check);
            });
        }
    }
}
