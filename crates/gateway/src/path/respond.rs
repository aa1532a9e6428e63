//! Stage 9, the response: a replica's answer whole, its own 4xx relayed, a failure in the OpenAI shape, or
//! a stream handed to its relay; and the fields every answer of the request path carries.

use super::{SERVER_TIMING, X_REQUEST_ID};
use crate::error::GatewayError;
use crate::path::ledger::{Ending, Ledger};
use crate::path::relay::{self, Relay, Streamed};
use crate::path::upstream::{self, Budgets, UpstreamAnswer};
use crate::route::Route;
use crate::state::Gateway;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use std::fmt::Write as _;
use tokio::time::Instant;

/// What the stages produced, before the ledger becomes part of the response.
// Lives for one `match` on the stack; boxing the stream would cost an allocation per request.
#[allow(clippy::large_enum_variant)]
pub(super) enum ClientAnswer {
    /// A non-streamed answer (a 2xx), read whole, with the usage it carries.
    Whole(StatusCode, relay::WholeAnswer),
    /// A stream whose first token has arrived.
    Stream(Streamed, tokio::sync::watch::Receiver<bool>),
    /// The replica's own 4xx, relayed as it was.
    Relayed(StatusCode, Bytes),
    /// A background response, answered at once and still generating: its slot is held until it
    /// finishes.
    Background(StatusCode, relay::WholeAnswer, crate::path::stored::Background),
}

/// An answer's body. A stream's relay is left bare for the public port's own HTTP/1.1
/// (`front`), which frames what it makes ready straight into the connection's buffer, and
/// writes the stream's head fields ([`stream_fields`]) the same way; hyper gets it as a body
/// ([`into_hyper`]).
/// The stream's relay is boxed as hyper's body would be: a connection's task holds this while
/// the answer goes out.
pub(crate) type ResponseBody = http1::server::Reply<Box<Relay>, Body>;

/// The answer as hyper's paths take it: the body as a `Body`, a stream's head fields as headers.
pub(crate) fn into_hyper(response: Response<ResponseBody>) -> Response {
    let (mut parts, reply) = response.into_parts();
    let body = match reply {
        ResponseBody::Body(body) => body,
        ResponseBody::Stream(relay) => {
            stream_fields(relay.ledger(), &mut inserting(&mut parts.headers));
            Body::new(*relay)
        }
    };
    Response::from_parts(parts, body)
}

/// What a stream's head says besides its status, framing and `date`, each field handed to
/// `each` as a name and value: one list for the front, which writes them straight into its
/// buffer (a `HeaderMap` costs a stream two allocations and a hash per field on its way to the
/// first token), and for hyper's paths, which take them as headers.
pub(crate) fn stream_fields(ex: &Ledger, each: &mut dyn FnMut(&HeaderName, &[u8])) {
    each(&header::CONTENT_TYPE, b"text/event-stream; charset=utf-8");
    each(&header::CACHE_CONTROL, b"no-cache");
    request_fields(&server_timing(ex), ex, each);
}

/// What every answer of the request path says of its request: `Server-Timing` (`timing`), the
/// team's rate limits, the request's ID.
pub(crate) fn request_fields(timing: &str, ex: &Ledger, each: &mut dyn FnMut(&HeaderName, &[u8])) {
    each(&SERVER_TIMING, timing.as_bytes());
    for (name, value) in ex.rate_headers().into_iter().flat_map(|r| r.pairs()) {
        each(&HeaderName::from_static(name), value.as_bytes());
    }
    // Plain and short: `prepare::request_id` keeps no other.
    each(&X_REQUEST_ID, ex.id().as_bytes());
}

/// Fields as headers, for hyper's paths and answers that are not streams.
pub(crate) fn inserting(headers: &mut HeaderMap) -> impl FnMut(&HeaderName, &[u8]) + '_ {
    |name, value| {
        if let Ok(v) = HeaderValue::from_bytes(value) {
            headers.insert(name.clone(), v);
        }
    }
}

/// Stage 8: the replica's answer read whole, or a stream (held until its first token by
/// [`upstream::call`]) with what its relay needs.
pub(super) async fn answer(
    g: &Gateway,
    route: &Route,
    answered: UpstreamAnswer,
    prepared: &crate::path::prepare::Prepared,
    budgets: &Budgets,
    replica: Option<&crate::route::ReplicaGuard>,
) -> Result<ClientAnswer, GatewayError> {
    let stream = prepared.stream;
    let upstream = match answered {
        UpstreamAnswer::Response(upstream) => upstream,
        UpstreamAnswer::Rejected(status, body) => return Ok(ClientAnswer::Relayed(status, body)),
        UpstreamAnswer::Stream(streamed) => return Ok(ClientAnswer::Stream(streamed, g.stop.subscribe())),
    };
    let status = upstream.status();
    let limit = g.config.server.max_response_bytes;
    if !status.is_success() {
        let body = upstream::error_body(upstream, budgets, stream, limit).await?;
        return Ok(ClientAnswer::Relayed(status, body));
    }
    let whole = relay::whole(
        upstream.into_body(),
        budgets.deadline,
        budgets.total,
        limit,
        route.rename.as_deref(),
        prepared.dialect,
    )
    .await?;
    if let (true, Some(id), Some(replica)) = (prepared.background, &whole.made, replica) {
        let follow = crate::path::stored::Background {
            conns: replica.replica.conns.clone(),
            id: id.clone(),
            deadline: budgets.deadline,
            connect: route.config.timeouts.connect,
        };
        return Ok(ClientAnswer::Background(status, whole, follow));
    }
    Ok(ClientAnswer::Whole(status, whole))
}

