//! The ledger of one request as it passes through the gateway — what it holds (its slot, its
//! quota, its leases), what it cost, and how it ended: one [`Ending`], set once — settled when it
//! is dropped, into the metrics and the access log.

use crate::access_log::{AccessLog, AccessRecord};
use crate::config::Slo;
use crate::error::Shape;
use crate::error::{CLIENT_CLOSED_REQUEST, Cut, GatewayError};
use crate::metrics::{ClassSeries, Metrics, NO_CLASS, UNKNOWN_ROUTE};
use crate::path::api::Api;
use crate::route::ReplicaGuard;
use admission::Permit;
use axum::http::StatusCode;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The labels of a request not yet routed or classified, made once: a request that is routed
/// and classified then costs no allocation for them.
static UNKNOWN_ROUTE_NAME: std::sync::LazyLock<Arc<str>> = std::sync::LazyLock::new(|| UNKNOWN_ROUTE.into());
static NO_CLASS_NAME: std::sync::LazyLock<Arc<str>> = std::sync::LazyLock::new(|| NO_CLASS.into());

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// The whole answer went out.
    Finished,
    /// Refused before any replica was asked; the code is the metric's rejection reason.
    Refused(&'static str),
    /// Failed after a replica was asked, before any byte went to the client.
    Failed(&'static str),
    /// The replica's own 4xx, relayed as it was.
    UpstreamRejected,
    Cut(Cut),
}

impl Ending {
    fn outcome(self) -> &'static str {
        match self {
            Ending::Finished => "ok",
            Ending::Refused(code) | Ending::Failed(code) => code,
            Ending::UpstreamRejected => "upstream_rejected",
            Ending::Cut(cut) => cut.code(),
        }
    }
}

/// Everything known about one request; its `Drop` writes the metrics and the access-log line.
pub(crate) struct Ledger {
    metrics: Arc<Metrics>,
    access: AccessLog,
    arrival: Instant,
    record: AccessRecord,
    series: Option<Arc<ClassSeries>>,
    slo: Option<Slo>,
    /// The admission slot, released when this is dropped (the end of the response body).
    permit: Option<Permit>,
    /// How long it waited for a slot (or before it was refused one).
    queue_wait: Option<Duration>,
    replica: Option<ReplicaGuard>,
    /// When the first upstream attempt started and when the upstream's first byte came back.
    upstream_start: Option<Instant>,
    upstream_first_byte: Option<Instant>,
    ending: Option<Ending>,
    /// The status the client got: set when the head goes out or the request ends, whichever
    /// comes first; none means the client left before any answer (logged as 499).
    status: Option<StatusCode>,
    first_chunk: Option<Instant>,
    last_chunk: Option<Instant>,
    chunks: u32,
    usage: Option<(u32, u32)>,
    /// The team's quota slot, settled with the real usage when this is dropped.
    /// Boxed, as only a team with a quota has one (see `lease`).
    quota: Option<Box<admission::quota::QuotaPermit>>,
    /// The team's windows for the `x-ratelimit-*` headers.
    rate_headers: Option<admission::quota::RateHeaders>,
    /// The request's leases in Redis, when limits are shared: given back when this is dropped.
    /// Boxed, as only a gateway sharing limits through Redis has one: it would otherwise make
    /// every request's record (moved several times on its way) twice as large.
    lease: Option<Box<crate::limits::Lease>>,
    /// The request's trace context and, when sampled, its spans' instants.
    trace: crate::traces::Trace,
    /// Under `balance: slo`: what the replica's TTFT and TPOT are learned against.
    slo_sample: Option<SloSample>,
    /// The endpoint it came in on: how its answer is read and its errors written.
    api: Option<Api>,
    /// Where the responses it makes are remembered (Responses' requests only).
    sessions: Option<Arc<crate::sessions::Sessions>>,
}

/// The features a replica was picked on, and when the request was sent to it.
pub(crate) struct SloSample {
    pub(crate) x: crate::route::predict::Features,
    pub(crate) sent: Instant,
}

impl Ledger {
    pub(crate) fn new(metrics: Arc<Metrics>, access: AccessLog, id: String) -> Ledger {
        Ledger {
            metrics,
            access,
            arrival: Instant::now(),
            record: AccessRecord {
                id,
                route: UNKNOWN_ROUTE_NAME.clone(),
                class: NO_CLASS_NAME.clone(),
                ..AccessRecord::default()
            },
            series: None,
            slo: None,
            permit: None,
            queue_wait: None,
            replica: None,
            upstream_start: None,
            upstream_first_byte: None,
            ending: None,
            status: None,
            first_chunk: None,
            last_chunk: None,
            chunks: 0,
            usage: None,
            quota: None,
            rate_headers: None,
            lease: None,
            trace: crate::traces::Trace::Off,
            slo_sample: None,
            api: None,
            sessions: None,
        }
    }

