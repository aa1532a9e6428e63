//! What a replica's error answer says, judged once for both front doors: a status (the answer's,
//! or the one an error event names in place of a stream's first token) is the replica's
//! backpressure, the client's own mistake, or the replica's failure.

use crate::error::GatewayError;
use crate::route::{Observation, busy_retry_after};
use axum::http::StatusCode;
use std::time::Duration;

/// The judgement of an answer that is not a success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// 429 or 503: the replica's backpressure, never a failure; its advice as the gateway passes
    /// it on ([`busy_retry_after`]).
    Busy {
        status: StatusCode,
        retry_after: Duration,
    },
    /// Another 4xx: the client's own mistake, relayed as it was.
    Rejected(StatusCode),
    /// Anything else (a 5xx, a 3xx, or an error event naming no status): the replica failed.
    Failed(Option<StatusCode>),
}

/// Judges `status` (`None`: an error that names none), with the replica's `Retry-After` in whole
/// seconds if it sent one.
pub(crate) fn judge(status: Option<StatusCode>, retry_after: Option<u64>) -> Verdict {
    match status {
        Some(status @ (StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE)) => Verdict::Busy {
            status,
            retry_after: busy_retry_after(retry_after),
        },
        Some(status) if status.is_client_error() => Verdict::Rejected(status),
        status => Verdict::Failed(status),
    }
}

impl Verdict {
    /// What the replica's health learns from it.
    pub(crate) fn observation(self) -> Observation {
        match self {
            Verdict::Busy { retry_after, .. } => Observation::Busy { retry_after },
            Verdict::Rejected(_) => Observation::ClientError,
            Verdict::Failed(_) => Observation::Failed,
        }
    }

    /// The status to relay (a rejection is the client's own), or the gateway's error: replica
    /// `index` of route `model` answered so, `how` (" in its stream before the first token", or
    /// nothing).
    pub(crate) fn into_result(
        self,
        model: &str,
        index: usize,
        how: &str,
    ) -> Result<StatusCode, GatewayError> {
        match self {
            Verdict::Busy { status, retry_after } => Err(GatewayError::UpstreamBusy {
                route: model.to_owned(),
                replica: index,
                status,
                retry_after,
            }),
            Verdict::Rejected(status) => Ok(status),
            Verdict::Failed(status) => {
                let named = status.map_or_else(|| "an error".to_owned(), |s| s.to_string());
                Err(GatewayError::upstream(format!(
                    "route '{model}' replica {index} answered {named}{how}"
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_rejected_and_failed_are_told_apart_by_the_status() {
        let busy = |s: u16, r| judge(StatusCode::from_u16(s).ok(), r);
        for s in [429, 503] {
            let v = busy(s, Some(7));
            assert_eq!(
                v.observation(),
                Observation::Busy {
                    retry_after: Duration::from_secs(7)
                }
            );
            assert_eq!(v.into_result("m", 0, "").unwrap_err().code(), "upstream_busy");
        }
        // The one Retry-After policy: one second without advice, at most a minute with it.
        assert_eq!(
            busy(503, None),
            Verdict::Busy {
                status: StatusCode::SERVICE_UNAVAILABLE,
                retry_after: Duration::from_secs(1)
            }
        );
        assert_eq!(
            busy(429, Some(100_000)),
            Verdict::Busy {
                status: StatusCode::TOO_MANY_REQUESTS,
                retry_after: Duration::from_secs(60)
            }
        );
        for s in [400, 404, 413, 422] {
            assert_eq!(busy(s, None).observation(), Observation::ClientError, "{s}");
            assert_eq!(
                busy(s, None).into_result("m", 0, "").ok().map(|s| s.as_u16()),
                Some(s)
            );
        }
        for s in [Some(500), Some(502), Some(504), Some(302), None] {
            let v = judge(s.and_then(|s| StatusCode::from_u16(s).ok()), None);
            assert_eq!(v.observation(), Observation::Failed, "{s:?}");
            assert_eq!(
                v.into_result("m", 2, "").unwrap_err().code(),
                "upstream_error",
                "{s:?}"
            );
        }
        let named = judge(None, None).into_result("m", 1, " in its stream before the first token");
        assert_eq!(
            named.unwrap_err().to_string(),
            "route 'm' replica 1 answered an error in its stream before the first token"
        );
    }
}
