//! A route at run time: its classes with their admission gates, its replicas, its tokenizer and its
//! upstream client. The jobs around the replicas live beside it: [`balance`] (choosing one),
//! [`replica`] (the state kept about each, changed in one place), [`health`] (active checks),
//! [`scrape`] (the engines' own metrics), [`adaptive`] (the task moving an adaptive C) and
//! [`transport`] (TCP, or TLS for `https://`, to a replica).

mod adaptive;
pub(crate) mod balance;
mod health;
pub(crate) mod predict;
mod replica;
mod scrape;
pub(crate) mod transport;

pub(crate) use replica::{Observation, Replica, ReplicaGuard, busy_retry_after};

use crate::config::ConfigError;
use crate::config::{ClassConfig, Concurrency, RouteConfig};
use crate::metrics::{ClassSeries, Metrics};
use crate::tls::ReplicaTrust;
use admission::{AdaptiveLimits, Admission, Limits};
use axum::http::HeaderMap;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use prometheus::{IntCounter, IntGauge};
use std::sync::Arc;
use std::time::Duration;
use tokenize::Tokenizer;
use tokio::time::Instant;

/// The client of the health checks and scrapes (the request path has its own, `transport`).
pub(crate) type UpstreamClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// One admission class of a route.
pub(crate) struct Class {
    pub(crate) config: ClassConfig,
    /// The class's name, shared by each request's access record instead of copied.
    pub(crate) name: Arc<str>,
    /// C, Q and Wq as configured: with Redis, shared by every gateway; `admission` then enforces
    /// this gateway's share of them while Redis is unreachable.
    pub(crate) limits: Limits,
    pub(crate) admission: Arc<Admission>,
    pub(crate) series: Arc<ClassSeries>,
    /// `spillway_concurrency_limit` of this class, which an adaptive C moves.
    pub(crate) limit_gauge: IntGauge,
    /// Indices into the route's replicas that this class may use.
    pub(crate) pool: Vec<usize>,
}

pub(crate) struct Route {
    pub(crate) config: RouteConfig,
    /// The route's model, shared by each request's access record instead of copied.
    pub(crate) name: Arc<str>,
    pub(crate) classes: Vec<Class>,
    pub(crate) replicas: Vec<Arc<Replica>>,
    pub(crate) tokenizer: Tokenizer,
    pub(crate) client: UpstreamClient,
    /// How its `https://` replicas are trusted; `None` when it has none.
    trust: Option<ReplicaTrust>,
    /// Set when the route renames the model upstream.
    pub(crate) rename: Option<Arc<crate::event::Rename>>,
    pub(crate) budget: admission::retry::RetryBudget,
    pub(crate) retries: IntCounter,
    pub(crate) retry_budget_exhausted: IntCounter,
}

