//! The signal-combination table, the saturation rule and "busy but healthy", applied to the rows:
//! the signals computed once ([`signals`]), each row of the table a function ([`table`]), ranked.

mod signals;
mod table;

use crate::catalog::Key;
use crate::kube::Cluster;
use crate::rows::{Reader, Rows};
use crate::verdict::{Evidence, Finding, Saturation, Suspect, Thresholds};
use signals::Signals;

pub(crate) struct Outcome {
    pub(crate) findings: Vec<Finding>,
    pub(crate) breaches: Vec<Evidence>,
    /// The objectives breached, by name: `ttft`, `itl`, `errors`.
    pub(crate) breached: Vec<&'static str>,
    /// TTFT and ITL p95 as the user sees them: the gateway's when it relays, else the engines'.
    pub(crate) user_ttft_p95: Option<f64>,
    pub(crate) user_itl_p95: Option<f64>,
    pub(crate) saturation: Saturation,
    pub(crate) busy: Vec<Evidence>,
    /// Why refusals by design are the limits doing their job: the refused share and the
    /// admitted requests inside their objectives. Empty unless nothing else is wrong.
    pub(crate) protected: Vec<Evidence>,
    /// Waits seen (in queue time, or in the TTFT of requests that have not finished) with no
    /// queue at the window's end: the queue drained.
    pub(crate) drained: bool,
}

/// Most specific first: a cause outranks the symptoms it produces (preemptions fill the queue, a
/// hung process fills it too), and arrivals-exceed-throughput is what is left.
const RANK: [Suspect; 8] = [
    Suspect::GpuFault,
    Suspect::KvPressure,
    Suspect::ProcessHealth,
    Suspect::SlowReplica,
    Suspect::GatewayTimeouts,
    Suspect::DecodeContention,
    Suspect::LongPrompts,
    Suspect::ArrivalsExceedThroughput,
];

/// The table applied to the rows: compute the signals, run the table, rank. `local` holds the
/// findings of each model's and replica's slice (empty when judging a slice): they say where the
/// totals' findings match, and raise the local causes the totals hide, before the ranking and
/// "busy but healthy" are decided.
pub(crate) fn apply(
    r: &Reader<'_>,
    rows: &Rows,
    t: &Thresholds,
    cluster: &Cluster,
    local: Vec<(String, Finding)>,
    blind: &mut Vec<String>,
) -> Outcome {
    let s = signals::compute(r, rows, t, cluster);
    let mut found: Vec<Finding> = Vec::new();
    for row in table::TABLE {
        let Some(f) = row(&s, blind) else { continue };
        // Two rows may name one suspect (a hang seen in the gauges and in a frozen scrape): one
        // finding, with both rows' evidence.
        match found.iter_mut().find(|g| g.suspect == f.suspect) {
            Some(g) => g.evidence.extend(f.evidence),
            None => found.push(f),
        }
    }
    if found.is_empty() {
        found.extend(table::backlog_left(&s));
    }
    crate::breakdown::place(&mut found, local);
    found.sort_by_key(|f| RANK.iter().position(|x| *x == f.suspect));
    backlog_before_an_unseen_gpu(&mut found, &s);
    let saturation = saturation(&s);
    let calm = found.is_empty() && s.breaches().is_empty() && !saturation.declared;
    Outcome {
        busy: if calm { busy(&s) } else { Vec::new() },
        protected: if calm { protected(&s) } else { Vec::new() },
        findings: found,
        breaches: s.breaches(),
        breached: s.breached(),
        user_ttft_p95: s.user_ttft.map(|(_, v)| v),
        user_itl_p95: s.user_itl.map(|(_, v)| v),
        saturation,
        drained: s.drained_seen || (s.queue_time_high && !s.queue_present),
    }
}

/// Decode contention judged on ITL alone (no GPU activity seen) is the weaker claim beside a
/// backlog that grows or is held at the engine's cap and takes longer than the queue-time line to
/// drain: the gaps then come as much from the queue's prefills joining every step as from the
/// batch's size, and the backlog is certain. It goes second.
fn backlog_before_an_unseen_gpu(found: &mut [Finding], s: &Signals<'_>) {
    let backlog = s.queue_now && !s.fleeting && (s.at_cap || s.queue_growth);
    if s.gpu_peak.is_some() || !backlog {
        return;
    }
    let at = |x: Suspect| found.iter().position(|f| f.suspect == x);
    if let (Some(d), Some(a)) = (
        at(Suspect::DecodeContention),
        at(Suspect::ArrivalsExceedThroughput),
    ) && d < a
    {
        found[d..=a].rotate_right(1);
    }
}

