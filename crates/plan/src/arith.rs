//! The formulas: C from the safe concurrency, Q from the wait budget, each layer's share, the
//! binding layer and the warnings ([`budgets`]: the nested timeouts) — every result kept with the
//! arithmetic that produced it.

use std::time::Duration;

use serde::Serialize;

use crate::PlanError;
use crate::measure::{Measurement, Sourced};
use crate::units::{ceil, floor, opt_secs, secs};
pub use crate::units::{dur, littles_law, num, round_up};

/// The `schema` of `spillway plan --json`.
pub const PLAN_SCHEMA: &str = "spillway-plan/1";

pub mod budgets;

use budgets::budgets;
pub use budgets::{
    ASSUMED_ITL_TAIL, ASSUMED_TTFT_TAIL, CONNECT, IDLE_FACTOR, MIN_STREAM_IDLE, TAIL_MARGIN,
    TOTAL_SHARE_OF_CALLER,
};

/// Where the plan will run, and what the operator pins.
#[derive(Debug, Clone, PartialEq)]
pub struct Deployment {
    /// R: ready model-server replicas.
    pub replicas: u32,
    /// G: gateway processes in front of them, each with its own counters.
    pub gateway_replicas: u32,
    /// Wq: the longest a request may wait in the gateway's queue; `None` derives it from the
    /// measurement's TTFT objective ([`wait_budget_for_ttft`]), or [`DEFAULT_WAIT_BUDGET`] without one.
    pub wait_budget: Option<Duration>,
    /// The share of the measured safe total the gateway may use.
    pub headroom: f64,
    /// The caller's own deadline, which every budget must fit inside.
    pub caller_deadline: Duration,
    /// Values the operator fixes instead of the formulas (the plan still shows the formula's).
    pub pinned: Pinned,
    /// Tenants' `max_parallel` quotas, to check against C.
    pub tenant_quotas: Vec<(String, u32)>,
    pub names: Names,
    /// Whether a LiteLLM proxy is planned for (in front of the gateway): without one, the plan
    /// neither sizes it nor reasons about it.
    pub litellm: bool,
    /// Whether an Envoy Gateway policy is planned for: without one, the plan says nothing of it.
    pub envoy: bool,
}

/// Values fixed by the operator.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pinned {
    pub concurrency: Option<u32>,
    pub queue: Option<u32>,
    pub first_token: Option<Duration>,
    pub litellm_cap: Option<u32>,
    /// The longest answer the deployment allows (`max_tokens`), instead of the bench's longest.
    pub max_tokens: Option<u32>,
    /// The engines' `--max-num-seqs` as they run, instead of each replica's share of C: what
    /// they hold is then reasoned from what they are, not from a value nobody applied.
    pub max_num_seqs: Option<u32>,
}

/// The names the emitted files use.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Names {
    /// The public model name clients (and LiteLLM) send.
    pub model: String,
    /// The name the model servers serve.
    pub served_model: String,
    /// What vLLM loads (a Hugging Face id or a path).
    pub hf_model: String,
    /// Kubernetes namespace of the HTTPRoute, the policy and the InferenceService.
    pub namespace: String,
    /// The HTTPRoute the Envoy Gateway policy targets; also the InferenceService's name.
    pub route: String,
    /// Where Spillway listens.
    pub listen: String,
    /// The replicas' base URLs, for Spillway.
    pub upstreams: Vec<String>,
    /// Where LiteLLM sends requests: the gateway's OpenAI base URL.
    pub api_base: String,
    /// The Spillway admission class.
    pub class: String,
    /// vLLM's `--max-model-len` and `--max-num-batched-tokens`, passed through when given: they
    /// come from the model and GPU, not from this arithmetic.
    pub max_model_len: Option<u32>,
    pub max_num_batched_tokens: Option<u32>,
    /// Values above that nothing measured (defaults and placeholders): each emitted file says so
    /// in a comment, so that nobody applies a guess as if it were measured.
    pub unmeasured: Vec<Unmeasured>,
}

