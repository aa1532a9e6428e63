//! `spillway bench` against in-process engines whose behaviour is known by construction.

extern crate spillway_bench as bench;

mod accuracy;
mod apis;
mod context;
mod knee;
mod layout;
mod replay;
mod report;
mod retry_after;
mod slo_mix;
mod support;
mod tenants;
mod tls;
mod watch;
