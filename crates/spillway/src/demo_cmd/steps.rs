//! The demo's live display: a spinner with the step in progress on a terminal, plain timestamped
//! lines otherwise (a pipe, a CI log), so the output reads the same in both.

use std::io::IsTerminal;
use std::time::Duration;

use bench::report::Width;
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
    /// In a terminal narrower than the story's longest lines (the plan's, diagnose's), each line
    /// is wrapped under its own indent rather than left to the terminal to break anywhere.
    pub(crate) fn printer(&self) -> impl Fn(&str) + Send + Sync + 'static {
        let bar = self.bar.clone();
        let width = Width::of_stdout();
        move |text: &str| {
            let text: String = text
                .trim_end_matches('\n')
                .lines()
                .map(|line| fit(line, width) + "\n")
                .collect();
            match &bar {
                Some(bar) => {
                    for line in text.lines() {
                        bar.println(line);
                    }
                }
                None => print!("{text}"),
            }
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

/// One line of the story at `width`: as it is when it fits, else wrapped at spaces, the rest of it
/// two columns further in than its own indent.
fn fit(line: &str, width: Width) -> String {
    match width {
        Width::Narrow(columns) if line.chars().count() > columns => {
            let indent = line.len() - line.trim_start().len();
            let wrapped = bench::report::wrap(line.trim_start(), columns, indent + 2);
            wrapped.get(2..).unwrap_or_default().trim_end().to_owned()
        }
        _ => line.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_story_lines_wrap_under_their_indent_in_a_narrow_terminal() {
        let line =
            "   C = floor(C_safe × R × headroom) = floor(16 × 2 × 0.8) = floor(25.6) = 25 and more words";
        let narrow = fit(line, Width::Narrow(40));
        let lines: Vec<&str> = narrow.lines().collect();
        assert!(lines.len() > 1, "{narrow}");
        assert!(lines[0].starts_with("   C = floor"), "{narrow}");
        assert!(
            lines[1..]
                .iter()
                .all(|l| l.starts_with("     ") && !l.starts_with("      ")),
            "{narrow}"
        );
        assert!(lines.iter().all(|l| l.chars().count() <= 40), "{narrow}");
        assert_eq!(fit(line, Width::Full), line);
        assert_eq!(fit("   short", Width::Narrow(40)), "   short");
    }
}
