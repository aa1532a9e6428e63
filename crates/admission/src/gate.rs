//! Admission per route and class: at most C requests in flight, at most Q waiting, nobody waiting
//! longer than Wq or past their own deadline, priority order in the queue, and honest `Retry-After`
//! that grows with a sustained overload and is spread so that obedient clients do not come back
//! together.
//!
//! C may be adaptive: [`Admission::adapt`] moves it by AIMD on the time from admission to the
//! first token (the upstream's TTFT, without the gateway's own queue, which C itself causes) against
//! the class's TTFT objective. Each interval with at least 5 samples: p95 above the objective →
//! C × 0.8 (at least `min`), remembering the C that breached; p95 under 0.8 × the objective while C
//! was reached → C + ⌈√C⌉ (at most `max`), but only + 1 where that step would reach the C that last
//! breached (a fast climb from far below, a careful one near the knee; reaching that C without a
//! breach forgets it); otherwise C stays. Only requests admitted since C last changed are samples
//! of it: one admitted under the old C would blame the new one for its wait.
//!
//! A [`Permit`] is the slot; it is released when dropped, which the server arranges to happen when
//! the response body ends or is dropped, not when headers are sent.

use crate::Priority;
use crate::fair::{Claim, DISPLACED, Fairness, Flows, GRANTED, Share, Verdict, Waiter};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// C, Q and Wq of one class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub concurrency: u32,
    pub queue: u32,
    pub queue_wait: Duration,
}

/// Which of a request's objectives no replica is predicted to meet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Objective {
    Ttft,
    Tpot,
}

impl std::fmt::Display for Objective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Objective::Ttft => "a first token",
            Objective::Tpot => "a time per output token",
        })
    }
}

/// Why a request was not admitted; each maps to a metric reason and carries its `Retry-After`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// Q requests are already waiting.
    #[error("the queue is full")]
    QueueFull { retry_after: Duration },
    /// Waited Wq (or to the request's own deadline) without a slot.
    #[error("no slot within {waited:?}")]
    QueueTimeout { waited: Duration, retry_after: Duration },
    /// The wait predicted from the drain rate already exceeds what the request may wait.
    #[error("the predicted wait ({predicted:.1?}) exceeds what the request may wait")]
    PredictedWait {
        predicted: Duration,
        retry_after: Duration,
    },
    /// A `sheddable` request found every slot taken: it never waits.
    #[error("all slots are busy and sheddable requests do not wait")]
    Shed { retry_after: Duration },
    /// `balance: slo`: no replica is predicted to meet a sheddable request's own objectives, so it
    /// is refused rather than sent to miss them. Milliseconds, to keep every refusal small.
    #[error(
        "no replica is predicted to give {what} within the {objective_ms} ms its objective leaves (the closest: {predicted_ms} ms, with the model's error); sheddable requests are refused rather than sent to miss it"
    )]
    SloUnattainable {
        what: Objective,
        objective_ms: u32,
        predicted_ms: u32,
        retry_after: Duration,
    },
}

impl Rejection {
    /// Every `reason` a rejection can carry, so a metric can declare its label sets up front.
    pub const REASONS: [&'static str; 5] = [
        "queue_full",
        "queue_timeout",
        "predicted_wait",
        "shed",
        "slo_unattainable",
    ];

    /// The metric `reason` label.
    pub fn reason(&self) -> &'static str {
        match self {
            Rejection::QueueFull { .. } => "queue_full",
            Rejection::QueueTimeout { .. } => "queue_timeout",
            Rejection::PredictedWait { .. } => "predicted_wait",
            Rejection::Shed { .. } => "shed",
            Rejection::SloUnattainable { .. } => "slo_unattainable",
        }
    }

    pub fn retry_after(&self) -> Duration {
        match *self {
            Rejection::QueueFull { retry_after }
            | Rejection::QueueTimeout { retry_after, .. }
            | Rejection::PredictedWait { retry_after, .. }
            | Rejection::Shed { retry_after }
            | Rejection::SloUnattainable { retry_after, .. } => retry_after,
        }
    }
}

