//! The request path, stage by stage, and the endpoints around it (`/v1/models`, `/health`,
//! `/ready`, `/metrics`). [`serve`] is the list of stages; each stage is a call into the module that
//! owns it and returns `Result<_, GatewayError>`.

use crate::config::{MetricsExposure, ServerConfig};
use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::outcome::{Ending, Exchange};
use crate::prepare::{self, Api, Parsed, Prepared};
use crate::relay::{self, Events, Relay, RelayConfig};
use crate::route::{Class, Route};
use crate::table::Table;
use crate::tenant::Tenant;
use crate::upstream::{self, Answered, Budgets};
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper_util::service::TowerToHyperService;
use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use tokio::time::Instant;

/// The gateway's public router.
pub fn router(gateway: Arc<Gateway>) -> Router {
    let mut router = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/ready", get(ready));
    if gateway.config.server.metrics == MetricsExposure::Public {
        router = router.route("/metrics", get(metrics));
    }
    router
        .fallback(|| async {
            GatewayError::NotFound(
                "no such endpoint: the gateway serves /v1/chat/completions, /v1/completions and /v1/models"
                    .into(),
            )
        })
        .method_not_allowed_fallback(|| async {
            GatewayError::MethodNotAllowed("this endpoint does not take that method")
        })
        .layer(axum::middleware::from_fn_with_state(gateway.clone(), request_id))
        .with_state(gateway)
}

/// The request's ID, as the middleware settled it.
#[derive(Clone)]
struct RequestId(String);

/// The router's side of [`identified`]: the ID goes into the request for the handlers.
pub(crate) async fn request_id(State(g): State<Arc<Gateway>>, req: Request, next: Next) -> Response {
    let limit = g.config.server.max_header_bytes;
    identified(limit, req, |id, mut req| async move {
        req.extensions_mut().insert(RequestId(id.clone()));
        let mut response = next.run(req).await;
        stamp(&mut response, &id);
        response
    })
    .await
}

/// Every request gets an ID (the client's `x-request-id`, if plain and short, else a new one),
/// which `serve` is given and its answer carries back; a request head over
/// `server.max_header_bytes` (`limit`) gets 431 in the OpenAI shape, with the ID.
async fn identified<B, R, F, Fut>(limit: usize, req: axum::http::Request<B>, serve: F) -> Response<R>
where
    R: From<Body>,
    F: FnOnce(String, axum::http::Request<B>) -> Fut,
    Fut: Future<Output = Response<R>>,
{
    let id = prepare::request_id(req.headers());
    if head_size(&req) <= limit {
        return serve(id, req).await;
    }
    let mut response = GatewayError::HeadersTooLarge { limit }.into_response();
    stamp(&mut response, &id);
    response.map(R::from)
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

/// Ready unless draining or some route has no replica that answered its last connection attempt.
async fn ready(State(g): State<Arc<Gateway>>) -> StatusCode {
    if g.is_draining() || !g.table().routes.iter().all(|r| r.has_reachable_replica()) {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    }
}

pub(crate) async fn metrics(State(g): State<Arc<Gateway>>) -> Response {
    g.refresh_gauges();
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        g.metrics.encode(),
    )
        .into_response()
}

async fn models(State(g): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    let table = g.table();
    let tenant = match table.tenants.identify(auth(&headers)) {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let data: Vec<_> = table
        .routes
        .iter()
        .filter(|r| tenant.may_use(&r.config.model))
        .map(|r| {
            let mut card = serde_json::json!({"id": r.config.model, "object": "model", "created": 0, "owned_by": "spillway"});
            // The smallest the replicas stated: a request that fits it fits wherever it goes.
            if let Some(len) = r.replicas.iter().filter_map(|x| x.max_model_len()).min() {
                card["max_model_len"] = len.into();
            }
            card
        })
        .collect();
    axum::Json(serde_json::json!({"object": "list", "data": data})).into_response()
}

fn auth(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok())
}

async fn chat(State(g): State<Arc<Gateway>>, req: Request) -> Response {
    let id = settled_id(&req);
    into_hyper(handle(g, None, Api::Chat, id, req).await)
}

async fn completions(State(g): State<Arc<Gateway>>, req: Request) -> Response {
    let id = settled_id(&req);
    into_hyper(handle(g, None, Api::Completions, id, req).await)
}

/// The request ID the middleware settled (or a new one, for a router without it).
fn settled_id(req: &Request) -> String {
    match req.extensions().get::<RequestId>() {
        Some(RequestId(id)) => id.clone(),
        None => prepare::request_id(req.headers()),
    }
}