/// A name the plan had to guess, and which files carry it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Unmeasured {
    pub targets: Vec<crate::Target>,
    /// One line for the reader: the value, why it is a guess, the flag that sets it.
    pub note: String,
}

/// Which control point rejects first as load rises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    Gateway,
    Litellm,
    Engine,
}

/// One line of arithmetic, with the numbers filled in and where its inputs came from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Line {
    pub name: &'static str,
    pub text: String,
    pub from: String,
}

/// Every budget, outermost first.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Budgets {
    #[serde(serialize_with = "secs")]
    pub caller: Duration,
    /// LiteLLM's `timeout` (the whole response) and `stream_timeout` (the first chunk).
    #[serde(serialize_with = "secs")]
    pub litellm_timeout: Duration,
    #[serde(serialize_with = "secs")]
    pub litellm_stream_timeout: Duration,
    #[serde(serialize_with = "secs")]
    pub total: Duration,
    #[serde(serialize_with = "secs")]
    pub first_token: Duration,
    #[serde(serialize_with = "secs")]
    pub stream_idle: Duration,
    #[serde(serialize_with = "secs")]
    pub connect: Duration,
    /// Wq.
    #[serde(serialize_with = "secs")]
    pub queue_wait: Duration,
    /// The model's own execution budget (KServe's request timeout).
    #[serde(serialize_with = "secs")]
    pub model: Duration,
}

/// The limits of one gateway process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Share {
    pub concurrency: u32,
    pub queue: u32,
}

/// The objectives Spillway's class counts goodput against.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Slo {
    #[serde(serialize_with = "opt_secs")]
    pub ttft: Option<Duration>,
    #[serde(serialize_with = "opt_secs")]
    pub itl: Option<Duration>,
}

/// Every figure of the plan and how it was reached.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    pub schema: &'static str,
    pub names: Names,
    pub replicas: u32,
    pub gateway_replicas: u32,
    /// One replica's safe concurrency.
    pub c_safe: u32,
    /// Requests per second of all R replicas at the safe load.
    pub throughput_rps: f64,
    pub headroom: f64,
    /// C: requests in flight across all gateways.
    pub concurrency: u32,
    /// Q: requests waiting across all gateways.
    pub queue: u32,
    /// What each gateway process enforces (its counters are its own).
    pub per_gateway: Share,
    /// vLLM `--max-num-seqs` on each replica.
    pub max_num_seqs: u32,
    /// vLLM `--max-num-queued-reqs` on each replica: a backstop behind the gateway's Q, never
    /// below what the gateway can hand one replica.
    pub max_num_queued_reqs: u32,
    /// LiteLLM's deployment `max_parallel_requests`.
    pub litellm_max_parallel: u32,
    /// Whether LiteLLM and Envoy Gateway were planned for: the text names only those that were.
    pub litellm: bool,
    pub envoy: bool,
    /// The longest answer the budgets were derived for, stated in Spillway's config as its
    /// `max_tokens` cap: a longer answer could outrun the total.
    pub max_tokens: Option<u32>,
    /// The API the measurement drove, when it was a bench result.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api: Option<bench_schema::spec::Api>,
    pub budgets: Budgets,
    pub slo: Option<Slo>,
    pub binding: Layer,
    pub binding_why: String,
    pub lines: Vec<Line>,
    pub warnings: Vec<String>,
}

/// Wq without a TTFT objective to derive it from.
pub const DEFAULT_WAIT_BUDGET: Duration = Duration::from_secs(2);

/// The wait budget that keeps a request which waits all of it inside the TTFT objective: what the
/// objective leaves after the engine's own TTFT tail, and at most half the objective (the engine's
/// tail moves with load; half is also what is left without a measured tail). Whole milliseconds,
/// rounded down; zero when the tail alone already reaches the objective.
pub fn wait_budget_for_ttft(objective: Duration, ttft_tail: Option<Duration>) -> Duration {
    let left = objective.saturating_sub(ttft_tail.unwrap_or(Duration::ZERO));
    let wq = left.min(objective / 2);
    Duration::from_millis(wq.as_millis() as u64)
}

