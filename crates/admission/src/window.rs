//! A sliding-window counter in fixed buckets: how much happened over the last `N` × `width`. The
//! retry budget and the tenant quotas count with it.

use std::time::Duration;
use tokio::time::Instant;

/// Amounts over the last `N` buckets of `width` each.
#[derive(Debug, Clone)]
pub struct SlidingWindow<const N: usize> {
    buckets: [u64; N],
    width: Duration,
    /// Start of the newest bucket.
    head: Instant,
    index: usize,
}

impl<const N: usize> SlidingWindow<N> {
    pub fn new(width: Duration, now: Instant) -> Self {
        Self {
            buckets: [0; N],
            width,
            head: now,
            index: 0,
        }
    }

    /// The span the window covers.
    pub fn span(&self) -> Duration {
        self.width * N as u32
    }

    fn advance(&mut self, now: Instant) {
        let mut steps = 0;
        while now.saturating_duration_since(self.head) >= self.width && steps < N {
            self.head += self.width;
            self.index = (self.index + 1) % N;
            self.buckets[self.index] = 0;
            steps += 1;
        }
        if now.saturating_duration_since(self.head) >= self.width {
            // Idle for longer than the window: every bucket is already empty.
            self.head = now;
        }
    }

    pub fn add(&mut self, now: Instant, amount: u64) {
        self.advance(now);
        self.buckets[self.index] = self.buckets[self.index].saturating_add(amount);
    }

    /// Takes `amount` back from what was added at `at` (if that is still in the window): a charge
    /// settled for less than was reserved.
    pub fn remove(&mut self, now: Instant, at: Instant, amount: u64) {
        self.advance(now);
        if let Some(i) = self.bucket_of(at) {
            self.buckets[i] = self.buckets[i].saturating_sub(amount);
        }
    }

    /// The bucket that holds instant `at`, if it is still in the window.
    fn bucket_of(&self, at: Instant) -> Option<usize> {
        let back = if at >= self.head {
            0
        } else {
            (self.head - at).as_nanos().div_ceil(self.width.as_nanos().max(1))
        };
        (back < N as u128).then(|| (self.index + N - back as usize) % N)
    }

    pub fn sum(&mut self, now: Instant) -> u64 {
        self.advance(now);
        self.buckets.iter().sum()
    }

    /// How long until the window's total falls to `target` or below as old buckets leave it.
    pub fn time_until_at_most(&mut self, now: Instant, target: u64) -> Duration {
        let mut total = self.sum(now);
        if total <= target {
            return Duration::ZERO;
        }
        // Oldest first: bucket k back from the newest leaves the window at head + (N - k) × width.
        for back in (0..N).rev() {
            let i = (self.index + N - back) % N;
            total = total.saturating_sub(self.buckets[i]);
            if total <= target {
                let leaves = self.head + self.width * (N - back) as u32;
                return leaves.saturating_duration_since(now);
            }
        }
        self.span()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn counts_slide_out_bucket_by_bucket() {
        let t0 = Instant::now();
        let mut w = SlidingWindow::<10>::new(Duration::from_secs(1), t0);
        w.add(t0, 5);
        tokio::time::advance(Duration::from_millis(2500)).await;
        w.add(Instant::now(), 3);
        assert_eq!(w.sum(Instant::now()), 8);
        // The 5 leave when their bucket (second 0) falls out: at 10 s.
        assert_eq!(
            w.time_until_at_most(Instant::now(), 3),
            Duration::from_millis(7500)
        );
        tokio::time::advance(Duration::from_millis(7500)).await;
        assert_eq!(w.sum(Instant::now()), 3);
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(w.sum(Instant::now()), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_settled_charge_is_taken_back_where_it_was_made() {
        let t0 = Instant::now();
        let mut w = SlidingWindow::<60>::new(Duration::from_secs(1), t0);
        w.add(t0, 100);
        tokio::time::advance(Duration::from_secs(5)).await;
        w.add(Instant::now(), 10);
        w.remove(Instant::now(), t0, 60);
        assert_eq!(w.sum(Instant::now()), 50);
        tokio::time::advance(Duration::from_secs(55)).await;
        assert_eq!(
            w.sum(Instant::now()),
            10,
            "the settled charge left with its bucket"
        );
    }
}