/// The public listener's service. The two completion endpoints go straight to the request path:
/// axum's routing, middleware and body boxing cost about ten allocations and as many dynamic
/// calls per request, which the hot path does without. Every other request, and any other
/// method on those paths, goes through the [`router`], which answers them as before.
#[derive(Clone)]
pub(crate) struct Front {
    /// `None` on connections over the limit: the router answers everything there.
    gateway: Option<Arc<Gateway>>,
    router: TowerToHyperService<Router>,
}

impl Front {
    pub(crate) fn new(gateway: Option<Arc<Gateway>>, router: Router) -> Front {
        Front {
            gateway,
            router: TowerToHyperService::new(router),
        }
    }
}

impl hyper::service::Service<axum::http::Request<Incoming>> for Front {
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Self::Error>> + Send>>;

    fn call(&self, req: axum::http::Request<Incoming>) -> Self::Future {
        if let Err(e) = host_checked(&req) {
            let mut response = e.into_response();
            stamp(&mut response, &prepare::request_id(req.headers()));
            return Box::pin(std::future::ready(Ok(response)));
        }
        let api = match (req.method(), req.uri().path()) {
            (&Method::POST, "/v1/chat/completions") => Some(Api::Chat),
            (&Method::POST, "/v1/completions") => Some(Api::Completions),
            _ => None,
        };
        match (api, &self.gateway) {
            (Some(api), Some(g)) => {
                let g = g.clone();
                Box::pin(async move { Ok(into_hyper(completion(g, None, api, req).await)) })
            }
            _ => Box::pin(self.router.call(req)),
        }
    }
}

/// RFC 9112 §3.2: an HTTP/1.1 request has one `Host` header, and an HTTP/1 request's `Host`, if
/// any, is valid; HTTP/2 names its authority otherwise. `front` hands such heads over to be
/// answered here.
fn host_checked<B>(req: &axum::http::Request<B>) -> Result<(), GatewayError> {
    let version = req.version();
    if version > axum::http::Version::HTTP_11 {
        return Ok(());
    }
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let message = match (hosts.next(), hosts.next()) {
        (None, _) if version == axum::http::Version::HTTP_11 => "an HTTP/1.1 request must have a Host header",
        (None, _) => return Ok(()),
        (Some(_), Some(_)) => "a request must have one Host header, not several",
        (Some(h), None) if !http1::server::valid_host(h.as_bytes()) => {
            "the Host header is not a valid host[:port]"
        }
        (Some(_), None) => return Ok(()),
    };
    Err(GatewayError::bad_request("invalid_host", message, None))
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
) -> Response<Reply>
where
    B: hyper::body::Body<Data = Bytes> + Send,
    B::Error: Into<axum::BoxError>,
{
    let limit = g.config.server.max_header_bytes;
    identified(limit, req, |id, req| handle(g, table, api, id, req)).await
}

/// What the stages produced, before the exchange becomes part of the response.
// Lives for one `match` on the stack; boxing the stream would cost an allocation per request.
#[allow(clippy::large_enum_variant)]
enum Answer {
    /// A non-streamed answer (a 2xx), read whole.
    Whole(StatusCode, Bytes),
    /// A stream whose first token has arrived.
    Stream(Events, RelayConfig),
    /// The replica's own 4xx, relayed as it was.
    Relayed(StatusCode, Bytes),
}

/// An answer's body. A stream's relay is left bare for the public port's own HTTP/1.1
/// (`front`), which frames what it makes ready straight into the connection's buffer, and
/// writes the stream's head fields ([`stream_fields`]) the same way; hyper gets it as a body
/// ([`into_hyper`]).
/// The stream's relay is boxed as hyper's body would be: a connection's task holds this while
/// the answer goes out.
pub(crate) type Reply = http1::server::Reply<Box<Relay>, Body>;

/// The answer as hyper's paths take it: the body as a `Body`, a stream's head fields as headers.
fn into_hyper(response: Response<Reply>) -> Response {
    let (mut parts, reply) = response.into_parts();
    let body = match reply {
        Reply::Body(body) => body,
        Reply::Stream(relay) => {
            stream_fields(relay.exchange(), &mut inserting(&mut parts.headers));
            Body::new(*relay)
        }
    };
    Response::from_parts(parts, body)
}

/// What a stream's head says besides its status, framing and `date`, each field handed to
/// `each` as a name and value: one list for the front, which writes them straight into its
/// buffer (a `HeaderMap` costs a stream two allocations and a hash per field on its way to the
/// first token), and for hyper's paths, which take them as headers.
pub(crate) fn stream_fields(ex: &Exchange, each: &mut dyn FnMut(&HeaderName, &[u8])) {
    each(&header::CONTENT_TYPE, b"text/event-stream; charset=utf-8");
    each(&header::CACHE_CONTROL, b"no-cache");
    request_fields(&server_timing(ex), ex, each);
}

