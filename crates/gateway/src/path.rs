//! The request path. [`serve`] is the list of stages, one call per stage into the module that owns
//! it, each returning `Result<_, GatewayError>`: `prepare` (parse, caps, class — stages 1–4),
//! `admit` (the team's quota and a slot — 5–6), `upstream` (a replica, retries — 7–9), `relay`
//! (the answer — 10), then `respond` makes the response and the `ledger` records how it ended.
//! Every request gets its ID here first ([`identified`]), whichever server read it.

pub(crate) mod admit;
pub(crate) mod ledger;
pub(crate) mod prepare;
pub(crate) mod relay;
pub(crate) mod respond;
pub(crate) mod upstream;

use crate::config::ServerConfig;
use crate::error::{GatewayError, Invalid};
use crate::path::ledger::Ledger;
use crate::state::Gateway;
use crate::table::Table;
use admit::admit;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use prepare::{Api, Parsed};
use respond::{ClientAnswer, ResponseBody, answer, respond};
use std::future::Future;
use std::sync::Arc;
use upstream::Budgets;

/// Every request gets an ID (the client's `x-request-id`, if plain and short, else a new one),
/// which `serve` is given and its answer carries back; a request head over
/// `server.max_header_bytes` gets 431 in the OpenAI shape with the ID, logged ([`refused`]).
pub(crate) async fn identified<B, R, F, Fut>(
    g: &Gateway,
    req: axum::http::Request<B>,
    serve: F,
) -> Response<R>
where
    R: From<Body>,
    F: FnOnce(String, axum::http::Request<B>) -> Fut,
    Fut: Future<Output = Response<R>>,
{
    let id = prepare::request_id(req.headers());
    let limit = g.config.server.max_header_bytes;
    if head_size(&req) <= limit {
        return serve(id, req).await;
    }
    refused(g, id, GatewayError::HeadersTooLarge { limit }).map(R::from)
}

/// The answer to a request refused before any handler took it (a head over the limit, a bad
/// `Host`, a connection over the limit, an unknown endpoint or method): its ledger ends at once,
/// so that it is logged and counted as the request path's own refusals are.
pub(crate) fn refused(g: &Gateway, id: String, e: GatewayError) -> Response {
    let mut ex = Ledger::new(g.metrics.clone(), g.access.clone(), id);
    ex.fail(&e);
    let mut response = e.into_response();
    stamp(&mut response, &ex.record.id);
    response
}

/// Named once: a name given as text is parsed again on every insert.
const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

const SERVER_TIMING: HeaderName = HeaderName::from_static("server-timing");

/// A request head's size against `server.max_header_bytes`: the path and query, then each
/// header's [`header_size`].
fn head_size<B>(req: &axum::http::Request<B>) -> usize {
    let uri = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    req.headers()
        .iter()
        .map(|(k, v)| header_size(k.as_str().as_bytes(), v.as_bytes()))
        .sum::<usize>()
        + uri
}

/// What one header line counts toward `server.max_header_bytes`, as `front` counts its heads.
use http1::server::header_size;

pub(crate) fn auth(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok())
}

/// What every answer says of its request besides what the request path adds: its ID, and a
/// `Server-Timing` of no wait for those that never reached the queue.
pub(crate) fn stamp(response: &mut Response, id: &str) {
    if let Ok(v) = HeaderValue::from_str(id) {
        response.headers_mut().insert(X_REQUEST_ID, v);
    }
    if !response.headers().contains_key(SERVER_TIMING) {
        response
            .headers_mut()
            .insert(SERVER_TIMING, HeaderValue::from_static("queue;dur=0.0"));
    }
}

/// A completion request as the router's middleware and handler would serve it, by `table` if
/// given (`front` takes the one in force once the body is in), else by the table in force then.
/// On `front`'s path, the head was counted against `max_header_bytes` whole before its headers
/// were sifted (`identified` sees only those kept).
pub(crate) async fn completion<B>(
    g: Arc<Gateway>,
    table: Option<Arc<Table>>,
    api: Api,
    req: axum::http::Request<B>,
) -> Response<ResponseBody>
where
    B: hyper::body::Body<Data = Bytes> + Send,
    B::Error: Into<axum::BoxError>,
{
    identified(&g, req, |id, req| handle(&g, table, api, id, req)).await
}

