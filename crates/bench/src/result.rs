//! A run's result as written to JSON (`spillway-bench/1`) and rendered as text and HTML: the
//! report, its levels and bursts, and every parameter.

use std::time::Duration;

use serde::Serialize;

use crate::request::{Api, Record};
use crate::spec::{Arrivals, LengthDist, Load, Phase, Slo, ser_opt_secs, ser_secs};
use crate::stats::{LevelStats, Percentiles, PromptTokens};
use crate::watch::QueueSummary;
use crate::workload::WorkloadInfo;

/// Every parameter, as the JSON report records it.
#[derive(Debug, Serialize)]
pub struct Parameters {
    pub url: String,
    pub model: String,
    /// The model's context as the server published it in `/v1/models` (`null`: not published).
    pub max_model_len: Option<u32>,
    /// The API driven (`--api`): chat, completions, responses or messages.
    pub api: Api,
    /// The same as `api`, under the name results had before there were four; kept for their
    /// readers.
    pub endpoint: Api,
    pub api_key_env: Option<String>,
    pub ignore_eos: bool,
    #[serde(serialize_with = "ser_secs")]
    pub request_timeout: Duration,
    pub ca_cert: Option<String>,
    pub loads: Vec<Load>,
    pub arrivals: Arrivals,
    #[serde(serialize_with = "ser_opt_secs")]
    pub duration_per_level: Option<Duration>,
    pub requests_per_level: Option<u64>,
    #[serde(serialize_with = "ser_secs")]
    pub warmup: Duration,
    pub input_len: LengthDist,
    pub output_len: LengthDist,
    pub dataset: Option<String>,
    pub workload: WorkloadInfo,
    pub slo: String,
    pub metrics_urls: Vec<String>,
    pub phases: Vec<Phase>,
    pub long_share: f64,
    pub long_input_len: LengthDist,
    pub long_output_len: LengthDist,
    pub burst_factor: f64,
    #[serde(serialize_with = "ser_secs")]
    pub burst_length: Duration,
    #[serde(serialize_with = "ser_secs")]
    pub recovery_timeout: Duration,
    pub max_concurrency: u32,
    pub max_in_flight: usize,
    pub seed: u64,
    /// The trace replayed (`--trace`); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<crate::replay::ReplayInfo>,
    /// Closed-loop clients waited what `Retry-After` said before sending again.
    pub honor_retry_after: bool,
    /// The objective classes requests drew from (`--slo-mix`); empty without.
    pub slo_mix: Vec<crate::slo_mix::SloClass>,
}

/// One level's results and its judgement.
#[derive(Debug, Clone, Serialize)]
pub struct LevelReport {
    pub phase: Phase,
    pub load: Load,
    /// Offsets from the run's start, seconds.
    #[serde(serialize_with = "ser_secs")]
    pub start: Duration,
    #[serde(serialize_with = "ser_secs")]
    pub end: Duration,
    pub stats: LevelStats,
    /// Long mix only: the ordinary requests alone, and the long ones alone.
    pub short: Option<LevelStats>,
    pub long: Option<LevelStats>,
    pub queue: Option<QueueSummary>,
    /// How long a ready task waited for this client's runtime during the level (seconds).
    pub client_loop_lag: Option<Percentiles>,
    pub unsent: u64,
    /// Sent during the warm-up and left out of the statistics.
    pub warmup_requests: usize,
    /// Set when the client's own lag was large enough to distort TTFT: the numbers are suspect.
    pub distorted: Option<String>,
    /// Set when the level measured too few requests to stand for a steady state.
    pub too_short: Option<String>,
    /// SLOs held and the queue drained.
    pub pass: bool,
    pub reasons: Vec<String>,
    /// The first error message of each kind, as the server worded it.
    pub error_examples: std::collections::BTreeMap<&'static str, String>,
    /// With `--slo-mix`: each objective class's requests against its own objectives, in the mix's
    /// order; empty without.
    pub slo_classes: Vec<crate::slo_mix::SloClassReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub records: Option<Vec<Record>>,
}

/// One point of a burst's timeline.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct TimelinePoint {
    /// From the level's start, seconds.
    pub t: f64,
    /// TTFT p95 over first tokens that arrived in the last second.
    pub ttft_p95: Option<f64>,
    /// First tokens in that second.
    pub arrivals: usize,
    pub waiting: Option<f64>,
}

