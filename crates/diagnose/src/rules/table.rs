//! The signal-combination table, one function per row of the seed's table (DESIGN §6): each reads
//! the signals and returns its finding with the evidence that made it match, or nothing.

use super::signals::{Signals, mean, p95};
use crate::catalog::Key;
use crate::verdict::{Basis, Evidence, Finding, Suspect};

/// A row: the signals in, a finding out; what it could not see goes to the blind spots.
pub(crate) type Row = fn(&Signals<'_>, &mut Vec<String>) -> Option<Finding>;

/// Every row, in the seed's order; the ranking is decided after.
pub(crate) const TABLE: [Row; 8] = [
    arrivals_exceed_throughput,
    long_prompts,
    decode_contention,
    kv_pressure,
    gateway_timeouts,
    process_health,
    frozen_scrape,
    gpu_fault,
];

/// Seed row 1, "waiting · queue time · TTFT up → arrivals exceed throughput". Queue time over
/// its line is the wait itself: a burst whose queue drained before the window's end still
/// matches (its backlog reads "drained").
fn arrivals_exceed_throughput(s: &Signals<'_>, _: &mut Vec<String>) -> Option<Finding> {
    let ttft = s.ttft_breach.clone().filter(|_| s.queue_time_high)?;
    let mut ev = s.queue_ev.clone();
    ev.extend(s.queue_time_ev.clone());
    ev.push(ttft);
    Some(Finding::new(Suspect::ArrivalsExceedThroughput, ev))
}

/// Seed row 1 in its level form, for what no row explains: an objective breached while a layer
/// holds waiters is a backlog; the verdict says where it waits and how long it takes to drain.
/// Waiters the engine takes within the queue-time line are no backlog, whatever else breached.
pub(crate) fn backlog_left(s: &Signals<'_>) -> Option<Finding> {
    let breaches = s.breaches();
    if breaches.is_empty() || !s.queue_now || s.fleeting {
        return None;
    }
    let mut ev = s.queue_ev.clone();
    ev.extend(s.backlog_ev.clone());
    ev.extend(breaches);
    Some(Finding::new(Suspect::ArrivalsExceedThroughput, ev))
}

/// Seed row 2, "queue low, prefill · TTFT up → long prompts, tokenisation, CPU". When the
/// engine's steps are prefill's, the gaps between tokens and the short waits behind a prefill
/// are its doing too, queue or not.
fn long_prompts(s: &Signals<'_>, _: &mut Vec<String>) -> Option<Finding> {
    let queue_low = !s.queue_time_high && !s.queue_present;
    // A wait no longer than the long prefills (their p95: the short ones pull the mean down) is
    // a wait behind a prefill step.
    let prefill = p95(s.e.prefill_time).or(mean(s.e.prefill_time));
    let behind_prefill = s.prefill_bound
        && s.engine_queue_time
            .is_none_or(|q| prefill.is_some_and(|p| q <= p));
    if !(queue_low || behind_prefill) {
        return None;
    }
    let itl = s.itl_breach.iter().filter(|_| s.prefill_bound);
    let mut ev: Vec<Evidence> = s.ttft_breach.iter().chain(itl).cloned().collect();
    if ev.is_empty() {
        return None;
    }
    let (c, e, t) = (&s.c, s.e, s.t);
    match s.engine_queue_time {
        Some(v) if queue_low => ev.push(c.ev(Key::QueueTime, "mean", v, "s", "<=", Some(t.queue_time))),
        Some(v) => ev.push(c.ev(Key::QueueTime, "mean", v, "s", "<=", prefill)),
        None => {}
    }
    if s.prefill_bound {
        let (prompt, generated) = (s.g.prompt_tokens_per_s, s.g.generation_tokens_per_s);
        let line = generated.map(|g| 4.0 * g);
        ev.push(c.ev(
            Key::PromptTokens,
            "per_s",
            prompt.unwrap_or(0.0),
            "tokens/s",
            ">=",
            line,
        ));
    }
    if let Some(v) = mean(e.prefill_time) {
        ev.push(c.ev(Key::PrefillTime, "mean", v, "s", "=", None));
    }
    if let Some(v) = s.g.prompt_tokens_per_request {
        ev.push(c.ev(Key::PromptTokens, "per_request", v, "tokens", "=", None));
    }
    Some(Finding::new(Suspect::LongPrompts, ev))
}

/// Seed row 3, "ITL · decode up, GPU busy → too much decode concurrency".
/// Gaps between tokens that the engine's prefills explain are row 2's, not this one's.
fn decode_contention(s: &Signals<'_>, blind: &mut Vec<String>) -> Option<Finding> {
    let itl = s.itl_breach.clone().filter(|_| !s.prefill_bound)?;
    match s.gpu_peak {
        Some((_, v)) if v < s.t.gpu_busy => return None,
        Some(_) => {}
        None => blind.push("GPU activity unseen: decode contention judged on ITL alone".into()),
    }
    let mut ev = vec![itl];
    if let Some(v) = mean(s.e.decode_time) {
        ev.push(s.c.ev(Key::DecodeTime, "mean", v, "s", "=", None));
    }
    ev.extend(s.gpu_ev("peak", ">=", s.t.gpu_busy));
    if let Some(run) = s.e.running {
        ev.push(s.c.ev(Key::Running, "mean", run.mean(), "requests", "=", None));
    }
    Some(Finding::new(Suspect::DecodeContention, ev))
}

/// Seed row 4, "KV cache high · preemptions up → too much context / too many sequences". vLLM
/// preempts only when a running sequence finds no free block, so a preemption is the cache full
/// at that step, whatever the gauge read at the window's two instants (it drops by the victim's
/// share at once): the fixed line says how high it stands now, the preemptions decide.
fn kv_pressure(s: &Signals<'_>, _: &mut Vec<String>) -> Option<Finding> {
    let (kv, pre) = (s.e.kv_usage?, s.e.preemptions?);
    if pre <= 0.0 {
        return None;
    }
    let preempted =
        s.c.ev(Key::Preemptions, "increase", pre, "preemptions", ">", Some(0.0));
    if kv.peak() >= s.kv_line {
        let high =
            s.c.ev(Key::KvUsage, "peak", kv.peak(), "ratio", ">=", Some(s.kv_line));
        return Some(Finding::new(Suspect::KvPressure, vec![high, preempted]));
    }
    let mut ev = vec![
        preempted,
        s.c.ev(Key::KvUsage, "peak", kv.peak(), "ratio", "<", Some(s.kv_line)),
    ];
    if let Some(w) = s.e.waiting.filter(|l| l.peak() >= 1.0) {
        ev.push(s.c.ev(Key::Waiting, "peak", w.peak(), "requests", ">=", Some(1.0)));
    }
    if let Some(run) = s.e.running {
        ev.push(s.c.ev(Key::Running, "end", run.end, "requests", "=", None));
    }
    Some(Finding::new(Suspect::KvPressure, ev))
}

/// Seed row 5, "engine healthy, gateway timeouts up → proxy deadlines, buffering, connections".
fn gateway_timeouts(s: &Signals<'_>, blind: &mut Vec<String>) -> Option<Finding> {
    let (c, e, t, u) = (&s.c, s.e, s.t, s.u);
    let (to, all) = u.timeouts_per_s.zip(u.requests_per_s)?;
    if u.seen_at != Some("gateway") || to <= 0.0 || all <= 0.0 || to / all <= t.error_ratio {
        return None;
    }
    if e.running.is_none() {
        blind.push(
            "gateway timeouts seen but no engine metrics: cannot tell whether the engines are healthy".into(),
        );
        return None;
    }
    let engine_ttft = p95(s.g.engine_ttft);
    let engine_itl = p95(s.g.engine_itl);
    // A queue the engine holds through the window, not one request caught between its arrival
    // and the next scheduler step when the gauge was read: closed-loop clients whose streams are
    // cut come back at once, so one may be read waiting at each end; more than one is a queue,
    // unless the engine takes it within the queue-time line.
    let engine_ok = engine_ttft.is_none_or(|v| v <= t.ttft_p95)
        && engine_itl.is_none_or(|v| v <= t.itl_p95)
        && (!e.waiting.is_some_and(|l| l.mean() > 1.0) || s.fleeting);
    if !engine_ok {
        return None;
    }
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
    Some(Finding::new(Suspect::GatewayTimeouts, ev))
}

/// Requests running without a first token that are more than a prefill's worth.
const UNSERVED: f64 = 4.0;

/// Seed row 6, "queue up, GPU activity low → CPU, network, process health", or the engine making
/// no progress at all. Requests running through the whole window and more still taken into the
/// batch while nothing comes out is a queue of the engine's own, which a scheduler with room to
/// spare never moves to `waiting`. (One request that arrived at the window's end and is still
/// in prefill is not a hang.)
fn process_health(s: &Signals<'_>, _: &mut Vec<String>) -> Option<Finding> {
    let (c, e) = (&s.c, s.e);
    let piling = s.stuck
        && e.running
            .is_some_and(|l| l.start.is_some_and(|s| s >= 1.0) && l.growth() > 0.0);
    // The level form: most of what was taken in the window given no first token, and half the
    // batch, where a healthy engine has only the few in prefill; whatever the GPU does for the
    // rest.
    let running_end = e.running.map_or(0.0, |l| l.end);
    let first_tokens = s.g.engine_ttft.map_or(0.0, |d| d.count);
    let unserved = s
        .unserved
        .filter(|u| *u >= UNSERVED && *u >= running_end / 2.0 && *u > first_tokens);
    if let Some(u) = unserved.filter(|_| !piling) {
        let mut ev = vec![c.now(Key::Ttft, "unserved_running", u, "requests", ">=", Some(UNSERVED))];
        ev.push(c.ev(Key::Running, "end", running_end, "requests", "=", None));
        ev.push(c.ev(Key::Ttft, "count", first_tokens, "requests", "<", Some(u)));
        return Some(Finding::new(Suspect::ProcessHealth, ev));
    }
    if let Some(ev) = short_of_its_pace(s).or_else(|| silent_mid_stream(s)) {
        return Some(Finding::new(Suspect::ProcessHealth, ev));
    }
    // A queue now, not refusals counted earlier in the window: a burst refused at a queue limit
    // that then went quiet leaves the GPU idle at the end with nothing wrong.
    if !((s.queue_now && (s.queue_growth || s.queue_time_high)) || piling) {
        return None;
    }
    let idle = s.gpu.is_some_and(|(_, v)| v < s.t.gpu_idle);
    if !(idle || (s.gpu.is_none() && s.stuck)) {
        return None;
    }
    let mut ev = s.queue_ev.clone();
    ev.extend(s.queue_time_ev.clone());
    ev.extend(s.gpu_ev("end", "<", s.t.gpu_idle));
    if let Some(run) = e.running.filter(|_| piling) {
        ev.push(c.ev(Key::Running, "growth", run.growth(), "requests", ">", Some(0.0)));
    }
    if s.stuck {
        ev.push(c.ev(Key::GenerationTokens, "per_s", 0.0, "tokens/s", "=", Some(0.0)));
    }
    Some(Finding::new(Suspect::ProcessHealth, ev))
}

/// A share of its own pace under which a batch stopped for part of the window.
const PACE: f64 = 0.5;

/// The level form of a hang at its onset: a batch running at both ends made less than half the
/// tokens its own gaps between tokens say it makes in the window (its mean running ÷ the mean
/// ITL of the tokens it did make), so it stopped for most of the window and nothing yet shows as
/// a wait or as a window with no token at all. One request read at both ends is no batch: open
/// arrivals come and go between the reads.
fn short_of_its_pace(s: &Signals<'_>) -> Option<Vec<Evidence>> {
    let run =
        s.e.running
            .filter(|l| l.end >= 1.0 && l.start >= Some(1.0) && l.mean() >= 1.5)?;
    let made = s.g.generation_tokens_per_s.filter(|g| *g > 0.0)?;
    let itl = mean(s.g.engine_itl).filter(|m| *m > 0.0)?;
    let pace = run.mean() / itl;
    if made >= PACE * pace {
        return None;
    }
    Some(vec![
        s.c.ev(
            Key::GenerationTokens,
            "per_s",
            made,
            "tokens/s",
            "<",
            Some(PACE * pace),
        ),
        s.c.ev(Key::Running, "mean", run.mean(), "requests", "=", None),
        s.c.ev(Key::Itl, "mean", itl, "s", "=", None),
    ])
}

/// A gap between two tokens of one stream, seconds, that no batch makes: the engine stopped.
const SILENCE: f64 = 1.0;

/// The level form of a hang just over: a gap between tokens of a second or more where the
/// typical gap is a hundred times shorter — no batch size or queue makes one; a process that
/// stopped (frozen, starved, swapped out) and went on does. (A preemption's recompute does too,
/// and row 4 outranks this one when preemptions are counted.)
fn silent_mid_stream(s: &Signals<'_>) -> Option<Vec<Evidence>> {
    let itl = s.g.engine_itl?;
    let (p50, p99) = (itl.p50?, itl.p99?);
    if p99 < SILENCE || p99 < 100.0 * p50 {
        return None;
    }
    Some(vec![
        s.c.ev(Key::Itl, "p99", p99, "s", ">=", Some(SILENCE)),
        s.c.ev(Key::Itl, "p50", p50, "s", "=", None),
    ])
}

/// Seed row 6 again, from the scrape itself: a target that claims work in hand (running or
/// waiting) while not one of its samples moved — counters, histograms, gauges — is a scrape
/// served from a cache or a frozen process: its figures are not the present, and nothing it runs
/// is progressing.
fn frozen_scrape(s: &Signals<'_>, blind: &mut Vec<String>) -> Option<Finding> {
    let (r, secs) = (s.c.r, s.c.secs);
    let mut ev = Vec::new();
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
        if running + waiting < 1.0 {
            continue;
        }
        let samples =
            r.w.end
                .series
                .iter()
                .filter(|s| s.name != "up" && s.label("instance") == Some(instance.as_str()))
                .count();
        ev.push(Evidence {
            series: format!(
                "every sample of {instance} ({samples}) unchanged while it reports {running} running, {waiting} waiting"
            ),
            stat: "frozen",
            value: secs,
            unit: "s",
            op: "=",
            threshold: None,
            window_secs: secs,
            basis: Basis::Instantaneous,
        });
        blind.push(format!(
            "{instance}: not one sample moved in {secs:.1} s while it reports work in hand: a \
             stale scrape (a metrics cache, a lagging federation) or a frozen process; its \
             figures are not the present"
        ));
    }
    (!ev.is_empty()).then(|| Finding::new(Suspect::ProcessHealth, ev))
}

