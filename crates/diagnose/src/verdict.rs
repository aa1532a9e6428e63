//! The answer: status, ranked suspects with evidence, saturation, SLO breaches, blind spots.

use crate::breakdown::{self, Breakdown};
use crate::catalog::{self, Found, Layer};
use crate::kube::Cluster;
use crate::rows::{self, Reader, Rows};
use crate::rules;
use crate::window::{Snapshot, Window};
use serde::Serialize;
use std::time::Duration;

/// The objectives and the levels the rules compare against.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Thresholds {
    /// p95 time to first token, seconds.
    pub ttft_p95: f64,
    /// p95 gap between tokens, seconds.
    pub itl_p95: f64,
    /// Share of requests answered 429 or 5xx.
    pub error_ratio: f64,
    /// Mean time in a queue (engine or gateway) that counts as "waiting", seconds.
    pub queue_time: f64,
    /// KV-cache usage (0–1) that counts as high.
    pub kv_high: f64,
    /// GPU activity (0–1) at or above which the GPU is busy.
    pub gpu_busy: f64,
    /// GPU activity (0–1) below which the GPU is idle.
    pub gpu_idle: f64,
}

impl Default for Thresholds {
    /// The bench's default SLOs (TTFT p95 1 s, ITL p95 50 ms, 1% errors); a queue wait of a
    /// quarter of the TTFT objective.
    fn default() -> Self {
        Self {
            ttft_p95: 1.0,
            itl_p95: 0.05,
            error_ratio: 0.01,
            queue_time: 0.25,
            kv_high: 0.9,
            gpu_busy: 0.8,
            gpu_idle: 0.3,
        }
    }
}

/// One series that moved (or held), how far, and against what.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Evidence {
    /// The metric name actually read (an older name if that is what the source serves).
    pub series: String,
    /// What of it: `p95`, `mean`, `end`, `growth`, `per_s`, `ratio`, `increase`, …
    pub stat: &'static str,
    pub value: f64,
    pub unit: &'static str,
    /// `>`, `>=`, `<`, `<=` or `=`: how `value` compares with `threshold`.
    pub op: &'static str,
    pub threshold: Option<f64>,
    pub window_secs: f64,
    /// Whether this is the state now or what completed inside the window.
    pub basis: Basis,
}

/// Where a piece of evidence comes from, so a verdict can say how much of it is the present.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// A gauge read at the window's ends (or a histogram's silence judged by one): the state now.
    Instantaneous,
    /// A histogram observed when requests finish (or reach a first token): it lags the onset.
    Completions,
    /// A counter's increase over the window (requests, errors, preemptions, restarts).
    Counter,
}

/// How much of the evidence behind a verdict is instantaneous: each item as `series stat`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EvidenceBasis {
    pub instantaneous: Vec<String>,
    pub completions: Vec<String>,
    pub counter: Vec<String>,
}

impl EvidenceBasis {
    fn of<'a>(evidence: impl IntoIterator<Item = &'a Evidence>) -> Self {
        let mut out = Self::default();
        for e in evidence {
            let item = format!("{} {}", e.series, e.stat);
            let list = match e.basis {
                Basis::Instantaneous => &mut out.instantaneous,
                Basis::Completions => &mut out.completions,
                Basis::Counter => &mut out.counter,
            };
            if !list.contains(&item) {
                list.push(item);
            }
        }
        out
    }
}

/// The seven rows of the signal-combination table, and the slow replica the breakdown finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Suspect {
    ArrivalsExceedThroughput,
    LongPrompts,
    DecodeContention,
    KvPressure,
    GatewayTimeouts,
    ProcessHealth,
    GpuFault,
    /// One replica far slower than its peers at the same load (found in its slice only).
    SlowReplica,
}

