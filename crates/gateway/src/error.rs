//! Every way a request can fail, where it came from, whether a retry could help, and the one place
//! each maps to a status code and an OpenAI-shaped body.

use admission::{Limits, QuotaExceeded, Rejection};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use protocol::ErrorBody;
use protocol::agents::Dialect;
use protocol::error::ErrorDetail;
use std::time::Duration;

/// The shape of the errors a client of an endpoint understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Shape {
    /// `{"error":{"message","type","param","code"}}`.
    #[default]
    OpenAi,
    /// `{"type":"error","error":{"type","message"}}`, with Anthropic's type names.
    Anthropic,
}

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

/// nginx's 499: the client closed the connection before its answer began. Never sent; logged.
pub const CLIENT_CLOSED_REQUEST: StatusCode = match StatusCode::from_u16(499) {
    Ok(status) => status,
    Err(_) => panic!("499 is a valid status"),
};

/// Why a request that had started (admitted, or already answering) stopped before its end. Its
/// [`Cut::code`] is the one word for it everywhere: the `code` of the error the client gets (an
/// SSE error event mid-stream, or the 504's body before any byte), the access log's `outcome`,
/// and the `reason` of `spillway_cancellations_total` and `spillway_wasted_tokens_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// The client went away (or, on HTTP/2, took nothing for `send_timeout`): nobody to tell.
    Client,
    /// No chunk from the replica for `stream_idle`.
    Idle,
    /// No first token within the `first_token` budget (always before any byte went out).
    FirstToken,
    /// The request's total budget ran out.
    Deadline,
    /// The gateway's drain after SIGTERM ran out while the stream was still going.
    Drain,
    /// The replica's stream failed, ended without `[DONE]`, or sent an event over the bound.
    Upstream,
}

impl Cut {
    /// Every kind of cut, so a metric can declare its label sets up front.
    pub const ALL: [Cut; 6] = [
        Cut::Client,
        Cut::Idle,
        Cut::FirstToken,
        Cut::Deadline,
        Cut::Drain,
        Cut::Upstream,
    ];

    /// The one code of this cut (see the type's docs).
    pub fn code(self) -> &'static str {
        match self {
            Cut::Client => "client_disconnect",
            Cut::Idle => "stream_idle_timeout",
            Cut::FirstToken => "first_token_timeout",
            Cut::Deadline => "deadline_exceeded",
            Cut::Drain => "gateway_shutdown",
            Cut::Upstream => "upstream_stream_error",
        }
    }

    /// The status it would have had as a whole answer: it picks the OpenAI `type` of its event.
    fn status(self) -> StatusCode {
        match self {
            Cut::Client => CLIENT_CLOSED_REQUEST,
            Cut::Idle | Cut::FirstToken | Cut::Deadline => StatusCode::GATEWAY_TIMEOUT,
            Cut::Drain => StatusCode::SERVICE_UNAVAILABLE,
            Cut::Upstream => StatusCode::BAD_GATEWAY,
        }
    }

    fn origin(self) -> Source {
        match self {
            Cut::Client => Source::Client,
            Cut::Idle | Cut::FirstToken | Cut::Deadline | Cut::Drain => Source::Capacity,
            Cut::Upstream => Source::Upstream,
        }
    }
}

/// A request the gateway refuses as malformed (400) before any replica sees it: the field, header
/// or file it names decides the code the client gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invalid {
    /// The body is not the JSON the endpoint takes, or a field's value is out of range.
    Request,
    /// An HTTP/1.1 head without exactly one valid `Host`.
    Host,
    /// The input is over the route's `max_input_tokens`.
    InputTooLong,
    /// `max_tokens` is over the route's cap and `over_cap: reject`.
    MaxTokensOverCap,
    /// `n` (or `best_of`) times the prompts is over the route's `max_n`.
    NOverCap,
    /// The `x-spillway-deadline` header is not a positive duration.
    Deadline,
    /// The `x-spillway-priority` header is not a priority.
    Priority,
    /// An `x-spillway-slo-*-ms` header is not a positive number of milliseconds.
    Slo,
    /// An admin reload found the configuration file wrong (the running one stays).
    Config,
}

impl Invalid {
    /// Every 400 code, so the docs can be checked against them.
    pub const ALL: [Invalid; 9] = [
        Invalid::Request,
        Invalid::Host,
        Invalid::InputTooLong,
        Invalid::MaxTokensOverCap,
        Invalid::NOverCap,
        Invalid::Deadline,
        Invalid::Priority,
        Invalid::Slo,
        Invalid::Config,
    ];