/// Wq and where it came from: pinned, derived from the measurement's TTFT objective, or the default.
fn wait_budget(m: &Measurement, d: &Deployment) -> (Duration, String) {
    if let Some(wq) = d.wait_budget {
        return (wq, "--wait-budget".into());
    }
    let Some(objective) = m.slo.as_ref().and_then(|s| s.ttft) else {
        return (
            DEFAULT_WAIT_BUDGET,
            "the default; no TTFT objective was measured to derive it from (--wait-budget)".into(),
        );
    };
    let tail = m.ttft_tail.as_ref().map(|t| t.value);
    let wq = wait_budget_for_ttft(objective, tail);
    let from = match tail {
        Some(tail) if wq.is_zero() => format!(
            "the TTFT p99 {} alone reaches the bench's TTFT objective {}: no wait fits, so no queue (--wait-budget to choose one)",
            dur(tail),
            dur(objective)
        ),
        Some(tail) => format!(
            "min(objective − TTFT p99, objective / 2) = min({} − {}, {} / 2), from the bench's TTFT objective, so a request that waits all of it still meets the objective (--wait-budget to choose)",
            dur(objective),
            dur(tail),
            dur(objective)
        ),
        None => format!(
            "half the bench's TTFT objective {} (--wait-budget to choose)",
            dur(objective)
        ),
    };
    (wq, from)
}

/// The lines of arithmetic and the warnings, gathered as each control point is planned.
struct Work {
    lines: Vec<Line>,
    warnings: Vec<String>,
}

impl Work {
    fn line(&mut self, name: &'static str, text: String, from: String) {
        self.lines.push(Line { name, text, from });
    }
}

/// The plan: every figure, the arithmetic and the checks — one step per control point, in the
/// seed's order (the gateway's C and Q, its share per process, vLLM's bounds, the budgets, the
/// max_tokens cap, LiteLLM's cap, the binding layer), then the warnings over all of them.
pub fn plan(m: &Measurement, d: &Deployment) -> Result<Plan, PlanError> {
    check(d)?;
    let mut w = Work {
        lines: Vec::new(),
        warnings: m.caveats.clone(),
    };
    let (wq, wq_from) = wait_budget(m, d);
    let throughput = throughput(m, d, &mut w);
    let c = concurrency(m, d, &mut w)?;
    let q = queue(d, throughput, (wq, &wq_from), &mut w);
    let per_gateway = per_gateway(d, c, q, &mut w);
    let max_num_seqs = max_num_seqs(m, d, c, &mut w);
    let max_num_queued_reqs = max_num_queued_reqs(c, q, max_num_seqs, &mut w);
    let budgets = budgets(m, d, (wq, &wq_from), &mut |n, t, f| w.line(n, t, f))?;
    let max_tokens = max_tokens(m, d, &budgets, &mut w);
    let litellm_max_parallel = litellm_cap(d, c, q, &mut w);
    let (binding, binding_why) = binding(d, (c, q, wq), max_num_seqs, litellm_max_parallel);
    let slo = m.slo.as_ref().map(|s| Slo {
        ttft: s.ttft,
        itl: s.itl,
    });
    let mut p = Plan {
        schema: PLAN_SCHEMA,
        names: d.names.clone(),
        replicas: d.replicas,
        gateway_replicas: d.gateway_replicas,
        c_safe: m.c_safe.value,
        throughput_rps: throughput,
        headroom: d.headroom,
        concurrency: c,
        queue: q,
        per_gateway,
        max_num_seqs,
        max_num_queued_reqs,
        litellm_max_parallel,
        litellm: d.litellm,
        envoy: d.envoy,
        max_tokens: max_tokens.map(|c| c.value),
        api: m.api,
        budgets,
        slo,
        binding,
        binding_why,
        lines: Vec::new(),
        warnings: Vec::new(),
    };
    warn(m, d, &p, &mut w.warnings);
    p.lines = w.lines;
    p.warnings = w.warnings;
    Ok(p)
}