/// What every answer of the request path says of its request: `Server-Timing` (`timing`), the
/// team's rate limits, the request's ID.
fn request_fields(timing: &str, ex: &Exchange, each: &mut dyn FnMut(&HeaderName, &[u8])) {
    each(&SERVER_TIMING, timing.as_bytes());
    for (name, value) in ex.rate_headers.iter().flat_map(|r| r.pairs()) {
        each(&HeaderName::from_static(name), value.as_bytes());
    }
    // Plain and short: `prepare::request_id` keeps no other.
    each(&X_REQUEST_ID, ex.record.id.as_bytes());
}

/// Fields as headers, for hyper's paths and answers that are not streams.
fn inserting(headers: &mut HeaderMap) -> impl FnMut(&HeaderName, &[u8]) + '_ {
    |name, value| {
        if let Ok(v) = HeaderValue::from_bytes(value) {
            headers.insert(name.clone(), v);
        }
    }
}

async fn handle<B>(
    g: Arc<Gateway>,
    table: Option<Arc<Table>>,
    api: Api,
    id: String,
    req: axum::http::Request<B>,
) -> Response<Reply>
where
    B: hyper::body::Body<Data = Bytes> + Send,
    B::Error: Into<axum::BoxError>,
{
    let (parts, body) = req.into_parts();
    let mut ex = Exchange::new(g.metrics.clone(), g.access.clone(), id);
    ex.trace = crate::traces::Trace::start(g.tracer.as_ref(), &parts.headers, ex.arrival);
    let answer = serve(&g, table, api, &parts.headers, body, &mut ex).await;
    // hyper's HTTP/2 server stops polling a stream's body when its client stops reading it.
    let detach = (parts.version == axum::http::Version::HTTP_2).then_some(&*g);
    respond(answer, ex, detach)
}

/// Stages 1–10 of the request path, in order; the first that fails ends the request.
async fn serve<B>(
    g: &Gateway,
    table: Option<Arc<Table>>,
    api: Api,
    headers: &HeaderMap,
    body: B,
    ex: &mut Exchange,
) -> Result<Answer, GatewayError>
where
    B: hyper::body::Body<Data = Bytes> + Send,
    B::Error: Into<axum::BoxError>,
{
    if g.is_draining() {
        return Err(GatewayError::Draining);
    }
    let body = read_body(body, &g.config.server).await?;
    let parsed = Parsed::parse(api, &body)?;
    ex.record.stream = parsed.stream();
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
    let route = table.route_for(&parsed, &tenant, headers)?;
    ex.record.route = route.name.clone();
    let budgets = Budgets::new(
        &route.config.timeouts,
        prepare::caller_deadline(headers)?,
        ex.arrival,
    );
    let prepared = prepare::prepare(parsed, &body, &route, &tenant, table.tenants.is_open(), headers)?;
    let class = &route.classes[prepared.class];
    ex.classified(class);
    ex.record.tokens_in = Some(prepared.input_tokens);
    ex.trace.admitting();
    admit(g, &route, class, &tenant, &prepared, &budgets, ex).await?;
    let answered = upstream::call(&route, api, &prepared, &budgets, ex).await?;
    answer(g, &route, answered, prepared.stream, &budgets).await
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
            "invalid_request",
            format!("cannot read the request body: {e}"),
            None,
        )),
        Err(_) => Err(GatewayError::BodyTimeout(server.body_timeout)),
    }
}

/// The most a request may cost, charged to its team's `tpm` until it ends: its prompt and
/// `max_tokens` for each sequence it generates.
fn reserved_tokens(prepared: &Prepared) -> u64 {
    u64::from(prepared.input_tokens)
        + u64::from(prepared.max_tokens.unwrap_or(0)) * u64::from(prepared.sequences)
}

/// Stages 5 and 6: the team's quota, then a slot in the class — one call to Redis where limits
/// are shared by several gateways, else (or while Redis does not answer) this gateway's own.
async fn admit(
    g: &Gateway,
    route: &Route,
    class: &Class,
    tenant: &Tenant,
    prepared: &Prepared,
    budgets: &Budgets,
    ex: &mut Exchange,
) -> Result<(), GatewayError> {
    let Some(shared) = &g.shared else {
        charge_quota(tenant, prepared, ex)?;
        return take_slot(route, class, prepared, budgets, ex).await;
    };
    // The Redis path's future is six times the local one's; boxed, it does not make every
    // request's future (allocated whole per request) that much larger.
    Box::pin(admit_with_redis(
        g, shared, route, class, tenant, prepared, budgets, ex,
    ))
    .await
}

