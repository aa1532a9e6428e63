//! Stage 7: pick a replica, call it under the budgets, classify its answer, and try another —
//! only before any byte reached the client, only when the error says a retry is allowed, within
//! the attempts, the route's retry budget and the deadline, after a jittered backoff.

use crate::error::GatewayError;
use crate::path::api::Api;
use crate::path::hints::DEADLINE_HEADER;
use crate::path::ledger::Ledger;
use crate::path::prepare::Prepared;
use crate::path::relay::{self, Events, Opened, Streamed};
use crate::path::verdict::{Verdict, judge};
use crate::route::transport::Response;
use crate::route::{Observation, Route};
pub(crate) use http1::client as h1;

use axum::http::StatusCode;
use bytes::Bytes;
use std::time::Duration;
use tokio::time::Instant;

/// A failed replica's (5xx) error body is read at most this far, for the log; clients never see
/// it.
const MAX_LOGGED_BODY: usize = 64 * 1024;

/// The request's budgets as instants: the caller's deadline, if smaller, shrinks each of them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budgets {
    pub(crate) total: Duration,
    pub(crate) first_token: Duration,
    pub(crate) deadline: Instant,
    pub(crate) first_token_deadline: Instant,
}

impl Budgets {
    pub(crate) fn new(t: &crate::config::Timeouts, caller: Option<Duration>, arrival: Instant) -> Budgets {
        let total = caller.map_or(t.total, |c| c.min(t.total));
        let first_token = t.first_token.min(total);
        Budgets {
            total,
            first_token,
            deadline: arrival + total,
            first_token_deadline: arrival + first_token,
        }
    }

    /// How long the response head may take: the first token for a stream, everything otherwise.
    pub(crate) fn head(&self, stream: bool) -> (Instant, Duration) {
        if stream {
            (self.first_token_deadline, self.first_token)
        } else {
            (self.deadline, self.total)
        }
    }
}

/// What a replica answered that goes to the client.
pub(crate) enum UpstreamAnswer {
    /// A stream whose first token has arrived.
    Stream(Streamed),
    /// A whole answer (2xx), or the replica's own 4xx, still to be read.
    Response(Response),
    /// The replica's own 4xx, sent as an error event in place of a stream's first token: its
    /// status and the event's JSON.
    Rejected(StatusCode, Bytes),
}

/// Calls replicas until one gives an answer to relay (a 2xx, or the client's own 4xx) or the
/// attempts run out; a stream counts as answered once its first token has come, so an error
/// event in its place is judged like the status it names. `ex` learns which replica answered
/// and how many retries it took.
pub(crate) async fn call(
    route: &Route,
    api: Api,
    prepared: &Prepared,
    budgets: &Budgets,
    ex: &mut Ledger,
) -> Result<UpstreamAnswer, GatewayError> {
    let pool = &route.classes[prepared.class].pool;
    let (head_deadline, _) = budgets.head(prepared.stream);
    let attempts = route.config.retry.attempts.get() as usize;
    let mut tried: Vec<usize> = Vec::with_capacity(attempts);
    // One reading of the clock for the first attempt's accounting and pick; a retry reads again.
    let mut now = Instant::now();
    route.budget.request(now);
    ex.calling(now);
    loop {
        let Some(replica) = pick(route, prepared, &tried, now, ex)? else {
            return Err(GatewayError::NoHealthyReplica(route.config.model.clone()));
        };
        tried.push(replica.index);
        let index = replica.index;
        ex.picked(replica);
        let trace = ex.trace().attempt(&route.replicas[index].url);
        let result = match attempt(route, api, prepared, budgets, ex.id(), index, trace).await {
            Ok(r) if prepared.stream && r.status().is_success() => {
                open(route, prepared, budgets, index, r, ex).await
            }
            Ok(r) => {
                ex.first_byte(Instant::now());
                Ok(UpstreamAnswer::Response(r))
            }
            Err(e) => Err(e),
        };
        ex.trace().attempt_done(match &result {
            Ok(UpstreamAnswer::Response(r)) => Ok(r.status().as_u16()),
            Ok(UpstreamAnswer::Stream(_)) => Ok(200),
            Ok(UpstreamAnswer::Rejected(status, _)) => Ok(status.as_u16()),
            Err(e) => Err((e.reason(), e.status().as_u16())),
        });
        let error = match result {
            Ok(answered) => return Ok(answered),
            Err(e) => e,
        };
        if !error.retryable()
            || tried.len() >= attempts
            || !route.has_untried(pool, &tried)
            || Instant::now() >= head_deadline
        {
            return Err(error);
        }
        if !route.budget.try_retry() {
            route.retry_budget_exhausted.inc();
            return Err(error);
        }
        let b = route.config.retry.backoff;
        let wait = admission::retry::backoff(b.base, b.max, tried.len() as u32);
        if Instant::now() + wait >= head_deadline {
            return Err(error);
        }
        tokio::time::sleep(wait).await;
        route.retries.inc();
        ex.retried();
        now = Instant::now();
    }
}

