//! Fair share between teams inside a contended class: each freed slot goes to the waiting team
//! that has attained the least service relative to its weight (least attained service, as
//! llm-d's flow control and the Virtual Token Counter of Sheng et al., OSDI '24, do).
//!
//! - **Service** is counted in weighted tokens: input + [`OUTPUT_WEIGHT`] × output, since a decoded
//!   token holds the replica far longer than a prefilled one (VTC's weights). A grant charges what
//!   the request may cost (its prompt and `max_tokens`), and its end settles the charge with what
//!   it really cost.
//! - **Decay**: attained service halves every [`HALF_LIFE`], so yesterday's heavy use does not
//!   cost a team today's turn.
//! - **Lift**: a team that starts waiting is lifted to the least service of the teams already
//!   waiting, so that a team back from idle gets its share from now on but cannot take every slot
//!   until it has caught up with history it did not use (VTC's counter lift). This is what keeps a
//!   heavy team from starving.
//! - Priority lanes still come first: fairness orders waiters within a lane.
//! - It is work-conserving: a team with nobody waiting is simply not picked, so its share goes to
//!   the others.
//!
//! `fifo` keeps the same bookkeeping (so the service gauges and the fairness index show how unfair
//! arrival order is) but hands slots out by arrival.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// The half-life of attained service.
pub const HALF_LIFE: Duration = Duration::from_secs(60);
/// What an output token weighs against an input token in attained service.
pub const OUTPUT_WEIGHT: u64 = 2;

/// The weighted tokens of a request with `input` prompt and `output` generated tokens.
pub fn service_cost(input: u64, output: u64) -> u64 {
    input.saturating_add(output.saturating_mul(OUTPUT_WEIGHT))
}

/// How a contended class orders the waiters of one priority lane.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fairness {
    /// By arrival.
    #[default]
    Fifo,
    /// The team with the least attained service relative to its weight first.
    Teams,
}

impl Fairness {
    pub fn as_str(self) -> &'static str {
        match self {
            Fairness::Fifo => "fifo",
            Fairness::Teams => "teams",
        }
    }
}

/// Who asks for a slot: the team it is charged to and what it may cost.
#[derive(Debug, Clone)]
pub struct Claim {
    pub team: Arc<str>,
    /// The team's weight: its share of a contended class is proportional to it.
    pub weight: f64,
    /// Weighted tokens charged when the slot is granted (see [`service_cost`]).
    pub cost: u64,
    /// Its own time-to-first-token objective, if it carries one: the queue serves the earliest
    /// deadline first (a request without one is due when Wq runs out).
    pub objective: Option<Duration>,
}

impl Claim {
    /// A claim with no team to tell apart (one anonymous flow).
    pub fn anonymous() -> Claim {
        Claim {
            team: Arc::from("anonymous"),
            weight: 1.0,
            cost: 0,
            objective: None,
        }
    }
}

/// A team's place in a class, as `/metrics` and `/admin/state` show it.
#[derive(Debug, Clone, PartialEq)]
pub struct Share {
    pub team: Arc<str>,
    pub weight: f64,
    /// Attained service now, decayed: what the scheduler compares (with any lift).
    pub service: f64,
    /// What it really received, decayed the same way (no lift): what the fairness index reads.
    pub received: f64,
    pub waiting: u32,
    /// When it last had a request waiting, if it ever had.
    pub backlogged_at: Option<Instant>,
}

/// Jain's fairness index of `xs`: 1 when all are equal, 1/n when one has everything.
pub fn jain(xs: &[f64]) -> Option<f64> {
    let sum: f64 = xs.iter().sum();
    let squares: f64 = xs.iter().map(|x| x * x).sum();
    (squares > 0.0).then(|| sum * sum / (xs.len() as f64 * squares))
}

/// What a waiter is told: the slot is its own, or it was pushed out of a full queue by a team
/// holding less than its share of the queue.
pub(crate) type Verdict = bool;
pub(crate) const GRANTED: Verdict = true;
pub(crate) const DISPLACED: Verdict = false;

