//! `spillway serve`: the admission-controlled OpenAI-compatible streaming gateway.

pub mod admission;
pub mod config;
