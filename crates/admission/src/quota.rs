//! Stage 5, the tenant quota: per team at most `max_parallel` requests in flight, `rpm` requests
//! and `tpm` tokens a minute. Windows slide in one-second buckets over the last 60 s (a request
//! counts for exactly 60 s after it was admitted). A request's tokens are charged at admission as
//! its prompt plus its `max_tokens` (after the caps: the most it can cost) and settled with the
//! real usage when it ends, so a stream cut short pays only for what was generated.

use crate::window::SlidingWindow;
use std::num::{NonZeroU32, NonZeroU64};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;

const BUCKET: Duration = Duration::from_secs(1);
type Minute = SlidingWindow<60>;

/// Which quota refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaKind {
    Parallel,
    Requests,
    Tokens,
}

impl QuotaKind {
    /// Every kind, so a metric can declare its label sets up front.
    pub const ALL: [QuotaKind; 3] = [QuotaKind::Parallel, QuotaKind::Requests, QuotaKind::Tokens];

    /// The metric `reason` label.
    pub fn reason(self) -> &'static str {
        match self {
            QuotaKind::Parallel => "tenant_parallel",
            QuotaKind::Requests => "tenant_rpm",
            QuotaKind::Tokens => "tenant_tpm",
        }
    }

    fn name(self) -> &'static str {
        match self {
            QuotaKind::Parallel => "max_parallel",
            QuotaKind::Requests => "rpm",
            QuotaKind::Tokens => "tpm",
        }
    }
}

/// The configured limits of one team.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QuotaLimits {
    pub max_parallel: Option<NonZeroU32>,
    pub rpm: Option<NonZeroU32>,
    pub tpm: Option<NonZeroU64>,
}

impl QuotaLimits {
    /// One gateway's share while limits shared by `gateways` gateways cannot be: each ÷
    /// `gateways`, at least 1.
    pub fn share(&self, gateways: NonZeroU32) -> QuotaLimits {
        let n = gateways.get();
        let share = |m: NonZeroU32| NonZeroU32::new((m.get() / n).max(1));
        QuotaLimits {
            max_parallel: self.max_parallel.and_then(share),
            rpm: self.rpm.and_then(share),
            tpm: self
                .tpm
                .and_then(|t| NonZeroU64::new((t.get() / u64::from(n)).max(1))),
        }
    }

    pub fn is_unlimited(&self) -> bool {
        *self == QuotaLimits::default()
    }
}

struct State {
    limits: QuotaLimits,
    in_flight: u32,
    requests: Minute,
    tokens: Minute,
}

impl State {
    /// Limit, remaining and time to reset of each window: the reset is when the oldest request
    /// (tokens: all of them) leaves it.
    fn headers(&mut self, now: Instant) -> RateHeaders {
        let limits = self.limits;
        RateHeaders {
            requests: limits.rpm.map(|rpm| {
                let used = self.requests.sum(now);
                let reset = self.requests.time_until_at_most(now, used.saturating_sub(1));
                (rpm.get(), u64::from(rpm.get()).saturating_sub(used), reset)
            }),
            tokens: limits.tpm.map(|tpm| {
                let used = self.tokens.sum(now);
                let reset = self.tokens.time_until_at_most(now, 0);
                (tpm.get(), tpm.get().saturating_sub(used), reset)
            }),
        }
    }
}

/// One team's live quota state; kept across reloads while the team stays.
pub struct Quota {
    team: String,
    /// No limit set: the common case skips the lock every request would otherwise share.
    unlimited: AtomicBool,
    state: Mutex<State>,
}

/// What an answer tells the client about its team's windows (OpenAI's `x-ratelimit-*`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RateHeaders {
    requests: Option<(u32, u64, Duration)>,
    tokens: Option<(u64, u64, Duration)>,
}

impl RateHeaders {
    /// Headers from windows counted elsewhere (in Redis, for limits shared by several gateways):
    /// (limit, used, time to reset) of each window the team has.
    pub fn from_counts(
        requests: Option<(u32, u64, Duration)>,
        tokens: Option<(u64, u64, Duration)>,
    ) -> RateHeaders {
        RateHeaders {
            requests: requests
                .map(|(limit, used, reset)| (limit, u64::from(limit).saturating_sub(used), reset)),
            tokens: tokens.map(|(limit, used, reset)| (limit, limit.saturating_sub(used), reset)),
        }
    }

