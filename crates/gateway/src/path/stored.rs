//! `GET /v1/responses/{id}` and `POST /v1/responses/{id}/cancel`: a stored response lives on the
//! replica that made it (`crate::sessions`), so the request goes there and nowhere else, for the
//! team that made it, under the route's key checks. No slot is taken: the replica generates
//! nothing for either.

use super::ledger::{Ending, Ledger};
use super::prepare::Api;
use super::relay;
use crate::error::GatewayError;
use crate::state::Gateway;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http1::client as h1;
use tokio::time::Instant;

/// What is asked of a stored response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ask {
    Read,
    Cancel,
}

/// The replica's answer to `ask` of response `id`, or the gateway's refusal in OpenAI's shape.
pub(crate) async fn serve(
    g: &Gateway,
    ask: Ask,
    id: &str,
    headers: &HeaderMap,
    request_id: String,
) -> Response {
    let mut ex = Ledger::new(g.metrics.clone(), g.access.clone(), request_id);
    ex.came_in_by(Api::Responses);
    let answer = match forward(g, ask, id, headers, &mut ex).await {
        Ok(answer) => answer,
        Err(e) => {
            ex.fail(&e);
            return e.into_response_as(ex.shape());
        }
    };
    let (status, body) = answer;
    ex.end(
        if status.is_success() {
            Ending::Finished
        } else {
            Ending::UpstreamRejected
        },
        status,
    );
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn forward(
    g: &Gateway,
    ask: Ask,
    id: &str,
    headers: &HeaderMap,
    ex: &mut Ledger,
) -> Result<(StatusCode, bytes::Bytes), GatewayError> {
    let table = g.table();
    let tenant = table.tenants.identify(super::auth(headers))?;
    ex.identified(tenant.team.clone());
    // An id is a word (`resp_…`): anything else would be written into the replica's request line.
    let plain = !id.is_empty()
        && id.len() <= 256
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    let not_found = || GatewayError::ResponseNotFound(id.chars().take(100).collect());
    let made = plain
        .then(|| g.sessions.find(id, ex.arrival()))
        .flatten()
        .filter(|m| m.team == tenant.team)
        .ok_or_else(not_found)?;
    let route = table.route(&made.route).cloned().ok_or_else(not_found)?;
    if !tenant.may_use(&route.config.model) {
        return Err(not_found());
    }
    ex.routed(route.name.clone());
    let index = route
        .replicas
        .iter()
        .position(|r| r.url == made.replica)
        .ok_or_else(not_found)?;
    let replica = &route.replicas[index];
    ex.picked(replica.hold(index));
    let path = match ask {
        Ask::Read => format!("/v1/responses/{id}"),
        Ask::Cancel => format!("/v1/responses/{id}/cancel"),
    };
    let empty = bytes::Bytes::new();
    ex.calling(Instant::now());
    let request_id = ex.id().to_owned();
    let request = h1::Request {
        method: if ask == Ask::Read { "GET" } else { "POST" },
        path: &path,
        headers: &[("x-request-id", request_id.as_bytes())],
        body: &empty,
    };
    let timeouts = &route.config.timeouts;
    let deadline = ex.arrival() + timeouts.total;
    let call = h1::send(&replica.conns, &request, timeouts.connect);
    let response = match tokio::time::timeout_at(deadline, call).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) if e.is_connect() => {
            return Err(GatewayError::UpstreamConnect {
                route: route.config.model.clone(),
                replica: index,
            });
        }
        Ok(Err(e)) => {
            return Err(GatewayError::upstream(format!(
                "the replica's answer failed: {e}"
            )));
        }
        Err(_) => return Err(GatewayError::DeadlineExceeded(timeouts.total)),
    };
    ex.first_byte(Instant::now());
    let status = response.status();
    let limit = g.config.server.max_response_bytes;
    let late = GatewayError::DeadlineExceeded(timeouts.total);
    let body = relay::collect(response.into_body(), deadline, limit, late).await?;
    let body = match &route.rename {
        Some(r) if status.is_success() => {
            crate::event::read_whole_in(Some(protocol::agents::Dialect::Responses), body, Some(r)).body
        }
        _ => body,
    };
    Ok((status, body))
}
