//! The calibrated preset stays near the published numbers it was fitted to (paused clock: exact).

use spillway_engine::calibration::{NIM_INPUT_TOKENS, NIM_LLAMA31_8B_H100, NIM_OUTPUT_TOKENS, closed_loop};
use spillway_engine::{EngineConfig, Preset};
use std::time::Duration;

/// ITL and throughput within ±25% at 1, 25, 100 and 200 concurrent requests; TTFT at 1. The
/// preset does not reproduce the published TTFT at 25–150, which include queueing outside a
/// scheduler model (see docs/engine-calibration.md).
#[tokio::test(start_paused = true)]
async fn llama_preset_tracks_the_published_itl_and_throughput() {
    for p in NIM_LLAMA31_8B_H100
        .iter()
        .filter(|p| [1, 25, 100, 200].contains(&p.concurrency))
    {
        let m = closed_loop(
            EngineConfig::preset(Preset::Llama31_8bH100),
            p.concurrency,
            NIM_INPUT_TOKENS,
            NIM_OUTPUT_TOKENS,
            Duration::from_secs(12),
        )
        .await
        .unwrap();
        let within = |sim: f64, publ: f64| (sim / publ - 1.0).abs() <= 0.25;
        assert!(
            within(m.itl_ms, p.itl_ms),
            "ITL at {}: {} vs {}",
            p.concurrency,
            m.itl_ms,
            p.itl_ms
        );
        assert!(
            within(m.output_tok_s, p.output_tok_s),
            "throughput at {}: {} vs {}",
            p.concurrency,
            m.output_tok_s,
            p.output_tok_s
        );
        if p.concurrency == 1 {
            assert!(
                within(m.ttft_ms, p.ttft_ms),
                "TTFT at 1: {} vs {}",
                m.ttft_ms,
                p.ttft_ms
            );
        }
    }
}
