//! Serving connections: the listener (accept, connection limits, the drain), the public port's own
//! HTTP/1.1 for the hot path (`front`), the router for everything else, and the admin API on its
//! own port, and the endpoint picker Envoy asks over gRPC. Each hands a completion request to
//! [`crate::path`].

pub mod admin;
pub(crate) mod front;
pub(crate) mod listener;
#[cfg(feature = "picker")]
pub(crate) mod picker;
pub(crate) mod router;
