//! `spillway serve`: the admission-controlled, OpenAI-compatible streaming gateway.
//!
//! # Layout
//! The request path, in order (DESIGN §1):
//! - [`prepare`]: parse and validate (400/413), cost caps (input tokens, `max_tokens`, `n`),
//!   class and priority — pure functions;
//! - [`tenant`]: who is asking (401/403), by SHA-256 of the bearer key;
//! - [`admission`]: C in flight (fixed or adaptive), Q waiting, Wq at most, priority lanes,
//!   predictive rejection and `Retry-After` (503/429);
//! - [`route`]: class rules, routing rules, replica pools, the balancers, health checks and
//!   outlier ejection;
//! - [`server`]: the upstream call under nested budgets (504/502), retried under [`retry`]'s
//!   budget before the first byte, the held response head, and [`relay`], which streams SSE through
//!   chunk by chunk;
//! - [`outcome`]: one [`outcome::Exchange`] per request, finished once on drop into [`metrics`] and
//!   the [`access_log`]; it owns the admission permit, so the slot is held until the body ends.
//!
//! [`config`] is the YAML the whole thing runs from, [`table`] the routes and tenants built from it
//! (swapped whole on a reload); [`admin`] the operator's API (state, drain, reload); [`error`] the
//! one place failures become status codes and OpenAI error bodies.

pub mod access_log;
pub mod admin;
pub mod admission;
pub mod config;
pub mod error;
pub mod metrics;
pub mod outcome;
pub mod prepare;
pub mod relay;
pub mod retry;
pub mod route;
pub mod server;
pub mod table;
pub mod tenant;

pub use config::Config;
pub use server::{Gateway, router, run};