    /// The responses this request makes are remembered in `sessions`, with the replica that
    /// made them.
    pub(crate) fn remembers(&mut self, sessions: Arc<crate::sessions::Sessions>) {
        self.sessions = Some(sessions);
    }

    /// The answer named the response it made: later requests naming it go to this replica.
    pub(crate) fn made_response(&mut self, id: &str) {
        if let (Some(s), Some(r)) = (&self.sessions, &self.replica) {
            let made = crate::sessions::Made {
                route: self.record.route.clone(),
                replica: r.replica.url.clone(),
                team: self.record.team.clone(),
            };
            s.remember(id, made, Instant::now());
        }
    }

    /// The endpoint the request came in on.
    pub(crate) fn came_in_by(&mut self, api: Api) {
        self.api = Some(api);
        self.record.api = Some(api.name());
    }

    /// How its errors are written for its client.
    pub(crate) fn shape(&self) -> Shape {
        self.api.map(Api::shape).unwrap_or_default()
    }

    /// How its answer is read: an agents' API's, or OpenAI's completions (`None`).
    pub(crate) fn dialect(&self) -> Option<protocol::agents::Dialect> {
        self.api.and_then(Api::dialect)
    }

    /// When the request arrived: every budget and duration counts from here.
    pub(crate) fn arrival(&self) -> Instant {
        self.arrival
    }

    /// The request's ID, as its answer and its log line carry it.
    pub(crate) fn id(&self) -> &str {
        &self.record.id
    }

    /// Its trace starts, from the caller's context in `headers`.
    pub(crate) fn start_trace(
        &mut self,
        tracer: Option<&Arc<crate::traces::Tracer>>,
        headers: &axum::http::HeaderMap,
    ) {
        self.trace = crate::traces::Trace::start(tracer, headers, self.arrival);
    }

    /// The request's trace, which each stage marks.
    pub(crate) fn trace(&mut self) -> &mut crate::traces::Trace {
        &mut self.trace
    }

    /// The body was parsed: whether it asks for a stream, and what the access log keeps of it
    /// for a replay (arrival, model, `max_tokens` asked, the prompt's prefix-block hashes).
    pub(crate) fn parsed(&mut self, parsed: &super::prepare::Parsed) {
        self.record.stream = parsed.stream();
        self.record.arrival_ms = crate::access_log::wall_ms(self.arrival);
        self.record.model = Some(parsed.model().into());
        self.record.max_tokens = parsed.max_tokens();
        if self.access.keeps_lines() {
            self.record.hash_ids = parsed.hash_ids();
        }
    }

    /// The caller's team, once its key is known.
    pub(crate) fn identified(&mut self, team: Arc<str>) {
        self.record.team = team;
    }

    /// The route that serves the request.
    pub(crate) fn routed(&mut self, route: Arc<str>) {
        self.record.route = route;
    }

    /// The input tokens the request was counted at, and the priority it was given.
    pub(crate) fn counted(&mut self, tokens_in: u32, priority: &'static str) {
        self.record.tokens_in = Some(tokens_in);
        self.record.priority = Some(priority);
    }

    /// The team's windows, for the `x-ratelimit-*` headers of its answer.
    pub(crate) fn rate_limited(&mut self, headers: Option<admission::quota::RateHeaders>) {
        self.rate_headers = headers;
    }

    pub(crate) fn rate_headers(&self) -> Option<&admission::quota::RateHeaders> {
        self.rate_headers.as_ref()
    }

    /// Its leases in Redis (or on this gateway's share of the shared limits).
    pub(crate) fn leased(&mut self, lease: crate::limits::Lease) {
        self.lease = Some(Box::new(lease));
    }

    /// The first attempt on a replica starts at `now`.
    pub(crate) fn calling(&mut self, now: Instant) {
        self.upstream_start = Some(now);
        if let Some(lease) = &mut self.lease {
            lease.upstream_started();
        }
    }

    /// `replica` was picked and is now asked.
    pub(crate) fn picked(&mut self, replica: ReplicaGuard) {
        self.replica = Some(replica);
    }

    /// `balance: slo` picked the replica on these features: what it measures is learned against
    /// them.
    pub(crate) fn sampled(&mut self, sample: SloSample) {
        self.slo_sample = Some(sample);
    }

