//! Entering the thread pool once per forward pass. A parallel product called from a thread
//! outside the rayon pool injects its job into the pool and blocks the caller on a futex until
//! the pool's threads finish it: two wake-ups per product, paid for every small matvec of a
//! decode step (some 30 per MoE layer). [`on_pool`] moves the whole pass onto one of the pool's
//! threads instead, so each product inside it is pushed onto that thread's own deque, computed
//! there and stolen by the other threads, with no hand-off of the caller. What runs where
//! changes; what is computed does not (products split by output rows, each output the same
//! dot), so results are bit-identical with or without it.

use super::numerics::Carried;

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
}
