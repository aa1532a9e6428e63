//! What one event of a streamed answer says, in each API the bench drives: whether it carries
//! generated tokens, its usage, whether it ends the stream or is an error (and the status that
//! error names), and the answer's id. Fed one event's bytes; the client owns the socket.
//!
//! Every API is read by the gateway's own judgement — [`protocol::judge`] for chat and completions,
//! [`protocol::agents`] for the Responses and Messages APIs — so that the bench and the gateway
//! agree on a stream's first token, its usage and its end.

use protocol::agents::{self, Dialect};
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

/// Reads one event (its bytes as the SSE splitter cut them) of an `api` stream; `None` for an
/// event without data (a comment, a keep-alive). The id is read only when `want_id`: it is
/// wanted once per answer and costs an allocation.
pub fn read(api: Api, event: &[u8], want_id: bool) -> Option<Event> {
    let data = judge::data(event)?;
    let data = data.bytes();
    let (judged, id) = match api {
        Api::Chat | Api::Completions => {
            let judged = judge::judge_data(data);
            let id = if want_id { judged.id(data) } else { None };
            (judged, id)
        }
        Api::Responses | Api::Messages => {
            let dialect = if api == Api::Responses {
                Dialect::Responses
            } else {
                Dialect::Messages
            };
            let (judged, id) = agents::judge_event(dialect, data);
            // vLLM writes a failure inside its generation as the OpenAI-shaped
            // `{"error":{…,"code":503}}` chunk on every route: read as chat's judge reads it.
            let judged = match judged.kind {
                Kind::Other => Some(judge::judge_data(data))
                    .filter(|j| j.kind == Kind::Error)
                    .unwrap_or(judged),
                _ => judged,
            };
            (judged, id.filter(|_| want_id))
        }
    };
    let usage = judged.usage.unwrap_or_default();
    Some(Event {
        kind: judged.kind,
        input_tokens: usage.prompt_tokens,
        output_tokens: usage.completion_tokens,
        error: judged.error,
        id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const RESPONSES: &str = include_str!("../../engine/tests/fixtures/vllm-0.32/responses-stream.sse");
    const MESSAGES: &str = include_str!("../../engine/tests/fixtures/vllm-0.32/messages-stream.sse");

    fn events(api: Api, stream: &str) -> Vec<Event> {
        let mut out = Vec::new();
        protocol::sse::EventSplitter::default().feed(stream.as_bytes(), |e| out.extend(read(api, &e, true)));
        out
    }

    fn kinds(evs: &[Event]) -> Vec<Kind> {
        evs.iter().map(|e| e.kind).collect()
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

    /// vLLM's own Responses stream: the id from `response.created`, three text deltas, the usage
    /// and the end from `response.completed` (status `incomplete` at the cap, still the last).
    #[test]
    fn vllms_responses_stream_reads_as_three_tokens_then_usage_and_the_end() {
        let evs = events(Api::Responses, RESPONSES);
        assert_eq!(evs.len(), 11);
        assert_eq!(kinds(&evs).iter().filter(|k| **k == Kind::Tokens).count(), 3);
        assert_eq!(kinds(&evs)[4..7], [Kind::Tokens; 3]);
        assert_eq!(evs[0].id.as_deref(), Some("resp_a866fc21525317cb"));
        let last = evs.last().unwrap();
        assert_eq!(last.kind, Kind::Done);
        assert_eq!((last.input_tokens, last.output_tokens), (Some(20), Some(4)));
        assert!(evs.iter().all(|e| e.error.is_none()));
        assert!(evs[1..].iter().all(|e| e.id.is_none()), "the id once");
    }

    /// vLLM's own Messages stream: the id and the prompt's tokens from `message_start`, four text
    /// deltas (one a replacement character), the output's tokens from `message_delta`, the end at
    /// `message_stop`.
    #[test]
    fn vllms_messages_stream_reads_as_four_tokens_then_usage_and_the_end() {
        let evs = events(Api::Messages, MESSAGES);
        let (o, t) = (Kind::Other, Kind::Tokens);
        assert_eq!(kinds(&evs), [o, o, t, t, t, t, o, o, Kind::Done]);
        assert_eq!(evs[0].id.as_deref(), Some("chatcmpl-b1b6a9e04f4f4c4b"));
        assert_eq!((evs[0].input_tokens, evs[0].output_tokens), (Some(20), None));
        assert_eq!((evs[7].input_tokens, evs[7].output_tokens), (Some(20), Some(5)));
    }

    /// Each API's error shapes, and vLLM's OpenAI-shaped chunk on both agent routes.
    #[test]
    fn errors_in_each_shape_name_their_status() {
        let status = |api, data: &str| {
            let ev = read(api, format!("data: {data}\n\n").as_bytes(), false).unwrap();
            assert_eq!(ev.kind, Kind::Error, "{data}");
            ev.error.unwrap().status
        };
        let overloaded = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        assert_eq!(status(Api::Messages, overloaded), Some(503));
        let limited = r#"{"type":"error","error":{"type":"rate_limit_error","message":"x"}}"#;
        assert_eq!(status(Api::Messages, limited), Some(429));
        let failed = r#"{"type":"response.failed","response":{"id":"resp_1","status":"failed","error":{"code":"rate_limit_exceeded","message":"slow down"}}}"#;
        assert_eq!(status(Api::Responses, failed), Some(429));
        let vllm = r#"{"error":{"message":"The server is overloaded","type":"ServiceUnavailableError","param":null,"code":503}}"#;
        assert_eq!(status(Api::Responses, vllm), Some(503));
        assert_eq!(status(Api::Messages, vllm), Some(503));
        // Not an error on these routes: a chat stream's end.
        assert_eq!(
            read(Api::Responses, b"data: [DONE]\n\n", false).unwrap().kind,
            Kind::Other
        );
    }
}