/// [`admit`] where Redis is configured: shared limits while it answers, this gateway's share of
/// them while it does not.
#[allow(clippy::too_many_arguments)]
async fn admit_with_redis(
    g: &Gateway,
    shared: &Arc<crate::shared::Shared>,
    route: &Route,
    class: &Class,
    tenant: &Tenant,
    prepared: &Prepared,
    budgets: &Budgets,
    ex: &mut Exchange,
) -> Result<(), GatewayError> {
    if admit_shared(g, route, class, tenant, prepared, budgets, ex).await? {
        return Ok(());
    }
    charge_quota(tenant, prepared, ex)?;
    // Waiting on this gateway's share while Redis is out: if limits turn shared meanwhile, Redis
    // decides instead (a slot of the share handed over then would come on top of C).
    let local = tokio::select! {
        r = take_slot(route, class, prepared, budgets, ex) => Some(r),
        () = shared.sharing() => None,
    };
    match local {
        Some(r) => r?,
        None => {
            ex.give_back_local();
            if admit_shared(g, route, class, tenant, prepared, budgets, ex).await? {
                return Ok(());
            }
            charge_quota(tenant, prepared, ex)?;
            take_slot(route, class, prepared, budgets, ex).await?;
        }
    }
    // Admitted on this gateway's share: Redis learns of it when it is back.
    let team_slot = tenant.limits.max_parallel.is_some();
    ex.lease = Some(Box::new(shared.local_lease(
        &route.config.model,
        &class.config.name,
        &tenant.team,
        team_slot,
    )));
    if shared.reachable() {
        // Redis is back (or coming back): it learns of the slot now, not at the next renewal,
        // so that the shared count includes it.
        shared.register().await;
    }
    Ok(())
}

/// Stages 5 and 6 against the limits shared by every gateway through Redis, in one call: false
/// when there are none, or Redis does not answer (then this gateway enforces its share of them).
async fn admit_shared(
    g: &Gateway,
    route: &Route,
    class: &Class,
    tenant: &Tenant,
    prepared: &Prepared,
    budgets: &Budgets,
    ex: &mut Exchange,
) -> Result<bool, GatewayError> {
    let Some(shared) = g.shared.as_ref().filter(|s| s.is_shared()) else {
        return Ok(false);
    };
    let tokens = reserved_tokens(prepared);
    let ask = crate::shared::Ask {
        status: route.config.overflow_status,
        route: &route.config.model,
        class: &class.config.name,
        limits: class.limits,
        priority: prepared.priority,
        deadline: budgets.first_token_deadline,
        team: &tenant.team,
        quota: tenant.limits,
        tokens,
        admission: &class.admission,
    };
    match shared.admit(ask).await {
        Err(crate::shared::Unavailable) => Ok(false),
        Ok(Ok(admitted)) => {
            // Counted here too, so that this gateway's share starts from it should Redis fail.
            let headers = admitted.headers.unwrap_or_default();
            ex.quota_admitted(tenant.quota.admit_counted(tokens, headers));
            ex.lease = Some(Box::new(admitted.lease));
            ex.admitted(admitted.permit);
            Ok(true)
        }
        Ok(Err(e)) => {
            if let GatewayError::Overloaded {
                rejection: admission::Rejection::QueueTimeout { waited, .. },
                ..
            } = &e
            {
                ex.waited(*waited);
            }
            Err(e)
        }
    }
}

/// Stage 5: the team's quota, before the class queue, so a team over it never takes a queue
/// place. The request is charged what it may cost at most (see [`reserved_tokens`]).
fn charge_quota(tenant: &Tenant, prepared: &Prepared, ex: &mut Exchange) -> Result<(), GatewayError> {
    let tokens = reserved_tokens(prepared);
    match tenant.quota.admit(tokens) {
        Ok(permit) => {
            ex.quota_admitted(permit);
            Ok(())
        }
        Err(e) => {
            ex.rate_headers = tenant.quota.headers();
            Err(e.into())
        }
    }
}

