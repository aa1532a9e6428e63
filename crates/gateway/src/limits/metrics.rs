//! The series of the limits shared through Redis: the mode they are enforced in, the calls to
//! Redis and their round trips, how long a handed-over slot takes to reach its waiter, and the
//! moves of the namespace between nodes.

use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

/// A Redis round trip's buckets: 100 µs to 1 s.
const ROUND_TRIP_BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

pub(super) struct RedisMetrics {
    pub(super) mode: IntGaugeVec,
    pub(super) changes: IntCounterVec,
    pub(super) calls: IntCounterVec,
    pub(super) seconds: HistogramVec,
    pub(super) grant_seconds: Histogram,
    pub(super) grant_to_upstream_seconds: Histogram,
    pub(super) node_changes: IntCounterVec,
    pub(super) redirections: IntCounterVec,
}

fn round_trips(name: &str, help: &str) -> HistogramOpts {
    HistogramOpts::new(name, help).buckets(ROUND_TRIP_BUCKETS.to_vec())
}

impl RedisMetrics {
    /// The series, registered in `registry` (a second gateway in one process keeps the first's).
    pub(super) fn register(registry: &Registry) -> RedisMetrics {
        let counter = |name, help, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels).expect("metric definition")
        };
        let m = RedisMetrics {
            mode: IntGaugeVec::new(
                Opts::new(
                    "spillway_limits_mode",
                    "1 for the mode the limits are enforced in: shared (through Redis) or local (this gateway's share; fair share between teams per gateway too)",
                ),
                &["mode"],
            )
            .expect("metric definition"),
            changes: counter(
                "spillway_limits_mode_changes_total",
                "Switches of the limits' mode, by the mode switched to (shared, local)",
                &["to"],
            ),
            calls: counter(
                "spillway_redis_calls_total",
                "Calls to Redis for shared limits, by operation and outcome (ok, late: answered after redis.timeout, error, timeout)",
                &["op", "outcome"],
            ),
            seconds: HistogramVec::new(
                round_trips(
                    "spillway_redis_call_seconds",
                    "Round-trip time of calls to Redis for shared limits",
                ),
                &["op"],
            )
            .expect("metric definition"),
            grant_seconds: Histogram::with_opts(round_trips(
                "spillway_redis_grant_seconds",
                "From the script that handed a freed slot to a waiter of this gateway to the waiter learning of it (Redis's clock to this host's)",
            ))
            .expect("metric definition"),
            grant_to_upstream_seconds: Histogram::with_opts(round_trips(
                "spillway_redis_grant_to_upstream_seconds",
                "From the script that handed a freed slot to a waiter of this gateway to the waiter's first attempt upstream (Redis's clock to this host's)",
            ))
            .expect("metric definition"),
            node_changes: counter(
                "spillway_redis_node_changes_total",
                "Moves of the shared limits to another Redis node, by how it was found (sentinel: a failover; cluster, moved: the namespace's slot moved)",
                &["found_by"],
            ),
            redirections: counter(
                "spillway_redis_redirections_total",
                "Redis Cluster's answers that sent a call elsewhere, by answer (moved, ask, tryagain): the namespace's slot moving",
                &["answer"],
            ),
        };
        for c in [
            Box::new(m.mode.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(m.redirections.clone()),
            Box::new(m.node_changes.clone()),
            Box::new(m.changes.clone()),
            Box::new(m.calls.clone()),
            Box::new(m.seconds.clone()),
            Box::new(m.grant_seconds.clone()),
            Box::new(m.grant_to_upstream_seconds.clone()),
        ] {
            let _ = registry.register(c);
        }
        m
    }
}
