//! The admin API, on its own listener and behind a bearer token: read the state of every route,
//! class and replica and where it differs from the file; drain or undrain a replica; reload the
//! configuration file. Every change is an audit event naming the token's holder.

use crate::config::{Config, ConfigError, MetricsExposure};
use crate::error::{AdminRefusal, GatewayError, Invalid};
use crate::state::Gateway;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use sha2::{Digest, Sha256};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub(crate) fn router(gateway: Arc<Gateway>) -> Router {
    let mut router = Router::new();
    if gateway.config.server.metrics == MetricsExposure::Admin {
        // Unauthenticated, as Prometheus scrapes it; the listener itself is the boundary.
        router = router.route("/metrics", get(crate::serve::router::metrics));
    }
    router
        .route("/admin/state", get(state))
        .route("/admin/replicas/drain", post(drain))
        .route("/admin/replicas/undrain", post(undrain))
        .route("/admin/reload", post(reload))
        .fallback(|| async { GatewayError::NotFound("no such admin endpoint".into()) })
        .with_state(gateway)
}

/// Compares digests of the two tokens, so the comparison takes the same time whatever they hold;
/// returns the name the audit log gives the token's holder.
fn authorized(g: &Gateway, headers: &HeaderMap) -> Result<String, GatewayError> {
    let (Some(expected), Some(admin)) = (g.admin_token(), &g.config.admin) else {
        return Err(GatewayError::AdminToken);
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let (a, b): ([u8; 32], [u8; 32]) = (
        Sha256::digest(given.as_bytes()).into(),
        Sha256::digest(expected.as_bytes()).into(),
    );
    if crate::tenant::digests_equal(&a, &b) {
        Ok(admin.actor().to_owned())
    } else {
        Err(GatewayError::AdminToken)
    }
}

async fn state(State(g): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    if let Err(e) = authorized(&g, &headers) {
        return e.into_response();
    }
    let table = g.table();
    let routes: Vec<_> = table
        .routes
        .iter()
        .map(|r| {
            let classes: Vec<_> = r
                .classes
                .iter()
                .map(|c| {
                    let l = c.admission.limits();
                    serde_json::json!({
                        "name": c.config.name,
                        "concurrency": l.concurrency,
                        "queue": l.queue,
                        "queue_wait_ms": l.queue_wait.as_millis() as u64,
                        "in_flight": c.admission.in_flight(),
                        "queued": c.admission.queued(),
                        "fairness": c.admission.fairness().as_str(),
                        "teams": c.admission.shares().iter().map(|t| serde_json::json!({
                            "team": &*t.team,
                            "weight": t.weight,
                            "attained_service": t.service.round(),
                            "waiting": t.waiting,
                        })).collect::<Vec<_>>(),
                    })
                })
                .collect();
            let replicas = g.replica_states(&r.config.model);
            serde_json::json!({ "model": r.config.model, "classes": classes, "replicas": replicas })
        })
        .collect();
    axum::Json(serde_json::json!({
        "draining": g.is_draining(),
        "routes": routes,
        "drift": drift(&g),
    }))
    .into_response()
}

/// Where the running state differs from the configuration file: drained replicas, adaptive limits
/// away from their configured start, a file that is not what runs (edited and not reloaded, or
/// its reload refused), and TLS files a reload refused. An emergency change shows here until it
/// is written back to the file.
fn drift(g: &Gateway) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    for r in &g.table().routes {
        for (i, replica) in r.replicas.iter().enumerate() {
            if replica.is_drained() {
                out.push(serde_json::json!({
                    "what": "replica_drained",
                    "route": r.config.model,
                    "replica": replica.url,
                    "index": i,
                    "file": "in service",
                    "running": "drained",
                }));
            }
        }
        for c in &r.classes {
            let configured = c.config.concurrency.initial();
            let running = c.admission.limits().concurrency;
            if running != configured {
                out.push(serde_json::json!({
                    "what": "concurrency",
                    "route": r.config.model,
                    "class": c.config.name,
                    "file": c.config.concurrency.to_string(),
                    "configured": configured,
                    "running": running,
                }));
            }
        }
    }
    if let Some(refused) = g.tls.as_ref().and_then(|t| t.refused()) {
        out.push(serde_json::json!({
            "what": "tls_certificate",
            "file": refused,
            "running": "the certificate and key read before",
        }));
    }
    if let Some(path) = g.config_path() {
        let file = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read it: {e}"))
            .and_then(|text| Config::from_yaml(&text).map_err(|e| e.to_string()));
        let differs = match &file {
            Ok(config) => {
                (*config != g.applied_config()).then(|| "differs from the running configuration".to_owned())
            }
            Err(e) => Some(format!("not loadable: {e}")),
        };
        if let Some(file) = differs {
            out.push(serde_json::json!({
                "what": "config_file",
                "path": path,
                "file": file,
                "running": "the configuration last applied",
                "last_reload_error": g.reload_error(),
            }));
        }
    }
    out
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplicaRef {
    route: String,
    replica: String,
}

async fn set_drained(g: &Gateway, headers: &HeaderMap, body: &[u8], drained: bool) -> Response {
    let by = match authorized(g, headers) {
        Ok(by) => by,
        Err(e) => return e.into_response(),
    };
    let target: ReplicaRef = match protocol::error::parse_json(body) {
        Ok(t) => t,
        Err(e) => {
            return GatewayError::bad_request(Invalid::Request, e.body.error.message, None).into_response();
        }
    };
    let table = g.table();
    let Some(route) = table.route(&target.route) else {
        return GatewayError::Admin {
            refusal: AdminRefusal::RouteNotFound,
            message: format!("no route '{}'", target.route),
        }
        .into_response();
    };
    let url = target.replica.trim_end_matches('/');
    let Some((index, replica)) = route.replicas.iter().enumerate().find(|(_, r)| &*r.url == url) else {
        return GatewayError::Admin {
            refusal: AdminRefusal::ReplicaNotFound,
            message: format!("route '{}' has no replica {url}", target.route),
        }
        .into_response();
    };
    let before = replica.set_drained(drained);
    crate::audit::drain(&by, &target.route, url, before, drained);
    axum::Json(replica.state(index)).into_response()
}

async fn drain(State(g): State<Arc<Gateway>>, headers: HeaderMap, body: Bytes) -> Response {
    set_drained(&g, &headers, &body, true).await
}

async fn undrain(State(g): State<Arc<Gateway>>, headers: HeaderMap, body: Bytes) -> Response {
    set_drained(&g, &headers, &body, false).await
}

async fn reload(State(g): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    let by = match authorized(&g, &headers) {
        Ok(by) => by,
        Err(e) => return e.into_response(),
    };
    let Some(path) = g.config_path() else {
        return GatewayError::Admin {
            refusal: AdminRefusal::NoConfigFile,
            message: "this gateway was not started from a file".into(),
        }
        .into_response();
    };
    match reload_file(&g, &path, &by) {
        Ok(()) => (
            StatusCode::OK,
            axum::Json(serde_json::json!({ "reloaded": path })),
        )
            .into_response(),
        Err(e) => GatewayError::bad_request(Invalid::Config, e.to_string(), None).into_response(),
    }
}

/// Reads, validates and applies the configuration file, then reads the listener's TLS
/// certificate and key again (`server.tls`); on any error the running ones stay, and the error
/// says which. `by` names who asked (an admin token's name, `SIGHUP`, the file watch) for the
/// audit events.
pub fn reload_file(g: &Gateway, path: &Path, by: &str) -> Result<(), ConfigError> {
    let config = reload_config(g, path, by);
    let tls = g.reload_tls(by);
    config?;
    tls.map_err(|mut e| {
        e.message.push_str(" (the TLS certificate in force stays)");
        e
    })
}

fn reload_config(g: &Gateway, path: &Path, by: &str) -> Result<(), ConfigError> {
    let before = g.applied_config();
    let result = std::fs::read_to_string(path)
        .map_err(|e| crate::config::err(path.display().to_string(), format!("cannot read it: {e}")))
        .and_then(|text| Config::from_yaml(&text))
        .and_then(|config| g.reload(config.clone()).map(|()| config));
    let shown = path.display().to_string();
    match &result {
        Ok(after) => {
            g.set_reload_error(None);
            crate::audit::reload(by, &shown, &before, Some(after), None);
        }
        Err(e) => {
            g.set_reload_error(Some(e.to_string()));
            crate::audit::reload(by, &shown, &before, None, Some(&e.to_string()));
        }
    }
    result.map(|_| ())
}

/// Reloads whenever the file's contents change, and the TLS certificate whenever its files do
/// (polled, so it also sees the symlink swaps of a ConfigMap or a Secret being updated).
pub async fn watch_file(g: Arc<Gateway>, path: std::path::PathBuf, every: Duration) {
    let mut last = std::fs::read(&path).ok();
    let tls_files = g
        .tls
        .as_ref()
        .map(|t| [t.files().cert.clone(), t.files().key.clone()]);
    let read_tls = || {
        tls_files
            .as_ref()
            .map(|files| files.each_ref().map(|f| std::fs::read(f).ok()))
    };
    let mut last_tls = read_tls();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = std::fs::read(&path).ok();
        let now_tls = read_tls();
        if now.is_some() && now != last {
            last = now;
            last_tls = now_tls;
            let _ = reload_file(&g, &path, "file watch");
        } else if now_tls != last_tls {
            // A pair caught halfway through its update fails and stays as it was; the next
            // tick reads it whole.
            last_tls = now_tls;
            let _ = g.reload_tls("file watch");
        }
    }
}