impl Suspect {
    /// The signals that move together, the suspect, and the first response, in the seed's words.
    pub fn table_row(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Suspect::ArrivalsExceedThroughput => (
                "waiting, queue time and TTFT up",
                "arrivals exceed throughput",
                "cap concurrency and the queue; answer the overflow with a fast 429/503",
            ),
            Suspect::LongPrompts => (
                "queue low, prefill and TTFT up",
                "long prompts, tokenisation or CPU",
                "cap input tokens; normalise prefixes so the prefix cache hits",
            ),
            Suspect::DecodeContention => (
                "ITL and decode up, GPU busy",
                "too much decode concurrency",
                "cap output tokens; reserve capacity for short requests",
            ),
            Suspect::KvPressure => (
                "KV cache high, preemptions up",
                "too much context or too many sequences",
                "lower concurrency or context length; retest the cache settings",
            ),
            Suspect::GatewayTimeouts => (
                "engine healthy, gateway timeouts up",
                "proxy deadlines, buffering or connections",
                "set timeouts per boundary (first token, idle, total); check that streams are relayed unbuffered",
            ),
            Suspect::ProcessHealth => (
                "queue up, GPU activity low",
                "CPU, network or process health",
                "check the pod, the route and the host",
            ),
            Suspect::GpuFault => (
                "XID, ECC and restarts together",
                "GPU, driver or runtime fault",
                "take the replica out of the route, then triage the hardware",
            ),
            Suspect::SlowReplica => (
                "one replica's ITL or TTFT far above its peers' at the same load",
                "a slow replica: its GPU (clocks, thermals), host or neighbours",
                "take it out of the route; check its GPU clocks, its host and what shares them",
            ),
        }
    }
}

/// A row of the table that matched, with what made it match.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub suspect: Suspect,
    pub signals: &'static str,
    pub suspect_text: &'static str,
    pub first_response: &'static str,
    pub evidence: Vec<Evidence>,
    /// The models and replicas it also matches in on their own (`replica 10.0.0.7:8000`).
    pub at: Vec<String>,
    /// Matched only in those slices: the totals hide it (a local cause in one replica).
    pub only_in_slices: bool,
}

impl Finding {
    pub(crate) fn new(suspect: Suspect, evidence: Vec<Evidence>) -> Self {
        let (signals, suspect_text, first_response) = suspect.table_row();
        Self {
            suspect,
            signals,
            suspect_text,
            first_response,
            evidence,
            at: Vec::new(),
            only_in_slices: false,
        }
    }
}

/// Saturation: at least two of SLO breached, queue growing, errors above their objective.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Saturation {
    pub declared: bool,
    pub slo: Vec<Evidence>,
    pub queue_growth: Vec<Evidence>,
    pub errors: Vec<Evidence>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// No traffic in the window: nothing finished, nothing running or waiting, nothing in flight
    /// or refused at the gateway. Nothing was measured, so nothing is judged.
    Idle,
    /// Objectives met, nothing in the table matched.
    Healthy,
    /// Objectives met, nothing matched, and the GPUs or the concurrency limit are nearly full:
    /// no incident.
    BusyButHealthy,
    /// The gateway refused part of the traffic for its configured reasons (queue full, queue
    /// timeout, predicted wait, shed, tenant quota) and the requests it let in met their
    /// objectives: the limits are doing their job.
    Protected,
    /// An objective is breached, the service is saturated, or a row of the table matched.
    Incident,
    /// Not enough could be seen to decide.
    Unknown,
}

impl Status {
    /// 0 no incident (idle, healthy, busy but healthy, protected), 1 an incident, 2 could not
    /// diagnose. The status itself tells the four 0s apart.
    pub fn exit_code(self) -> u8 {
        match self {
            Status::Idle | Status::Healthy | Status::BusyButHealthy | Status::Protected => 0,
            Status::Incident => 1,
            Status::Unknown => 2,
        }
    }
}

/// Everything `diagnose` concludes about one window.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub status: Status,
    /// One line: what to tell the person on call.
    pub summary: String,
    pub window_secs: f64,
    pub thresholds: Thresholds,
    pub discovery: Vec<Found>,
    pub rows: Rows,
    /// The rows narrowed to each model and each replica.
    pub breakdown: Breakdown,
    /// Ranked, most specific first.
    pub findings: Vec<Finding>,
    pub saturation: Saturation,
    pub slo_breaches: Vec<Evidence>,
    /// Why the status is not an incident when the service is busy or refusing by design.
    pub healthy_evidence: Vec<Evidence>,
    /// How much of the evidence behind the status (breaches, findings, healthy evidence) is
    /// instantaneous, and how much lags behind completions or counts over the window.
    pub evidence_basis: EvidenceBasis,
    /// Where requests wait at the window's end, and what that says about the gateway's C.
    pub backlog: Option<crate::change::Backlog>,
    /// For an incident: what to change, with the number and the arithmetic behind it.
    pub changes: Vec<crate::change::Change>,
    /// What could not be seen, and so was not judged.
    pub blind_spots: Vec<String>,
    /// The InferenceService's conditions and the pods' restarts, when given.
    pub cluster: Cluster,
}

