//! The gateway's configuration: YAML in the shape of DESIGN §8, parsed strictly and validated once.
//!
//! `Config::from_yaml` → `validate` is the only way in, so a running gateway never holds a config
//! that breaks containment (`connect < first_token ≤ total`) or names a limit it cannot enforce.

use serde::Deserialize;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;
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
}

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
    /// Every Redis call gives up after this long, and the gateway falls back to its share.
    #[serde(default = "RedisConfig::default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// Keeps the keys of several deployments on one Redis apart.
    #[serde(default = "RedisConfig::default_namespace")]
    pub namespace: String,
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
        }
    }
}

/// One public model name and the pool of replicas behind it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// The model name clients send.
    pub model: String,
    /// The model name sent upstream, when it differs.
    #[serde(default)]
    pub upstream_model: Option<String>,
    /// Base URLs of the replicas (`http://host:port`), each serving `/v1/...`.
    pub replicas: Vec<String>,
    #[serde(default)]
    pub balance: Balance,
    #[serde(default)]
    pub limits: CostLimits,
    #[serde(default)]
    pub timeouts: Timeouts,
    /// 503 (the service's capacity, the default) or 429 for queue-full and queue-timeout rejections.
    #[serde(default = "default_overflow_status")]
    pub overflow_status: u16,
    /// A Hugging Face `tokenizer.json` for counting input tokens; without it, one token per 4 bytes.
    #[serde(default)]
    pub tokenizer: Option<PathBuf>,
    #[serde(default)]
    pub retry: RetryConfig,
    #[serde(default)]
    pub health: HealthConfig,
    #[serde(default)]
    pub outlier: OutlierConfig,
    #[serde(default)]
    pub redirect: Vec<Redirect>,
    /// Admission classes; the first is the default. Without any, one class `default` with C = 64,
    /// Q = 64, Wq = 2s (or half of `first_token`, if that is shorter).
    #[serde(default)]
    pub classes: Vec<ClassConfig>,
}

fn default_overflow_status() -> u16 {
    503
}

/// Retries, only before the first byte reaches the client and only for a connection failure or a
/// busy replica (429/503), on another replica, within a budget.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Upstream attempts per request at most, the first included (1: never retry).
    pub attempts: NonZeroU32,
    pub backoff: Backoff,
    pub budget: Budget,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            attempts: NonZeroU32::new(2).unwrap_or(NonZeroU32::MIN),
            backoff: Backoff::default(),
            budget: Budget::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Backoff {
    #[serde(with = "humantime_serde")]
    pub base: Duration,
    #[serde(with = "humantime_serde")]
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: Duration::from_millis(100),
            max: Duration::from_secs(1),
        }
    }
}

/// Retries over ten seconds ≤ `ratio` × requests + `min_per_second` × 10.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Budget {
    pub ratio: f64,
    pub min_per_second: u32,
}

impl Default for Budget {
    fn default() -> Self {
        Self {
            ratio: 0.1,
            min_per_second: 5,
        }
    }
}

/// Active health checks of each replica's `/health`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    pub enabled: bool,
    pub path: String,
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Consecutive failed probes that make a replica unhealthy.
    pub unhealthy_after: NonZeroU32,
    /// Consecutive good probes that make it healthy again.
    pub healthy_after: NonZeroU32,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            path: "/health".into(),
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            unhealthy_after: NonZeroU32::new(3).unwrap_or(NonZeroU32::MIN),
            healthy_after: NonZeroU32::new(2).unwrap_or(NonZeroU32::MIN),
        }
    }
}

/// Passive outlier ejection: a replica failing this many requests in a row (connect errors, 5xx
/// other than 503, first-token timeouts; never a busy 429/503 or a client's 4xx) leaves the route for
/// `base_ejection` × its number of ejections, at most `max_ejection`, while no more than
/// `max_ejected_percent` of the replicas (at least one) are out at once.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutlierConfig {
    pub consecutive_failures: NonZeroU32,
    #[serde(with = "humantime_serde")]
    pub base_ejection: Duration,
    #[serde(with = "humantime_serde")]
    pub max_ejection: Duration,
    pub max_ejected_percent: u32,
}

impl Default for OutlierConfig {
    fn default() -> Self {
        Self {
            consecutive_failures: NonZeroU32::new(5).unwrap_or(NonZeroU32::MIN),
            base_ejection: Duration::from_secs(30),
            max_ejection: Duration::from_secs(300),
            max_ejected_percent: 50,
        }
    }
}

