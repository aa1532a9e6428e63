//! The demo's live display: a spinner with the step in progress on a terminal, plain timestamped
//! lines otherwise (a pipe, a CI log), so the output reads the same in both.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::time::Instant;

pub(crate) struct Steps {
    bar: Option<ProgressBar>,
    start: Instant,
}

impl Steps {
    pub(crate) fn new() -> Steps {
        let bar = std::io::stdout().is_terminal().then(|| {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stdout_with_hz(8));
            bar.set_style(
                ProgressStyle::with_template("{spinner} {elapsed:>3} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        Steps {
            bar,
            start: Instant::now(),
        }
    }

    /// Names what runs now: the spinner's message, or one plain line with the time so far.
    pub(crate) fn step(&self, what: &str) {
        match &self.bar {
            Some(bar) => bar.set_message(what.to_owned()),
            None => println!("[{:5.1}s] {what}", self.start.elapsed().as_secs_f64()),
        }
    }

    /// Prints lines of the story above the spinner.
    pub(crate) fn say(&self, text: &str) {
        self.printer()(text);
    }

    /// [`Steps::say`] for another task: what a finished bench level prints while the bench runs.
    pub(crate) fn printer(&self) -> impl Fn(&str) + Send + Sync + 'static {
        let bar = self.bar.clone();
        move |text: &str| match &bar {
            Some(bar) => {
                for line in text.trim_end_matches('\n').lines() {
                    bar.println(line);
                }
            }
            None => println!("{}", text.trim_end_matches('\n')),
        }
    }

    pub(crate) fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    pub(crate) fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
