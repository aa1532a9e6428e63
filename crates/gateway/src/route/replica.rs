//! One upstream replica: its live request count and every piece of state the gateway keeps about
//! it, changed only through [`Replica::observe`] and the operator's drain.

use crate::config::OutlierConfig;
use crate::metrics::Metrics;
use prometheus::{IntCounter, IntGauge};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// The longest a busy replica's `Retry-After` keeps first attempts away from it.
const MAX_BUSY_BACKOFF: Duration = Duration::from_secs(5);

/// A busy replica's advice as the gateway passes it on, by either front door: its `Retry-After`
/// in whole seconds when it sent one, else one second, within 1–60 s (a replica cannot send the
/// gateway's clients away for longer than a minute).
pub(crate) fn busy_retry_after(secs: Option<u64>) -> Duration {
    Duration::from_secs(secs.unwrap_or(1).clamp(1, 60))
}

/// What one attempt, probe or scrape learned about a replica.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Observation {
    /// A whole answer, or a stream's first chunk: the replica works.
    Served,
    /// The replica answered the client's own mistake (4xx): says nothing about its health.
    ClientError,
    /// 429/503: backpressure, never a failure; no first attempts until `retry_after` (bounded).
    Busy { retry_after: Duration },
    /// A 5xx other than 503, a lost connection, a stream that failed before its first chunk.
    Failed,
    /// The connection could not be opened.
    ConnectFailed,
    /// No answer or first chunk within the budget.
    TimedOut,
    /// An active health check passed (true) or failed (false) enough times in a row.
    Health(bool),
    /// The engine's own metrics: requests waiting and KV-cache usage.
    EngineLoad { waiting: f64, running: f64, kv: f64 },
}

/// Outlier-ejection state, under one lock so a decision sees one consistent picture.
#[derive(Debug, Default)]
struct Ejection {
    consecutive_failures: u32,
    ejections: u32,
    until: Option<Instant>,
}

/// One upstream replica and its live state.
pub(crate) struct Replica {
    /// An `Arc`, so that each request's access record shares it instead of copying it.
    pub(crate) url: Arc<str>,
    /// Its idle connections, for the request path (health checks and scrapes use their own).
    pub(crate) conns: Arc<super::transport::Conns>,
    /// The last attempt to reach it failed to connect (cleared by any answer).
    unreachable: AtomicBool,
    /// Set by the active health checks; only healthy replicas are picked.
    healthy: AtomicBool,
    /// Set by an operator through the admin API: no new requests, in-flight ones finish.
    drained: AtomicBool,
    /// The last scrape of the engine's own metrics: (when, waiting requests, KV-cache usage).
    engine_load: Mutex<Option<(Instant, f64, f64)>>,
    /// The engine's running requests at the last scrape (for `balance: slo`'s models).
    engine_running: Mutex<f64>,
    /// The prompt tokens of the requests in flight through this gateway (`balance: slo` only).
    outstanding_tokens: std::sync::atomic::AtomicU64,
    ejection: Mutex<Ejection>,
    busy_until: Mutex<Option<Instant>>,
    outstanding: AtomicU32,
    /// The context length its `/v1/models` states (`max_model_len`, as vLLM publishes it); 0
    /// while unknown. Learned by the health checks, forgotten when it turns unhealthy (it may
    /// come back with another).
    max_model_len: AtomicU32,
    /// TTFT and TPOT learned from this gateway's streams, for `balance: slo`.
    predictor: Mutex<super::predict::Predictor>,
    gauges: Gauges,
}

struct Gauges {
    outstanding: IntGauge,
    healthy: IntGauge,
    ejected: IntGauge,
    ejections: IntCounter,
    ok: IntCounter,
    errors: IntCounter,
    timeouts: IntCounter,
    busy: IntCounter,
}

/// Holds a replica's outstanding count up while a request uses it.
pub(crate) struct ReplicaGuard {
    pub(crate) replica: Arc<Replica>,
    /// Its position in the route: what clients and the access log are told instead of its URL.
    pub(crate) index: usize,
    /// Prompt tokens counted in the replica's tokens in flight.
    tokens: u32,
}

impl Drop for ReplicaGuard {
    fn drop(&mut self) {
        self.replica.outstanding.fetch_sub(1, Ordering::Relaxed);
        self.replica.gauges.outstanding.dec();
        if self.tokens > 0 {
            self.replica
                .outstanding_tokens
                .fetch_sub(u64::from(self.tokens), Ordering::Relaxed);
        }
    }
}

