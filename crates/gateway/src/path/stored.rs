//! `GET /v1/responses/{id}` and `POST /v1/responses/{id}/cancel`: a stored response lives on the
//! replica that made it (`crate::sessions`), so the request goes there and nowhere else, for the
//! team that made it, under the route's key checks. No slot is taken: the replica generates
//! nothing for either.

use super::api::Api;
use super::ledger::{Ending, Ledger};
use super::relay;
use crate::config::BACKGROUND_POLL;
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

/// What a request asks of a stored response, by its method and path (without the query), and
/// the id it names: `GET /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`.
#[cfg_attr(not(feature = "picker"), allow(dead_code))]
pub(crate) fn asked<'a>(method: &str, path: &'a str) -> Option<(Ask, &'a str)> {
    let rest = path.strip_prefix("/v1/responses/")?;
    match (method, rest.strip_suffix("/cancel")) {
        ("POST", Some(id)) => Some((Ask::Cancel, id)),
        ("GET", None) if !rest.contains('/') => Some((Ask::Read, rest)),
        _ => None,
    }
}

/// The replica's answer to `ask` of response `id`, or the gateway's refusal in OpenAI's shape.
pub(crate) async fn serve(
    g: &Gateway,
    ask: Ask,
    id: &str,
    headers: &HeaderMap,
    request_id: String,
) -> Response {
    match reply(g, ask, id, headers, request_id).await {
        Ok((status, body)) => (status, [(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => e.into_response(),
    }
}

/// The replica's status and body for `ask` of response `id` (the proxy's answer, and the endpoint
/// picker's immediate one), logged and counted as the request path's requests are.
pub(crate) async fn reply(
    g: &Gateway,
    ask: Ask,
    id: &str,
    headers: &HeaderMap,
    request_id: String,
) -> Result<(StatusCode, bytes::Bytes), GatewayError> {
    let mut ex = Ledger::new(g.metrics.clone(), g.access.clone(), request_id);
    ex.came_in_by(Api::Responses);
    let (status, body) = match forward(g, ask, id, headers, &mut ex).await {
        Ok(answer) => answer,
        Err(e) => {
            ex.fail(&e);
            return Err(e);
        }
    };
    let ending = if status.is_success() {
        Ending::Finished
    } else {
        Ending::UpstreamRejected
    };
    ex.end(ending, status);
    Ok((status, body))
}

async fn forward(
    g: &Gateway,
    ask: Ask,
    id: &str,
    headers: &HeaderMap,
    ex: &mut Ledger,
) -> Result<(StatusCode, bytes::Bytes), GatewayError> {
    let table = g.table();
    let tenant = table.tenants.identify(super::auth(headers).as_deref())?;
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

/// A background response the replica is still generating: the ledger, which holds the request's
/// slot, lives on here and ends when the replica reports the response finished — asked by its
/// `GET` every [`BACKGROUND_POLL`] — or, at `deadline` (the route's total budget), cancels it.
pub(crate) struct Background {
    pub(crate) conns: std::sync::Arc<crate::route::transport::Conns>,
    pub(crate) id: String,
    pub(crate) deadline: Instant,
    pub(crate) connect: std::time::Duration,
}

impl Background {
    pub(crate) async fn follow(self, mut ex: Ledger) {
        let read = format!("/v1/responses/{}", self.id);
        let empty = bytes::Bytes::new();
        loop {
            tokio::time::sleep(BACKGROUND_POLL).await;
            if Instant::now() >= self.deadline {
                let cancel = format!("{read}/cancel");
                let request = h1::Request {
                    method: "POST",
                    path: &cancel,
                    headers: &[],
                    body: &empty,
                };
                let _ = tokio::time::timeout(self.connect * 2, h1::send(&self.conns, &request, self.connect))
                    .await;
                ex.end(Ending::Cut(crate::error::Cut::Deadline), StatusCode::OK);
                return;
            }
            let request = h1::Request {
                method: "GET",
                path: &read,
                headers: &[],
                body: &empty,
            };
            let Ok(Ok(response)) =
                tokio::time::timeout_at(self.deadline, h1::send(&self.conns, &request, self.connect)).await
            else {
                // Unreachable for now: asked again until the deadline.
                continue;
            };
            let status = response.status();
            let late = GatewayError::DeadlineExceeded(std::time::Duration::ZERO);
            let Ok(body) = relay::collect(response.into_body(), self.deadline, 1 << 20, late).await else {
                continue;
            };
            if !status.is_success() {
                // The replica no longer holds it (restarted): nothing more can be learned.
                ex.end(Ending::Failed("upstream_error"), StatusCode::OK);
                return;
            }
            #[derive(serde::Deserialize)]
            struct Status {
                status: Option<String>,
            }
            let now = serde_json::from_slice::<Status>(&body)
                .ok()
                .and_then(|s| s.status);
            if let Some(done @ ("completed" | "incomplete" | "failed" | "cancelled")) = now.as_deref() {
                let whole =
                    crate::event::read_whole_in(Some(protocol::agents::Dialect::Responses), body, None);
                ex.whole_answer(Instant::now(), whole.usage);
                let ending = match done {
                    "failed" => Ending::Failed("upstream_error"),
                    "cancelled" => Ending::Cut(crate::error::Cut::Client),
                    _ => Ending::Finished,
                };
                ex.end(ending, StatusCode::OK);
                return;
            }
        }
    }
}
