//! `spillway plan`: one measurement in, consistent limits for every control point out, with the
//! arithmetic shown — the seed's order: each replica's safe concurrency, the gateway's C a little
//! below their sum, the queue sized by the wait budget, timeouts that nest.
//!
//! # Layout
//! - [`measure`]: what was measured — a `spillway-bench/1` result read for the figures a plan
//!   needs, or figures measured with another tool;
//! - [`arith`]: the deployment, the formulas and the checks, giving a [`Plan`]: every figure, each
//!   line of arithmetic with where its inputs came from, the binding layer and the warnings;
//!   `arith::budgets` derives the nested timeouts;
//! - [`names`]: the names the files use — the flags', else what the bench measured, else
//!   placeholders each file marks as not measured;
//! - [`emit`]: the plan as files for each control point — Spillway's config, an Envoy Gateway
//!   `BackendTrafficPolicy`, a LiteLLM `model_list`, vLLM's arguments and a KServe
//!   `InferenceService` — serialized from typed structs;
//! - [`report`]: the plan as text for a terminal.
//!
//! Everything here is a pure function of its inputs; reading files and printing is the binary's.

pub mod arith;
pub mod emit;
pub mod measure;
pub mod names;
pub mod report;
mod units;

pub use arith::{Deployment, Names, Plan, Unmeasured, plan};
pub use emit::{Artifact, Target};
pub use measure::{Figures, Measurement};

/// Why no plan could be made: each is one line for the operator, naming the input to change.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("{file}: not a spillway bench result: {detail}")]
    NotBench { file: String, detail: String },
    #[error("{file}: schema {found:?} is not spillway-bench/1 (write one with `spillway bench --json`)")]
    Schema { file: String, found: String },
    #[error(
        "{file}: no level passed its SLOs{knee}, so there is no safe load to plan from; re-run the bench from a lower load or with the objectives you can meet"
    )]
    NoSafeLoad { file: String, knee: String },
    #[error("--headroom {0}: must be above 0 and at most 1 (0.8 leaves a fifth for failures and skew)")]
    Headroom(f64),
    #[error("{0}")]
    WaitBudget(String),
    #[error("deadlines cannot nest: {0}")]
    Nesting(String),
    #[error("{0}")]
    Input(String),
    #[error("cannot write {target}: {source}")]
    Yaml {
        target: &'static str,
        source: serde_yaml_ng::Error,
    },
}
