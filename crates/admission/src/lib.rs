//! Admission policy: who may go now, who waits, and who is refused with an honest `Retry-After`.
//! Pure logic on `tokio::time` (so every rule is tested on a paused clock); no I/O, no HTTP. The
//! gateway owns the requests and maps each refusal here to its status code and body.
//!
//! # Layout
//! - [`gate`]: one route and class's gate — at most C in flight, at most Q waiting, nobody longer
//!   than Wq or past their own deadline, priority order, an adaptive C; its [`Permit`] is the slot;
//!   a refusal is a [`Rejection`].
//! - [`fair`]: fair share between the teams waiting in a contended class: least attained service
//!   in weighted tokens, with decay.
//! - [`quota`]: a team's `max_parallel`, `rpm` and `tpm`; a refusal is a [`QuotaExceeded`].
//! - [`retry`]: the retry budget of a route and the jittered backoff between attempts.
//! - [`window`]: the sliding-window counter the quotas and the retry budget count with.
//! - [`Priority`]: the queue lanes, here because the gate orders by them.

pub mod fair;
pub mod gate;
pub mod quota;
pub mod retry;
pub mod window;

pub use fair::{Claim, Fairness, Share};
pub use gate::{AdaptiveLimits, Admission, Limits, Objective, Permit, Rejection, SharedWaiter};
pub use quota::{Quota, QuotaExceeded, QuotaKind, QuotaLimits, QuotaPermit, RateHeaders};
pub use retry::{RetryBudget, backoff};
pub use window::SlidingWindow;

/// Queue priority: `critical` before `standard`; `sheddable` never waits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    Critical,
    #[default]
    Standard,
    Sheddable,
}

impl Priority {
    pub const ALL: [Priority; 3] = [Priority::Critical, Priority::Standard, Priority::Sheddable];

    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Critical => "critical",
            Priority::Standard => "standard",
            Priority::Sheddable => "sheddable",
        }
    }

    pub fn parse(s: &str) -> Option<Priority> {
        Priority::ALL.into_iter().find(|p| p.as_str() == s)
    }
}
