//! Anthropic's Messages API stream (`POST /v1/messages`, `stream: true`) as vLLM 0.32 writes it:
//! `message_start` (the id, the prompt's tokens) … `content_block_delta` … `message_delta` (the
//! output's tokens) and `message_stop`, each event's `type` in its data. Tokens are every
//! non-empty `text_delta`, `thinking_delta` or `input_json_delta`; errors are
//! `{"type":"error","error":{"type":…,"message":…}}`, their status named by the type.

use std::borrow::Cow;

use protocol::judge::{ErrorInfo, Kind};
use serde::Deserialize;

use super::Event;
use super::lenient::{Count, ErrorObject, Str, Text};

#[derive(Default, Deserialize)]
#[serde(default)]
struct Data<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow)]
    delta: Option<Delta<'a>>,
    message: Option<Message>,
    usage: Option<Usage>,
    error: Option<ErrorObject>,
}

/// A content block's delta (a `message_delta`'s holds the stop reason and no type).
#[derive(Default, Deserialize)]
#[serde(default)]
struct Delta<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    text: Text,
    thinking: Text,
    partial_json: Text,
}

impl Delta<'_> {
    fn carries_tokens(&self) -> bool {
        match self.kind.as_deref() {
            Some("text_delta") => self.text.0,
            Some("thinking_delta") => self.thinking.0,
            Some("input_json_delta") => self.partial_json.0,
            _ => false,
        }
    }
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct Message {
    id: Str,
    usage: Option<Usage>,
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
    match kind {
        "content_block_delta" if d.delta.as_ref().is_some_and(Delta::carries_tokens) => {
            Event::of_kind(Kind::Tokens)
        }
        "message_start" => {
            let message = d.message.unwrap_or_default();
            let mut ev = Event::of_kind(Kind::Other);
            // Only the prompt's count: `output_tokens` here is before any token was made.
            ev.input_tokens = message.usage.and_then(|u| u.input_tokens.0);
            ev.id = message.id.0.filter(|_| want_id);
            ev
        }
        "message_delta" => {
            let mut ev = Event::of_kind(Kind::Usage);
            if let Some(u) = d.usage {
                ev.input_tokens = u.input_tokens.0;
                ev.output_tokens = u.output_tokens.0;
            }
            ev
        }
        "message_stop" => Event::of_kind(Kind::Done),
        "error" => error(d.error),
        // An OpenAI-shaped `{"error":…}` on this route is an error as well.
        "" if d.error.is_some() => error(d.error),
        _ => Event::of_kind(Kind::Other),
    }
}

/// An error event: the status its type (or code) names and its message.
fn error(object: Option<ErrorObject>) -> Event {
    let info = object.map(ErrorObject::info).unwrap_or_default();
    let mut ev = Event::of_kind(Kind::Error);
    ev.error = Some(ErrorInfo {
        message: info.message.or_else(|| Some("error event".to_owned())),
        ..info
    });
    ev
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &str = include_str!("../../../engine/tests/fixtures/vllm-0.32/messages-stream.sse");

    fn events(stream: &str) -> Vec<Event> {
        let mut out = Vec::new();
        protocol::sse::EventSplitter::default().feed(stream.as_bytes(), |e| {
            if let Some(ev) = super::super::read(crate::request::Api::Messages, &e, true) {
                out.push(ev);
            }
        });
        out
    }

    /// vLLM's own stream: four text deltas (one of them a replacement character), the id and the
    /// prompt's tokens from `message_start`, the output's from `message_delta`, the end at
    /// `message_stop`.
    #[test]
    fn vllms_stream_reads_as_four_tokens_then_usage_and_the_end() {
        let evs = events(FIXTURE);
        assert_eq!(evs.len(), 9);
        let kinds: Vec<Kind> = evs.iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [
                Kind::Other,
                Kind::Other,
                Kind::Tokens,
                Kind::Tokens,
                Kind::Tokens,
                Kind::Tokens,
                Kind::Other,
                Kind::Usage,
                Kind::Done
            ]
        );
        assert_eq!(evs[0].id.as_deref(), Some("chatcmpl-b1b6a9e04f4f4c4b"));
        assert_eq!((evs[0].input_tokens, evs[0].output_tokens), (Some(20), None));
        assert_eq!((evs[7].input_tokens, evs[7].output_tokens), (Some(20), Some(5)));
    }

    #[test]
    fn thinking_and_tool_input_are_tokens_and_signatures_are_not() {
        let delta = |d: &str| {
            read(
                format!(r#"{{"type":"content_block_delta","index":0,"delta":{d}}}"#).as_bytes(),
                false,
            )
            .kind
        };
        assert_eq!(
            delta(r#"{"type":"thinking_delta","thinking":"hm"}"#),
            Kind::Tokens
        );
        assert_eq!(
            delta(r#"{"type":"input_json_delta","partial_json":"{\"a\""}"#),
            Kind::Tokens
        );
        assert_eq!(
            delta(r#"{"type":"input_json_delta","partial_json":""}"#),
            Kind::Other
        );
        assert_eq!(
            delta(r#"{"type":"signature_delta","signature":"abc"}"#),
            Kind::Other
        );
        assert_eq!(delta(r#"{"type":"text_delta","text":""}"#), Kind::Other);
        assert_eq!(read(br#"{"type":"ping"}"#, false).kind, Kind::Other);
    }

    #[test]
    fn errors_name_their_status_by_type() {
        let overloaded = read(
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
            false,
        );
        assert_eq!(overloaded.kind, Kind::Error);
        assert_eq!(
            overloaded.error,
            Some(ErrorInfo {
                status: Some(529),
                message: Some("Overloaded".into())
            })
        );
        let limited = read(
            br#"{"type":"error","error":{"type":"rate_limit_error","message":"x"}}"#,
            false,
        );
        assert_eq!(limited.error.unwrap().status, Some(429));
        // vLLM's own failure mid-stream: its type names no status the SDK knows, read as a 500.
        let internal = read(
            br#"{"type":"error","error":{"type":"internal_error","message":"boom"}}"#,
            false,
        );
        assert_eq!(internal.error.unwrap().status, Some(500));
        let openai = read(
            br#"{"error":{"message":"busy","type":"ServiceUnavailableError","code":503}}"#,
            false,
        );
        assert_eq!(openai.kind, Kind::Error);
        assert_eq!(openai.error.unwrap().status, Some(503));
        let bare = read(br#"{"type":"error"}"#, false);
        assert_eq!(bare.error.unwrap().message.as_deref(), Some("error event"));
    }
}
