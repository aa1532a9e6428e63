//! A cost model fitted to a measurement of the real engine: the requests a bench run recorded
//! (`spillway bench --records`) in, the step-time terms that explain their TTFT and ITL out, with
//! the residuals that say how well they do.
//!
//! Two kinds of equation, one per request, solved together by non-negative least squares on
//! relative error:
//! - a request that had the engine to itself until its first token: its TTFT is the API server's
//!   own time, plus its prefill steps (`overhead` each, `prefill_token` per token, the attention
//!   term per pair);
//! - any request of two tokens or more: its mean gap between tokens is one step, and a step holds
//!   the requests decoding beside it (`decode_seq` each, `context_token` per token they attend)
//!   and the prefills that finished while it decoded (spread over its gaps).
//!
//! The other requests are read from the same records, so the run may be closed- or open-loop.

mod bench;
mod rows;
mod solve;

use crate::cost::{CostFile, CostModel, FitNote, FrontendCost};
use std::time::Duration;

pub use bench::samples_from_bench_json;

/// One request as the client measured it; times in seconds from one origin for the whole run.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub sent: f64,
    pub prompt: u32,
    pub output: u32,
    pub ttft: f64,
    pub e2e: f64,
    /// The gaps between its tokens as they arrived (`itl_us` in the bench's records), seconds.
    pub itl: Vec<f64>,
    /// The level it was sent in (`c=8`, `2 rps`), for the residuals' table.
    pub level: String,
}

/// What the fit needs to know of the measured engine besides its requests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FitOptions {
    /// Its `--max-num-batched-tokens`: a longer prompt's prefill takes several steps.
    pub max_num_batched_tokens: u32,
}

impl Default for FitOptions {
    fn default() -> Self {
        FitOptions {
            max_num_batched_tokens: 8192,
        }
    }
}

/// The fitted model and how well it explains the requests it was fitted to.
#[derive(Debug, Clone, PartialEq)]
pub struct Fit {
    pub cost: CostModel,
    pub frontend: FrontendCost,
    pub ttft_requests: usize,
    pub itl_requests: usize,
    /// Root mean square of (predicted − measured) / measured, per kind of equation.
    pub ttft_rms_relative_error: f64,
    pub itl_rms_relative_error: f64,
    pub residuals: Vec<Residual>,
    /// Terms the run could not tell apart, left at zero, and why.
    pub notes: Vec<String>,
}

/// Measured against predicted, for one group of requests.
#[derive(Debug, Clone, PartialEq)]
pub struct Residual {
    /// `ttft` (requests alone until their first token) or `itl` (mean gap between tokens).
    pub kind: &'static str,
    /// The level, or for TTFT the prompt lengths (`513-1024 tokens`).
    pub group: String,
    pub requests: usize,
    /// Means over the group, seconds.
    pub measured: f64,
    pub predicted: f64,
}

impl Residual {
    pub fn relative_error(&self) -> f64 {
        (self.predicted - self.measured) / self.measured
    }
}

/// The terms, in the order of the regression's columns.
pub(crate) const TERMS: [&str; 6] = [
    "overhead",
    "frontend per_request",
    "prefill_token",
    "prefill attention (per pair)",
    "decode_seq",
    "context_token",
];

