//! The requests of a `spillway bench --json --records` result (`spillway-bench/1`), read for the
//! fields a fit needs and nothing else: the engine does not link the bench.

use super::Sample;
use serde::Deserialize;

#[derive(Deserialize)]
struct Run {
    schema: String,
    levels: Vec<Level>,
}

#[derive(Deserialize)]
struct Level {
    load: Load,
    /// Seconds from the run's start.
    start: f64,
    #[serde(default)]
    records: Option<Vec<Record>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum Load {
    Concurrency(u32),
    Rate(f64),
}

#[derive(Deserialize)]
struct Record {
    scheduled: f64,
    send_lag: f64,
    ttft: Option<f64>,
    e2e: f64,
    #[serde(default)]
    itl_us: Vec<u32>,
    input_tokens: Option<u32>,
    asked_input_tokens: Option<u32>,
    output_tokens: u32,
    outcome: Outcome,
}

#[derive(Deserialize)]
struct Outcome {
    kind: String,
}

/// Every successful request of every level, on the run's clock. Levels without records (a run
/// without `--records`) are an error: their percentiles cannot be fitted.
pub fn samples_from_bench_json(text: &str) -> Result<Vec<Sample>, crate::EngineError> {
    let bad = |m: String| crate::EngineError::Invalid(m);
    let run: Run = serde_json::from_str(text).map_err(|e| bad(format!("not a bench result: {e}")))?;
    if run.schema != "spillway-bench/1" {
        return Err(bad(format!("schema '{}' is not spillway-bench/1", run.schema)));
    }
    let mut out = Vec::new();
    let mut without = 0;
    for level in &run.levels {
        let Some(records) = &level.records else {
            without += 1;
            continue;
        };
        let name = match level.load {
            Load::Concurrency(c) => format!("c={c}"),
            Load::Rate(r) => format!("{r} rps"),
        };
        for r in records {
            let (Some(ttft), Some(prompt)) = (r.ttft, r.input_tokens.or(r.asked_input_tokens)) else {
                continue;
            };
            if r.outcome.kind != "ok" || r.output_tokens == 0 {
                continue;
            }
            out.push(Sample {
                sent: level.start + r.scheduled + r.send_lag,
                prompt,
                output: r.output_tokens,
                ttft,
                e2e: r.e2e,
                itl: r.itl_us.iter().map(|&us| f64::from(us) / 1e6).collect(),
                level: name.clone(),
            });
        }
    }
    if out.is_empty() {
        return Err(bad(if without > 0 {
            "the bench result has no per-request records: run the bench with --json FILE --records".to_owned()
        } else {
            "the bench result holds no successful request".to_owned()
        }));
    }
    Ok(out)
}
