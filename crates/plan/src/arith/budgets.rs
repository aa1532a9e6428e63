//! The nested budgets: the caller's deadline outside, LiteLLM's and the gateway's inside it, the
//! model's innermost, each derived from a measured tail with a margin and checked for containment.

use std::time::Duration;

use super::{Budgets, Deployment};
use crate::PlanError;
use crate::measure::{Measurement, Sourced};
use crate::units::{dur, num, round_up};

/// A tail with this margin on top is a budget, not a prediction of the mean.
pub const TAIL_MARGIN: f64 = 1.5;
/// A gap this many times the 99th-percentile gap is a stall, not a slow token.
pub const IDLE_FACTOR: f64 = 10.0;
/// The shortest stream-idle budget: a long prefill batched beside a stream, or a preemption, pauses
/// it for seconds with nothing wrong, and cutting a healthy stream loses what it already said.
pub const MIN_STREAM_IDLE: Duration = Duration::from_secs(5);
/// What is assumed for a tail nobody measured (each use says so).
pub const ASSUMED_TTFT_TAIL: Duration = Duration::from_secs(5);
pub const ASSUMED_ITL_TAIL: Duration = Duration::from_secs(1);
/// Without an e2e tail, the gateway's total is this share of the caller's deadline.
pub const TOTAL_SHARE_OF_CALLER: f64 = 0.9;
pub const CONNECT: Duration = Duration::from_secs(1);

fn tail_or(t: &Option<Sourced<Duration>>, assumed: Duration, flag: &str) -> (Duration, String) {
    match t {
        Some(t) => (t.value, t.from.clone()),
        None => (assumed, format!("assumed: nothing measured it ({flag})")),
    }
}