/// How fast a full class frees its slots, by Little's law: C requests that each hold a slot for S
/// seconds on average free C / S slots per second. S is the mean hold of the slots released in the
/// last ten seconds, so time spent idle never dilutes it (a rate of completions over wall time
/// would: after an idle minute it read as almost zero and refused a fresh burst), and with too few
/// recent holds there is no estimate at all: nobody is refused on a guess.
#[derive(Debug, Default)]
struct DrainRate {
    /// (released at, held for), oldest first, at most `MAX_HOLDS`.
    holds: VecDeque<(Instant, Duration)>,
    total: Duration,
}

impl DrainRate {
    const WINDOW: Duration = Duration::from_secs(10);
    const MAX_HOLDS: usize = 256;
    /// Fewer recent holds than this say too little to predict from.
    const MIN_SAMPLES: usize = 4;

    fn record(&mut self, now: Instant, held: Duration) {
        if self.holds.len() == Self::MAX_HOLDS {
            self.pop();
        }
        self.holds.push_back((now, held));
        self.total += held;
    }

    fn pop(&mut self) {
        if let Some((_, held)) = self.holds.pop_front() {
            self.total = self.total.saturating_sub(held);
        }
    }

    /// Slots freed per second while all `concurrency` are busy, or `None` without enough history.
    fn rate(&mut self, now: Instant, concurrency: u32) -> Option<f64> {
        while self
            .holds
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) > Self::WINDOW)
        {
            self.pop();
        }
        if self.holds.len() < Self::MIN_SAMPLES {
            return None;
        }
        let mean = self.total.as_secs_f64() / self.holds.len() as f64;
        // Holds of (almost) nothing: slots come back as fast as they are taken.
        Some(f64::from(concurrency) / mean.max(1e-6))
    }
}

/// The requests refused lately, each counted with a weight that halves every
/// `TAU × ln 2` (about 7 s): the excess of arrivals over what drained, most of which will come
/// back for a slot. Under a sustained overload it grows towards the refusal rate × `TAU`; once
/// refusals stop it fades by itself, so no state says when an overload began or ended.
#[derive(Debug, Default)]
struct Refused {
    weight: f64,
    at: Option<Instant>,
}

impl Refused {
    const TAU: Duration = Duration::from_secs(10);

    /// The weight now, before counting a new refusal.
    fn now(&mut self, now: Instant) -> f64 {
        if let Some(at) = self.at {
            let dt = now.saturating_duration_since(at).as_secs_f64();
            self.weight *= (-dt / Self::TAU.as_secs_f64()).exp();
        }
        self.at = Some(now);
        self.weight
    }

    fn count(&mut self) {
        self.weight += 1.0;
    }
}

/// How far above the wait it estimates `Retry-After` may be drawn (see [`spread`]).
const SPREAD: f64 = 0.5;
/// The most `Retry-After` advises.
const MAX_RETRY_AFTER: f64 = 60.0;

/// The state of an adaptive C.
#[derive(Debug, Clone)]
struct Adaptive {
    min: u32,
    max: u32,
    slo: Duration,
    samples: Vec<Duration>,
    /// The most requests in flight since the last adjustment.
    peak: u32,
    /// The C at which p95 last went over the objective: climb by one near it.
    breached_at: Option<u32>,
    /// When C last changed: only requests admitted since then are samples of it.
    changed_at: Instant,
}

/// Bounds and objective of an adaptive C.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdaptiveLimits {
    pub min: u32,
    pub max: u32,
    pub slo: Duration,
}

struct State {
    limits: Limits,
    adaptive: Option<Adaptive>,
    in_flight: u32,
    /// Waiters by team and priority, and each team's attained service.
    flows: Flows,
    next_id: u64,
    drain: DrainRate,
    refused: Refused,
}

impl State {
    fn queued(&self) -> u32 {
        self.flows.queued()
    }

    /// Under `teams`, charges a grant's claim to its team; whether it did.
    fn charge_grant(&mut self, claim: &Claim, now: Instant) -> bool {
        if self.flows.fairness != Fairness::Teams {
            return false;
        }
        let i = self.flows.index(claim, now);
        let team = self.flows.list[i].team.clone();
        self.flows.charge(&team, claim.cost as f64, now);
        true
    }

    /// Hands a slot to the next waiter (see [`Flows::pop_next`]); false if nobody took it.
    fn grant_next(&mut self, now: Instant) -> bool {
        while let Some((i, w)) = self.flows.pop_next(now) {
            if w.tx.send(GRANTED).is_ok() {
                return true;
            }
            self.flows.refund(i, w.cost, now);
        }
        false
    }

