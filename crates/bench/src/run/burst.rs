//! The sustained-plus-burst phase: k × the load for a window, then how long rolling TTFT p95 and the
//! server's waiting queue take to come back.

use std::time::Duration;

use super::{BurstReport, Ctx, TimelinePoint};
use crate::load::{Burst, Stop};
use crate::spec::{Load, Metric, Phase};
use crate::stats::percentile;
use crate::watch::QueueSample;

impl Ctx {
    /// Sustained load at `load`, k × load for the burst window, then `load` again until the
    /// recovery window ends; recovery read from the first-token timeline and the server's queue.
    pub(super) async fn burst(&mut self, load: Load) -> BurstReport {
        let sustain = match self.opts.stop {
            Stop::After(d) => d,
            Stop::Requests(_) => Duration::from_secs(5),
        };
        let burst = Burst {
            factor: self.opts.burst_factor,
            start: sustain,
            length: self.opts.burst_length,
        };
        let total = sustain + self.opts.burst_length + self.opts.recovery_timeout;
        let workload = self.opts.workload.clone();
        let ticker = self.progress.level(Phase::Burst, load, self.sink.clone());
        let run = self
            .driver
            .run(
                load,
                Stop::After(total),
                &workload,
                Some(burst),
                self.sink.clone(),
            )
            .await;
        drop(ticker);
        let level_start = run.start;
        let samples = self
            .watch
            .as_ref()
            .map(|w| w.between(run.start, run.end))
            .unwrap_or_default();
        let mut arrivals: Vec<(f64, f64)> = run
            .records
            .iter()
            .filter(|r| r.ok())
            .filter_map(|r| {
                let ttft = r.ttft?;
                Some((
                    (r.scheduled + r.send_lag + ttft).as_secs_f64(),
                    ttft.as_secs_f64(),
                ))
            })
            .collect();
        arrivals.sort_by(|a, b| a.0.total_cmp(&b.0));
        let level_len = run.end.saturating_sub(run.start).as_secs_f64();
        let mut level = self.judge(Phase::Burst, load, run, false);
        let (b_start, b_end) = (
            burst.start.as_secs_f64(),
            (burst.start + burst.length).as_secs_f64(),
        );
        let rel = |s: &QueueSample| s.at.saturating_sub(level_start).as_secs_f64();
        let timeline = timeline(&arrivals, &samples, level_start, level_len);
        let ttft_limit = self.opts.slo.limit(Metric::Ttft).map(|d| d.as_secs_f64());
        let settle = level_len - 1.0;
        let ttft_recovery = ttft_limit.map(|limit| {
            recovery(
                timeline
                    .iter()
                    .map(|p| (p.t, p.ttft_p95.is_none_or(|v| v <= limit))),
                b_end,
                settle,
            )
        });
        // The queue before the burst, skipping the level's first moments (or its first half, for a
        // short one); a closed loop shows a request or two waiting between steps, so its most is the
        // bar.
        let settle_in = (b_start / 2.0).min(0.5);
        let before: Vec<f64> = samples
            .iter()
            .filter(|s| rel(s) >= settle_in && rel(s) < b_start)
            .map(|s| s.waiting)
            .collect();
        // At least one: a request waiting for the next step is no backlog.
        let baseline_waiting = (!before.is_empty()).then(|| before.iter().copied().fold(1.0, f64::max));
        // Back at the baseline once the smallest of the last three samples is: one sample caught
        // between steps does not undo a recovery.
        let queue_recovery = baseline_waiting.map(|base| {
            let points = samples.iter().enumerate().map(|(i, s)| {
                let low = samples[i.saturating_sub(2)..=i]
                    .iter()
                    .map(|s| s.waiting)
                    .fold(f64::INFINITY, f64::min);
                (rel(s), low <= base)
            });
            recovery(points, b_end, settle)
        });
        let recovered =
            ttft_recovery.is_none_or(|r| r.is_some()) && queue_recovery.is_none_or(|r| r.is_some());
        // A burst is meant to breach the SLOs for a while; the level is judged by its recovery.
        level.pass = recovered;
        level.reasons.clear();
        let window = humantime::format_duration(self.opts.recovery_timeout);
        if ttft_recovery == Some(None) {
            level.reasons.push(format!(
                "rolling TTFT p95 not back under the SLO within {window} of the burst"
            ));
        }
        if queue_recovery == Some(None) {
            level.reasons.push(format!(
                "the waiting queue not back to its pre-burst level within {window}"
            ));
        }
        self.level_done(&level);
        let report = BurstReport {
            load,
            factor: burst.factor,
            burst_start: b_start,
            burst_end: b_end,
            timeline,
            baseline_waiting,
            ttft_recovery_seconds: ttft_recovery.flatten(),
            queue_recovery_seconds: queue_recovery.flatten(),
            recovered,
            level,
        };
        self.progress.println(crate::report::fit(
            &crate::report::burst_line(&report),
            crate::report::Width::of_stderr(),
        ));
        report
    }
}

/// Seconds after `from` at which `ok` became true and stayed true up to the end; `None` when it
/// never did, or only after `settle` (too late to be sure it held).
pub fn recovery(points: impl Iterator<Item = (f64, bool)>, from: f64, settle: f64) -> Option<f64> {
    let mut since = Some(from);
    for (t, ok) in points.filter(|(t, _)| *t >= from) {
        match (ok, since) {
            (false, _) => since = None,
            (true, None) => since = Some(t),
            (true, Some(_)) => {}
        }
    }
    since.filter(|s| *s <= settle).map(|s| s - from)
}

/// A point every 250 ms: TTFT p95 over the first tokens of the preceding second, and the queue.
/// `arrivals` are (first token at, TTFT) sorted by time; `samples` are in time order.
fn timeline(
    arrivals: &[(f64, f64)],
    samples: &[QueueSample],
    level_start: Duration,
    len: f64,
) -> Vec<TimelinePoint> {
    let step = 0.25;
    let mut out = Vec::new();
    let mut t = step;
    while t <= len + 1e-9 {
        let from = arrivals.partition_point(|(at, _)| *at <= t - 1.0);
        let to = arrivals.partition_point(|(at, _)| *at <= t);
        let mut window: Vec<f64> = arrivals[from..to].iter().map(|(_, ttft)| *ttft).collect();
        window.sort_by(f64::total_cmp);
        let seen = samples.partition_point(|s| s.at.saturating_sub(level_start).as_secs_f64() <= t);
        let waiting = seen.checked_sub(1).map(|i| samples[i].waiting);
        out.push(TimelinePoint {
            t,
            ttft_p95: percentile(&window, 95.0),
            arrivals: window.len(),
            waiting,
        });
        t += step;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_is_the_start_of_the_final_good_run() {
        let pts = [
            (1.0, false),
            (2.0, false),
            (3.0, true),
            (4.0, false),
            (5.0, true),
            (6.0, true),
        ];
        assert_eq!(recovery(pts.into_iter(), 1.5, 10.0), Some(3.5));
        assert_eq!(recovery(pts.into_iter(), 1.5, 5.0), Some(3.5), "settled by 5");
        assert_eq!(
            recovery(pts.into_iter(), 1.5, 4.0),
            None,
            "recovered too late to confirm"
        );
        assert_eq!(
            recovery([(3.0, true)].into_iter(), 2.0, 10.0),
            Some(0.0),
            "never breached"
        );
        assert_eq!(recovery([(3.0, false)].into_iter(), 2.0, 10.0), None);
    }
}
