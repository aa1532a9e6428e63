//! The request's hints — its ID, deadline, priority, objectives, key and trace context — read
//! from its headers here, and the list of those headers, which `front` keeps of a head (with the
//! names the routes' rules read) and docs/config.md documents.

use crate::config::Priority;
use crate::error::{GatewayError, Invalid};
use crate::tenant::Tenant;
use crate::traces::TRACE_HEADERS;
use axum::http::{HeaderMap, HeaderName, header};
use std::time::Duration;

/// The request header a caller sets its own deadline with (`"5s"`, `"1500ms"`, or milliseconds).
pub(crate) const DEADLINE_HEADER: &str = "x-spillway-deadline";
/// The request header that lowers (or, on a gateway without tenants, sets) the priority.
pub(crate) const PRIORITY_HEADER: &str = "x-spillway-priority";
// As names made at compile time: looking a header up by a string checks and lowers its bytes
// first, on every request.
const PRIORITY: HeaderName = HeaderName::from_static(PRIORITY_HEADER);
const DEADLINE: HeaderName = HeaderName::from_static(DEADLINE_HEADER);
/// A request's own objectives for `balance: slo`, in milliseconds (TTFT, TPOT); llm-d's names are
/// accepted too.
pub(crate) const SLO_HEADERS: [&str; 4] = [
    "x-spillway-slo-ttft-ms",
    "x-llm-d-slo-ttft-ms",
    "x-spillway-slo-tpot-ms",
    "x-llm-d-slo-tpot-ms",
];
const SLO_TTFT: [HeaderName; 2] = [
    HeaderName::from_static(SLO_HEADERS[0]),
    HeaderName::from_static(SLO_HEADERS[1]),
];
const SLO_TPOT: [HeaderName; 2] = [
    HeaderName::from_static(SLO_HEADERS[2]),
    HeaderName::from_static(SLO_HEADERS[3]),
];
/// The request header a caller names its request with.
pub(crate) const REQUEST_ID_HEADER: &str = "x-request-id";
const REQUEST_ID: HeaderName = HeaderName::from_static(REQUEST_ID_HEADER);

/// The headers the request path reads, besides those the routes' rules name: the API key
/// ([`auth`]), the request's ID, deadline, priority and objectives, and the W3C trace context
/// (`traces`). A header read anywhere else on the request path belongs here: `front` passes on
/// no other.
pub(crate) const READ_HEADERS: [&str; 11] = [
    "authorization",
    API_KEY_HEADER,
    REQUEST_ID_HEADER,
    DEADLINE_HEADER,
    PRIORITY_HEADER,
    SLO_HEADERS[0],
    SLO_HEADERS[1],
    SLO_HEADERS[2],
    SLO_HEADERS[3],
    TRACE_HEADERS[0],
    TRACE_HEADERS[1],
];

/// Anthropic's header for the API key, which its SDK (and Claude Code) sends in place of
/// `Authorization`.
pub(crate) const API_KEY_HEADER: &str = "x-api-key";

/// The API key the request brings, as an `Authorization` value: that header as sent, else
/// `x-api-key`'s key as a bearer token.
pub(crate) fn auth(headers: &HeaderMap) -> Option<std::borrow::Cow<'_, str>> {
    if let Some(v) = headers.get(header::AUTHORIZATION) {
        return v.to_str().ok().map(std::borrow::Cow::Borrowed);
    }
    let key = headers.get(API_KEY_HEADER)?.to_str().ok()?;
    Some(std::borrow::Cow::Owned(format!("Bearer {key}")))
}

/// A request's TTFT and TPOT objectives.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Objectives {
    pub ttft: Option<Duration>,
    pub tpot: Option<Duration>,
}

