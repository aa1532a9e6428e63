//! `spillway bench`: an SLO load tester that finds the safe concurrency, against any
//! OpenAI-compatible server (vLLM, the Spillway gateway, `spillway engine`), in any of the four
//! APIs vLLM serves for generation: chat, completions, Responses and Anthropic's Messages.
//!
//! # Layout
//! - [`spec`]: what a run is asked for — length distributions, SLO strings, arrivals, phases.
//! - [`workload`]: the prompts: synthetic, or a ShareGPT / JSONL dataset, with a long share.
//! - [`request`]: the words the rest share — where a request goes ([`Target`]) and what was
//!   measured of it ([`request::Record`], [`request::Outcome`]); `error`: [`BenchError`].
//! - [`body`]: each API's request (chat, completions, Responses, Messages) and its headers.
//! - [`events`]: what one event of each API's stream says (tokens, usage, end, error, id).
//! - [`stream`]: one answer's stream read to its end: TTFT, every ITL gap, tokens, outcome.
//! - [`client`]: one request sent and measured (its status, `Retry-After`, `Server-Timing`).
//! - [`load`]: closed- and open-loop drivers for one level, with an optional burst.
//! - [`watch`]: the server's queue through `/metrics`, and the client's own timer lateness.
//! - [`stats`]: exact percentiles, throughput, goodput, SLO verdicts.
//! - [`machine`]: the host, cores and processor the run ran on, for the reports.
//! - [`tenants`]: several tenants at once, each with its own key and load; their shares and Jain's
//!   fairness index.
//! - [`slo_mix`]: mixed per-request objectives (`--slo-mix`), sent as headers; each class's
//!   goodput against its own objectives.
//! - [`replay`]: a trace (`--trace`) sent on its timestamps, prompts sharing prefix blocks as its
//!   hash ids say.
//! - [`run`]: the phases (baseline, staircase + bisection, long mix, burst) and the safe load.
//! - [`result`]: the run's result, [`Report`], as the JSON carries it (`spillway-bench/1`).
//! - [`report`] (text), [`html`] (self-contained charts) and serde JSON render a [`Report`];
//!   `progress` is the live line on stderr.

pub mod body;
pub mod client;
mod error;
pub mod events;
pub mod html;
pub mod load;
pub mod machine;
mod progress;
pub mod replay;
pub mod report;
pub mod request;
pub mod result;
pub mod run;
pub mod slo_mix;
pub mod spec;
pub mod stats;
pub mod stream;
pub mod tenants;
pub mod watch;
pub mod workload;

pub use client::{Api, Target};
pub use error::BenchError;
pub use result::Report;
pub use run::{Extras, Options, run, run_with};