/// A replica of the request's class not in `tried`, by the route's balancer; `None` when none is
/// left. Under `balance: slo`, a sheddable request no replica can serve in time is refused here.
pub(crate) fn pick(
    route: &Route,
    prepared: &Prepared,
    tried: &[usize],
    now: Instant,
    ex: &mut Ledger,
) -> Result<Option<crate::route::ReplicaGuard>, GatewayError> {
    if let Some(url) = &prepared.pinned {
        return Ok(route.pick_pinned(url, tried, now));
    }
    if route.config.balance == crate::config::Balance::Slo {
        pick_by_slo(route, prepared, tried, now, ex)
    } else {
        let pool = &route.classes[prepared.class].pool;
        match prepared.affinity {
            // An agent's session stays where its conversation is cached, within a bounded load.
            Some(session) => {
                Ok(route.pick_by(crate::config::Balance::PrefixAffinity, pool, tried, session, now))
            }
            None => Ok(route.pick(pool, tried, prepared.prefix_key, now)),
        }
    }
}

/// `balance: slo`'s pick (see `route::balance::pick_slo`), counted by its verdict; a sheddable
/// request that no replica is predicted to serve within its objectives is refused at once, before
/// any replica spends a step on it, with `Retry-After` from the prediction. What the stream then
/// measures is learned against the features of the pick (`Ledger::slo_sample`).
fn pick_by_slo(
    route: &Route,
    prepared: &Prepared,
    tried: &[usize],
    now: Instant,
    ex: &mut Ledger,
) -> Result<Option<crate::route::ReplicaGuard>, GatewayError> {
    use crate::route::balance::{SloAsk, SloVerdict};
    let class = &route.classes[prepared.class];
    let waited = now.saturating_duration_since(ex.arrival());
    let ask = SloAsk {
        ttft: prepared.slo.ttft.map(|t| t.saturating_sub(waited)),
        tpot: prepared.slo.tpot,
        input_tokens: prepared.input_tokens,
        prefix_key: prepared.affinity.unwrap_or(prepared.prefix_key),
        fallback: route.config.slo_fallback,
    };
    let Some((replica, x, verdict)) = route.pick_slo(&class.pool, tried, &ask, now) else {
        return Ok(None);
    };
    let outcome = match verdict {
        SloVerdict::Meets => "meets",
        SloVerdict::Unknown => "unknown",
        SloVerdict::Explore => "explore",
        SloVerdict::Unattainable { .. } if prepared.priority != admission::Priority::Sheddable => {
            "unattainable_sent"
        }
        SloVerdict::Unattainable {
            what,
            objective,
            predicted,
        } => {
            class.series.slo_routing("refused");
            let late = predicted.saturating_sub(objective);
            return Err(GatewayError::Overloaded {
                status: route.config.overflow(),
                route: route.config.model.clone(),
                class: class.config.name.clone(),
                limits: class.admission.limits(),
                rejection: admission::Rejection::SloUnattainable {
                    what,
                    objective_ms: objective.as_millis().min(u128::from(u32::MAX)) as u32,
                    predicted_ms: predicted.as_millis().min(u128::from(u32::MAX)) as u32,
                    retry_after: late.max(Duration::from_secs(1)).min(Duration::from_secs(60)),
                },
            });
        }
    };
    class.series.slo_routing(outcome);
    ex.sampled(crate::path::ledger::SloSample { x, sent: now });
    Ok(Some(replica))
}

/// Waits for the first token of replica `index`'s stream (DESIGN rule 10 holds the head until
/// then), and judges an error event in its place like the status it names: 429 and 503 are the
/// replica's backpressure (retried elsewhere), another 4xx is the client's, anything else a
/// failure ([`judge`], as for an answer's status).
async fn open(
    route: &Route,
    prepared: &Prepared,
    budgets: &Budgets,
    index: usize,
    response: Response,
    ex: &mut Ledger,
) -> Result<UpstreamAnswer, GatewayError> {
    let replica = &route.replicas[index];
    let name = &route.config.model;
    let events = Events::new(
        prepared.dialect,
        route.rename.clone(),
        !prepared.client_wants_usage,
        budgets,
        route.config.timeouts.stream_idle,
        Instant::now(),
    );
    let opened = relay::open(response.into_body(), events, ex).await;
    ex.first_byte(Instant::now());
    let early = match opened {
        Ok(Opened::Stream(streamed)) => {
            route.observe(replica, Observation::Served);
            return Ok(UpstreamAnswer::Stream(streamed));
        }
        Ok(Opened::Error(early)) => early,
        Err(e) => {
            let seen = match e {
                GatewayError::FirstTokenTimeout(_) => Observation::TimedOut,
                _ => Observation::Failed,
            };
            route.observe(replica, seen);
            return Err(e);
        }
    };
    let verdict = judge(early.status, None);
    route.observe(replica, verdict.observation());
    match verdict.into_result(name, index, " in its stream before the first token") {
        // The replica's own 4xx, in place of the stream: the client's, relayed.
        Ok(status) => Ok(UpstreamAnswer::Rejected(status, early.body)),
        Err(e) => {
            if let Verdict::Failed(status) = verdict {
                let detail = String::from_utf8_lossy(&early.body[..early.body.len().min(300)]);
                tracing::warn!(route = %name, replica = %replica.url, ?status, body = %detail, "upstream sent an error event before the first token");
            }
            Err(e)
        }
    }
}