/// The response for what the stages produced; the ledger ends in [`answered`], or lives on in
/// the stream, which runs on a task of its own, under `detach`'s send timeout, where given.
pub(super) fn respond(
    answer: Result<ClientAnswer, GatewayError>,
    mut ex: Ledger,
    detach: Option<&Gateway>,
) -> Response<ResponseBody> {
    let (streamed, stop) = match answer {
        Ok(ClientAnswer::Stream(streamed, stop)) => (streamed, stop),
        Ok(ClientAnswer::Whole(status, whole)) => {
            return answered(Unstreamed::Whole(status, whole), ex);
        }
        Ok(ClientAnswer::Relayed(status, body)) => return answered(Unstreamed::Relayed(status, body), ex),
        Ok(ClientAnswer::Background(status, whole, follow)) => {
            let timing = server_timing(&ex);
            if let Some(id) = &whole.made {
                ex.made_response(id);
            }
            ex.answering(status);
            let mut response = relayed(status, whole.body);
            request_fields(&timing, &ex, &mut inserting(response.headers_mut()));
            tokio::spawn(follow.follow(ex));
            return response.map(ResponseBody::Body);
        }
        Err(e) => return answered(Unstreamed::Failed(e), ex),
    };
    ex.answering(StatusCode::OK);
    let relay = Relay::new(streamed, stop, ex);
    // The head fields go with the relay ([`stream_fields`]): the front writes them, and
    // `into_hyper` makes them headers.
    let Some(g) = detach else {
        return Response::new(ResponseBody::Stream(Box::new(relay)));
    };
    let mut response = Response::new(());
    stream_fields(relay.ledger(), &mut inserting(response.headers_mut()));
    response.map(|()| {
        ResponseBody::Body(Body::new(relay::detached(
            relay,
            g.config.server.send_timeout,
            g.metrics.send_timeouts.clone(),
        )))
    })
}

/// How a request ends that is not a stream.
enum Unstreamed {
    Whole(StatusCode, relay::WholeAnswer),
    Relayed(StatusCode, Bytes),
    Failed(GatewayError),
}

/// The response for a request that ends here, with its ledger.
fn answered(ended: Unstreamed, mut ex: Ledger) -> Response<ResponseBody> {
    // Timed before the ledger ends, as the stages left it.
    let timing = server_timing(&ex);
    let mut response = match ended {
        Unstreamed::Whole(status, whole) => {
            relay::whole_answered(&mut ex, status, &whole);
            relayed(status, whole.body)
        }
        Unstreamed::Relayed(status, body) => {
            ex.end(Ending::UpstreamRejected, status);
            relayed(status, body)
        }
        Unstreamed::Failed(e) => {
            ex.fail(&e);
            e.into_response_as(ex.shape())
        }
    };
    request_fields(&timing, &ex, &mut inserting(response.headers_mut()));
    response.map(ResponseBody::Body)
}

/// A replica's answer as it was: its status, and its body typed JSON (the replicas' headers are
/// not passed on) unless it has none (a 204, or any empty answer).
fn relayed(status: StatusCode, body: Bytes) -> Response {
    if body.is_empty() {
        return status.into_response();
    }
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// `Server-Timing`: milliseconds in Spillway's queue, the upstream's time to its first byte
/// (retries included), and how many retries it took.
pub(crate) fn server_timing(ex: &Ledger) -> String {
    let mut out = String::with_capacity(64);
    out.push_str("queue;dur=");
    millis(&mut out, ex.queue_wait().unwrap_or_default());
    let (start, first_byte) = ex.upstream_timing();
    if let Some(start) = start {
        let end = first_byte.unwrap_or_else(Instant::now);
        out.push_str(", upstream;dur=");
        millis(&mut out, end.saturating_duration_since(start));
    }
    if ex.retries() > 0 {
        let _ = write!(out, ", retry;desc={}", ex.retries());
    }
    out
}

/// `d` in milliseconds with one decimal, rounded half up, in integers and without `fmt`: a
/// float's `{:.1}` costs more than the rest of the header, on every answer's way out.
fn millis(out: &mut String, d: std::time::Duration) {
    // In u64: `as_micros` is a u128, whose division and formatting cost more than a float's.
    let micros = d
        .as_secs()
        .saturating_mul(1_000_000)
        .saturating_add(u64::from(d.subsec_micros()));
    let tenths = micros.saturating_add(50) / 100;
    out.push_str(itoa::Buffer::new().format(tenths / 10));
    out.push('.');
    out.push(char::from(b'0' + (tenths % 10) as u8));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_timing_durations_are_milliseconds_with_one_decimal() {
        for (micros, text) in [
            (0, "0.0"),
            (49, "0.0"),
            (50, "0.1"),
            (1_234, "1.2"),
            (1_250, "1.3"),
            (999_999, "1000.0"),
            (12_345_678, "12345.7"),
        ] {
            let mut out = String::new();
            millis(&mut out, std::time::Duration::from_micros(micros));
            assert_eq!(out, text, "{micros} µs");
        }
    }
}
