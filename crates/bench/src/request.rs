//! One request: where it is sent ([`Target`], [`Api`]) and what was measured of it
//! ([`Record`], [`Outcome`]) — the words the client, the statistics and the reports share.

use std::time::Duration;

use serde::Serialize;

use crate::spec::{ser_opt_secs, ser_secs};

pub use bench_schema::spec::Api;

/// Where and how to send: the target's base URL (without `/v1`), the model, an optional key.
#[derive(Debug, Clone)]
pub struct Target {
    pub url: String,
    pub model: String,
    pub api_key: Option<String>,
    /// The API its requests are written in and its streams read by.
    pub api: Api,
    /// Send vLLM's `ignore_eos` so outputs run to `max_tokens` and lengths stay as asked.
    pub ignore_eos: bool,
    /// A request that has not finished after this long is abandoned and counted as a timeout.
    pub timeout: Duration,
    /// A PEM file of certificates to trust for https:// besides the usual public roots (a private
    /// CA, a self-signed test server).
    pub ca_cert: Option<std::path::PathBuf>,
}

/// How a request ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Outcome {
    Ok,
    /// A non-200 answer before the stream began.
    Status {
        code: u16,
    },
    /// Connect, write or read failure.
    Transport,
    /// Not finished within the request timeout.
    Timeout,
    /// An error event inside a 200 stream (a stalled or failed upstream): OpenAI's `{"error":…}`,
    /// the Responses API's `error` or `response.failed`, Anthropic's `{"type":"error",…}`.
    StreamError,
    /// The stream ended without its API's last event (`[DONE]`, `response.completed`,
    /// `message_stop`) and without an error event.
    Truncated,
}

impl Outcome {
    /// The bucket the statistics count it in: 429, 503 and 504 apart, other statuses by class.
    pub fn kind(&self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Status { code: 429 } => "http_429",
            Outcome::Status { code: 503 } => "http_503",
            Outcome::Status { code: 504 } => "http_504",
            Outcome::Status { code } if *code < 500 => "http_4xx",
            Outcome::Status { .. } => "http_5xx",
            Outcome::Transport => "transport",
            Outcome::Timeout => "timeout",
            Outcome::StreamError => "stream_error",
            Outcome::Truncated => "truncated",
        }
    }
}

/// One request's measurements. Times are from when it was sent unless said otherwise.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// When the load generator meant to send it, from the start of its level.
    #[serde(serialize_with = "ser_secs")]
    pub scheduled: Duration,
    /// How late it was actually sent: the client's own distortion.
    #[serde(serialize_with = "ser_secs")]
    pub send_lag: Duration,
    #[serde(serialize_with = "ser_opt_secs")]
    pub ttft: Option<Duration>,
    #[serde(serialize_with = "ser_secs")]
    pub e2e: Duration,
    /// Gaps between content chunks, in microseconds.
    pub itl_us: Vec<u32>,
    /// Prompt tokens as the server's `usage` counted them.
    pub input_tokens: Option<u32>,
    /// Prompt tokens as the bench asked for them (synthetic prompts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub asked_input_tokens: Option<u32>,
    /// Completion tokens from `usage`, else the number of content chunks.
    pub output_tokens: u32,
    pub outcome: Outcome,
    /// The response's `id`, to join with server-side records.
    pub id: Option<String>,
    /// Part of the long share of a long-mix level.
    pub long: bool,
    /// The gateway's `Server-Timing` split of the time to the first byte, when it sent one
    /// (Spillway does): how long the request waited in the gateway's queue…
    #[serde(serialize_with = "ser_opt_secs", skip_serializing_if = "Option::is_none")]
    pub gateway_queue: Option<Duration>,
    /// …and how long the upstream took to its first byte, retries included.
    #[serde(serialize_with = "ser_opt_secs", skip_serializing_if = "Option::is_none")]
    pub upstream_first_byte: Option<Duration>,
    /// A refusal's `Retry-After`, in seconds as the header said.
    #[serde(serialize_with = "ser_opt_secs", skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<Duration>,
    /// How long the client then waited before its next request (only when it honours Retry-After):
    /// time in no request's latency.
    #[serde(serialize_with = "ser_opt_secs", skip_serializing_if = "Option::is_none")]
    pub retry_wait: Option<Duration>,
    /// The tenant that sent it, in a run of several (`--tenant`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<std::sync::Arc<str>>,
    /// The objective class it drew, in a run with `--slo-mix`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slo_class: Option<std::sync::Arc<str>>,
    /// A refusal's machine-readable `error.code` (a string, as the gateway's `slo_unattainable`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    #[serde(skip)]
    pub error: Option<String>,
}

impl Record {
    /// A request sent but not (yet) answered: a transport failure until the exchange says otherwise.
    pub fn unanswered(scheduled: Duration, send_lag: Duration, long: bool) -> Record {
        Record {
            scheduled,
            send_lag,
            ttft: None,
            e2e: Duration::ZERO,
            itl_us: Vec::new(),
            input_tokens: None,
            asked_input_tokens: None,
            output_tokens: 0,
            outcome: Outcome::Transport,
            id: None,
            long,
            gateway_queue: None,
            upstream_first_byte: None,
            retry_after: None,
            retry_wait: None,
            tenant: None,
            slo_class: None,
            error_code: None,
            error: None,
        }
    }

    pub fn ok(&self) -> bool {
        self.outcome == Outcome::Ok
    }

    /// Time per output token after the first; `None` for fewer than two tokens.
    pub fn tpot(&self) -> Option<Duration> {
        let ttft = self.ttft?;
        (self.output_tokens > 1).then(|| (self.e2e.saturating_sub(ttft)) / (self.output_tokens - 1))
    }
}
