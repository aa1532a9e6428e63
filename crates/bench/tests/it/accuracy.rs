//! The client's TTFT against the engine's own record of each request, joined by response id.

use std::time::Duration;

use bench::load::Stop;
use bench::spec::{Load, Phase};

use crate::support::{TIMED, concurrency, fixed_step_engine, options};

/// Runs `streams` closed-loop clients against an engine running at most `seqs` sequences and
/// returns, sorted, client TTFT − engine TTFT (seconds) for every request after the warm-up.
async fn ttft_differences(streams: u32, seqs: usize, stop: Stop, warmup: Duration) -> Vec<f64> {
    let engine = engine::spawn_local(fixed_step_engine(seqs, Duration::from_millis(5)))
        .await
        .unwrap();
    let mut opts = options(&engine.url(), 16, 4, "ttft_p99=60s");
    opts.phases = vec![Phase::Staircase];
    opts.loads = concurrency(&[streams]);
    opts.stop = stop;
    opts.warmup = warmup;
    opts.keep_records = true;
    opts.metrics_url = None;
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

/// One stream, then 1,000 streams held open by the client while the engine runs 16 at a time (the
/// rest wait inside the engine, and its TTFT counts that wait from the request's arrival, as vLLM's
/// does). The first two seconds open 1,000 connections at once and are left out as warm-up. The
/// engine delivers at most 16 chunks per 5 ms step, so what is compared is the client's timing, not
/// the simulator's time to write a large batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_ttft_matches_the_engines_ground_truth_at_1_and_1000_streams() {
    let _timed = TIMED.lock().await;
    let runs = [
        (1, Stop::Requests(200), Duration::ZERO),
        (1000, Stop::After(Duration::from_secs(6)), Duration::from_secs(2)),
    ];
    for (streams, stop, warmup) in runs {
        let d = ttft_differences(streams, 16, stop, warmup).await;
        assert!(d.len() >= 200, "{} requests measured", d.len());
        let median = d[d.len() / 2];
        eprintln!(
            "{streams} streams: {} requests, client − engine TTFT median {:.3} ms, p90 {:.3} ms",
            d.len(),
            median * 1e3,
            d[d.len() * 9 / 10] * 1e3
        );
        // The client can only see the token after the engine made it.
        assert!(
            d[0] > 0.0,
            "{streams} streams: client TTFT below the engine's by {}",
            -d[0]
        );
        assert!(
            median < 0.001,
            "{streams} streams: median difference {:.3} ms",
            median * 1e3
        );
    }
}
