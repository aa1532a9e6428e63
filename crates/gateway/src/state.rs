//! The gateway's shared state: the routing table in force (swapped whole on a reload), metrics,
//! the access log, the background tasks of the routes, and the drain.

use crate::access_log::AccessLog;
use crate::config::{Config, ConfigError, err};
use crate::metrics::Metrics;
use crate::table::Table;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use tokio::sync::watch;

/// Stops the health checks when the server stops.
pub(crate) struct StopProbes<'a>(pub(crate) &'a Gateway);

impl Drop for StopProbes<'_> {
    fn drop(&mut self) {
        self.0.probes.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

/// Stops a background task when the server stops.
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Everything the request path shares.
pub struct Gateway {
    table: RwLock<Arc<Table>>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) access: AccessLog,
    draining: AtomicBool,
    /// Turns true when the drain runs out: streams still open end with an SSE error event.
    pub(crate) stop: watch::Sender<bool>,
    /// The configuration the process started with: `listen` and `server` come from it for good.
    pub config: Config,
    probes: Mutex<Vec<AbortOnDrop>>,
    admin_token: Option<String>,
    config_path: Mutex<Option<std::path::PathBuf>>,
    /// Where the admin API listens, once it does.
    pub admin_addr: std::sync::OnceLock<std::net::SocketAddr>,
    /// Where the endpoint picker listens, once it does.
    pub picker_addr: std::sync::OnceLock<std::net::SocketAddr>,
    /// The endpoint picker's streams open now: the drain waits for them as for connections.
    pub(crate) picker_streams: std::sync::atomic::AtomicUsize,
    /// Limits shared with the other gateways through Redis, when configured.
    pub(crate) shared: Option<Arc<crate::limits::SharedLimits>>,
    /// OpenTelemetry traces, when configured.
    pub(crate) tracer: Option<Arc<crate::traces::Tracer>>,
    /// The configuration in force: the one it started with, or the last reload that applied.
    applied: RwLock<Config>,
    /// Why the last reload of the file was refused; cleared by one that applies.
    reload_error: Mutex<Option<String>>,
    /// Requests the public port's own HTTP/1.1 is serving, for its write policy (`front`).
    pub(crate) load: Arc<http1::server::Load>,
    /// Counts a client write cut by `server.send_timeout`; one for every connection.
    pub(crate) send_cut: Arc<dyn Fn() + Send + Sync>,
    /// Which replica made each stored response (the Responses API's state lives there).
    pub(crate) sessions: Arc<crate::sessions::Sessions>,
    /// TLS on the public listener, when `server.tls` is configured.
    pub(crate) tls: Option<crate::tls::ServerTls>,
    /// TLS on the endpoint picker's port, when `endpoint_picker.tls` is configured.
    #[cfg_attr(not(feature = "picker"), allow(dead_code))]
    pub(crate) picker_tls: Option<Arc<rustls::ServerConfig>>,
}

impl Gateway {
    pub fn new(config: Config, access: AccessLog) -> Result<Arc<Gateway>, ConfigError> {
        Self::with_env(config, access, &|name| std::env::var(name).ok())
    }

