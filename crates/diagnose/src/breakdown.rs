//! The rows narrowed to one model or one replica: where a finding comes from, and a replica that
//! is sick while the totals still look fine (one hung engine among four still generates 75% of
//! the tokens).

use crate::catalog;
use crate::kube::Cluster;
use crate::rows::{self, Reader};
use crate::rules;
use crate::source::instance_of;
use crate::verdict::{Basis, Evidence, Finding, Suspect, Thresholds};
use crate::window::{Level, Series, Snapshot, Window};
use serde::Serialize;
use std::collections::{BTreeSet, HashMap};

/// Slices shown per dimension, the busiest first; the rest are only counted, so that a fleet of
/// hundreds of replicas does not bury the verdict.
const MAX_SLICES: usize = 16;

/// Causes that live in one replica: found there, they stand as findings even when the totals
/// hide them. Rule 6 and the slow replica (found against the replica's peers) can be hidden:
/// GPU faults come from DCGM series, which no slice holds, and KV pressure is judged on the
/// highest replica's cache, which the totals see too. Symptoms of load (arrivals, decode
/// contention, long prompts, timeouts) are judged on the totals only, and shown per slice.
const LOCAL_CAUSES: [Suspect; 2] = [Suspect::ProcessHealth, Suspect::SlowReplica];

/// A replica this many times slower than its peers' median, over the objective, is slow.
const SLOWER: f64 = 2.0;

