//! The safe concurrency against an engine whose knee is known by construction.

use std::time::Duration;

use bench::spec::{Load, Phase};

use crate::support::{options, paused_engine};

/// The truth, by construction: the engine runs at most 16 sequences, each step costs 3 ms whatever
/// the batch, and a request is 32 tokens (~33 steps, ~100 ms). Up to 16 closed-loop clients, every
/// request is scheduled at the next step: TTFT is one or two steps, ~3–7 ms. With 17 or more, one
/// request or more always waits a whole request time (~100 ms) for a slot: at 17, 1 request in 17
/// (5.9%) has a TTFT near 100 ms, so TTFT p95 breaches a 30 ms SLO, and more so above. So C_safe is
/// 16 and the knee 17; at 17 only 0.9% of requests stand between pass and fail, so 17 is within the
/// "one step" the issue allows. p95 rather than p99 so that a few requests delayed by a busy machine
/// cannot fail a level below the knee.
///
/// On a paused clock: the engine steps, the bench sends and reads over real loopback sockets, and
/// time moves only when every task waits, so a busy machine cannot stretch a step or delay a
/// timestamp (the test failed beside other load on the real clock: C_safe 7, a queue that "did not
/// drain" at C=8). The client stamps a token at the virtual instant the engine made it (the
/// accuracy test checks this), so the levels' TTFTs are the steps themselves: 3 or 6 ms below the
/// knee, ~100 ms for the requests that wait above it.
#[tokio::test(start_paused = true)]
async fn safe_concurrency_lands_on_the_engines_knee() {
    let engine = testkit::Engine::start(paused_engine(16, Duration::from_millis(3))).await;
    let mut opts = options(&engine.url(), 32, 32, "ttft_p95=30ms,error_rate=1%");
    opts.phases = vec![Phase::Baseline, Phase::Staircase, Phase::Burst];
    let report = bench::run(opts).await.unwrap();
    let table = bench::report::table(&report);
    eprintln!("{table}");

    let safe = report.safe.expect("a safe level");
    let Load::Concurrency(c) = safe else {
        panic!("{safe:?}")
    };
    assert!((15..=17).contains(&c), "C_safe {c}, truth 16:\n{table}");
    assert_eq!(report.knee, Some(Load::Concurrency(c + 1)), "{table}");
    // The staircase doubled to 32 (its first step, 1, is the baseline run), then bisected.
    let tried: Vec<f64> = report
        .levels
        .iter()
        .filter(|l| l.phase == Phase::Staircase)
        .map(|l| l.load.value())
        .collect();
    assert_eq!(&tried[..5], &[2.0, 4.0, 8.0, 16.0, 32.0], "{table}");
    // At 32 the engine's own queue shows why: about 16 requests waiting on average.
    let at32 = report
        .levels
        .iter()
        .find(|l| l.load == Load::Concurrency(32))
        .unwrap();
    assert!(!at32.pass);
    assert!(
        at32.queue.as_ref().is_some_and(|q| q.waiting_mean >= 8.0),
        "{table}"
    );
    // The burst to 2 × 16 breaches, then TTFT and the queue recover.
    let burst = &report.bursts[0];
    assert!(burst.recovered, "{table}");
    assert!(
        burst
            .timeline
            .iter()
            .any(|p| p.ttft_p95.is_some_and(|t| t > 0.05)),
        "the burst was felt"
    );
    assert!(burst.ttft_recovery_seconds.is_some() && burst.queue_recovery_seconds.is_some());
    assert!(
        report.summary.contains(&format!("Safe load: C={c}")),
        "{}",
        report.summary
    );
}

/// Without a staircase only the levels that ran and passed may be named: a baseline that fails
/// names nothing (it named the highest load asked for, never run), one that passes names its own
/// level, not the loads asked for.
#[tokio::test(start_paused = true)]
async fn a_baseline_alone_names_only_its_own_passing_level() {
    let engine = testkit::Engine::start(paused_engine(16, Duration::from_millis(3))).await;
    // Every TTFT is a step or more (3 ms): a 1 ms SLO fails the baseline.
    let mut opts = options(&engine.url(), 32, 8, "ttft_p95=1ms,error_rate=1%");
    opts.phases = vec![Phase::Baseline];
    opts.loads = vec![Load::Rate(20.0), Load::Rate(100.0)];
    let report = bench::run(opts).await.unwrap();
    assert_eq!(report.levels.len(), 1);
    assert!(!report.levels[0].pass);
    assert_eq!(report.safe, None, "{}", report.summary);
    assert!(
        report
            .summary
            .contains("The baseline at 20 req/s failed the SLOs")
            && report.summary.contains("no safe load is named")
            && !report.summary.contains("100 req/s"),
        "{}",
        report.summary
    );

    let mut opts = options(&engine.url(), 32, 8, "ttft_p95=30ms,error_rate=1%");
    opts.phases = vec![Phase::Baseline];
    opts.loads = vec![Load::Concurrency(16)];
    let report = bench::run(opts).await.unwrap();
    assert!(report.levels[0].pass, "{}", bench::report::table(&report));
    assert_eq!(report.safe, Some(Load::Concurrency(1)), "{}", report.summary);
    assert!(
        report.summary.contains("Candidate safe load: C=1"),
        "{}",
        report.summary
    );
}

/// A burst alone judges recovery, not the SLOs at a steady load: it names no safe load, and says
/// which phase could.
#[tokio::test(start_paused = true)]
async fn a_burst_alone_names_no_safe_load() {
    let engine = testkit::Engine::start(paused_engine(16, Duration::from_millis(3))).await;
    let mut opts = options(&engine.url(), 32, 8, "ttft_p95=30ms,error_rate=1%");
    opts.phases = vec![Phase::Burst];
    opts.loads = vec![Load::Concurrency(4)];
    let report = bench::run(opts).await.unwrap();
    assert_eq!(report.bursts.len(), 1);
    assert_eq!(report.safe, None, "{}", report.summary);
    assert!(
        report
            .summary
            .contains("No phase judged the SLOs at a steady load (baseline or staircase)"),
        "{}",
        report.summary
    );
}
