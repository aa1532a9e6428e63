//! The process-wide sections: `server` (the HTTP server's own limits and the drain), `admin`,
//! `redis` (limits shared by several gateways) and `tracing`.

use super::{ConfigError, err};
use serde::Deserialize;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

/// Where and how much to trace. Spans leave through a bounded queue on an exporter thread: a slow
/// or absent collector costs dropped spans (counted), never a slower request.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TracingConfig {
    /// The collector's OTLP/HTTP base URL (`http://collector:4318`); `/v1/traces` is appended
    /// unless the URL already ends with it. Plain HTTP: put a collector beside the gateway for TLS.
    pub otlp_endpoint: String,
    /// The share of traces started here that are recorded (0–1); a caller's sampled flag wins.
    #[serde(default = "TracingConfig::default_sample_ratio")]
    pub sample_ratio: f64,
    /// `service.name` of the spans.
    #[serde(default = "TracingConfig::default_service_name")]
    pub service_name: String,
    /// Finished requests waiting for the exporter at most; beyond it their spans are dropped.
    #[serde(default = "TracingConfig::default_max_queued")]
    pub max_queued: usize,
    /// One export call gives up after this long, and its spans count as dropped.
    #[serde(default = "TracingConfig::default_export_timeout", with = "humantime_serde")]
    pub export_timeout: Duration,
}

impl TracingConfig {
    fn default_sample_ratio() -> f64 {
        1.0
    }
    fn default_service_name() -> String {
        "spillway".into()
    }
    fn default_max_queued() -> usize {
        2048
    }
    fn default_export_timeout() -> Duration {
        Duration::from_secs(10)
    }

    /// The URL spans are posted to.
    pub fn traces_url(&self) -> String {
        let base = self.otlp_endpoint.trim_end_matches('/');
        if base.ends_with("/v1/traces") {
            base.to_owned()
        } else {
            format!("{base}/v1/traces")
        }
    }
}

/// The endpoint picker's gRPC listener (`ext_proc` and `grpc.health.v1`, plaintext HTTP/2).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointPickerConfig {
    pub listen: SocketAddr,
    /// Endpoints named after the first, for Envoy to retry on in order.
    #[serde(default = "one_fallback")]
    pub fallbacks: u8,
    /// TLS on the picker's port (several Gateways connect to a picker only over TLS, without
    /// checking its certificate); absent: plaintext HTTP/2.
    #[serde(default)]
    pub tls: Option<PickerTls>,
}

/// The picker's certificate: files, or `self_signed` (one made at start).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum PickerTls {
    Files(TlsConfig),
    Made(SelfSigned),
}

/// `tls: self_signed`.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SelfSigned {
    SelfSigned,
}

fn one_fallback() -> u8 {
    1
}

/// More fallbacks than this only lengthen every answer: Envoy's retries stop well before.
pub const MAX_FALLBACKS: u8 = 8;

/// One set of limits for every gateway of a deployment: C, Q and team quotas are kept in Redis,
/// and each gateway falls back to its share of them (limit ÷ `gateways`) while Redis is out.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    /// The environment variable holding the URL (`redis://[:password@]host:port[/db]`), so that a
    /// password never sits in the file.
    #[serde(default = "RedisConfig::default_url_env")]
    pub url_env: String,
    /// How many gateways share the limits: while Redis is unreachable each enforces 1/gateways.
    pub gateways: NonZeroU32,
    /// A slot held by a gateway that stops renewing it (it died) is free again after this long.
    #[serde(default = "RedisConfig::default_lease_ttl", with = "humantime_serde")]
    pub lease_ttl: Duration,
    /// A call slower than this is late (counted and logged): Redis is slow, not down. A request
    /// waits for Redis its queue budget, at least this long, and is then served on the share.
    #[serde(default = "RedisConfig::default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// Redis is down, and the gateway turns to its share, when it has not answered for this long
    /// (or calls failed for this long); it is up again, and limits shared, when it has answered
    /// for this long: hysteresis, so that a slow Redis does not flap the fleet.
    #[serde(default = "RedisConfig::default_down_after", with = "humantime_serde")]
    pub down_after: Duration,
    /// Keeps the keys of several deployments on one Redis apart.
    #[serde(default = "RedisConfig::default_namespace")]
    pub namespace: String,
    /// The environment variable holding Redis's password (AUTH), where it is not in the URL.
    #[serde(default)]
    pub password_env: Option<String>,
    /// With a `redis+sentinel://` URL: the environment variable holding the sentinels' own
    /// password, where they ask for one (`requirepass` in sentinel.conf).
    #[serde(default)]
    pub sentinel_password_env: Option<String>,
    /// For a `rediss://` URL: the CA to trust instead of the system's, and a client certificate.
    #[serde(default)]
    pub tls: Option<RedisTls>,
}