    /// The header pairs to add to a response.
    pub fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::with_capacity(6);
        if let Some((limit, remaining, reset)) = self.requests {
            out.push(("x-ratelimit-limit-requests", limit.to_string()));
            out.push(("x-ratelimit-remaining-requests", remaining.to_string()));
            out.push(("x-ratelimit-reset-requests", reset_text(reset)));
        }
        if let Some((limit, remaining, reset)) = self.tokens {
            out.push(("x-ratelimit-limit-tokens", limit.to_string()));
            out.push(("x-ratelimit-remaining-tokens", remaining.to_string()));
            out.push(("x-ratelimit-reset-tokens", reset_text(reset)));
        }
        out
    }
}

/// OpenAI's reset format: `1s`, `6m0s`, `250ms`.
fn reset_text(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{}s", ms.div_ceil(1000))
    } else {
        let s = ms.div_ceil(1000);
        format!("{}m{}s", s / 60, s % 60)
    }
}

/// A request admitted by its team's quota: holds its parallel slot and settles its tokens when
/// dropped.
pub struct QuotaPermit {
    quota: Arc<Quota>,
    at: Instant,
    charged: u64,
    used: Option<u64>,
    pub headers: RateHeaders,
}

impl QuotaPermit {
    /// The tokens the request really cost (prompt + completion), known when it ends.
    pub fn settle(&mut self, tokens: u64) {
        self.used = Some(tokens);
    }
}

impl Drop for QuotaPermit {
    fn drop(&mut self) {
        let now = Instant::now();
        let mut s = self.quota.lock();
        s.in_flight = s.in_flight.saturating_sub(1);
        // Without usage the reservation stands: never charge less than may have been generated.
        if let Some(used) = self.used
            && used < self.charged
        {
            s.tokens.remove(now, self.at, self.charged - used);
        } else if let Some(used) = self.used
            && used > self.charged
        {
            s.tokens.add(now, used - self.charged);
        }
    }
}

