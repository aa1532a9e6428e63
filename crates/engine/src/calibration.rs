//! The calibration run: an in-process engine measured closed-loop in the published points' units
//! ([`crate::published`] holds the presets and the points).

pub use crate::published::{
    LLAMA31_8B_H100, NIM_INPUT_TOKENS, NIM_LLAMA31_8B_H100, NIM_OUTPUT_TOKENS, PublishedPoint,
};
use std::time::Duration;

/// What a closed-loop run measured, in the units of [`PublishedPoint`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    pub concurrency: u32,
    pub ttft_ms: f64,
    pub itl_ms: f64,
    pub output_tok_s: f64,
    pub requests: usize,
}

/// Runs `concurrency` closed-loop clients against an in-process engine for `duration`, each sending
/// `input`-token prompts for exactly `output` tokens, and measures the last two thirds of the run:
/// median TTFT, median per-request ITL, and output throughput. TTFT is the client's: from the
/// moment the request reaches the API server (its frontend wait included) to the first token.
/// Meant for a paused clock, where the result is exact and the run takes only CPU time.
pub async fn closed_loop(
    config: crate::EngineConfig,
    concurrency: u32,
    input: u32,
    output: u32,
    duration: Duration,
) -> Result<Measured, crate::EngineError> {
    use crate::engine::{Engine, GenerateParams};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let (engine, steps) = Engine::start(config)?;
    let stop = Arc::new(AtomicBool::new(false));
    // (arrival, TTFT) as each client saw them.
    let seen: Arc<std::sync::Mutex<Vec<(tokio::time::Instant, Duration)>>> = Arc::default();
    let mut clients = Vec::new();
    for c in 0..concurrency {
        let engine = engine.clone();
        let stop = stop.clone();
        let seen = seen.clone();
        // Spread the first arrivals over a second, as real clients drift apart; clients started in
        // the same instant would stay in lockstep on a deterministic engine.
        let offset = Duration::from_secs(1) * c / concurrency.max(1);
        clients.push(tokio::spawn(async move {
            tokio::time::sleep(offset).await;
            let mut k = 0u32;
            while !stop.load(Ordering::Relaxed) {
                // Distinct prompts: no accidental prefix-cache hits.
                let prompt = (0..input)
                    .map(|t| c.wrapping_mul(7919) ^ k.wrapping_mul(104_729) ^ t)
                    .collect();
                let params = GenerateParams {
                    prompt,
                    max_tokens: Some(output),
                    n: 1,
                    ignore_eos: true,
                };
                let arrival = tokio::time::Instant::now();
                engine.frontend_admit().await;
                let Ok(mut generation) = engine.submit(params) else {
                    return;
                };
                let _ = generation.choices[0].wait_for(|p| p.tokens >= 1).await;
                let ttft = arrival.elapsed();
                let _ = generation.choices[0].wait_for(|p| p.finish.is_some()).await;
                seen.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((arrival, ttft));
                k += 1;
            }
        }));
    }
    let start = tokio::time::Instant::now();
    tokio::time::sleep(duration / 3).await;
    let window_start = tokio::time::Instant::now();
    let g1 = engine.snapshot().generated_tokens;
    tokio::time::sleep(duration - duration / 3).await;
    let g2 = engine.snapshot().generated_tokens;
    let window = window_start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.abort();
    }
    steps.stop();
    let records: Vec<_> = engine
        .records()
        .into_iter()
        .filter(|r| r.arrival >= window_start && r.output_tokens == output && r.ttft.is_some())
        .collect();
    if records.is_empty() {
        return Err(crate::EngineError::Invalid(format!(
            "no request finished within {:?} of {:?}",
            start.elapsed(),
            duration
        )));
    }
    let mut ttft: Vec<f64> = seen
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|(arrival, _)| *arrival >= window_start)
        .map(|(_, d)| d.as_secs_f64() * 1e3)
        .collect();
    let mut itl: Vec<f64> = records
        .iter()
        .filter_map(|r| r.decode)
        .map(|d| d.as_secs_f64() * 1e3 / f64::from(output.saturating_sub(1).max(1)))
        .collect();
    Ok(Measured {
        concurrency,
        ttft_ms: median(&mut ttft),
        itl_ms: median(&mut itl),
        output_tok_s: (g2 - g1) as f64 / window,
        requests: records.len(),
    })
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() { f64::NAN } else { v[v.len() / 2] }
}
