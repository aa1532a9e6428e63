//! The request path. [`serve`] is the list of stages, one call per stage into the module that owns
//! it, each returning `Result<_, GatewayError>`: `prepare` (parse, caps, class — stages 1–4),
//! `admit` (the team's quota and a slot — 5–6), `upstream` (a replica, retries — 7), `relay`
//! (the answer — 8), then `respond` makes the response and the `ledger` records how it ended (9),
//! as `lib.rs` numbers them.
//! Every request gets its ID here first ([`identified`]), whichever server read it.

pub(crate) mod admit;
pub(crate) mod api;
pub(crate) mod hints;
pub(crate) mod ledger;
pub(crate) mod prepare;
pub(crate) mod relay;
pub(crate) mod respond;
pub(crate) mod stored;
pub(crate) mod upstream;
pub(crate) mod verdict;

use crate::config::ServerConfig;
use crate::error::{GatewayError, Invalid};
use crate::path::ledger::Ledger;
use crate::state::Gateway;
use crate::table::Table;
use admit::admit;
use api::Api;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use bytes::BytesMut;
pub(crate) use hints::auth;
use http_body_util::BodyExt;
use prepare::Parsed;
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
    let id = hints::request_id(req.headers());
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
    stamp(&mut response, ex.id());
    response
}

/// Named once: a name given as text is parsed again on every insert.
const X_REQUEST_ID: HeaderName = HeaderName::from_static(hints::REQUEST_ID_HEADER);

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
    ex.start_trace(g.tracer.as_ref(), &parts.headers);
    came_in(g, api, &mut ex);
    let answer = serve(g, table, api, &parts.headers, body, &mut ex).await;
    // hyper's HTTP/2 server stops polling a stream's body when its client stops reading it.
    let detach = (parts.version == axum::http::Version::HTTP_2).then_some(g);
    respond(answer, ex, detach)
}

/// The ledger learns the endpoint a request came in on, on either front door: how its answer is
/// read and its errors written, and where the responses it makes are remembered.
pub(crate) fn came_in(g: &Gateway, api: Api, ex: &mut Ledger) {
    ex.came_in_by(api);
    if api == Api::Responses {
        ex.remembers(g.sessions.clone());
    }
}

/// Stages 1–8 of the request path, in order (the 9th, the response and its ledger, is
/// `respond`'s); the first that fails ends the request.
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
    let body = read_body(HyperBody(std::pin::pin!(body)), &g.config.server).await?;
    let Admitted {
        route,
        prepared,
        budgets,
    } = admitted(g, table, api, headers, &body, ex).await?;
    let answered = upstream::call(&route, api, &prepared, &budgets, ex).await?;
    answer(g, &route, answered, &prepared, &budgets, ex.replica()).await
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
    ex.parsed(&parsed);
    ex.trace().request(
        (api.operation(), api.path()),
        parsed.model(),
        parsed.max_tokens(),
        parsed.stream(),
    );
    let table = table.unwrap_or_else(|| g.table());
    // Authenticate before naming any model, so that models cannot be enumerated without a key.
    let tenant = table.tenants.identify(auth(headers).as_deref())?;
    ex.identified(tenant.team.clone());
    let route = prepare::route_for(&table, &parsed, &tenant, headers)?;
    ex.routed(route.name.clone());
    let budgets = Budgets::new(
        &route.config.timeouts,
        hints::caller_deadline(headers)?,
        ex.arrival(),
    );
    let mut prepared = prepare::prepare(parsed, body, &route, &tenant, table.tenants.is_open(), headers)?;
    if let Some(id) = &prepared.previous {
        prepared.pinned = Some(made_by(g, &route, &tenant, id, ex.arrival())?);
    }
    let class = &route.classes[prepared.class];
    ex.counted(prepared.input_tokens, prepared.priority.as_str());
    if !api.takes_slot() {
        // A token count: checked and routed, counted under no class, and given no slot.
        return Ok(Admitted {
            route,
            prepared,
            budgets,
        });
    }
    ex.classified(class);
    ex.trace().admitting();
    admit(g, &route, class, &tenant, &prepared, &budgets, ex).await?;
    Ok(Admitted {
        route,
        prepared,
        budgets,
    })
}