/// Fits the step-time terms to the samples.
pub fn fit(samples: &[Sample], options: FitOptions) -> Result<Fit, crate::EngineError> {
    let rows = rows::build(samples, options);
    let (ttft_n, itl_n) = rows.iter().fold((0, 0), |(t, i), r| match r.kind {
        rows::Kind::Ttft => (t + 1, i),
        rows::Kind::Itl => (t, i + 1),
    });
    if itl_n < 4 {
        return Err(crate::EngineError::Invalid(format!(
            "{itl_n} requests of two tokens or more with their timings: too few to fit a cost model \
             (run the bench with --records and outputs of at least 2 tokens)"
        )));
    }
    let mut fixed = [false; TERMS.len()];
    let mut notes = Vec::new();
    let bursts = rows::bursts(samples).iter().filter(|&&b| b).count();
    if bursts > 0 {
        notes.push(format!(
            "{bursts} of {} requests got their tokens in one burst (mean gap under a twentieth of their \
             level's median: the API server wrote several steps at once) and are left out",
            samples.len()
        ));
    }
    if ttft_n == 0 {
        fixed[1] = true;
        notes.push(
            "no request had the engine to itself until its first token (run a concurrency-1 level): \
             the API server's own time is left at zero"
                .to_owned(),
        );
    }
    let (lo, hi) = rows
        .iter()
        .filter(|r| r.kind == rows::Kind::Ttft)
        .fold((u32::MAX, 0), |(lo, hi), r| (lo.min(r.prompt), hi.max(r.prompt)));
    if ttft_n == 0 || f64::from(hi) < 2.0 * f64::from(lo) {
        fixed[3] = true;
        notes.push(format!(
            "the prompts alone on the engine spanned {}–{} tokens: the attention term needs lengths \
             at least 2× apart (e.g. --input-len uniform:64,2048) and is left at zero",
            if ttft_n == 0 { 0 } else { lo },
            hi
        ));
    }
    let theta = solve::nonnegative_least_squares(&rows, fixed);
    let secs = |s: f64| Duration::from_secs_f64(s.max(0.0));
    let cost = CostModel {
        overhead: secs(theta[0]),
        prefill_token: secs(theta[2]),
        prefill_attention_per_million_pairs: secs(theta[3] * 1e6),
        decode_seq: secs(theta[4]),
        context_token: secs(theta[5]),
    };
    let frontend = FrontendCost {
        per_request: secs(theta[1]),
        per_output_token: Duration::ZERO,
    };
    let rms = |kind| {
        let errs: Vec<f64> = rows
            .iter()
            .filter(|r| r.kind == kind)
            .map(|r| (r.predict(&theta) - r.y) / r.y)
            .collect();
        (errs.iter().map(|e| e * e).sum::<f64>() / errs.len().max(1) as f64).sqrt()
    };
    Ok(Fit {
        cost,
        frontend,
        ttft_requests: ttft_n,
        itl_requests: itl_n,
        ttft_rms_relative_error: rms(rows::Kind::Ttft),
        itl_rms_relative_error: rms(rows::Kind::Itl),
        residuals: rows::residuals(&rows, &theta),
        notes,
    })
}

impl Fit {
    /// The file `--cost-model` reads.
    pub fn file(&self, source: String, options: FitOptions) -> CostFile {
        CostFile {
            schema: crate::cost::COST_FILE_SCHEMA.to_owned(),
            source,
            cost: self.cost,
            frontend: self.frontend,
            fit: Some(FitNote {
                ttft_requests: self.ttft_requests,
                itl_requests: self.itl_requests,
                ttft_rms_relative_error: round4(self.ttft_rms_relative_error),
                itl_rms_relative_error: round4(self.itl_rms_relative_error),
                max_num_batched_tokens: options.max_num_batched_tokens,
                notes: self.notes.clone(),
            }),
        }
    }

    /// The terms and the residuals as a table for a terminal.
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let c = &self.cost;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "step = {:?} + {:?} × prefill tokens + {:?} × prefill pairs / 10⁶ + {:?} × decoding \
             sequences + {:?} × context tokens attended",
            c.overhead, c.prefill_token, c.prefill_attention_per_million_pairs, c.decode_seq, c.context_token
        );
        let _ = writeln!(
            out,
            "API server: {:?} per request (the TTFT a step does not explain)",
            self.frontend.per_request
        );
        let _ = writeln!(
            out,
            "fitted to {} requests alone until their first token (TTFT rms error {:.1}%) and {} \
             requests' mean gaps between tokens (ITL rms error {:.1}%)",
            self.ttft_requests,
            self.ttft_rms_relative_error * 100.0,
            self.itl_requests,
            self.itl_rms_relative_error * 100.0
        );
        let _ = writeln!(
            out,
            "\n{:<5} {:<22} {:>6} {:>12} {:>12} {:>7}",
            "", "group", "n", "measured ms", "fitted ms", "Δ"
        );
        for r in &self.residuals {
            let _ = writeln!(
                out,
                "{:<5} {:<22} {:>6} {:>12.3} {:>12.3} {:>+6.1}%",
                r.kind,
                r.group,
                r.requests,
                r.measured * 1e3,
                r.predicted * 1e3,
                r.relative_error() * 100.0
            );
        }
        for n in &self.notes {
            let _ = writeln!(out, "note: {n}");
        }
        out
    }
}

fn round4(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

#[cfg(test)]
mod tests;
