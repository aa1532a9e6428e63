//! The gateway's decisions joined to the engines' state: where the backlog sits, whether the
//! gateway's C is above what the engines absorb or below what they could, and for an incident
//! the concrete change with its number, worked with `spillway plan`'s formulas (C from what the
//! engines run, Q = ceil(throughput × Wq), budgets = 1.5 × the measured tail).

use crate::rows::Rows;
use crate::verdict::{Finding, Suspect, Thresholds};
use serde::Serialize;

/// Where requests wait at the window's end.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Backlog {
    /// `gateway`, `engine`, `both`, or `drained` (no queue now, but waits shown in the TTFT of
    /// requests that have not finished).
    pub sits: &'static str,
    /// The gateway's admission queue, summed over classes and gateways.
    pub gateway_queued: Option<f64>,
    /// The engines' waiting lists, summed over replicas.
    pub engine_waiting: Option<f64>,
    /// What the engines run, summed over replicas.
    pub engine_running: Option<f64>,
    /// The gateway's C, summed over classes and gateways.
    pub gateway_concurrency: Option<f64>,
    /// Requests finished per second in the window, and how long what waits now takes to drain
    /// at that rate.
    pub finished_per_s: Option<f64>,
    pub drain_secs: Option<f64>,
    /// One line: where, and what it means for C.
    pub reading: String,
}

impl Backlog {
    /// Where the backlog waits and how long it takes to drain, for the verdict's one line.
    pub fn clause(&self) -> Option<String> {
        let waiting = self.gateway_queued.unwrap_or(0.0) + self.engine_waiting.unwrap_or(0.0);
        let place = match self.sits {
            "gateway" => "in the gateway's queue",
            "engine" => "in the engines' queue",
            "both" => "in the gateway's and the engines' queues",
            _ => return None,
        };
        Some(match (self.drain_secs, self.finished_per_s) {
            (Some(d), Some(rate)) => format!(
                "{} waiting {place}, {} to drain at {} finished/s",
                num(waiting),
                secs(d),
                num(rate)
            ),
            _ => format!("{} waiting {place}, none finished in the window", num(waiting)),
        })
    }
}

/// One change to make, with its number and the arithmetic that gave it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Change {
    /// What to change, with the value: "lower the gateway's C from 16 to 8".
    pub what: String,
    /// The formula with the numbers in it, as `spillway plan` prints its own.
    pub arithmetic: String,
}

/// The backlog and the changes, for the verdict.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Advice {
    pub backlog: Option<Backlog>,
    pub changes: Vec<Change>,
}

/// A C this many times what the engines hold at once (running and waiting) binds nothing: the
/// gateway's admission is off (the demo's unprotected run sets C = 1000000), and "lower C from
/// 1000000" would misread it as a setting chosen too high.
const OFF_RATIO: f64 = 10.0;

fn admission_off(c: f64, running: Option<f64>, waiting: f64) -> bool {
    c >= OFF_RATIO * (running.unwrap_or(0.0) + waiting).max(1.0)
}

/// A number as a person writes it: `24`, `0.8`, `6.25`.
fn num(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round())
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    }
}

/// Seconds as a person writes them: `2 s`, `450 ms`.
fn secs(v: f64) -> String {
    if v >= 1.0 {
        format!("{} s", num(v))
    } else {
        format!("{} ms", num((v * 1000.0).round()))
    }
}

/// A value as [`num`] prints it, so that the arithmetic adds up as printed.
fn shown(v: f64) -> f64 {
    num(v).parse().unwrap_or(v)
}

/// Seconds as [`secs`] prints them.
fn shown_secs(v: f64) -> f64 {
    if v >= 1.0 {
        shown(v)
    } else {
        (v * 1000.0).round() / 1000.0
    }
}

// Products of decimal inputs land a hair off the integer: round that away, as plan does.
fn floor(v: f64) -> f64 {
    (v + 1e-9).floor().max(0.0)
}