impl Replica {
    pub(crate) fn new(
        route: &str,
        url: &str,
        metrics: &Metrics,
        trust: Option<&crate::tls::ReplicaTrust>,
    ) -> Replica {
        let labels = [route, url];
        let result = |r: &str| metrics.upstream.with_label_values(&[route, url, r]);
        let healthy = metrics.replica_healthy.with_label_values(&labels);
        healthy.set(1);
        Replica {
            url: url.into(),
            conns: Arc::new(super::transport::Upstream::conns(url, trust)),
            unreachable: AtomicBool::new(false),
            healthy: AtomicBool::new(true),
            drained: AtomicBool::new(false),
            engine_load: Mutex::new(None),
            engine_running: Mutex::new(0.0),
            outstanding_tokens: std::sync::atomic::AtomicU64::new(0),
            ejection: Mutex::new(Ejection::default()),
            busy_until: Mutex::new(None),
            outstanding: AtomicU32::new(0),
            max_model_len: AtomicU32::new(0),
            predictor: Mutex::default(),
            gauges: Gauges {
                outstanding: metrics.replica_outstanding.with_label_values(&labels),
                healthy,
                ejected: metrics.replica_ejected.with_label_values(&labels),
                ejections: metrics.ejections.with_label_values(&labels),
                ok: result("ok"),
                errors: result("error"),
                timeouts: result("timeout"),
                busy: result("busy"),
            },
        }
    }

    /// Takes a slot on this replica for one request.
    pub(crate) fn hold(self: &Arc<Self>, index: usize) -> ReplicaGuard {
        self.outstanding.fetch_add(1, Ordering::Relaxed);
        self.gauges.outstanding.inc();
        ReplicaGuard {
            replica: self.clone(),
            index,
            tokens: 0,
        }
    }

    /// [`Replica::hold`] counting the request's prompt tokens in flight too.
    pub(crate) fn hold_tokens(self: &Arc<Self>, index: usize, tokens: u32) -> ReplicaGuard {
        self.outstanding_tokens
            .fetch_add(u64::from(tokens), Ordering::Relaxed);
        let mut guard = self.hold(index);
        guard.tokens = tokens;
        guard
    }

    pub(crate) fn outstanding(&self) -> u32 {
        self.outstanding.load(Ordering::Relaxed)
    }

    /// The context length it stated, if known.
    pub(crate) fn max_model_len(&self) -> Option<u32> {
        Some(self.max_model_len.load(Ordering::Relaxed)).filter(|n| *n > 0)
    }

    pub(crate) fn set_max_model_len(&self, len: Option<u32>) {
        self.max_model_len.store(len.unwrap_or(0), Ordering::Relaxed);
    }

    pub(crate) fn is_ejected(&self, now: Instant) -> bool {
        self.lock_ejection().until.is_some_and(|t| now < t)
    }

    /// Whether requests may go here: healthy, not drained, not ejected.
    pub(crate) fn eligible(&self, now: Instant) -> bool {
        self.healthy.load(Ordering::Relaxed) && !self.drained.load(Ordering::Relaxed) && !self.is_ejected(now)
    }

    /// Whether it said it was busy recently enough that a first attempt should go elsewhere.
    pub(crate) fn is_busy(&self, now: Instant) -> bool {
        lock(&self.busy_until).is_some_and(|t| now < t)
    }

    pub(crate) fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    pub(crate) fn is_reachable(&self) -> bool {
        !self.unreachable.load(Ordering::Relaxed)
    }

    /// The engine-aware score (lower is better): this gateway's live in-flight count, plus twice the
    /// requests the engine reported waiting, plus four times its KV-cache usage; `None` when the
    /// scrape is over 3 s old. The live count keeps a once-a-second report from herding every
    /// request onto whichever replica looked best at the last scrape.
    pub(crate) fn engine_score(&self, now: Instant) -> Option<f64> {
        let (at, waiting, kv) = (*lock(&self.engine_load))?;
        (now.saturating_duration_since(at) < Duration::from_secs(3))
            .then(|| f64::from(self.outstanding()) + 2.0 * waiting + 4.0 * kv)
    }

    /// The features of a request of `input_tokens` sent now (see [`super::predict`]), and what
    /// this replica is predicted to give it (`None` while its model warms up).
    pub(crate) fn predict(
        &self,
        input_tokens: u32,
        prefix_home: bool,
        now: Instant,
    ) -> (super::predict::Features, Option<super::predict::Prediction>) {
        let fresh = lock(&self.engine_load)
            .filter(|(at, _, _)| now.saturating_duration_since(*at) < Duration::from_secs(3));
        let (waiting, kv) = fresh.map_or((0.0, 0.0), |(_, waiting, kv)| (waiting, kv));
        let running = if fresh.is_some() {
            *lock(&self.engine_running)
        } else {
            0.0
        };
        let x = super::predict::features(super::predict::State {
            input_tokens,
            in_flight: self.outstanding(),
            tokens_in_flight: self.outstanding_tokens.load(Ordering::Relaxed),
            engine_waiting: waiting,
            engine_running: running,
            kv,
            prefix_home,
        });
        let prediction = lock(&self.predictor).predict(&x);
        (x, prediction)
    }

    /// A stream sent with features `x` had its first token after `ttft`.
    pub(crate) fn learn_ttft(&self, x: &super::predict::Features, ttft: Duration) {
        lock(&self.predictor).learn_ttft(x, ttft);
    }

