//! The agents' APIs as a gateway reads them: OpenAI's Responses (`POST /v1/responses`) and
//! Anthropic's Messages (`POST /v1/messages`, and its `count_tokens`), as vLLM 0.32 serves them.
//!
//! A request keeps every member it does not name in `extra`, as the chat types do, so that the
//! gateway forwards what it does not read. An event of their streams is judged by its `type`
//! (both APIs name every event in its data), into the same [`Judgement`] the chat stream's events
//! get, so that the relay times tokens, reads usage and finds the end the same way whichever API
//! spoke:
//! - Responses: `response.output_text.delta`, `response.reasoning_text.delta`,
//!   `response.reasoning_summary_text.delta`, `response.refusal.delta` and
//!   `response.function_call_arguments.delta` with a non-empty `delta` carry tokens;
//!   `response.completed` and `response.incomplete` end the stream with the response's usage
//!   (`input_tokens`, `output_tokens`); `response.failed` and `error` are errors.
//! - Messages: `content_block_delta` whose `delta` holds a non-empty `text`, `thinking` or
//!   `partial_json` carries tokens; `message_delta` carries the usage; `message_stop` ends it;
//!   `error` is an error (its `error.type` names the status: `rate_limit_error` 429,
//!   `overloaded_error` 503 — Anthropic's own 529 is an overload a gateway answers as 503).
//!
//! The events are read by serde_json into small typed views: unlike the chat stream's
//! hand-tuned judgement (`judge`), there is no reading here to hold to a reference.

use crate::judge::{ErrorInfo, Judgement, Kind, Usage};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::borrow::Cow;

/// Which agents' API a stream or an answer is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Responses,
    Messages,
}

/// `POST /v1/responses`: what the gateway reads of it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResponsesRequest {
    pub model: String,
    /// A string, or a list of items (messages, function call outputs…).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub background: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_response_id: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `POST /v1/messages` and `/v1/messages/count_tokens`: what the gateway reads of it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MessagesRequest {
    pub model: String,
    pub messages: Vec<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The text of a request's parts, in order, for counting its tokens and hashing its prefix: every
/// string under `text`, `content`, `input`, `output`, `arguments`, `thinking` and
/// `instructions`/`system`, at any depth (a message's blocks, a tool call's arguments), with the
/// `role` of each message before it.
pub fn texts(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(s) => out.push(s.clone()),
        Value::Array(items) => items.iter().for_each(|v| texts(v, out)),
        Value::Object(map) => {
            // The role first, as a template writes it before the message's text.
            if let Some(Value::String(role)) = map.get("role") {
                out.push(role.clone());
            }
            const READ: [&str; 8] = [
                "text",
                "content",
                "input",
                "output",
                "arguments",
                "thinking",
                "instructions",
                "system",
            ];
            for (k, v) in map {
                if READ.contains(&k.as_str()) {
                    texts(v, out);
                }
            }
        }
        _ => {}
    }
}

