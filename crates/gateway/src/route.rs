//! A route at run time: its classes with their admission gates, its replicas, its tokenizer and its
//! upstream client.

use crate::admission::{AdaptiveLimits, Admission, Limits};
use crate::config::{Balance, ClassConfig, Concurrency, RouteConfig};
use crate::metrics::{ClassSeries, Metrics};
use axum::http::HeaderMap;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use prometheus::{IntCounter, IntGauge};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;
use tokenize::Tokenizer;
use tokio::time::Instant;

pub type UpstreamClient = Client<HttpConnector, Full<Bytes>>;

/// One admission class of a route.
pub struct Class {
    pub config: ClassConfig,
    pub admission: Arc<Admission>,
    pub series: ClassSeries,
    /// `spillway_concurrency_limit` of this class, which an adaptive C moves.
    pub limit_gauge: IntGauge,
    /// Indices into the route's replicas that this class may use.
    pub pool: Vec<usize>,
}

/// One upstream replica and its live request count.
pub struct Replica {
    pub url: String,
    /// The last attempt to reach it failed to connect (cleared by any answer). Passive only:
    /// active health probes and ejection come with the resilience work.
    pub unreachable: AtomicBool,
    /// Set by the active health checks; only healthy replicas are picked.
    pub healthy: AtomicBool,
    /// Set by an operator through the admin API: no new requests, in-flight ones finish.
    pub drained: AtomicBool,
    /// The last scrape of the engine's own metrics: (when, waiting requests, KV-cache usage).
    engine_load: std::sync::Mutex<Option<(Instant, f64, f64)>>,
    /// Failures in a row, for outlier ejection.
    consecutive_failures: AtomicU32,
    ejections: AtomicU32,
    ejected_until: std::sync::Mutex<Option<Instant>>,
    ejected_gauge: IntGauge,
    ejections_total: IntCounter,
    healthy_gauge: IntGauge,
    outstanding: AtomicU32,
    gauge: IntGauge,
    pub ok: IntCounter,
    pub errors: IntCounter,
    pub timeouts: IntCounter,
    pub busy: IntCounter,
}

/// Holds a replica's outstanding count up while a request uses it.
pub struct ReplicaGuard {
    pub replica: Arc<Replica>,
    /// The replica's position in the route, for excluding it from a retry.
    pub index: usize,
}

/// Rendezvous (highest random weight) hashing: the replica with the highest weight for a key keeps
/// it while replicas come and go, and no ring is needed.
fn rendezvous(key: u64, replica: &str) -> u64 {
    let mut h = key ^ 0x9e37_79b9_7f4a_7c15;
    for b in replica.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

/// `vllm:num_requests_waiting` (summed over engines) and `vllm:kv_cache_usage_perc` (the highest)
/// from a Prometheus text exposition; `None` if the waiting count is missing.
pub fn parse_engine_load(text: &str) -> Option<(f64, f64)> {
    let waiting = protocol::prom::sum(text, "vllm:num_requests_waiting")?;
    let kv = ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"]
        .into_iter()
        .filter_map(|name| protocol::prom::max(text, name))
        .fold(0.0, f64::max);
    Some((waiting, kv))
}

impl Replica {
    /// The engine-aware score (lower is better): this gateway's live in-flight count, plus twice the
    /// requests the engine reported waiting, plus four times its KV-cache usage; `None` when the
    /// scrape is over 3 s old. The live count keeps a once-a-second report from herding every
    /// request onto whichever replica looked best at the last scrape.
    fn engine_score(&self, now: Instant, outstanding: u32) -> Option<f64> {
        let (at, waiting, kv) = (*self.engine_load.lock().unwrap_or_else(|e| e.into_inner()))?;
        (now.saturating_duration_since(at) < Duration::from_secs(3))
            .then(|| f64::from(outstanding) + 2.0 * waiting + 4.0 * kv)
    }

    pub fn is_ejected(&self, now: Instant) -> bool {
        self.ejected_until
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|t| now < t)
    }

    /// Whether requests may go here: healthy and not ejected.
    fn eligible(&self, now: Instant) -> bool {
        self.healthy.load(Ordering::Relaxed) && !self.drained.load(Ordering::Relaxed) && !self.is_ejected(now)
    }

    /// The replica's state for the admin view.
    pub fn state(&self) -> serde_json::Value {
        serde_json::json!({
            "url": self.url,
            "healthy": self.healthy.load(Ordering::Relaxed),
            "drained": self.drained.load(Ordering::Relaxed),
            "ejected": self.is_ejected(Instant::now()),
            "reachable": !self.unreachable.load(Ordering::Relaxed),
            "outstanding": self.outstanding.load(Ordering::Relaxed),
        })
    }

    fn set_healthy(&self, healthy: bool) {
        self.healthy.store(healthy, Ordering::Relaxed);
        self.healthy_gauge.set(i64::from(healthy));
    }
}