fn ceil(v: f64) -> f64 {
    (v - 1e-9).ceil().max(0.0)
}

/// Wq as `spillway plan` defaults it: min(TTFT objective − the engines' own first token, TTFT
/// objective / 2), down to a tenth of a second (a budget must fit), never under one; with the
/// arithmetic.
fn wait_budget(objective: f64, own: Option<f64>, own_name: &str) -> (f64, String) {
    let (objective, own) = (shown_secs(objective), own.map(shown_secs));
    let half = objective / 2.0;
    let signed = |v: f64| {
        if v < 0.0 {
            format!("−{}", secs(-v))
        } else {
            secs(v)
        }
    };
    let (raw, text) = match own {
        Some(own) => {
            let raw = (objective - own).min(half);
            (
                raw,
                format!(
                    "Wq = min(TTFT objective − {own_name}, TTFT objective / 2) = min({} − {}, {}) = {}",
                    secs(objective),
                    secs(own),
                    secs(half),
                    signed(raw)
                ),
            )
        }
        None => (half, format!("Wq = TTFT objective / 2 = {}", secs(half))),
    };
    let down = floor((raw * 10.0).max(0.0)) / 10.0;
    let wq = down.max(0.1);
    let text = if raw < 0.1 {
        format!("{text} → {} (at least a tenth of a second)", secs(wq))
    } else if (wq - raw).abs() > 1e-9 {
        format!("{text} → {} (down to a tenth of a second)", secs(wq))
    } else {
        text
    };
    (wq, text)
}

/// Budgets are this many times the measured tail, as `spillway plan` makes them.
const TAIL_MARGIN: f64 = 1.5;

/// What the window says about the fleet, in the quantities the formulas use.
pub(crate) struct Fleet {
    /// Engine replicas seen (distinct instances of the running gauge).
    pub(crate) engines: usize,
    pub(crate) window_secs: f64,
}

