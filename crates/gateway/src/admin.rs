//! The admin API, on its own listener and behind a bearer token: read the state of every route,
//! class and replica; drain or undrain a replica; reload the configuration file.

use crate::config::Config;
use crate::error::GatewayError;
use crate::server::Gateway;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use sha2::{Digest, Sha256};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

pub fn router(gateway: Arc<Gateway>) -> Router {
    Router::new()
        .route("/admin/state", get(state))
        .route("/admin/replicas/drain", post(drain))
        .route("/admin/replicas/undrain", post(undrain))
        .route("/admin/reload", post(reload))
        .fallback(|| async { GatewayError::client(404, "not_found", "no such admin endpoint", None) })
        .with_state(gateway)
}

/// Compares digests of the two tokens, so the comparison takes the same time whatever they hold.
fn authorized(g: &Gateway, headers: &HeaderMap) -> Result<(), GatewayError> {
    let Some(expected) = g.admin_token() else {
        return Err(GatewayError::client(
            403,
            "admin_disabled",
            "the admin API has no token configured",
            None,
        ));
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
    if a.iter().zip(b.iter()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0 {
        Ok(())
    } else {
        Err(GatewayError::client(
            401,
            "invalid_admin_token",
            "missing or wrong admin token",
            None,
        ))
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
                    })
                })
                .collect();
            let replicas: Vec<_> = r.replicas.iter().map(|x| x.state()).collect();
            serde_json::json!({ "model": r.config.model, "classes": classes, "replicas": replicas })
        })
        .collect();
    axum::Json(serde_json::json!({ "draining": g.is_draining(), "routes": routes })).into_response()
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplicaRef {
    route: String,
    replica: String,
}

async fn set_drained(g: &Gateway, headers: &HeaderMap, body: &[u8], drained: bool) -> Response {
    if let Err(e) = authorized(g, headers) {
        return e.into_response();
    }
    let target: ReplicaRef = match protocol::error::parse_json(body) {
        Ok(t) => t,
        Err(e) => {
            return GatewayError::client(400, "invalid_request", e.body.error.message, None).into_response();
        }
    };
    let table = g.table();
    let Some(route) = table.route(&target.route) else {
        return GatewayError::client(
            404,
            "route_not_found",
            format!("no route '{}'", target.route),
            None,
        )
        .into_response();
    };
    let url = target.replica.trim_end_matches('/');
    let Some(replica) = route.replicas.iter().find(|r| r.url == url) else {
        return GatewayError::client(
            404,
            "replica_not_found",
            format!("route '{}' has no replica {url}", target.route),
            None,
        )
        .into_response();
    };
    replica.drained.store(drained, Ordering::Relaxed);
    tracing::info!(route = %target.route, replica = %url, drained, "replica drain changed by the admin API");
    axum::Json(replica.state()).into_response()
}

async fn drain(State(g): State<Arc<Gateway>>, headers: HeaderMap, body: Bytes) -> Response {
    set_drained(&g, &headers, &body, true).await
}

async fn undrain(State(g): State<Arc<Gateway>>, headers: HeaderMap, body: Bytes) -> Response {
    set_drained(&g, &headers, &body, false).await
}

async fn reload(State(g): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    if let Err(e) = authorized(&g, &headers) {
        return e.into_response();
    }
    let Some(path) = g.config_path() else {
        return GatewayError::client(
            409,
            "no_config_file",
            "this gateway was not started from a file",
            None,
        )
        .into_response();
    };
    match reload_file(&g, &path) {
        Ok(()) => (
            StatusCode::OK,
            axum::Json(serde_json::json!({ "reloaded": path })),
        )
            .into_response(),
        Err(message) => GatewayError::client(400, "invalid_config", message, None).into_response(),
    }
}

/// Reads, validates and applies the configuration file; on any error the running one stays.
pub fn reload_file(g: &Gateway, path: &Path) -> Result<(), String> {
    let result = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))
        .and_then(|text| Config::from_yaml(&text).map_err(|e| format!("{}: {e}", path.display())))
        .and_then(|config| g.reload(config));
    match &result {
        Ok(()) => tracing::info!(path = %path.display(), "configuration reloaded"),
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, "reload refused; the running configuration stays")
        }
    }
    result
}

/// Reloads whenever the file's contents change (polled, so it also sees ConfigMap symlink swaps).
pub async fn watch_file(g: Arc<Gateway>, path: std::path::PathBuf, every: Duration) {
    let mut last = std::fs::read(&path).ok();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = std::fs::read(&path).ok();
        if now.is_some() && now != last {
            last = now;
            let _ = reload_file(&g, &path);
        }
    }
}
