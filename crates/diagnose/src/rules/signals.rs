//! What the table's rows read, computed once from the rows: the objectives breached, the queues
//! and their waits, the GPU's activity, and the evidence each of them stands on.

use crate::catalog::{Key, Kind, SIGNALS};
use crate::kube::Cluster;
use crate::rows::{EngineRow, Generation, Infrastructure, Reader, Rows, UserImpact};
use crate::verdict::{Basis, Evidence, Thresholds};
use crate::window::{Distribution, Level};

/// Evidence written against the window being judged.
pub(crate) struct Ctx<'a> {
    pub(crate) r: &'a Reader<'a>,
    pub(crate) secs: f64,
}

impl Ctx<'_> {
    pub(crate) fn series(&self, key: Key) -> String {
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
    pub(crate) fn ev(
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

    /// Evidence of the state now, whatever the series' kind (a histogram's silence, a backlog's
    /// drain time).
    pub(crate) fn now(
        &self,
        key: Key,
        stat: &'static str,
        value: f64,
        unit: &'static str,
        op: &'static str,
        threshold: Option<f64>,
    ) -> Evidence {
        Evidence {
            basis: Basis::Instantaneous,
            ..self.ev(key, stat, value, unit, op, threshold)
        }
    }
}

/// A distribution's p95 when it observed anything.
pub(crate) fn p95(d: Option<Distribution>) -> Option<f64> {
    d.filter(|d| d.count > 0.0).and_then(|d| d.p95)
}

pub(crate) fn mean(d: Option<Distribution>) -> Option<f64> {
    d.filter(|d| d.count > 0.0).and_then(|d| d.mean)
}

/// A gauge at or over one at the window's end.
pub(crate) fn present(l: Option<Level>) -> bool {
    l.is_some_and(|l| l.end >= 1.0)
}

/// A gauge at or over one at both ends.
pub(crate) fn stood(l: Option<Level>) -> bool {
    l.is_some_and(|l| l.end >= 1.0 && l.start.is_some_and(|s| s >= 1.0))
}

fn growing(l: Option<Level>) -> bool {
    l.is_some_and(|l| l.end >= 1.0 && l.growth() > 0.0)
}

/// Every signal the rows of the table read, computed once per window (or slice).
pub(crate) struct Signals<'a> {
    pub(crate) c: Ctx<'a>,
    pub(crate) t: &'a Thresholds,
    pub(crate) cluster: &'a Cluster,
    pub(crate) g: &'a Generation,
    pub(crate) e: &'a EngineRow,
    pub(crate) u: &'a UserImpact,
    pub(crate) infra: &'a Infrastructure,
    /// TTFT and ITL p95 as the user sees them: the gateway's when it relays, else the engines'.
    pub(crate) user_ttft: Option<(Key, f64)>,
    pub(crate) user_itl: Option<(Key, f64)>,
    pub(crate) ttft_breach: Option<Evidence>,
    pub(crate) itl_breach: Option<Evidence>,
    pub(crate) error_breach: Option<Evidence>,
    /// A queue at the window's end, in either layer, or refusals at a queue limit in it.
    pub(crate) queue_present: bool,
    /// A queue now, not refusals counted earlier in the window.
    pub(crate) queue_now: bool,
    pub(crate) queue_growth: bool,
    /// What waits now and how it moved.
    pub(crate) queue_ev: Vec<Evidence>,
    /// The wait itself: queue time over its line, observed or not yet observable.
    pub(crate) queue_time_ev: Vec<Evidence>,
    pub(crate) queue_time_high: bool,
    pub(crate) engine_queue_time: Option<f64>,
    /// Waits seen in the TTFT of requests that have not finished, with no queue left.
    pub(crate) drained_seen: bool,
    /// Requests running and nothing generated in the window: no progress at all.
    pub(crate) stuck: bool,
    /// The level of what waits: how long the queues now take to drain at the measured
    /// completion rate, over the queue-time line, for a queue held through the window.
    pub(crate) backlog_ev: Vec<Evidence>,
    /// An engine's queue held with its batch full: saturated whatever the window's trend.
    pub(crate) at_cap: bool,
    /// The KV usage that counts as high: the fixed line, or lower where the engine says its
    /// cache's size and fewer free blocks than running sequences are left above it (each grows
    /// by a block at times, and one that finds none is preempted).
    pub(crate) kv_line: f64,
    /// What waits now (either layer) drains within the queue-time line at the measured
    /// completion rate: requests between arrival and the next step, not a backlog.
    pub(crate) fleeting: bool,
    /// Requests taken into the batch in the window with no first token by its end (admitted
    /// less first tokens less those still waiting): on a healthy engine, the few in prefill.
    pub(crate) unserved: Option<f64>,
    /// The engine's steps are prefill's: prompt tokens are most of its work (four times the
    /// generated ones) and a request's prefill lasts longer than the gap allowed between tokens,
    /// so every prefill stalls the decodes beside it.
    pub(crate) prefill_bound: bool,
    /// GPU activity (graphics engine when DCGM profiles, else utilisation) at the end, and its
    /// peak over the two ends.
    pub(crate) gpu: Option<(Key, f64)>,
    pub(crate) gpu_peak: Option<(Key, f64)>,
}