    /// The client's `code` (and the metric's `reason`, the log's `outcome`).
    pub fn code(self) -> &'static str {
        match self {
            Invalid::Request => "invalid_request",
            Invalid::Host => "invalid_host",
            Invalid::InputTooLong => "input_too_long",
            Invalid::MaxTokensOverCap => "max_tokens_over_cap",
            Invalid::NOverCap => "n_over_cap",
            Invalid::Deadline => "invalid_deadline",
            Invalid::Slo => "invalid_slo",
            Invalid::Priority => "invalid_priority",
            Invalid::Config => "invalid_config",
        }
    }
}

/// What an admin request names that the gateway cannot act on: each its own status and code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminRefusal {
    /// No route serves that model.
    RouteNotFound,
    /// The route has no replica with that URL.
    ReplicaNotFound,
    /// A reload asked of a gateway not started from a file.
    NoConfigFile,
}

impl AdminRefusal {
    /// Every admin refusal, so the docs can be checked against them.
    pub const ALL: [AdminRefusal; 3] = [
        AdminRefusal::RouteNotFound,
        AdminRefusal::ReplicaNotFound,
        AdminRefusal::NoConfigFile,
    ];

    pub fn code(self) -> &'static str {
        match self {
            AdminRefusal::RouteNotFound => "route_not_found",
            AdminRefusal::ReplicaNotFound => "replica_not_found",
            AdminRefusal::NoConfigFile => "no_config_file",
        }
    }

    fn status(self) -> StatusCode {
        match self {
            AdminRefusal::RouteNotFound | AdminRefusal::ReplicaNotFound => StatusCode::NOT_FOUND,
            AdminRefusal::NoConfigFile => StatusCode::CONFLICT,
        }
    }
}

