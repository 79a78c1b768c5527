//! Standard output for every command, and what happens when its reader goes away.
//!
//! SIGPIPE stays ignored in the whole process (Rust's default): a socket write to a peer that
//! has gone then fails with `EPIPE` instead of killing the process, which a server (`serve`,
//! whose clients hang up mid-stream) and the HTTP clients (`pull`, packs on S3) need. Output
//! to a closed pipe (`deltafin run … | head`) still ends the command the way a Unix tool ends:
//! [`print`] meets `EPIPE`, restores SIGPIPE's default action and raises it, so the command
//! dies of SIGPIPE, quietly, at once (no panic, no generating on into nothing).

use std::io::Write;

/// Writes `s` to standard output and flushes it. A closed reader ends the process by SIGPIPE
/// (module header); any other write error ends it with exit code 1 and the error on stderr.
pub fn print(s: &str) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(s.as_bytes()).and_then(|()| out.flush()) {
        failed(&e);
    }
}

/// [`print`] of `s` and a newline.
pub fn println(s: &str) {
    print(&format!("{s}\n"));
}

/// Ends the process for a failed write to standard output (module header).
pub fn failed(e: &std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        // SAFETY: restoring a signal's default action and raising it in this process.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            libc::raise(libc::SIGPIPE);
        }
    }
    eprintln!("error: writing to standard output: {e}");
    std::process::exit(1)
}
