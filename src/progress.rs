//! Progress on standard error, one look for every command that moves bytes (`synth`, `pack`,
//! `pull`, loading a model): a bar with bytes done and total (binary units), rate and ETA when
//! standard error is a terminal; nothing, or with [`Progress`] a plain line every 10%, when it
//! is not (a log file, a test reading the output).
//!
//! A leaf module: it imports nothing from the crate, so `write`, `pull`, `load` and `cli` all
//! use it.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The template of every byte bar: `LABEL [=====>    ] 1.20 GiB/4.00 GiB 350.00 MiB/s ETA 8s`.
pub const BAR_TEMPLATE: &str =
    "{msg} [{bar:30}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} ETA {eta}";

/// The template while the total is not known yet: `LABEL ⠋ 3s`.
pub const SPINNER_TEMPLATE: &str = "{msg} {spinner} {elapsed}";

/// The style of every byte bar ([`BAR_TEMPLATE`]).
pub fn bar_style() -> ProgressStyle {
    ProgressStyle::with_template(BAR_TEMPLATE)
        .expect("static template")
        .progress_chars("=> ")
}

/// The style of a bar whose total is not known yet ([`SPINNER_TEMPLATE`]).
pub fn spinner_style() -> ProgressStyle {
    ProgressStyle::with_template(SPINNER_TEMPLATE).expect("static template")
}

/// Whether standard error is a terminal (bars are drawn only then).
pub fn stderr_is_terminal() -> bool {
    std::io::stderr().is_terminal()
}

/// A byte bar of `total` bytes labelled `label` ([`bar_style`]), drawn on standard error when
/// `show` and standard error is a terminal, hidden otherwise.
pub fn bar(total: u64, label: &str, show: bool) -> ProgressBar {
    let target = if show && stderr_is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let b = ProgressBar::with_draw_target(Some(total), target);
    b.set_style(bar_style());
    b.set_message(label.to_string());
    b
}

/// Bytes in binary units with one decimal, as the plain lines write them: `512 B`, `1.5 KiB`,
/// `1.2 GiB`.
pub fn binary_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

/// The plain lines of a piped command: one each time the work passes another 10% of its total,
/// as `synth: 1.2 GiB of 4.0 GiB written (30%)`.
#[derive(Debug)]
pub struct PlainLines {
    label: String,
    verb: String,
    /// The last tenth reported (0: none yet).
    tenths: u64,
}

impl PlainLines {
    /// Lines `LABEL: DONE of TOTAL VERB (P%)`.
    pub fn new(label: &str, verb: &str) -> Self {
        Self {
            label: label.to_string(),
            verb: verb.to_string(),
            tenths: 0,
        }
    }

    /// The line to print for `done` of `total` bytes: `Some` when `done` reaches a tenth of
    /// `total` not reported yet (several tenths passed at once give one line), else `None`.
    pub fn update(&mut self, done: u64, total: u64) -> Option<String> {
        if total == 0 {
            return None;
        }
        let tenths = (done.min(total) as u128 * 10 / total as u128) as u64;
        if tenths <= self.tenths {
            return None;
        }
        self.tenths = tenths;
        let pct = done.min(total) as u128 * 100 / total as u128;
        Some(format!(
            "{}: {} of {} {} ({pct}%)",
            self.label,
            binary_bytes(done),
            binary_bytes(total),
            self.verb
        ))
    }
}

/// Progress of a long write: a byte bar on a terminal, plain lines every 10% otherwise.
pub struct Progress {
    bar: ProgressBar,
    lines: Option<PlainLines>,
}

impl Progress {
    /// Progress labelled `label` whose plain lines say `verb` (`synth`, `written`); the total
    /// is given with each update.
    pub fn new(label: &str, verb: &str) -> Self {
        let tty = stderr_is_terminal();
        Self {
            bar: bar(0, label, tty),
            lines: (!tty).then(|| PlainLines::new(label, verb)),
        }
    }

    /// `done` of `total` bytes are done.
    pub fn set(&mut self, done: u64, total: u64) {
        self.bar.set_length(total);
        self.bar.set_position(done);
        if let Some(line) = self.lines.as_mut().and_then(|l| l.update(done, total)) {
            eprintln!("{line}");
        }
    }

    /// Removes the bar (a terminal keeps no trace of it).
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_lines_come_every_tenth() {
        let mut p = PlainLines::new("synth", "written");
        let g = 1u64 << 30;
        assert_eq!(p.update(0, 4 * g), None);
        assert_eq!(p.update(g / 4, 4 * g), None);
        assert_eq!(
            p.update(g / 2, 4 * g).as_deref(),
            Some("synth: 512.0 MiB of 4.0 GiB written (12%)")
        );
        assert_eq!(p.update(g / 2 + 1, 4 * g), None);
        // from 12% to 31%: one line
        assert_eq!(
            p.update(g + g / 4, 4 * g).as_deref(),
            Some("synth: 1.2 GiB of 4.0 GiB written (31%)")
        );
        assert_eq!(
            p.update(4 * g, 4 * g).as_deref(),
            Some("synth: 4.0 GiB of 4.0 GiB written (100%)")
        );
        assert_eq!(p.update(4 * g, 4 * g), None);
        assert_eq!(PlainLines::new("x", "y").update(5, 0), None);
    }

    #[test]
    fn binary_units() {
        assert_eq!(binary_bytes(0), "0 B");
        assert_eq!(binary_bytes(1023), "1023 B");
        assert_eq!(binary_bytes(1536), "1.5 KiB");
        assert_eq!(binary_bytes(160 << 20), "160.0 MiB");
        assert_eq!(binary_bytes(5 << 40), "5.0 TiB");
    }

    #[test]
    fn the_bar_is_hidden_when_not_asked() {
        assert!(bar(10, "x", false).is_hidden());
    }
}
