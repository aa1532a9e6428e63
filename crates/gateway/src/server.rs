//! The HTTP server: routes, the request path from admission to the relayed answer, `/metrics`,
//! `/health` and `/ready`, and a drain on shutdown.

use crate::access_log::AccessLog;
use crate::config::Config;
use crate::error::GatewayError;
use crate::metrics::Metrics;
use crate::outcome::{Cut, Exchange};
use crate::prepare::{self, Api, DEADLINE_HEADER, Parsed};
use crate::relay::{EventSplitter, Relay, parse_usage};
use crate::route::Route;
use crate::table::Table;
use axum::Router;
use axum::body::Body;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::time::Instant;

/// Stops the health checks when the server stops.
struct StopProbes<'a>(&'a Gateway);

impl Drop for StopProbes<'_> {
    fn drop(&mut self) {
        self.0.probes.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

/// Stops a background task when the server stops.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Upstream error bodies larger than this are cut when relayed.
const MAX_ERROR_BODY: usize = 64 * 1024;
/// A whole (non-streamed) upstream answer may be at most this large.
const MAX_RESPONSE_BODY: usize = 64 * 1024 * 1024;

/// Everything the request path shares.
pub struct Gateway {
    table: RwLock<Arc<Table>>,
    pub metrics: Arc<Metrics>,
    access: AccessLog,
    draining: AtomicBool,
    /// The configuration the process started with: `listen` and `server` come from it for good.
    pub config: Config,
    probes: Mutex<Vec<AbortOnDrop>>,
    admin_token: Option<String>,
    config_path: Mutex<Option<std::path::PathBuf>>,
    /// Where the admin API listens, once it does.
    pub admin_addr: std::sync::OnceLock<std::net::SocketAddr>,
}

impl Gateway {
    pub fn new(config: Config, access: AccessLog) -> Result<Arc<Gateway>, String> {
        Self::with_env(config, access, &|name| std::env::var(name).ok())
    }

    /// As [`Gateway::new`], reading secrets through `env` (tests pass their own).
    pub fn with_env(
        config: Config,
        access: AccessLog,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Arc<Gateway>, String> {
        // `server.access_log: false` is decided here once, not per request.
        let access = if config.server.access_log {
            access
        } else {
            AccessLog::discard()
        };
        let admin_token = match &config.admin {
            Some(a) => match env(&a.token_env) {
                Some(t) if !t.is_empty() => Some(t),
                _ => {
                    return Err(format!(
                        "admin.token_env: the environment variable {} holding the admin token is not set",
                        a.token_env
                    ));
                }
            },
            None => None,
        };
        let metrics = Arc::new(Metrics::new());
        let table = Table::build(config.clone(), &metrics, None)?;
        Ok(Arc::new(Gateway {
            table: RwLock::new(Arc::new(table)),
            metrics,
            access,
            draining: AtomicBool::new(false),
            config,
            probes: Mutex::new(Vec::new()),
            admin_token,
            config_path: Mutex::new(None),
            admin_addr: std::sync::OnceLock::new(),
        }))
    }

    pub fn admin_token(&self) -> Option<&str> {
        self.admin_token.as_deref()
    }

    /// The file the configuration came from, for reloads.
    pub fn set_config_path(&self, path: std::path::PathBuf) {
        *self.config_path.lock().unwrap_or_else(|e| e.into_inner()) = Some(path);
    }

    pub fn config_path(&self) -> Option<std::path::PathBuf> {
        self.config_path.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The routing table in force; a request holds one for its whole life.
    pub fn table(&self) -> Arc<Table> {
        self.table.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Applies a new configuration without a restart: routes, classes, limits, replicas and tenants
    /// change at once for new requests; requests in flight keep what they started with.
    /// `listen` and `server` cannot change in a running process and must stay as they are.
    pub fn reload(&self, config: Config) -> Result<(), String> {
        if config.listen != self.config.listen
            || config.server != self.config.server
            || config.admin != self.config.admin
        {
            return Err("'listen', 'server' and 'admin' cannot change without a restart".into());
        }
        let previous = self.table();
        let table = Table::build(config, &self.metrics, Some(&previous))?;
        *self.table.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(table);
        self.start_probes();
        Ok(())
    }

    /// (Re)starts the active health checks of the current routes.
    fn start_probes(&self) {
        let probes = self
            .table()
            .routes
            .iter()
            .flat_map(|r| {
                let health = r
                    .config
                    .health
                    .enabled
                    .then(|| AbortOnDrop(tokio::spawn(r.clone().probe_health())));
                let engines = (r.config.balance == crate::config::Balance::EngineAware)
                    .then(|| AbortOnDrop(tokio::spawn(r.clone().scrape_engines())));
                let adaptive = r
                    .classes
                    .iter()
                    .any(|c| matches!(c.config.concurrency, crate::config::Concurrency::Adaptive { .. }))
                    .then(|| AbortOnDrop(tokio::spawn(r.clone().adapt_limits())));
                health.into_iter().chain(engines).chain(adaptive)
            })
            .collect();
        *self.probes.lock().unwrap_or_else(|e| e.into_inner()) = probes;
    }

    /// Stops taking new requests (`/ready` turns 503); requests in flight go on.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::Release);
        self.metrics.draining.set(1);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// In-flight requests over every class of every route.
    pub fn in_flight(&self) -> u32 {
        self.table()
            .routes
            .iter()
            .flat_map(|r| &r.classes)
            .map(|c| c.admission.in_flight())
            .sum()
    }

    /// The admission gate of a route's class, for tests and the admin view.
    pub fn admission(&self, model: &str, class: &str) -> Option<Arc<crate::admission::Admission>> {
        let table = self.table();
        let route = table.route(model)?;
        route
            .classes
            .iter()
            .find(|c| c.config.name == class)
            .map(|c| c.admission.clone())
    }

    fn refresh_gauges(&self) {
        for r in &self.table().routes {
            r.refresh_ejections();
            for c in &r.classes {
                let labels = [r.config.model.as_str(), c.config.name.as_str()];
                self.metrics
                    .in_flight
                    .with_label_values(&labels)
                    .set(i64::from(c.admission.in_flight()));
                self.metrics
                    .queued
                    .with_label_values(&labels)
                    .set(i64::from(c.admission.queued()));
            }
        }
    }
}

/// The gateway's router.
pub fn router(gateway: Arc<Gateway>) -> Router {
    let limit = gateway.config.server.max_body_bytes;
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .fallback(|| async {
            GatewayError::client(
                404,
                "not_found",
                "no such endpoint: the gateway serves /v1/chat/completions, /v1/completions and /v1/models",
                None,
            )
        })
        .layer(DefaultBodyLimit::max(limit))
        .with_state(gateway)
}

/// Serves until `shutdown` resolves, then drains: `/ready` fails, new requests get 503, and the
/// streams in flight get up to `server.drain_timeout` to finish.
pub async fn run(
    listener: TcpListener,
    gateway: Arc<Gateway>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    let drain_timeout = gateway.config.server.drain_timeout;
    let drain_delay = gateway.config.server.drain_delay;
    let g = gateway.clone();
    let (drained_tx, drained_rx) = tokio::sync::oneshot::channel::<()>();
    let signal = async move {
        shutdown.await;
        g.drain();
        tracing::info!(
            in_flight = g.in_flight(),
            "draining: not ready, refusing new requests"
        );
        tokio::time::sleep(drain_delay).await;
        tracing::info!(
            in_flight = g.in_flight(),
            "closing the listener; waiting for streams in flight"
        );
        let _ = drained_tx.send(());
    };
    gateway.start_probes();
    let _stop_probes = StopProbes(&gateway);
    let _admin = match &gateway.config.admin {
        Some(a) => {
            let admin = TcpListener::bind(a.listen).await?;
            let _ = gateway.admin_addr.set(admin.local_addr()?);
            let app = crate::admin::router(gateway.clone());
            Some(AbortOnDrop(tokio::spawn(async move {
                let _ = axum::serve(admin, app).await;
            })))
        }
        None => None,
    };
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let server = axum::serve(listener, router(gateway.clone())).with_graceful_shutdown(signal);
    let mut server = std::pin::pin!(server.into_future());
    tokio::select! {
        r = &mut server => return r,
        _ = drained_rx => {}
    }
    match tokio::time::timeout(drain_timeout, server).await {
        Ok(r) => r,
        Err(_) => {
            tracing::warn!(
                in_flight = gateway.in_flight(),
                "drain timeout: exiting with streams still open"
            );
            Ok(())
        }
    }
}

/// Ready unless draining or some route has no replica that answered its last connection attempt.
async fn ready(State(g): State<Arc<Gateway>>) -> StatusCode {
    if g.is_draining() || !g.table().routes.iter().all(|r| r.has_reachable_replica()) {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    }
}

async fn metrics(State(g): State<Arc<Gateway>>) -> Response {
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
        .map(|r| serde_json::json!({"id": r.config.model, "object": "model", "created": 0, "owned_by": "spillway"}))
        .collect();
    axum::Json(serde_json::json!({"object": "list", "data": data})).into_response()
}

fn auth(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok())
}

async fn chat(
    State(g): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle(g, Api::Chat, headers, body).await
}

async fn completions(
    State(g): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle(g, Api::Completions, headers, body).await
}

async fn handle(
    g: Arc<Gateway>,
    api: Api,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let id = prepare::request_id(&headers);
    let exchange = Exchange::new(g.metrics.clone(), g.access.clone(), id.clone(), false);
    let mut response = match serve(&g, api, &headers, body, exchange).await {
        Ok(r) => r,
        Err((e, mut exchange)) => {
            exchange.record.status = e.status;
            if exchange.rejection.is_none() && exchange.cut.is_none() {
                if exchange.replica.is_none() {
                    // Refused before any replica was asked: a rejection, by its code.
                    exchange.rejection = Some(e.code);
                } else {
                    exchange.record.outcome = e.code.into();
                }
            }
            e.into_response()
        }
    };
    if let Ok(v) = HeaderValue::from_str(&id) {
        response.headers_mut().insert("x-request-id", v);
    }
    response
}

type Failed = (GatewayError, Exchange);

/// Stages 1–12 for one request. On failure the exchange comes back so its record is completed.
async fn serve(
    g: &Gateway,
    api: Api,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    mut ex: Exchange,
) -> Result<Response, Failed> {
    macro_rules! fail {
        ($e:expr) => {
            return Err(($e, ex))
        };
    }
    if g.is_draining() {
        fail!(GatewayError::capacity(
            503,
            "draining",
            "the gateway is shutting down; retry on another instance",
            Some(Duration::from_secs(1))
        ));
    }
    let body = match body {
        Ok(b) => b,
        Err(r) if r.status() == StatusCode::PAYLOAD_TOO_LARGE => fail!(GatewayError::client(
            413,
            "body_too_large",
            format!(
                "the request body exceeds this gateway's limit of {} bytes (server.max_body_bytes)",
                g.config.server.max_body_bytes
            ),
            None
        )),
        Err(r) => fail!(GatewayError::client(
            400,
            "invalid_request",
            format!("cannot read the request body: {r}"),
            None
        )),
    };
    let parsed = match Parsed::parse(api, &body) {
        Ok(p) => p,
        Err(e) => fail!(e),
    };
    ex.record.stream = parsed.stream();
    let table = g.table();
    let Some(route) = table.route(parsed.model()).cloned() else {
        let model: String = parsed.model().chars().take(100).collect();
        fail!(GatewayError::client(
            404,
            "model_not_found",
            format!("The model `{model}` does not exist."),
            Some("model")
        ));
    };
    ex.record.route.clone_from(&route.config.model);
    let tenant = match table.tenants.identify(auth(headers)) {
        Ok(t) => t,
        Err(e) => fail!(e),
    };
    ex.record.team.clone_from(&tenant.team);
    if !tenant.may_use(&route.config.model) {
        fail!(GatewayError::client(
            403,
            "model_not_allowed",
            format!(
                "team '{}' may not use model '{}'",
                tenant.team, route.config.model
            ),
            Some("model")
        ));
    }
    // Routing rules: one hop to another route (its caps, classes and replicas then apply).
    let target = if route.config.redirect.is_empty() {
        None
    } else {
        route
            .redirect(parsed.max_tokens(), parsed.input_tokens(&route), headers)
            .and_then(|to| table.route(to))
            .cloned()
    };
    let route = match target {
        Some(target) => {
            ex.record.route.clone_from(&target.config.model);
            target
        }
        None => route,
    };
    let caller = match prepare::caller_deadline(headers) {
        Ok(d) => d,
        Err(e) => fail!(e),
    };
    let prepared = match prepare::prepare(parsed, &route, &tenant, table.tenants.is_open(), headers) {
        Ok(p) => p,
        Err(e) => fail!(e),
    };
    let class = &route.classes[prepared.class];
    ex.record.class.clone_from(&class.config.name);
    ex.series = Some(class.series.clone());
    ex.slo = class.config.slo;
    ex.record.tokens_in = Some(prepared.input_tokens);

    // Budgets: the caller's deadline, if smaller, shrinks every one of them.
    let t = route.config.timeouts;
    let total = caller.map_or(t.total, |c| c.min(t.total));
    let deadline = ex.arrival + total;
    let first_token_deadline = ex.arrival + t.first_token.min(total);

    let permit = match class
        .admission
        .acquire(prepared.priority, first_token_deadline)
        .await
    {
        Ok(p) => p,
        Err(rejection) => {
            ex.rejection = Some(rejection.reason());
            let limits = class.admission.limits();
            let what = match rejection {
                crate::admission::Rejection::QueueFull { .. } => {
                    format!("the queue is full ({} waiting)", limits.queue)
                }
                crate::admission::Rejection::QueueTimeout { waited, .. } => {
                    format!("no slot within {waited:?} (queue_wait {:?})", limits.queue_wait)
                }
                crate::admission::Rejection::PredictedWait { predicted, .. } => {
                    format!("the predicted wait ({predicted:.1?}) exceeds what the request may wait")
                }
                crate::admission::Rejection::Shed { .. } => {
                    "all slots are busy and sheddable requests do not wait".to_owned()
                }
            };
            let status = route.config.overflow_status;
            fail!(GatewayError::capacity(
                status,
                rejection.reason(),
                format!(
                    "model '{}' class '{}' is at capacity ({} in flight): {what}; retry after {}s",
                    route.config.model,
                    class.config.name,
                    limits.concurrency,
                    rejection.retry_after().as_secs()
                ),
                Some(rejection.retry_after())
            ));
        }
    };
    class.series.queue_wait.observe(permit.queue_wait.as_secs_f64());
    ex.permit = Some(permit);

    let head_deadline = if prepared.stream {
        first_token_deadline
    } else {
        deadline
    };
    let retry = &route.config.retry;
    route.budget.request();
    let mut tried: Vec<usize> = Vec::with_capacity(2);
    // Stage 9: retry only before any byte went to the client, only for a connection failure or a
    // busy replica, on another replica, within the attempts, the budget and the deadline.
    let upstream = loop {
        let Some(replica) = route.pick(&route.classes[prepared.class].pool, &tried, prepared.prefix_key)
        else {
            fail!(GatewayError::capacity(
                503,
                "no_healthy_replica",
                format!("model '{}' has no healthy replica to try", route.config.model),
                Some(Duration::from_secs(1))
            ));
        };
        tried.push(replica.index);
        let url = format!("{}{}", replica.replica.url, api.path());
        ex.replica = Some(replica);
        let remaining = deadline.saturating_duration_since(Instant::now());
        let request = hyper::Request::post(url)
            .header(header::CONTENT_TYPE, "application/json")
            .header("x-request-id", ex.record.id.as_str())
            .header(DEADLINE_HEADER, format!("{}ms", remaining.as_millis()))
            .body(Full::new(prepared.body.clone()));
        let request = match request {
            Ok(r) => r,
            Err(e) => fail!(GatewayError::upstream(
                "bad_upstream_url",
                format!("cannot build the upstream request: {e}")
            )),
        };
        let replica = ex.replica.as_ref().map(|r| r.replica.clone());
        let failure = match tokio::time::timeout_at(head_deadline, route.client.request(request)).await {
            Ok(Ok(r)) => {
                let status = r.status().as_u16();
                if let Some(rep) = &replica {
                    rep.unreachable.store(false, Ordering::Relaxed);
                    // A 5xx other than a busy 503 is the replica failing; a busy replica or a client's
                    // 4xx says nothing about its health. A stream succeeds only at its first chunk.
                    if status >= 500 && status != 503 {
                        route.report(rep, false);
                    } else if (200..300).contains(&status) && !prepared.stream {
                        route.report(rep, true);
                    }
                }
                if status != 429 && status != 503 {
                    break r;
                }
                if let Some(r) = &replica {
                    r.busy.inc();
                }
                if !may_retry(&route, prepared.class, &tried, head_deadline) {
                    return upstream_error(r, ex, deadline).await;
                }
                drop(r);
                None
            }
            Ok(Err(e)) => {
                let url = replica.as_ref().map(|r| r.url.clone()).unwrap_or_default();
                if let Some(r) = &replica {
                    r.errors.inc();
                    r.unreachable.store(e.is_connect(), Ordering::Relaxed);
                    route.report(r, false);
                }
                let err = if e.is_connect() {
                    GatewayError::upstream(
                        "upstream_connect",
                        format!("cannot connect to replica {url}: {e}"),
                    )
                } else {
                    GatewayError::upstream(
                        "upstream_error",
                        format!("lost the connection to replica {url}: {e}"),
                    )
                };
                if !e.is_connect() || !may_retry(&route, prepared.class, &tried, head_deadline) {
                    fail!(err);
                }
                Some(err)
            }
            Err(_) => {
                if let Some(r) = &replica {
                    r.timeouts.inc();
                    route.report(r, false);
                }
                ex.cut = Some(Cut::Deadline);
                let (code, budget) = if prepared.stream {
                    ("first_token_timeout", "first_token")
                } else {
                    ("deadline_exceeded", "total")
                };
                fail!(GatewayError::capacity(
                    504,
                    code,
                    format!("no answer from the replica within the {budget} budget"),
                    None
                ));
            }
        };
        // Another attempt: within the attempts and the budget, after a jittered backoff that
        // still leaves time before the deadline.
        let last = failure.unwrap_or_else(|| {
            GatewayError::capacity(
                503,
                "upstream_busy",
                "every replica tried was busy",
                Some(Duration::from_secs(1)),
            )
        });
        if tried.len() >= retry.attempts.get() as usize {
            fail!(last);
        }
        if !route.budget.try_retry() {
            route.retry_budget_exhausted.inc();
            fail!(last);
        }
        let wait = crate::retry::backoff(retry.backoff.base, retry.backoff.max, tried.len() as u32);
        if Instant::now() + wait >= head_deadline {
            fail!(last);
        }
        tokio::time::sleep(wait).await;
        route.retries.inc();
        ex.record.retries += 1;
    };
    let status = upstream.status();
    if !status.is_success() {
        return upstream_error(upstream, ex, deadline).await;
    }
    if let Some(r) = &ex.replica {
        r.replica.ok.inc();
    }
    if !prepared.stream {
        return whole_answer(upstream, ex, deadline, route.rename.as_ref()).await;
    }

    // Hold the response head until the first chunk: a failure before it is still a clean error.
    let mut body = upstream.into_body();
    let mut splitter = EventSplitter::default();
    let mut first = Vec::new();
    while first.is_empty() {
        match tokio::time::timeout_at(first_token_deadline, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    splitter.feed(&data, |e| first.push(e));
                }
            }
            Ok(Some(Err(e))) => fail!(GatewayError::upstream(
                "upstream_error",
                format!("the replica's stream failed before the first token: {e}")
            )),
            Ok(None) => fail!(GatewayError::upstream(
                "upstream_error",
                "the replica closed the stream before the first token"
            )),
            Err(_) => {
                ex.cut = Some(Cut::Deadline);
                if let Some(r) = &ex.replica {
                    r.replica.timeouts.inc();
                    route.report(&r.replica, false);
                }
                fail!(GatewayError::capacity(
                    504,
                    "first_token_timeout",
                    format!(
                        "no first token within the first_token budget ({:?})",
                        first_token_deadline - ex.arrival
                    ),
                    None
                ));
            }
        }
    }
    if let Some(r) = &ex.replica {
        route.report(&r.replica, true);
    }
    ex.answered = true;
    ex.record.status = 200;
    let mut relay = Relay {
        rename: route.rename.clone(),
        upstream: body,
        splitter,
        pending: Vec::new(),
        strip_usage: !prepared.client_wants_usage,
        idle: t.stream_idle,
        deadline,
        exchange: ex,
        done: false,
    };
    let now = Instant::now();
    relay.pending = first.into_iter().filter_map(|e| relay.event(e, now)).collect();
    let stream = futures::stream::unfold(relay, |mut r| async move { r.next().await.map(|item| (item, r)) });
    Ok((
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream; charset=utf-8"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

/// Whether another replica is left to try before the deadline (attempts and budget are checked
/// after, so that a refused retry is counted against the budget only when one was possible).
fn may_retry(route: &Route, class: usize, tried: &[usize], deadline: Instant) -> bool {
    route.config.retry.attempts.get() as usize > tried.len()
        && route.has_untried(&route.classes[class].pool, tried)
        && Instant::now() < deadline
}

/// A non-2xx answer from the replica: a client error is relayed as it is; a busy replica is
/// backpressure (503); anything else is the replica's failure (502).
async fn upstream_error(
    upstream: hyper::Response<hyper::body::Incoming>,
    mut ex: Exchange,
    deadline: Instant,
) -> Result<Response, Failed> {
    let status = upstream.status().as_u16();
    let retry_after = upstream
        .headers()
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let body = tokio::time::timeout_at(
        deadline,
        Limited::new(upstream.into_body(), MAX_ERROR_BODY).collect(),
    )
    .await
    .ok()
    .and_then(Result::ok)
    .map(|b| b.to_bytes())
    .unwrap_or_default();
    let replica = ex.replica.as_ref().map(|r| r.replica.clone());
    match status {
        429 | 503 => {
            // Counted as busy by the attempt loop, which saw this answer first.
            let url = replica.map(|r| r.url.clone()).unwrap_or_default();
            Err((
                GatewayError::capacity(
                    503,
                    "upstream_busy",
                    format!("replica {url} is busy (it answered {status})"),
                    Some(Duration::from_secs(retry_after.unwrap_or(1))),
                ),
                ex,
            ))
        }
        400..=499 => {
            if let Some(r) = &replica {
                r.ok.inc();
            }
            ex.record.status = status;
            ex.record.outcome = "upstream_rejected".into();
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
            Ok((status, [(header::CONTENT_TYPE, "application/json")], body).into_response())
        }
        _ => {
            if let Some(r) = &replica {
                r.errors.inc();
            }
            let url = replica.map(|r| r.url.clone()).unwrap_or_default();
            let detail = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
            Err((
                GatewayError::upstream(
                    "upstream_error",
                    format!("replica {url} answered {status}: {detail}"),
                ),
                ex,
            ))
        }
    }
}

/// A non-streamed answer: read it whole within the total budget, then send it on.
async fn whole_answer(
    upstream: hyper::Response<hyper::body::Incoming>,
    mut ex: Exchange,
    deadline: Instant,
    rename: Option<&crate::relay::Rename>,
) -> Result<Response, Failed> {
    match tokio::time::timeout_at(
        deadline,
        Limited::new(upstream.into_body(), MAX_RESPONSE_BODY).collect(),
    )
    .await
    {
        Ok(Ok(collected)) => {
            let mut body = collected.to_bytes();
            if let Some(r) = rename {
                body = r.apply(body);
            }
            ex.usage = parse_usage(&body);
            ex.finished = true;
            ex.answered = true;
            ex.record.status = 200;
            let now = Instant::now();
            ex.first_chunk = Some(now);
            ex.last_chunk = Some(now);
            Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
        }
        Ok(Err(e)) => Err((
            GatewayError::upstream("upstream_error", format!("the replica's answer failed: {e}")),
            ex,
        )),
        Err(_) => {
            ex.cut = Some(Cut::Deadline);
            Err((
                GatewayError::capacity(
                    504,
                    "deadline_exceeded",
                    "no complete answer within the total budget",
                    None,
                ),
                ex,
            ))
        }
    }
}
