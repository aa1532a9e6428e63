//! The one level of a replay: the trace sent on its timestamps, judged like any level.

use super::Ctx;
use crate::replay::Replay;
use crate::result::LevelReport;
use crate::spec::{Load, Phase};

impl Ctx {
    /// Sends the trace and judges what came back.
    pub(super) async fn replay_level(&mut self, replay: &Replay) -> LevelReport {
        let load = Load::Rate(replay.info().rate);
        let ticker = self.progress.level(Phase::Replay, load, self.sink.clone());
        let run = self.driver.replay(replay, self.sink.clone()).await;
        drop(ticker);
        let report = self.judge(Phase::Replay, load, run, false);
        self.kept(report)
    }
}

/// `replayed 1200 requests of day.jsonl (600 s of trace at 2×: 4 req/s): SLOs held` or the
/// reasons they did not.
pub(super) fn summarize(replay: &Replay, level: &LevelReport) -> String {
    let info = replay.info();
    let verdict = if level.pass {
        "its SLOs held".to_owned()
    } else {
        format!("its SLOs failed: {}", level.reasons.join("; "))
    };
    format!(
        "replayed {} requests of {} ({} s of trace at {}×: {} req/s): {verdict}.",
        info.requests,
        info.file,
        crate::report::number(info.span_seconds),
        crate::report::number(info.speed),
        crate::report::number(info.rate),
    )
}