/// How a replica is chosen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Balance {
    /// The replica with the fewest requests in flight through this gateway.
    #[default]
    LeastOutstanding,
    /// Power of two choices: the less loaded of two replicas drawn at random (scales to many
    /// replicas and many gateways without herding).
    P2c,
    /// Requests whose prompts share a prefix go to the same replica, for its prefix cache
    /// (rendezvous hashing), unless it carries well over the mean load (bounded load, ×1.25 + 1).
    PrefixAffinity,
    /// Prefers replicas whose own `/metrics` show few waiting requests and a cool KV cache (scraped
    /// about once a second); stale data falls back to least outstanding.
    EngineAware,
}

/// The cost one request may have (seed: "한 요청의 최대 비용을 제한한다").
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostLimits {
    #[serde(default)]
    pub max_input_tokens: Option<NonZeroU32>,
    #[serde(default)]
    pub max_tokens: MaxTokens,
    #[serde(default)]
    pub max_n: Option<NonZeroU32>,
    /// What to do with `max_tokens` over its cap: `reject` (400, the default) or `clamp` to the cap.
    #[serde(default)]
    pub over_cap: OverCap,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MaxTokens {
    /// Sent upstream when the request gives no `max_tokens`.
    #[serde(default)]
    pub default: Option<NonZeroU32>,
    #[serde(default)]
    pub cap: Option<NonZeroU32>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OverCap {
    #[default]
    Reject,
    Clamp,
}

/// The four nested budgets of one upstream call.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Timeouts {
    /// To open a connection to a replica.
    #[serde(with = "humantime_serde")]
    pub connect: Duration,
    /// From arrival to the first token: gateway queue + engine queue + prefill.
    #[serde(with = "humantime_serde")]
    pub first_token: Duration,
    /// The longest gap allowed between two chunks of a stream.
    #[serde(with = "humantime_serde")]
    pub stream_idle: Duration,
    /// From arrival to the last byte.
    #[serde(with = "humantime_serde")]
    pub total: Duration,
}

impl Default for Timeouts {
    /// Generous but finite: unlike Envoy's 15 s route timeout, never shorter than a long stream.
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(1),
            first_token: Duration::from_secs(30),
            stream_idle: Duration::from_secs(30),
            total: Duration::from_secs(600),
        }
    }
}

/// An admission class: its own C, Q and Wq, and the rule that puts requests in it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassConfig {
    pub name: String,
    #[serde(default)]
    pub when: Option<When>,
    /// C: requests in flight at most — a number, or `{ adaptive: { min, max } }`.
    pub concurrency: Concurrency,
    /// Q: requests waiting at most (0: never wait).
    pub queue: u32,
    /// Wq: the longest any request waits for a slot.
    #[serde(with = "humantime_serde")]
    pub queue_wait: Duration,
    #[serde(default)]
    pub slo: Option<Slo>,
    /// The class's own replicas (e.g. long requests on their own endpoints); default: the route's.
    #[serde(default)]
    pub replicas: Option<Vec<String>>,
}

/// A fixed C, or one that follows the measured time to first token (see [`crate::admission`]).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(try_from = "RawConcurrency")]
pub enum Concurrency {
    Fixed(NonZeroU32),
    Adaptive { adaptive: AdaptiveConfig },
}

/// What `concurrency:` may hold, read loosely so that a wrong value gets a message naming the
/// allowed ones instead of serde's "did not match any variant".
#[derive(Deserialize)]
#[serde(untagged)]
enum RawConcurrency {
    Fixed(u64),
    Adaptive { adaptive: AdaptiveConfig },
    Other(serde::de::IgnoredAny),
}

impl TryFrom<RawConcurrency> for Concurrency {
    type Error = String;

    fn try_from(raw: RawConcurrency) -> Result<Self, String> {
        const ALLOWED: &str =
            "a number of requests from 1 up, or { adaptive: { min, max } } with min and max from 1 up";
        match raw {
            RawConcurrency::Fixed(n) => u32::try_from(n)
                .ok()
                .and_then(NonZeroU32::new)
                .map(Concurrency::Fixed)
                .ok_or_else(|| format!("{n} is not allowed: use {ALLOWED}")),
            RawConcurrency::Adaptive { adaptive } => Ok(Concurrency::Adaptive { adaptive }),
            RawConcurrency::Other(_) => Err(format!("use {ALLOWED}")),
        }
    }
}

impl Concurrency {
    /// The limit to start with: the fixed value, or the adaptive `initial` (default: `min`).
    pub fn initial(&self) -> u32 {
        match self {
            Concurrency::Fixed(n) => n.get(),
            Concurrency::Adaptive { adaptive } => adaptive.initial.unwrap_or(adaptive.min).get(),
        }
    }
}

