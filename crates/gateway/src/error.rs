//! Every way a request can fail, where it came from, whether a retry could help, and the one place
//! each maps to a status code and an OpenAI-shaped body.

use admission::{Limits, QuotaExceeded, Rejection};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use protocol::ErrorBody;
use protocol::error::ErrorDetail;
use std::time::Duration;

/// Who caused a failure: it decides the status family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// The request itself (4xx): retrying it unchanged cannot succeed.
    Client,
    /// The service's own capacity or budgets (429/503/504).
    Capacity,
    /// A replica failed or misbehaved (502).
    Upstream,
}

/// A request that ends without a stream (or a stream that ends early): each variant decides its
/// status, OpenAI `type` and `code`, `param`, `Retry-After` and whether another replica may be tried.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GatewayError {
    /// A 400 that names the field or the limit.
    #[error("{message}")]
    BadRequest {
        code: &'static str,
        message: String,
        param: Option<&'static str>,
    },
    #[error("the request body exceeds this gateway's limit of {limit} bytes (server.max_body_bytes)")]
    BodyTooLarge { limit: usize },
    #[error("the request body did not arrive within {0:?} (server.body_timeout)")]
    BodyTimeout(Duration),
    #[error("the request headers exceed this gateway's limit of {limit} bytes (server.max_header_bytes)")]
    HeadersTooLarge { limit: usize },
    #[error("The model `{0}` does not exist.")]
    ModelNotFound(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    MethodNotAllowed(&'static str),
    #[error("missing API key: send 'Authorization: Bearer <key>'")]
    MissingKey,
    #[error("invalid API key")]
    InvalidKey,
    #[error("missing or wrong admin token")]
    AdminToken,
    /// An admin request that cannot be carried out (unknown route or replica, no file to reload).
    #[error("{message}")]
    Admin {
        status: u16,
        code: &'static str,
        message: String,
    },
    #[error("team '{team}' may not use model '{model}'")]
    ModelNotAllowed { team: String, model: String },
    #[error("the gateway is shutting down; retry on another instance")]
    Draining,
    #[error("the gateway holds its maximum of {0} client connections; retry shortly")]
    TooManyConnections(usize),
    /// Admission refused the request (queue full, wait too long, sheddable).
    #[error("{}", overloaded_message(route, class, limits, rejection))]
    Overloaded {
        status: u16,
        route: String,
        class: String,
        limits: Limits,
        rejection: Rejection,
    },
    /// A team over one of its quotas.
    #[error(transparent)]
    QuotaExceeded(#[from] QuotaExceeded),
    #[error("model '{0}' has no healthy replica to try")]
    NoHealthyReplica(String),
    /// Every replica tried answered 429/503: backpressure, retryable elsewhere.
    #[error("route '{route}' replica {replica} is busy (it answered {status})")]
    UpstreamBusy {
        route: String,
        replica: usize,
        status: u16,
        retry_after: Duration,
    },
    #[error("no first token within the first_token budget ({0:?})")]
    FirstTokenTimeout(Duration),
    #[error("no complete answer within the total budget ({0:?})")]
    DeadlineExceeded(Duration),
    /// The connection to a replica could not be opened: nothing was sent, so another may be tried.
    #[error("cannot connect to route '{route}' replica {replica}")]
    UpstreamConnect { route: String, replica: usize },
    /// A replica failed after the request reached it; the details are logged, not sent.
    #[error("{message}")]
    Upstream { code: &'static str, message: String },
}

fn overloaded_message(route: &str, class: &str, limits: &Limits, rejection: &Rejection) -> String {
    let what = match rejection {
        Rejection::QueueFull { .. } => format!("{rejection} ({} waiting)", limits.queue),
        Rejection::QueueTimeout { .. } => format!("{rejection} (queue_wait {:?})", limits.queue_wait),
        Rejection::PredictedWait { .. } | Rejection::Shed { .. } => rejection.to_string(),
    };
    format!(
        "model '{route}' class '{class}' is at capacity ({} in flight): {what}; retry after {}s",
        limits.concurrency,
        retry_after_secs(rejection.retry_after())
    )
}

fn retry_after_secs(d: Duration) -> u64 {
    d.as_secs_f64().ceil().max(1.0) as u64
}

impl GatewayError {
    /// A 400 naming what is wrong.
    pub fn bad_request(code: &'static str, message: impl Into<String>, param: Option<&'static str>) -> Self {
        GatewayError::BadRequest {
            code,
            message: message.into(),
            param,
        }
    }

    pub(crate) fn upstream(code: &'static str, message: impl Into<String>) -> Self {
        GatewayError::Upstream {
            code,
            message: message.into(),
        }
    }

    pub(crate) fn origin(&self) -> Source {
        use GatewayError::*;
        match self {
            BadRequest { .. }
            | BodyTooLarge { .. }
            | BodyTimeout(_)
            | HeadersTooLarge { .. }
            | ModelNotFound(_)
            | NotFound(_)
            | MethodNotAllowed(_)
            | MissingKey
            | InvalidKey
            | AdminToken
            | Admin { .. }
            | ModelNotAllowed { .. } => Source::Client,
            Draining
            | TooManyConnections(_)
            | Overloaded { .. }
            | QuotaExceeded(_)
            | NoHealthyReplica(_)
            | UpstreamBusy { .. }
            | FirstTokenTimeout(_)
            | DeadlineExceeded(_) => Source::Capacity,
            UpstreamConnect { .. } | Upstream { .. } => Source::Upstream,
        }
    }

    pub fn status(&self) -> u16 {
        use GatewayError::*;
        match self {
            BadRequest { .. } => 400,
            Admin { status, .. } => *status,
            MissingKey | InvalidKey | AdminToken => 401,
            ModelNotAllowed { .. } => 403,
            ModelNotFound(_) | NotFound(_) => 404,
            MethodNotAllowed(_) => 405,
            BodyTimeout(_) => 408,
            BodyTooLarge { .. } => 413,
            HeadersTooLarge { .. } => 431,
            Overloaded { status, .. } => *status,
            QuotaExceeded(_) => 429,
            Draining | TooManyConnections(_) | NoHealthyReplica(_) | UpstreamBusy { .. } => 503,
            FirstTokenTimeout(_) | DeadlineExceeded(_) => 504,
            UpstreamConnect { .. } | Upstream { .. } => 502,
        }
    }

    /// A stable machine-readable code: the body's `code`, the metric `reason`, the log's `outcome`.
    pub fn code(&self) -> &'static str {
        use GatewayError::*;
        match self {
            BadRequest { code, .. } | Upstream { code, .. } | Admin { code, .. } => code,
            BodyTooLarge { .. } => "body_too_large",
            BodyTimeout(_) => "body_timeout",
            HeadersTooLarge { .. } => "headers_too_large",
            ModelNotFound(_) => "model_not_found",
            NotFound(_) => "not_found",
            MethodNotAllowed(_) => "method_not_allowed",
            MissingKey => "missing_api_key",
            InvalidKey => "invalid_api_key",
            AdminToken => "invalid_admin_token",
            ModelNotAllowed { .. } => "model_not_allowed",
            Draining => "draining",
            TooManyConnections(_) => "too_many_connections",
            Overloaded { rejection, .. } => rejection.reason(),
            QuotaExceeded(_) => "rate_limit_exceeded",
            NoHealthyReplica(_) => "no_healthy_replica",
            UpstreamBusy { .. } => "upstream_busy",
            FirstTokenTimeout(_) => "first_token_timeout",
            DeadlineExceeded(_) => "deadline_exceeded",
            UpstreamConnect { .. } => "upstream_connect",
        }
    }

    /// The metric's `reason` (and the log's `outcome`): the code, or for a quota which one.
    pub fn reason(&self) -> &'static str {
        match self {
            GatewayError::QuotaExceeded(q) => q.kind.reason(),
            _ => self.code(),
        }
    }

    /// OpenAI's error `type`.
    fn kind(&self) -> &'static str {
        match (self.origin(), self.status()) {
            (_, 401) => "authentication_error",
            (_, 403) => "permission_error",
            (_, 404) => "not_found_error",
            (_, 413) => "request_too_large",
            (Source::Client, _) => "invalid_request_error",
            (_, 429) => "rate_limit_error",
            (_, 504) => "timeout_error",
            (Source::Capacity, _) => "service_unavailable_error",
            (Source::Upstream, _) => "upstream_error",
        }
    }

    fn param(&self) -> Option<&'static str> {
        match self {
            GatewayError::BadRequest { param, .. } => *param,
            GatewayError::ModelNotFound(_) | GatewayError::ModelNotAllowed { .. } => Some("model"),
            _ => None,
        }
    }

    pub fn retry_after(&self) -> Option<Duration> {
        use GatewayError::*;
        match self {
            Overloaded { rejection, .. } => Some(rejection.retry_after()),
            UpstreamBusy { retry_after, .. } => Some(*retry_after),
            QuotaExceeded(q) => Some(q.retry_after),
            Draining | TooManyConnections(_) | NoHealthyReplica(_) => Some(Duration::from_secs(1)),
            _ => None,
        }
    }

    /// Whether another replica may be tried: only when nothing reached a replica (a refused
    /// connection) or the replica said it was busy. Timeouts and failures after the request was
    /// sent are never retried: the replica may still be working on it.
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            GatewayError::UpstreamConnect { .. } | GatewayError::UpstreamBusy { .. }
        )
    }

    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                message: self.to_string(),
                kind: self.kind().to_owned(),
                param: self.param().map(str::to_owned),
                code: self.code().into(),
            },
        }
    }

    /// The same error as one SSE event, for a stream that already started.
    pub(crate) fn sse_event(&self) -> bytes::Bytes {
        protocol::sse::event(&self.body())
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&self.body()).unwrap_or_default();
        let mut response = (
            status,
            [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
            body,
        )
            .into_response();
        if let Some(after) = self.retry_after() {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs(after)));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn renders_openai_shape_and_retry_after() {
        let e = GatewayError::Overloaded {
            status: 503,
            route: "m".into(),
            class: "c".into(),
            limits: Limits {
                concurrency: 4,
                queue: 2,
                queue_wait: Duration::from_secs(1),
            },
            rejection: Rejection::QueueFull {
                retry_after: Duration::from_millis(1500),
            },
        };
        assert!(!e.retryable());
        let r = e.into_response();
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()["retry-after"], "2");
        let body = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["code"], "queue_full");
        assert_eq!(v["error"]["type"], "service_unavailable_error");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("the queue is full (2 waiting)")
        );
        assert!(v["error"]["param"].is_null());
    }

    #[test]
    fn only_connection_failures_and_busy_replicas_are_retryable() {
        let connect = GatewayError::UpstreamConnect {
            route: "m".into(),
            replica: 0,
        };
        let busy = GatewayError::UpstreamBusy {
            route: "m".into(),
            replica: 1,
            status: 503,
            retry_after: Duration::from_secs(1),
        };
        assert!(connect.retryable() && busy.retryable());
        assert_eq!((connect.status(), busy.status()), (502, 503));
        for e in [
            GatewayError::upstream("upstream_error", "lost"),
            GatewayError::FirstTokenTimeout(Duration::from_secs(1)),
            GatewayError::bad_request("invalid_request", "x", None),
        ] {
            assert!(!e.retryable(), "{e:?}");
        }
    }

    #[test]
    fn types_follow_openai() {
        let kind = |e: GatewayError| e.body().error.kind;
        assert_eq!(kind(GatewayError::MissingKey), "authentication_error");
        assert_eq!(
            kind(GatewayError::ModelNotAllowed {
                team: "t".into(),
                model: "m".into()
            }),
            "permission_error"
        );
        assert_eq!(kind(GatewayError::ModelNotFound("x".into())), "not_found_error");
        assert_eq!(kind(GatewayError::BodyTooLarge { limit: 1 }), "request_too_large");
        assert_eq!(
            kind(GatewayError::FirstTokenTimeout(Duration::from_secs(1))),
            "timeout_error"
        );
        assert_eq!(
            kind(GatewayError::upstream("upstream_error", "x")),
            "upstream_error"
        );
    }
}
