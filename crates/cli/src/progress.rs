//! Progress on stderr for long work (`filter`, `export`, `import`,
//! `verify`, `compact`, `restore`): drawn only when stderr is a terminal.
//! Otherwise nothing is drawn, not a byte: a pipe or a log file gets the
//! command's summary line alone.

use std::io::IsTerminal as _;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A count of work done, or a spinner for work that has none; cleared
/// from the terminal when dropped.
pub struct Progress(ProgressBar);

impl Progress {
    /// Counts `unit`s (lines, records) of `what`, with their rate.
    pub fn counting(what: &str, unit: &str) -> Progress {
        let bar = bar();
        if let Ok(style) = ProgressStyle::with_template(&format!(
            "{{spinner}} {what}: {{human_pos}} {unit} ({{per_sec}}, {{elapsed}})"
        )) {
            bar.set_style(style);
        }
        Progress(bar)
    }

    /// A spinner for `what`, turning until dropped.
    pub fn spinner(what: &str) -> Progress {
        let bar = bar();
        if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
            bar.set_style(style);
        }
        bar.set_message(what.to_owned());
        bar.enable_steady_tick(Duration::from_millis(200));
        Progress(bar)
    }

    /// `n` more done.
    pub fn inc(&self, n: u64) {
        self.0.inc(n);
    }

    /// Prints `line` on stderr above the progress line.
    pub fn note(&self, line: &str) {
        self.0.suspend(|| eprintln!("{line}"));
    }

    /// `n` done in all.
    pub fn set(&self, n: u64) {
        self.0.set_position(n);
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}

/// A bar drawing on stderr when it is a terminal, else one that draws
/// nothing.
fn bar() -> ProgressBar {
    if std::io::stderr().is_terminal() {
        ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
    } else {
        ProgressBar::hidden()
    }
}