impl Verdict {
    pub fn exit_code(&self) -> u8 {
        self.status.exit_code()
    }

    pub fn window(&self) -> Duration {
        Duration::from_secs_f64(self.window_secs)
    }
}

/// The diagnosis of the window between two snapshots (plus what Kubernetes says, if given).
pub fn diagnose(start: &Snapshot, end: &Snapshot, thresholds: &Thresholds, cluster: &Cluster) -> Verdict {
    let window = Window::new(start, end);
    let found = catalog::discover(end);
    let reader = Reader {
        w: &window,
        found: &found,
    };
    let rows = rows::build(&reader);
    let mut blind_spots = blind_spots(&found, &rows);
    let (breakdown, local) = breakdown::build(start, end, thresholds);
    let outcome = rules::apply(&reader, &rows, thresholds, cluster, local, &mut blind_spots);
    let seen_layer = |l: Layer| found.iter().any(|f| f.layer == l && f.name.is_some());
    let decidable =
        rows.infrastructure.targets_up > 0 && (seen_layer(Layer::Engine) || seen_layer(Layer::Gateway));
    let not_ready: Vec<String> = cluster
        .not_ready()
        .map(|c| format!("{}={}", c.kind, c.reason.as_deref().unwrap_or("False")))
        .collect();
    let incident = !outcome.findings.is_empty()
        || !outcome.breaches.is_empty()
        || outcome.saturation.declared
        || !not_ready.is_empty();
    let status = if incident {
        Status::Incident
    } else if !decidable {
        Status::Unknown
    } else if !outcome.protected.is_empty() {
        Status::Protected
    } else if !traffic(&rows) {
        Status::Idle
    } else if !outcome.busy.is_empty() {
        Status::BusyButHealthy
    } else {
        Status::Healthy
    };
    let service = cluster.service.as_deref().unwrap_or("the InferenceService");
    // "Met" only where something was measured against the objective.
    let met = match outcome.user_ttft_p95 {
        Some(_) => "objectives met".to_owned(),
        None => "no objective breached, none measured: no first token observed in the window".to_owned(),
    };
    let fleet = crate::change::Fleet {
        engines: breakdown::engine_instances(end).len(),
        window_secs: window.secs(),
    };
    let advice = crate::change::advise(
        &rows,
        &outcome.findings,
        outcome.drained,
        status == Status::Incident,
        thresholds,
        &fleet,
    );
    let summary = match status {
        Status::Incident if outcome.findings.is_empty() && !not_ready.is_empty() => {
            format!(
                "{service} is not ready ({}): read its conditions and pod events first",
                not_ready.join(", ")
            )
        }
        Status::Incident => match outcome.findings.first() {
            Some(f) => {
                format!(
                    "{}suspect first: {}{} — {}",
                    if outcome.saturation.declared {
                        "saturated; "
                    } else {
                        ""
                    },
                    f.suspect_text,
                    if f.only_in_slices {
                        format!(" at {}", f.at.join(", "))
                    } else {
                        String::new()
                    },
                    f.first_response
                ) + &advice
                    .backlog
                    .as_ref()
                    .and_then(|b| b.clause())
                    .map(|c| format!("; {c}"))
                    .unwrap_or_default()
            }
            None if outcome.saturation.declared => {
                "saturated; no row of the table matched: read the rows".into()
            }
            None => "objectives breached; no row of the table matched: read the rows".into(),
        },
        Status::Protected => protected_summary(&rows, &met),
        Status::Idle => {
            "idle: no traffic in the window (nothing finished, running, waiting or refused): nothing to judge"
                .into()
        }
        Status::BusyButHealthy => format!("busy but healthy: {met}, no incident"),
        Status::Healthy => format!("healthy: {met}, nothing in the table matched"),
        Status::Unknown => "could not diagnose: no engine or gateway metrics were seen".into(),
    };
    let mut healthy_evidence = outcome.busy;
    for e in outcome.protected {
        // Busy and protected both cite the admitted's TTFT and ITL: once is enough.
        if !healthy_evidence
            .iter()
            .any(|h| h.series == e.series && h.stat == e.stat)
        {
            healthy_evidence.push(e);
        }
    }
    let evidence_basis = EvidenceBasis::of(
        outcome
            .breaches
            .iter()
            .chain(outcome.findings.iter().flat_map(|f| &f.evidence))
            .chain(&healthy_evidence),
    );
    Verdict {
        status,
        summary,
        window_secs: window.secs(),
        thresholds: *thresholds,
        discovery: found,
        rows,
        breakdown,
        findings: outcome.findings,
        saturation: outcome.saturation,
        slo_breaches: outcome.breaches,
        healthy_evidence,
        evidence_basis,
        backlog: advice.backlog,
        changes: advice.changes,
        blind_spots,
        cluster: cluster.clone(),
    }
}

