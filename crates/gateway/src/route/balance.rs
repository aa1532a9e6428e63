//! Choosing a replica: least outstanding (the default), power of two choices, prefix affinity and
//! engine-aware, over the replicas a request may use.

use super::predict::Features;
use super::replica::Replica;
use crate::config::Balance;
use admission::Objective;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Rendezvous (highest random weight) hashing: the replica with the highest weight for a key keeps
/// it while replicas come and go, and no ring is needed.
fn rendezvous(key: u64, replica: &str) -> u64 {
    let mut h = key ^ 0x9e37_79b9_7f4a_7c15;
    for b in replica.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

/// Picks one of `candidates` (indices into `replicas`, all eligible) by `balance`.
///
/// Ties are broken from a random starting point drawn for each pick, so no shared counter (which a
/// retry's pick would also advance) can line every first attempt up on the same replica.
pub(crate) fn pick(
    balance: Balance,
    replicas: &[Arc<Replica>],
    candidates: &[usize],
    prefix_key: u64,
    now: Instant,
) -> Option<usize> {
    let n = candidates.len();
    if n <= 1 {
        return candidates.first().copied();
    }
    let start = rand::random_range(0..n);
    let rotated = || (0..n).map(move |k| candidates[(start + k) % n]);
    let load = |i: &usize| replicas[*i].outstanding();
    let least = || rotated().min_by_key(load);
    match balance {
        Balance::LeastOutstanding => least(),
        Balance::P2c => {
            let a = rand::random_range(0..n);
            let b = (a + 1 + rand::random_range(0..n - 1)) % n;
            let (a, b) = (candidates[a], candidates[b]);
            Some(if load(&b) < load(&a) { b } else { a })
        }
        Balance::PrefixAffinity => {
            let total: u32 = candidates.iter().map(load).sum();
            // Bounded load: at most 25% over the mean (plus one), else the next in line.
            let bound = f64::from(total + 1) / n as f64 * 1.25 + 1.0;
            let mut ranked = candidates.to_vec();
            ranked.sort_by_key(|i| std::cmp::Reverse(rendezvous(prefix_key, &replicas[*i].url)));
            ranked
                .into_iter()
                .find(|i| f64::from(load(i) + 1) <= bound)
                .or_else(least)
        }
        // `route::Route::pick_slo` picks for `slo`; a request it does not see goes by load.
        Balance::Slo => least(),
        Balance::EngineAware => {
            let scores: Option<Vec<(usize, f64)>> = rotated()
                .map(|i| replicas[i].engine_score(now).map(|s| (i, s)))
                .collect();
            match scores {
                Some(scores) => scores
                    .into_iter()
                    .min_by(|a, b| a.1.total_cmp(&b.1))
                    .map(|(i, _)| i),
                None => least(),
            }
        }
    }
}

/// A request's own objectives for `balance: slo`: what is left of its TTFT objective now (the
/// gateway's queue has used some) and its time per output token.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SloAsk {
    pub(crate) ttft: Option<Duration>,
    pub(crate) tpot: Option<Duration>,
    pub(crate) input_tokens: u32,
    /// The prompt prefix's hash: which replica prefix affinity would pick is a feature.
    pub(crate) prefix_key: u64,
    /// How to pick while no prediction helps (`slo_fallback`).
    pub(crate) fallback: Balance,
}

/// What `balance: slo` concluded for a request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum SloVerdict {
    /// The replica picked is predicted to meet every objective.
    Meets,
    /// No replica is: the one picked comes closest; `what` it misses, its objective and what the
    /// replica is predicted to give.
    Unattainable {
        what: admission::Objective,
        objective: Duration,
        predicted: Duration,
    },
    /// No objective, or a replica's model is still warming up: picked by load.
    Unknown,
    /// Sent to an idle replica whose model learned nothing for [`EXPLORE_AFTER`]: what it
    /// predicts may be out of date, and only a stream tells.
    Explore,
}

/// How long a replica with nothing in flight may go without a stream before the next request is
/// sent to it to learn what it gives now: without it, a replica predicted slow once (in a burst)
/// would never be tried again, however idle and fast it has become since.
pub(crate) const EXPLORE_AFTER: Duration = Duration::from_secs(1);