impl Signals<'_> {
    pub(crate) fn gpu_ev(&self, stat: &'static str, op: &'static str, th: f64) -> Option<Evidence> {
        let (k, v) = if stat == "peak" { self.gpu_peak? } else { self.gpu? };
        Some(self.c.ev(k, stat, v, "ratio", op, Some(th)))
    }

    /// The objectives breached, by name: `ttft`, `itl`, `errors`.
    pub(crate) fn breached(&self) -> Vec<&'static str> {
        [
            ("ttft", &self.ttft_breach),
            ("itl", &self.itl_breach),
            ("errors", &self.error_breach),
        ]
        .into_iter()
        .filter_map(|(name, b)| b.is_some().then_some(name))
        .collect()
    }

    pub(crate) fn breaches(&self) -> Vec<Evidence> {
        [&self.ttft_breach, &self.itl_breach, &self.error_breach]
            .into_iter()
            .flatten()
            .cloned()
            .collect()
    }
}

pub(crate) fn compute<'a>(
    r: &'a Reader<'a>,
    rows: &'a Rows,
    t: &'a Thresholds,
    cluster: &'a Cluster,
) -> Signals<'a> {
    let c = Ctx { r, secs: r.w.secs() };
    let (g, e, u, infra) = (
        &rows.generation,
        &rows.engine,
        &rows.user_impact,
        &rows.infrastructure,
    );
    let user_ttft = p95(g.gateway_ttft)
        .map(|v| (Key::GwTtft, v))
        .or_else(|| p95(g.engine_ttft).map(|v| (Key::Ttft, v)));
    let user_itl = p95(g.gateway_itl)
        .map(|v| (Key::GwItl, v))
        .or_else(|| p95(g.engine_itl).map(|v| (Key::Itl, v)));
    let held = Held::of(e);
    let ttft_breach = user_ttft
        .filter(|(_, v)| *v > t.ttft_p95)
        .map(|(k, v)| c.ev(k, "p95", v, "s", ">", Some(t.ttft_p95)))
        .or_else(|| ttft_unobserved(&c, e, user_ttft.is_none(), &held));
    let itl_breach = user_itl
        .filter(|(_, v)| *v > t.itl_p95)
        .map(|(k, v)| c.ev(k, "p95", v, "s", ">", Some(t.itl_p95)));
    let error_breach = error_breach(&c, u, t);

    let overflow = e.gateway_overflow > Some(0.0) || e.engine_overflow > Some(0.0);
    let queue_present = present(e.waiting) || present(e.gateway_queued) || overflow;
    let queue_growth = growing(e.waiting) || growing(e.gateway_queued) || overflow;
    let stuck = e.running.is_some_and(|l| l.end >= 1.0) && g.generation_tokens_per_s == Some(0.0);
    let engine_queue_time = mean(e.queue_time);
    let kv_line = kv_line(e, t);
    let mut queue_time_ev = queue_time(&c, e, t, kv_line, &held, stuck, engine_queue_time);
    let backlog_ev = if stuck {
        Vec::new()
    } else {
        backlog(&c, rows, t, &held)
    };
    queue_time_ev.extend(backlog_ev.iter().cloned());
    // A queue that stood through a window without a first token: those waiting at its start
    // have waited at least the window.
    if !queue_time_ev.is_empty() && user_ttft.is_none() && (stood(e.waiting) || stood(e.gateway_queued)) {
        let key = if stood(e.waiting) {
            Key::Waiting
        } else {
            Key::GwQueued
        };
        let op = if c.secs > t.ttft_p95 { ">" } else { "<=" };
        queue_time_ev.push(c.ev(key, "waited_at_least", c.secs, "s", op, Some(t.ttft_p95)));
    }
    let fleeting = fleeting(rows, c.secs, t);
    let drained = drained_wait(&c, g, e, t, engine_queue_time);
    let drained_seen = !drained.is_empty();
    queue_time_ev.extend(drained);

    // DCGM averages each sample over its own period, so the ends are read as they are, not
    // averaged together: busy at either end counts for decode contention (a window that opens
    // as the load arrives starts idle), idle means idle now.
    let gpu_level = infra
        .gpu_engine_active
        .map(|l| (Key::GrEngineActive, l))
        .or_else(|| infra.gpu_util.map(|l| (Key::GpuUtil, l)));
    Signals {
        queue_ev: queue_ev(&c, e),
        queue_time_high: !queue_time_ev.is_empty(),
        queue_time_ev,
        c,
        t,
        cluster,
        g,
        e,
        u,
        infra,
        user_ttft,
        user_itl,
        ttft_breach,
        itl_breach,
        error_breach,
        queue_present,
        queue_now: present(e.waiting) || present(e.gateway_queued),
        queue_growth,
        engine_queue_time,
        drained_seen,
        stuck,
        at_cap: held.engine && !backlog_ev.is_empty(),
        kv_line,
        fleeting,
        unserved: unserved(g, e),
        prefill_bound: g
            .prompt_tokens_per_s
            .zip(g.generation_tokens_per_s)
            .is_some_and(|(prompt, generated)| prompt >= 4.0 * generated)
            && mean(e.prefill_time).is_some_and(|p| p > t.itl_p95),
        backlog_ev,
        gpu: gpu_level.map(|(k, l)| (k, l.end)),
        gpu_peak: gpu_level.map(|(k, l)| (k, l.peak())),
    }
}

