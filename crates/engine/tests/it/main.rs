//! Integration tests of the engine simulator: one binary, a module per area.

mod agents;
mod api;
mod calibration;
mod clients;
mod faults;
mod metrics;
mod scheduling;
mod store;
mod support;
mod tokenizer;
mod vllm;