pub(crate) fn advise(
    rows: &Rows,
    findings: &[Finding],
    drained: bool,
    incident: bool,
    t: &Thresholds,
    fleet: &Fleet,
) -> Advice {
    let e = &rows.engine;
    // Where requests wait is read for an incident: one request caught between its arrival and
    // the scheduler's next step on a healthy stack is no backlog.
    if !incident {
        return Advice::default();
    }
    let backlog = backlog(rows, drained, throughput(rows, fleet.window_secs));
    let mut changes = Vec::new();
    let running = e.running.map(|l| l.end);
    let waiting = e.waiting.map_or(0.0, |l| l.end);
    let queued = e.gateway_queued.map_or(0.0, |l| l.end);
    let c_gw = e.gateway_concurrency_limit.filter(|c| *c > 0.0);
    let throughput = throughput(rows, fleet.window_secs);
    let first = findings.first().map(|f| f.suspect);

    // The engines queue: what they run now is what they take (their sequence cap, or what the KV
    // cache holds). A C above it parks the rest in the engines' queue, out of reach of the
    // gateway's Wq, priorities and Retry-After.
    let engine_cap = running.filter(|r| *r >= 1.0 && waiting >= 1.0);
    match (engine_cap, c_gw) {
        (Some(cap), Some(c)) if admission_off(c, running, waiting) => changes.push(Change {
            what: format!("turn the gateway's admission on: C = {}", num(cap)),
            arithmetic: format!(
                "C = Σ running while the engines queue = {}: the gateway's C of {} admits \
                 everything, so the {} waiting sit in the engines' queue, where no Wq, priority \
                 or Retry-After reaches them",
                num(cap),
                num(c),
                num(waiting)
            ),
        }),
        (Some(cap), Some(c)) if c > cap && waiting >= 1.0 => changes.push(Change {
            what: format!("lower the gateway's C from {} to {}", num(c), num(cap)),
            arithmetic: format!(
                "C = Σ running while the engines queue = {}: the {} above it wait in the engines' \
                 queue ({} now), where no Wq, priority or Retry-After reaches them",
                num(cap),
                num(c - cap),
                num(waiting)
            ),
        }),
        (Some(cap), None) if first == Some(Suspect::ArrivalsExceedThroughput) => changes.push(Change {
            what: format!("put Spillway in front with C = {}", num(cap)),
            arithmetic: format!(
                "C = Σ running while the engines queue = {}: the overflow then waits in the \
                     gateway's queue and is refused with a Retry-After when Wq runs out",
                num(cap)
            ),
        }),
        (None, None) if first == Some(Suspect::ArrivalsExceedThroughput) => {
            // The window never saw the engines' batch full (the queue drained): C comes from a
            // bench; the wait budget from the objective and the engines' own first token.
            let own = e.prefill_time.filter(|d| d.count > 0.0).and_then(|d| d.p99);
            let (wq_round, wq_text) = wait_budget(t.ttft_p95, own, "engine prefill p99");
            changes.push(Change {
                what: format!(
                    "put Spillway in front with queue_wait {} and C from a bench",
                    secs(wq_round)
                ),
                arithmetic: format!(
                    "{wq_text}; C = floor(C_safe × R × headroom) once `spillway bench` has \
                     measured C_safe: this window never saw the engines' batch full"
                ),
            });
        }
        _ => {}
    }
    // The gateway queues while the engines have room: C holds them back.
    let room = waiting < 1.0
        && e.kv_usage.is_none_or(|kv| kv.end < t.kv_high)
        && !findings.iter().any(|f| {
            matches!(
                f.suspect,
                Suspect::DecodeContention
                    | Suspect::KvPressure
                    | Suspect::ProcessHealth
                    | Suspect::GpuFault
                    | Suspect::SlowReplica
            )
        });
    if let Some(c) = c_gw
        && queued >= 1.0
        && room
    {
        let itl = rows
            .generation
            .engine_itl
            .filter(|d| d.count > 0.0)
            .and_then(|d| d.p95);
        // With ITL already at or over its objective there is no headroom to spend: no raise.
        let step = match itl.filter(|v| *v > 0.0) {
            Some(itl) => {
                let (objective, itl) = (shown_secs(t.itl_p95), shown_secs(itl));
                let next = floor(c * (objective / itl).min(2.0));
                (next > c).then(|| {
                    (
                        next,
                        format!(
                            "C' = floor(C × min(ITL objective / engine ITL p95, 2)) = floor({} × min({} / {}, 2)) \
                             = {}: decode time grows with the batch, so an estimate to confirm with \
                             `spillway bench --concurrency {},{}`",
                            num(c),
                            secs(objective),
                            secs(itl),
                            num(next),
                            num(c),
                            num(next)
                        ),
                    )
                })
            }
            None => Some((
                c * 2.0,
                format!(
                    "no engine ITL seen: find the engines' C_safe with `spillway bench --concurrency {},{},…` \
                     and plan C = floor(C_safe × R × headroom)",
                    num(c),
                    num(c * 2.0)
                ),
            )),
        };
        if let Some((next, why)) = step {
            changes.push(Change {
                what: format!(
                    "raise the gateway's C from {} towards {}: the engines wait on nothing ({} waiting{})",
                    num(c),
                    num(next),
                    num(waiting),
                    e.kv_usage
                        .map(|kv| format!(", KV {:.0}%", kv.end * 100.0))
                        .unwrap_or_default()
                ),
                arithmetic: why,
            });
        }
    }
    // A queue deeper than drains within the TTFT objective: waits that breach it anyway.
    let gw_wait = e
        .gateway_queue_wait
        .filter(|d| d.count > 0.0)
        .and_then(|d| d.mean);
    if let Some(x) = throughput
        && (queued >= 1.0 || gw_wait.is_some_and(|w| w > t.queue_time))
    {
        let own = rows
            .generation
            .engine_ttft
            .filter(|d| d.count > 0.0)
            .and_then(|d| d.p99);
        let (wq, wq_text) = wait_budget(t.ttft_p95, own, "engine TTFT p99");
        let x = shown(x);
        let q = ceil(x * wq).max(1.0);
        changes.push(Change {
            what: format!("set the queue to Q = {} with queue_wait {}", num(q), secs(wq)),
            arithmetic: format!(
                "{wq_text}; Q = ceil(throughput × Wq) = ceil({} req/s × {}) = {}: what drains in time, \
                 the rest refused at once with a Retry-After",
                num(x),
                secs(wq),
                num(q)
            ),
        });
    }
    // Arrivals over what the fleet serves: the replicas that would serve them all.
    if first == Some(Suspect::ArrivalsExceedThroughput)
        && let (Some(x), Some(arrivals)) = (throughput, arrivals(rows, fleet.window_secs))
        && arrivals > x
        && fleet.engines > 0
    {
        let r = fleet.engines as f64;
        let (arrivals, x) = (shown(arrivals), shown(x));
        let needed = ceil(r * arrivals / x);
        changes.push(Change {
            what: format!(
                "or serve them all: {} replicas where there are {}",
                num(needed),
                num(r)
            ),
            arithmetic: format!(
                "R' = ceil(R × arrivals / throughput) = ceil({} × {} / {}) = {}",
                num(r),
                num(arrivals),
                num(x),
                num(needed)
            ),
        });
    }
    for f in findings {
        if let Some(c) = for_suspect(f, rows, t, fleet, c_gw) {
            changes.push(c);
        }
    }
    Advice { backlog, changes }
}