/// Whether each layer's queue at the window's end is held, not one request caught between its
/// arrival and the scheduler's next step: it stood at both ends, or the engine runs the same
/// number at both ends (vLLM moves a waiting request into the batch at its next step if it can:
/// a steady maximum is its cap), or the gateway's slots were all taken at both ends.
struct Held {
    engine: bool,
    gateway: bool,
    running_steady: Option<Level>,
    slots_full: bool,
}

impl Held {
    fn of(e: &EngineRow) -> Self {
        let running_steady = e.running.filter(|l| l.end >= 1.0 && l.start == Some(l.end));
        let slots_full = e
            .gateway_in_flight
            .zip(e.gateway_concurrency_limit)
            .is_some_and(|(f, limit)| limit > 0.0 && f.end >= limit && f.start.is_some_and(|s| s >= limit));
        Self {
            engine: present(e.waiting) && (stood(e.waiting) || running_steady.is_some()),
            gateway: present(e.gateway_queued) && (stood(e.gateway_queued) || slots_full),
            running_steady,
            slots_full,
        }
    }
}

/// Requests admitted in the window (finished, plus what the batch and the queue grew by) that
/// have no first token at its end and are not waiting: running, but not served.
fn unserved(g: &Generation, e: &EngineRow) -> Option<f64> {
    let (running, waiting) = (e.running?, e.waiting?);
    let first_tokens = g.engine_ttft?.count;
    let admitted = e.finished? + running.growth() + waiting.growth();
    Some((admitted - first_tokens - waiting.end).max(0.0))
}