/// One call to replica `index`, its answer classified: a response to relay, or why not.
async fn attempt(
    route: &Route,
    api: Api,
    prepared: &Prepared,
    budgets: &Budgets,
    id: &str,
    index: usize,
    trace: Option<crate::traces::TraceHeaders>,
) -> Result<Response, GatewayError> {
    let replica = &route.replicas[index];
    let name = &route.config.model;
    let (head_deadline, head_budget) = budgets.head(prepared.stream);
    let remaining = budgets.deadline.saturating_duration_since(Instant::now());
    let deadline = format!("{}ms", remaining.as_millis());
    let none: (&str, &[u8]) = ("", b"");
    let mut headers = [
        ("x-request-id", id.as_bytes()),
        (DEADLINE_HEADER, deadline.as_bytes()),
        none,
        none,
    ];
    let mut n = 2;
    if let Some(t) = &trace {
        headers[n] = ("traceparent", t.traceparent.as_bytes());
        n += 1;
        if let Some(state) = &t.tracestate {
            headers[n] = ("tracestate", state.as_bytes());
            n += 1;
        }
    }
    let request = h1::Request {
        method: "POST",
        path: api.path(),
        headers: &headers[..n],
        body: &prepared.body,
    };
    let call = h1::send(&replica.conns, &request, route.config.timeouts.connect);
    let response = match tokio::time::timeout_at(head_deadline, call).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            let connect = e.is_connect();
            tracing::warn!(route = %name, replica = %replica.url, error = %e, connect, "upstream call failed");
            return Err(if connect {
                route.observe(replica, Observation::ConnectFailed);
                GatewayError::UpstreamConnect {
                    route: name.clone(),
                    replica: index,
                }
            } else {
                route.observe(replica, Observation::Failed);
                GatewayError::upstream(format!("lost the connection to route '{name}' replica {index}"))
            });
        }
        Err(_) => {
            route.observe(replica, Observation::TimedOut);
            return Err(if prepared.stream {
                GatewayError::FirstTokenTimeout(head_budget)
            } else {
                GatewayError::DeadlineExceeded(head_budget)
            });
        }
    };
    let status = response.status();
    if status.is_success() {
        // A stream has served only once its first chunk arrives (the relay says so).
        if !prepared.stream {
            route.observe(replica, Observation::Served);
        }
        return Ok(response);
    }
    let verdict = judge(Some(status), response.retry_after());
    route.observe(replica, verdict.observation());
    match verdict.into_result(name, index, "") {
        Ok(_) => Ok(response),
        Err(e) if matches!(verdict, Verdict::Busy { .. }) => Err(e),
        Err(e) => {
            // Read no longer than the head could take: a retry, or the client's 502, waits on it.
            let late = GatewayError::DeadlineExceeded(head_budget);
            let body = relay::collect(response.into_body(), head_deadline, MAX_LOGGED_BODY, late)
                .await
                .unwrap_or_default();
            let detail = String::from_utf8_lossy(&body[..body.len().min(300)]);
            tracing::warn!(route = %name, replica = %replica.url, status = status.as_u16(), body = %detail, "upstream answered an error");
            Err(e)
        }
    }
}

/// The replica's own 4xx body, to relay as it is: whole, within `limit` bytes
/// (`server.max_response_bytes`) and by the time the head was due (`budgets.head`), since a
/// stream's client would otherwise wait on a stalled body past its first-token budget.
pub(crate) async fn error_body(
    response: Response,
    budgets: &Budgets,
    stream: bool,
    limit: usize,
) -> Result<bytes::Bytes, GatewayError> {
    let (deadline, budget) = budgets.head(stream);
    let late = if stream {
        GatewayError::FirstTokenTimeout(budget)
    } else {
        GatewayError::DeadlineExceeded(budget)
    };
    relay::collect(response.into_body(), deadline, limit, late).await
}