impl Route {
    /// Builds a route; on a reload, `previous` (the route of the same model) hands over its live
    /// state: each class keeps its admission gate (with the new limits) and each replica that stays
    /// keeps its health, ejection and in-flight count.
    pub(crate) fn new(
        config: RouteConfig,
        metrics: &Metrics,
        previous: Option<&Route>,
        redis: Option<&crate::config::RedisConfig>,
        trust: Option<ReplicaTrust>,
    ) -> Result<Route, ConfigError> {
        let tokenizer = match &config.tokenizer {
            Some(path) => Tokenizer::from_file(path).map_err(|e| {
                crate::config::err(format!("routes.{}.tokenizer", config.model), e.to_string())
            })?,
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
                let kept = previous.and_then(|p| p.classes.iter().find(|k| k.config.name == c.name));
                Class::new(&config.model, c, kept, metrics, pool_of(c), redis)
            })
            .collect();
        // A replica that stays keeps its state, unless the CA its TLS is checked against changed:
        // its pooled connections were checked against the old one.
        let same_trust = |p: &Route| match (&p.trust, &trust) {
            (None, None) => true,
            (Some(a), Some(b)) => a.same_as(b),
            _ => false,
        };
        let kept = previous.filter(|p| same_trust(p));
        let replicas = urls
            .iter()
            .map(
                |url| match kept.and_then(|p| p.replicas.iter().find(|r| *r.url == **url)) {
                    Some(kept) => kept.clone(),
                    None => Arc::new(Replica::new(&config.model, url, metrics, trust.as_ref())),
                },
            )
            .collect();
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(config.timeouts.connect));
        connector.set_nodelay(true);
        // The health checks and scrapes of `https://` replicas, trusted as the request path is.
        connector.enforce_http(false);
        let tls = match &trust {
            Some(t) => (*t.client).clone(),
            None => crate::tls::no_trust()?,
        };
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector);
        // SSE chunks are a few hundred bytes: a small fixed read buffer per upstream connection
        // keeps memory per stream down (hyper would start at 8 KiB and grow).
        let client = Client::builder(TokioExecutor::new())
            .http1_read_buf_exact_size(4096)
            .build(connector);
        let rename = config
            .upstream_model
            .as_deref()
            .filter(|u| *u != config.model)
            .map(|u| Arc::new(crate::event::Rename::new(u, &config.model)));
        Ok(Route {
            budget: admission::retry::RetryBudget::new(
                config.retry.budget.ratio,
                config.retry.budget.min_per_second,
            ),
            retries: metrics.retries.with_label_values(&[config.model.as_str()]),
            retry_budget_exhausted: metrics
                .retry_budget_exhausted
                .with_label_values(&[config.model.as_str()]),
            rename,
            name: config.model.as_str().into(),
            config,
            classes,
            replicas,
            tokenizer,
            client,
            trust,
        })
    }

    /// Whether some replica of this route is eligible and answered its last connection attempt.
    pub(crate) fn has_reachable_replica(&self) -> bool {
        let now = Instant::now();
        self.replicas.iter().any(|r| r.eligible(now) && r.is_reachable())
    }

    /// The class a request belongs to: the first rule that matches after the default, else the default.
    pub(crate) fn classify(&self, max_tokens: Option<u32>, input_tokens: u32, headers: &HeaderMap) -> usize {
        self.classes
            .iter()
            .skip(1)
            .position(|c| {
                c.config
                    .when
                    .as_ref()
                    .is_some_and(|w| w.matches(max_tokens, input_tokens, headers))
            })
            .map_or(0, |k| k + 1)
    }

    /// The route a routing rule sends this request to, if any.
    pub(crate) fn redirect(
        &self,
        max_tokens: Option<u32>,
        input_tokens: u32,
        headers: &HeaderMap,
    ) -> Option<&str> {
        self.config
            .redirect
            .iter()
            .find(|r| r.when.matches(max_tokens, input_tokens, headers))
            .map(|r| r.to.as_str())
    }

    /// An eligible replica (healthy, not drained, not ejected) of `pool` (a class's replicas) not
    /// in `tried`, by the route's balancer; `None` when none is left. A replica that said it was
    /// busy is passed over while another is free: backpressure, not ejection.
    pub(crate) fn pick(
        &self,
        pool: &[usize],
        tried: &[usize],
        prefix_key: u64,
        now: Instant,
    ) -> Option<ReplicaGuard> {
        self.pick_by(self.config.balance, pool, tried, prefix_key, now)
    }

    /// As [`Route::pick`], by `balance` rather than the route's own.
    pub(crate) fn pick_by(
        &self,
        balance: crate::config::Balance,
        pool: &[usize],
        tried: &[usize],
        prefix_key: u64,
        now: Instant,
    ) -> Option<ReplicaGuard> {
        let candidates = &self.candidates(pool, tried, now);
        let index = balance::pick(balance, &self.replicas, candidates, prefix_key, now)?;
        Some(self.replicas[index].hold(index))
    }

    /// The replica at `url` when it may take a request (healthy, not ejected, not tried):
    /// whatever its class's pool or its load, since only it holds what the request continues.
    pub(crate) fn pick_pinned(&self, url: &str, tried: &[usize], now: Instant) -> Option<ReplicaGuard> {
        let index = self.replicas.iter().position(|r| &*r.url == url)?;
        (!tried.contains(&index) && self.replicas[index].eligible(now))
            .then(|| self.replicas[index].hold(index))
    }

    /// The eligible replicas of `pool` not in `tried`: those not busy, or all of them if every
    /// one is.
    fn candidates(&self, pool: &[usize], tried: &[usize], now: Instant) -> Vec<usize> {
        let eligible: Vec<usize> = pool
            .iter()
            .copied()
            .filter(|i| !tried.contains(i) && self.replicas[*i].eligible(now))
            .collect();
        if eligible.iter().all(|i| self.replicas[*i].is_busy(now)) {
            return eligible;
        }
        eligible
            .into_iter()
            .filter(|i| !self.replicas[*i].is_busy(now))
            .collect()
    }

    /// [`Route::pick`] for `balance: slo`: by the request's own objectives, with the features the
    /// pick was made on and its verdict.
    pub(crate) fn pick_slo(
        &self,
        pool: &[usize],
        tried: &[usize],
        ask: &balance::SloAsk,
        now: Instant,
    ) -> Option<(ReplicaGuard, predict::Features, balance::SloVerdict)> {
        let candidates = &self.candidates(pool, tried, now);
        let (index, x, verdict) = balance::pick_slo(&self.replicas, candidates, ask, now)?;
        Some((
            self.replicas[index].hold_tokens(index, ask.input_tokens),
            x,
            verdict,
        ))
    }

    /// Whether an eligible replica not in `tried` is left.
    pub(crate) fn has_untried(&self, pool: &[usize], tried: &[usize]) -> bool {
        let now = Instant::now();
        pool.iter()
            .any(|i| !tried.contains(i) && self.replicas[*i].eligible(now))
    }

    /// Records what was learned about `replica`, ejecting it (and saying so) when outlier
    /// detection decides, as long as no more than `max_ejected_percent` are out at once.
    pub(crate) fn observe(&self, replica: &Replica, what: Observation) {
        let o = &self.config.outlier;
        let now = Instant::now();
        let out = self.replicas.iter().filter(|r| r.is_ejected(now)).count();
        let cap = (self.replicas.len() * o.max_ejected_percent as usize / 100).max(1);
        if let Some(time) = replica.observe(what, o, out < cap, now) {
            tracing::warn!(route = %self.config.model, replica = %replica.url, ?time, "replica ejected");
        }
    }

    /// Brings the replicas' gauges up to date (ejections end by time, not by an event).
    pub(crate) fn refresh_gauges(&self) {
        let now = Instant::now();
        for r in &self.replicas {
            r.refresh_gauges(now);
        }
    }
}

