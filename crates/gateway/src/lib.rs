//! `spillway serve`: the admission-controlled, OpenAI-compatible streaming gateway.
//!
//! # Layout
//! Three folders and the request path between them, each depending only on those listed after it:
//! - `serve/` — the connections: `listener` (accept, connection limits, header and idle
//!   timeouts, the drain), `front` (the public port's own HTTP/1.1 for the hot path), `router`
//!   (everything else, and hyper's service), [`admin`] (the operator's API, whose changes
//!   [`audit`] logs), `picker` (the endpoint picker Envoy asks over `ext_proc`, the second front
//!   door: gRPC glue around the same path — stages 1–7 by `path::admitted` and `upstream::pick`,
//!   the answer fed to the relay's `Events` and judged by `verdict`, the ledger settled at its
//!   end; behind the `picker` feature, on by default, so that a proxy-only build links no gRPC).
//!   Both ports share `listener`'s accept loop and connection cap. Each hands a completion
//!   request to `path`.
//! - `path/` — the request path; `path::serve()` is one call per stage, in this order:
//!   1. read the body (413/408) — `read_body`, for either front door — and parse it — `prepare`
//!      (400); the request's hints (ID, deadline, priority, objectives, key) are `hints`';
//!   2. who is asking — `tenant` (401), before any model is named;
//!   3. which route serves the model — `prepare::route_for` over the `table` (404/403, rules);
//!   4. cap the cost, pick the class and priority — `prepare` (400 naming the limit);
//!   5. the team's quota — `admit`, by [`admission::quota`] (429 with `Retry-After` and OpenAI's
//!      `x-ratelimit-*`), counted in a sliding [`admission::window`];
//!   6. a slot in the class — `admit`, by [`admission::gate`] (503/429 with `Retry-After`); with
//!      `redis:` in the config, stages 5 and 6 are one call to the limits every gateway shares
//!      (`limits`), and this gateway's share of them while Redis is unreachable;
//!   7. pick a replica, call it under the budgets, retry where allowed — `upstream`
//!      (502/503/504), with `route` choosing among healthy replicas and [`admission::retry`]
//!      keeping retries within a budget;
//!   8. the answer — `relay`: a whole body, or a stream whose head waits for the first token,
//!      each SSE event read by [`event`] (its kind, its usage, an error, the model's name); the
//!      relay's decisions are `relay::Events`, fed bytes and the time by either front door, and
//!      a replica's error answer is judged once, by `verdict`;
//!   9. the response — `respond`; the end — `ledger`: one ending per request, written into
//!      `metrics` and the [`access_log`] when the record is dropped; it owns the admission slot,
//!      so the slot is held until the body ends.
//! - `limits/` — the limits every gateway of a deployment shares through Redis, and its scripts;
//!   `limits/node` finds the Redis node that holds them (Sentinel, Cluster) and follows it.
//!
//! Under them: `state` (the [`Gateway`]: the table in force, reloads, the drain), `table` (routes
//! and tenants, swapped whole on a reload), `route` (a route's classes, replicas, balancing,
//! health, scraping, adaptive C), `tenant`, [`config`] (the YAML), [`tls`] (the listener's
//! certificate, reloaded in place, and the trust of `https://` replicas), `traces` (OpenTelemetry spans,
//! exported off the request path), `metrics`, [`access_log`], [`event`], and [`error`] (the one
//! place failures, and the cuts of a stream, become status codes, codes and OpenAI bodies).

pub mod access_log;
pub mod audit;
pub mod config;
pub mod error;
pub mod event;
mod limits;
mod metrics;
mod path;
mod route;
mod serve;
mod sessions;
mod state;
mod table;
mod tenant;
pub mod tls;
mod traces;

pub use admission::QuotaKind;
pub use config::Config;
pub use error::GatewayError;
pub use serve::admin;
pub use serve::listener::{bind, run};
pub use serve::router::router;
pub use state::Gateway;
pub use tenant::{key_sha256, new_key};

/// The per-replica latency model of `balance: slo`, for its benchmark in `benches/`.
#[doc(hidden)]
pub mod benching {
    use crate::route::predict::{Predictor, State, features};
    use std::time::Duration;

    #[derive(Default)]
    pub struct SloModel(Predictor);

    impl SloModel {
        pub fn learn(
            &mut self,
            input_tokens: u32,
            in_flight: u32,
            waiting: f64,
            ttft: Duration,
            tpot: Duration,
        ) {
            let x = features(State {
                input_tokens,
                in_flight,
                engine_waiting: waiting,
                ..State::default()
            });
            self.0.learn_ttft(&x, ttft);
            self.0.learn_tpot(&x, tpot);
        }