/// A request that ends without a stream (or a stream that ends early): each variant decides its
/// status, OpenAI `type` and `code`, `param`, `Retry-After` and whether another replica may be tried.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GatewayError {
    /// A 400 that names the field or the limit.
    #[error("{message}")]
    BadRequest {
        code: Invalid,
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
    /// A stored response the gateway does not know (vLLM's words for an id it does not hold).
    #[error("Response with id '{0}' not found.")]
    ResponseNotFound(String),
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
    Admin { refusal: AdminRefusal, message: String },
    #[error("team '{team}' may not use model '{model}'")]
    ModelNotAllowed { team: String, model: String },
    #[error("the gateway is shutting down; retry on another instance")]
    Draining,
    #[error("the gateway holds its maximum of {0} client connections; retry shortly")]
    TooManyConnections(usize),
    /// Admission refused the request (queue full, wait too long, sheddable).
    #[error("{}", overloaded_message(route, class, limits, rejection))]
    Overloaded {
        status: StatusCode,
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
        status: StatusCode,
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
    Upstream { message: String },
    #[error("the replica's answer is over {limit} bytes (server.max_response_bytes)")]
    UpstreamTooLarge { limit: usize },
    /// A stream cut after its head went out: the client gets it as one SSE error event.
    #[error("{message}")]
    MidStream { cut: Cut, message: String },
}

fn overloaded_message(route: &str, class: &str, limits: &Limits, rejection: &Rejection) -> String {
    if let Rejection::SloUnattainable { .. } = rejection {
        return format!(
            "model '{route}' class '{class}' cannot meet this request's objectives: {rejection}; retry after {}s",
            retry_after_secs(rejection.retry_after())
        );
    }
    let what = match rejection {
        Rejection::QueueFull { .. } => format!("{rejection} ({} waiting)", limits.queue),
        Rejection::QueueTimeout { .. } => format!("{rejection} (queue_wait {:?})", limits.queue_wait),
        Rejection::PredictedWait { .. } | Rejection::Shed { .. } | Rejection::SloUnattainable { .. } => {
            rejection.to_string()
        }
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
    pub fn bad_request(code: Invalid, message: impl Into<String>, param: Option<&'static str>) -> Self {
        GatewayError::BadRequest {
            code,
            message: message.into(),
            param,
        }
    }

    pub(crate) fn upstream(message: impl Into<String>) -> Self {
        GatewayError::Upstream {
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
            | ResponseNotFound(_)
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
            UpstreamConnect { .. } | Upstream { .. } | UpstreamTooLarge { .. } => Source::Upstream,
            MidStream { cut, .. } => cut.origin(),
        }
    }

    /// The status of the answer; for a stream already answering, the one its cut would have had.
    pub fn status(&self) -> StatusCode {
        use GatewayError::*;
        match self {
            BadRequest { .. } => StatusCode::BAD_REQUEST,
            Admin { refusal, .. } => refusal.status(),
            Overloaded { status, .. } => *status,
            MissingKey | InvalidKey | AdminToken => StatusCode::UNAUTHORIZED,
            ModelNotAllowed { .. } => StatusCode::FORBIDDEN,
            ModelNotFound(_) | NotFound(_) | ResponseNotFound(_) => StatusCode::NOT_FOUND,
            MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            HeadersTooLarge { .. } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            QuotaExceeded(_) => StatusCode::TOO_MANY_REQUESTS,
            Draining | TooManyConnections(_) | NoHealthyReplica(_) | UpstreamBusy { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            FirstTokenTimeout(_) | DeadlineExceeded(_) => StatusCode::GATEWAY_TIMEOUT,
            UpstreamConnect { .. } | Upstream { .. } | UpstreamTooLarge { .. } => StatusCode::BAD_GATEWAY,
            MidStream { cut, .. } => cut.status(),
        }
    }

    /// The cut this error is, for a request that had started: the deadlines, and a stream's end.
    pub(crate) fn cut(&self) -> Option<Cut> {
        match self {
            GatewayError::FirstTokenTimeout(_) => Some(Cut::FirstToken),
            GatewayError::DeadlineExceeded(_) => Some(Cut::Deadline),
            GatewayError::MidStream { cut, .. } => Some(*cut),
            _ => None,
        }
    }

    /// A stable machine-readable code: the body's `code`, the metric `reason`, the log's `outcome`.
    pub fn code(&self) -> &'static str {
        use GatewayError::*;
        match self {
            BadRequest { code, .. } => code.code(),
            Admin { refusal, .. } => refusal.code(),
            Upstream { .. } => "upstream_error",
            UpstreamTooLarge { .. } => "upstream_response_too_large",
            BodyTooLarge { .. } => "body_too_large",
            BodyTimeout(_) => "body_timeout",
            HeadersTooLarge { .. } => "headers_too_large",
            ModelNotFound(_) => "model_not_found",
            NotFound(_) => "not_found",
            ResponseNotFound(_) => "response_not_found",
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
            FirstTokenTimeout(_) => Cut::FirstToken.code(),
            DeadlineExceeded(_) => Cut::Deadline.code(),
            MidStream { cut, .. } => cut.code(),
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
            (_, StatusCode::UNAUTHORIZED) => "authentication_error",
            (_, StatusCode::FORBIDDEN) => "permission_error",
            (_, StatusCode::NOT_FOUND) => "not_found_error",
            (_, StatusCode::PAYLOAD_TOO_LARGE) => "request_too_large",
            (Source::Client, _) => "invalid_request_error",
            (_, StatusCode::TOO_MANY_REQUESTS) => "rate_limit_error",
            (_, StatusCode::GATEWAY_TIMEOUT) => "timeout_error",
            (Source::Capacity, _) => "service_unavailable_error",
            (Source::Upstream, _) => "upstream_error",
        }
    }

    fn param(&self) -> Option<&'static str> {
        match self {
            GatewayError::BadRequest { param, .. } => *param,
            GatewayError::ModelNotFound(_) | GatewayError::ModelNotAllowed { .. } => Some("model"),
            GatewayError::ResponseNotFound(_) => Some("response_id"),
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

    /// A stream cut after its head went out, as the one SSE error event the client gets, in
    /// its API's own form (`dialect`; OpenAI's completions' without one).
    pub(crate) fn stream_cut(cut: Cut, message: impl Into<String>, dialect: Option<Dialect>) -> bytes::Bytes {
        let e = GatewayError::MidStream {
            cut,
            message: message.into(),
        };
        let data = match dialect {
            None => return protocol::sse::event(&e.body()),
            Some(Dialect::Messages) => e.anthropic_body(),
            // Responses' `error` event: its code, message and param at the top.
            Some(Dialect::Responses) => serde_json::json!({
                "type": "error",
                "code": e.code(),
                "message": e.to_string(),
                "param": null,
            }),
        };
        let mut out = b"event: error\ndata: ".to_vec();
        out.extend_from_slice(&serde_json::to_vec(&data).unwrap_or_default());
        out.extend_from_slice(b"\n\n");
        out.into()
    }

    /// The body in Anthropic's shape, for a client of the Messages API: its SDK reads the type
    /// (and retries `rate_limit_error` and `overloaded_error` after `retry-after`).
    fn anthropic_body(&self) -> serde_json::Value {
        let kind = match self.status().as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 => "overloaded_error",
            s if s >= 500 => "api_error",
            _ if self.cut().is_some() => "api_error",
            _ => "invalid_request_error",
        };
        serde_json::json!({
            "type": "error",
            "error": {"type": kind, "message": self.to_string()},
        })
    }
}

impl GatewayError {
    /// The answer's status, headers (its type, `Retry-After`) and OpenAI-shaped body, for the
    /// proxy's response and the endpoint picker's immediate answer alike.
    /// (The body in `shape`, the form its client reads.)
    pub(crate) fn render_as(&self, shape: Shape) -> (StatusCode, axum::http::HeaderMap, Vec<u8>) {
        let mut headers = axum::http::HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(after) = self.retry_after() {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs(after)));
        }
        let body = match shape {
            Shape::OpenAi => serde_json::to_vec(&self.body()),
            Shape::Anthropic => serde_json::to_vec(&self.anthropic_body()),
        };
        (self.status(), headers, body.unwrap_or_default())
    }

    /// The response, in `shape`.
    pub(crate) fn into_response_as(self, shape: Shape) -> Response {
        let (status, headers, body) = self.render_as(shape);
        (status, headers, body).into_response()
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        self.into_response_as(Shape::OpenAi)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn renders_openai_shape_and_retry_after() {
        let e = GatewayError::Overloaded {
            status: StatusCode::SERVICE_UNAVAILABLE,
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
            status: StatusCode::SERVICE_UNAVAILABLE,
            retry_after: Duration::from_secs(1),
        };
        assert!(connect.retryable() && busy.retryable());
        assert_eq!(
            (connect.status(), busy.status()),
            (StatusCode::BAD_GATEWAY, StatusCode::SERVICE_UNAVAILABLE)
        );
        for e in [
            GatewayError::upstream("lost"),
            GatewayError::FirstTokenTimeout(Duration::from_secs(1)),
            GatewayError::bad_request(Invalid::Request, "x", None),
        ] {
            assert!(!e.retryable(), "{e:?}");
        }
    }

    /// Each cut has one code, the same in the client's event, the log and the metrics; its
    /// OpenAI `type` says what kind of failure it was, not that every cut is the upstream's.
    #[test]
    fn a_cut_is_rendered_with_its_own_code_and_type() {
        let rendered = |cut: Cut| {
            let event = GatewayError::stream_cut(cut, "m", None);
            let json = std::str::from_utf8(&event)
                .unwrap()
                .trim()
                .strip_prefix("data: ")
                .unwrap();
            let v: serde_json::Value = serde_json::from_str(json).unwrap();
            (
                v["error"]["code"].as_str().unwrap().to_owned(),
                v["error"]["type"].as_str().unwrap().to_owned(),
            )
        };
        let expected = [
            (Cut::Idle, "stream_idle_timeout", "timeout_error"),
            (Cut::FirstToken, "first_token_timeout", "timeout_error"),
            (Cut::Deadline, "deadline_exceeded", "timeout_error"),
            (Cut::Drain, "gateway_shutdown", "service_unavailable_error"),
            (Cut::Upstream, "upstream_stream_error", "upstream_error"),
        ];
        for (cut, code, kind) in expected {
            assert_eq!(cut.code(), code);
            assert_eq!(rendered(cut), (code.to_owned(), kind.to_owned()), "{cut:?}");
        }
        assert_eq!(Cut::Client.code(), "client_disconnect");
        // The deadlines before the first byte are the same cuts, with the same codes.
        let first = GatewayError::FirstTokenTimeout(Duration::from_secs(1));
        let total = GatewayError::DeadlineExceeded(Duration::from_secs(1));
        assert_eq!(
            (first.cut(), first.code()),
            (Some(Cut::FirstToken), "first_token_timeout")
        );
        assert_eq!(
            (total.cut(), total.code()),
            (Some(Cut::Deadline), "deadline_exceeded")
        );
    }

    /// One of each kind of error, with every code each can carry: the match below has no
    /// wildcard, so a new variant does not compile until it is listed here (and so in the docs).
    fn every_code() -> Vec<&'static str> {
        let d = Duration::from_secs(1);
        let mut errors = vec![
            GatewayError::BodyTooLarge { limit: 1 },
            GatewayError::BodyTimeout(d),
            GatewayError::HeadersTooLarge { limit: 1 },
            GatewayError::ModelNotFound("m".into()),
            GatewayError::NotFound("x".into()),
            GatewayError::ResponseNotFound("resp_1".into()),
            GatewayError::MethodNotAllowed("x"),
            GatewayError::MissingKey,
            GatewayError::InvalidKey,
            GatewayError::AdminToken,
            GatewayError::ModelNotAllowed {
                team: "t".into(),
                model: "m".into(),
            },
            GatewayError::Draining,
            GatewayError::TooManyConnections(1),
            GatewayError::NoHealthyReplica("m".into()),
            GatewayError::UpstreamBusy {
                route: "m".into(),
                replica: 0,
                status: StatusCode::SERVICE_UNAVAILABLE,
                retry_after: d,
            },
            GatewayError::FirstTokenTimeout(d),
            GatewayError::DeadlineExceeded(d),
            GatewayError::UpstreamConnect {
                route: "m".into(),
                replica: 0,
            },
            GatewayError::upstream("x"),
            GatewayError::UpstreamTooLarge { limit: 1 },
            GatewayError::QuotaExceeded(QuotaExceeded {
                team: "t".into(),
                kind: admission::QuotaKind::Requests,
                limit: 1,
                retry_after: d,
            }),
        ];
        errors.extend(Invalid::ALL.map(|i| GatewayError::bad_request(i, "x", None)));
        errors.extend(AdminRefusal::ALL.map(|refusal| GatewayError::Admin {
            refusal,
            message: "x".into(),
        }));
        errors.extend(Cut::ALL.map(|cut| GatewayError::MidStream {
            cut,
            message: "x".into(),
        }));
        let mut codes: Vec<&'static str> = errors.iter().map(GatewayError::code).collect();
        // Admission's refusals carry the reason of the rejection they wrap.
        codes.extend(Rejection::REASONS);
        for e in &errors {
            match e {
                GatewayError::BadRequest { .. }
                | GatewayError::BodyTooLarge { .. }
                | GatewayError::BodyTimeout(_)
                | GatewayError::HeadersTooLarge { .. }
                | GatewayError::ModelNotFound(_)
                | GatewayError::NotFound(_)
                | GatewayError::ResponseNotFound(_)
                | GatewayError::MethodNotAllowed(_)
                | GatewayError::MissingKey
                | GatewayError::InvalidKey
                | GatewayError::AdminToken
                | GatewayError::Admin { .. }
                | GatewayError::ModelNotAllowed { .. }
                | GatewayError::Draining
                | GatewayError::TooManyConnections(_)
                | GatewayError::Overloaded { .. }
                | GatewayError::QuotaExceeded(_)
                | GatewayError::NoHealthyReplica(_)
                | GatewayError::UpstreamBusy { .. }
                | GatewayError::FirstTokenTimeout(_)
                | GatewayError::DeadlineExceeded(_)
                | GatewayError::UpstreamConnect { .. }
                | GatewayError::Upstream { .. }
                | GatewayError::UpstreamTooLarge { .. }
                | GatewayError::MidStream { .. } => {}
            }
        }
        codes
    }

    /// A client's author looks codes up in docs/errors.md: every code the gateway can send is
    /// there, written as code (in backquotes).
    #[test]
    fn every_code_a_client_can_see_is_in_the_docs() {
        let docs = include_str!("../../../docs/errors.md");
        let missing: Vec<_> = every_code()
            .into_iter()
            .filter(|code| !docs.contains(&format!("`{code}`")))
            .collect();
        assert!(missing.is_empty(), "not in docs/errors.md: {missing:?}");
    }

    #[test]
    fn codes_are_distinct_words() {
        let codes = every_code();
        let mut seen = std::collections::HashSet::new();
        for code in &codes {
            assert!(
                code.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{code}"
            );
            // The two deadlines are the same cut before and after the first byte: one word.
            assert!(
                seen.insert(*code) || ["first_token_timeout", "deadline_exceeded"].contains(code),
                "{code} twice"
            );
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
        assert_eq!(kind(GatewayError::upstream("x")), "upstream_error");
    }
}