    /// Gives a freed slot to the first live waiter, or takes it out of flight; `held` is how long
    /// a request used it (none for a slot handed back unused).
    fn release(&mut self, now: Instant, held: Option<Duration>) {
        if let Some(held) = held {
            self.drain.record(now, held);
        }
        if self.in_flight > self.limits.concurrency {
            // C was lowered by a reload: this slot goes away instead of to a waiter.
            self.in_flight -= 1;
            return;
        }
        if !self.grant_next(now) {
            self.in_flight -= 1;
        }
    }

    fn retry_after(&mut self, ahead: u32, now: Instant) -> Duration {
        let (concurrency, queue_wait) = (self.limits.concurrency, self.limits.queue_wait);
        self.retry_after_at(ahead, now, concurrency, queue_wait)
    }

    /// `Retry-After` for a refused request with `ahead` waiters before it, at `concurrency` slots
    /// (every call counts a refusal): see [`retry_after_secs`].
    fn retry_after_at(
        &mut self,
        ahead: u32,
        now: Instant,
        concurrency: u32,
        queue_wait: Duration,
    ) -> Duration {
        let refused = self.refused.now(now);
        self.refused.count();
        let drain = self.drain.rate(now, concurrency).filter(|r| *r > 0.0);
        let (lo, hi) = spread(retry_after_secs(ahead, refused, drain, queue_wait));
        Duration::from_secs(rand::random_range(lo..=hi))
    }
}

/// The wait to advise a refused request before it is spread, in seconds: the time the class takes
/// to drain the `ahead` waiters before it, itself, and the `refused` requests turned away lately
/// (which will come back for a slot too), at `drain` slots a second; Wq without a drain rate.
/// A passing refusal is told the queue's drain time (a second or less), while one in an overload
/// that goes on is told more the longer and the harder it goes on: at 2× what drains for ten
/// seconds, about six seconds more.
fn retry_after_secs(ahead: u32, refused: f64, drain: Option<f64>, queue_wait: Duration) -> f64 {
    match drain {
        Some(rate) => (f64::from(ahead) + 1.0 + refused) / rate,
        None => queue_wait.as_secs_f64(),
    }
    .min(MAX_RETRY_AFTER)
}

/// The admission gate of one route and class.
pub struct Admission {
    state: Mutex<State>,
    /// Requests of this gateway waiting in the queue shared through Redis, for the gauge.
    waiting_shared: std::sync::atomic::AtomicU32,
}

/// Counts a request waiting in the shared queue while it lives (and its team as waiting, for the
/// fairness index and `/admin/state`).
pub struct SharedWaiter<'a>(&'a Admission, Arc<str>);

impl Drop for SharedWaiter<'_> {
    fn drop(&mut self) {
        self.0
            .waiting_shared
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        let mut s = self.0.lock();
        if let Some(i) = s.flows.find(&self.1) {
            s.flows.waiting_shared(i, -1, Instant::now());
        }
    }
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        f.debug_struct("Admission")
            .field("limits", &s.limits)
            .field("in_flight", &s.in_flight)
            .field("queued", &s.queued())
            .finish()
    }
}

/// A slot in flight; dropping it frees the slot for the next waiter.
#[derive(Debug)]
pub struct Permit {
    admission: Arc<Admission>,
    /// How long the request waited for the slot.
    pub queue_wait: Duration,
    /// Requests ahead of it in its lane's order when it joined the queue (none: it did not wait).
    pub ahead: Option<u32>,
    granted_at: Instant,
    /// The team charged for the slot, and how much (none under `fifo`): settled with `cost`,
    /// what it really cost, when the slot is released.
    team: Arc<str>,
    charged: Option<u64>,
    cost: Option<u64>,
}

impl Permit {
    /// `charged`: whether the grant charged the claim's cost to its team (under `teams`).
    fn new(
        admission: Arc<Admission>,
        queue_wait: Duration,
        granted_at: Instant,
        claim: &Claim,
        charged: bool,
    ) -> Permit {
        Permit {
            admission,
            queue_wait,
            ahead: None,
            granted_at,
            team: claim.team.clone(),
            charged: charged.then_some(claim.cost),
            cost: None,
        }
    }