/// TLS to Redis (`rediss://`): PEM files, read at start.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisTls {
    /// The CA certificate(s) the server's certificate must chain to (default: the system's).
    pub ca_file: Option<std::path::PathBuf>,
    /// This gateway's certificate, where Redis asks for one (`tls-auth-clients`).
    pub cert_file: Option<std::path::PathBuf>,
    /// The key of `cert_file`.
    pub key_file: Option<std::path::PathBuf>,
}

impl RedisConfig {
    fn default_url_env() -> String {
        "SPILLWAY_REDIS_URL".into()
    }
    fn default_lease_ttl() -> Duration {
        Duration::from_secs(10)
    }
    fn default_timeout() -> Duration {
        Duration::from_millis(100)
    }
    fn default_down_after() -> Duration {
        Duration::from_secs(1)
    }
    fn default_namespace() -> String {
        "spillway".into()
    }

    /// The Redis URL, read through `env`.
    pub fn url(&self, env: &dyn Fn(&str) -> Option<String>) -> Result<String, ConfigError> {
        env(&self.url_env).filter(|u| !u.is_empty()).ok_or_else(|| {
            err(
                "redis.url_env",
                format!(
                    "the environment variable {} holding the Redis URL is not set",
                    self.url_env
                ),
            )
        })
    }

    /// Redis's password, read through `env` from `password_env`, if set.
    pub fn password(&self, env: &dyn Fn(&str) -> Option<String>) -> Result<Option<String>, ConfigError> {
        secret(
            env,
            "redis.password_env",
            self.password_env.as_deref(),
            "Redis's password",
        )
    }

    /// The sentinels' password, read through `env` from `sentinel_password_env`, if set.
    pub fn sentinel_password(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<String>, ConfigError> {
        secret(
            env,
            "redis.sentinel_password_env",
            self.sentinel_password_env.as_deref(),
            "the sentinels' password",
        )
    }

    /// This gateway's share of a limit while Redis is unreachable: limit ÷ gateways, at least 1
    /// (a limit of 0 stays 0).
    pub fn share(&self, limit: u32) -> u32 {
        if limit == 0 {
            0
        } else {
            (limit / self.gateways.get()).max(1)
        }
    }
}

/// A secret from the environment variable named at `field`, if one is named; an error (that
/// names the variable, never its value) if it is named but unset or empty.
fn secret(
    env: &dyn Fn(&str) -> Option<String>,
    field: &str,
    var: Option<&str>,
    what: &str,
) -> Result<Option<String>, ConfigError> {
    let Some(var) = var else { return Ok(None) };
    env(var).filter(|p| !p.is_empty()).map(Some).ok_or_else(|| {
        err(
            field,
            format!("the environment variable {var} holding {what} is not set"),
        )
    })
}

/// The admin API: state, drain/undrain a replica, reload. Bearer-token protected; the token comes
/// from the environment variable named here, never from the file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    pub listen: SocketAddr,
    pub token_env: String,
    /// Who holds the token, as the audit log names them (default: `token_env`); never the token.
    #[serde(default)]
    pub name: Option<String>,
}

/// An admin token shorter than this is refused: the admin API can drain replicas and reload.
pub const MIN_ADMIN_TOKEN: usize = 16;

impl AdminConfig {
    /// The name audit events give changes made with this token.
    pub fn actor(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.token_env)
    }

    /// The admin token, read through `env`: it must be set and at least [`MIN_ADMIN_TOKEN`] long.
    pub fn token(&self, env: &dyn Fn(&str) -> Option<String>) -> Result<String, ConfigError> {
        match env(&self.token_env) {
            None => Err(err(
                "admin.token_env",
                format!(
                    "the environment variable {} holding the admin token is not set",
                    self.token_env
                ),
            )),
            Some(t) if t.chars().count() < MIN_ADMIN_TOKEN => Err(err(
                "admin.token_env",
                format!(
                    "the admin token in {} is {} characters; use at least {MIN_ADMIN_TOKEN}",
                    self.token_env,
                    t.chars().count()
                ),
            )),
            Some(t) => Ok(t),
        }
    }
}

