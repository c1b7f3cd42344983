//! Progress for commands that take a while (simulations, what-ifs): a spinner with the run in hand, the runs
//! done of all and the time so far, on stderr. It is drawn only when stderr is a terminal, so pipes, files and
//! `--output json` readers see nothing of it.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::time::Duration;

/// Runs of a long command, one after another.
pub struct Progress(ProgressBar);

impl Progress {
    /// `total` runs of `what` (`simulating`, `replaying`).
    pub fn runs(total: usize, what: &str) -> Progress {
        let bar = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
        let style = ProgressStyle::with_template(&format!(
            "{{spinner}} {what} {{pos}}/{{len}} done, now {{msg}} [{{elapsed}}]"
        ))
        .unwrap_or_else(|_| ProgressStyle::default_spinner());
        bar.set_style(style);
        bar.enable_steady_tick(Duration::from_millis(200));
        Progress(bar)
    }

    /// The run now in hand.
    pub fn start(&self, name: &str) {
        self.0.set_message(name.to_owned());
    }

    /// One more run done.
    pub fn done(&self) {
        self.0.inc(1);
    }

    /// How many are done of how many, as counted afresh.
    pub fn at(&self, done: usize, total: usize) {
        self.0.set_length(total as u64);
        self.0.set_position(done as u64);
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}
