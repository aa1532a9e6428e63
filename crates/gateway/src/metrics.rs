//! The gateway's Prometheus metrics. Every label value comes from the configuration or a fixed set
//! (route, class, replica, status, reason): never a request ID, a key, or a model name a client made up.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// The route label of requests whose model no route serves.
pub(crate) const UNKNOWN_ROUTE: &str = "_unknown";
/// The class label of requests rejected before a class was chosen.
pub(crate) const NO_CLASS: &str = "_none";

const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0,
    320.0,
];
const ITL_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0,
];
const QUEUE_BUCKETS: &[f64] = &[
    0.0, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

pub(crate) struct Metrics {
    pub registry: Registry,
    pub requests: IntCounterVec,
    pub api_requests: IntCounterVec,
    pub rejections: IntCounterVec,
    pub cancellations: IntCounterVec,
    pub queue_wait: HistogramVec,
    pub ttft: HistogramVec,
    pub itl: HistogramVec,
    pub duration: HistogramVec,
    pub prompt_tokens: IntCounterVec,
    pub completion_tokens: IntCounterVec,
    pub wasted_tokens: IntCounterVec,
    pub goodput: IntCounterVec,
    pub slo_requests: IntCounterVec,
    pub upstream: IntCounterVec,
    pub in_flight: IntGaugeVec,
    pub queued: IntGaugeVec,
    pub oldest_wait: prometheus::GaugeVec,
    pub team_service: IntCounterVec,
    pub slo_routing: IntCounterVec,
    #[cfg_attr(not(feature = "picker"), allow(dead_code))]
    pub picker_requests: IntCounterVec,
    pub slo_prediction_error: prometheus::GaugeVec,
    pub team_queue_wait: HistogramVec,
    pub attained_service: prometheus::GaugeVec,
    pub fairness_index: prometheus::GaugeVec,
    pub concurrency_limit: IntGaugeVec,
    pub queue_limit: IntGaugeVec,
    pub replica_outstanding: IntGaugeVec,
    pub replica_healthy: IntGaugeVec,
    pub replica_ejected: IntGaugeVec,
    pub ejections: IntCounterVec,
    pub retries: IntCounterVec,
    pub retry_budget_exhausted: IntCounterVec,
    pub draining: prometheus::IntGauge,
    pub connections: prometheus::IntGauge,
    pub connections_over_limit: IntCounter,
    pub accept_errors: IntCounter,
    pub send_timeouts: IntCounter,
}

/// Pre-resolved series of one route and class, so the hot path does no label lookups.
pub(crate) struct ClassSeries {
    pub queue_wait: Histogram,
    pub ttft: Histogram,
    pub itl: Histogram,
    pub duration: Histogram,
    pub goodput: IntCounter,
    pub slo_requests: IntCounter,
    route: String,
    class: String,
    slo_routing: IntCounterVec,
    /// The series of each team seen, found by label the first time: the teams of one
    /// configuration.
    /// A read lock for the usual lookup, so that workers answering the same class do not take
    /// turns for it.
    teams: std::sync::RwLock<std::collections::HashMap<std::sync::Arc<str>, TeamSeries>>,
}

/// A class's series for one team that every answered request moves.
pub(crate) struct TeamSeries {
    /// `spillway_requests_total` with status 200.
    pub ok: IntCounter,
    pub prompt_tokens: IntCounter,
    pub completion_tokens: IntCounter,
    pub service: IntCounter,
    pub queue_wait: Histogram,
}

impl ClassSeries {
    /// A `balance: slo` pick and its verdict (`meets`, `unattainable_sent`, `refused`, `unknown`).
    pub(crate) fn slo_routing(&self, verdict: &str) {
        self.slo_routing
            .with_label_values(&[self.route.as_str(), self.class.as_str(), verdict])
            .inc();
    }

    /// Calls `f` with `team`'s series, looked up by label only the first time.
    pub(crate) fn team<R>(
        &self,
        metrics: &Metrics,
        team: &std::sync::Arc<str>,
        f: impl FnOnce(&TeamSeries) -> R,
    ) -> R {
        if let Some(series) = self.teams.read().unwrap_or_else(|e| e.into_inner()).get(&**team) {
            return f(series);
        }
        let mut teams = self.teams.write().unwrap_or_else(|e| e.into_inner());
        let series = teams.entry(team.clone()).or_insert_with(|| {
            let l = [self.route.as_str(), self.class.as_str(), team];
            TeamSeries {
                ok: metrics.requests.with_label_values(&[l[0], l[1], l[2], "200"]),
                prompt_tokens: metrics.prompt_tokens.with_label_values(&l),
                completion_tokens: metrics.completion_tokens.with_label_values(&l),
                service: metrics.team_service.with_label_values(&l),
                queue_wait: metrics.team_queue_wait.with_label_values(&l),
            }
        });
        f(series)
    }
}

fn must<T>(r: prometheus::Result<T>) -> T {
    // Names, help and buckets are constants of this file: registration cannot fail.
    r.unwrap_or_else(|e| panic!("metric definition: {e}"))
}

impl Metrics {
    pub(crate) fn new() -> Metrics {
        let registry = Registry::new();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = must(IntCounterVec::new(Opts::new(name, help), labels));
            must(registry.register(Box::new(c.clone())));
            c
        };
        let gauge = |name: &str, help: &str, labels: &[&str]| {
            let g = must(IntGaugeVec::new(Opts::new(name, help), labels));
            must(registry.register(Box::new(g.clone())));
            g
        };
        let float_gauge = |name: &str, help: &str, labels: &[&str]| {
            let g = must(prometheus::GaugeVec::new(Opts::new(name, help), labels));
            must(registry.register(Box::new(g.clone())));
            g
        };
        let hist = |name: &str, help: &str, buckets: &[f64]| {
            let h = must(HistogramVec::new(
                HistogramOpts::new(name, help).buckets(buckets.to_vec()),
                &["route", "class"],
            ));
            must(registry.register(Box::new(h.clone())));
            h
        };
        let rc = &["route", "class"];
        let draining = must(prometheus::IntGauge::new(
            "spillway_draining",
            "1 while the gateway drains for shutdown and refuses new requests.",
        ));
        must(registry.register(Box::new(draining.clone())));
        let plain_gauge = |name: &str, help: &str| {
            let g = must(prometheus::IntGauge::new(name, help));
            must(registry.register(Box::new(g.clone())));
            g
        };
        let plain_counter = |name: &str, help: &str| {
            let c = must(IntCounter::new(name, help));
            must(registry.register(Box::new(c.clone())));
            c
        };
        Metrics {
            requests: counter(
                "spillway_requests_total",
                "Requests answered, by team and final HTTP status.",
                &["route", "class", "team", "status"],
            ),
            api_requests: counter(
                "spillway_api_requests_total",
                "Requests answered, by the endpoint they came in on (chat, completions, embeddings, responses, messages, count_tokens) and final HTTP status.",
                &["route", "api", "status"],
            ),
            rejections: counter(
                "spillway_rejections_total",
                "Requests refused before reaching a replica, by team and reason.",
                &["route", "class", "team", "reason"],
            ),
            cancellations: counter(
                "spillway_cancellations_total",
                "Requests ended early (client gone, deadline, stalled upstream), by reason.",
                &["route", "class", "reason"],
            ),
            queue_wait: hist(
                "spillway_queue_wait_seconds",
                "Time admitted requests waited for a slot.",
                QUEUE_BUCKETS,
            ),
            ttft: hist(
                "spillway_time_to_first_token_seconds",
                "Arrival at the gateway to the first chunk relayed.",
                LATENCY_BUCKETS,
            ),
            itl: hist(
                "spillway_inter_token_latency_seconds",
                "Gaps between relayed stream chunks.",
                ITL_BUCKETS,
            ),
            duration: hist(
                "spillway_request_duration_seconds",
                "Arrival to the end of the response.",
                LATENCY_BUCKETS,
            ),
            prompt_tokens: counter(
                "spillway_prompt_tokens_total",
                "Prompt tokens of completed requests, by team.",
                &["route", "class", "team"],
            ),
            completion_tokens: counter(
                "spillway_completion_tokens_total",
                "Completion tokens relayed to clients, by team.",
                &["route", "class", "team"],
            ),
            wasted_tokens: counter(
                "spillway_wasted_tokens_total",
                "Tokens generated for requests whose client did not get the whole answer, by reason.",
                &["route", "class", "reason"],
            ),
            goodput: counter(
                "spillway_goodput_requests_total",
                "Completed requests that met their class's TTFT and ITL objectives.",
                rc,
            ),
            slo_requests: counter(
                "spillway_slo_requests_total",
                "Completed requests measured against their class's objectives (the goodput denominator).",
                rc,
            ),
            upstream: counter(
                "spillway_upstream_requests_total",
                "Calls to replicas, by result.",
                &["route", "replica", "result"],
            ),
            in_flight: gauge("spillway_in_flight", "Requests holding an admission slot.", rc),
            queued: gauge("spillway_queued", "Requests waiting for an admission slot.", rc),
            oldest_wait: float_gauge(
                "spillway_queue_oldest_wait_seconds",
                "How long the oldest request waiting for a slot has waited (0: none waits).",
                rc,
            ),
            team_service: counter(
                "spillway_team_service_tokens_total",
                "Service each team attained, in weighted tokens (prompt + 2 × completion, as fair share counts it).",
                &["route", "class", "team"],
            ),
            slo_routing: counter(
                "spillway_slo_routing_total",
                "balance: slo picks, by verdict: meets (a replica is predicted to meet the request's objectives), unattainable_sent (none is; sent to the closest), refused (none is and the request was sheddable), unknown (no objective, or a model still warming up), explore (sent to an idle replica whose model learned nothing for a second).",
                &["route", "class", "verdict"],
            ),
            picker_requests: counter(
                "spillway_endpoint_picker_requests_total",
                "Requests Envoy asked the endpoint picker about, by result: picked (admitted and given endpoints), refused (answered 4xx/5xx in Envoy's place), answered (/v1/models, and GET or cancel of a stored response, answered by the picker itself).",
                &["result"],
            ),
            slo_prediction_error: float_gauge(
                "spillway_slo_prediction_error_ratio",
                "balance: slo: each replica's mean relative error of its TTFT and TPOT predictions, measured before each stream was learned (about the last 40).",
                &["route", "replica", "target"],
            ),
            team_queue_wait: {
                let h = must(HistogramVec::new(
                    HistogramOpts::new(
                        "spillway_team_queue_wait_seconds",
                        "Time admitted requests waited for a slot, by team.",
                    )
                    .buckets(QUEUE_BUCKETS.to_vec()),
                    &["route", "class", "team"],
                ));
                must(registry.register(Box::new(h.clone())));
                h
            },
            attained_service: float_gauge(
                "spillway_team_attained_service",
                "Each team's attained service in the class as fair share compares it: weighted tokens, halving every 60 s.",
                &["route", "class", "team"],
            ),
            fairness_index: float_gauge(
                "spillway_weighted_fairness_index",
                "Jain's index over the attained service per weight of the teams that waited in the last 60 s (1: each team served in proportion to its weight; 1/n: one team has it all).",
                rc,
            ),
            concurrency_limit: gauge(
                "spillway_concurrency_limit",
                "C: the class's in-flight limit.",
                rc,
            ),
            queue_limit: gauge("spillway_queue_limit", "Q: the class's queue limit.", rc),
            replica_outstanding: gauge(
                "spillway_replica_outstanding",
                "Requests in flight to each replica.",
                &["route", "replica"],
            ),
            replica_healthy: gauge(
                "spillway_replica_healthy",
                "1 while the replica passes its health checks, 0 while it is out of the route.",
                &["route", "replica"],
            ),
            replica_ejected: gauge(
                "spillway_replica_ejected",
                "1 while outlier detection keeps the replica out of the route.",
                &["route", "replica"],
            ),
            ejections: counter(
                "spillway_ejections_total",
                "Times outlier detection took the replica out of the route.",
                &["route", "replica"],
            ),
            retries: counter(
                "spillway_retries_total",
                "Upstream attempts after the first.",
                &["route"],
            ),
            retry_budget_exhausted: counter(
                "spillway_retry_budget_exhausted_total",
                "Retries refused because the route's retry budget was spent.",
                &["route"],
            ),
            draining,
            connections: plain_gauge("spillway_connections", "Client connections open."),
            connections_over_limit: plain_counter(
                "spillway_connections_over_limit_total",
                "Client connections accepted over server.max_connections, answered 503 and closed.",
            ),
            accept_errors: plain_counter(
                "spillway_accept_errors_total",
                "Failures to accept a client connection (for example, out of file descriptors).",
            ),
            send_timeouts: plain_counter(
                "spillway_send_timeouts_total",
                "Client connections cut because a write to the client stayed blocked for server.send_timeout.",
            ),
            registry,
        }
    }

    pub(crate) fn class_series(&self, route: &str, class: &str) -> ClassSeries {
        let l = &[route, class];
        ClassSeries {
            route: route.to_owned(),
            class: class.to_owned(),
            slo_routing: self.slo_routing.clone(),
            teams: std::sync::RwLock::default(),
            queue_wait: self.queue_wait.with_label_values(l),
            ttft: self.ttft.with_label_values(l),
            itl: self.itl.with_label_values(l),
            duration: self.duration.with_label_values(l),
            goodput: self.goodput.with_label_values(l),
            slo_requests: self.slo_requests.with_label_values(l),
        }
    }

    /// Every refusal and cut the configuration makes possible for one route and class, at 0:
    /// Prometheus advises exporting the label sets you know, so that a series exists before its
    /// first event (a rate over it is 0, not absent, and an alert on it is armed). `teams`: each
    /// team, and whether it has a quota that can refuse.
    /// `slo`: the route balances by objectives, so it may refuse `slo_unattainable`.
    pub(crate) fn declare(&self, route: &str, class: &str, teams: &[(&str, bool)], slo: bool) {
        for cut in crate::error::Cut::ALL {
            let l = [route, class, cut.code()];
            self.cancellations.with_label_values(&l);
            self.wasted_tokens.with_label_values(&l);
        }
        for (team, quota) in teams {
            for reason in admission::Rejection::REASONS {
                if reason != "slo_unattainable" || slo {
                    self.rejections.with_label_values(&[route, class, team, reason]);
                }
            }
            if *quota {
                for kind in admission::quota::QuotaKind::ALL {
                    self.rejections
                        .with_label_values(&[route, class, team, kind.reason()]);
                }
            }
        }
    }

    /// The classic text format (0.0.4), which promtool and every Prometheus read.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut buf = Vec::with_capacity(32 * 1024);
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        buf
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