    /// Another replica serves it than the one picked (a retry, or Envoy's fallback): it is
    /// counted there, and nothing it measures is learned against the first pick.
    #[cfg_attr(not(feature = "picker"), allow(dead_code))]
    pub(crate) fn moved(&mut self, replica: ReplicaGuard) {
        self.record.retries += 1;
        self.slo_sample = None;
        self.replica = Some(replica);
    }

    /// A retry on another replica, picked next.
    pub(crate) fn retried(&mut self) {
        self.record.retries += 1;
    }

    pub(crate) fn retries(&self) -> u32 {
        self.record.retries
    }

    /// The replica asked, and its place in the route.
    #[cfg_attr(not(feature = "picker"), allow(dead_code))]
    pub(crate) fn replica(&self) -> Option<&ReplicaGuard> {
        self.replica.as_ref()
    }

    /// The upstream's first byte (a stream's first token) came at `now`.
    pub(crate) fn first_byte(&mut self, now: Instant) {
        self.upstream_first_byte = Some(now);
    }

    /// When the first attempt started and the first byte came, for `Server-Timing`.
    pub(crate) fn upstream_timing(&self) -> (Option<Instant>, Option<Instant>) {
        (self.upstream_start, self.upstream_first_byte)
    }

    /// The usage an event or an answer reported.
    pub(crate) fn reported(&mut self, usage: (u32, u32)) {
        self.usage = Some(usage);
    }

    /// A fact of how it ended the log names (`upstream_body_not_ended`).
    pub(crate) fn note(&mut self, note: &'static str) {
        self.record.note = Some(note);
    }

    #[cfg(test)]
    pub(crate) fn noted(&self) -> Option<&'static str> {
        self.record.note
    }

    /// The request now belongs to a class: its metrics and objective apply.
    pub(crate) fn classified(&mut self, class: &crate::route::Class) {
        self.record.class = class.name.clone();
        self.series = Some(class.series.clone());
        self.slo = class.config.slo;
    }

    /// The team's quota let the request through (`None`: the team has no quota).
    pub(crate) fn quota_admitted(&mut self, permit: Option<admission::quota::QuotaPermit>) {
        self.rate_headers = permit.as_ref().map(|p| p.headers);
        self.quota = permit.map(Box::new);
    }

    /// The request holds a slot until this record is dropped.
    /// Gives back a slot and quota place this gateway granted on its own share, refunding the
    /// reserved tokens: limits turned shared while the request waited, and Redis decides instead.
    pub(crate) fn give_back_local(&mut self) {
        self.permit = None;
        if let Some(mut q) = self.quota.take() {
            q.settle(0);
        }
        self.rate_headers = None;
    }

    pub(crate) fn admitted(&mut self, permit: Permit) {
        if let Some(s) = &self.series {
            let waited = permit.queue_wait.as_secs_f64();
            s.queue_wait.observe(waited);
            s.team(&self.metrics, &self.record.team, |t| t.queue_wait.observe(waited));
        }
        self.queue_wait = Some(permit.queue_wait);
        self.record.queue_ahead = permit.ahead;
        self.permit = Some(permit);
    }

    /// The time it waited before admission refused it.
    pub(crate) fn waited(&mut self, waited: Duration) {
        self.queue_wait = Some(waited);
    }

    pub(crate) fn queue_wait(&self) -> Option<Duration> {
        self.queue_wait
    }

    /// Sets how the request ended, with the status the client got; the first ending stands.
    pub(crate) fn end(&mut self, ending: Ending, status: StatusCode) {
        if self.ending.is_none() {
            self.ending = Some(ending);
            self.status.get_or_insert(status);
        }
    }

    /// The status the client was sent, once it was.
    #[cfg_attr(not(feature = "picker"), allow(dead_code))]
    pub(crate) fn status(&self) -> Option<StatusCode> {
        self.status
    }

    pub(crate) fn ended(&self) -> bool {
        self.ending.is_some()
    }

    /// The request fails with `e` before any byte of an answer went out.
    pub(crate) fn fail(&mut self, e: &GatewayError) {
        let ending = match e.cut() {
            Some(cut) => Ending::Cut(cut),
            None if self.replica.is_none() => Ending::Refused(e.reason()),
            None => Ending::Failed(e.reason()),
        };
        self.end(ending, e.status());
    }

    /// The response head went out with `status`; the body follows.
    pub(crate) fn answering(&mut self, status: StatusCode) {
        self.status = Some(status);
    }

    /// A relayed chunk carrying tokens, at `now`: the first sets TTFT, the rest are ITL gaps.
    pub(crate) fn token_chunk(&mut self, now: Instant) {
        match self.last_chunk {
            None => {
                self.first_chunk = Some(now);
                if let Some(p) = &self.permit {
                    p.first_token(now);
                }
                if let (Some(s), Some(r)) = (&self.slo_sample, &self.replica) {
                    r.replica.learn_ttft(&s.x, now.saturating_duration_since(s.sent));
                }
                if let Some(s) = &self.series {
                    s.ttft.observe((now - self.arrival).as_secs_f64());
                }
            }
            Some(prev) => {
                if let Some(s) = &self.series {
                    // Events of one read share their instant (a replica wrote them faster than
                    // they were read): their gap is nothing, known without a subtraction.
                    let gap = if now == prev {
                        0.0
                    } else {
                        (now - prev).as_secs_f64()
                    };
                    s.itl.observe(gap);
                }
            }
        }
        self.last_chunk = Some(now);
        self.chunks += 1;
    }

    /// A whole (non-streamed) answer arrived at `now`.
    pub(crate) fn whole_answer(&mut self, now: Instant, usage: Option<(u32, u32)>) {
        self.first_chunk = Some(now);
        self.last_chunk = Some(now);
        self.usage = usage;
    }

    /// TTFT within the class's objective, and the mean gap between chunks within its ITL
    /// objective. A request whose first token was never seen (a stream of deltas the relay did
    /// not count) is not known to be inside anything, so it never counts.
    fn met_slo(&self) -> bool {
        let Some(first) = self.first_chunk else {
            return false;
        };
        let Some(slo) = self.slo else { return true };
        let ttft_ok = slo.ttft.is_none_or(|limit| first - self.arrival <= limit);
        let itl_ok = match (slo.itl, self.first_chunk, self.last_chunk) {
            (Some(limit), Some(first), Some(last)) if self.chunks > 1 => {
                (last - first) / (self.chunks - 1) <= limit
            }
            _ => true,
        };
        ttft_ok && itl_ok
    }
}

