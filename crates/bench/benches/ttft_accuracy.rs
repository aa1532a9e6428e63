//! The client's TTFT against the engine's own record of each request, joined by response id, at
//! one stream and at 1,000: how much of a measured TTFT is the client's own delay.
//!
//! `cargo bench -p spillway-bench --bench ttft_accuracy`. It was a test until a busy machine made
//! it fail: a timing bound is a measurement, recorded here, not a pass/fail gate. The test suite
//! checks the join and the ordering on a paused clock (`tests/it/accuracy.rs`).

extern crate spillway_bench as bench;

use std::time::Duration;

use bench::load::Stop;
use bench::spec::{Arrivals, LengthDist, Load, Phase, Slo};
use bench::workload::{Source, Workload};
use bench::{Api, Options, Target};
use engine::EngineConfig;
use engine::cost::CostModel;

fn options(url: &str, streams: u32, stop: Stop, warmup: Duration) -> Options {
    let input_len = LengthDist::Fixed { tokens: 16 };
    let output_len = LengthDist::Fixed { tokens: 4 };
    Options {
        target: Target {
            url: url.to_string(),
            model: "sim".into(),
            api_key: None,
            api: Api::Chat,
            ignore_eos: true,
            timeout: Duration::from_secs(60),
            ca_cert: None,
        },
        api_key_env: None,
        loads: vec![Load::Concurrency(streams)],
        arrivals: Arrivals::Poisson,
        stop,
        warmup,
        workload: Workload {
            source: Source::Synthetic {
                input: input_len,
                output: output_len,
            },
            long: None,
        },
        input_len,
        output_len,
        dataset: None,
        slo: "ttft_p99=60s".parse::<Slo>().expect("a valid SLO"),
        metrics_urls: Vec::new(),
        phases: vec![Phase::Staircase],
        long_share: 0.0,
        long_input: None,
        long_output: None,
        burst_factor: 2.0,
        burst_length: Duration::from_secs(1),
        recovery_timeout: Duration::from_secs(3),
        max_concurrency: streams,
        max_in_flight: 10_000,
        seed: 1,
        keep_records: true,
        quiet: true,
    }
}

/// Client TTFT − engine TTFT (seconds), sorted, for every request after the warm-up.
async fn differences(streams: u32, stop: Stop, warmup: Duration) -> Vec<f64> {
    // At most 16 sequences, every step 5 ms: the engine delivers at most 16 chunks per step, so
    // what is compared is the client's timing, not the simulator's time to write a large batch.
    let mut cfg = EngineConfig::preset(engine::Preset::Tiny);
    cfg.model = "sim".into();
    cfg.max_num_seqs = 16;
    cfg.cost = CostModel {
        overhead: Duration::from_millis(5),
        ..CostModel::ZERO
    };
    cfg.core_thread = true;
    cfg.precise_timer = true;
    let engine = engine::spawn_local(cfg).await.expect("the engine starts");
    let report = bench::run(options(&engine.url(), streams, stop, warmup))
        .await
        .expect("the run completes");
    let level = &report.levels[0];
    let truth: std::collections::HashMap<u64, Duration> = engine
        .engine
        .records()
        .into_iter()
        .filter_map(|r| Some((r.id, r.ttft?)))
        .collect();
    let mut diffs: Vec<f64> = level
        .records
        .as_deref()
        .unwrap_or_default()
        .iter()
        .filter(|r| r.scheduled >= warmup && r.ok())
        .filter_map(|r| {
            let id = r.id.as_deref()?.strip_prefix("chatcmpl-")?;
            let engine_ttft = truth.get(&u64::from_str_radix(id, 16).ok()?)?;
            Some(r.ttft?.as_secs_f64() - engine_ttft.as_secs_f64())
        })
        .collect();
    diffs.sort_by(f64::total_cmp);
    diffs
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let runs = [
            (1, Stop::Requests(200), Duration::ZERO),
            (1000, Stop::After(Duration::from_secs(6)), Duration::from_secs(2)),
        ];
        println!("streams  requests  client−engine TTFT: min  median  p90  max (ms)");
        for (streams, stop, warmup) in runs {
            let d = differences(streams, stop, warmup).await;
            if d.is_empty() {
                println!("{streams:>7}  no request measured");
                continue;
            }
            let at = |q: f64| d[((d.len() - 1) as f64 * q) as usize] * 1e3;
            println!(
                "{streams:>7}  {:>8}  {:>23.3}  {:>6.3}  {:>.3}  {:.3}",
                d.len(),
                at(0.0),
                at(0.5),
                at(0.9),
                at(1.0)
            );
        }
    });
}