pub(crate) struct Waiter {
    pub(crate) id: u64,
    pub(crate) tx: oneshot::Sender<Verdict>,
    /// When it joined the queue: the age of what waits, which no completion histogram shows.
    pub(crate) since: Instant,
    /// When it is due: the queue serves the earliest first (its objective, at most Wq away).
    pub(crate) due: Instant,
    pub(crate) cost: u64,
}

/// One team's waiters and attained service in a class.
pub(crate) struct Flow {
    pub(crate) team: Arc<str>,
    weight: f64,
    /// Attained service as the scheduler compares it: what it received, and any lift.
    service: f64,
    /// What it really received (no lift), for the fairness index.
    received: f64,
    /// When `service` and `received` were last decayed.
    at: Instant,
    /// Its requests waiting in the queue shared through Redis (not in `lanes`).
    pub(crate) waiting_shared: u32,
    /// Waiters by lane: critical, then standard (sheddable never waits).
    pub(crate) lanes: [VecDeque<Waiter>; 2],
    backlogged_at: Option<Instant>,
}

fn decay(value: f64, from: Instant, to: Instant) -> f64 {
    let dt = to.saturating_duration_since(from).as_secs_f64();
    value * (-dt * std::f64::consts::LN_2 / HALF_LIFE.as_secs_f64()).exp()
}

impl Flow {
    fn service_at(&self, now: Instant) -> f64 {
        decay(self.service, self.at, now)
    }

    /// Brings both counters to `now`.
    fn decay_to(&mut self, now: Instant) {
        if now > self.at {
            self.service = decay(self.service, self.at, now);
            self.received = decay(self.received, self.at, now);
            self.at = now;
        }
    }

    /// Adds weighted tokens it received (negative: a correction).
    fn add(&mut self, now: Instant, amount: f64) {
        self.decay_to(now);
        self.service = (self.service + amount).max(0.0);
        self.received = (self.received + amount).max(0.0);
    }

    /// Attained service per unit of weight: the key the scheduler orders teams by.
    fn normalized(&self, now: Instant) -> f64 {
        self.service_at(now) / self.weight
    }

    pub(crate) fn waiting(&self) -> usize {
        self.lanes[0].len() + self.lanes[1].len()
    }
}

/// The flows of one class and how the next slot is picked among them.
#[derive(Default)]
pub(crate) struct Flows {
    pub(crate) fairness: Fairness,
    pub(crate) list: Vec<Flow>,
    /// Waiters per lane, all teams together.
    pub(crate) lane_len: [u32; 2],
}

/// Flows idle this long, with next to no service left, are forgotten (a team removed by a reload,
/// a key that stopped coming).
const FORGET_AFTER: Duration = Duration::from_secs(600);

impl Flows {
    pub(crate) fn queued(&self) -> u32 {
        self.lane_len[0] + self.lane_len[1]
    }

    /// The flow of `claim`'s team, made if new; its weight follows the claim (a reload may change it).
    pub(crate) fn index(&mut self, claim: &Claim, now: Instant) -> usize {
        let found = self
            .list
            .iter()
            .position(|f| Arc::ptr_eq(&f.team, &claim.team) || f.team == claim.team);
        let i = found.unwrap_or_else(|| {
            self.forget_idle(now);
            self.list.push(Flow {
                team: claim.team.clone(),
                weight: claim.weight,
                service: 0.0,
                received: 0.0,
                at: now,
                waiting_shared: 0,
                lanes: [VecDeque::new(), VecDeque::new()],
                backlogged_at: None,
            });
            self.list.len() - 1
        });
        self.list[i].weight = claim.weight.max(f64::MIN_POSITIVE);
        i
    }

    pub(crate) fn find(&self, team: &Arc<str>) -> Option<usize> {
        self.list
            .iter()
            .position(|f| Arc::ptr_eq(&f.team, team) || f.team == *team)
    }

    fn forget_idle(&mut self, now: Instant) {
        self.list.retain(|f| {
            f.waiting() > 0
                || f.waiting_shared > 0
                || f.service_at(now) >= 1.0
                || now.saturating_duration_since(f.at) < FORGET_AFTER
        });
    }

