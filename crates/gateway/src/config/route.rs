//! The `routes` section: one public model, its replicas, budgets, retries, health checks, cost caps
//! and admission classes, and its validation.

use super::{ConfigError, err};
use serde::Deserialize;
use std::collections::HashSet;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

/// One public model name and the pool of replicas behind it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// The model name clients send.
    pub model: String,
    /// The model name sent upstream, when it differs.
    #[serde(default)]
    pub upstream_model: Option<String>,
    /// Base URLs of the replicas (`http://host:port` or `https://host:port`), each serving `/v1/...`.
    pub replicas: Vec<String>,
    /// The CA certificates (a PEM bundle) that `https://` replicas' certificates must chain to;
    /// absent: the Mozilla roots (webpki-roots).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    #[serde(default)]
    pub balance: Balance,
    /// Under `balance: slo`, how to pick while no prediction helps (no objective, a model
    /// warming up); any balancer but `slo`.
    #[serde(default)]
    pub slo_fallback: Balance,
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
    /// The agents' APIs (Responses, Messages): their sessions and background work.
    #[serde(default)]
    pub agents: AgentsConfig,
}

/// How a route serves agents: which headers name a session, and what a background request gets.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentsConfig {
    /// Request headers whose value names an agent's session, the first present taken: a session's
    /// turns go to one replica (its prefix cache holds the conversation) while it is healthy and
    /// not overloaded, as prefix affinity sends a shared prefix. Empty: no session affinity.
    pub session_headers: Vec<String>,
    /// Responses' `background: true`: the replica answers at once and generates with no client
    /// connected, which a slot released at the answer's end would let exceed C unseen. `refuse`
    /// (400 naming `background`), or `hold`: the slot is kept until the replica reports the
    /// response finished.
    pub background: Background,
}

impl Default for AgentsConfig {
    fn default() -> Self {
        AgentsConfig {
            session_headers: ["x-session-affinity", "session_id", "x-claude-code-session-id"]
                .map(String::from)
                .to_vec(),
            background: Background::Refuse,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Background {
    Refuse,
    /// The slot is held, and the response's `GET` asked every [`BACKGROUND_POLL`], until the
    /// replica reports it finished (or the route's total budget cancels it).
    Hold,
}

/// How often a held background response is asked whether it has finished.
pub const BACKGROUND_POLL: std::time::Duration = std::time::Duration::from_millis(250);

impl RouteConfig {
    /// The status of an overload refusal: `overflow_status`, which validation holds to 429 or 503.
    pub fn overflow(&self) -> axum::http::StatusCode {
        if self.overflow_status == 429 {
            axum::http::StatusCode::TOO_MANY_REQUESTS
        } else {
            axum::http::StatusCode::SERVICE_UNAVAILABLE
        }
    }
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
    /// Each request to the replica predicted to meet its own TTFT/TPOT objectives with the least
    /// headroom to spare, so tight requests keep the fast capacity (see `route::predict`).
    Slo,
}

impl Balance {
    /// As the configuration writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Balance::LeastOutstanding => "least_outstanding",
            Balance::P2c => "p2c",
            Balance::PrefixAffinity => "prefix_affinity",
            Balance::EngineAware => "engine_aware",
            Balance::Slo => "slo",
        }
    }
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
    /// How waiters of one priority share a contended class: `teams` (least attained service
    /// per weight first; the default when tenants are configured) or `fifo` (arrival order).
    #[serde(default)]
    pub fairness: Option<super::Fairness>,
}

/// A fixed C, or one that follows the measured time to first token (see [`admission::Admission::adapt`]).
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

/// One route's replicas, budgets, retries, health, caps and classes (its model is checked by the caller).
pub(super) fn validate_route(i: usize, route: &mut RouteConfig) -> Result<(), ConfigError> {
    let at = |field: &str| format!("routes[{i}].{field}");
    if route.replicas.is_empty() {
        return Err(err(at("replicas"), "at least one replica is needed"));
    }
    check_replicas(&mut route.replicas, &format!("routes[{i}].replicas"))?;
    if route.slo_fallback == Balance::Slo {
        return Err(err(
            at("slo_fallback"),
            "must be another balancer: least_outstanding, p2c, prefix_affinity or engine_aware",
        ));
    }
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
            fairness: None,
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
        if !matches!(parsed.scheme_str(), Some("http" | "https")) || parsed.host().is_none() {
            return Err(err(
                format!("{path}[{j}]"),
                format!("'{r}' must be http://host:port or https://host:port"),
            ));
        }
        *r = r.trim_end_matches('/').to_owned();
    }
    Ok(())
}