    /// The request really cost `cost` weighted tokens (see [`crate::fair::service_cost`]): when
    /// the slot is released, its team's attained service takes this instead of what the grant
    /// charged.
    pub fn settle(&mut self, cost: u64) {
        self.cost = Some(cost);
    }

    /// The first token arrived at `now`: a sample for an adaptive C.
    pub fn first_token(&self, now: Instant) {
        let mut s = self.admission.lock();
        // A request admitted before C last changed measures the old C, not this one.
        if let Some(a) = s.adaptive.as_mut()
            && a.samples.len() < 4096
            && self.granted_at >= a.changed_at
        {
            a.samples.push(now.saturating_duration_since(self.granted_at));
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let now = Instant::now();
        let held = now.saturating_duration_since(self.granted_at);
        let mut s = self.admission.lock();
        if let (Some(charged), Some(cost)) = (self.charged, self.cost) {
            s.flows.settle(&self.team, charged, self.granted_at, cost, now);
        }
        s.release(now, Some(held));
    }
}

/// Removes a waiter that stops waiting (timeout or a client that left) from the queue, or, if it
/// was granted a slot in the same instant, gives that slot on.
struct WaitGuard {
    admission: Arc<Admission>,
    id: u64,
    team: Arc<str>,
    lane: usize,
    /// What a grant charged its team.
    cost: u64,
    rx: oneshot::Receiver<Verdict>,
    done: bool,
}

impl WaitGuard {
    /// Leaves the queue; `Some` if it was told meanwhile (a slot, now the caller's, or pushed out).
    fn leave(&mut self) -> Option<Verdict> {
        self.done = true;
        let mut s = self.admission.lock();
        if s.flows.remove(&self.team, self.lane, self.id) {
            None
        } else {
            // Popped by a release, which sent under the lock while we still held the receiver.
            self.rx.try_recv().ok()
        }
    }
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        if !self.done && self.leave() == Some(GRANTED) {
            // Granted as it left: the slot goes on, and the charge comes back.
            let now = Instant::now();
            let mut s = self.admission.lock();
            s.flows.charge(&self.team, -(self.cost as f64), now);
            s.release(now, None);
        }
    }
}

