//! Exact percentiles (no histogram rounding) and the summary of one latency the JSON carries.

use serde::{Deserialize, Serialize};

/// The `p`-th percentile (0–100) of sorted values, interpolating linearly between the two closest
/// ranks (NumPy's default, which `vllm bench serve` reports).
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p / 100.0).clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64))
}

/// The usual summary of one latency, in seconds. Read back by `spillway plan`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    pub count: usize,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

impl Percentiles {
    /// `None` for no values.
    pub fn of(sorted: &[f64]) -> Option<Percentiles> {
        let p = |q| percentile(sorted, q);
        Some(Percentiles {
            count: sorted.len(),
            mean: sorted.iter().sum::<f64>() / sorted.len().max(1) as f64,
            p50: p(50.0)?,
            p90: p(90.0)?,
            p95: p(95.0)?,
            p99: p(99.0)?,
            max: *sorted.last()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_match_an_exact_computation() {
        // Linear interpolation between closest ranks, worked by hand: for 1..=10, p95 sits at rank
        // 0.95 * 9 = 8.55, between 9 and 10.
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(5.5));
        assert!((percentile(&v, 95.0).unwrap() - 9.55).abs() < 1e-12);
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&v, 100.0), Some(10.0));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);

        // Against a brute-force definition on shuffled data: the value v with exactly
        // floor(rank) values below it, plus the interpolated fraction of the next gap.
        let mut x: u64 = 12345;
        let mut data: Vec<f64> = (0..1001)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (x >> 33) as f64 / 1e3
            })
            .collect();
        let unsorted = data.clone();
        data.sort_by(f64::total_cmp);
        for p in [1.0_f64, 10.0, 50.0, 90.0, 95.0, 99.0, 99.9] {
            let rank: f64 = p / 100.0 * 1000.0;
            let k = rank.floor() as usize;
            let kth = |k: usize| {
                *unsorted
                    .iter()
                    .find(|v| {
                        unsorted.iter().filter(|w| w < v).count() <= k
                            && unsorted.iter().filter(|w| w <= v).count() > k
                    })
                    .unwrap()
            };
            let exact = kth(k) + (kth((k + 1).min(1000)) - kth(k)) * (rank - k as f64);
            assert!((percentile(&data, p).unwrap() - exact).abs() < 1e-9, "p{p}");
        }
    }
}