/// Saturation is declared when two or more of SLO worsening, queue growth and errors move
/// together (DESIGN §6).
fn saturation(s: &Signals<'_>) -> Saturation {
    let mut saturation = Saturation {
        slo: [s.ttft_breach.clone(), s.itl_breach.clone()]
            .into_iter()
            .flatten()
            .collect(),
        // An engine at its cap with a queue that takes long to drain is saturated whatever the
        // queue's trend.
        queue_growth: if s.queue_growth {
            s.queue_ev.clone()
        } else if s.at_cap {
            s.queue_ev.iter().chain(&s.backlog_ev).cloned().collect()
        } else {
            Vec::new()
        },
        errors: s.error_breach.clone().into_iter().collect(),
        declared: false,
    };
    let moving = [
        !saturation.slo.is_empty(),
        !saturation.queue_growth.is_empty(),
        !saturation.errors.is_empty(),
    ];
    saturation.declared = moving.iter().filter(|m| **m).count() >= 2;
    saturation
}

/// Why a window with nothing wrong is busy: the GPUs or the gateway's slots nearly full, with
/// the objectives met.
fn busy(s: &Signals<'_>) -> Vec<Evidence> {
    let (c, e, t) = (&s.c, s.e, s.t);
    let mut busy = Vec::new();
    if let Some((k, v)) = s.gpu.filter(|(_, v)| *v >= t.gpu_busy) {
        busy.push(c.ev(k, "end", v, "ratio", ">=", Some(t.gpu_busy)));
    }
    if let (Some(f), Some(limit)) = (e.gateway_in_flight, e.gateway_concurrency_limit)
        && limit > 0.0
        && f.mean() >= 0.8 * limit
    {
        busy.push(c.ev(
            Key::GwInFlight,
            "mean",
            f.mean(),
            "requests",
            ">=",
            Some(0.8 * limit),
        ));
    }
    if !busy.is_empty() {
        busy.extend(met(s));
    }
    busy
}

/// The user's TTFT and ITL inside their objectives.
fn met(s: &Signals<'_>) -> Vec<Evidence> {
    let (c, t) = (&s.c, s.t);
    let ttft = s
        .user_ttft
        .map(|(k, v)| c.ev(k, "p95", v, "s", "<=", Some(t.ttft_p95)));
    let itl = s
        .user_itl
        .map(|(k, v)| c.ev(k, "p95", v, "s", "<=", Some(t.itl_p95)));
    ttft.into_iter().chain(itl).collect()
}

/// Why refusals by design are the limits doing their job: the refused share and the admitted
/// requests inside their objectives.
fn protected(s: &Signals<'_>) -> Vec<Evidence> {
    let (c, u, t) = (&s.c, s.u, s.t);
    if u.refused.is_empty() {
        return Vec::new();
    }
    let mut protected = Vec::new();
    if let Some(v) = u.refused_by_design_ratio {
        protected.push(c.ev(Key::GwRejections, "refused_by_design_ratio", v, "", "=", None));
    }
    for x in &u.refused {
        let team = x
            .team
            .as_ref()
            .map(|t| format!(",team=\"{t}\""))
            .unwrap_or_default();
        protected.push(Evidence {
            series: format!("{}{{reason=\"{}\"{team}}}", c.series(Key::GwRejections), x.reason),
            ..c.ev(Key::GwRejections, "increase", x.requests, "requests", "=", None)
        });
    }
    if let Some(v) = u.admitted_error_ratio {
        protected.push(c.ev(
            Key::GwRequests,
            "admitted_error_ratio",
            v,
            "",
            "<=",
            Some(t.error_ratio),
        ));
    }
    protected.extend(met(s));
    if let Some(v) = u.goodput_ratio {
        protected.push(c.ev(Key::GwGoodput, "admitted_ratio", v, "", "=", None));
    }
    protected
}

#[cfg(test)]
mod tests;