/// The members of one event of either API that its judgement reads.
#[derive(Deserialize, Default)]
#[serde(default)]
struct View<'a> {
    #[serde(rename = "type", borrow)]
    ty: Option<Cow<'a, str>>,
    /// Responses: the text; Messages: an object holding it.
    delta: Option<Delta<'a>>,
    usage: Option<AgentUsage>,
    /// Responses: the response an event announces or ends.
    response: Option<Inner>,
    /// Messages: the message `message_start` opens; Responses' `error`: its text.
    message: Option<Message>,
    /// The error object (Messages', Responses' whole-answer `error`).
    error: Option<Value>,
    /// Responses' `error` event: its code.
    code: Option<Value>,
    id: Option<String>,
    status: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Delta<'a> {
    Text(#[serde(borrow)] Cow<'a, str>),
    Block(Block),
    Other(serde::de::IgnoredAny),
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Block {
    text: Option<String>,
    thinking: Option<String>,
    partial_json: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Message {
    Opened(Inner),
    Text(String),
    Other(serde::de::IgnoredAny),
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Inner {
    id: Option<String>,
    usage: Option<AgentUsage>,
    error: Option<Value>,
}

/// Both APIs count `input_tokens` and `output_tokens`.
#[derive(Deserialize, Default)]
#[serde(default)]
struct AgentUsage {
    input_tokens: Option<Value>,
    output_tokens: Option<Value>,
}

impl AgentUsage {
    fn usage(&self) -> Usage {
        let count = |v: &Option<Value>| {
            v.as_ref()
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
        };
        Usage {
            prompt_tokens: count(&self.input_tokens),
            completion_tokens: count(&self.output_tokens),
        }
    }
}

/// What one event's data says, in `dialect`, and the id of the response or message it names
/// (`response.created`'s, `message_start`'s).
pub fn judge_event(dialect: Dialect, data: &[u8]) -> (Judgement, Option<String>) {
    let other = (Judgement::of_kind(Kind::Other), None);
    let Ok(view) = serde_json::from_slice::<View<'_>>(data) else {
        return other;
    };
    let ty = view.ty.as_deref().unwrap_or("");
    let mut judgement = Judgement::of_kind(Kind::Other);
    let mut id = None;
    match dialect {
        Dialect::Responses => match ty {
            "response.output_text.delta"
            | "response.reasoning_text.delta"
            | "response.reasoning_summary_text.delta"
            | "response.refusal.delta"
            | "response.function_call_arguments.delta" => {
                if matches!(&view.delta, Some(Delta::Text(t)) if !t.is_empty()) {
                    judgement.kind = Kind::Tokens;
                }
            }
            "response.completed" | "response.incomplete" => {
                judgement.kind = Kind::Done;
                judgement.usage = view
                    .response
                    .as_ref()
                    .and_then(|r| r.usage.as_ref())
                    .map(AgentUsage::usage);
            }
            "response.failed" => {
                judgement.kind = Kind::Error;
                let e = view.response.as_ref().and_then(|r| r.error.as_ref());
                judgement.error = Some(error_info(e, None));
            }
            "error" => {
                judgement.kind = Kind::Error;
                let message = match &view.message {
                    Some(Message::Text(m)) => Some(m.clone()),
                    _ => None,
                };
                let code = view.code.as_ref();
                judgement.error = Some(ErrorInfo {
                    status: code
                        .and_then(status_of_code)
                        .or_else(|| code.and_then(Value::as_str).and_then(status_of_type)),
                    message,
                });
            }
            "response.created" => id = view.response.and_then(|r| r.id),
            _ => {}
        },
        Dialect::Messages => match ty {
            "content_block_delta" => {
                if let Some(Delta::Block(b)) = &view.delta {
                    let some = |s: &Option<String>| s.as_deref().is_some_and(|s| !s.is_empty());
                    if some(&b.text) || some(&b.thinking) || some(&b.partial_json) {
                        judgement.kind = Kind::Tokens;
                    }
                }
            }
            "message_delta" => judgement.usage = view.usage.as_ref().map(AgentUsage::usage),
            "message_start" => {
                if let Some(Message::Opened(m)) = view.message {
                    // The prompt's count, which a `message_delta` may leave out.
                    judgement.usage = m.usage.as_ref().map(AgentUsage::usage).map(|u| Usage {
                        completion_tokens: None,
                        ..u
                    });
                    id = m.id;
                }
            }
            "message_stop" => judgement.kind = Kind::Done,
            "error" => {
                judgement.kind = Kind::Error;
                judgement.error = Some(error_info(view.error.as_ref(), None));
            }
            _ => {}
        },
    }
    (judgement, id)
}

/// What a whole (non-streamed) answer in `dialect` says: its usage, whether it is an error, and
/// its id (a response's, which later requests may name).
pub fn judge_answer(dialect: Dialect, body: &[u8]) -> (Judgement, Option<String>) {
    let Ok(view) = serde_json::from_slice::<View<'_>>(body) else {
        return (Judgement::of_kind(Kind::Other), None);
    };
    let mut judgement = Judgement::of_kind(Kind::Other);
    judgement.usage = view.usage.as_ref().map(AgentUsage::usage);
    let failed = match dialect {
        Dialect::Responses => {
            view.error.as_ref().is_some_and(|e| !e.is_null()) || view.status.as_deref() == Some("failed")
        }
        Dialect::Messages => view.ty.as_deref() == Some("error"),
    };
    if failed {
        judgement.kind = Kind::Error;
        judgement.error = Some(error_info(view.error.as_ref(), None));
    }
    (judgement, view.id)
}

/// An error object's status (its `code` when that is a number or digits, else what its `type`
/// names) and message.
fn error_info(error: Option<&Value>, status: Option<u16>) -> ErrorInfo {
    let Some(e) = error else {
        return ErrorInfo {
            status,
            message: None,
        };
    };
    let status = status
        .or_else(|| e.get("code").and_then(status_of_code))
        .or_else(|| e.get("code").and_then(Value::as_str).and_then(status_of_type))
        .or_else(|| e.get("type").and_then(Value::as_str).and_then(status_of_type));
    ErrorInfo {
        status,
        message: e.get("message").and_then(Value::as_str).map(str::to_owned),
    }
}

fn status_of_code(code: &Value) -> Option<u16> {
    let n = match code {
        Value::Number(n) => n.as_u64()?,
        Value::String(s) => s.parse().ok()?,
        _ => return None,
    };
    u16::try_from(n).ok().filter(|s| (400..600).contains(s))
}

/// The status an Anthropic error type (or OpenAI's, which share most names) stands for.
fn status_of_type(kind: &str) -> Option<u16> {
    Some(match kind {
        // OpenAI's Responses API names a failed response's error by codes of its own
        // (`rate_limit_exceeded`, `invalid_prompt`, `server_error`).
        "invalid_request_error" | "BadRequestError" | "invalid_prompt" => 400,
        "authentication_error" => 401,
        "permission_error" => 403,
        "not_found_error" | "NotFoundError" => 404,
        "request_too_large" => 413,
        "rate_limit_error" | "rate_limit_exceeded" => 429,
        "api_error" | "server_error" => 500,
        // Anthropic's 529: a replica out of room, which a gateway answers as 503.
        "overloaded_error" => 503,
        "timeout_error" => 504,
        _ => return None,
    })
}

/// `data` with every `model` member that holds `upstream` — at the top, in `response` and in
/// `message` — holding `public`; `None` when none does.
pub fn renamed(data: &[u8], upstream: &str, public: &str) -> Option<Vec<u8>> {
    let mut value: Value = serde_json::from_slice(data).ok()?;
    let mut changed = false;
    let mut put = |obj: Option<&mut Value>| {
        if let Some(m) = obj.and_then(|o| o.get_mut("model"))
            && m.as_str() == Some(upstream)
        {
            *m = Value::from(public);
            changed = true;
        }
    };
    put(Some(&mut value));
    put(value.get_mut("response"));
    put(value.get_mut("message"));
    if !changed {
        return None;
    }
    serde_json::to_vec(&value).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(dialect: Dialect, sse: &str) -> Vec<(Kind, Option<(u32, u32)>)> {
        let mut out = Vec::new();
        let mut s = crate::sse::EventSplitter::default();
        s.feed(sse.as_bytes(), |e| {
            let data = crate::judge::data(&e)
                .map(|d| d.bytes().to_vec())
                .unwrap_or_default();
            let (j, _) = judge_event(dialect, &data);
            out.push((j.kind, j.usage.and_then(|u| u.pair())));
        });
        out
    }

    #[test]
    fn a_messages_stream_as_vllm_writes_it() {
        let sse = include_str!("../../engine/tests/fixtures/vllm-0.32/messages-stream.sse");
        let got = kinds(Dialect::Messages, sse);
        let tokens = got.iter().filter(|(k, _)| *k == Kind::Tokens).count();
        assert_eq!(tokens, 4, "{got:?}");
        assert_eq!(got.last().unwrap().0, Kind::Done);
        assert!(got.contains(&(Kind::Other, Some((20, 5)))), "{got:?}");
        let start = "{\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":7,\"output_tokens\":1}}}";
        let (j, id) = judge_event(Dialect::Messages, start.as_bytes());
        assert_eq!(
            (j.usage.unwrap().prompt_tokens, id.as_deref()),
            (Some(7), Some("msg_1"))
        );
    }

    #[test]
    fn a_responses_stream_as_vllm_writes_it() {
        let sse = include_str!("../../engine/tests/fixtures/vllm-0.32/responses-stream.sse");
        let got = kinds(Dialect::Responses, sse);
        assert_eq!(
            got.iter().filter(|(k, _)| *k == Kind::Tokens).count(),
            3,
            "{got:?}"
        );
        assert_eq!(got.last().unwrap(), &(Kind::Done, Some((20, 4))));
        let created = sse
            .lines()
            .find(|l| l.starts_with("data:") && l.contains("response.created"))
            .unwrap();
        let (_, id) = judge_event(
            Dialect::Responses,
            created.trim_start_matches("data: ").as_bytes(),
        );
        assert_eq!(id.as_deref(), Some("resp_a866fc21525317cb"));
    }

    #[test]
    fn tool_calls_and_reasoning_carry_tokens_and_errors_name_their_status() {
        let r = |s: &str| judge_event(Dialect::Responses, s.as_bytes()).0;
        let m = |s: &str| judge_event(Dialect::Messages, s.as_bytes()).0;
        assert_eq!(
            r(r#"{"type":"response.function_call_arguments.delta","delta":"{\"a\""}"#).kind,
            Kind::Tokens
        );
        assert_eq!(
            r(r#"{"type":"response.reasoning_text.delta","delta":"hm"}"#).kind,
            Kind::Tokens
        );
        assert_eq!(
            r(r#"{"type":"response.output_text.delta","delta":""}"#).kind,
            Kind::Other
        );
        assert_eq!(
            m(r#"{"type":"content_block_delta","delta":{"type":"input_json_delta","partial_json":"{"}}"#)
                .kind,
            Kind::Tokens
        );
        assert_eq!(
            m(r#"{"type":"content_block_delta","delta":{"type":"thinking_delta","thinking":"so"}}"#).kind,
            Kind::Tokens
        );
        assert_eq!(
            m(r#"{"type":"content_block_delta","delta":{"type":"signature_delta","signature":"x"}}"#).kind,
            Kind::Other
        );
        let e = m(r#"{"type":"error","error":{"type":"overloaded_error","message":"full"}}"#);
        assert_eq!((e.kind, e.error.unwrap().status), (Kind::Error, Some(503)));
        let e = r(r#"{"type":"error","code":"429","message":"slow down","param":null}"#);
        assert_eq!(
            (e.kind, e.error.as_ref().unwrap().status),
            (Kind::Error, Some(429))
        );
        assert_eq!(e.error.unwrap().message.as_deref(), Some("slow down"));
        let e = r(r#"{"type":"response.failed","response":{"error":{"code":"server_error","message":"x"}}}"#);
        assert_eq!((e.kind, e.error.unwrap().status), (Kind::Error, Some(500)));
        let e = r(
            r#"{"type":"response.failed","response":{"error":{"code":"rate_limit_exceeded","message":"x"}}}"#,
        );
        assert_eq!(e.error.unwrap().status, Some(429));
        let e = r(r#"{"type":"error","code":"rate_limit_exceeded","message":"x","param":null}"#);
        assert_eq!(e.error.unwrap().status, Some(429));
        // Not JSON, or not an object: nothing to read.
        assert_eq!(r("[DONE]").kind, Kind::Other);
        assert_eq!(m("7").kind, Kind::Other);
    }

    #[test]
    fn whole_answers_give_their_usage_and_id() {
        let body = include_str!("../../engine/tests/fixtures/vllm-0.32/responses.json");
        let (j, id) = judge_answer(Dialect::Responses, body.as_bytes());
        assert_eq!((j.kind, j.usage.unwrap().pair()), (Kind::Other, Some((20, 4))));
        assert_eq!(id.as_deref(), Some("resp_be3d582c82ff73d5"));
        let body = include_str!("../../engine/tests/fixtures/vllm-0.32/messages.json");
        let (j, _) = judge_answer(Dialect::Messages, body.as_bytes());
        assert_eq!(j.usage.unwrap().pair(), Some((20, 5)));
        let body = include_str!("../../engine/tests/fixtures/vllm-0.32/messages-unknown-model.json");
        assert_eq!(
            judge_answer(Dialect::Messages, body.as_bytes())
                .0
                .error
                .unwrap()
                .status,
            Some(404)
        );
    }

    #[test]
    fn the_public_name_goes_where_each_api_writes_the_model() {
        let created = r#"{"type":"response.created","response":{"id":"r","model":"up"}}"#;
        let v: Value = serde_json::from_slice(&renamed(created.as_bytes(), "up", "pub").unwrap()).unwrap();
        assert_eq!(v["response"]["model"], "pub");
        let start = r#"{"type":"message_start","message":{"model":"up"}}"#;
        let v: Value = serde_json::from_slice(&renamed(start.as_bytes(), "up", "pub").unwrap()).unwrap();
        assert_eq!(v["message"]["model"], "pub");
        assert_eq!(renamed(br#"{"type":"ping"}"#, "up", "pub"), None);
    }

    #[test]
    fn a_requests_text_is_read_from_every_part() {
        let v: Value = serde_json::from_str(
            r#"[{"role":"user","content":[{"type":"input_text","text":"hi"}]},{"type":"function_call_output","output":"42"}]"#,
        )
        .unwrap();
        let mut out = Vec::new();
        texts(&v, &mut out);
        assert_eq!(out, ["user", "hi", "42"]);
    }
}