    /// A stream sent with features `x` averaged `tpot` between its tokens.
    pub(crate) fn learn_tpot(&self, x: &super::predict::Features, tpot: Duration) {
        lock(&self.predictor).learn_tpot(x, tpot);
    }

    /// Nothing in flight here and a TTFT model that learned nothing since `since`: what it
    /// predicts may be long out of date.
    pub(crate) fn idle_and_stale(&self, since: Instant) -> bool {
        self.outstanding() == 0 && lock(&self.predictor).stale(since)
    }

    /// Samples and mean relative error of its TTFT and TPOT models.
    pub(crate) fn prediction_quality(&self) -> [(u32, Option<f64>); 2] {
        lock(&self.predictor).quality()
    }

    /// An operator's drain (true) or undrain (false); returns what it was, for the audit log.
    pub(crate) fn set_drained(&self, drained: bool) -> bool {
        self.drained.swap(drained, Ordering::Relaxed)
    }

    pub(crate) fn is_drained(&self) -> bool {
        self.drained.load(Ordering::Relaxed)
    }

    /// The one place the gateway's view of this replica changes. Returns the ejection time when
    /// this observation ejected it; `may_eject` says whether the route can spare one more replica.
    pub(crate) fn observe(
        &self,
        what: Observation,
        outlier: &OutlierConfig,
        may_eject: bool,
        now: Instant,
    ) -> Option<Duration> {
        let g = &self.gauges;
        match what {
            Observation::Served | Observation::ClientError => {
                g.ok.inc();
                self.unreachable.store(false, Ordering::Relaxed);
                self.lock_ejection().consecutive_failures = 0;
                None
            }
            Observation::Busy { retry_after } => {
                g.busy.inc();
                self.unreachable.store(false, Ordering::Relaxed);
                *lock(&self.busy_until) = Some(now + retry_after.min(MAX_BUSY_BACKOFF));
                None
            }
            Observation::Failed | Observation::ConnectFailed | Observation::TimedOut => {
                if what == Observation::TimedOut {
                    g.timeouts.inc();
                } else {
                    g.errors.inc();
                }
                self.unreachable
                    .store(what == Observation::ConnectFailed, Ordering::Relaxed);
                self.failed(outlier, may_eject, now)
            }
            Observation::Health(healthy) => {
                self.healthy.store(healthy, Ordering::Relaxed);
                g.healthy.set(i64::from(healthy));
                None
            }
            Observation::EngineLoad { waiting, running, kv } => {
                *lock(&self.engine_load) = Some((now, waiting, kv));
                *lock(&self.engine_running) = running;
                None
            }
        }
    }

    /// Passive outlier detection: too many failures in a row eject the replica for
    /// `base_ejection` × its number of ejections, at most `max_ejection`.
    fn failed(&self, o: &OutlierConfig, may_eject: bool, now: Instant) -> Option<Duration> {
        let mut e = self.lock_ejection();
        e.consecutive_failures += 1;
        if e.consecutive_failures < o.consecutive_failures.get()
            || e.until.is_some_and(|t| now < t)
            || !may_eject
        {
            return None;
        }
        e.ejections += 1;
        let time = o.base_ejection.saturating_mul(e.ejections).min(o.max_ejection);
        e.until = Some(now + time);
        e.consecutive_failures = 0;
        self.gauges.ejected.set(1);
        self.gauges.ejections.inc();
        Some(time)
    }

    /// Brings the ejection gauge up to date (ejections end by time, not by an event).
    pub(crate) fn refresh_gauges(&self, now: Instant) {
        self.gauges.ejected.set(i64::from(self.is_ejected(now)));
    }

    fn lock_ejection(&self) -> std::sync::MutexGuard<'_, Ejection> {
        lock(&self.ejection)
    }

    /// The replica's state for the admin view.
    pub(crate) fn state(&self, index: usize) -> serde_json::Value {
        let now = Instant::now();
        let [(ttft_n, ttft_e), (tpot_n, tpot_e)] = self.prediction_quality();
        let slo_model = serde_json::json!({
            "ttft_samples": ttft_n,
            "ttft_error": ttft_e,
            "tpot_samples": tpot_n,
            "tpot_error": tpot_e,
        });
        serde_json::json!({
            "index": index,
            "url": self.url,
            "healthy": self.healthy.load(Ordering::Relaxed),
            "drained": self.drained.load(Ordering::Relaxed),
            "ejected": self.is_ejected(now),
            "busy": self.is_busy(now),
            "reachable": self.is_reachable(),
            "outstanding": self.outstanding(),
            "engine_waiting": lock(&self.engine_load).map(|(_, waiting, _)| waiting),
            "slo_model": slo_model,
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every change under these locks is a plain write: the state stays consistent after a panic.
    m.lock().unwrap_or_else(|e| e.into_inner())
}