/// The deployment's own figures, before any arithmetic.
fn check(d: &Deployment) -> Result<(), PlanError> {
    if !(d.headroom.is_finite() && d.headroom > 0.0 && d.headroom <= 1.0) {
        return Err(PlanError::Headroom(d.headroom));
    }
    if d.replicas == 0 {
        return Err(PlanError::Input("--replicas must be at least 1".into()));
    }
    if d.gateway_replicas == 0 {
        return Err(PlanError::Input("--gateway-replicas must be at least 1".into()));
    }
    if d.caller_deadline.is_zero() {
        return Err(PlanError::Input("--caller-deadline must be above zero".into()));
    }
    Ok(())
}

/// The measured throughput scaled to R replicas.
fn throughput(m: &Measurement, d: &Deployment, w: &mut Work) -> f64 {
    let r = d.replicas;
    let measured = m.throughput.value;
    let throughput = measured * f64::from(r) / f64::from(m.throughput_replicas);
    if m.throughput_replicas == r {
        w.line(
            "throughput",
            format!("throughput = {} req/s over R = {r} replicas", num(throughput)),
            m.throughput.from.clone(),
        );
    } else {
        w.line(
            "throughput",
            format!(
                "throughput = measured × R / M = {} × {r} / {} = {} req/s",
                num(measured),
                m.throughput_replicas,
                num(throughput)
            ),
            format!("measured: {}; R: --replicas", m.throughput.from),
        );
    }
    throughput
}

/// The gateway's C: the replicas' safe concurrency with headroom, or the pinned one.
fn concurrency(m: &Measurement, d: &Deployment, w: &mut Work) -> Result<u32, PlanError> {
    let (c_safe, r) = (m.c_safe.value, d.replicas);
    let raw_c = f64::from(c_safe) * f64::from(r) * d.headroom;
    let formula_c = floor(raw_c);
    let c_text = format!(
        "C = floor(C_safe × R × headroom) = floor({c_safe} × {r} × {}) = floor({}) = {formula_c}",
        num(d.headroom),
        num(raw_c)
    );
    let c_from = format!(
        "C_safe {c_safe} per replica: {}; R {r}: --replicas; headroom {}: the share of the measured total kept for failures and skew",
        m.c_safe.from,
        num(d.headroom)
    );
    let c = match d.pinned.concurrency {
        Some(pinned) => {
            w.line(
                "C",
                format!("C = {pinned}, pinned with --concurrency ({c_text})"),
                c_from,
            );
            pinned
        }
        None => {
            w.line("C", c_text, c_from);
            formula_c
        }
    };
    if c == 0 {
        return Err(PlanError::Input(format!(
            "C would be 0 (C_safe {c_safe} × R {r} × headroom {} < 1): add replicas or re-measure",
            num(d.headroom)
        )));
    }
    Ok(c)
}

/// The gateway's Q: what drains within the wait budget, or the pinned one.
fn queue(d: &Deployment, throughput: f64, (wq, wq_from): (Duration, &str), w: &mut Work) -> u32 {
    let raw_q = throughput * wq.as_secs_f64();
    let formula_q = ceil(raw_q);
    let q_text = format!(
        "Q = ceil(throughput × Wq) = ceil({} × {}) = {formula_q}: what drains within the wait budget",
        num(throughput),
        num(wq.as_secs_f64())
    );
    let q_from = format!("throughput: above; Wq {}: {wq_from}", dur(wq));
    match d.pinned.queue {
        Some(pinned) => {
            w.line(
                "Q",
                format!("Q = {pinned}, pinned with --queue ({q_text})"),
                q_from,
            );
            pinned
        }
        None => {
            w.line("Q", q_text, q_from);
            formula_q
        }
    }
}

