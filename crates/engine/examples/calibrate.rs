//! Prints the calibrated preset beside the published Llama-3.1-8B points it was fitted to.
//!
//! `cargo run --release -p spillway-engine --example calibrate` (runs on a paused clock: exact and fast).
//! `… --example calibrate -- 1ms 40us` adds an API server (per request, per output token).

use spillway_engine::calibration::{NIM_INPUT_TOKENS, NIM_LLAMA31_8B_H100, NIM_OUTPUT_TOKENS, closed_loop};
use spillway_engine::cost::FrontendCost;
use spillway_engine::{EngineConfig, Preset};
use std::time::Duration;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut config = EngineConfig::preset(Preset::Llama31_8bH100);
    if let [per_request, per_output_token] = args.as_slice() {
        let d = |s: &str| humantime::parse_duration(s).expect("a duration such as 1ms or 40us");
        config.frontend = FrontendCost {
            per_request: d(per_request),
            per_output_token: d(per_output_token),
        };
        println!("API server: {per_request} per request, {per_output_token} per output token");
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    println!(
        "preset llama-3.1-8b-h100 vs NVIDIA NIM Llama-3.1-8B-Instruct on H100 ({NIM_INPUT_TOKENS} in / {NIM_OUTPUT_TOKENS} out assumed)"
    );
    println!("| conc | TTFT ms pub | sim | Δ | ITL ms pub | sim | Δ | tok/s pub | sim | Δ |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for p in NIM_LLAMA31_8B_H100 {
        let m = rt
            .block_on(closed_loop(
                config.clone(),
                p.concurrency,
                NIM_INPUT_TOKENS,
                NIM_OUTPUT_TOKENS,
                Duration::from_secs(30),
            ))
            .expect("run");
        let d = |sim: f64, publ: f64| format!("{:+.0}%", (sim / publ - 1.0) * 100.0);
        println!(
            "| {} | {:.1} | {:.1} | {} | {:.1} | {:.1} | {} | {:.0} | {:.0} | {} |",
            p.concurrency,
            p.ttft_ms,
            m.ttft_ms,
            d(m.ttft_ms, p.ttft_ms),
            p.itl_ms,
            m.itl_ms,
            d(m.itl_ms, p.itl_ms),
            p.output_tok_s,
            m.output_tok_s,
            d(m.output_tok_s, p.output_tok_s)
        );
    }
}
