//! Ctrl-C while `deltafin run` generates: the first SIGINT asks the generation to stop after
//! the step under way ([`requested`], passed to the engine as
//! [`crate::engine::GenerateOptions::cancel`]), so the text so far and the statistics are still
//! written, then the command exits with status 130 ([`Interrupted`]). A second Ctrl-C, or one
//! outside a generation (loading, reading the prompt), ends the process at once with status 130.

use std::sync::atomic::{AtomicBool, Ordering};

static GENERATING: AtomicBool = AtomicBool::new(false);
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    if GENERATING.load(Ordering::SeqCst) && !STOP.swap(true, Ordering::SeqCst) {
        return;
    }
    // SAFETY: _exit is async-signal-safe.
    unsafe { libc::_exit(130) }
}

/// Installs the SIGINT handler of this module (its effect is process-wide).
pub fn install() {
    // SAFETY: the handler only touches atomics and calls _exit, both async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t);
    }
}

/// A generation under way, from [`Generating::start`] until dropped: while it lives, the first
/// Ctrl-C sets [`requested`] instead of ending the process.
pub struct Generating(());

impl Generating {
    /// Marks a generation as started, clearing an earlier request to stop.
    pub fn start() -> Self {
        STOP.store(false, Ordering::SeqCst);
        GENERATING.store(true, Ordering::SeqCst);
        Generating(())
    }
}

impl Drop for Generating {
    fn drop(&mut self) {
        GENERATING.store(false, Ordering::SeqCst);
    }
}

/// Whether Ctrl-C asked the generation under way to stop.
pub fn requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// The error a command returns after a generation that Ctrl-C stopped has written its text and
/// statistics: [`super::main`] prints `interrupted` and exits with status 130 (128 + SIGINT),
/// as a shell reports a command ended by Ctrl-C.
#[derive(Debug)]
pub struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("interrupted")
    }
}

impl std::error::Error for Interrupted {}