    /// As [`Gateway::new`], reading secrets through `env` (tests pass their own).
    pub fn with_env(
        config: Config,
        access: AccessLog,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Arc<Gateway>, ConfigError> {
        // `server.access_log: false` is decided here once, not per request.
        let access = if config.server.access_log {
            access
        } else {
            AccessLog::discard()
        };
        let admin_token = match &config.admin {
            Some(a) => Some(a.token(env)?),
            None => None,
        };
        let metrics = Arc::new(Metrics::new());
        // Registered once per gateway: the counter belongs to its access log.
        let _ = metrics.registry.register(Box::new(access.dropped()));
        let table = Table::build(&config, &metrics, None)?;
        let shared = match &config.redis {
            Some(r) => Some(crate::limits::SharedLimits::new(
                r,
                &r.url(env)?,
                r.password(env)?,
                r.sentinel_password(env)?,
                &metrics.registry,
            )?),
            None => None,
        };
        let tracer = match &config.tracing {
            Some(t) => Some(
                crate::traces::Tracer::start(t, &metrics.registry)
                    .map_err(|e| err("tracing", format!("cannot start the exporter thread: {e}")))?,
            ),
            None => None,
        };
        let tls = match &config.server.tls {
            Some(files) => Some(crate::tls::ServerTls::load(files)?),
            None => None,
        };
        let picker_tls = match config.endpoint_picker.as_ref().and_then(|p| p.tls.as_ref()) {
            Some(t) => Some(crate::tls::picker_config(t)?),
            None => None,
        };
        let send_timeouts = metrics.send_timeouts.clone();
        Ok(Arc::new(Gateway {
            tls,
            picker_tls,
            load: Arc::default(),
            send_cut: Arc::new(move || send_timeouts.inc()),
            shared,
            tracer,
            applied: RwLock::new(config.clone()),
            reload_error: Mutex::new(None),
            table: RwLock::new(Arc::new(table)),
            metrics,
            access,
            draining: AtomicBool::new(false),
            stop: watch::Sender::new(false),
            config,
            probes: Mutex::new(Vec::new()),
            admin_token,
            config_path: Mutex::new(None),
            admin_addr: std::sync::OnceLock::new(),
            picker_addr: std::sync::OnceLock::new(),
            picker_streams: std::sync::atomic::AtomicUsize::new(0),
            sessions: Arc::default(),
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
    pub(crate) fn table(&self) -> Arc<Table> {
        self.table.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Applies a new configuration without a restart: routes, classes, limits, replicas and tenants
    /// change at once for new requests; requests in flight keep what they started with.
    /// `listen` and `server` cannot change in a running process and must stay as they are.
    pub fn reload(&self, config: Config) -> Result<(), ConfigError> {
        if config.listen != self.config.listen
            || config.server != self.config.server
            || config.admin != self.config.admin
            || config.redis != self.config.redis
            || config.tracing != self.config.tracing
        {
            return Err(err(
                "config",
                "'listen', 'server', 'admin', 'redis' and 'tracing' cannot change without a restart",
            ));
        }
        let previous = self.table();
        let table = Table::build(&config, &self.metrics, Some(&previous))?;
        *self.table.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(table);
        *self.applied.write().unwrap_or_else(|e| e.into_inner()) = config;
        self.start_probes();
        Ok(())
    }

    /// Reads the public listener's certificate and key again (`by` names who asked, for the
    /// audit event); on an error the pair in force stays. `Ok` without `server.tls`.
    pub fn reload_tls(&self, by: &str) -> Result<(), ConfigError> {
        let Some(tls) = &self.tls else { return Ok(()) };
        let result = tls.reload();
        crate::audit::certificate(by, tls.files(), result.as_ref().err());
        result
    }

    /// Connects to Redis for shared limits, if configured; the work stops when the handles drop.
    pub(crate) fn start_shared(&self) -> Vec<AbortOnDrop> {
        let tasks = self.shared.as_ref().map(|s| s.start());
        tasks.into_iter().flatten().map(AbortOnDrop).collect()
    }

    /// Whether limits are shared through Redis right now (`None`: no Redis configured).
    pub fn limits_shared(&self) -> Option<bool> {
        self.shared.as_ref().map(|s| s.is_shared())
    }

    /// The configuration in force, to compare with the file and to log what a reload changed.
    pub fn applied_config(&self) -> Config {
        self.applied.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Why the last reload of the file was refused, while the file stays ahead of what runs.
    pub fn reload_error(&self) -> Option<String> {
        self.reload_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn set_reload_error(&self, error: Option<String>) {
        *self.reload_error.lock().unwrap_or_else(|e| e.into_inner()) = error;
    }

    /// (Re)starts the active health checks of the current routes.
    pub(crate) fn start_probes(&self) {
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
                let engines = matches!(
                    r.config.balance,
                    crate::config::Balance::EngineAware | crate::config::Balance::Slo
                )
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
    pub fn admission(&self, model: &str, class: &str) -> Option<Arc<admission::Admission>> {
        let table = self.table();
        let route = table.route(model)?;
        route
            .classes
            .iter()
            .find(|c| c.config.name == class)
            .map(|c| c.admission.clone())
    }

    /// The admin view of a route's replicas (health, drain, ejection, busy, load), so tests and
    /// operators can wait on state rather than on time.
    pub fn replica_states(&self, model: &str) -> Vec<serde_json::Value> {
        self.table().route(model).map_or_else(Vec::new, |r| {
            r.replicas.iter().enumerate().map(|(i, x)| x.state(i)).collect()
        })
    }

    pub(crate) fn refresh_gauges(&self) {
        // Set anew at each scrape: a class a reload removed must not keep its last age forever.
        self.metrics.oldest_wait.reset();
        self.metrics.attained_service.reset();
        self.metrics.fairness_index.reset();
        let now = tokio::time::Instant::now();
        self.metrics.slo_prediction_error.reset();
        for r in &self.table().routes {
            r.refresh_gauges();
            if r.config.balance == crate::config::Balance::Slo {
                for replica in &r.replicas {
                    let [(_, ttft), (_, tpot)] = replica.prediction_quality();
                    for (target, error) in [("ttft", ttft), ("tpot", tpot)] {
                        if let Some(e) = error {
                            self.metrics
                                .slo_prediction_error
                                .with_label_values(&[r.config.model.as_str(), &replica.url, target])
                                .set(e);
                        }
                    }
                }
            }
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
                self.metrics
                    .oldest_wait
                    .with_label_values(&labels)
                    .set(c.admission.oldest_wait().map_or(0.0, |d| d.as_secs_f64()));
                let shares = c.admission.shares();
                let mut backlogged = Vec::new();
                for s in &shares {
                    self.metrics
                        .attained_service
                        .with_label_values(&[labels[0], labels[1], &s.team])
                        .set(s.service);
                    if s.backlogged_at
                        .is_some_and(|t| now.saturating_duration_since(t) <= admission::fair::HALF_LIFE)
                    {
                        backlogged.push(s.received / s.weight);
                    }
                }
                if let Some(j) = admission::fair::jain(&backlogged) {
                    self.metrics.fairness_index.with_label_values(&labels).set(j);
                }
            }
        }
    }
}
