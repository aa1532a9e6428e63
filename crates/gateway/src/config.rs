//! The gateway's configuration: YAML in the shape of DESIGN §8, parsed strictly and validated once.
//!
//! `Config::from_yaml` → `validate` is the only way in, so a running gateway never holds a config
//! that breaks containment (`connect < first_token ≤ total`) or names a limit it cannot enforce.
//! The whole file and its tenants are here; the `routes` section is in `route`, the process-wide
//! ones (`server`, `admin`, `redis`, `tracing`) in `server`.

mod route;
mod server;
mod yaml;

pub use route::*;
pub use server::*;

use serde::Deserialize;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

/// The whole gateway configuration.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub listen: SocketAddr,
    pub routes: Vec<RouteConfig>,
    /// With no tenants, requests need no key and run as one anonymous tenant.
    #[serde(default)]
    pub tenants: Vec<TenantConfig>,
    #[serde(default)]
    pub server: ServerConfig,
    /// The admin API on its own listener; absent: no admin API.
    #[serde(default)]
    pub admin: Option<AdminConfig>,
    /// Limits shared by several gateways through Redis; absent: this process enforces them alone.
    #[serde(default)]
    pub redis: Option<RedisConfig>,
    /// OpenTelemetry traces of each request, sent over OTLP/HTTP; absent: no spans are made (a
    /// caller's `traceparent` is still passed on to the replica).
    #[serde(default)]
    pub tracing: Option<TracingConfig>,
    /// The Gateway API Inference Extension's endpoint picker (Envoy's `ext_proc` over gRPC),
    /// served beside the HTTP listener; absent: not served.
    #[serde(default)]
    pub endpoint_picker: Option<EndpointPickerConfig>,
}

/// A team and its API keys (stored as SHA-256 hex digests, never in clear).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    pub team: String,
    pub key_sha256: Vec<String>,
    /// Public model names this team may use; empty: all.
    #[serde(default)]
    pub models: Vec<String>,
    #[serde(default)]
    pub priority: Priority,
    /// Requests of this team in flight at once, at most.
    #[serde(default)]
    pub max_parallel: Option<NonZeroU32>,
    /// Requests per minute (sliding 60 s), at most.
    #[serde(default)]
    pub rpm: Option<NonZeroU32>,
    /// Tokens per minute (prompt + completion; `max_tokens` reserved at admission, settled at the end).
    #[serde(default)]
    pub tpm: Option<std::num::NonZeroU64>,
    /// The team's share of a contended class under `fairness: teams`, relative to the others'.
    #[serde(default = "one")]
    pub weight: f64,
}

fn one() -> f64 {
    1.0
}

/// Queue priority lives with the admission gate that orders by it.
pub use admission::{Fairness, Priority};

/// A configuration that cannot be used, with the path of the offending field.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{path}: {message}")]
pub struct ConfigError {
    pub path: String,
    pub message: String,
}

pub(crate) fn err(path: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError {
        path: path.into(),
        message: message.into(),
    }
}

