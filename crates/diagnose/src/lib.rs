//! `spillway diagnose`: metric samples in, a verdict with evidence out.
//!
//! # Layout
//! - [`catalog`]: the series a diagnosis reads, under their current and older vLLM names, and
//!   discovery (which exist);
//! - [`window`]: two snapshots and what moved between them — gauge levels, counter increases
//!   with resets, histogram quantiles as PromQL's `histogram_quantile` computes them;
//! - [`rows`]: the four rows on one screen (user impact, generation, engine, infrastructure);
//! - [`breakdown`]: the same window narrowed to each model and each replica, judged by the same
//!   table, so a finding says where it comes from and a sick replica is not averaged away;
//! - `rules`: the signals computed once (`rules::signals`), the signal-combination table as one
//!   function per seed row (`rules::table`), ranked; the saturation rule, "busy but healthy";
//! - [`change`]: where the backlog sits, C against what the engines absorb, and each incident's
//!   change with its number, worked with `spillway plan`'s formulas;
//! - [`verdict`]: the answer and its exit code; [`render`] prints it for a terminal;
//! - [`kube`]: an InferenceService's conditions and its pods' restarts, from kubectl's JSON;
//! - [`source`]: the only I/O — scraping `/metrics` endpoints, or asking a Prometheus server for
//!   the same series at the window's two ends, so both paths feed the same pure functions.

pub mod breakdown;
pub mod catalog;
pub mod change;
pub mod kube;
pub mod render;
pub mod rows;
mod rules;
pub mod source;
pub mod verdict;
pub mod window;

pub use kube::Cluster;
pub use verdict::{Status, Suspect, Thresholds, Verdict, diagnose};
pub use window::{Snapshot, histogram_quantile};

/// What can go wrong at the edge; the pure functions cannot fail.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{url}: {message}")]
    Fetch { url: String, message: String },
    #[error("Prometheus at {url}: {message}")]
    Prometheus { url: String, message: String },
    #[error("{0}")]
    Kube(String),
}
