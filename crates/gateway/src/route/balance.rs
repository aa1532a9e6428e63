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
}

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
    let predicted: Vec<_> = (0..n)
        .map(|k| {
            let i = candidates[(start + k) % n];
            let (x, p) = replicas[i].predict(ask.input_tokens, now);
            (i, x, p)
        })
        .collect();
    let by_load = || {
        predicted
            .iter()
            .min_by_key(|(i, _, _)| replicas[*i].outstanding())
            .map(|(i, x, _)| (*i, *x, SloVerdict::Unknown))
    };
    let cold = |p: &Option<super::predict::Prediction>| match p {
        None => true,
        // A TPOT objective alone says nothing until the TPOT model knows something.
        Some(p) => ask.ttft.is_none() && p.tpot.is_none(),
    };
    if (ask.ttft.is_none() && ask.tpot.is_none()) || predicted.iter().any(|(_, _, p)| cold(p)) {
        return by_load();
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
