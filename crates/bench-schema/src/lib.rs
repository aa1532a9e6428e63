//! The vocabulary of a `spillway-bench/1` result, apart from the load generator that writes it, so
//! that a reader (`spillway plan`) links serde and not hyper, rustls and plotters.
//!
//! # Layout
//! - [`spec`]: SLO targets, load levels and phases, parsed from the command line's strings;
//! - [`stats`]: exact percentiles and the summary of one latency;
//! - [`units`]: durations as seconds in the JSON, numbers without empty decimals in the text.

pub mod spec;
pub mod stats;
pub mod units;