/// `balance: slo`: of `candidates`, the replica predicted to meet `ask`'s objectives with the
/// least headroom to spare (tight requests keep the fast replicas for those that need them); when
/// none is predicted to, the one that comes closest. With the features it was picked on, which the
/// stream's measurements are learned against.
pub(crate) fn pick_slo(
    replicas: &[Arc<Replica>],
    candidates: &[usize],
    ask: &SloAsk,
    now: Instant,
) -> Option<(usize, Features, SloVerdict)> {
    let n = candidates.len();
    let start = rand::random_range(0..n.max(1));
    let home = candidates
        .iter()
        .max_by_key(|i| rendezvous(ask.prefix_key, &replicas[**i].url))
        .copied();
    let predicted: Vec<_> = (0..n)
        .map(|k| {
            let i = candidates[(start + k) % n];
            let (x, p) = replicas[i].predict(ask.input_tokens, home == Some(i), now);
            (i, x, p)
        })
        .collect();
    // Nothing predicted helps: the route's other balancer picks, and the stream is learned.
    let by_load = || {
        let i = pick(ask.fallback, replicas, candidates, ask.prefix_key, now)?;
        let x = predicted.iter().find(|(j, _, _)| *j == i)?.1;
        Some((i, x, SloVerdict::Unknown))
    };
    let cold = |p: &Option<super::predict::Prediction>| match p {
        None => true,
        // A TPOT objective alone says nothing until the TPOT model knows something.
        Some(p) => ask.ttft.is_none() && p.tpot.is_none(),
    };
    if (ask.ttft.is_none() && ask.tpot.is_none()) || predicted.iter().any(|(_, _, p)| cold(p)) {
        return by_load();
    }
    let stale_since = now.checked_sub(EXPLORE_AFTER).unwrap_or(now);
    if let Some((i, x, _)) = predicted
        .iter()
        .find(|(i, _, _)| replicas[*i].idle_and_stale(stale_since))
    {
        return Some((*i, *x, SloVerdict::Explore));
    }
    // Each objective against its prediction, made larger by the model's own measured error (at
    // most doubled), so that "predicted to meet" is not a coin toss at the line.
    let misses = |p: &super::predict::Prediction| {
        let ttft = ask
            .ttft
            .map(|o| (Objective::Ttft, o, p.ttft.mul_f64(1.0 + p.ttft_error.min(1.0))));
        let tpot = ask
            .tpot
            .zip(p.tpot)
            .map(|(o, t)| (Objective::Tpot, o, t.mul_f64(1.0 + p.tpot_error.min(1.0))));
        ttft.into_iter().chain(tpot)
    };
    // Headroom: the smallest share of an objective left over (negative: missed by that share).
    let left = |(_, objective, predicted): &(Objective, Duration, Duration)| {
        (objective.as_secs_f64() - predicted.as_secs_f64()) / objective.as_secs_f64().max(1e-6)
    };
    let headroom = |p: &super::predict::Prediction| misses(p).map(|m| left(&m)).fold(f64::INFINITY, f64::min);
    let scored = predicted
        .iter()
        .filter_map(|(i, x, p)| p.map(|p| (*i, *x, p, headroom(&p))));
    let meets = scored
        .clone()
        .filter(|s| s.3 >= 0.0)
        .min_by(|a, b| a.3.total_cmp(&b.3));
    match meets {
        Some((i, x, _, _)) => Some((i, x, SloVerdict::Meets)),
        None => scored.max_by(|a, b| a.3.total_cmp(&b.3)).map(|(i, x, p, _)| {
            let worst = misses(&p).min_by(|a, b| left(a).total_cmp(&left(b))).unwrap_or((
                Objective::Ttft,
                Duration::ZERO,
                p.ttft,
            ));
            let (what, objective, predicted) = worst;
            (
                i,
                x,
                SloVerdict::Unattainable {
                    what,
                    objective,
                    predicted,
                },
            )
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::predict::{State, features};

    fn replicas() -> Vec<Arc<Replica>> {
        let metrics = crate::metrics::Metrics::new();
        ["http://127.0.0.1:1", "http://127.0.0.1:2"]
            .iter()
            .map(|url| Arc::new(Replica::new("chat", url, &metrics, None)))
            .collect()
    }

    fn teach(r: &Replica, ttft_ms: u64) {
        for k in 0..12u32 {
            let x = features(State {
                input_tokens: 100 + 10 * k,
                in_flight: k % 3,
                engine_waiting: 0.0,
                ..State::default()
            });
            r.learn_ttft(&x, Duration::from_millis(ttft_ms));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_replica_predicted_slow_long_ago_is_tried_again() {
        let r = replicas();
        let ask = SloAsk {
            ttft: Some(Duration::from_millis(100)),
            tpot: None,
            input_tokens: 120,
            prefix_key: 7,
            fallback: Balance::LeastOutstanding,
        };
        // Replica 0 looked slow (in a burst); replica 1 is fast and busy being learned.
        teach(&r[0], 500);
        teach(&r[1], 20);
        let pick = pick_slo(&r, &[0, 1], &ask, Instant::now()).unwrap();
        assert_eq!((pick.0, pick.2), (1, SloVerdict::Meets));
        // Two seconds on, replica 1 still streaming, replica 0 idle and unheard of: it is tried.
        tokio::time::advance(Duration::from_secs(2)).await;
        teach(&r[1], 20);
        let pick = pick_slo(&r, &[0, 1], &ask, Instant::now()).unwrap();
        assert_eq!((pick.0, pick.2), (0, SloVerdict::Explore));
        // What it showed now is what counts from then on.
        teach(&r[0], 15);
        let pick = pick_slo(&r, &[0, 1], &ask, Instant::now()).unwrap();
        assert_eq!(pick.2, SloVerdict::Meets);
    }

    #[tokio::test(start_paused = true)]
    async fn with_nothing_predicted_the_routes_other_balancer_picks() {
        let r = replicas();
        let home = if rendezvous(7, &r[0].url) > rendezvous(7, &r[1].url) {
            0
        } else {
            1
        };
        // No objective: prefix affinity, the fallback here, sends the prefix to its home.
        let ask = SloAsk {
            ttft: None,
            tpot: None,
            input_tokens: 120,
            prefix_key: 7,
            fallback: Balance::PrefixAffinity,
        };
        for _ in 0..8 {
            let pick = pick_slo(&r, &[0, 1], &ask, Instant::now()).unwrap();
            assert_eq!((pick.0, pick.2), (home, SloVerdict::Unknown));
            // The home replica's feature says so.
            assert_eq!(pick.1[7], 1.0);
        }
    }
}
