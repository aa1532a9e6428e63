//! `--trace` through the library against an in-process engine on a paused clock: every request
//! leaves at its timestamp over the speed, with the lengths it asked, and prompts that share hash
//! ids share the engine's prefix cache.

use std::sync::Arc;
use std::time::Duration;

use bench::replay::Replay;
use bench::spec::Phase;
use trace::Format;

use crate::support::{options, paused_engine};

/// Six requests over 2.5 s in 16-token blocks: r1 shares r0's first two blocks, r3 all of r0's,
/// r2 and r4 nothing, r5 has no ids at all.
const TRACE: &str = r#"{"timestamp": 0, "input_length": 48, "output_length": 4, "hash_ids": [1, 2, 3]}
{"timestamp": 500, "input_length": 48, "output_length": 6, "hash_ids": [1, 2, 9]}
{"timestamp": 1000, "input_length": 32, "output_length": 3, "hash_ids": [7, 8]}
{"timestamp": 1500, "input_length": 48, "output_length": 5, "hash_ids": [1, 2, 3]}
{"timestamp": 2000, "input_length": 40, "output_length": 2, "hash_ids": [11, 12, 13]}
{"timestamp": 2500, "input_length": 20, "output_length": 2, "hash_ids": []}
"#;

async fn replay(url: &str, speed: f64) -> bench::Report {
    let trace = trace::format::read(Format::Mooncake, TRACE.as_bytes(), Some(16)).unwrap();
    let mut opts = options(url, 16, 8, "ttft_p95=1s");
    opts.keep_records = true;
    opts.metrics_urls.clear();
    let extras = bench::Extras {
        replay: Some(Replay {
            trace: Arc::new(trace),
            speed,
            file: "six.jsonl".into(),
        }),
        ..bench::Extras::default()
    };
    bench::run_with(opts, extras).await.unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_trace_is_sent_on_its_timestamps_with_its_lengths_and_prefixes() {
    let mut cfg = paused_engine(4, Duration::from_millis(2));
    cfg.enable_prefix_caching = true;
    let engine = engine::spawn_local(cfg).await.unwrap();
    let report = replay(&engine.url(), 1.0).await;
    assert_eq!(report.levels.len(), 1, "one level, in place of the phases");
    let level = &report.levels[0];
    assert_eq!(level.phase, Phase::Replay);
    assert!(level.pass, "{:?}", level.reasons);
    let mut records = level.records.clone().unwrap();
    records.sort_by_key(|r| r.scheduled);
    let at: Vec<u128> = records.iter().map(|r| r.scheduled.as_millis()).collect();
    assert_eq!(at, [0, 500, 1000, 1500, 2000, 2500]);
    let asked: Vec<(Option<u32>, u32)> = records
        .iter()
        .map(|r| (r.asked_input_tokens, r.output_tokens))
        .collect();
    assert_eq!(
        asked,
        [
            (Some(48), 4),
            (Some(48), 6),
            (Some(32), 3),
            (Some(48), 5),
            (Some(40), 2),
            (Some(20), 2)
        ]
    );
    let info = report.parameters.trace.as_ref().unwrap();
    assert_eq!((info.requests, info.block_tokens), (6, 16));
    assert!(
        report
            .summary
            .starts_with("replayed 6 requests of six.jsonl (2.5 s of trace at 1×"),
        "{}",
        report.summary
    );

    // The engine's own records, in arrival order after the preflight's: what its prefix cache found.
    let mut truth = engine.engine.records();
    truth.sort_by_key(|r| r.arrival);
    let truth = &truth[truth.len() - 6..];
    let cached: Vec<u32> = truth.iter().map(|r| r.prompt_tokens_cached).collect();
    let template = truth[0].prompt_tokens - 48;
    // Whole 16-token blocks of the shared prefix, the chat template's tokens in front of it.
    let shared = |tokens: u32| (template + tokens) / 16 * 16;
    assert_eq!(cached[1], shared(32), "r1 shares two blocks with r0: {cached:?}");
    assert_eq!(
        cached[3],
        shared(48).min(truth[3].prompt_tokens - 1) / 16 * 16,
        "r3 all of r0's: {cached:?}"
    );
    for i in [2, 4, 5] {
        assert!(
            cached[i] < cached[1],
            "r{i} shares nothing but the template: {cached:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn speed_compresses_the_timestamps() {
    let engine = engine::spawn_local(paused_engine(4, Duration::from_millis(2)))
        .await
        .unwrap();
    let report = replay(&engine.url(), 2.0).await;
    let mut at: Vec<u128> = report.levels[0]
        .records
        .as_ref()
        .unwrap()
        .iter()
        .map(|r| r.scheduled.as_millis())
        .collect();
    at.sort();
    assert_eq!(at, [0, 250, 500, 750, 1000, 1250]);
    let info = report.parameters.trace.as_ref().unwrap();
    assert!((info.rate - 6.0 / 1.25).abs() < 1e-9, "{}", info.rate);
}