/// Requests served per second: the engines' finished, else the gateway's 2xx.
pub(crate) fn throughput(rows: &Rows, window_secs: f64) -> Option<f64> {
    let from_engines = rows
        .engine
        .finished
        .filter(|n| *n > 0.0 && window_secs > 0.0)
        .map(|n| n / window_secs);
    let u = &rows.user_impact;
    let from_gateway = u
        .requests_per_s
        .zip(u.success_ratio)
        .map(|(r, s)| r * s)
        .filter(|v| *v > 0.0);
    from_engines.or(from_gateway)
}

/// Requests arriving per second: every answer the gateway gave (refusals too) plus its queue's
/// growth, else the engines' finished plus the growth of what they hold.
fn arrivals(rows: &Rows, window_secs: f64) -> Option<f64> {
    if window_secs <= 0.0 {
        return None;
    }
    let e = &rows.engine;
    let growth = |l: Option<crate::window::Level>| l.map_or(0.0, |l| l.growth().max(0.0));
    match rows.user_impact.seen_at {
        Some("gateway") => rows
            .user_impact
            .requests_per_s
            .map(|r| r + (growth(e.gateway_queued) + growth(e.gateway_in_flight)) / window_secs),
        _ => e
            .finished
            .map(|n| (n + growth(e.waiting) + growth(e.running)) / window_secs),
    }
}