/// Stage 6: a slot in the class, or a fast refusal with `Retry-After`.
async fn take_slot(
    route: &Route,
    class: &Class,
    prepared: &Prepared,
    budgets: &Budgets,
    ex: &mut Exchange,
) -> Result<(), GatewayError> {
    match class
        .admission
        .acquire(prepared.priority, budgets.first_token_deadline)
        .await
    {
        Ok(permit) => {
            ex.admitted(permit);
            Ok(())
        }
        Err(rejection) => {
            if let admission::Rejection::QueueTimeout { waited, .. } = rejection {
                ex.waited(waited);
            }
            Err(GatewayError::Overloaded {
                status: route.config.overflow_status,
                route: route.config.model.clone(),
                class: class.config.name.clone(),
                limits: class.admission.limits(),
                rejection,
            })
        }
    }
}

/// Stage 10: the replica's answer read whole, or a stream (held until its first token by
/// [`upstream::call`]) with what its relay needs.
async fn answer(
    g: &Gateway,
    route: &Route,
    answered: Answered,
    stream: bool,
    budgets: &Budgets,
) -> Result<Answer, GatewayError> {
    let upstream = match answered {
        Answered::Response(upstream) => upstream,
        Answered::Rejected(status, body) => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
            return Ok(Answer::Relayed(status, body));
        }
        Answered::Stream(events) => {
            let config = RelayConfig {
                idle: route.config.timeouts.stream_idle,
                deadline: budgets.deadline,
                stop: g.stop.subscribe(),
            };
            return Ok(Answer::Stream(events, config));
        }
    };
    let status = upstream.status();
    let limit = g.config.server.max_response_bytes;
    if !status.is_success() {
        let body = upstream::error_body(upstream, budgets, stream, limit).await?;
        return Ok(Answer::Relayed(status, body));
    }
    let body = relay::whole(
        upstream.into_body(),
        budgets.deadline,
        budgets.total,
        limit,
        route.rename.as_deref(),
    )
    .await?;
    Ok(Answer::Whole(status, body))
}

/// The response for what the stages produced; the exchange ends in [`answered`], or lives on in
/// the stream, which runs on a task of its own, under `detach`'s send timeout, where given.
fn respond(
    answer: Result<Answer, GatewayError>,
    mut ex: Exchange,
    detach: Option<&Gateway>,
) -> Response<Reply> {
    let (opened, config) = match answer {
        Ok(Answer::Stream(opened, config)) => (opened, config),
        Ok(Answer::Whole(status, body)) => return answered(Ended::Whole(status, body), ex),
        Ok(Answer::Relayed(status, body)) => return answered(Ended::Relayed(status, body), ex),
        Err(e) => return answered(Ended::Failed(e), ex),
    };
    ex.answering(200);
    let relay = Relay::new(opened, config, ex);
    // The head fields go with the relay ([`stream_fields`]): the front writes them, and
    // `into_hyper` makes them headers.
    let Some(g) = detach else {
        return Response::new(Reply::Stream(Box::new(relay)));
    };
    let mut response = Response::new(());
    stream_fields(relay.exchange(), &mut inserting(response.headers_mut()));
    response.map(|()| {
        Reply::Body(Body::new(relay::detached(
            relay,
            g.config.server.send_timeout,
            g.metrics.send_timeouts.clone(),
        )))
    })
}

/// How a request ends that is not a stream.
enum Ended {
    Whole(StatusCode, Bytes),
    Relayed(StatusCode, Bytes),
    Failed(GatewayError),
}

/// The response for a request that ends here, with its exchange.
fn answered(ended: Ended, mut ex: Exchange) -> Response<Reply> {
    // Timed before the exchange ends, as the stages left it.
    let timing = server_timing(&ex);
    let mut response = match ended {
        Ended::Whole(status, body) => {
            ex.trace.finish_reasons(&body);
            ex.whole_answer(Instant::now(), crate::event::parse_usage(&body));
            ex.end(Ending::Finished, status.as_u16());
            relayed(status, body)
        }
        Ended::Relayed(status, body) => {
            ex.end(Ending::UpstreamRejected, status.as_u16());
            relayed(status, body)
        }
        Ended::Failed(e) => {
            ex.fail(&e);
            e.into_response()
        }
    };
    request_fields(&timing, &ex, &mut inserting(response.headers_mut()));
    response.map(Reply::Body)
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
fn server_timing(ex: &Exchange) -> String {
    let mut out = String::with_capacity(64);
    out.push_str("queue;dur=");
    millis(&mut out, ex.queue_wait().unwrap_or_default());
    if let Some(start) = ex.upstream_start {
        let end = ex.upstream_first_byte.unwrap_or_else(Instant::now);
        out.push_str(", upstream;dur=");
        millis(&mut out, end.saturating_duration_since(start));
    }
    if ex.record.retries > 0 {
        let _ = write!(out, ", retry;desc={}", ex.record.retries);
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