pub(crate) async fn handle<B>(
    g: &Gateway,
    table: Option<Arc<Table>>,
    api: Api,
    id: String,
    req: axum::http::Request<B>,
) -> Response<ResponseBody>
where
    B: hyper::body::Body<Data = Bytes> + Send,
    B::Error: Into<axum::BoxError>,
{
    let (parts, body) = req.into_parts();
    let mut ex = Ledger::new(g.metrics.clone(), g.access.clone(), id);
    ex.trace = crate::traces::Trace::start(g.tracer.as_ref(), &parts.headers, ex.arrival);
    let answer = serve(g, table, api, &parts.headers, body, &mut ex).await;
    // hyper's HTTP/2 server stops polling a stream's body when its client stops reading it.
    let detach = (parts.version == axum::http::Version::HTTP_2).then_some(g);
    respond(answer, ex, detach)
}

/// Stages 1–10 of the request path, in order; the first that fails ends the request.
async fn serve<B>(
    g: &Gateway,
    table: Option<Arc<Table>>,
    api: Api,
    headers: &HeaderMap,
    body: B,
    ex: &mut Ledger,
) -> Result<ClientAnswer, GatewayError>
where
    B: hyper::body::Body<Data = Bytes> + Send,
    B::Error: Into<axum::BoxError>,
{
    if g.is_draining() {
        return Err(GatewayError::Draining);
    }
    let body = read_body(body, &g.config.server).await?;
    let Admitted {
        route,
        prepared,
        budgets,
    } = admitted(g, table, api, headers, &body, ex).await?;
    let answered = upstream::call(&route, api, &prepared, &budgets, ex).await?;
    answer(g, &route, answered, prepared.stream, &budgets).await
}

/// A request past stages 1–6: its route, what goes to the replica, and its budgets.
pub(crate) struct Admitted {
    pub(crate) route: Arc<crate::route::Route>,
    pub(crate) prepared: prepare::Prepared,
    pub(crate) budgets: Budgets,
}

/// Stages 1–6, on a body read whole: parse, authenticate, route, caps and class, quota, a slot.
/// The proxy and the endpoint picker share them, so a request is admitted alike on either path.
pub(crate) async fn admitted(
    g: &Gateway,
    table: Option<Arc<Table>>,
    api: Api,
    headers: &HeaderMap,
    body: &Bytes,
    ex: &mut Ledger,
) -> Result<Admitted, GatewayError> {
    let parsed = Parsed::parse(api, body)?;
    ex.record.stream = parsed.stream();
    ex.record.arrival_ms = crate::access_log::wall_ms(ex.arrival);
    ex.record.model = Some(parsed.model().into());
    ex.record.max_tokens = parsed.max_tokens();
    ex.record.hash_ids = parsed.hash_ids();
    ex.trace.request(
        api == Api::Chat,
        parsed.model(),
        parsed.max_tokens(),
        parsed.stream(),
    );
    let table = table.unwrap_or_else(|| g.table());
    // Authenticate before naming any model, so that models cannot be enumerated without a key.
    let tenant = table.tenants.identify(auth(headers))?;
    ex.record.team = tenant.team.clone();
    let route = prepare::route_for(&table, &parsed, &tenant, headers)?;
    ex.record.route = route.name.clone();
    let budgets = Budgets::new(
        &route.config.timeouts,
        prepare::caller_deadline(headers)?,
        ex.arrival,
    );
    let prepared = prepare::prepare(parsed, body, &route, &tenant, table.tenants.is_open(), headers)?;
    let class = &route.classes[prepared.class];
    ex.classified(class);
    ex.record.tokens_in = Some(prepared.input_tokens);
    ex.record.priority = Some(prepared.priority.as_str());
    ex.trace.admitting();
    admit(g, &route, class, &tenant, &prepared, &budgets, ex).await?;
    Ok(Admitted {
        route,
        prepared,
        budgets,
    })
}

/// The body, whole, within `server.max_body_bytes` (413) and `server.body_timeout` (408).
async fn read_body<B>(body: B, server: &ServerConfig) -> Result<Bytes, GatewayError>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<axum::BoxError>,
{
    let limit = server.max_body_bytes;
    // A declared length over the limit is refused before any of the body is asked for, so an
    // `Expect: 100-continue` client is never told to send it.
    if body.size_hint().lower() > limit as u64 {
        return Err(GatewayError::BodyTooLarge { limit });
    }
    match tokio::time::timeout(server.body_timeout, Limited::new(body, limit).collect()).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
            Err(GatewayError::BodyTooLarge { limit })
        }
        Ok(Err(e)) if e.downcast_ref::<http1::server::BodyTimedOut>().is_some() => {
            Err(GatewayError::BodyTimeout(server.body_timeout))
        }
        Ok(Err(e)) => Err(GatewayError::bad_request(
            Invalid::Request,
            format!("cannot read the request body: {e}"),
            None,
        )),
        Err(_) => Err(GatewayError::BodyTimeout(server.body_timeout)),
    }
}