/// Each gateway process's share of C and Q when they count apart.
fn per_gateway(d: &Deployment, c: u32, q: u32, w: &mut Work) -> Share {
    let g = d.gateway_replicas;
    if g == 1 {
        w.line(
            "per gateway",
            format!("one gateway: its counters are the whole C = {c} and Q = {q}"),
            "G 1: --gateway-replicas".into(),
        );
        return Share {
            concurrency: c,
            queue: q,
        };
    }
    let share = Share {
        concurrency: (c / g).max(1),
        queue: q / g,
    };
    w.line(
        "per gateway",
        format!(
            "per gateway: C / G = floor({c} / {g}) = {}, Q / G = floor({q} / {g}) = {}: each process counts only its own requests, so {g} of them would otherwise admit {g} × C. With counters shared through Redis (Spillway's shared-limit mode) each gateway enforces the whole C and Q: plan with --gateway-replicas 1 then",
            share.concurrency, share.queue
        ),
        format!("G {g}: --gateway-replicas"),
    );
    if c < g {
        w.warnings.push(format!(
            "C {c} is below the {g} gateways: each still admits 1, so together they admit {g}"
        ));
    }
    share
}

/// vLLM's `--max-num-seqs`: each replica's share of C, or as the engines run.
fn max_num_seqs(m: &Measurement, d: &Deployment, c: u32, w: &mut Work) -> u32 {
    let (c_safe, r) = (m.c_safe.value, d.replicas);
    let share = c.div_ceil(r);
    let max_num_seqs = match d.pinned.max_num_seqs {
        Some(n) => {
            w.line(
                "vLLM",
                format!(
                    "--max-num-seqs = {n} per replica, as the engines run (each replica's share of C would be ceil(C / R) = ceil({c} / {r}) = {share})"
                ),
                "--max-num-seqs".into(),
            );
            n
        }
        None => {
            w.line(
                "vLLM",
                format!(
                    "--max-num-seqs = ceil(C / R) = ceil({c} / {r}) = {share}: each replica's share of C, so a balanced engine never queues behind the gateway and an unbalanced one queues rather than batch past its share"
                ),
                "C, R: above".into(),
            );
            share
        }
    };
    if d.pinned.max_num_seqs.is_none() && max_num_seqs > c_safe {
        w.warnings.push(format!(
            "--max-num-seqs {max_num_seqs} is above the safe concurrency {c_safe} of one replica: C {c} over {r} replicas asks each for more than it held safely"
        ));
    }
    max_num_seqs
}

/// vLLM's `--max-num-queued-reqs`: a backstop of C.
fn max_num_queued_reqs(c: u32, q: u32, max_num_seqs: u32, w: &mut Work) -> u32 {
    // Q is the gateway's: the engine's own bound only stops what bypasses the gateway, and must
    // never refuse what it admitted. The gateways together hold at most C in flight, all of which
    // can land on one replica when the others are out: C − its batch wait there at most, so a
    // bound of C also leaves a batch of room for aborts vLLM has not yet reaped.
    w.line(
        "vLLM",
        format!(
            "--max-num-queued-reqs = C = {c}: a backstop, not the queue — Q {q} waits at the gateway, which can hand one replica at most its C in flight (every other replica out), {max_num_seqs} of them running; vLLM's own bound then refuses only what bypasses the gateway"
        ),
        "C, --max-num-seqs: above".into(),
    );
    c
}

/// The max_tokens cap the total budget holds for: pinned, else the measurement's longest answer.
fn max_tokens(m: &Measurement, d: &Deployment, budgets: &Budgets, w: &mut Work) -> Option<Sourced<u32>> {
    let max_tokens = match (d.pinned.max_tokens, &m.output_cap) {
        (Some(cap), _) => Some(Sourced::new(cap, "--max-tokens")),
        (None, cap) => cap.clone(),
    };
    match &max_tokens {
        Some(cap) => w.line(
            "max_tokens",
            format!(
                "max_tokens cap = {}: the total {} holds for answers up to that length, so Spillway's config caps max_tokens there (and sends it when a request gives none)",
                cap.value,
                dur(budgets.total)
            ),
            cap.from.clone(),
        ),
        None => w.warnings.push(format!(
            "no max_tokens cap to go with the total {}: the measured answers had no stated maximum, and a longer answer can outrun the total; give --max-tokens to state one",
            dur(budgets.total)
        )),
    }
    max_tokens
}

