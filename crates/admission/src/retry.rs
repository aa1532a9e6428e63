//! Retries that cannot become a storm: a budget (retries ≤ a ratio of recent requests plus a small
//! floor per second) and exponential backoff with full jitter.

use crate::window::SlidingWindow;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

type TenSeconds = SlidingWindow<10>;

/// The retry budget of one route: requests and retries over the last ten seconds.
#[derive(Debug)]
pub struct RetryBudget {
    ratio: f64,
    min_per_second: u32,
    windows: Mutex<(TenSeconds, TenSeconds)>,
}

impl RetryBudget {
    pub fn new(ratio: f64, min_per_second: u32) -> RetryBudget {
        let now = Instant::now();
        let window = || TenSeconds::new(Duration::from_secs(1), now);
        RetryBudget {
            ratio,
            min_per_second,
            windows: Mutex::new((window(), window())),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (TenSeconds, TenSeconds)> {
        self.windows.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a request's first attempt, made at `now`.
    pub fn request(&self, now: Instant) {
        self.lock().0.add(now, 1);
    }

    /// Takes one retry from the budget; false (and nothing taken) when it is spent.
    pub fn try_retry(&self) -> bool {
        let now = Instant::now();
        let mut w = self.lock();
        let (requests, retries) = (w.0.sum(now), w.1.sum(now));
        let span = w.0.span().as_secs_f64();
        let allowed = self.ratio * requests as f64 + f64::from(self.min_per_second) * span;
        if retries as f64 + 1.0 > allowed {
            return false;
        }
        w.1.add(now, 1);
        true
    }
}

/// The wait before retry number `retry` (1-based): uniformly random up to `min(max, base × 2^(retry-1))`.
pub fn backoff(base: Duration, max: Duration, retry: u32) -> Duration {
    let ceiling = base
        .saturating_mul(1u32.checked_shl(retry.saturating_sub(1)).unwrap_or(u32::MAX))
        .min(max);
    ceiling.mul_f64(rand::random::<f64>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn retries_stay_within_the_ratio_plus_the_floor() {
        let budget = RetryBudget::new(0.1, 1);
        for _ in 0..100 {
            budget.request(Instant::now());
        }
        // 10 s window: 0.1 × 100 + 1/s × 10 s = 20 retries, then none.
        let granted = (0..50).filter(|_| budget.try_retry()).count();
        assert_eq!(granted, 20);
        // As the window slides past, the budget comes back.
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(budget.try_retry());
    }

    #[test]
    fn backoff_is_jittered_under_an_exponential_ceiling() {
        let base = Duration::from_millis(100);
        let max = Duration::from_secs(1);
        for retry in 1..8 {
            let ceiling = (base * 2u32.pow(retry - 1)).min(max);
            for _ in 0..50 {
                assert!(backoff(base, max, retry) <= ceiling);
            }
        }
        assert!(
            backoff(base, max, 40) <= max,
            "no overflow on a long run of retries"
        );
    }
}