impl Class {
    fn new(
        route: &str,
        c: &ClassConfig,
        kept: Option<&Class>,
        metrics: &Metrics,
        pool: Vec<usize>,
        redis: Option<&crate::config::RedisConfig>,
    ) -> Class {
        let labels = [route, c.name.as_str()];
        let limit_gauge = metrics.concurrency_limit.with_label_values(&labels);
        metrics
            .queue_limit
            .with_label_values(&labels)
            .set(i64::from(c.queue));
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
        let local = match redis {
            Some(r) => Limits {
                concurrency: r.share(limits.concurrency),
                queue: r.share(limits.queue),
                ..limits
            },
            None => limits,
        };
        let admission = match kept {
            Some(k) => {
                k.admission.set_limits(local);
                k.admission.clone()
            }
            None => Admission::new(local),
        };
        admission.set_adaptive(adaptive);
        admission.set_fairness(c.fairness.unwrap_or_default());
        let shown = if redis.is_some() {
            limits.concurrency
        } else {
            admission.limits().concurrency
        };
        limit_gauge.set(i64::from(shown));
        Class {
            pool,
            limits,
            config: c.clone(),
            name: c.name.as_str().into(),
            admission,
            limit_gauge,
            series: Arc::new(metrics.class_series(route, &c.name)),
        }
    }
}