/// Where `/metrics` is served.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetricsExposure {
    /// On the public listener (and the admin one, if any).
    #[default]
    Public,
    /// Only on the admin listener, for deployments whose clients must not read the gateway's state.
    Admin,
}

/// Which HTTP/1.1 server serves the public port's client connections.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Http1 {
    /// The gateway's own for the completion requests that make up the hot path (`front`), hyper
    /// for everything else.
    #[default]
    Fast,
    /// hyper for every request: the well-kept server, should the gateway's own misbehave.
    Hyper,
}

/// TLS on the public listener: a certificate chain and its private key, PEM files read at start
/// and again on SIGHUP or a reload (a file that cannot be used then leaves the old pair in force).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// The certificate chain, leaf first (`tls.crt` of a Kubernetes TLS secret).
    pub cert: std::path::PathBuf,
    /// Its private key: PKCS#8, PKCS#1 (RSA) or SEC1 (EC) (`tls.key`).
    pub key: std::path::PathBuf,
}

/// Limits of the HTTP server itself.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Request bodies above this are answered 413 without being read further.
    pub max_body_bytes: usize,
    /// After SIGTERM, how long `/ready` fails and new requests get 503 while the listener stays
    /// open, so that load balancers stop sending before connections are refused.
    #[serde(with = "humantime_serde")]
    pub drain_delay: Duration,
    /// Then how long in-flight streams may run before the process exits anyway.
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// Write one JSON access-log line per request to standard output.
    pub access_log: bool,
    /// A connection must deliver a complete request head within this long of connecting or of
    /// its previous response; a slow or idle keep-alive connection is closed when it runs out
    /// (nginx's `client_header_timeout` and `keepalive_timeout`, Envoy's `request_headers_timeout`).
    #[serde(with = "humantime_serde")]
    pub header_timeout: Duration,
    /// The whole request body must arrive within this long of its head (nginx's
    /// `client_body_timeout`); past it the request gets 408.
    #[serde(with = "humantime_serde")]
    pub body_timeout: Duration,
    /// A write to a client that blocks (its window and the socket's buffer full) must be unblocked
    /// by the client reading within this long (nginx's `send_timeout`); one that stops reading is
    /// cut, so that it cannot hold its slot and its replica's stream for ever. On HTTP/2, where one
    /// stream's window can shut while the socket never blocks, it bounds each chunk's wait instead
    /// (`relay::detached`).
    #[serde(with = "humantime_serde")]
    pub send_timeout: Duration,
    /// Client connections held at most; more are answered 503 (`/health`, `/ready` and `/metrics`
    /// still answered) and closed. Default: derived from the open-files limit, leaving room for
    /// one upstream connection per client connection and a reserve.
    pub max_connections: Option<usize>,
    /// Request heads larger than this get 431.
    pub max_header_bytes: usize,
    /// `public` (default) or `admin`: where `/metrics` is served.
    pub metrics: MetricsExposure,
    /// `fast` (default) or `hyper`: which HTTP/1.1 server parses client requests.
    pub http1: Http1,
    /// A replica's whole answer (not a stream: each event of those has its own bound) is read
    /// up to this many bytes; a larger one gets 502 `upstream_response_too_large`.
    pub max_response_bytes: usize,
    /// TLS on the public listener (HTTP/1.1 and h2 by ALPN); absent: plain HTTP. The admin
    /// listener stays plain HTTP.
    pub tls: Option<TlsConfig>,
}

impl ServerConfig {
    /// The most a request head may take before the HTTP server answers 431 itself: heads a little
    /// over `max_header_bytes` get the gateway's own 431, in the OpenAI shape, from the request path.
    pub(crate) fn max_head_buffer(&self) -> usize {
        (self.max_header_bytes * 4).max(16 * 1024)
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: 4 * 1024 * 1024,
            drain_delay: Duration::from_secs(2),
            drain_timeout: Duration::from_secs(30),
            access_log: true,
            header_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(30),
            send_timeout: Duration::from_secs(60),
            max_connections: None,
            max_header_bytes: 32 * 1024,
            metrics: MetricsExposure::Public,
            http1: Http1::Fast,
            max_response_bytes: 16 * 1024 * 1024,
            tls: None,
        }
    }
}
