//! A default run against a local engine, and a lock for the tests whose subject is time.

use std::time::Duration;

use bench::load::Stop;
use bench::spec::{Arrivals, LengthDist, Load, Phase, Slo};
use bench::workload::{Source, Workload};
use bench::{Api, Options, Target};
use engine::EngineConfig;
use engine::cost::CostModel;

/// An engine whose every step costs `step`, whatever its batch: its capacity is exactly
/// `max_num_seqs` sequences, each taking one step per token.
pub(crate) fn fixed_step_engine(max_num_seqs: usize, step: Duration) -> EngineConfig {
    let mut cfg = EngineConfig::preset(engine::Preset::Tiny);
    cfg.model = "sim".into();
    cfg.max_num_seqs = max_num_seqs;
    cfg.cost = CostModel {
        overhead: step,
        ..CostModel::ZERO
    };
    cfg.core_thread = true;
    cfg
}

/// [`fixed_step_engine`] for a test on a paused clock (`#[tokio::test(start_paused = true)]`): the
/// step loop runs on the test's runtime and clock, so a step takes exactly `step` of virtual time
/// however busy the machine is, and the bench's timestamps are taken on that same clock.
pub(crate) fn paused_engine(max_num_seqs: usize, step: Duration) -> EngineConfig {
    let mut cfg = fixed_step_engine(max_num_seqs, step);
    cfg.core_thread = false;
    cfg.precise_timer = false;
    cfg
}

pub(crate) fn options(url: &str, input: u32, output: u32, slo: &str) -> Options {
    let input_len = LengthDist::Fixed { tokens: input };
    let output_len = LengthDist::Fixed { tokens: output };
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
        loads: Vec::new(),
        arrivals: Arrivals::Poisson,
        stop: Stop::After(Duration::from_millis(1500)),
        warmup: Duration::ZERO,
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
        slo: slo.parse::<Slo>().unwrap(),
        metrics_urls: vec![format!("{url}/metrics")],
        phases: Phase::ALL.to_vec(),
        long_share: 0.2,
        long_input: Some(LengthDist::Fixed { tokens: 1000 }),
        long_output: Some(LengthDist::Fixed { tokens: 2 * output }),
        burst_factor: 2.0,
        burst_length: Duration::from_secs(1),
        recovery_timeout: Duration::from_secs(3),
        max_concurrency: 32,
        max_in_flight: 10_000,
        seed: 1,
        keep_records: false,
        quiet: true,
    }
}

pub(crate) fn concurrency(loads: &[u32]) -> Vec<Load> {
    loads.iter().map(|c| Load::Concurrency(*c)).collect()
}