/// The replica that made response `id`, which a request continuing it must go to: one of this
/// route's, made for this tenant's team; else the API's own not-found (another replica would not
/// hold it, and a team may not build on another's).
fn made_by(
    g: &Gateway,
    route: &crate::route::Route,
    tenant: &crate::tenant::Tenant,
    id: &str,
    now: tokio::time::Instant,
) -> Result<Arc<str>, GatewayError> {
    g.sessions
        .find(id, now)
        .filter(|m| m.team == tenant.team && route.replicas.iter().any(|r| r.url == m.replica))
        .map(|m| m.replica)
        .ok_or_else(|| GatewayError::ResponseNotFound(id.chars().take(100).collect()))
}

/// Where a request's body comes from, a piece at a time: hyper's (or `front`'s) body on the
/// proxy's port, Envoy's body messages on the picker's. [`read_body`] reads either.
pub(crate) trait BodySource: Send {
    /// The length the request declared, if any: over the limit, it is refused unread.
    fn declared(&self) -> u64 {
        0
    }

    /// The next piece; `None` at the body's end.
    fn next(&mut self) -> impl Future<Output = Result<Option<Bytes>, GatewayError>> + Send;
}

/// The body, whole, within `server.max_body_bytes` (413) and `server.body_timeout` (408).
pub(crate) async fn read_body<S: BodySource>(
    mut body: S,
    server: &ServerConfig,
) -> Result<Bytes, GatewayError> {
    let limit = server.max_body_bytes;
    // A declared length over the limit is refused before any of the body is asked for, so an
    // `Expect: 100-continue` client is never told to send it.
    if body.declared() > limit as u64 {
        return Err(GatewayError::BodyTooLarge { limit });
    }
    let reading = async {
        // A body in one piece (as `front` reads one) is taken as it is, without a copy.
        let mut first = Bytes::new();
        let mut more = BytesMut::new();
        while let Some(piece) = body.next().await? {
            if first.len() + more.len() + piece.len() > limit {
                return Err(GatewayError::BodyTooLarge { limit });
            }
            if first.is_empty() && more.is_empty() {
                first = piece;
            } else {
                if more.is_empty() {
                    more.extend_from_slice(&first);
                }
                more.extend_from_slice(&piece);
            }
        }
        Ok(if more.is_empty() { first } else { more.freeze() })
    };
    match tokio::time::timeout(server.body_timeout, reading).await {
        Ok(Err(GatewayError::BodyTimeout(_))) | Err(_) => Err(GatewayError::BodyTimeout(server.body_timeout)),
        Ok(read) => read,
    }
}

impl<S: BodySource> BodySource for &mut S {
    fn declared(&self) -> u64 {
        (**self).declared()
    }

    fn next(&mut self) -> impl Future<Output = Result<Option<Bytes>, GatewayError>> + Send {
        (**self).next()
    }
}

/// A body as hyper serves it (or `front`, in hyper's shape).
struct HyperBody<B>(B);

impl<B> BodySource for HyperBody<B>
where
    B: hyper::body::Body<Data = Bytes> + Send + Unpin,
    B::Error: Into<axum::BoxError>,
{
    fn declared(&self) -> u64 {
        self.0.size_hint().lower()
    }

    async fn next(&mut self) -> Result<Option<Bytes>, GatewayError> {
        loop {
            let Some(frame) = self.0.frame().await else {
                return Ok(None);
            };
            let e = match frame {
                // Trailers (HTTP/2's, or a chunked body's) carry nothing the request path reads.
                Ok(frame) => match frame.into_data() {
                    Ok(data) => return Ok(Some(data)),
                    Err(_) => continue,
                },
                Err(e) => e.into(),
            };
            if e.downcast_ref::<http1::server::BodyTimedOut>().is_some() {
                // The duration is `read_body`'s to name.
                return Err(GatewayError::BodyTimeout(std::time::Duration::ZERO));
            }
            return Err(GatewayError::bad_request(
                Invalid::Request,
                format!("cannot read the request body: {e}"),
                None,
            ));
        }
    }
}