/// The nested budgets: caller > LiteLLM > gateway total > model, and within the gateway
/// connect < first_token (⊇ Wq + the engine's TTFT) ≤ total, stream_idle ≤ total.
pub(super) fn budgets(
    m: &Measurement,
    d: &Deployment,
    (wq, wq_from): (Duration, &str),
    line: &mut impl FnMut(&'static str, String, String),
) -> Result<Budgets, PlanError> {
    let (ttft, ttft_from) = tail_or(&m.ttft_tail, ASSUMED_TTFT_TAIL, "--ttft-p99");
    let first_token = match d.pinned.first_token {
        Some(ft) => {
            line(
                "first_token",
                format!("first_token = {}, pinned with --first-token", dur(ft)),
                format!("TTFT tail {}: {ttft_from}", dur(ttft)),
            );
            ft
        }
        None => {
            let ft = round_up(wq + ttft.mul_f64(TAIL_MARGIN));
            line(
                "first_token",
                format!(
                    "first_token = Wq + {} × TTFT p99 = {} + {} × {} → {}: the gateway's queue, then the engine's queue and prefill",
                    num(TAIL_MARGIN),
                    dur(wq),
                    num(TAIL_MARGIN),
                    dur(ttft),
                    dur(ft)
                ),
                format!("Wq: {wq_from}; TTFT p99: {ttft_from}"),
            );
            ft
        }
    };
    // Only a measured tail can make a budget impossible; an assumed one only sizes a derived budget.
    let measured_ttft = m.ttft_tail.as_ref().map_or(Duration::ZERO, |t| t.value);
    if wq + measured_ttft >= first_token {
        let room = first_token.saturating_sub(measured_ttft);
        let after = if measured_ttft.is_zero() {
            String::new()
        } else {
            format!(" after the engine's TTFT p99 {}", dur(measured_ttft))
        };
        return Err(PlanError::WaitBudget(format!(
            "--wait-budget {} cannot fit the first-token budget {}:{after} only {} is left for the queue; shorten --wait-budget below {} or raise --first-token",
            dur(wq),
            dur(first_token),
            dur(room),
            dur(room)
        )));
    }

    let (itl, itl_from) = tail_or(&m.itl_tail, ASSUMED_ITL_TAIL, "--itl-p99");
    let stream_idle = round_up(itl.mul_f64(IDLE_FACTOR).max(MIN_STREAM_IDLE));
    line(
        "stream_idle",
        format!(
            "stream_idle = max({}, {} × ITL p99) = max({}, {} × {}) → {}: a gap that long is a stall, not a slow token",
            dur(MIN_STREAM_IDLE),
            num(IDLE_FACTOR),
            dur(MIN_STREAM_IDLE),
            num(IDLE_FACTOR),
            dur(itl),
            dur(stream_idle)
        ),
        format!("ITL p99: {itl_from}"),
    );

    let caller = d.caller_deadline;
    let (model, total) = match &m.e2e_tail {
        Some(e2e) => {
            let model = round_up(e2e.value.mul_f64(TAIL_MARGIN));
            let total = round_up(wq + model).max(first_token).max(stream_idle);
            line(
                "total",
                format!(
                    "model budget = {} × e2e p99 = {} × {} → {}; total = max(Wq + model, first_token, stream_idle) = max({} + {}, {}, {}) → {}",
                    num(TAIL_MARGIN),
                    num(TAIL_MARGIN),
                    dur(e2e.value),
                    dur(model),
                    dur(wq),
                    dur(model),
                    dur(first_token),
                    dur(stream_idle),
                    dur(total)
                ),
                format!("e2e p99: {}", e2e.from),
            );
            (model, total)
        }
        None => {
            let total = Duration::from_secs((caller.as_secs_f64() * TOTAL_SHARE_OF_CALLER).floor() as u64)
                .max(first_token)
                .max(stream_idle);
            let model = total.saturating_sub(wq);
            line(
                "total",
                format!(
                    "total = floor({} × caller deadline) = floor({} × {}) = {}; model budget = total − Wq = {}: no e2e tail was measured (--e2e-p99), so the gateway takes what the caller allows",
                    num(TOTAL_SHARE_OF_CALLER),
                    num(TOTAL_SHARE_OF_CALLER),
                    dur(caller),
                    dur(total),
                    dur(model)
                ),
                "caller deadline: --caller-deadline".into(),
            );
            (model, total)
        }
    };
    if total >= caller {
        return Err(PlanError::Nesting(format!(
            "the gateway's total {} (Wq {} + the model's {}) is not under the caller's deadline {}; raise --caller-deadline, shorten --wait-budget or cap output lengths",
            dur(total),
            dur(wq),
            dur(model),
            dur(caller)
        )));
    }
    // LiteLLM sits above the gateway: it gives up just after it, so the gateway's clean 504 is what
    // the caller sees, and still before the caller does.
    let gap = Duration::from_secs(1).min((caller - total) / 2);
    let litellm_timeout = total + gap;
    let litellm_stream_timeout = first_token + gap;
    let connect = CONNECT.min(first_token / 2);
    let ttft_shown = if m.ttft_tail.is_some() {
        dur(ttft)
    } else {
        format!("{} (assumed)", dur(ttft))
    };
    if d.litellm {
        line(
            "nesting",
            format!(
                "caller {} > LiteLLM timeout {} > gateway total {} > model {}; LiteLLM stream_timeout {} > first_token {} > Wq {} + TTFT p99 {}; connect {} < first_token",
                dur(caller),
                dur(litellm_timeout),
                dur(total),
                dur(model),
                dur(litellm_stream_timeout),
                dur(first_token),
                dur(wq),
                ttft_shown,
                dur(connect)
            ),
            "LiteLLM = the gateway's budget + min(1s, half the room left under the caller)".into(),
        );
    } else {
        line(
            "nesting",
            format!(
                "caller {} > gateway total {} > model {}; first_token {} > Wq {} + TTFT p99 {}; connect {} < first_token",
                dur(caller),
                dur(total),
                dur(model),
                dur(first_token),
                dur(wq),
                ttft_shown,
                dur(connect)
            ),
            "the budgets above".into(),
        );
    }
    Ok(Budgets {
        caller,
        litellm_timeout,
        litellm_stream_timeout,
        total,
        first_token,
        stream_idle,
        connect,
        queue_wait: wq,
        model,
    })
}
