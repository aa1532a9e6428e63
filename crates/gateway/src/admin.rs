//! The admin API, on its own listener and behind a bearer token: read the state of every route,
//! class and replica; drain or undrain a replica; reload the configuration file.

use crate::config::{Config, ConfigError, MetricsExposure};
use crate::error::GatewayError;
use crate::gateway::Gateway;
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
        router = router.route("/metrics", get(crate::server::metrics));
    }
    router
        .route("/admin/state", get(state))
        .route("/admin/replicas/drain", post(drain))
        .route("/admin/replicas/undrain", post(undrain))
        .route("/admin/reload", post(reload))
        .fallback(|| async { GatewayError::NotFound("no such admin endpoint".into()) })
        .with_state(gateway)
}

/// Compares digests of the two tokens, so the comparison takes the same time whatever they hold.
fn authorized(g: &Gateway, headers: &HeaderMap) -> Result<(), GatewayError> {
    let Some(expected) = g.admin_token() else {
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
        Ok(())
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
                    })
                })
                .collect();
            let replicas = g.replica_states(&r.config.model);
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
            return GatewayError::bad_request("invalid_request", e.body.error.message, None).into_response();
        }
    };
    let table = g.table();
    let Some(route) = table.route(&target.route) else {
        return GatewayError::Admin {
            status: 404,
            code: "route_not_found",
            message: format!("no route '{}'", target.route),
        }
        .into_response();
    };
    let url = target.replica.trim_end_matches('/');
    let Some((index, replica)) = route.replicas.iter().enumerate().find(|(_, r)| r.url == url) else {
        return GatewayError::Admin {
            status: 404,
            code: "replica_not_found",
            message: format!("route '{}' has no replica {url}", target.route),
        }
        .into_response();
    };
    replica.set_drained(drained);
    tracing::info!(route = %target.route, replica = %url, drained, "replica drain changed by the admin API");
    axum::Json(replica.state(index)).into_response()
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
        return GatewayError::Admin {
            status: 409,
            code: "no_config_file",
            message: "this gateway was not started from a file".into(),
        }
        .into_response();
    };
    match reload_file(&g, &path) {
        Ok(()) => (
            StatusCode::OK,
            axum::Json(serde_json::json!({ "reloaded": path })),
        )
            .into_response(),
        Err(e) => GatewayError::bad_request("invalid_config", e.to_string(), None).into_response(),
    }
}

/// Reads, validates and applies the configuration file; on any error the running one stays.
pub fn reload_file(g: &Gateway, path: &Path) -> Result<(), ConfigError> {
    let result = std::fs::read_to_string(path)
        .map_err(|e| crate::config::err(path.display().to_string(), format!("cannot read it: {e}")))
        .and_then(|text| Config::from_yaml(&text))
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