fn backlog(rows: &Rows, drained: bool, finished_per_s: Option<f64>) -> Option<Backlog> {
    let e = &rows.engine;
    let queued = e.gateway_queued.map(|l| l.end);
    let waiting = e.waiting.map(|l| l.end);
    let running = e.running.map(|l| l.end);
    let c = e.gateway_concurrency_limit.filter(|c| *c > 0.0);
    let (g, w) = (queued.unwrap_or(0.0) >= 1.0, waiting.unwrap_or(0.0) >= 1.0);
    let sits = match (g, w) {
        (true, true) => "both",
        (true, false) => "gateway",
        (false, true) => "engine",
        (false, false) if drained => "drained",
        (false, false) => return None,
    };
    let reading = match sits {
        "gateway" => format!(
            "the backlog is in the gateway's queue ({} queued, the engines {} waiting): C holds it \
             where Wq, priorities and Retry-After apply",
            num(queued.unwrap_or(0.0)),
            num(waiting.unwrap_or(0.0))
        ),
        "engine" => match (c, running) {
            (Some(c), r) if admission_off(c, r, waiting.unwrap_or(0.0)) => format!(
                "the backlog is in the engines' queue ({} waiting): the gateway's admission is off \
                 (C {} admits everything)",
                num(waiting.unwrap_or(0.0)),
                num(c)
            ),
            (Some(c), Some(r)) if c > r => format!(
                "the backlog is in the engines' queue ({} waiting): the gateway's C {} is above the {} \
                 they run",
                num(waiting.unwrap_or(0.0)),
                num(c),
                num(r)
            ),
            (Some(c), _) => format!(
                "the backlog is in the engines' queue ({} waiting) with the gateway's C {}: traffic \
                 that does not pass the gateway, or more than one gateway's C",
                num(waiting.unwrap_or(0.0)),
                num(c)
            ),
            (None, _) => format!(
                "the backlog is in the engines' queue ({} waiting): no gateway's C in front of them",
                num(waiting.unwrap_or(0.0))
            ),
        },
        "both" => format!(
            "both queues hold requests ({} in the gateway's, {} in the engines'): the gateway's C is \
             above what the engines run",
            num(queued.unwrap_or(0.0)),
            num(waiting.unwrap_or(0.0))
        ),
        _ => "no queue now, but requests waited in the window (their queue time, or first tokens \
              late to requests still running): the queue drained before its end"
            .to_owned(),
    };
    Some(Backlog {
        sits,
        gateway_queued: queued,
        engine_waiting: waiting,
        engine_running: running,
        gateway_concurrency: c,
        finished_per_s,
        drain_secs: finished_per_s
            .filter(|_| g || w)
            .map(|rate| (queued.unwrap_or(0.0) + waiting.unwrap_or(0.0)) / rate),
        reading,
    })
}