/// LiteLLM's `max_parallel_requests`: C + Q, or the pinned one.
fn litellm_cap(d: &Deployment, c: u32, q: u32, w: &mut Work) -> u32 {
    let formula_cap = c + q;
    let cap_text = format!(
        "LiteLLM max_parallel_requests = C + Q = {c} + {q} = {formula_cap}: every request the gateway can run or queue gets through, so the gateway, not LiteLLM, answers overload"
    );
    match d.pinned.litellm_cap {
        Some(pinned) => {
            if d.litellm {
                w.line(
                    "LiteLLM",
                    format!(
                        "LiteLLM max_parallel_requests = {pinned}, pinned with --litellm-cap ({cap_text})"
                    ),
                    "C, Q: above".into(),
                );
            }
            pinned
        }
        None => {
            if d.litellm {
                w.line("LiteLLM", cap_text, "C, Q: above".into());
            }
            formula_cap
        }
    }
}

/// The layer whose limit is met first, and why.
fn binding(
    d: &Deployment,
    (c, q, wq): (u32, u32, Duration),
    max_num_seqs: u32,
    litellm_max_parallel: u32,
) -> (Layer, String) {
    let r = d.replicas;
    let engines = max_num_seqs * r;
    let litellm_above = if d.litellm {
        format!(" and LiteLLM {litellm_max_parallel} ≥ C")
    } else {
        String::new()
    };
    if d.litellm && litellm_max_parallel < c {
        (
            Layer::Litellm,
            format!(
                "LiteLLM binds: its cap {litellm_max_parallel} is below C {c}, so the gateway never fills and its queue never forms; LiteLLM's 429s answer overload"
            ),
        )
    } else if engines < c {
        (
            Layer::Engine,
            format!(
                "the engines bind: {r} × --max-num-seqs {max_num_seqs} = {engines} is below C {c}, so requests wait inside vLLM, where no gateway bounds or sees the wait"
            ),
        )
    } else {
        (
            Layer::Gateway,
            format!(
                "the gateway binds: at most C {c} in flight and Q {q} waiting for at most {}; the engines hold {r} × {max_num_seqs} = {engines} ≥ C{litellm_above}",
                dur(wq)
            ),
        )
    }
}