/// Any sign of a request in the window: one finished, answered or refused, or one running,
/// waiting, queued or in flight at either end.
fn traffic(rows: &Rows) -> bool {
    let (u, e, g) = (&rows.user_impact, &rows.engine, &rows.generation);
    let held = |l: Option<crate::window::Level>| l.is_some_and(|l| l.peak() > 0.0);
    let moved = |v: Option<f64>| v.is_some_and(|v| v > 0.0);
    moved(u.requests_per_s)
        || moved(e.finished)
        || moved(g.generation_tokens_per_s)
        || moved(g.prompt_tokens_per_s)
        || !u.refused.is_empty()
        || moved(e.gateway_overflow)
        || moved(e.engine_overflow)
        || held(e.running)
        || held(e.waiting)
        || held(e.gateway_queued)
        || held(e.gateway_in_flight)
}

/// "protected: the gateway refused 45.5% by design (queue_full 30.0%, …); the admitted met …".
fn protected_summary(rows: &Rows, met: &str) -> String {
    let u = &rows.user_impact;
    let pct = |v: Option<f64>| v.map_or("?".to_owned(), |v| format!("{:.1}%", v * 100.0));
    let by = crate::rows::refused_by(&u.refused, pct);
    // Three refusals or more for each request served: the refused come straight back.
    let storm = match (u.refused_by_design_ratio, u.success_ratio) {
        (Some(r), Some(s)) if s > 0.0 && r / s >= 3.0 => format!(
            "; {:.0} refused for each served: clients sending again at once, a retry storm \
             (do they wait the Retry-After?)",
            r / s
        ),
        _ => String::new(),
    };
    let by_engine = u.refused.iter().any(|x| x.reason.starts_with("vllm:"));
    let by_gateway = u.refused.iter().any(|x| !x.reason.starts_with("vllm:"));
    let who = match (by_gateway, by_engine) {
        (true, true) => "the gateway and the engines",
        (false, true) => "the engines",
        _ => "the gateway",
    };
    format!(
        "protected: {who} refused {} of requests by design ({}); the admitted: {met}, \
         errors {}, goodput {} of those measured{storm}",
        pct(u.refused_by_design_ratio),
        by,
        pct(u.admitted_error_ratio),
        pct(u.goodput_ratio),
    )
}

fn blind_spots(found: &[Found], rows: &Rows) -> Vec<String> {
    let mut out = Vec::new();
    for layer in [Layer::Gateway, Layer::Engine, Layer::Gpu] {
        let (seen, missing): (Vec<&Found>, Vec<&Found>) = found
            .iter()
            .filter(|f| f.layer == layer)
            .partition(|f| f.name.is_some());
        let what = match layer {
            Layer::Gateway => "gateway (spillway_*)",
            Layer::Engine => "engine (vllm:*)",
            Layer::Gpu => "GPU (DCGM_FI_*)",
        };
        if seen.is_empty() {
            out.push(format!("no {what} series: that layer was not judged"));
        } else if !missing.is_empty() {
            let names: Vec<&str> = missing.iter().map(|f| f.wanted).collect();
            out.push(format!("{what} series missing: {}", names.join(", ")));
        }
    }
    for f in found.iter().filter(|f| f.renamed) {
        out.push(format!(
            "{} read under its older name {}",
            f.wanted,
            f.name.unwrap_or_default()
        ));
    }
    let u = &rows.user_impact;
    if u.seen_at == Some("engine") && u.cancellations_per_s.is_none() {
        out.push(
            "cancellations: vLLM 0.32 counts no aborted request (finished_reason=\"abort\" stays 0), so \
             clients that left, and the requests they were, are missing from the engines' counts; \
             scrape the gateway (spillway_cancellations_total) to see them"
                .to_owned(),
        );
    }
    if !rows.infrastructure.targets_down.is_empty() {
        out.push(format!(
            "targets not answering at the end of the window: {}",
            rows.infrastructure.targets_down.join(", ")
        ));
    }
    out
}