/// How a request ended, worked out once when its ledger is dropped, for each step of its end.
struct Closing {
    ending: Ending,
    status: StatusCode,
    tokens_in: Option<u32>,
    tokens_out: Option<u32>,
    /// Its attained service: decode weighed above prefill (see `admission::fair`).
    service: u64,
    now: Instant,
}

/// The request's end, as four steps: what it held is settled with the admission that granted it,
/// what it measured is learned, it is counted in the metrics, and it is logged.
impl Drop for Ledger {
    fn drop(&mut self) {
        let end = self.closing();
        self.settle_admission(&end);
        self.learn();
        self.count(&end);
        self.log(&end);
    }
}

impl Ledger {
    fn closing(&self) -> Closing {
        // Nothing said how it ended: the client went away (while queued, waiting on the replica,
        // or mid-stream); nginx's 499 where no answer had started.
        let ending = self.ending.unwrap_or(Ending::Cut(Cut::Client));
        let status = self.status.unwrap_or(CLIENT_CLOSED_REQUEST);
        let (tokens_in, tokens_out) = match self.usage {
            Some((p, c)) => (Some(p), Some(c)),
            None => (self.record.tokens_in, (self.chunks > 0).then_some(self.chunks)),
        };
        let service = admission::fair::service_cost(
            u64::from(tokens_in.unwrap_or(0)),
            u64::from(tokens_out.unwrap_or(0)),
        );
        Closing {
            ending,
            status,
            tokens_in,
            tokens_out,
            service,
            now: Instant::now(),
        }
    }

    /// The quota, the shared lease and the slot learn what the request really cost; without
    /// usage, what the stream showed of it.
    fn settle_admission(&mut self, end: &Closing) {
        let cost = u64::from(end.tokens_in.unwrap_or(0)) + u64::from(end.tokens_out.unwrap_or(0));
        if let Some(q) = self.quota.as_mut() {
            q.settle(cost);
        }
        if let Some(l) = self.lease.as_mut() {
            l.settle(cost);
        }
        if let Some(p) = self.permit.as_mut() {
            p.settle(end.service);
        }
        if let Some(l) = self.lease.as_mut() {
            l.settle_service(end.service);
        }
    }

    /// `balance: slo`'s model learns the stream's time per output token on the replica it picked.
    fn learn(&self) {
        if let (Some(s), Some(r), Some(first), Some(last)) =
            (&self.slo_sample, &self.replica, self.first_chunk, self.last_chunk)
            && self.chunks > 1
        {
            r.replica.learn_tpot(&s.x, (last - first) / (self.chunks - 1));
        }
    }