impl std::fmt::Display for Concurrency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Concurrency::Fixed(n) => write!(f, "{n}"),
            Concurrency::Adaptive { adaptive: a } => write!(f, "adaptive {}–{}", a.min, a.max),
        }
    }
}

/// Bounds and pace of an adaptive C.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdaptiveConfig {
    pub min: NonZeroU32,
    pub max: NonZeroU32,
    #[serde(default)]
    pub initial: Option<NonZeroU32>,
    /// How often the limit is reconsidered.
    #[serde(default = "default_adapt_interval", with = "humantime_serde")]
    pub interval: Duration,
}

fn default_adapt_interval() -> Duration {
    Duration::from_secs(1)
}

/// A request belongs to the class if any condition given holds.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct When {
    #[serde(default)]
    pub max_tokens_over: Option<u32>,
    #[serde(default)]
    pub input_tokens_over: Option<u32>,
    /// Only requests that state their `max_tokens` can match this.
    #[serde(default)]
    pub max_tokens_under: Option<u32>,
    #[serde(default)]
    pub input_tokens_under: Option<u32>,
    #[serde(default)]
    pub header: Option<HeaderMatch>,
}

impl When {
    /// True if any condition given holds for the request.
    pub fn matches(
        &self,
        max_tokens: Option<u32>,
        input_tokens: u32,
        headers: &axum::http::HeaderMap,
    ) -> bool {
        self.max_tokens_over
            .zip(max_tokens)
            .is_some_and(|(limit, m)| m > limit)
            || self
                .max_tokens_under
                .zip(max_tokens)
                .is_some_and(|(limit, m)| m < limit)
            || self.input_tokens_over.is_some_and(|limit| input_tokens > limit)
            || self.input_tokens_under.is_some_and(|limit| input_tokens < limit)
            || self.header.as_ref().is_some_and(|h| {
                headers.get(h.name.as_str()).and_then(|v| v.to_str().ok()) == Some(h.value.as_str())
            })
    }
}

/// A routing rule: requests matching `when` go to the route `to` instead (one hop; the target's
/// own rules do not apply), e.g. short, simple requests to a smaller model.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Redirect {
    pub when: When,
    pub to: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderMatch {
    pub name: String,
    pub value: String,
}

/// The class's latency objective; requests inside it count as goodput.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Slo {
    #[serde(default, with = "humantime_serde")]
    pub ttft: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub itl: Option<Duration>,
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
}

/// Queue priority lives with the admission gate that orders by it.
pub use admission::Priority;

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
            let inner = e.into_inner().to_string();
            err(if path == "." { "config".into() } else { path }, inner)
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

    /// Shared limits: a lease must outlive a renewal round and a call's timeout.
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
        } else if self.server.metrics == MetricsExposure::Admin {
            return Err(err(
                "server.metrics",
                "'admin' serves /metrics on the admin listener, but there is no admin section",
            ));
        }
        Ok(())
    }
}