        /// The predicted TTFT, if the model has warmed up.
        pub fn predict(&self, input_tokens: u32, in_flight: u32, waiting: f64) -> Option<Duration> {
            self.0
                .predict(&features(State {
                    input_tokens,
                    in_flight,
                    engine_waiting: waiting,
                    ..State::default()
                }))
                .map(|p| p.ttft)
        }
    }
}

/// Entry points for the fuzz targets in `fuzz/`: the request path's pure stages, outside a server.
#[doc(hidden)]
pub mod fuzzing {
    use crate::config::Config;
    use crate::error::GatewayError;
    use axum::http::HeaderMap;

    /// A route built from a configuration, to run requests through its parsing and caps.
    pub struct FuzzRoute(crate::route::Route, std::sync::Arc<crate::tenant::Tenants>);

    /// What stages 1–4 made of a request: the body sent upstream and its `max_tokens`.
    pub struct Prepared {
        pub body: bytes::Bytes,
        pub max_tokens: Option<u32>,
    }

    impl FuzzRoute {
        /// The first route of `config`.
        pub fn new(config: &Config) -> Result<FuzzRoute, crate::config::ConfigError> {
            let metrics = crate::metrics::Metrics::new();
            let trust = crate::tls::route_trust(&config.routes[0], 0)?;
            let route = crate::route::Route::new(config.routes[0].clone(), &metrics, None, None, trust)?;
            Ok(FuzzRoute(
                route,
                std::sync::Arc::new(crate::tenant::Tenants::new(&[], None, None)),
            ))
        }

        /// Parses `body` for the chat or completions endpoint and applies the caps and the class rules.
        pub fn prepare(
            &self,
            chat: bool,
            headers: &HeaderMap,
            body: &[u8],
        ) -> Result<Prepared, GatewayError> {
            let api = if chat {
                crate::path::api::Api::Chat
            } else {
                crate::path::api::Api::Completions
            };
            let parsed = crate::path::prepare::Parsed::parse(api, body)?;
            let tenant = self.1.identify(None)?;
            let p = crate::path::prepare::prepare(
                parsed,
                &bytes::Bytes::copy_from_slice(body),
                &self.0,
                &tenant,
                true,
                headers,
            )?;
            Ok(Prepared {
                body: p.body,
                max_tokens: p.max_tokens,
            })
        }
    }

    /// The caller's deadline header, parsed.
    pub fn caller_deadline(headers: &HeaderMap) -> Result<Option<std::time::Duration>, GatewayError> {
        crate::path::hints::caller_deadline(headers)
    }

    /// The request ID the gateway would use.
    pub fn request_id(headers: &HeaderMap) -> String {
        crate::path::hints::request_id(headers)
    }

    /// A request head the public port's own HTTP/1.1 (`front`) serves itself.
    #[derive(Debug)]
    pub struct FrontHead {
        pub chat: bool,
        /// The request-target, as sent.
        pub target: String,
        pub content_length: usize,
        /// The client asked to close after the answer.
        pub close: bool,
        /// Where the body starts: the blank lines before the head, and the head.
        pub body_offset: usize,
    }

    /// What `front` makes of `data` arriving in two reads cut at `cut`, as its connection would
    /// read it: `None` where it does not serve the request itself (hyper does, or it is
    /// refused), else what it read of the head.
    pub fn front_head(data: &[u8], cut: usize) -> Option<FrontHead> {
        let mut buf = bytes::BytesMut::new();
        let mut searched = 0;
        let mut skipped = 0;
        for piece in [&data[..cut.min(data.len())], &data[cut.min(data.len())..]] {
            buf.extend_from_slice(piece);
            let (blank, scanned) = http1::server::scan(&buf, &mut searched, 64 * 1024);
            bytes::Buf::advance(&mut buf, blank);
            skipped += blank;
            match scanned {
                http1::server::Scan::Complete(end) => {
                    let head = buf.split_to(end).freeze();
                    let r = crate::serve::front::FrontRequest::from_head(&head, &[], usize::MAX)?;
                    // As `front::serve` does: a body over the limit goes to hyper's path.
                    if r.content_length > crate::config::ServerConfig::default().max_body_bytes {
                        return None;
                    }
                    return Some(FrontHead {
                        chat: r.api == crate::path::api::Api::Chat,
                        target: r.uri.to_string(),
                        content_length: r.content_length,
                        close: r.close,
                        body_offset: skipped + end,
                    });
                }
                http1::server::Scan::More => {}
                _ => return None,
            }
        }
        None
    }

    /// What the replica client makes of an answer `data` read in pieces cut at `cuts`, then
    /// the connection's close: its status, body, whether the connection could be reused, how
    /// many bytes of `data` the answer took, and where a trailer section past hyper's limits
    /// began.
    pub fn upstream_answer(data: &[u8], cuts: &[usize]) -> Result<http1::client::Decoded, String> {
        http1::client::decode_answer(data, cuts).map_err(|e| e.to_string())
    }
}
