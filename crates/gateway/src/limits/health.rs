//! Whether Redis is down, not merely slow: the signals the shared→local switch waits on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// When Redis last answered, and since when calls have failed without an answer in between.
///
/// A slow answer is an answer: only silence or failures lasting `down_after` make Redis down.
#[derive(Debug)]
pub(super) struct Health {
    base: Instant,
    /// ms since `base` (+1, so that 0 is "never") of the last answer.
    answered: AtomicU64,
    /// ms since `base` (+1; 0: none) of the first failure since the last answer.
    failing: AtomicU64,
}

impl Health {
    pub(super) fn new() -> Health {
        Health {
            base: Instant::now(),
            answered: AtomicU64::new(0),
            failing: AtomicU64::new(0),
        }
    }

    fn stamp(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.base).as_millis() as u64 + 1
    }

    /// How long since this gateway started.
    pub(super) fn since_start(&self) -> Duration {
        self.base.elapsed()
    }

    /// Redis answered a call.
    pub(super) fn answered(&self) {
        self.answered.store(self.stamp(Instant::now()), Ordering::Release);
        self.failing.store(0, Ordering::Release);
    }

    /// Redis answered something after `since`.
    pub(super) fn answered_since(&self, since: Instant) -> bool {
        self.answered.load(Ordering::Acquire) >= self.stamp(since)
    }

    /// A call failed or gave up; true when calls have failed for `down_after` with no answer in
    /// between: Redis is down.
    pub(super) fn failed(&self, down_after: Duration) -> bool {
        let now = self.stamp(Instant::now());
        let first = match self
            .failing
            .compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => now,
            Err(first) => first,
        };
        now.saturating_sub(first) >= down_after.as_millis() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn failures_make_redis_down_only_when_they_last_and_no_answer_comes_between() {
        let h = Health::new();
        let down_after = Duration::from_secs(1);
        assert!(!h.failed(down_after), "one failure is not an outage");
        tokio::time::advance(Duration::from_millis(600)).await;
        assert!(!h.failed(down_after));
        // An answer, however slow, clears the failures.
        h.answered();
        tokio::time::advance(Duration::from_millis(600)).await;
        assert!(!h.failed(down_after), "failing for 0 ms since the answer");
        tokio::time::advance(Duration::from_millis(999)).await;
        assert!(!h.failed(down_after));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(h.failed(down_after), "failing for 1 s without an answer");
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_counts_for_calls_started_before_it() {
        let h = Health::new();
        let start = Instant::now();
        assert!(!h.answered_since(start));
        tokio::time::advance(Duration::from_millis(5)).await;
        h.answered();
        assert!(h.answered_since(start));
        tokio::time::advance(Duration::from_millis(5)).await;
        assert!(!h.answered_since(Instant::now()));
    }
}