/// The change for a cause other than arrivals, with its number where the window gives one.
fn for_suspect(f: &Finding, rows: &Rows, t: &Thresholds, fleet: &Fleet, c_gw: Option<f64>) -> Option<Change> {
    let (e, g) = (&rows.engine, &rows.generation);
    let per_replica = |v: f64| v / fleet.engines.max(1) as f64;
    match f.suspect {
        Suspect::KvPressure => {
            let kv = shown(e.kv_usage?.peak());
            let running = shown(per_replica(e.running?.peak()));
            let seqs = floor(running * t.kv_high / kv).max(1.0);
            let what = |seqs: f64| {
                format!(
                    "lower vLLM's --max-num-seqs to {} per replica (or C to {})",
                    num(seqs),
                    num(seqs * fleet.engines.max(1) as f64)
                )
            };
            // Preempted under the line: the cache ran out between the two reads, and the gauge
            // says nothing of by how much; one sequence fewer is the step to retest.
            if seqs >= running && running > 1.0 {
                return Some(Change {
                    what: what(running - 1.0),
                    arithmetic: format!(
                        "preemptions with the cache at {} of its line {} when read: it ran out \
                         between the reads; max-num-seqs = running per replica − 1 = {} − 1 = {}, \
                         then retest",
                        num(kv),
                        num(t.kv_high),
                        num(running),
                        num(running - 1.0)
                    ),
                });
            }
            Some(Change {
                what: what(seqs),
                arithmetic: format!(
                    "max-num-seqs = floor(running per replica × KV line / KV peak) = floor({} × {} / {}) \
                     = {}: the cache then stays under the line that preempts",
                    num(running),
                    num(t.kv_high),
                    num(kv),
                    num(seqs)
                ),
            })
        }
        Suspect::DecodeContention => {
            // The ITL the rule judged: the gateway's when it relays, else the engines'.
            let itl = shown_secs(g.gateway_itl.or(g.engine_itl).filter(|d| d.count > 0.0)?.p95?);
            let running = shown(e.running?.mean());
            let c = floor(running * shown_secs(t.itl_p95) / itl).max(1.0);
            if c >= running {
                return None;
            }
            Some(Change {
                what: format!(
                    "lower concurrency to C = {} (running now {})",
                    num(c),
                    num(running)
                ),
                arithmetic: format!(
                    "C = floor(running × ITL objective / ITL p95) = floor({} × {} / {}) = {}: decode \
                     time grows with the batch",
                    num(running),
                    secs(t.itl_p95),
                    secs(itl),
                    num(c)
                ),
            })
        }
        Suspect::LongPrompts => {
            let ttft = shown_secs(g.gateway_ttft.or(g.engine_ttft).filter(|d| d.count > 0.0)?.p95?);
            let tokens = shown(g.prompt_tokens_per_request?);
            let cap = floor(tokens * shown_secs(t.ttft_p95) / ttft).max(1.0);
            if cap >= tokens {
                return None;
            }
            Some(Change {
                what: format!("cap input tokens at {} per request", num(cap)),
                arithmetic: format!(
                    "max input = floor(prompt tokens per request × TTFT objective / TTFT p95) = \
                     floor({} × {} / {}) = {}: prefill time grows with the prompt",
                    num(tokens),
                    secs(t.ttft_p95),
                    secs(ttft),
                    num(cap)
                ),
            })
        }
        Suspect::GatewayTimeouts => {
            let tail = |d: Option<crate::window::Distribution>| {
                d.filter(|d| d.count > 0.0).and_then(|d| d.p99.or(d.p95))
            };
            let ttft = tail(g.engine_ttft)?;
            let ft = ceil(ttft * TAIL_MARGIN * 10.0) / 10.0;
            let total = tail(rows.user_impact.latency).map(|e2e| ceil(e2e * TAIL_MARGIN));
            Some(Change {
                what: format!(
                    "raise the route's first_token to at least {}{}",
                    secs(ft),
                    total
                        .map(|t| format!(" and total to {}", secs(t)))
                        .unwrap_or_default()
                ),
                arithmetic: format!(
                    "first_token ≥ {} × engine TTFT p99 = {} × {} → {}{}: the engines answer inside \
                     these; the gateway cuts them short",
                    num(TAIL_MARGIN),
                    num(TAIL_MARGIN),
                    secs(ttft),
                    secs(ft),
                    total
                        .map(|t| format!("; total ≥ {} × e2e p99 → {}", num(TAIL_MARGIN), secs(t)))
                        .unwrap_or_default()
                ),
            })
        }
        Suspect::ProcessHealth | Suspect::GpuFault | Suspect::SlowReplica
            if f.only_in_slices && fleet.engines > 1 =>
        {
            // Only the replicas: a finding also names the models it was seen in.
            let replicas: Vec<&str> =
                f.at.iter()
                    .filter(|a| a.starts_with("replica "))
                    .map(String::as_str)
                    .collect();
            let r = fleet.engines as f64;
            let keep = r - replicas.len() as f64;
            if replicas.is_empty() || keep < 1.0 {
                return None;
            }
            let c = c_gw.map(|c| floor(c * keep / r));
            Some(Change {
                what: format!(
                    "take {} out of the route{}",
                    replicas.join(", "),
                    c.map(|c| format!(" and lower C to {} until it is back", num(c)))
                        .unwrap_or_default()
                ),
                arithmetic: match (c, c_gw) {
                    (Some(c), Some(now)) => format!(
                        "C = floor(C × healthy replicas / R) = floor({} × {} / {}) = {}",
                        num(now),
                        num(keep),
                        num(r),
                        num(c)
                    ),
                    _ => format!("{} of {} replicas serve", num(keep), num(r)),
                },
            })
        }
        _ => None,
    }
}