    /// Adds `amount` weighted tokens (negative: a refund) to a team, under `teams` only.
    pub(crate) fn charge(&mut self, team: &Arc<str>, amount: f64, now: Instant) {
        if self.fairness != Fairness::Teams {
            return;
        }
        if let Some(i) = self.find(team) {
            self.list[i].add(now, amount);
        }
    }

    /// A request granted at `granted_at` and charged `charged` then really cost `cost`: the
    /// charge, decayed since like the rest of the team's service, is replaced by the cost.
    pub(crate) fn settle(
        &mut self,
        team: &Arc<str>,
        charged: u64,
        granted_at: Instant,
        cost: u64,
        now: Instant,
    ) {
        let left = decay(charged as f64, granted_at, now);
        self.charge(team, cost as f64 - left, now);
    }

    /// A request of flow `i` starts (`+1`) or stops (`-1`) waiting in the queue shared through
    /// Redis.
    pub(crate) fn waiting_shared(&mut self, i: usize, delta: i32, now: Instant) {
        let f = &mut self.list[i];
        f.waiting_shared = f.waiting_shared.saturating_add_signed(delta);
        f.backlogged_at = Some(now);
    }

    /// Queues a waiter of flow `i` in `lane`; a flow that starts waiting is lifted to the least
    /// normalized service of the flows already waiting (see the module docs).
    pub(crate) fn push(&mut self, i: usize, lane: usize, waiter: Waiter, now: Instant) {
        if self.list[i].waiting() == 0 && self.fairness == Fairness::Teams {
            let floor = self
                .list
                .iter()
                .enumerate()
                .filter(|(j, f)| *j != i && f.waiting() > 0)
                .map(|(_, f)| f.normalized(now))
                .min_by(f64::total_cmp);
            if let Some(floor) = floor {
                let f = &mut self.list[i];
                f.decay_to(now);
                f.service = f.service.max(floor * f.weight);
            }
        }
        let f = &mut self.list[i];
        f.backlogged_at = Some(now);
        // Earliest deadline first; an equal one after those already waiting (arrival order).
        let at = f.lanes[lane].partition_point(|w| w.due <= waiter.due);
        f.lanes[lane].insert(at, waiter);
        self.lane_len[lane] += 1;
    }

    /// The flow whose waiter in `lane` gets the next slot: the least normalized service under
    /// `teams` (ties by deadline, then arrival), the earliest deadline (then arrival) under `fifo`.
    fn pick(&self, lane: usize, now: Instant) -> Option<usize> {
        let waiting = self
            .list
            .iter()
            .enumerate()
            .filter_map(|(i, f)| f.lanes[lane].front().map(|w| (i, f, (w.due, w.id))));
        match self.fairness {
            Fairness::Fifo => waiting.min_by_key(|(_, _, key)| *key).map(|(i, _, _)| i),
            Fairness::Teams => waiting
                .min_by(|a, b| {
                    a.1.normalized(now)
                        .total_cmp(&b.1.normalized(now))
                        .then(a.2.cmp(&b.2))
                })
                .map(|(i, _, _)| i),
        }
    }

    /// Takes the waiter that gets the next slot (critical lane first), charging its team; with
    /// the index of its flow.
    pub(crate) fn pop_next(&mut self, now: Instant) -> Option<(usize, Waiter)> {
        for lane in 0..2 {
            if let Some(i) = self.pick(lane, now) {
                let w = self.list[i].lanes[lane].pop_front()?;
                self.lane_len[lane] -= 1;
                if self.fairness == Fairness::Teams {
                    self.list[i].add(now, w.cost as f64);
                }
                return Some((i, w));
            }
        }
        None
    }

    /// Gives back the charge of a waiter whose grant nobody took (it had just left).
    pub(crate) fn refund(&mut self, team_of: usize, cost: u64, now: Instant) {
        if self.fairness == Fairness::Teams {
            self.list[team_of].add(now, -(cost as f64));
        }
    }