/// One route's replicas, budgets, retries, health, caps and classes (its model is checked by the caller).
fn validate_route(i: usize, route: &mut RouteConfig) -> Result<(), ConfigError> {
    let at = |field: &str| format!("routes[{i}].{field}");
    if route.replicas.is_empty() {
        return Err(err(at("replicas"), "at least one replica is needed"));
    }
    check_replicas(&mut route.replicas, &format!("routes[{i}].replicas"))?;
    for (k, class) in route.classes.iter_mut().enumerate() {
        if let Some(list) = class.replicas.as_mut() {
            if list.is_empty() {
                return Err(err(
                    format!("routes[{i}].classes[{k}].replicas"),
                    "leave it out, or name at least one",
                ));
            }
            check_replicas(list, &format!("routes[{i}].classes[{k}].replicas"))?;
        }
    }
    let t = route.timeouts;
    if t.connect.is_zero() || t.first_token.is_zero() || t.stream_idle.is_zero() || t.total.is_zero() {
        return Err(err(at("timeouts"), "every timeout must be more than zero"));
    }
    if t.connect >= t.first_token {
        return Err(err(
            at("timeouts"),
            format!(
                "connect ({:?}) must be less than first_token ({:?})",
                t.connect, t.first_token
            ),
        ));
    }
    if t.first_token > t.total {
        return Err(err(
            at("timeouts"),
            format!(
                "first_token ({:?}) must not exceed total ({:?})",
                t.first_token, t.total
            ),
        ));
    }
    if t.stream_idle > t.total {
        return Err(err(
            at("timeouts"),
            format!(
                "stream_idle ({:?}) must not exceed total ({:?})",
                t.stream_idle, t.total
            ),
        ));
    }
    let b = route.retry.budget;
    if !(b.ratio.is_finite() && (0.0..=1.0).contains(&b.ratio)) {
        return Err(err(
            at("retry.budget.ratio"),
            format!("must be between 0 and 1, not {}", b.ratio),
        ));
    }
    if route.retry.backoff.base > route.retry.backoff.max {
        return Err(err(at("retry.backoff"), "base must not exceed max"));
    }
    let o = route.outlier;
    if o.max_ejected_percent > 100 || o.base_ejection > o.max_ejection {
        return Err(err(
            at("outlier"),
            "max_ejected_percent is 0–100 and base_ejection ≤ max_ejection",
        ));
    }
    let h = &route.health;
    if h.enabled && (h.interval.is_zero() || h.timeout.is_zero() || h.timeout > h.interval) {
        return Err(err(
            at("health"),
            "interval and timeout must be above zero, timeout ≤ interval",
        ));
    }
    if !h.path.starts_with('/') {
        return Err(err(at("health.path"), "must start with '/'"));
    }
    if route.overflow_status != 503 && route.overflow_status != 429 {
        return Err(err(
            at("overflow_status"),
            format!("must be 503 or 429, not {}", route.overflow_status),
        ));
    }
    if let (Some(d), Some(c)) = (route.limits.max_tokens.default, route.limits.max_tokens.cap)
        && d > c
    {
        return Err(err(
            at("limits.max_tokens"),
            format!("default ({d}) exceeds cap ({c})"),
        ));
    }
    if route.classes.is_empty() {
        route.classes.push(ClassConfig {
            name: "default".into(),
            when: None,
            concurrency: Concurrency::Fixed(NonZeroU32::new(64).unwrap_or(NonZeroU32::MIN)),
            queue: 64,
            // Never longer than half the first-token budget the queue sits inside.
            queue_wait: Duration::from_secs(2).min(t.first_token / 2),
            slo: None,
            replicas: None,
        });
    }
    let mut names = HashSet::new();
    for (k, class) in route.classes.iter().enumerate() {
        let at = |field: &str| format!("routes[{i}].classes[{k}].{field}");
        if class.name.is_empty()
            || !class
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(err(at("name"), "use letters, digits, '-' and '_'"));
        }
        if !names.insert(class.name.clone()) {
            return Err(err(at("name"), format!("'{}' appears twice", class.name)));
        }
        if k == 0 && class.when.is_some() {
            return Err(err(
                at("when"),
                "the first class is the default and takes no 'when'",
            ));
        }
        if k > 0 && class.when.as_ref().is_none_or(|w| *w == When::default()) {
            return Err(err(at("when"), "every class after the first needs a rule"));
        }
        if let Concurrency::Adaptive { adaptive: a } = class.concurrency {
            if a.min > a.max || a.initial.is_some_and(|i| i < a.min || i > a.max) || a.interval.is_zero() {
                return Err(err(
                    at("concurrency.adaptive"),
                    "needs min ≤ initial ≤ max and an interval above zero",
                ));
            }
            if class.slo.and_then(|s| s.ttft).is_none() {
                return Err(err(
                    at("slo.ttft"),
                    "an adaptive concurrency follows the TTFT objective: set slo.ttft",
                ));
            }
        }
        if class.queue > 0 && class.queue_wait.is_zero() {
            return Err(err(
                at("queue_wait"),
                "a class with a queue needs a queue_wait above zero",
            ));
        }
        if class.queue_wait >= t.first_token {
            return Err(err(
                at("queue_wait"),
                format!(
                    "{:?} must be less than the route's first_token budget ({:?}): the queue is inside it",
                    class.queue_wait, t.first_token
                ),
            ));
        }
    }
    Ok(())
}
/// Replica base URLs must be plain `http://host:port`; a trailing slash is dropped.
fn check_replicas(list: &mut [String], path: &str) -> Result<(), ConfigError> {
    for (j, r) in list.iter_mut().enumerate() {
        let parsed: hyper::Uri = r
            .parse()
            .map_err(|e| err(format!("{path}[{j}]"), format!("'{r}' is not a URL: {e}")))?;
        if parsed.scheme_str() != Some("http") || parsed.authority().is_none() {
            return Err(err(
                format!("{path}[{j}]"),
                format!("'{r}' must be http://host:port (TLS to replicas is not supported yet)"),
            ));
        }
        *r = r.trim_end_matches('/').to_owned();
    }
    Ok(())
}

#[cfg(test)]
mod tests;