impl Drop for ReplicaGuard {
    fn drop(&mut self) {
        self.replica.outstanding.fetch_sub(1, Ordering::Relaxed);
        self.replica.gauge.dec();
    }
}

pub struct Route {
    pub config: RouteConfig,
    pub classes: Vec<Class>,
    pub replicas: Vec<Arc<Replica>>,
    pub tokenizer: Tokenizer,
    pub client: UpstreamClient,
    /// Set when the route renames the model upstream.
    pub rename: Option<crate::relay::Rename>,
    pub budget: crate::retry::RetryBudget,
    pub retries: IntCounter,
    pub retry_budget_exhausted: IntCounter,
    next: AtomicUsize,
}

impl Route {
    /// Builds a route; on a reload, `previous` (the route of the same model) hands over its live
    /// state: each class keeps its admission gate (with the new limits) and each replica that stays
    /// keeps its health, ejection and in-flight count.
    pub fn new(config: RouteConfig, metrics: &Metrics, previous: Option<&Route>) -> Result<Route, String> {
        let tokenizer = match &config.tokenizer {
            Some(path) => Tokenizer::from_file(path)?,
            None => Tokenizer::Estimate,
        };
        // Every replica of the route or of one of its classes, each once.
        let mut urls = config.replicas.clone();
        for url in config.classes.iter().flat_map(|c| c.replicas.iter().flatten()) {
            if !urls.contains(url) {
                urls.push(url.clone());
            }
        }
        let pool_of = |c: &ClassConfig| -> Vec<usize> {
            match &c.replicas {
                Some(list) => list
                    .iter()
                    .filter_map(|u| urls.iter().position(|x| x == u))
                    .collect(),
                None => (0..config.replicas.len()).collect(),
            }
        };
        let classes = config
            .classes
            .iter()
            .map(|c| {
                let labels = [config.model.as_str(), c.name.as_str()];
                let limit_gauge = metrics.concurrency_limit.with_label_values(&labels);
                metrics
                    .queue_limit
                    .with_label_values(&labels)
                    .set(i64::from(c.queue));
                let kept = previous.and_then(|p| p.classes.iter().find(|k| k.config.name == c.name));
                let adaptive = match c.concurrency {
                    Concurrency::Fixed(_) => None,
                    Concurrency::Adaptive { adaptive: a } => Some(AdaptiveLimits {
                        min: a.min.get(),
                        max: a.max.get(),
                        slo: c.slo.and_then(|s| s.ttft).unwrap_or(Duration::from_secs(1)),
                    }),
                };
                // An adaptive C that stays adaptive keeps what it has learned across a reload.
                let concurrency = match (kept, adaptive) {
                    (Some(k), Some(_)) if matches!(k.config.concurrency, Concurrency::Adaptive { .. }) => {
                        k.admission.limits().concurrency
                    }
                    _ => c.concurrency.initial(),
                };
                let limits = Limits {
                    concurrency,
                    queue: c.queue,
                    queue_wait: c.queue_wait,
                };
                let admission = match kept {
                    Some(k) => {
                        k.admission.set_limits(limits);
                        k.admission.clone()
                    }
                    None => Admission::new(limits),
                };
                admission.set_adaptive(adaptive);
                limit_gauge.set(i64::from(admission.limits().concurrency));
                Class {
                    pool: pool_of(c),
                    config: c.clone(),
                    admission,
                    limit_gauge,
                    series: metrics.class_series(&config.model, &c.name),
                }
            })
            .collect();
        let replicas = urls
            .iter()
            .map(|url| {
                if let Some(kept) = previous.and_then(|p| p.replicas.iter().find(|r| &r.url == url)) {
                    return kept.clone();
                }
                let labels = |result: &str| {
                    metrics
                        .upstream
                        .with_label_values(&[config.model.as_str(), url, result])
                };
                Arc::new(Replica {
                    url: url.clone(),
                    unreachable: AtomicBool::new(false),
                    healthy: AtomicBool::new(true),
                    drained: AtomicBool::new(false),
                    engine_load: std::sync::Mutex::new(None),
                    consecutive_failures: AtomicU32::new(0),
                    ejections: AtomicU32::new(0),
                    ejected_until: std::sync::Mutex::new(None),
                    ejected_gauge: metrics
                        .replica_ejected
                        .with_label_values(&[config.model.as_str(), url]),
                    ejections_total: metrics.ejections.with_label_values(&[config.model.as_str(), url]),
                    healthy_gauge: {
                        let g = metrics
                            .replica_healthy
                            .with_label_values(&[config.model.as_str(), url]);
                        g.set(1);
                        g
                    },
                    outstanding: AtomicU32::new(0),
                    gauge: metrics
                        .replica_outstanding
                        .with_label_values(&[config.model.as_str(), url]),
                    ok: labels("ok"),
                    errors: labels("error"),
                    timeouts: labels("timeout"),
                    busy: labels("busy"),
                })
            })
            .collect();
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(config.timeouts.connect));
        connector.set_nodelay(true);
        // SSE chunks are a few hundred bytes: a small fixed read buffer per upstream connection
        // keeps memory per stream down (hyper would start at 8 KiB and grow).
        let client = Client::builder(TokioExecutor::new())
            .http1_read_buf_exact_size(4096)
            .build(connector);
        let rename = config
            .upstream_model
            .as_deref()
            .filter(|u| *u != config.model)
            .map(|u| crate::relay::Rename::new(u, &config.model));
        Ok(Route {
            budget: crate::retry::RetryBudget::new(
                config.retry.budget.ratio,
                config.retry.budget.min_per_second,
            ),
            retries: metrics.retries.with_label_values(&[config.model.as_str()]),
            retry_budget_exhausted: metrics
                .retry_budget_exhausted
                .with_label_values(&[config.model.as_str()]),
            rename,
            config,
            classes,
            replicas,
            tokenizer,
            client,
            next: AtomicUsize::new(0),
        })
    }

    /// Whether some replica of this route is healthy and answered its last connection attempt.
    pub fn has_reachable_replica(&self) -> bool {
        self.replicas
            .iter()
            .any(|r| r.eligible(Instant::now()) && !r.unreachable.load(Ordering::Relaxed))
    }

    /// The class a request belongs to: the first rule that matches after the default, else the default.
    pub fn classify(&self, max_tokens: Option<u32>, input_tokens: u32, headers: &HeaderMap) -> &Class {
        self.classes[1..]
            .iter()
            .find(|c| {
                c.config
                    .when
                    .as_ref()
                    .is_some_and(|w| w.matches(max_tokens, input_tokens, headers))
            })
            .unwrap_or(&self.classes[0])
    }

    /// The route a routing rule sends this request to, if any.
    pub fn redirect(&self, max_tokens: Option<u32>, input_tokens: u32, headers: &HeaderMap) -> Option<&str> {
        self.config
            .redirect
            .iter()
            .find(|r| r.when.matches(max_tokens, input_tokens, headers))
            .map(|r| r.to.as_str())
    }

    /// An eligible replica (healthy, not drained, not ejected) of `pool` (a class's replicas) not
    /// in `tried`, by the route's balancer; `None` when none is left.
    pub fn pick(&self, pool: &[usize], tried: &[usize], prefix_key: u64) -> Option<ReplicaGuard> {
        let now = Instant::now();
        let n = pool.len().max(1);
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        let eligible: Vec<usize> = (0..pool.len())
            .map(|k| pool[(start + k) % n])
            .filter(|i| !tried.contains(i) && self.replicas[*i].eligible(now))
            .collect();
        let load = |i: &usize| self.replicas[*i].outstanding.load(Ordering::Relaxed);
        let least = || eligible.iter().copied().min_by_key(load);
        let index = match self.config.balance {
            Balance::LeastOutstanding => least(),
            Balance::P2c => match eligible.len() {
                0 | 1 => eligible.first().copied(),
                len => {
                    let a = rand::random_range(0..len);
                    let b = (a + 1 + rand::random_range(0..len - 1)) % len;
                    let (a, b) = (eligible[a], eligible[b]);
                    Some(if load(&b) < load(&a) { b } else { a })
                }
            },
            Balance::PrefixAffinity => {
                let total: u32 = eligible.iter().map(load).sum();
                // Bounded load: at most 25% over the mean (plus one), else the next in line.
                let bound = f64::from(total + 1) / eligible.len().max(1) as f64 * 1.25 + 1.0;
                let mut ranked = eligible.clone();
                ranked.sort_by_key(|i| std::cmp::Reverse(rendezvous(prefix_key, &self.replicas[*i].url)));
                ranked
                    .into_iter()
                    .find(|i| f64::from(load(i) + 1) <= bound)
                    .or_else(least)
            }
            Balance::EngineAware => {
                let scores: Option<Vec<(usize, f64)>> = eligible
                    .iter()
                    .map(|i| self.replicas[*i].engine_score(now, load(i)).map(|s| (*i, s)))
                    .collect();
                match scores {
                    Some(scores) => scores
                        .into_iter()
                        .min_by(|a, b| a.1.total_cmp(&b.1))
                        .map(|(i, _)| i),
                    None => least(),
                }
            }
        }?;
        let replica = self.replicas[index].clone();
        replica.outstanding.fetch_add(1, Ordering::Relaxed);
        replica.gauge.inc();
        Some(ReplicaGuard { replica, index })
    }

    /// Runs the adaptive-concurrency controller of this route's adaptive classes.
    pub async fn adapt_limits(self: Arc<Self>) {
        let every = self
            .classes
            .iter()
            .filter_map(|c| match c.config.concurrency {
                Concurrency::Adaptive { adaptive } => Some(adaptive.interval),
                Concurrency::Fixed(_) => None,
            })
            .min();
        let Some(every) = every else { return };
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            for c in self
                .classes
                .iter()
                .filter(|c| matches!(c.config.concurrency, Concurrency::Adaptive { .. }))
            {
                let before = c.admission.limits().concurrency;
                let after = c.admission.adapt();
                c.limit_gauge.set(i64::from(after));
                if after != before {
                    tracing::info!(route = %self.config.model, class = %c.config.name, from = before, to = after, "adaptive concurrency");
                }
            }
        }
    }

    /// Reads each replica's `/metrics` about once a second for the engine-aware balancer.
    pub async fn scrape_engines(self: Arc<Self>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let scrapes = self.replicas.iter().map(|r| {
                let client = self.client.clone();
                let uri = format!("{}/metrics", r.url);
                async move {
                    let req = hyper::Request::get(uri).body(Full::new(Bytes::new())).ok()?;
                    let resp = tokio::time::timeout(Duration::from_millis(800), client.request(req))
                        .await
                        .ok()?
                        .ok()?;
                    if !resp.status().is_success() {
                        return None;
                    }
                    let body = tokio::time::timeout(
                        Duration::from_millis(800),
                        http_body_util::BodyExt::collect(http_body_util::Limited::new(
                            resp.into_body(),
                            4 << 20,
                        )),
                    )
                    .await
                    .ok()?
                    .ok()?
                    .to_bytes();
                    parse_engine_load(&String::from_utf8_lossy(&body))
                }
            });
            let results = futures::future::join_all(scrapes).await;
            let now = Instant::now();
            for (r, load) in self.replicas.iter().zip(results) {
                if let Some((waiting, kv)) = load {
                    *r.engine_load.lock().unwrap_or_else(|e| e.into_inner()) = Some((now, waiting, kv));
                }
            }
        }
    }

    /// Whether an eligible replica not in `tried` is left.
    pub fn has_untried(&self, pool: &[usize], tried: &[usize]) -> bool {
        let now = Instant::now();
        pool.iter()
            .any(|i| !tried.contains(i) && self.replicas[*i].eligible(now))
    }

    /// Passive outlier detection: counts a request's outcome at `replica`, ejecting it after too
    /// many failures in a row.
    pub fn report(&self, replica: &Replica, ok: bool) {
        if ok {
            replica.consecutive_failures.store(0, Ordering::Relaxed);
            return;
        }
        let o = self.config.outlier;
        let failures = replica.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures < o.consecutive_failures.get() {
            return;
        }
        let now = Instant::now();
        let out = self.replicas.iter().filter(|r| r.is_ejected(now)).count();
        let cap = (self.replicas.len() * o.max_ejected_percent as usize / 100).max(1);
        let mut until = replica.ejected_until.lock().unwrap_or_else(|e| e.into_inner());
        if until.is_some_and(|t| now < t) || out >= cap {
            return;
        }
        let k = replica.ejections.fetch_add(1, Ordering::Relaxed) + 1;
        let time = o.base_ejection.saturating_mul(k).min(o.max_ejection);
        *until = Some(now + time);
        replica.consecutive_failures.store(0, Ordering::Relaxed);
        replica.ejected_gauge.set(1);
        replica.ejections_total.inc();
        tracing::warn!(route = %self.config.model, replica = %replica.url, ?time, failures, "replica ejected");
    }

    /// Brings the ejection gauges up to date (ejections end by time, not by an event).
    pub fn refresh_ejections(&self) {
        let now = Instant::now();
        for r in &self.replicas {
            r.ejected_gauge.set(i64::from(r.is_ejected(now)));
        }
    }

    /// Probes every replica's health path forever (until the task is dropped).
    pub async fn probe_health(self: Arc<Self>) {
        let h = self.config.health.clone();
        let mut streaks = vec![(0u32, 0u32); self.replicas.len()];
        let mut tick = tokio::time::interval(h.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let probes = self.replicas.iter().map(|r| {
                let uri = format!("{}{}", r.url, h.path);
                let client = self.client.clone();
                async move {
                    let Ok(req) = hyper::Request::get(uri).body(Full::new(Bytes::new())) else {
                        return false;
                    };
                    matches!(
                        tokio::time::timeout(h.timeout, client.request(req)).await,
                        Ok(Ok(resp)) if resp.status().is_success()
                    )
                }
            });
            let results = futures::future::join_all(probes).await;
            for ((r, ok), (good, bad)) in self.replicas.iter().zip(results).zip(streaks.iter_mut()) {
                if ok {
                    *good += 1;
                    *bad = 0;
                } else {
                    *bad += 1;
                    *good = 0;
                }
                let healthy = r.healthy.load(Ordering::Relaxed);
                if healthy && *bad >= h.unhealthy_after.get() {
                    r.set_healthy(false);
                    tracing::warn!(route = %self.config.model, replica = %r.url, "replica unhealthy: failed {} health checks", *bad);
                } else if !healthy && *good >= h.healthy_after.get() {
                    r.set_healthy(true);
                    tracing::info!(route = %self.config.model, replica = %r.url, "replica healthy again");
                }
            }
        }
    }
}