/// A held queue's drain time (what waits now ÷ what finishes per second) over the queue-time
/// line: at an incident's onset the rise is often over, and the level is the evidence. With
/// nothing finished in the window the queue has waited at least the window.
fn backlog(c: &Ctx<'_>, rows: &Rows, t: &Thresholds, held: &Held) -> Vec<Evidence> {
    let e = &rows.engine;
    let layers = [
        (held.engine, Key::Waiting, e.waiting),
        (held.gateway, Key::GwQueued, e.gateway_queued),
    ];
    let waiting: f64 = layers
        .iter()
        .filter(|(h, ..)| *h)
        .map(|(_, _, l)| l.map_or(0.0, |l| l.end))
        .sum();
    let Some((_, key, _)) = layers.iter().find(|(h, ..)| *h) else {
        return Vec::new();
    };
    let drain = match crate::change::throughput(rows, c.secs) {
        Some(rate) => waiting / rate,
        None => c.secs,
    };
    if drain <= t.queue_time {
        return Vec::new();
    }
    vec![c.now(*key, "drain_secs", drain, "s", ">", Some(t.queue_time))]
}

/// The KV line: `--kv-high`, or where the engine says its cache's size, the usage above which
/// fewer free blocks are left than sequences running (never under half the cache).
fn kv_line(e: &EngineRow, t: &Thresholds) -> f64 {
    match (e.kv_blocks, e.running) {
        (Some(blocks), Some(run)) if blocks > 0.0 => t.kv_high.min((1.0 - run.end / blocks).max(0.5)),
        _ => t.kv_high,
    }
}

/// Whether what waits at the window's end would drain within the queue-time line at the
/// window's completion rate (nothing waiting drains at once; no completions, never).
fn fleeting(rows: &Rows, secs: f64, t: &Thresholds) -> bool {
    let e = &rows.engine;
    let waiting = e.waiting.map_or(0.0, |l| l.end) + e.gateway_queued.map_or(0.0, |l| l.end);
    if waiting <= 0.0 {
        return true;
    }
    crate::change::throughput(rows, secs).is_some_and(|rate| waiting / rate <= t.queue_time)
}

/// TTFT is observed at a first token, so the first seconds of a flood leave it empty: no first
/// token while a queue is held is the worst case, not an objective met.
fn ttft_unobserved(c: &Ctx<'_>, e: &EngineRow, unobserved: bool, held: &Held) -> Option<Evidence> {
    if !unobserved || !(held.engine || held.gateway) {
        return None;
    }
    let key = if c.r.name(Key::GwTtft).is_some() {
        Key::GwTtft
    } else {
        Key::Ttft
    };
    let waiting_now = e.waiting.map_or(0.0, |l| l.end) + e.gateway_queued.map_or(0.0, |l| l.end);
    Some(c.now(
        key,
        "unobserved_while_waiting",
        waiting_now,
        "requests",
        ">=",
        Some(1.0),
    ))
}

/// The errors of the admitted: the gateway's refusals by design are its limits working, judged
/// apart (protected), not failures.
fn error_breach(c: &Ctx<'_>, u: &UserImpact, t: &Thresholds) -> Option<Evidence> {
    let key = if u.seen_at == Some("gateway") {
        Key::GwRequests
    } else {
        Key::RequestSuccess
    };
    let (stat, ratio) = if u.refused.is_empty() {
        ("error_ratio", u.error_ratio)
    } else {
        ("admitted_error_ratio", u.admitted_error_ratio)
    };
    ratio
        .filter(|v| *v > t.error_ratio)
        .map(|v| c.ev(key, stat, v, "", ">", Some(t.error_ratio)))
}

