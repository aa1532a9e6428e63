//! Every way a request can fail, where it came from, and the one place each maps to a status code
//! and an OpenAI-shaped body.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use protocol::ErrorBody;
use protocol::error::ErrorDetail;
use std::time::Duration;

/// Who caused a failure: it decides the status family and whether a retry could help.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The request itself (4xx): retrying it unchanged cannot succeed.
    Client,
    /// The service's own capacity or budgets (429/503/504).
    Capacity,
    /// A replica failed or misbehaved (502).
    Upstream,
}

/// A request that ends without a stream: its status, OpenAI body and `Retry-After`.
#[derive(Debug, Clone, PartialEq)]
pub struct GatewayError {
    pub status: u16,
    pub source: Source,
    /// OpenAI's `type`.
    pub kind: &'static str,
    /// A stable machine-readable code, also the metric `reason`.
    pub code: &'static str,
    pub message: String,
    pub param: Option<&'static str>,
    pub retry_after: Option<Duration>,
}

impl GatewayError {
    pub fn client(
        status: u16,
        code: &'static str,
        message: impl Into<String>,
        param: Option<&'static str>,
    ) -> Self {
        let kind = match status {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            _ => "invalid_request_error",
        };
        Self {
            status,
            source: Source::Client,
            kind,
            code,
            message: message.into(),
            param,
            retry_after: None,
        }
    }

    pub fn capacity(
        status: u16,
        code: &'static str,
        message: impl Into<String>,
        retry_after: Option<Duration>,
    ) -> Self {
        let kind = match status {
            429 => "rate_limit_error",
            504 => "timeout_error",
            _ => "service_unavailable_error",
        };
        Self {
            status,
            source: Source::Capacity,
            kind,
            code,
            message: message.into(),
            param: None,
            retry_after,
        }
    }

    pub fn upstream(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status: 502,
            source: Source::Upstream,
            kind: "upstream_error",
            code,
            message: message.into(),
            param: None,
            retry_after: None,
        }
    }

    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                message: self.message.clone(),
                kind: self.kind.to_owned(),
                param: self.param.map(str::to_owned),
                code: self.code.into(),
            },
        }
    }

    /// The same error as one SSE event, for a stream that already started.
    pub fn sse_event(&self) -> bytes::Bytes {
        protocol::sse::event(&self.body())
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&self.body()).unwrap_or_default();
        let mut response = (
            status,
            [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
            body,
        )
            .into_response();
        if let Some(after) = self.retry_after {
            let secs = after.as_secs_f64().ceil().max(1.0) as u64;
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn renders_openai_shape_and_retry_after() {
        let e = GatewayError::capacity(503, "queue_full", "full", Some(Duration::from_millis(1500)));
        let r = e.into_response();
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()["retry-after"], "2");
        let body = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["code"], "queue_full");
        assert_eq!(v["error"]["type"], "service_unavailable_error");
        assert_eq!(v["error"]["message"], "full");
        assert!(v["error"]["param"].is_null());
    }
}
