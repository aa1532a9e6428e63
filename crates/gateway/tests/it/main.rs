//! Integration tests of the gateway, with simulated engines in-process as the upstream.

mod adaptive;
mod admission;
mod agents;
mod audit;
mod bad_input;
mod balance;
mod cancellation;
mod clients;
mod deploy;
#[cfg(feature = "picker")]
mod doors;
mod embeddings;
mod fair_share;
mod handoff;
mod hostile;
mod http1;
mod observability;
mod operations;
#[cfg(feature = "picker")]
mod picker;
mod quotas;
mod redis_ha;
mod redis_tls;
mod resilience;
mod shared;
mod slo_routing;
mod streaming;
mod styles;
mod support;
mod tls;
mod traces;
mod vllm;
mod wire;
