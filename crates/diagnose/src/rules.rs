//! The signal-combination table, the saturation rule and "busy but healthy", applied to the rows.

use crate::catalog::{Key, Kind, SIGNALS};
use crate::kube::Cluster;
use crate::rows::{Reader, Rows};
use crate::verdict::{Basis, Evidence, Finding, Saturation, Suspect, Thresholds};
use crate::window::{Distribution, Level};

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

struct Ctx<'a> {
    r: &'a Reader<'a>,
    secs: f64,
}

impl Ctx<'_> {
    fn series(&self, key: Key) -> String {
        self.r.name(key).map_or_else(
            || {
                SIGNALS
                    .iter()
                    .find(|s| s.key == key)
                    .map_or("?", |s| s.names[0])
                    .to_owned()
            },
            str::to_owned,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn ev(
        &self,
        key: Key,
        stat: &'static str,
        value: f64,
        unit: &'static str,
        op: &'static str,
        threshold: Option<f64>,
    ) -> Evidence {
        let basis = match SIGNALS.iter().find(|s| s.key == key).map(|s| s.kind) {
            Some(Kind::Gauge) => Basis::Instantaneous,
            Some(Kind::Histogram) => Basis::Completions,
            Some(Kind::Counter) | None => Basis::Counter,
        };
        Evidence {
            series: self.series(key),
            stat,
            value,
            unit,
            op,
            threshold,
            window_secs: self.secs,
            basis,
        }
    }
}

/// A distribution's p95 when it observed anything.
fn p95(d: Option<Distribution>) -> Option<f64> {
    d.filter(|d| d.count > 0.0).and_then(|d| d.p95)
}

fn mean(d: Option<Distribution>) -> Option<f64> {
    d.filter(|d| d.count > 0.0).and_then(|d| d.mean)
}

/// The evidence of a wait the queue-time histogram has not seen yet (see its call); empty when
/// the TTFT is inside its objective, explained by prefill, or not the unfinished requests'.
fn drained_wait(
    c: &Ctx<'_>,
    g: &crate::rows::Generation,
    e: &crate::rows::EngineRow,
    t: &Thresholds,
    queue_time: Option<f64>,
) -> Vec<Evidence> {
    let Some(ttft) = g.engine_ttft.filter(|d| d.count > 0.0) else {
        return Vec::new();
    };
    let Some(ttft_p95) = ttft.p95.filter(|v| *v > t.ttft_p95) else {
        return Vec::new();
    };
    let prefill = p95(e.prefill_time).or(mean(e.prefill_time));
    let finished = e.queue_time.map_or(0.0, |d| d.count);
    let unfinished = ttft.count - finished;
    let slow =
        c.r.name(Key::Ttft)
            .and_then(|name| c.r.w.observed_above(name, t.ttft_p95));
    let Some(slow) = slow else {
        return Vec::new();
    };
    // Prefill explains a slow first token when it took half of it; with nothing finished to
    // time it, when the window's work was mostly prompt tokens.
    let prefill_explains = match prefill {
        Some(p) => p >= ttft_p95 / 2.0,
        None => g
            .prompt_tokens_per_s
            .zip(g.generation_tokens_per_s)
            .is_none_or(|(prompt, generated)| prompt >= generated),
    };
    if queue_time.is_some_and(|v| v > t.queue_time)
        || prefill_explains
        || unfinished < 1.0
        || slow > unfinished
    {
        return Vec::new();
    }
    let prefill_ev = match prefill {
        Some(p) => c.ev(Key::PrefillTime, "p95", p, "s", "<", Some(ttft_p95 / 2.0)),
        None => c.ev(
            Key::PromptTokens,
            "per_s",
            g.prompt_tokens_per_s.unwrap_or(0.0),
            "tokens/s",
            "<",
            g.generation_tokens_per_s,
        ),
    };
    vec![
        c.ev(
            Key::Ttft,
            "over_objective",
            slow,
            "requests",
            "<=",
            Some(unfinished),
        ),
        c.ev(
            Key::QueueTime,
            "unobserved_unfinished",
            unfinished,
            "requests",
            ">=",
            Some(1.0),
        ),
        prefill_ev,
    ]
}

/// The table applied to the rows. `local` holds the findings of each model's and replica's slice
/// (empty when judging a slice): they say where the totals' findings match, and raise the local
/// causes the totals hide, before the ranking and "busy but healthy" are decided.
pub(crate) fn apply(
    r: &Reader<'_>,
    rows: &Rows,
    t: &Thresholds,
    cluster: &Cluster,
    local: Vec<(String, Finding)>,
    blind: &mut Vec<String>,
) -> Outcome {
    let c = Ctx { r, secs: r.w.secs() };
    let (g, e, u, infra) = (
        &rows.generation,
        &rows.engine,
        &rows.user_impact,
        &rows.infrastructure,
    );

    // The user's TTFT and ITL: the gateway's when it relays, else the engines'.
    let user_ttft = p95(g.gateway_ttft)
        .map(|v| (Key::GwTtft, v))
        .or_else(|| p95(g.engine_ttft).map(|v| (Key::Ttft, v)));
    let user_itl = p95(g.gateway_itl)
        .map(|v| (Key::GwItl, v))
        .or_else(|| p95(g.engine_itl).map(|v| (Key::Itl, v)));
    let error_key = if u.seen_at == Some("gateway") {
        Key::GwRequests
    } else {
        Key::RequestSuccess
    };
    // Onset. TTFT is observed at a first token and queue time when a request finishes, so the
    // first seconds of a flood leave them empty. A queue at the window's end is held (not one
    // request caught between its arrival and the scheduler's next step) when it stood at both
    // ends, or when the engine runs the same number at both ends (vLLM moves a waiting request
    // into the batch at its next step if it can: a steady maximum is its cap) or the gateway's
    // slots were all taken at both ends. No first token while a queue is held is the worst case.
    let stood = |l: Option<Level>| l.is_some_and(|l| l.end >= 1.0 && l.start.is_some_and(|s| s >= 1.0));
    let running_steady = e.running.filter(|l| l.end >= 1.0 && l.start == Some(l.end));
    let slots_full = e
        .gateway_in_flight
        .zip(e.gateway_concurrency_limit)
        .is_some_and(|(f, limit)| limit > 0.0 && f.end >= limit && f.start.is_some_and(|s| s >= limit));
    let engine_held =
        e.waiting.is_some_and(|l| l.end >= 1.0) && (stood(e.waiting) || running_steady.is_some());
    let gateway_held =
        e.gateway_queued.is_some_and(|l| l.end >= 1.0) && (stood(e.gateway_queued) || slots_full);
    let waiting_now = e.waiting.map_or(0.0, |l| l.end) + e.gateway_queued.map_or(0.0, |l| l.end);
    let instant = |mut ev: Evidence| {
        ev.basis = Basis::Instantaneous;
        ev
    };
    let ttft_unobserved = (user_ttft.is_none() && (engine_held || gateway_held)).then(|| {
        let key = if r.name(Key::GwTtft).is_some() {
            Key::GwTtft
        } else {
            Key::Ttft
        };
        instant(c.ev(
            key,
            "unobserved_while_waiting",
            waiting_now,
            "requests",
            ">=",
            Some(1.0),
        ))
    });
    let ttft_breach = user_ttft
        .filter(|(_, v)| *v > t.ttft_p95)
        .map(|(k, v)| c.ev(k, "p95", v, "s", ">", Some(t.ttft_p95)))
        .or(ttft_unobserved);
    let itl_breach = user_itl
        .filter(|(_, v)| *v > t.itl_p95)
        .map(|(k, v)| c.ev(k, "p95", v, "s", ">", Some(t.itl_p95)));
    // The errors of the admitted: the gateway's refusals by design are its limits working, judged
    // apart (protected), not failures.
    let (error_stat, error_ratio) = if u.refused.is_empty() {
        ("error_ratio", u.error_ratio)
    } else {
        ("admitted_error_ratio", u.admitted_error_ratio)
    };
    let error_breach = error_ratio
        .filter(|v| *v > t.error_ratio)
        .map(|v| c.ev(error_key, error_stat, v, "", ">", Some(t.error_ratio)));
    let breaches: Vec<Evidence> = [ttft_breach.clone(), itl_breach.clone(), error_breach.clone()]
        .into_iter()
        .flatten()
        .collect();
    let breached = [
        ("ttft", &ttft_breach),
        ("itl", &itl_breach),
        ("errors", &error_breach),
    ]
    .into_iter()
    .filter_map(|(name, b)| b.is_some().then_some(name))
    .collect();

    // Queues: the engines' waiting list and the gateway's admission queue.
    let present = |l: Option<Level>| l.is_some_and(|l| l.end >= 1.0);
    let growing = |l: Option<Level>| l.is_some_and(|l| l.end >= 1.0 && l.growth() > 0.0);
    let overflow = e.gateway_overflow > Some(0.0) || e.engine_overflow > Some(0.0);
    let queue_present = present(e.waiting) || present(e.gateway_queued) || overflow;
    let mut queue_ev = Vec::new();
    if let Some(w) = e.waiting.filter(|l| l.end >= 1.0) {
        queue_ev.push(c.ev(Key::Waiting, "end", w.end, "requests", ">=", Some(1.0)));
        if w.growth() > 0.0 {
            queue_ev.push(c.ev(Key::Waiting, "growth", w.growth(), "requests", ">", Some(0.0)));
        }
    }
    if let Some(q) = e.gateway_queued.filter(|l| l.end >= 1.0) {
        queue_ev.push(c.ev(Key::GwQueued, "end", q.end, "requests", ">=", Some(1.0)));
        if q.growth() > 0.0 {
            queue_ev.push(c.ev(Key::GwQueued, "growth", q.growth(), "requests", ">", Some(0.0)));
        }
    }
    if let Some(o) = e.gateway_overflow.filter(|v| *v > 0.0) {
        queue_ev.push(c.ev(
            Key::GwRejections,
            "queue_full+queue_timeout",
            o,
            "requests",
            ">",
            Some(0.0),
        ));
    }
    if let Some(o) = e.engine_overflow.filter(|v| *v > 0.0) {
        queue_ev.push(c.ev(Key::EngineRejections, "increase", o, "requests", ">", Some(0.0)));
    }
    let queue_growth = growing(e.waiting) || growing(e.gateway_queued) || overflow;
    let engine_queue_time = mean(e.queue_time);
    let gateway_queue_time = mean(e.gateway_queue_wait);
    let mut queue_time_ev = Vec::new();
    if let Some(v) = engine_queue_time.filter(|v| *v > t.queue_time) {
        queue_time_ev.push(c.ev(Key::QueueTime, "mean", v, "s", ">", Some(t.queue_time)));
    }
    if let Some(v) = gateway_queue_time.filter(|v| *v > t.queue_time) {
        queue_time_ev.push(c.ev(Key::GwQueueWait, "mean", v, "s", ">", Some(t.queue_time)));
    }
    // The gateway times what still waits: a request that has waited past the line now is a long
    // wait whatever the finished ones say.
    if let Some(old) = e.gateway_oldest_wait.filter(|l| l.end > t.queue_time) {
        queue_time_ev.push(c.ev(Key::GwOldestWait, "end", old.end, "s", ">", Some(t.queue_time)));
    }
    // At onset nothing has left the queue to be timed: a held queue with no queue time observed
    // is the evidence, unless the engine makes no progress at all (a hang, rule 6's, not a flood).
    let stuck = e.running.is_some_and(|l| l.end >= 1.0) && g.generation_tokens_per_s == Some(0.0);
    let unobserved = [
        (engine_held, engine_queue_time, Key::QueueTime, e.waiting),
        (
            gateway_held,
            gateway_queue_time,
            Key::GwQueueWait,
            e.gateway_queued,
        ),
    ];
    for (held, observed, key, queue) in unobserved {
        if !stuck && held && observed.is_none() {
            let waiting = queue.map_or(0.0, |l| l.end);
            let ev = c.ev(
                key,
                "unobserved_while_waiting",
                waiting,
                "requests",
                ">=",
                Some(1.0),
            );
            queue_time_ev.push(instant(ev));
        }
    }
    if !queue_time_ev.is_empty() {
        if let Some(run) = running_steady.filter(|_| engine_held) {
            queue_time_ev.push(c.ev(Key::Running, "steady", run.end, "requests", "=", None));
        }
        // A full KV cache is why a batch stops taking requests before its sequence cap.
        if let Some(kv) = e.kv_usage.filter(|l| engine_held && l.end >= t.kv_high) {
            queue_time_ev.push(c.ev(Key::KvUsage, "end", kv.end, "ratio", ">=", Some(t.kv_high)));
        }
        if slots_full && gateway_held {
            let f = e.gateway_in_flight.map_or(0.0, |l| l.end);
            queue_time_ev.push(c.ev(
                Key::GwInFlight,
                "at_limit",
                f,
                "requests",
                ">=",
                e.gateway_concurrency_limit,
            ));
        }
    }
    // A queue that stood through a window without a first token: those waiting at its start
    // have waited at least the window.
    if !queue_time_ev.is_empty() && user_ttft.is_none() && (stood(e.waiting) || stood(e.gateway_queued)) {
        let key = if stood(e.waiting) {
            Key::Waiting
        } else {
            Key::GwQueued
        };
        queue_time_ev.push(c.ev(
            key,
            "waited_at_least",
            c.secs,
            "s",
            if c.secs > t.ttft_p95 { ">" } else { "<=" },
            Some(t.ttft_p95),
        ));
    }
    // vLLM times the queue when a request finishes and TTFT at its first token: requests that
    // waited, then got a first token and have not finished show in TTFT alone, and the queue
    // may have drained by the window's end. TTFT over its objective that the finished requests'
    // prefill does not explain, with no more slow first tokens than unfinished ones, is that
    // wait. (Slow first tokens of requests that finished with a short queue and prefill point
    // before the engine: tokenisation or the API server's CPU, rule 2.)
    let drained = drained_wait(&c, g, e, t, engine_queue_time);
    let drained_seen = !drained.is_empty();
    queue_time_ev.extend(drained);
    let queue_time_high = !queue_time_ev.is_empty();

    // The GPUs: graphics-engine activity when DCGM profiles, else utilisation. DCGM averages
    // each sample over its own period, so the ends are read as they are, not averaged together:
    // busy at either end counts for decode contention (a window that opens as the load arrives
    // starts idle), idle means idle now.
    let gpu_level = infra
        .gpu_engine_active
        .map(|l| (Key::GrEngineActive, l))
        .or_else(|| infra.gpu_util.map(|l| (Key::GpuUtil, l)));
    let gpu_peak = gpu_level.map(|(k, l)| (k, l.peak()));
    let gpu = gpu_level.map(|(k, l)| (k, l.end));
    let gpu_ev = |stat: &'static str, op: &'static str, th: f64| {
        let (k, v) = if stat == "peak" { gpu_peak? } else { gpu? };
        Some(c.ev(k, stat, v, "ratio", op, Some(th)))
    };

    let mut found: Vec<Finding> = Vec::new();

    // 1. Arrivals exceed throughput: waiting, queue time and TTFT up together. Queue time over
    // its line is the wait itself: a burst whose queue drained before the window's end still
    // matches (its backlog reads "drained").
    if queue_time_high && let Some(ttft) = ttft_breach.clone() {
        let mut ev = queue_ev.clone();
        ev.extend(queue_time_ev.clone());
        ev.push(ttft);
        found.push(Finding::new(Suspect::ArrivalsExceedThroughput, ev));
    }

    // 2. Queue low, prefill and TTFT up: long prompts, tokenisation, CPU.
    if let Some(ttft) = ttft_breach.clone()
        && !queue_time_high
        && !queue_present
    {
        let mut ev = vec![ttft];
        if let Some(v) = engine_queue_time {
            ev.push(c.ev(Key::QueueTime, "mean", v, "s", "<=", Some(t.queue_time)));
        }
        if let Some(v) = mean(e.prefill_time) {
            ev.push(c.ev(Key::PrefillTime, "mean", v, "s", "=", None));
        }
        if let Some(v) = g.prompt_tokens_per_request {
            ev.push(c.ev(Key::PromptTokens, "per_request", v, "tokens", "=", None));
        }
        found.push(Finding::new(Suspect::LongPrompts, ev));
    }

    // 3. ITL and decode up with the GPU busy: too much decode concurrency.
    if let Some(itl) = itl_breach.clone() {
        let gpu_ok = match gpu_peak {
            Some((_, v)) => v >= t.gpu_busy,
            None => {
                blind.push("GPU activity unseen: decode contention judged on ITL alone".into());
                true
            }
        };
        if gpu_ok {
            let mut ev = vec![itl];
            if let Some(v) = mean(e.decode_time) {
                ev.push(c.ev(Key::DecodeTime, "mean", v, "s", "=", None));
            }
            ev.extend(gpu_ev("peak", ">=", t.gpu_busy));
            if let Some(run) = e.running {
                ev.push(c.ev(Key::Running, "mean", run.mean(), "requests", "=", None));
            }
            found.push(Finding::new(Suspect::DecodeContention, ev));
        }
    }

    // 4. KV cache high and preemptions up.
    if let (Some(kv), Some(pre)) = (e.kv_usage, e.preemptions)
        && kv.peak() >= t.kv_high
        && pre > 0.0
    {
        found.push(Finding::new(
            Suspect::KvPressure,
            vec![
                c.ev(Key::KvUsage, "peak", kv.peak(), "ratio", ">=", Some(t.kv_high)),
                c.ev(Key::Preemptions, "increase", pre, "preemptions", ">", Some(0.0)),
            ],
        ));
    }

    // 5. Engine healthy, gateway timeouts up.
    if u.seen_at == Some("gateway")
        && let (Some(to), Some(all)) = (u.timeouts_per_s, u.requests_per_s)
        && to > 0.0
        && all > 0.0
        && to / all > t.error_ratio
    {
        let engine_ttft = p95(g.engine_ttft);
        let engine_itl = p95(g.engine_itl);
        let engine_seen = e.running.is_some();
        // A queue the engine holds through the window, not one request caught between its
        // arrival and the next scheduler step when the gauge was read (closed-loop clients
        // whose streams are cut come back at once).
        let engine_ok = engine_seen
            && engine_ttft.is_none_or(|v| v <= t.ttft_p95)
            && engine_itl.is_none_or(|v| v <= t.itl_p95)
            && !e.waiting.is_some_and(|l| l.mean() >= 1.0);
        if !engine_seen {
            blind.push(
                "gateway timeouts seen but no engine metrics: cannot tell whether the engines are healthy"
                    .into(),
            );
        } else if engine_ok {
            let mut ev = vec![c.ev(
                Key::GwRequests,
                "timeout_ratio",
                to / all,
                "",
                ">",
                Some(t.error_ratio),
            )];
            if let Some(v) = engine_ttft {
                ev.push(c.ev(Key::Ttft, "p95", v, "s", "<=", Some(t.ttft_p95)));
            }
            if let Some(v) = engine_itl {
                ev.push(c.ev(Key::Itl, "p95", v, "s", "<=", Some(t.itl_p95)));
            }
            if let Some(w) = e.waiting {
                ev.push(c.ev(Key::Waiting, "end", w.end, "requests", "<", Some(1.0)));
            }
            found.push(Finding::new(Suspect::GatewayTimeouts, ev));
        }
    }

    // 6. Queue up with the GPU idle (or the engine making no progress): CPU, network, process.
    // Requests running through the whole window and more still taken into the batch while
    // nothing comes out: a queue of the engine's own, which a scheduler with room to spare never
    // moves to `waiting`. (One request that arrived at the window's end and is still in prefill
    // is not a hang.)
    let piling = stuck
        && e.running
            .is_some_and(|l| l.start.is_some_and(|s| s >= 1.0) && l.growth() > 0.0);
    // A queue now, not refusals counted earlier in the window: a burst refused at a queue limit
    // that then went quiet leaves the GPU idle at the end with nothing wrong.
    let queue_now = present(e.waiting) || present(e.gateway_queued);
    if (queue_now && (queue_growth || queue_time_high)) || piling {
        let idle = gpu.is_some_and(|(_, v)| v < t.gpu_idle);
        if idle || (gpu.is_none() && stuck) {
            let mut ev = queue_ev.clone();
            ev.extend(queue_time_ev.clone());
            ev.extend(gpu_ev("end", "<", t.gpu_idle));
            if let Some(run) = e.running.filter(|_| piling) {
                ev.push(c.ev(Key::Running, "growth", run.growth(), "requests", ">", Some(0.0)));
            }
            if stuck {
                ev.push(c.ev(Key::GenerationTokens, "per_s", 0.0, "tokens/s", "=", Some(0.0)));
            }
            found.push(Finding::new(Suspect::ProcessHealth, ev));
        }
    }

    // 6b. A target that claims work in hand (running or waiting) while not one of its samples
    // moved — counters, histograms, gauges — is a scrape served from a cache or a frozen
    // process: its figures are not the present, and nothing it runs is progressing.
    let mut frozen_ev = Vec::new();
    for instance in r.w.frozen_instances() {
        let held = |key: Key| {
            r.name(key).map_or(0.0, |name| {
                r.w.end
                    .named(name)
                    .filter(|s| s.label("instance") == Some(instance.as_str()))
                    .map(|s| s.value)
                    .sum::<f64>()
            })
        };
        let (running, waiting) = (held(Key::Running), held(Key::Waiting));
        if running + waiting >= 1.0 {
            let samples =
                r.w.end
                    .series
                    .iter()
                    .filter(|s| s.name != "up" && s.label("instance") == Some(instance.as_str()))
                    .count();
            frozen_ev.push(Evidence {
                series: format!(
                    "every sample of {instance} ({samples}) unchanged while it reports {} running, {} waiting",
                    running, waiting
                ),
                stat: "frozen",
                value: c.secs,
                unit: "s",
                op: "=",
                threshold: None,
                window_secs: c.secs,
                basis: Basis::Instantaneous,
            });
            blind.push(format!(
                "{instance}: not one sample moved in {:.1} s while it reports work in hand: a \
                 stale scrape (a metrics cache, a lagging federation) or a frozen process; its \
                 figures are not the present",
                c.secs
            ));
        }
    }
    if !frozen_ev.is_empty() {
        match found.iter_mut().find(|f| f.suspect == Suspect::ProcessHealth) {
            Some(f) => f.evidence.extend(frozen_ev),
            None => found.push(Finding::new(Suspect::ProcessHealth, frozen_ev)),
        }
    }

    // 7. XID, ECC and restarts together.
    let xid = infra.xid.filter(|v| *v > 0.0);
    let ecc = infra.ecc_dbe.filter(|l| l.end > 0.0);
    if xid.is_some() || ecc.is_some() {
        // One line per sick GPU, with its labels: which GPU to take out of the route.
        let mut ev = Vec::new();
        for (key, stat, unit) in [(Key::Xid, "last", "xid"), (Key::EccDbe, "end", "errors")] {
            let Some(name) = r.name(key) else { continue };
            for s in r.w.end.series.iter().filter(|s| s.name == name && s.value > 0.0) {
                let labels: Vec<String> = s.labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
                ev.push(Evidence {
                    series: format!("{name}{{{}}}", labels.join(",")),
                    stat,
                    value: s.value,
                    unit,
                    op: ">",
                    threshold: Some(0.0),
                    window_secs: c.secs,
                    basis: Basis::Instantaneous,
                });
            }
        }
        for i in &infra.restarted {
            ev.push(Evidence {
                series: format!("counters of {i} went back (process restarted)"),
                stat: "restart",
                value: 1.0,
                unit: "",
                op: "=",
                threshold: None,
                window_secs: c.secs,
                basis: Basis::Counter,
            });
        }
        for restart in cluster.restarts_within(r.w.start.at, r.w.end.at) {
            ev.push(Evidence {
                series: format!("pod {} container {} restarted", restart.pod, restart.container),
                stat: "restart",
                value: restart.count as f64,
                unit: "restarts",
                op: "=",
                threshold: None,
                window_secs: c.secs,
                basis: Basis::Counter,
            });
        }
        found.push(Finding::new(Suspect::GpuFault, ev));
    }

    crate::breakdown::place(&mut found, local);
    found.sort_by_key(|f| RANK.iter().position(|s| *s == f.suspect));

    let mut saturation = Saturation {
        slo: [ttft_breach, itl_breach].into_iter().flatten().collect(),
        queue_growth: if queue_growth { queue_ev } else { Vec::new() },
        errors: error_breach.into_iter().collect(),
        declared: false,
    };
    let moving = [
        !saturation.slo.is_empty(),
        !saturation.queue_growth.is_empty(),
        !saturation.errors.is_empty(),
    ];
    saturation.declared = moving.iter().filter(|m| **m).count() >= 2;

    let mut busy = Vec::new();
    if found.is_empty() && breaches.is_empty() && !saturation.declared {
        if let Some((k, v)) = gpu.filter(|(_, v)| *v >= t.gpu_busy) {
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
            busy.extend(user_ttft.map(|(k, v)| c.ev(k, "p95", v, "s", "<=", Some(t.ttft_p95))));
            busy.extend(user_itl.map(|(k, v)| c.ev(k, "p95", v, "s", "<=", Some(t.itl_p95))));
        }
    }

    let mut protected = Vec::new();
    if found.is_empty() && breaches.is_empty() && !saturation.declared && !u.refused.is_empty() {
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
        protected.extend(user_ttft.map(|(k, v)| c.ev(k, "p95", v, "s", "<=", Some(t.ttft_p95))));
        protected.extend(user_itl.map(|(k, v)| c.ev(k, "p95", v, "s", "<=", Some(t.itl_p95))));
        if let Some(v) = u.goodput_ratio {
            protected.push(c.ev(Key::GwGoodput, "admitted_ratio", v, "", "=", None));
        }
    }

    Outcome {
        findings: found,
        breaches,
        breached,
        user_ttft_p95: user_ttft.map(|(_, v)| v),
        user_itl_p95: user_itl.map(|(_, v)| v),
        saturation,
        busy,
        protected,
        drained: drained_seen || (queue_time_high && !queue_present),
    }
}

#[cfg(test)]
mod tests;
