//! Integration tests of the engine simulator: one binary, a module per area.

mod api;
mod clients;
mod faults;
mod metrics;
mod scheduling;
mod support;
