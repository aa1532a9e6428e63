//! The `spillway` command line, run as a user runs it.

mod bench;
mod commands;
mod demo;
mod deploy;
mod deploy_picker;
mod diagnose;
mod fit;
mod image;
mod manifests;
mod plan;
mod shared;
mod slo_mix;
mod support;
mod tenants;
mod tls;
mod trace;
mod vllm;
