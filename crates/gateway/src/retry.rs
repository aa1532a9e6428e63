//! Retries that cannot become a storm: a budget (retries ≤ a ratio of recent requests plus a small
//! floor per second) and exponential backoff with full jitter.

use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// Requests and retries over the last ten seconds, in one-second buckets.
#[derive(Debug)]
struct Window {
    requests: [u32; 10],
    retries: [u32; 10],
    head: Instant,
    index: usize,
}

impl Window {
    const WIDTH: Duration = Duration::from_secs(1);

    fn advance(&mut self, now: Instant) {
        let mut steps = 0;
        while now.saturating_duration_since(self.head) >= Self::WIDTH && steps < 10 {
            self.head += Self::WIDTH;
            self.index = (self.index + 1) % 10;
            self.requests[self.index] = 0;
            self.retries[self.index] = 0;
            steps += 1;
        }
        if now.saturating_duration_since(self.head) >= Self::WIDTH {
            self.head = now;
        }
    }
}

/// The retry budget of one route.
#[derive(Debug)]
pub(crate) struct RetryBudget {
    ratio: f64,
    min_per_second: u32,
    window: Mutex<Window>,
}

impl RetryBudget {
    pub(crate) fn new(ratio: f64, min_per_second: u32) -> RetryBudget {
        RetryBudget {
            ratio,
            min_per_second,
            window: Mutex::new(Window {
                requests: [0; 10],
                retries: [0; 10],
                head: Instant::now(),
                index: 0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Window> {
        self.window.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a request's first attempt.
    pub(crate) fn request(&self) {
        let mut w = self.lock();
        w.advance(Instant::now());
        let i = w.index;
        w.requests[i] += 1;
    }

    /// Takes one retry from the budget; false (and nothing taken) when it is spent.
    pub(crate) fn try_retry(&self) -> bool {
        let mut w = self.lock();
        w.advance(Instant::now());
        let requests: u32 = w.requests.iter().sum();
        let retries: u32 = w.retries.iter().sum();
        let allowed = self.ratio * f64::from(requests) + f64::from(self.min_per_second) * 10.0;
        if f64::from(retries) + 1.0 > allowed {
            return false;
        }
        let i = w.index;
        w.retries[i] += 1;
        true
    }
}

/// The wait before retry number `retry` (1-based): uniformly random up to `min(max, base × 2^(retry-1))`.
pub(crate) fn backoff(base: Duration, max: Duration, retry: u32) -> Duration {
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
            budget.request();
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