    /// The metrics: cuts and wasted tokens, refusals, requests and tokens by team, duration and
    /// goodput.
    fn count(&self, end: &Closing) {
        let m = &self.metrics;
        let labels = [&*self.record.route, &*self.record.class];
        let team = &*self.record.team;
        let (ending, status, service) = (end.ending, end.status, end.service);
        match ending {
            Ending::Cut(cut) => {
                let l = [labels[0], labels[1], cut.code()];
                m.cancellations.with_label_values(&l).inc();
                let wasted = u64::from(end.tokens_out.unwrap_or(0));
                if wasted > 0 {
                    m.wasted_tokens.with_label_values(&l).inc_by(wasted);
                }
            }
            Ending::Refused(reason) => {
                m.rejections
                    .with_label_values(&[labels[0], labels[1], team, reason])
                    .inc();
            }
            Ending::Finished | Ending::Failed(_) | Ending::UpstreamRejected => {}
        }
        if let Some(api) = self.api {
            m.api_requests
                .with_label_values(&[labels[0], api.name(), status_label(status)])
                .inc();
        }
        // The usual ending (status 200) moves its team's series without a label lookup.
        let usage = self
            .usage
            .filter(|_| ending == Ending::Finished && self.series.is_some());
        match &self.series {
            Some(s) if status == StatusCode::OK => s.team(m, &self.record.team, |t| {
                t.ok.inc();
                t.service.inc_by(service);
                if let Some((p, c)) = usage {
                    t.prompt_tokens.inc_by(u64::from(p));
                    t.completion_tokens.inc_by(u64::from(c));
                }
            }),
            _ => {
                m.requests
                    .with_label_values(&[labels[0], labels[1], team, status_label(status)])
                    .inc();
                if let Some((p, c)) = usage {
                    m.prompt_tokens
                        .with_label_values(&[labels[0], labels[1], team])
                        .inc_by(u64::from(p));
                    m.completion_tokens
                        .with_label_values(&[labels[0], labels[1], team])
                        .inc_by(u64::from(c));
                }
                if self.permit.is_some() && service > 0 {
                    m.team_service
                        .with_label_values(&[labels[0], labels[1], team])
                        .inc_by(service);
                }
            }
        }
        if let Some(s) = &self.series {
            s.duration.observe((end.now - self.arrival).as_secs_f64());
            if ending == Ending::Finished {
                s.slo_requests.inc();
                if self.met_slo() {
                    s.goodput.inc();
                }
            }
        }
    }

    /// The trace's spans and the access log's line.
    fn log(&mut self, end: &Closing) {
        let Closing {
            ending,
            status,
            tokens_in,
            tokens_out,
            now,
            ..
        } = *end;
        self.record.status = status.as_u16();
        self.record.outcome = ending.outcome();
        self.record.queue_ms = self.queue_wait.map(ms);
        self.record.ttft_ms = self.first_chunk.map(|t| ms(t - self.arrival));
        self.record.duration_ms = ms(now - self.arrival);
        self.record.tokens_in = tokens_in;
        self.record.tokens_out = tokens_out;
        if let Some(r) = &self.replica {
            self.record.replica = Some(r.replica.url.clone());
        }
        let error = match ending {
            Ending::Refused(code) | Ending::Failed(code) => Some(code),
            _ => None,
        };
        std::mem::take(&mut self.trace).finish(|| crate::traces::Summary {
            id: self.record.id.clone(),
            route: self.record.route.clone(),
            class: self.record.class.clone(),
            team: self.record.team.clone(),
            status: status.as_u16(),
            cut: match ending {
                Ending::Cut(cut) => Some(cut),
                _ => None,
            },
            outcome: ending.outcome(),
            error,
            retries: self.record.retries,
            tokens_in,
            tokens_out,
            queue_wait: self.queue_wait,
            upstream_start: self.upstream_start,
            first_token: self.first_chunk,
            chunks: self.chunks,
            end: now,
        });
        self.access.write(std::mem::take(&mut self.record));
    }
}

/// Status codes as bounded label values.
fn status_label(status: StatusCode) -> &'static str {
    match status.as_u16() {
        200 => "200",
        400 => "400",
        401 => "401",
        403 => "403",
        404 => "404",
        408 => "408",
        413 => "413",
        429 => "429",
        431 => "431",
        499 => "499",
        500 => "500",
        502 => "502",
        503 => "503",
        504 => "504",
        s if s < 300 => "2xx",
        s if s < 500 => "4xx",
        _ => "5xx",
    }
}

/// Milliseconds to the microsecond, so that the log reads `1.487`, not `1.4872729999999998`.
fn ms(d: Duration) -> f64 {
    d.as_micros() as f64 / 1e3
}