/// Seed row 7, "XID · ECC · restarts together → GPU, driver, runtime fault": one line per sick
/// GPU, with its labels (which GPU to take out of the route), and the restarts beside them.
fn gpu_fault(s: &Signals<'_>, _: &mut Vec<String>) -> Option<Finding> {
    let (r, secs) = (s.c.r, s.c.secs);
    let xid = s.infra.xid.filter(|v| *v > 0.0);
    let ecc = s.infra.ecc_dbe.filter(|l| l.end > 0.0);
    if xid.is_none() && ecc.is_none() {
        return None;
    }
    let counted = |series: String, stat, value, unit| Evidence {
        series,
        stat,
        value,
        unit,
        op: "=",
        threshold: None,
        window_secs: secs,
        basis: Basis::Counter,
    };
    let mut ev = Vec::new();
    for (key, stat, unit) in [(Key::Xid, "last", "xid"), (Key::EccDbe, "end", "errors")] {
        let Some(name) = r.name(key) else { continue };
        for x in r.w.end.series.iter().filter(|x| x.name == name && x.value > 0.0) {
            let labels: Vec<String> = x.labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
            ev.push(Evidence {
                series: format!("{name}{{{}}}", labels.join(",")),
                stat,
                value: x.value,
                unit,
                op: ">",
                threshold: Some(0.0),
                window_secs: secs,
                basis: Basis::Instantaneous,
            });
        }
    }
    for i in &s.infra.restarted {
        ev.push(counted(
            format!("counters of {i} went back (process restarted)"),
            "restart",
            1.0,
            "",
        ));
    }
    for restart in s.cluster.restarts_within(r.w.start.at, r.w.end.at) {
        ev.push(counted(
            format!("pod {} container {} restarted", restart.pod, restart.container),
            "restart",
            restart.count as f64,
            "restarts",
        ));
    }
    Some(Finding::new(Suspect::GpuFault, ev))
}