impl Admission {
    pub fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                limits,
                adaptive: None,
                in_flight: 0,
                flows: Flows::default(),
                next_id: 0,
                drain: DrainRate::default(),
                refused: Refused::default(),
            }),
            waiting_shared: std::sync::atomic::AtomicU32::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent across a panic elsewhere: every change is a few plain writes.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Changes C, Q and Wq in place (a reload). Requests in flight keep their slots; a larger C
    /// admits waiters at once, a smaller one admits nobody until enough slots come back.
    pub fn set_limits(&self, limits: Limits) {
        let mut s = self.lock();
        s.limits = limits;
        let now = Instant::now();
        while s.in_flight < s.limits.concurrency && s.grant_next(now) {
            s.in_flight += 1;
        }
    }

    /// How waiters of one lane are ordered from now on (a reload may change it).
    pub fn set_fairness(&self, fairness: Fairness) {
        self.lock().flows.fairness = fairness;
    }

    pub fn fairness(&self) -> Fairness {
        self.lock().flows.fairness
    }

    /// Each team's attained service and waiters in this class.
    pub fn shares(&self) -> Vec<Share> {
        self.lock().flows.shares(Instant::now())
    }

    /// Makes C adaptive within `bounds` (or fixed again with `None`), keeping the current C if it
    /// lies within them.
    pub fn set_adaptive(&self, bounds: Option<AdaptiveLimits>) {
        let mut s = self.lock();
        s.adaptive = bounds.map(|b| Adaptive {
            min: b.min,
            max: b.max,
            slo: b.slo,
            samples: Vec::new(),
            peak: 0,
            breached_at: None,
            changed_at: Instant::now(),
        });
        if let Some(b) = bounds {
            let c = s.limits.concurrency.clamp(b.min, b.max);
            drop(s);
            let limits = Limits {
                concurrency: c,
                ..self.limits()
            };
            self.set_limits(limits);
        }
    }

    /// One step of the adaptive controller (see the module docs); returns C after it.
    pub fn adapt(&self) -> u32 {
        let (current, next) = {
            let mut s = self.lock();
            let current = s.limits.concurrency;
            let in_flight = s.in_flight;
            let Some(a) = s.adaptive.as_mut() else {
                return current;
            };
            let mut samples = std::mem::take(&mut a.samples);
            let peak = std::mem::replace(&mut a.peak, in_flight);
            if samples.len() < 5 {
                return current;
            }
            samples.sort_unstable();
            let p95 = samples[(samples.len() * 95 / 100).min(samples.len() - 1)];
            let next = if p95 > a.slo {
                a.breached_at = Some(current);
                ((f64::from(current) * 0.8) as u32).max(a.min)
            } else if p95 < a.slo.mul_f64(0.8) && peak >= current {
                if a.breached_at.is_some_and(|b| current >= b) {
                    a.breached_at = None;
                }
                let sqrt = f64::from(current).sqrt().ceil() as u32;
                let step = match a.breached_at {
                    Some(b) if current + sqrt >= b => 1,
                    _ => sqrt,
                };
                (current + step).min(a.max)
            } else {
                current
            };
            if next != current {
                a.changed_at = Instant::now();
            }
            (current, next)
        };
        if next != current {
            let limits = Limits {
                concurrency: next,
                ..self.limits()
            };
            self.set_limits(limits);
        }
        next
    }

    pub fn limits(&self) -> Limits {
        self.lock().limits
    }

    /// A slot granted elsewhere (by limits shared through Redis), counted here so that the local
    /// share, should Redis fail, starts from what this gateway already has in flight.
    /// Its team is charged here too, so that fairness on the share starts from the service
    /// the team already had.
    pub fn admit_counted(self: &Arc<Self>, queue_wait: Duration, claim: &Claim) -> Permit {
        let now = Instant::now();
        let charged = {
            let mut s = self.lock();
            s.in_flight += 1;
            s.charge_grant(claim, now)
        };
        Permit::new(self.clone(), queue_wait, now, claim, charged)
    }

    /// For limits shared through Redis: how many waiters may be ahead of a request before its
    /// predicted wait at `concurrency` slots exceeds `budget` (`None`: no estimate yet; -1: even
    /// the first waiter would wait too long), from this gateway's own hold times.
    pub fn most_ahead(&self, concurrency: u32, budget: Duration) -> Option<i64> {
        let rate = self.lock().drain.rate(Instant::now(), concurrency)?;
        let fits = (rate * budget.as_secs_f64()).floor().min(1e12);
        Some(fits as i64 - 1)
    }

    /// `Retry-After` for a request with `ahead` waiters before it under shared `limits`.
    pub fn retry_after_shared(&self, ahead: u32, limits: Limits) -> Duration {
        self.lock()
            .retry_after_at(ahead, Instant::now(), limits.concurrency, limits.queue_wait)
    }

    pub fn in_flight(&self) -> u32 {
        self.lock().in_flight
    }

    /// Requests of this gateway waiting for a slot, here or in the queue shared through Redis.
    pub fn queued(&self) -> u32 {
        self.lock().queued() + self.waiting_shared.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How long the oldest request waiting here has waited; `None` with nobody waiting. Waiters of the queue shared
    /// through Redis are not timed here.
    pub fn oldest_wait(&self) -> Option<Duration> {
        let oldest = self.lock().flows.oldest()?;
        Some(Instant::now().saturating_duration_since(oldest))
    }

    /// Counts a request of `claim`'s team waiting in the shared queue until the guard drops.
    pub fn shared_waiter(&self, claim: &Claim) -> SharedWaiter<'_> {
        self.waiting_shared
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let now = Instant::now();
        let mut s = self.lock();
        let i = s.flows.index(claim, now);
        s.flows.waiting_shared(i, 1, now);
        SharedWaiter(self, claim.team.clone())
    }

    /// Waits for a slot, at most Wq and never past `deadline`; `claim` names the team the slot
    /// is charged to, which orders it among the waiters of its lane (see [`crate::fair`]).
    pub async fn acquire(
        self: &Arc<Self>,
        priority: Priority,
        deadline: Instant,
        claim: &Claim,
    ) -> Result<Permit, Rejection> {
        let start = Instant::now();
        let (guard, budget, ahead) = {
            let mut s = self.lock();
            if s.in_flight < s.limits.concurrency && s.queued() == 0 {
                s.in_flight += 1;
                let in_flight = s.in_flight;
                if let Some(a) = s.adaptive.as_mut() {
                    a.peak = a.peak.max(in_flight);
                }
                let charged = s.charge_grant(claim, start);
                return Ok(Permit::new(self.clone(), Duration::ZERO, start, claim, charged));
            }
            let flow = s.flows.index(claim, start);
            let lane = match priority {
                Priority::Critical => 0,
                Priority::Standard => 1,
                Priority::Sheddable => {
                    let retry_after = s.retry_after(0, start);
                    return Err(Rejection::Shed { retry_after });
                }
            };
            let queued = s.queued();
            // Under `teams`, a team holding more than its share of a full queue makes room — once
            // nothing else refuses the newcomer.
            let victim = if queued >= s.limits.queue {
                match s.flows.victim_for(flow, lane) {
                    Some(victim) => Some(victim),
                    None => {
                        let retry_after = s.retry_after(queued, start);
                        return Err(Rejection::QueueFull { retry_after });
                    }
                }
            } else {
                None
            };
            let ahead = s.flows.ahead(flow, lane);
            let budget = s.limits.queue_wait.min(deadline.saturating_duration_since(start));
            let concurrency = s.limits.concurrency;
            if let Some(rate) = s.drain.rate(start, concurrency).filter(|r| *r > 0.0) {
                let predicted = Duration::from_secs_f64((f64::from(ahead + 1) / rate).min(3600.0));
                if predicted > budget {
                    let retry_after = s.retry_after(ahead, start);
                    return Err(Rejection::PredictedWait {
                        predicted,
                        retry_after,
                    });
                }
            }
            if budget.is_zero() {
                let retry_after = s.retry_after(ahead, start);
                return Err(Rejection::QueueTimeout {
                    waited: Duration::ZERO,
                    retry_after,
                });
            }
            if let Some(pushed_out) = victim.and_then(|v| s.flows.push_out(v)) {
                let _ = pushed_out.tx.send(DISPLACED);
            }
            let (tx, rx) = oneshot::channel();
            let id = s.next_id;
            s.next_id += 1;
            let wq = s.limits.queue_wait;
            let waiter = Waiter {
                id,
                tx,
                since: start,
                due: start + claim.objective.map_or(wq, |o| o.min(wq)),
                cost: claim.cost,
            };
            s.flows.push(flow, lane, waiter, start);
            let team = s.flows.list[flow].team.clone();
            (
                WaitGuard {
                    admission: self.clone(),
                    id,
                    team,
                    lane,
                    cost: claim.cost,
                    rx,
                    done: false,
                },
                budget,
                ahead,
            )
        };
        let mut guard = guard;
        let told = match tokio::time::timeout(budget, &mut guard.rx).await {
            Ok(Ok(verdict)) => Some(verdict),
            _ => guard.leave(),
        };
        guard.done = true;
        let now = Instant::now();
        match told {
            Some(GRANTED) => {
                let charged = self.fairness() == Fairness::Teams;
                let mut permit = Permit::new(self.clone(), now - start, now, claim, charged);
                permit.ahead = Some(ahead);
                Ok(permit)
            }
            Some(_) => {
                let mut s = self.lock();
                let queued = s.queued();
                let retry_after = s.retry_after(queued, now);
                Err(Rejection::QueueFull { retry_after })
            }
            None => {
                let retry_after = self.lock().retry_after(0, now);
                Err(Rejection::QueueTimeout {
                    waited: now - start,
                    retry_after,
                })
            }
        }
    }
}

/// The whole seconds a wait of `w` seconds is advised as, drawn evenly from the first to the last:
/// ⌈w⌉ to ⌈max(w × (1 + SPREAD), w + 1)⌉, within 1–60. Whole seconds on the wire would otherwise
/// send every client refused in the same second back in the same second.
fn spread(w: f64) -> (u64, u64) {
    let clamp = |x: f64| x.ceil().clamp(1.0, MAX_RETRY_AFTER) as u64;
    let lo = clamp(w);
    (lo, clamp((w * (1.0 + SPREAD)).max(w + 1.0)).max(lo))
}

#[cfg(test)]
mod tests;