impl Config {
    /// Parses and validates YAML; every error names the field's path.
    pub fn from_yaml(text: &str) -> Result<Config, ConfigError> {
        let de = serde_yaml_ng::Deserializer::from_str(text);
        let config: Config = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let path = if path == "." { "config".into() } else { path };
            let message = yaml::plain(&path, &e.into_inner(), text);
            err(path, message)
        })?;
        config.validate()
    }

    /// Checks what types cannot: containment of budgets, unique names, usable URLs and keys.
    pub fn validate(mut self) -> Result<Config, ConfigError> {
        if self.routes.is_empty() {
            return Err(err("routes", "at least one route is needed"));
        }
        let mut models = HashSet::new();
        for (i, route) in self.routes.iter_mut().enumerate() {
            let at = |field: &str| format!("routes[{i}].{field}");
            if route.model.is_empty() {
                return Err(err(at("model"), "must not be empty"));
            }
            if !models.insert(route.model.clone()) {
                return Err(err(at("model"), format!("'{}' is routed twice", route.model)));
            }
            validate_route(i, route)?;
        }
        for (i, route) in self.routes.iter().enumerate() {
            for (k, r) in route.redirect.iter().enumerate() {
                let at = format!("routes[{i}].redirect[{k}]");
                if r.to == route.model || !models.contains(&r.to) {
                    return Err(err(
                        format!("{at}.to"),
                        format!("'{}' is not another route's model", r.to),
                    ));
                }
                if r.when == When::default() {
                    return Err(err(format!("{at}.when"), "a rule needs a condition"));
                }
            }
        }
        self.validate_tenants(&models)?;
        // Teams share a contended class fairly unless a class says otherwise; with no tenants
        // there is one anonymous team, and arrival order is all there is.
        let fairness = if self.tenants.is_empty() {
            Fairness::Fifo
        } else {
            Fairness::Teams
        };
        for class in self.routes.iter_mut().flat_map(|r| r.classes.iter_mut()) {
            class.fairness.get_or_insert(fairness);
        }
        self.validate_listeners()?;
        self.validate_redis()?;
        self.validate_tracing()?;
        Ok(self)
    }

    fn validate_tracing(&self) -> Result<(), ConfigError> {
        let Some(t) = &self.tracing else { return Ok(()) };
        let url = t.traces_url();
        match url.parse::<hyper::Uri>() {
            Ok(u) if u.scheme_str() == Some("http") && u.host().is_some() => {}
            Ok(u) if u.scheme_str() == Some("https") => {
                return Err(err(
                    "tracing.otlp_endpoint",
                    "https is not supported: send to a collector beside the gateway over http",
                ));
            }
            _ => {
                return Err(err(
                    "tracing.otlp_endpoint",
                    format!("'{}' is not an http://host:port URL", t.otlp_endpoint),
                ));
            }
        }
        if !(0.0..=1.0).contains(&t.sample_ratio) {
            return Err(err("tracing.sample_ratio", "must be between 0 and 1"));
        }
        if t.service_name.is_empty() {
            return Err(err("tracing.service_name", "must not be empty"));
        }
        if t.max_queued == 0 || t.max_queued > 1_000_000 {
            return Err(err("tracing.max_queued", "must be between 1 and 1000000"));
        }
        if t.export_timeout.is_zero() {
            return Err(err("tracing.export_timeout", "must be more than zero"));
        }
        Ok(())
    }

    /// SharedLimits limits: a lease must outlive a renewal round and a call's timeout.
    fn validate_redis(&self) -> Result<(), ConfigError> {
        let Some(r) = &self.redis else { return Ok(()) };
        if r.url_env.is_empty() {
            return Err(err("redis.url_env", "must name an environment variable"));
        }
        if r.namespace.is_empty() || r.namespace.contains(['{', '}']) {
            return Err(err(
                "redis.namespace",
                "must be non-empty and without braces (it becomes the keys' hash tag)",
            ));
        }
        if r.timeout.is_zero() || r.timeout > Duration::from_secs(1) {
            return Err(err(
                "redis.timeout",
                "must be above zero and at most 1s: requests wait on it",
            ));
        }
        if r.lease_ttl < Duration::from_secs(1) || r.lease_ttl < r.timeout * 10 {
            return Err(err(
                "redis.lease_ttl",
                "must be at least 1s and 10 × redis.timeout: leases are renewed every ttl/3",
            ));
        }
        if let Some(tls) = &r.tls
            && tls.cert_file.is_some() != tls.key_file.is_some()
        {
            return Err(err(
                "redis.tls",
                "cert_file and key_file go together (a client certificate and its key)",
            ));
        }
        if r.down_after < r.timeout || r.down_after > r.lease_ttl {
            return Err(err(
                "redis.down_after",
                "must be at least redis.timeout and at most redis.lease_ttl: leases must outlive an outage's detection",
            ));
        }
        for (i, route) in self.routes.iter().enumerate() {
            for (k, class) in route.classes.iter().enumerate() {
                if matches!(class.concurrency, Concurrency::Adaptive { .. }) {
                    return Err(err(
                        format!("routes[{i}].classes[{k}].concurrency"),
                        "an adaptive C is not shared through Redis yet: give a fixed C with redis",
                    ));
                }
            }
        }
        Ok(())
    }

    /// Teams: names, unique well-formed key digests, models that some route serves.
    fn validate_tenants(&mut self, models: &HashSet<String>) -> Result<(), ConfigError> {
        let mut keys = HashSet::new();
        for (i, tenant) in self.tenants.iter_mut().enumerate() {
            if tenant.team.is_empty() {
                return Err(err(format!("tenants[{i}].team"), "must not be empty"));
            }
            if !(tenant.weight.is_finite() && tenant.weight > 0.0 && tenant.weight <= 1e6) {
                return Err(err(
                    format!("tenants[{i}].weight"),
                    format!(
                        "must be a number above 0 (and at most 1000000), not {}",
                        tenant.weight
                    ),
                ));
            }
            if tenant.key_sha256.is_empty() {
                return Err(err(
                    format!("tenants[{i}].key_sha256"),
                    "at least one key hash is needed",
                ));
            }
            for (j, k) in tenant.key_sha256.iter_mut().enumerate() {
                *k = k.to_ascii_lowercase();
                if k.len() != 64 || !k.chars().all(|c| c.is_ascii_hexdigit()) {
                    return Err(err(
                        format!("tenants[{i}].key_sha256[{j}]"),
                        "must be 64 hex digits (sha256sum of the key)",
                    ));
                }
                if !keys.insert(k.clone()) {
                    return Err(err(
                        format!("tenants[{i}].key_sha256[{j}]"),
                        "this key belongs to two tenants",
                    ));
                }
            }
            for (j, m) in tenant.models.iter().enumerate() {
                if !models.contains(m) {
                    return Err(err(
                        format!("tenants[{i}].models[{j}]"),
                        format!("no route serves '{m}'"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The server's own limits and the admin listener.
    fn validate_listeners(&self) -> Result<(), ConfigError> {
        if self.server.max_body_bytes < 1024 {
            return Err(err("server.max_body_bytes", "must be at least 1024"));
        }
        if self.server.max_header_bytes < 1024 {
            return Err(err("server.max_header_bytes", "must be at least 1024"));
        }
        for (key, timeout) in [
            ("server.header_timeout", self.server.header_timeout),
            ("server.body_timeout", self.server.body_timeout),
            ("server.send_timeout", self.server.send_timeout),
        ] {
            if timeout.is_zero() {
                return Err(err(key, "must be more than zero"));
            }
            if timeout > Duration::from_secs(24 * 3600) {
                return Err(err(key, "must be at most 24h"));
            }
        }
        if self.server.max_connections == Some(0) {
            return Err(err("server.max_connections", "must be at least 1"));
        }
        if let Some(a) = &self.admin {
            // Port 0 asks for any free port: two of those never collide.
            if a.listen == self.listen && a.listen.port() != 0 {
                return Err(err(
                    "admin.listen",
                    format!(
                        "{} is also the public listener: the admin API needs its own",
                        a.listen
                    ),
                ));
            }
            if a.token_env.is_empty() {
                return Err(err(
                    "admin.token_env",
                    "name the environment variable holding the token",
                ));
            }
        }
        if let Some(p) = &self.endpoint_picker {
            let taken = [Some(self.listen), self.admin.as_ref().map(|a| a.listen)];
            if p.listen.port() != 0 && taken.contains(&Some(p.listen)) {
                return Err(err(
                    "endpoint_picker.listen",
                    format!(
                        "{} is taken by another listener: the picker needs its own",
                        p.listen
                    ),
                ));
            }
            if p.fallbacks > MAX_FALLBACKS {
                return Err(err(
                    "endpoint_picker.fallbacks",
                    format!("must be at most {MAX_FALLBACKS}"),
                ));
            }
        }
        if self.admin.is_none() && self.server.metrics == MetricsExposure::Admin {
            return Err(err(
                "server.metrics",
                "'admin' serves /metrics on the admin listener, but there is no admin section",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