/// The engines' waiting list and the gateway's admission queue: their levels, growth and
/// overflow.
fn queue_ev(c: &Ctx<'_>, e: &EngineRow) -> Vec<Evidence> {
    let mut ev = Vec::new();
    for (key, level) in [(Key::Waiting, e.waiting), (Key::GwQueued, e.gateway_queued)] {
        if let Some(w) = level.filter(|l| l.end >= 1.0) {
            ev.push(c.ev(key, "end", w.end, "requests", ">=", Some(1.0)));
            if w.growth() > 0.0 {
                ev.push(c.ev(key, "growth", w.growth(), "requests", ">", Some(0.0)));
            }
        }
    }
    if let Some(o) = e.gateway_overflow.filter(|v| *v > 0.0) {
        ev.push(c.ev(
            Key::GwRejections,
            "queue_full+queue_timeout",
            o,
            "requests",
            ">",
            Some(0.0),
        ));
    }
    if let Some(o) = e.engine_overflow.filter(|v| *v > 0.0) {
        ev.push(c.ev(Key::EngineRejections, "increase", o, "requests", ">", Some(0.0)));
    }
    ev
}

/// The wait in the queues: observed over its line, timed by the gateway now, or held with
/// nothing yet timed.
fn queue_time(
    c: &Ctx<'_>,
    e: &EngineRow,
    t: &Thresholds,
    kv_line: f64,
    held: &Held,
    stuck: bool,
    engine_queue_time: Option<f64>,
) -> Vec<Evidence> {
    let gateway_queue_time = mean(e.gateway_queue_wait);
    let mut ev = Vec::new();
    if let Some(v) = engine_queue_time.filter(|v| *v > t.queue_time) {
        ev.push(c.ev(Key::QueueTime, "mean", v, "s", ">", Some(t.queue_time)));
    }
    if let Some(v) = gateway_queue_time.filter(|v| *v > t.queue_time) {
        ev.push(c.ev(Key::GwQueueWait, "mean", v, "s", ">", Some(t.queue_time)));
    }
    // The gateway times what still waits: a request that has waited past the line now is a long
    // wait whatever the finished ones say.
    if let Some(old) = e.gateway_oldest_wait.filter(|l| l.end > t.queue_time) {
        ev.push(c.ev(Key::GwOldestWait, "end", old.end, "s", ">", Some(t.queue_time)));
    }
    // At onset nothing has left the queue to be timed: a held queue with no queue time observed
    // is the evidence, unless the engine makes no progress at all (a hang, rule 6's, not a flood).
    let unobserved = [
        (held.engine, engine_queue_time, Key::QueueTime, e.waiting),
        (
            held.gateway,
            gateway_queue_time,
            Key::GwQueueWait,
            e.gateway_queued,
        ),
    ];
    for (held, observed, key, queue) in unobserved {
        if !stuck && held && observed.is_none() {
            let waiting = queue.map_or(0.0, |l| l.end);
            ev.push(c.now(
                key,
                "unobserved_while_waiting",
                waiting,
                "requests",
                ">=",
                Some(1.0),
            ));
        }
    }
    if !ev.is_empty() {
        if let Some(run) = held.running_steady.filter(|_| held.engine) {
            ev.push(c.ev(Key::Running, "steady", run.end, "requests", "=", None));
        }
        // A full KV cache is why a batch stops taking requests before its sequence cap.
        if let Some(kv) = e.kv_usage.filter(|l| held.engine && l.end >= kv_line) {
            ev.push(c.ev(Key::KvUsage, "end", kv.end, "ratio", ">=", Some(kv_line)));
        }
        if held.slots_full && held.gateway {
            let f = e.gateway_in_flight.map_or(0.0, |l| l.end);
            ev.push(c.ev(
                Key::GwInFlight,
                "at_limit",
                f,
                "requests",
                ">=",
                e.gateway_concurrency_limit,
            ));
        }
    }
    ev
}

/// The evidence of a wait the queue-time histogram has not seen yet: vLLM times the queue when a
/// request finishes and TTFT at its first token, so requests that waited, then got a first token
/// and have not finished show in TTFT alone, and the queue may have drained by the window's end.
/// TTFT over its objective that the finished requests' prefill does not explain, with no more
/// slow first tokens than unfinished ones, is that wait. (Slow first tokens of requests that
/// finished with a short queue and prefill point before the engine: rule 2.)
fn drained_wait(
    c: &Ctx<'_>,
    g: &Generation,
    e: &EngineRow,
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