/// Replicas far slower than their peers at no more load: for each such slice, its finding. A
/// load symptom (decode contention) slows every replica that carries the load; one replica
/// slow beside peers that run as many requests points at the replica itself.
fn slow_replicas(slices: &mut [(Slice, Vec<Finding>)], t: &Thresholds, secs: f64) {
    type Stat = fn(&Slice) -> Option<f64>;
    let stats: [(Stat, f64, &'static str); 2] = [
        (|s| s.itl_p95, t.itl_p95, "ITL p95"),
        (|s| s.ttft_p95, t.ttft_p95, "TTFT p95"),
    ];
    let mut slow = Vec::new();
    for (i, (s, _)) in slices.iter().enumerate() {
        for (stat, objective, what) in stats {
            let Some(v) = stat(s).filter(|v| *v > objective) else {
                continue;
            };
            let mut peers: Vec<(f64, f64)> = slices
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .filter_map(|(_, (p, _))| Some((stat(p)?, p.running.map_or(0.0, |l| l.peak()))))
                .collect();
            if peers.is_empty() {
                continue;
            }
            peers.sort_by(|a, b| a.0.total_cmp(&b.0));
            let median = peers[peers.len() / 2].0;
            // No more load than a peer: its mean at most the busiest peer's peak (the gauges
            // move by one as requests end between the two reads).
            let peers_running = peers.iter().map(|p| p.1).fold(0.0, f64::max);
            let running = s.running.map_or(0.0, |l| l.mean());
            if v > SLOWER * median && running <= peers_running {
                let ev = |series: String, value: f64, op, threshold| Evidence {
                    series,
                    stat: "p95",
                    value,
                    unit: "s",
                    op,
                    threshold,
                    window_secs: secs,
                    basis: Basis::Completions,
                };
                slow.push((
                    i,
                    vec![
                        ev(format!("{what} of this replica"), v, ">", Some(SLOWER * median)),
                        ev(
                            format!("{what} median of its {} peers", peers.len()),
                            median,
                            "=",
                            None,
                        ),
                        Evidence {
                            series: "running on this replica, and at most on a peer".into(),
                            stat: "mean",
                            value: running,
                            unit: "requests",
                            op: "<=",
                            threshold: Some(peers_running),
                            window_secs: secs,
                            basis: Basis::Instantaneous,
                        },
                    ],
                ));
                break;
            }
        }
    }
    for (i, evidence) in slow {
        let (s, f) = &mut slices[i];
        s.suspects.push(Suspect::SlowReplica);
        f.push(Finding::new(Suspect::SlowReplica, evidence));
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Dimension {
    /// The gateway's `route` and the engines' `model_name`: a route that serves a model under
    /// another name shows as two slices.
    Model,
    /// An engine's scrape target (`instance`), joined with the gateway's series about the
    /// replica at the same `host:port`.
    Replica,
}

impl Dimension {
    pub fn word(self) -> &'static str {
        match self {
            Dimension::Model => "model",
            Dimension::Replica => "replica",
        }
    }
}

/// One model's or one replica's figures over the window.
#[derive(Debug, Clone, Serialize)]
pub struct Slice {
    pub dimension: Dimension,
    pub name: String,
    /// The gateway's count when the slice has it (a model), else the engines'.
    pub requests_per_s: Option<f64>,
    pub error_ratio: Option<f64>,
    /// The gateway's when it relays this slice, else the engines'.
    pub ttft_p95: Option<f64>,
    pub itl_p95: Option<f64>,
    pub running: Option<Level>,
    pub waiting: Option<Level>,
    pub kv_peak: Option<f64>,
    pub preemptions: Option<f64>,
    pub generation_tokens_per_s: Option<f64>,
    /// The gateway's calls to this replica per second, and the share that failed (an error or
    /// a timeout; a replica's 429/503 "busy" is not a failure).
    pub upstream_calls_per_s: Option<f64>,
    pub upstream_failed_ratio: Option<f64>,
    /// Rows of the table that match on this slice alone.
    pub suspects: Vec<Suspect>,
    /// Objectives this slice breaches on its own: `ttft`, `itl`, `errors`.
    pub breached: Vec<&'static str>,
    /// For a route, the names its engines serve it under when they differ from the route's.
    pub served_as: Vec<String>,
}

impl Slice {
    /// `replica 10.0.0.7:8000`, `model llama`: how findings name where they were seen.
    pub fn label(&self) -> String {
        format!("{} {}", self.dimension.word(), self.name)
    }
}

/// Every slice worth showing: a dimension appears only when it has two or more values.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Breakdown {
    pub slices: Vec<Slice>,
    /// Slices beyond the first MAX_SLICES of a dimension, left out.
    pub omitted: usize,
}

/// The breakdown, and each slice's findings (to say where the totals' findings come from, and
/// to raise the local causes the totals hide).
pub(crate) fn build(start: &Snapshot, end: &Snapshot, t: &Thresholds) -> (Breakdown, Vec<(String, Finding)>) {
    let mut out = Breakdown::default();
    let mut findings = Vec::new();
    let engines = engine_instances(end);
    let join = join(end);
    for dimension in [Dimension::Model, Dimension::Replica] {
        let names = values(end, dimension, &engines, &join);
        if names.len() < 2 {
            continue;
        }
        let mut slices: Vec<(Slice, Vec<Finding>)> = names
            .into_iter()
            .map(|name| slice(start, end, t, dimension, name, &engines, &join))
            .collect();
        if dimension == Dimension::Replica {
            slow_replicas(&mut slices, t, end.at - start.at);
        }
        // Shown first, so never the ones left out: a local cause, then any finding, then the
        // busiest. (Every slice's findings count, shown or not.)
        let order = |s: &Slice| {
            (
                !s.suspects.iter().any(|x| LOCAL_CAUSES.contains(x)),
                s.suspects.is_empty(),
            )
        };
        let rate = |s: &Slice| s.requests_per_s.or(s.upstream_calls_per_s).unwrap_or(0.0);
        slices.sort_by(|(a, _), (b, _)| {
            order(a)
                .cmp(&order(b))
                .then_with(|| rate(b).total_cmp(&rate(a)))
                .then_with(|| a.name.cmp(&b.name))
        });
        out.omitted += slices.len().saturating_sub(MAX_SLICES);
        for (i, (s, f)) in slices.into_iter().enumerate() {
            let label = s.label();
            findings.extend(f.into_iter().map(|f| (label.clone(), f)));
            if i < MAX_SLICES {
                out.slices.push(s);
            }
        }
    }
    (out, findings)
}

/// Where a slice's finding stands in the verdict: beside the totals' finding of the same row,
/// or, for a local cause, as a finding of its own that carries each slice's evidence, named by
/// its slice.
pub(crate) fn place(findings: &mut Vec<Finding>, local: Vec<(String, Finding)>) {
    for (label, mut f) in local {
        for e in &mut f.evidence {
            e.series = format!("{label}: {}", e.series);
        }
        match findings.iter_mut().find(|g| g.suspect == f.suspect) {
            Some(g) => {
                if g.only_in_slices {
                    g.evidence.append(&mut f.evidence);
                }
                if !g.at.contains(&label) {
                    g.at.push(label);
                }
            }
            None if LOCAL_CAUSES.contains(&f.suspect) => {
                f.at.push(label);
                f.only_in_slices = true;
                findings.push(f);
            }
            None => {}
        }
    }
}

/// Which route each engine target serves, from the gateway's per-replica series: a route and
/// the model name its engines serve it under are one model, named by the route. A target two
/// routes send to keeps its own name.
type Join = HashMap<String, String>;

fn join(end: &Snapshot) -> Join {
    let mut routes: HashMap<String, BTreeSet<&str>> = HashMap::new();
    for s in end.series.iter().filter(|s| s.name.starts_with("spillway_")) {
        if let (Some(route), Some(replica)) = (s.label("route"), s.label("replica")) {
            routes.entry(instance_of(replica)).or_default().insert(route);
        }
    }
    routes
        .into_iter()
        .filter(|(_, r)| r.len() == 1)
        .filter_map(|(i, r)| r.first().map(|r| (i, (*r).to_owned())))
        .collect()
}

fn model_of<'a>(s: &'a Series, join: &'a Join) -> Option<&'a str> {
    if s.label("model_name").is_some()
        && let Some(route) = s.label("instance").and_then(|i| join.get(i))
    {
        return Some(route);
    }
    s.label("model_name").or_else(|| {
        s.name
            .starts_with("spillway_")
            .then(|| s.label("route"))
            .flatten()
    })
}

/// Engines' scrape targets: the `instance` of any `vllm:` series.
pub(crate) fn engine_instances(end: &Snapshot) -> BTreeSet<String> {
    end.series
        .iter()
        .filter(|s| s.name.starts_with("vllm:"))
        .filter_map(|s| s.label("instance").map(str::to_owned))
        .collect()
}

/// A dimension's values: models by name; replicas as the engines' targets and the gateway's
/// replicas, by `host:port`.
fn values(end: &Snapshot, dimension: Dimension, engines: &BTreeSet<String>, join: &Join) -> BTreeSet<String> {
    match dimension {
        Dimension::Model => end
            .series
            .iter()
            .filter_map(|s| model_of(s, join).map(str::to_owned))
            .collect(),
        Dimension::Replica => {
            let mut all = engines.clone();
            all.extend(
                end.series
                    .iter()
                    .filter(|s| s.name.starts_with("spillway_"))
                    .filter_map(|s| s.label("replica").map(instance_of)),
            );
            all
        }
    }
}

fn slice(
    start: &Snapshot,
    end: &Snapshot,
    t: &Thresholds,
    dimension: Dimension,
    name: String,
    engines: &BTreeSet<String>,
    join: &Join,
) -> (Slice, Vec<Finding>) {
    let keep = |s: &Series| {
        s.name == "up"
            || match dimension {
                Dimension::Model => model_of(s, join) == Some(name.as_str()),
                Dimension::Replica => {
                    (s.label("instance") == Some(name.as_str()) && engines.contains(&name))
                        || s.label("replica").is_some_and(|r| instance_of(r) == name)
                }
            }
    };
    let (a, b) = (start.filtered(keep), end.filtered(keep));
    let w = Window::new(&a, &b);
    // Discovered again: a replica's slice has no `spillway_requests_total`, so its user impact
    // is the engine's.
    let found = catalog::discover(&b);
    let reader = Reader { w: &w, found: &found };
    let rows = rows::build(&reader);
    let outcome = rules::apply(
        &reader,
        &rows,
        t,
        &Cluster::default(),
        Vec::new(),
        &mut Vec::new(),
    );
    let (u, g, e) = (&rows.user_impact, &rows.generation, &rows.engine);
    let secs = w.secs();
    let upstream = |keep: fn(&Series) -> bool| {
        w.increase("spillway_upstream_requests_total", keep)
            .filter(|_| secs > 0.0)
            .map(|v| v / secs)
    };
    let calls = upstream(|_| true);
    let failed = upstream(|s| matches!(s.label("result"), Some("error" | "timeout")));
    let served_as: BTreeSet<String> = b
        .series
        .iter()
        .filter_map(|s| s.label("model_name"))
        .filter(|m| dimension == Dimension::Model && *m != name)
        .map(str::to_owned)
        .collect();
    let slice = Slice {
        served_as: served_as.into_iter().collect(),
        dimension,
        name,
        requests_per_s: u.requests_per_s,
        error_ratio: u.error_ratio,
        ttft_p95: outcome.user_ttft_p95,
        itl_p95: outcome.user_itl_p95,
        running: e.running,
        waiting: e.waiting,
        kv_peak: e.kv_usage.map(|l| l.peak()),
        preemptions: e.preemptions,
        generation_tokens_per_s: g.generation_tokens_per_s,
        upstream_calls_per_s: calls,
        upstream_failed_ratio: calls.filter(|c| *c > 0.0).map(|c| failed.unwrap_or(0.0) / c),
        suspects: outcome.findings.iter().map(|f| f.suspect).collect(),
        breached: outcome.breached,
    };
    (slice, outcome.findings)
}
