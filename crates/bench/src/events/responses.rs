//! OpenAI's Responses API stream (`POST /v1/responses`, `stream: true`) as vLLM 0.32 writes it:
//! `response.created` … `response.output_text.delta` … `response.completed`, each event's `type`
//! in its data; no `[DONE]`. Tokens are every non-empty delta of text, reasoning, a reasoning
//! summary, a refusal or a function call's arguments; usage and the end are `response.completed`
//! (or `response.incomplete`); errors are `error` events, `response.failed`, or vLLM's own
//! `{"error":{…,"code":503}}` chunk.

use std::borrow::Cow;

use protocol::judge::{ErrorInfo, Kind};
use serde::Deserialize;

use super::Event;
use super::lenient::{Count, ErrorObject, Status, Str, Text};

/// The event types whose `delta` is generated text.
const TOKEN_EVENTS: [&str; 5] = [
    "response.output_text.delta",
    "response.reasoning_text.delta",
    "response.reasoning_summary_text.delta",
    "response.refusal.delta",
    "response.function_call_arguments.delta",
];

#[derive(Default, Deserialize)]
#[serde(default)]
struct Data<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    delta: Text,
    response: Option<Response>,
    error: Option<ErrorObject>,
    code: Status,
    message: Str,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct Response {
    id: Str,
    usage: Option<Usage>,
    error: Option<ErrorObject>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct Usage {
    input_tokens: Count,
    output_tokens: Count,
}

/// Reads one event's data.
pub fn read(data: &[u8], want_id: bool) -> Event {
    if data.trim_ascii() == b"[DONE]" {
        return Event::of_kind(Kind::Done);
    }
    let Ok(d) = serde_json::from_slice::<Data<'_>>(data) else {
        return Event::of_kind(Kind::Other);
    };
    let kind = d.kind.as_deref().unwrap_or_default();
    let mut ev = Event::of_kind(match kind {
        _ if TOKEN_EVENTS.contains(&kind) => {
            if d.delta.0 {
                Kind::Tokens
            } else {
                Kind::Other
            }
        }
        "response.completed" | "response.incomplete" => Kind::Done,
        "response.failed" | "error" => Kind::Error,
        // vLLM's streamed error chunk has no type.
        "" if d.error.is_some() => Kind::Error,
        _ => Kind::Other,
    });
    if ev.kind == Kind::Error {
        // An `error` event's own code and message first, then the error object it carries (the
        // failed response's, or vLLM's chunk's).
        let carried = d
            .response
            .and_then(|r| r.error)
            .or(d.error)
            .map(ErrorObject::info)
            .unwrap_or_default();
        let fallback = if kind.is_empty() { "error event" } else { kind };
        ev.error = Some(ErrorInfo {
            status: d.code.0.or(carried.status),
            message: d
                .message
                .0
                .or(carried.message)
                .or_else(|| Some(fallback.to_owned())),
        });
        return ev;
    }
    if let Some(r) = d.response {
        if want_id {
            ev.id = r.id.0;
        }
        if let Some(u) = r.usage {
            ev.input_tokens = u.input_tokens.0;
            ev.output_tokens = u.output_tokens.0;
        }
    }
    ev
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &str = include_str!("../../../engine/tests/fixtures/vllm-0.32/responses-stream.sse");

    fn events(stream: &str) -> Vec<Event> {
        let mut out = Vec::new();
        protocol::sse::EventSplitter::default().feed(stream.as_bytes(), |e| {
            if let Some(ev) = super::super::read(crate::request::Api::Responses, &e, true) {
                out.push(ev);
            }
        });
        out
    }

    /// vLLM's own stream: three text deltas, the id from `response.created`, the usage and the end
    /// from `response.completed` (status `incomplete` at the cap, still the last event).
    #[test]
    fn vllms_stream_reads_as_three_tokens_then_usage_and_the_end() {
        let evs = events(FIXTURE);
        assert_eq!(evs.len(), 11);
        let kinds: Vec<Kind> = evs.iter().map(|e| e.kind).collect();
        assert_eq!(kinds.iter().filter(|k| **k == Kind::Tokens).count(), 3);
        assert_eq!(kinds[4..7], [Kind::Tokens; 3]);
        assert_eq!(kinds.last(), Some(&Kind::Done));
        assert_eq!(evs[0].id.as_deref(), Some("resp_a866fc21525317cb"));
        let last = evs.last().unwrap();
        assert_eq!((last.input_tokens, last.output_tokens), (Some(20), Some(4)));
        assert!(evs.iter().all(|e| e.error.is_none()));
    }

    #[test]
    fn reasoning_and_tool_call_arguments_are_tokens_and_empty_deltas_are_not() {
        for kind in TOKEN_EVENTS {
            let ev = read(
                format!(r#"{{"type":"{kind}","delta":"x","sequence_number":4}}"#).as_bytes(),
                false,
            );
            assert_eq!(ev.kind, Kind::Tokens, "{kind}");
            let empty = read(format!(r#"{{"type":"{kind}","delta":""}}"#).as_bytes(), false);
            assert_eq!(empty.kind, Kind::Other, "{kind}");
        }
        let done_text = read(br#"{"type":"response.output_text.done","text":"abc"}"#, false);
        assert_eq!(
            done_text.kind,
            Kind::Other,
            "the whole text again is no new token"
        );
    }

    #[test]
    fn errors_in_each_shape_name_their_status() {
        let event = read(
            br#"{"type":"error","code":"rate_limit_exceeded","message":"slow down","param":null,"sequence_number":1}"#,
            false,
        );
        assert_eq!(event.kind, Kind::Error);
        assert_eq!(event.error.as_ref().unwrap().status, Some(429));
        assert_eq!(event.error.unwrap().message.as_deref(), Some("slow down"));

        let failed = read(
            br#"{"type":"response.failed","response":{"id":"resp_1","status":"failed","error":{"code":"server_error","message":"boom"}}}"#,
            false,
        );
        assert_eq!(failed.kind, Kind::Error);
        assert_eq!(
            failed.error,
            Some(ErrorInfo {
                status: Some(500),
                message: Some("boom".into())
            })
        );

        let vllm = read(
            br#"{"error":{"message":"The server is overloaded","type":"ServiceUnavailableError","param":null,"code":503}}"#,
            false,
        );
        assert_eq!(vllm.kind, Kind::Error);
        assert_eq!(vllm.error.unwrap().status, Some(503));

        let unnamed = read(br#"{"type":"error","code":null,"message":null}"#, false);
        assert_eq!(
            unnamed.error,
            Some(ErrorInfo {
                status: None,
                message: Some("error".into())
            })
        );
    }

    #[test]
    fn odd_data_is_no_token_and_no_failure() {
        for data in [
            &b"not json"[..],
            b"[1,2]",
            br#"{"type":3}"#,
            br#"{"type":"response.output_text.delta","delta":{"a":1}}"#,
        ] {
            assert_eq!(
                read(data, true).kind,
                Kind::Other,
                "{}",
                String::from_utf8_lossy(data)
            );
        }
        assert_eq!(read(b" [DONE] ", false).kind, Kind::Done);
    }
}