/// The sustained-plus-burst phase at one load.
#[derive(Debug, Clone, Serialize)]
pub struct BurstReport {
    pub load: Load,
    pub factor: f64,
    /// From the level's start, seconds.
    pub burst_start: f64,
    pub burst_end: f64,
    pub timeline: Vec<TimelinePoint>,
    /// The most requests waiting before the burst: the level the queue must return to.
    pub baseline_waiting: Option<f64>,
    /// From the end of the burst until rolling TTFT p95 stayed under the SLO; `None`: never.
    pub ttft_recovery_seconds: Option<f64>,
    pub queue_recovery_seconds: Option<f64>,
    pub recovered: bool,
    pub level: LevelReport,
}

/// The whole run, as written to JSON and rendered as text and HTML.
#[derive(Debug, Serialize)]
pub struct Report {
    /// `spillway-bench/1`; see the JSON schema in docs/bench.md.
    pub schema: &'static str,
    pub tool: Tool,
    pub parameters: Parameters,
    pub started_at: String,
    pub finished_at: String,
    /// Where it ran: the client shares the machine with the server when both are local.
    pub machine: crate::machine::Machine,
    pub levels: Vec<LevelReport>,
    pub bursts: Vec<BurstReport>,
    /// The first staircase level that failed.
    pub knee: Option<Load>,
    /// The largest level that passed the SLOs (and recovered from a burst, when that phase ran).
    pub safe: Option<Load>,
    pub summary: String,
    /// The prompts' real length: the server's count of their tokens against the bench's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<PromptDrift>,
    /// A run of several tenants at once (`--tenant`): what each sent and got, in the order given;
    /// empty otherwise.
    pub tenants: Vec<crate::tenants::TenantReport>,
    /// Jain's index over the tenants' service, unweighted (equal shares are 1; not the gateway's
    /// weighted index); `null` without tenants.
    pub fairness: Option<crate::tenants::Fairness>,
    /// What the run changed on its own, and why (e.g. long-mix lengths fitted to the context).
    pub notes: Vec<String>,
    /// Levels whose numbers the client's own lag may have distorted.
    pub distorted_levels: usize,
    #[serde(skip)]
    pub slo: Slo,
}

/// Prompt tokens asked for against the server's count (`usage.prompt_tokens`), over every
/// request that had both.
#[derive(Debug, Clone, Serialize)]
pub struct PromptDrift {
    pub requests: usize,
    pub asked_mean: f64,
    pub served_mean: f64,
    /// What the server's chat template adds to each prompt: the first request's count less its
    /// one word.
    pub template_tokens: Option<u32>,
    /// Server tokens per asked token, the template's taken out, less 1: +0.6 is 1.6× as long.
    pub drift: f64,
}

/// A drift beyond this is said in a warning: latencies measured are of other prompt lengths than
/// the ones asked for.
pub const DRIFT_WARNING: f64 = 0.10;

impl PromptDrift {
    pub(crate) fn of(tokens: PromptTokens, template_tokens: Option<u32>) -> Option<PromptDrift> {
        let n = tokens.requests as f64;
        Some(PromptDrift {
            requests: tokens.requests,
            asked_mean: tokens.asked as f64 / n,
            served_mean: tokens.served as f64 / n,
            template_tokens,
            drift: tokens.ratio(template_tokens.unwrap_or(0))? - 1.0,
        })
    }

    /// The warning a large drift deserves.
    pub fn warning(&self) -> Option<String> {
        (self.drift.abs() > DRIFT_WARNING).then(|| {
            format!(
                "WARNING: the server counted the prompts {:+.0}% against the tokens asked ({:.0} asked, {:.0} counted on \
                 average, its chat template's {} tokens included): its tokenizer is not the bench's four-bytes-a-token \
                 words, so every length in this report is the asked one, not the one served",
                self.drift * 100.0,
                self.asked_mean,
                self.served_mean,
                self.template_tokens.map_or("unknown".to_owned(), |t| t.to_string()),
            )
        })
    }
}

#[derive(Debug, Serialize)]
pub struct Tool {
    pub name: &'static str,
    pub version: &'static str,
}