impl Quota {
    pub fn new(team: &str, limits: QuotaLimits) -> Arc<Quota> {
        let now = Instant::now();
        Arc::new(Quota {
            team: team.to_owned(),
            unlimited: AtomicBool::new(limits.is_unlimited()),
            state: Mutex::new(State {
                limits,
                in_flight: 0,
                requests: Minute::new(BUCKET, now),
                tokens: Minute::new(BUCKET, now),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_limits(&self, limits: QuotaLimits) {
        let mut s = self.lock();
        s.limits = limits;
        self.unlimited.store(limits.is_unlimited(), Ordering::Relaxed);
    }

    /// The windows as they stand, for the headers of a refused request.
    pub fn headers(&self) -> Option<RateHeaders> {
        let now = Instant::now();
        let mut s = self.lock();
        if s.limits.rpm.is_none() && s.limits.tpm.is_none() {
            return None;
        }
        Some(s.headers(now))
    }

    /// A request admitted by the quota shared through Redis, counted here too so that the local
    /// share, should Redis fail, starts from what this gateway's team already used.
    pub fn admit_counted(self: &Arc<Self>, tokens: u64, headers: RateHeaders) -> Option<QuotaPermit> {
        if self.unlimited.load(Ordering::Relaxed) {
            return None;
        }
        let now = Instant::now();
        let mut s = self.lock();
        s.in_flight += 1;
        s.requests.add(now, 1);
        s.tokens.add(now, tokens);
        Some(QuotaPermit {
            quota: self.clone(),
            at: now,
            charged: tokens,
            used: None,
            headers,
        })
    }

    /// Admits a request that may cost `tokens`, or says which quota it is over and when to retry.
    pub fn admit(self: &Arc<Self>, tokens: u64) -> Result<Option<QuotaPermit>, QuotaExceeded> {
        if self.unlimited.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let now = Instant::now();
        let mut s = self.lock();
        if s.limits.is_unlimited() {
            return Ok(None);
        }
        let limits = s.limits;
        let over = |kind: QuotaKind, limit: u64, retry_after: Duration| QuotaExceeded {
            team: self.team.clone(),
            kind,
            limit,
            retry_after: retry_after.max(Duration::from_secs(1)),
        };
        if let Some(max) = limits.max_parallel
            && s.in_flight >= max.get()
        {
            return Err(over(
                QuotaKind::Parallel,
                u64::from(max.get()),
                Duration::from_secs(1),
            ));
        }
        if let Some(rpm) = limits.rpm {
            let limit = u64::from(rpm.get());
            if s.requests.sum(now) + 1 > limit {
                let wait = s.requests.time_until_at_most(now, limit - 1);
                return Err(over(QuotaKind::Requests, limit, wait));
            }
        }
        if let Some(tpm) = limits.tpm {
            let limit = tpm.get();
            if tokens > limit {
                return Err(over(QuotaKind::Tokens, limit, Duration::from_secs(60)));
            }
            if s.tokens.sum(now) + tokens > limit {
                let wait = s.tokens.time_until_at_most(now, limit - tokens);
                return Err(over(QuotaKind::Tokens, limit, wait));
            }
        }
        s.in_flight += 1;
        s.requests.add(now, 1);
        s.tokens.add(now, tokens);
        let headers = s.headers(now);
        Ok(Some(QuotaPermit {
            quota: self.clone(),
            at: now,
            charged: tokens,
            used: None,
            headers,
        }))
    }
}

/// A team over one of its quotas, and when a retry could pass.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.message())]
pub struct QuotaExceeded {
    pub team: String,
    pub kind: QuotaKind,
    pub limit: u64,
    pub retry_after: Duration,
}

impl QuotaExceeded {
    fn message(&self) -> String {
        let limit = self.limit;
        let what = match self.kind {
            QuotaKind::Parallel => format!("{limit} requests in flight"),
            QuotaKind::Requests => format!("{limit} requests per minute"),
            QuotaKind::Tokens => format!("{limit} tokens per minute (prompt + max_tokens are reserved)"),
        };
        format!(
            "team '{}' is over its quota of {what} ({}); retry after {}s",
            self.team,
            self.kind.name(),
            self.retry_after.as_secs_f64().ceil().max(1.0)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(limits: QuotaLimits) -> Arc<Quota> {
        Quota::new("t", limits)
    }

    #[tokio::test(start_paused = true)]
    async fn rpm_is_exact_and_says_when_a_request_frees_up() {
        let q = quota(QuotaLimits {
            rpm: NonZeroU32::new(3),
            ..QuotaLimits::default()
        });
        let mut held = Vec::new();
        for remaining in [2, 1, 0] {
            let p = q.admit(0).unwrap().unwrap();
            assert_eq!(p.headers.requests.unwrap().1, remaining);
            held.push(p);
            tokio::time::advance(Duration::from_secs(10)).await;
        }
        match q.admit(0) {
            Err(QuotaExceeded {
                kind: QuotaKind::Requests,
                retry_after,
                ..
            }) => assert_eq!(retry_after, Duration::from_secs(30), "the first leaves at 60 s"),
            other => panic!("{:?}", other.map(|_| ())),
        }
        tokio::time::advance(Duration::from_secs(30)).await;
        assert!(q.admit(0).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn max_parallel_is_exact() {
        let q = quota(QuotaLimits {
            max_parallel: NonZeroU32::new(2),
            ..QuotaLimits::default()
        });
        let a = q.admit(0).unwrap();
        let _b = q.admit(0).unwrap();
        assert!(matches!(
            q.admit(0),
            Err(QuotaExceeded {
                kind: QuotaKind::Parallel,
                ..
            })
        ));
        drop(a);
        assert!(q.admit(0).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn tokens_are_reserved_then_settled_with_real_usage() {
        let q = quota(QuotaLimits {
            tpm: NonZeroU64::new(1000),
            ..QuotaLimits::default()
        });
        let mut a = q.admit(600).unwrap().unwrap();
        assert_eq!(a.headers.tokens.unwrap().1, 400);
        assert!(q.admit(500).is_err(), "600 reserved + 500 > 1000");
        a.settle(100);
        drop(a);
        let b = q.admit(500).unwrap().unwrap();
        assert_eq!(b.headers.tokens.unwrap().1, 400, "100 used + 500 reserved");
        assert!(
            q.admit(2000).is_err(),
            "more than a minute's worth can never pass"
        );
    }

    #[test]
    fn resets_read_like_openai() {
        assert_eq!(reset_text(Duration::from_millis(250)), "250ms");
        assert_eq!(reset_text(Duration::from_millis(1200)), "2s");
        assert_eq!(reset_text(Duration::from_secs(360)), "6m0s");
    }
}
