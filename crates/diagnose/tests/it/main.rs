//! `diagnose` against real engines, a real gateway and real load: one situation per scenario.

mod corpus;
mod kube;
mod prometheus;
mod scenarios;
mod support;
