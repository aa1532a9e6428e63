//! The outputs: JSON whose statistics match its own records, and an HTML report that is valid,
//! self-contained and holds its charts.

use std::time::Duration;

use bench::spec::Phase;

use crate::support::{concurrency, options, paused_engine};

fn exact_percentile(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let rank = p / 100.0 * (v.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    v[lo] + (v[hi] - v[lo]) * (rank - lo as f64)
}

#[tokio::test(start_paused = true)]
async fn json_and_html_reports_hold_every_phase() {
    let engine = testkit::Engine::start(paused_engine(8, Duration::from_millis(2))).await;
    let mut opts = options(&engine.url(), 16, 8, "ttft_p95=500ms,itl_p95=200ms,error_rate=5%");
    opts.loads = concurrency(&[2, 4]);
    opts.stop = bench::load::Stop::After(Duration::from_millis(400));
    opts.burst_length = Duration::from_millis(300);
    opts.recovery_timeout = Duration::from_millis(1500);
    opts.keep_records = true;
    let report = bench::run(opts).await.unwrap();
    let phases: Vec<Phase> = report.levels.iter().map(|l| l.phase).collect();
    assert_eq!(
        phases,
        [
            Phase::Baseline,
            Phase::Staircase,
            Phase::Staircase,
            Phase::LongMix
        ]
    );
    // The burst at C=4 (2 × 4 fits the engine's 8 sequences) recovers at once.
    assert_eq!(report.bursts.len(), 1);
    assert_eq!(report.bursts[0].load, bench::spec::Load::Concurrency(4));
    assert!(report.bursts[0].recovered, "{}", bench::report::table(&report));

    let json: serde_json::Value = serde_json::to_value(&report).unwrap();
    assert_eq!(json["schema"], "spillway-bench/1");
    assert_eq!(json["tool"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(json["parameters"]["model"], "sim");
    assert_eq!(
        json["parameters"]["slo"],
        "ttft_p95=500ms,itl_p95=200ms,error_rate=5%"
    );
    assert_eq!(json["safe"]["concurrency"], 4);
    for level in json["levels"].as_array().unwrap() {
        let records = level["records"].as_array().unwrap();
        let ok: Vec<&serde_json::Value> = records.iter().filter(|r| r["outcome"]["kind"] == "ok").collect();
        assert_eq!(level["stats"]["ok"].as_u64().unwrap() as usize, ok.len());
        let ttft: Vec<f64> = ok.iter().map(|r| r["ttft"].as_f64().unwrap()).collect();
        let itl: Vec<f64> = ok
            .iter()
            .flat_map(|r| {
                r["itl_us"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|g| g.as_f64().unwrap() / 1e6)
            })
            .collect();
        for (stat, values) in [("ttft", ttft), ("itl", itl)] {
            for p in [50.0, 90.0, 95.0, 99.0] {
                let reported = level["stats"][stat][format!("p{}", p as u32)].as_f64().unwrap();
                let exact = exact_percentile(values.clone(), p);
                assert!(
                    (reported - exact).abs() < 1e-9,
                    "{stat} p{p}: {reported} vs {exact}"
                );
            }
        }
        // Every record carries its scheduled time and send lag (the self-check's inputs).
        assert!(records.iter().all(|r| r["send_lag"].as_f64().unwrap() >= 0.0));
    }
    let long = &json["levels"][3];
    assert!(long["short"]["requests"].as_u64().unwrap() > 0);
    assert!(long["long"]["requests"].as_u64().unwrap() > 0);
    assert!(json["bursts"][0]["timeline"].as_array().unwrap().len() > 4);

    let html = bench::html::render(&report).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"));
    // Self-contained: nothing to fetch, nothing to run.
    for banned in [
        "<script", "<link", "<img", "<iframe", " src=", "href=", "url(", "@import",
    ] {
        assert!(!html.contains(banned), "the report must not contain {banned:?}");
    }
    // Four charts against load; each burst's TTFT and queue timelines in one chart, one time axis.
    assert_eq!(html.matches("<svg").count(), 4 + report.bursts.len(), "charts");
    for title in [
        "Time to first token against load",
        "Inter-token latency against load",
        "Throughput and goodput against load",
        "Burst at C=4",
        "requests waiting in the server",
    ] {
        assert!(html.contains(title), "missing chart {title:?}");
    }
    assert!(
        html.contains(
            "<td class=\"l\">burst</td><td class=\"l w\">2× the load for 300 ms, recovery within 1.5 s</td>"
        ),
        "parameters listed as a person reads them"
    );
    assert!(html.contains("<dt>Where</dt><dd>"), "the machine is named");
    // In a terminal of 80 columns the table fits it; piped, it is the full table.
    let narrow = bench::report::table_for(&report, bench::report::Width::Narrow(80));
    for line in narrow.lines() {
        assert!(
            line.chars().count() <= 80,
            "{} columns: {line:?}\n{narrow}",
            line.chars().count()
        );
    }
    assert!(narrow.contains(" ttft99 "), "{narrow}");
    for l in &report.levels {
        let live = bench::report::one_line_for(l, bench::report::Width::Narrow(80));
        assert!(live.lines().all(|line| line.chars().count() <= 80), "{live}");
    }
    assert_eq!(
        bench::report::table(&report),
        bench::report::table_for(&report, bench::report::Width::Full)
    );
    assert!(
        bench::report::table(&report)
            .lines()
            .nth(1)
            .unwrap()
            .chars()
            .count()
            > 120
    );
    let safe = report.safe.expect("a safe load");
    assert!(
        html.contains(&format!("safe ({safe})")),
        "the safe load is marked on the charts"
    );
    let dir = std::env::temp_dir().join(format!("spillway-bench-report-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("report.html");
    std::fs::write(&path, &html).unwrap();
    // A real parser checks the page: every element closed in order, every SVG well-formed XML.
    let out = testkit::run_python("check_html.py", &[path.to_str().unwrap()]).await;
    assert!(
        out.contains(&format!("ok: {} svg", 4 + report.bursts.len())),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Open loop: arrivals follow the schedule whatever the answers do, and each record says when it
/// was due and how late it went. On a paused clock: the schedule is the generator's, not the
/// machine's.
#[tokio::test(start_paused = true)]
async fn open_loop_sends_on_schedule() {
    let engine = testkit::Engine::start(paused_engine(64, Duration::from_millis(2))).await;
    for (arrivals, rate) in [
        (bench::spec::Arrivals::Constant, 200.0),
        (bench::spec::Arrivals::Poisson, 300.0),
    ] {
        let mut opts = options(&engine.url(), 16, 4, "ttft_p95=1s");
        opts.target.api = bench::Api::Completions;
        opts.phases = vec![Phase::Staircase];
        opts.loads = vec![bench::spec::Load::Rate(rate)];
        opts.arrivals = arrivals;
        opts.stop = bench::load::Stop::After(Duration::from_secs(2));
        opts.keep_records = true;
        let report = bench::run(opts).await.unwrap();
        let level = &report.levels[0];
        let records = level.records.as_ref().unwrap();
        let n = records.len() as f64;
        assert!(
            (n - 2.0 * rate).abs() < 0.15 * 2.0 * rate,
            "{arrivals:?}: {n} arrivals in 2 s at {rate}/s"
        );
        assert_eq!(level.stats.ok, records.len(), "{}", bench::report::table(&report));
        let mut due: Vec<f64> = records.iter().map(|r| r.scheduled.as_secs_f64()).collect();
        due.sort_by(f64::total_cmp);
        let gaps: Vec<f64> = due.windows(2).map(|w| w[1] - w[0]).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        assert!(
            (mean - 1.0 / rate).abs() < 0.15 / rate,
            "{arrivals:?}: mean gap {mean}"
        );
        let spread = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        match arrivals {
            // Equal gaps; Poisson gaps have a standard deviation equal to their mean.
            bench::spec::Arrivals::Constant => assert!(spread.sqrt() < 0.2 * mean, "sd {}", spread.sqrt()),
            _ => assert!(
                (spread.sqrt() / mean - 1.0).abs() < 0.25,
                "sd/mean {}",
                spread.sqrt() / mean
            ),
        }
        let lag = level.stats.send_lag.unwrap();
        assert!(lag.p50 < 0.002, "median send lag {} s", lag.p50);
        assert_eq!(level.unsent, 0);
    }
}

/// The self-check: a client that cannot send what the schedule asks says so in the level itself.
#[tokio::test(start_paused = true)]
async fn a_client_that_falls_behind_flags_its_level() {
    let engine = testkit::Engine::start(paused_engine(64, Duration::from_millis(50))).await;
    let mut opts = options(&engine.url(), 16, 4, "ttft_p95=1s");
    opts.phases = vec![Phase::Staircase];
    opts.loads = vec![bench::spec::Load::Rate(100.0)];
    opts.arrivals = bench::spec::Arrivals::Constant;
    opts.stop = bench::load::Stop::After(Duration::from_secs(1));
    opts.max_in_flight = 2;
    let report = bench::run(opts).await.unwrap();
    let level = &report.levels[0];
    assert!(level.unsent > 50, "{} unsent", level.unsent);
    let flag = level.distorted.as_deref().unwrap_or_default();
    assert!(flag.contains("arrivals not sent"), "{flag:?}");
    assert_eq!(report.distorted_levels, 1);
    assert!(bench::report::table(&report).contains("WARNING: 1 level(s) flagged"));
    assert!(
        bench::html::render(&report)
            .unwrap()
            .contains("flagged by the self-check")
    );
}

/// A closed-loop level that saw only its first wave says so.
#[tokio::test(start_paused = true)]
async fn a_level_of_one_wave_is_marked_too_short() {
    let engine = testkit::Engine::start(paused_engine(64, Duration::from_millis(2))).await;
    let mut opts = options(&engine.url(), 16, 4, "ttft_p95=1s");
    opts.phases = vec![Phase::Staircase];
    opts.loads = concurrency(&[8]);
    opts.stop = bench::load::Stop::Requests(8);
    let report = bench::run(opts).await.unwrap();
    let note = report.levels[0].too_short.as_deref().unwrap_or_default();
    assert!(
        note.contains("only 8 requests measured for 8 clients"),
        "{note:?}"
    );
    assert!(bench::report::table(&report).contains("too short:"));
}
