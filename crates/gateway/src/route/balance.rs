//! Choosing a replica: least outstanding (the default), power of two choices, prefix affinity and
//! engine-aware, over the replicas a request may use.

use super::replica::Replica;
use crate::config::Balance;
use std::sync::Arc;
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