/// What the figures together get wrong: LiteLLM below C + Q, C at the knee, a queue that outlasts
/// the first-token budget, greedy quotas, Wq past the TTFT objective, missing upstreams.
fn warn(m: &Measurement, d: &Deployment, p: &Plan, warnings: &mut Vec<String>) {
    let (r, c, q, wq) = (d.replicas, p.concurrency, p.queue, p.budgets.queue_wait);
    let (litellm_max_parallel, throughput) = (p.litellm_max_parallel, p.throughput_rps);
    if d.litellm && p.binding != Layer::Litellm && litellm_max_parallel < c + q {
        warnings.push(format!(
            "LiteLLM's cap {litellm_max_parallel} is below C + Q = {}: it rejects before the gateway's queue is full, so only {} of Q's {q} places can be used",
            c + q,
            litellm_max_parallel - c
        ));
    }
    if let Some(knee) = &m.knee {
        let knee_total = knee.value * f64::from(r);
        if f64::from(c) >= knee_total {
            warnings.push(format!(
                "C {c} is at or above the measured knee: {} per replica × {r} = {} ({})",
                num(knee.value),
                num(knee_total),
                knee.from
            ));
        }
    }
    let drain = q as f64 / throughput;
    if Duration::from_secs_f64(drain) > p.budgets.first_token {
        warnings.push(format!(
            "Q {q} takes {}s to drain at {} req/s, longer than the first-token budget {}: the back of the queue would time out while waiting; Q ≤ {} fits",
            num(drain),
            num(throughput),
            dur(p.budgets.first_token),
            floor(throughput * p.budgets.first_token.as_secs_f64())
        ));
    }
    for (team, quota) in &d.tenant_quotas {
        if *quota > c {
            warnings.push(format!(
                "tenant {team}'s max_parallel {quota} is above C {c}: one team can take every slot; keep each quota below C"
            ));
        }
    }
    if let (Some(objective), Some(tail)) = (m.slo.as_ref().and_then(|s| s.ttft), &m.ttft_tail) {
        let worst = wq + tail.value;
        if worst > objective {
            warnings.push(format!(
                "a request that waits the whole Wq {} sees its first token after about {} (Wq + TTFT p99), over the TTFT objective {} the bench used: the queue trades that objective for fewer rejections; --wait-budget {} keeps every admitted request inside it",
                dur(wq),
                dur(worst),
                dur(objective),
                dur(objective.saturating_sub(tail.value))
            ));
        }
    }
    if d.names.upstreams.len() != r as usize {
        warnings.push(format!(
            "{} upstream URL(s) for R = {r} replicas: Spillway's route lists what --upstream gave",
            d.names.upstreams.len()
        ));
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::measure::{Figures, Sourced};

    pub(crate) fn names(r: u32) -> Names {
        Names {
            model: "corp-chat".into(),
            served_model: "corp-chat".into(),
            hf_model: "corp-chat".into(),
            namespace: "ai-serving".into(),
            route: "corp-chat".into(),
            listen: "0.0.0.0:8080".into(),
            upstreams: (0..r).map(|i| format!("http://127.0.0.1:{}", 8000 + i)).collect(),
            api_base: "http://corp-chat.ai-serving.svc.cluster.local/v1".into(),
            class: "interactive".into(),
            max_model_len: None,
            max_num_batched_tokens: None,
            unmeasured: Vec::new(),
        }
    }

    pub(crate) fn seed() -> (Measurement, Deployment) {
        let m = Measurement::from_figures(
            &Figures {
                c_safe: 15,
                throughput: 6.0,
                ttft_p99: None,
                itl_p99: None,
                e2e_p99: None,
            },
            2,
        )
        .unwrap();
        let d = Deployment {
            replicas: 2,
            gateway_replicas: 1,
            wait_budget: Some(Duration::from_secs(2)),
            headroom: 0.8,
            caller_deadline: Duration::from_secs(60),
            pinned: Pinned::default(),
            tenant_quotas: Vec::new(),
            names: names(2),
            litellm: true,
            envoy: true,
        };
        (m, d)
    }

    #[test]
    fn rounding_keeps_decimal_products_whole() {
        assert_eq!(floor(0.29 * 100.0), 29);
        assert_eq!(ceil(0.1 * 3.0 * 10.0), 3);
        assert_eq!(round_up(Duration::from_millis(2301)), Duration::from_millis(2400));
        assert_eq!(round_up(Duration::from_millis(10_001)), Duration::from_secs(11));
        assert_eq!(num(24.000000000000004), "24");
        assert_eq!(dur(Duration::from_millis(1500)), "1.5s");
        assert_eq!(dur(Duration::from_millis(450)), "450ms");
    }

    #[test]
    fn the_wait_budget_fits_the_ttft_objective() {
        let ms = Duration::from_millis;
        assert_eq!(wait_budget_for_ttft(ms(500), Some(ms(100))), ms(250));
        assert_eq!(wait_budget_for_ttft(ms(500), Some(ms(320))), ms(180));
        assert_eq!(wait_budget_for_ttft(ms(500), None), ms(250));
        assert_eq!(wait_budget_for_ttft(ms(500), Some(ms(600))), Duration::ZERO);
        assert!((littles_law(14.04, ms(993)) - 13.94172).abs() < 1e-9);
    }

    #[test]
    fn wq_defaults_from_the_bench_objective_and_says_so() {
        let (mut m, mut d) = seed();
        d.wait_budget = None;
        m.slo = Some(crate::measure::Objectives {
            text: "ttft_p99=500ms".into(),
            ttft: Some(Duration::from_millis(500)),
            itl: None,
        });
        m.ttft_tail = Some(Sourced::new(Duration::from_millis(100), "test"));
        let p = plan(&m, &d).unwrap();
        assert_eq!(p.budgets.queue_wait, Duration::from_millis(250));
        assert_eq!(p.queue, 2, "ceil(6 × 0.25)");
        let q = p.lines.iter().find(|l| l.name == "Q").unwrap();
        assert!(
            q.from
                .contains("min(500ms − 100ms, 500ms / 2), from the bench's TTFT objective"),
            "{}",
            q.from
        );
        assert!(
            !p.warnings.iter().any(|w| w.contains("objective")),
            "{:?}",
            p.warnings
        );
        m.slo = None;
        let p = plan(&m, &d).unwrap();
        assert_eq!(p.budgets.queue_wait, DEFAULT_WAIT_BUDGET);
        d.wait_budget = Some(Duration::from_secs(1));
        assert_eq!(plan(&m, &d).unwrap().budgets.queue_wait, Duration::from_secs(1));
    }

    #[test]
    fn the_total_comes_with_the_max_tokens_cap_it_holds_for() {
        let (mut m, mut d) = seed();
        let p = plan(&m, &d).unwrap();
        assert_eq!(p.max_tokens, None);
        assert!(
            p.warnings.iter().any(|w| w.starts_with("no max_tokens cap")),
            "{:?}",
            p.warnings
        );
        m.output_cap = Some(Sourced::new(32, "the bench"));
        let p = plan(&m, &d).unwrap();
        assert_eq!(p.max_tokens, Some(32));
        let line = p.lines.iter().find(|l| l.name == "max_tokens").unwrap();
        assert!(
            line.text.starts_with("max_tokens cap = 32: the total"),
            "{}",
            line.text
        );
        d.pinned.max_tokens = Some(256);
        assert_eq!(plan(&m, &d).unwrap().max_tokens, Some(256));
    }

    /// The demo's deployment: no LiteLLM in front, engines that run 16 sequences each. The plan
    /// reasons from those, not from a LiteLLM cap and a --max-num-seqs nobody applied.
    #[test]
    fn gateways_with_their_own_counters_split_c_and_q() {
        let (m, mut d) = seed();
        d.gateway_replicas = 3;
        let p = plan(&m, &d).unwrap();
        assert_eq!((p.concurrency, p.queue), (24, 12));
        assert_eq!(
            p.per_gateway,
            Share {
                concurrency: 8,
                queue: 4
            }
        );
    }

    #[test]
    fn a_pinned_c_above_the_engines_makes_them_bind_and_is_warned() {
        let (mut m, mut d) = seed();
        m.knee = Some(Sourced::new(16.0, "test"));
        d.pinned.concurrency = Some(40);
        d.pinned.litellm_cap = Some(20);
        let p = plan(&m, &d).unwrap();
        assert_eq!(p.binding, Layer::Litellm, "{}", p.binding_why);
        assert!(
            p.warnings
                .iter()
                .any(|w| w.contains("at or above the measured knee")),
            "{:?}",
            p.warnings
        );
        assert!(
            p.warnings
                .iter()
                .any(|w| w.contains("above the safe concurrency 15")),
            "{:?}",
            p.warnings
        );
    }

    #[test]
    fn a_long_queue_and_a_greedy_tenant_are_warned() {
        let (m, mut d) = seed();
        d.pinned.queue = Some(120);
        d.tenant_quotas = vec![("search".into(), 30)];
        let p = plan(&m, &d).unwrap();
        assert!(
            p.warnings.iter().any(|w| w.contains("Q 120 takes 20s to drain")),
            "{:?}",
            p.warnings
        );
        assert!(
            p.warnings
                .iter()
                .any(|w| w.contains("tenant search's max_parallel 30")),
            "{:?}",
            p.warnings
        );
        assert!(
            !p.warnings.iter().any(|w| w.contains("LiteLLM's cap")),
            "{:?}",
            p.warnings
        );
    }
}
