//! The live display on stderr: the phase and level, requests done, running p95s and errors. Hidden
//! when stderr is not a terminal or `--quiet` is set, so logs and pipes stay clean.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::task::JoinHandle;

use crate::load::Sink;
use crate::spec::{Load, Metric, Phase};
use crate::stats::{percentile, values};

/// A spinner line redrawn from the live records of the level in progress.
pub(crate) struct Progress {
    bar: ProgressBar,
}

impl Progress {
    pub(crate) fn new(quiet: bool) -> Progress {
        let target = if quiet {
            ProgressDrawTarget::hidden()
        } else {
            ProgressDrawTarget::stderr_with_hz(4)
        };
        let bar = ProgressBar::with_draw_target(None, target);
        bar.set_style(
            ProgressStyle::with_template("{spinner} {elapsed:>4} {prefix:.bold} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        Progress { bar }
    }

    /// Shows `phase` at `load` and keeps the line fresh until the returned guard is dropped.
    pub(crate) fn level(&self, phase: Phase, load: Load, sink: Sink) -> Ticker {
        self.bar.set_prefix(format!("{} {load}", phase.name()));
        let bar = self.bar.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            loop {
                tick.tick().await;
                let line = {
                    let recs = sink.lock().unwrap_or_else(|e| e.into_inner());
                    let tail: Vec<_> = recs.iter().rev().take(500).collect();
                    let p95 = |m| {
                        percentile(&values(&tail, m), 95.0)
                            .map_or("-".to_string(), |v| format!("{:.1}ms", v * 1e3))
                    };
                    let errors = recs.iter().filter(|r| !r.ok()).count();
                    format!(
                        "{} done · ttft p95 {} · itl p95 {} · errors {errors}",
                        recs.len(),
                        p95(Metric::Ttft),
                        p95(Metric::Itl)
                    )
                };
                bar.set_message(line);
                bar.tick();
            }
        });
        Ticker { task }
    }

    /// A line printed above the spinner (a finished level's summary).
    pub(crate) fn println(&self, line: impl AsRef<str>) {
        if self.bar.is_hidden() {
            return;
        }
        self.bar.println(line);
    }

    pub(crate) fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// Stops a level's redraws when dropped.
pub(crate) struct Ticker {
    task: JoinHandle<()>,
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.task.abort();
    }
}
