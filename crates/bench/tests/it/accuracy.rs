//! The client's TTFT against the engine's own record of each request, joined by response id.

use std::time::Duration;

use bench::load::Stop;
use bench::spec::{Load, Phase};

use crate::support::{concurrency, options, paused_engine};

/// The engine's step: every step costs this, whatever its batch.
const STEP: Duration = Duration::from_millis(5);

/// Runs `streams` closed-loop clients against an engine running at most `seqs` sequences and
/// returns, sorted, client TTFT − engine TTFT (seconds) for every request after the warm-up.
async fn ttft_differences(streams: u32, seqs: usize, stop: Stop, warmup: Duration) -> Vec<f64> {
    let engine = testkit::Engine::start(paused_engine(seqs, STEP)).await;
    let mut opts = options(&engine.url(), 16, 4, "ttft_p99=60s");
    opts.phases = vec![Phase::Staircase];
    opts.loads = concurrency(&[streams]);
    opts.stop = stop;
    opts.warmup = warmup;
    opts.keep_records = true;
    opts.metrics_urls.clear();
    let report = bench::run(opts).await.unwrap();
    let level = &report.levels[0];
    assert_eq!(level.load, Load::Concurrency(streams));
    assert_eq!(
        level.stats.ok,
        level.stats.requests,
        "{}",
        bench::report::table(&report)
    );
    let truth: std::collections::HashMap<u64, Duration> = engine
        .engine
        .records()
        .into_iter()
        .filter_map(|r| Some((r.id, r.ttft?)))
        .collect();
    let mut diffs: Vec<f64> = level
        .records
        .as_ref()
        .unwrap()
        .iter()
        .filter(|r| r.scheduled >= warmup)
        .map(|r| {
            let id =
                r.id.as_deref()
                    .and_then(|id| id.strip_prefix("chatcmpl-"))
                    .unwrap();
            let engine_ttft = truth[&u64::from_str_radix(id, 16).unwrap()];
            r.ttft.unwrap().as_secs_f64() - engine_ttft.as_secs_f64()
        })
        .collect();
    diffs.sort_by(f64::total_cmp);
    diffs
}

/// One stream, then 200 streams held open by the client while the engine runs 16 at a time (the
/// rest wait inside the engine, and its TTFT counts that wait from the request's arrival, as vLLM's
/// does). On a paused clock, so that the machine's load cannot move either side: what is checked is
/// that every record joins the engine's by id, that the client never sees a token before the
/// engine made it, and that it sees it within the same step. How close the two are on a real clock
/// under load is measured by `cargo bench -p spillway-bench --bench ttft_accuracy`.
#[tokio::test(start_paused = true)]
async fn client_ttft_matches_the_engines_ground_truth_at_1_and_200_streams() {
    let runs = [
        (1, Stop::Requests(200), Duration::ZERO),
        (200, Stop::After(Duration::from_secs(3)), Duration::from_secs(1)),
    ];
    for (streams, stop, warmup) in runs {
        let d = ttft_differences(streams, 16, stop, warmup).await;
        assert!(d.len() >= 200, "{} requests measured", d.len());
        eprintln!(
            "{streams} streams: {} requests, client − engine TTFT min {:.3} ms, median {:.3} ms, max {:.3} ms",
            d.len(),
            d[0] * 1e3,
            d[d.len() / 2] * 1e3,
            d[d.len() - 1] * 1e3,
        );
        assert!(
            d[0] >= 0.0,
            "{streams} streams: client TTFT below the engine's by {}",
            -d[0]
        );
        assert!(
            d[d.len() - 1] < STEP.as_secs_f64(),
            "{streams} streams: the client saw a first token {:.3} ms after the engine made it",
            d[d.len() - 1] * 1e3
        );
    }
}
