//! The wire formats every Spillway component speaks: serde types only, no I/O, no runtime.
//!
//! # Layout
//! - [`openai`]: OpenAI-compatible request and response bodies (chat, legacy completions and
//!   embeddings), parsed leniently the way vLLM does: unknown fields are kept, not rejected, so a
//!   proxy can forward them.
//! - [`agents`]: the agents' APIs (Responses, Messages): their requests, and what each event of
//!   their streams says, in the judgement the chat stream's events get.
//! - [`error`]: the OpenAI error body `{"error":{"message","type","param","code"}}` and the parse
//!   errors that map onto it, naming the offending field.
//! - [`sse`]: Server-Sent Events framing for streamed completions.
//! - [`judge`]: what one event of a stream says (tokens, usage, the end, an error), read as a JSON
//!   parse reads it, for the gateway and the load tester alike.
//! - [`prom`]: values read out of a Prometheus text exposition (an engine's or a gateway's `/metrics`).

pub mod agents;
pub mod error;
pub mod judge;
pub mod openai;
pub mod prom;
pub mod sse;

pub use error::{ApiError, ErrorBody};