/// The request's objectives: its `x-spillway-slo-ttft-ms` / `x-spillway-slo-tpot-ms` headers (or
/// llm-d's `x-llm-d-slo-*-ms`), else its class's `slo: { ttft, itl }`. Both names are checked when
/// both are sent; ours wins.
pub(crate) fn objectives(
    headers: &HeaderMap,
    class: Option<crate::config::Slo>,
) -> Result<Objectives, GatewayError> {
    let one = |name: &HeaderName| -> Result<Option<Duration>, GatewayError> {
        let Some(v) = headers.get(name) else {
            return Ok(None);
        };
        let ms = v.to_str().ok().and_then(|s| s.trim().parse::<f64>().ok());
        match ms {
            Some(ms) if ms > 0.0 && ms <= 3_600_000.0 => Ok(Some(Duration::from_secs_f64(ms / 1000.0))),
            _ => Err(GatewayError::bad_request(
                Invalid::Slo,
                format!("{name} must be a number of milliseconds above 0 and at most 3600000"),
                None,
            )),
        }
    };
    let read = |[ours, llm_d]: &[HeaderName; 2]| Ok::<_, GatewayError>(one(ours)?.or(one(llm_d)?));
    Ok(Objectives {
        ttft: read(&SLO_TTFT)?.or(class.and_then(|c| c.ttft)),
        tpot: read(&SLO_TPOT)?.or(class.and_then(|c| c.itl)),
    })
}

/// The request's priority: the tenant's, or lower if the header asks; on a gateway without tenants
/// the header may also raise it.
pub(crate) fn priority(headers: &HeaderMap, tenant: &Tenant, open: bool) -> Result<Priority, GatewayError> {
    let Some(value) = headers.get(&PRIORITY) else {
        return Ok(tenant.priority);
    };
    let asked = value.to_str().ok().and_then(Priority::parse).ok_or_else(|| {
        GatewayError::bad_request(
            Invalid::Priority,
            format!("{PRIORITY_HEADER} must be critical, standard or sheddable"),
            None,
        )
    })?;
    Ok(if open { asked } else { asked.max(tenant.priority) })
}

/// The caller's own budget from its deadline header, if it sent one.
pub(crate) fn caller_deadline(headers: &HeaderMap) -> Result<Option<Duration>, GatewayError> {
    let Some(v) = headers.get(&DEADLINE) else {
        return Ok(None);
    };
    let s = v.to_str().unwrap_or("").trim();
    let parsed = s
        .parse::<u64>()
        .map(Duration::from_millis)
        .or_else(|_| humantime::parse_duration(s))
        .ok()
        .filter(|d| !d.is_zero());
    parsed.map(Some).ok_or_else(|| {
        GatewayError::bad_request(
            Invalid::Deadline,
            format!(
                "{DEADLINE_HEADER} must be a positive duration such as 5s, 1500ms or 1500 (milliseconds)"
            ),
            None,
        )
    })
}

/// A request ID we may echo and log: the client's if short and plain, else a fresh one.
pub(crate) fn request_id(headers: &HeaderMap) -> String {
    headers
        .get(&REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|s| {
            (1..=128).contains(&s.len())
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
        })
        .map_or_else(new_request_id, str::to_owned)
}

/// 128 random bits in 32 hex digits, written without `fmt`'s machinery (every request that
/// brings no ID of its own gets one).
fn new_request_id() -> String {
    let mut n = rand::random::<u128>();
    let mut id = [0u8; 32];
    for digit in id.iter_mut().rev() {
        *digit = b"0123456789abcdef"[(n & 0xf) as usize];
        n >>= 4;
    }
    String::from_utf8(id.to_vec()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_request_id_is_32_hex_digits_and_a_clients_own_is_kept() {
        let (a, b) = (request_id(&HeaderMap::new()), request_id(&HeaderMap::new()));
        for id in [&a, &b] {
            assert_eq!(id.len(), 32, "{id}");
            assert!(
                id.bytes()
                    .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)),
                "{id}"
            );
        }
        assert_ne!(a, b);
        let mut headers = HeaderMap::new();
        headers.insert("x-request-id", "req-1.a_b:c".parse().unwrap());
        assert_eq!(request_id(&headers), "req-1.a_b:c");
        headers.insert("x-request-id", "not ok".parse().unwrap());
        assert_eq!(request_id(&headers).len(), 32);
    }

    /// docs/config.md's table of request headers names every header the request path reads.
    #[test]
    fn the_docs_list_every_header_read() {
        let docs = include_str!("../../../../docs/config.md");
        let start = docs.find("## Request headers the gateway reads").unwrap();
        let table = &docs[start..];
        let table = &table[..table[3..].find("\n## ").unwrap()];
        for name in READ_HEADERS {
            assert!(
                table.contains(&format!("`{name}`")),
                "{name} missing from config.md"
            );
        }
    }
}
