//! What one event of a streamed answer says, in each API the bench drives: whether it carries
//! generated tokens, its usage, whether it ends the stream or is an error (and the status that
//! error names), and the answer's id. A parser fed one event's bytes; the client owns the socket.
//!
//! Chat and completions are read by the gateway's own judge ([`protocol::judge`]), so that the two
//! agree on a stream's first token. The Responses API ([`responses`]) and Anthropic's Messages API
//! ([`messages`]) are read here, as vLLM 0.32 streams them (its captures are the tests' input).

mod lenient;
pub mod messages;
pub mod responses;

use protocol::judge::{self, ErrorInfo, Kind};

use crate::request::Api;

/// What the bench reads out of one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub kind: Kind,
    /// Prompt tokens, when the event counts them.
    pub input_tokens: Option<u32>,
    /// Generated tokens, when the event counts them (a usage or final event).
    pub output_tokens: Option<u32>,
    /// An error event's status and message.
    pub error: Option<ErrorInfo>,
    /// The answer's id, when the event names it (and it was asked for).
    pub id: Option<String>,
}

impl Event {
    pub(crate) fn of_kind(kind: Kind) -> Event {
        Event {
            kind,
            input_tokens: None,
            output_tokens: None,
            error: None,
            id: None,
        }
    }
}

/// Reads one event (its bytes as the SSE splitter cut them) of an `api` stream; `None` for an
/// event without data (a comment, a keep-alive). The id is read only when `want_id`: it is
/// wanted once per answer and costs an allocation.
pub fn read(api: Api, event: &[u8], want_id: bool) -> Option<Event> {
    match api {
        Api::Chat | Api::Completions => {
            let (judged, data) = judge::judge(event);
            let data = data?;
            let usage = judged.usage.unwrap_or_default();
            Some(Event {
                kind: judged.kind,
                input_tokens: usage.prompt_tokens,
                output_tokens: usage.completion_tokens,
                id: if want_id { judged.id(data.bytes()) } else { None },
                error: judged.error,
            })
        }
        Api::Responses => Some(responses::read(judge::data(event)?.bytes(), want_id)),
        Api::Messages => Some(messages::read(judge::data(event)?.bytes(), want_id)),
    }
}

/// The HTTP status an error's code or type names: a number (or digits) from 400 to 599, or one of
/// the names OpenAI's Responses API, Anthropic's API and vLLM give their errors. Anthropic's SDK
/// retries `overloaded_error` as the 529 it comes with.
pub fn status_named(code: &str) -> Option<u16> {
    if let Ok(n) = code.trim().parse::<u16>() {
        return (400..=599).contains(&n).then_some(n);
    }
    let status = match code {
        "invalid_request_error" | "invalid_prompt" | "BadRequestError" => 400,
        "authentication_error" | "AuthenticationError" => 401,
        "permission_error" | "PermissionDeniedError" => 403,
        "not_found_error" | "NotFoundError" => 404,
        "request_too_large" => 413,
        "rate_limit_error" | "rate_limit_exceeded" | "RateLimitError" => 429,
        "api_error" | "server_error" | "internal_error" | "InternalServerError" => 500,
        "ServiceUnavailableError" | "service_unavailable" => 503,
        "timeout_error" => 504,
        "overloaded_error" => 529,
        _ => return None,
    };
    Some(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_named_by_numbers_and_by_each_apis_words() {
        assert_eq!(status_named("503"), Some(503));
        assert_eq!(status_named("200"), None, "not an error status");
        assert_eq!(status_named("overloaded_error"), Some(529));
        assert_eq!(status_named("rate_limit_error"), Some(429));
        assert_eq!(status_named("rate_limit_exceeded"), Some(429));
        assert_eq!(status_named("NotFoundError"), Some(404));
        assert_eq!(status_named("queue_full"), None);
    }

    #[test]
    fn chat_events_are_the_gateways_judgement() {
        let ev = read(
            Api::Chat,
            b"data: {\"id\":\"c-1\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n",
            true,
        )
        .unwrap();
        assert_eq!(ev.kind, Kind::Usage);
        assert_eq!((ev.input_tokens, ev.output_tokens), (Some(3), Some(2)));
        assert_eq!(ev.id.as_deref(), Some("c-1"));
        assert_eq!(read(Api::Chat, b": keep-alive\n\n", true), None);
        assert_eq!(read(Api::Messages, b"event: ping\n\n", true), None);
    }
}