    /// Removes waiter `id` of `team` from `lane`; false if it is no longer queued.
    pub(crate) fn remove(&mut self, team: &Arc<str>, lane: usize, id: u64) -> bool {
        let Some(i) = self.find(team) else {
            return false;
        };
        let queue = &mut self.list[i].lanes[lane];
        match queue.iter().position(|w| w.id == id) {
            Some(pos) => {
                queue.remove(pos);
                self.lane_len[lane] -= 1;
                true
            }
            None => false,
        }
    }

    /// How many waiters are likely served before a new one of flow `i` in `lane`: under `fifo`,
    /// everyone ahead in its lane; under `teams`, its own team's waiters and, of each other team,
    /// at most as many as its weight gives it while this team's turn comes.
    pub(crate) fn ahead(&self, i: usize, lane: usize) -> u32 {
        let critical = if lane == 1 { self.lane_len[0] } else { 0 };
        if self.fairness == Fairness::Fifo {
            return critical + self.lane_len[lane];
        }
        let me = &self.list[i];
        let own = me.lanes[lane].len() as f64;
        let others: f64 = self
            .list
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, f)| (f.lanes[lane].len() as f64).min(((own + 1.0) * f.weight / me.weight).ceil()))
            .sum();
        critical + (own + others) as u32
    }

    /// Under `teams`, with the queue full: the flow and lane whose newest waiter would make room
    /// — the team holding the most of the queue for its weight, if that is more than flow `i`
    /// would hold after joining. Only waiters of `lane` or a less urgent one are pushed out.
    pub(crate) fn victim_for(&self, i: usize, lane: usize) -> Option<(usize, usize)> {
        if self.fairness != Fairness::Teams {
            return None;
        }
        let mine = (self.list[i].waiting() as f64 + 1.0) / self.list[i].weight;
        self.list
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .filter_map(|(j, f)| {
                let l = if !f.lanes[1].is_empty() { 1 } else { 0 };
                (l >= lane && !f.lanes[l].is_empty()).then(|| (j, l, f.waiting() as f64 / f.weight))
            })
            .filter(|(_, _, held)| *held > mine)
            .max_by(|a, b| a.2.total_cmp(&b.2))
            .map(|(j, l, _)| (j, l))
    }

    /// Takes the newest waiter of `victim_for`'s answer out of the queue.
    pub(crate) fn push_out(&mut self, (flow, lane): (usize, usize)) -> Option<Waiter> {
        let w = self.list[flow].lanes[lane].pop_back()?;
        self.lane_len[lane] -= 1;
        Some(w)
    }

    /// The oldest waiter's arrival (a lane is in deadline order, so any of its waiters).
    pub(crate) fn oldest(&self) -> Option<Instant> {
        self.list
            .iter()
            .flat_map(|f| f.lanes.iter().flatten().map(|w| w.since))
            .min()
    }

    pub(crate) fn shares(&self, now: Instant) -> Vec<Share> {
        self.list
            .iter()
            .map(|f| Share {
                team: f.team.clone(),
                weight: f.weight,
                service: f.service_at(now),
                received: decay(f.received, f.at, now),
                waiting: f.waiting() as u32 + f.waiting_shared,
                backlogged_at: f.backlogged_at,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_of_equal_and_of_one_taking_all() {
        assert_eq!(jain(&[3.0, 3.0, 3.0]), Some(1.0));
        assert_eq!(jain(&[5.0, 0.0]), Some(0.5));
        let j = jain(&[1.0, 3.0]).unwrap();
        assert!((j - 16.0 / 20.0).abs() < 1e-12, "{j}");
        assert_eq!(jain(&[0.0, 0.0]), None);
    }

    #[test]
    fn service_halves_every_half_life() {
        let t0 = Instant::now();
        let v = decay(100.0, t0, t0 + HALF_LIFE);
        assert!((v - 50.0).abs() < 1e-9, "{v}");
        assert_eq!(service_cost(10, 5), 20);
    }
}
