//! The planner end to end: the seed's worked example, golden files for every emitter, the emitted
//! Kubernetes objects against their published CRDs, bad input, and a planned gateway under load.

mod end_to_end;
mod errors;
mod golden;
mod schemas;
mod seed;
mod support;
