//! Relaying an upstream SSE stream to the client chunk by chunk, without buffering: timing each
//! token chunk, reading the usage chunk (and dropping it if the client did not ask for it), and
//! ending with an SSE error event when the upstream stalls, fails or runs out of time.

use crate::error::GatewayError;
use crate::outcome::{Cut, Exchange};
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use memchr::memmem;
use std::time::Duration;
use tokio::time::Instant;

/// Splits a byte stream into complete SSE events (each ending in a blank line), keeping the rest.
#[derive(Debug, Default)]
pub struct EventSplitter {
    partial: BytesMut,
}

impl EventSplitter {
    /// Feeds bytes; calls `each` with every event completed by them, terminator included.
    pub fn feed(&mut self, data: &[u8], mut each: impl FnMut(Bytes)) {
        self.partial.extend_from_slice(data);
        loop {
            let Some(end) = event_end(&self.partial) else {
                return;
            };
            each(self.partial.split_to(end).freeze());
        }
    }

    /// Whatever is left when the stream ends (an event without its blank line).
    pub fn rest(&mut self) -> Bytes {
        self.partial.split().freeze()
    }
}

/// Needles built once: building a searcher costs more than searching one event.
struct Needles {
    lf: memmem::Finder<'static>,
    crlf: memmem::Finder<'static>,
    usage: memmem::Finder<'static>,
    no_choices: memmem::Finder<'static>,
    content: memmem::Finder<'static>,
    text: memmem::Finder<'static>,
}

static NEEDLES: std::sync::LazyLock<Needles> = std::sync::LazyLock::new(|| Needles {
    lf: memmem::Finder::new(b"\n\n"),
    crlf: memmem::Finder::new(b"\r\n\r\n"),
    usage: memmem::Finder::new(b"\"usage\":{"),
    no_choices: memmem::Finder::new(b"\"choices\":[]"),
    content: memmem::Finder::new(b"\"content\":\""),
    text: memmem::Finder::new(b"\"text\":\""),
});

/// The index just past the first blank line (`\n\n`, or `\r\n\r\n`), if there is one.
fn event_end(buf: &[u8]) -> Option<usize> {
    let n = &*NEEDLES;
    let lf = n.lf.find(buf).map(|i| i + 2);
    // CRLF framing is rare (vLLM and OpenAI use LF); look for it only where a CR appears at all.
    let crlf = memchr::memchr(b'\r', buf)
        .and_then(|_| n.crlf.find(buf))
        .map(|i| i + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// What one SSE event of an OpenAI stream is, judged without parsing its JSON.
#[derive(Debug, PartialEq, Eq)]
pub enum EventKind {
    Done,
    /// The usage-only chunk (`"choices":[]` with `usage`).
    Usage,
    /// A chunk carrying generated text.
    Tokens,
    /// Anything else: the role chunk, the finish chunk, comments, errors.
    Other,
}

pub fn classify(event: &[u8]) -> EventKind {
    if event.starts_with(b"data: [DONE]") || event.starts_with(b"data:[DONE]") {
        return EventKind::Done;
    }
    let n = &*NEEDLES;
    if n.usage.find(event).is_some() && n.no_choices.find(event).is_some() {
        return EventKind::Usage;
    }
    let has_text = |f: &memmem::Finder<'_>| {
        f.find(event)
            .is_some_and(|p| event.get(p + f.needle().len()).is_some_and(|c| *c != b'"'))
    };
    if has_text(&n.content) || has_text(&n.text) {
        EventKind::Tokens
    } else {
        EventKind::Other
    }
}

/// Reads `prompt_tokens` and `completion_tokens` out of a usage chunk (or a whole response).
pub fn parse_usage(json: &[u8]) -> Option<(u32, u32)> {
    #[derive(serde::Deserialize)]
    struct Usage {
        prompt_tokens: u32,
        completion_tokens: u32,
    }
    #[derive(serde::Deserialize)]
    struct WithUsage {
        usage: Option<Usage>,
    }
    let body = json.strip_prefix(b"data: ").unwrap_or(json);
    let parsed: WithUsage = serde_json::from_slice(body.trim_ascii_end()).ok()?;
    parsed.usage.map(|u| (u.prompt_tokens, u.completion_tokens))
}

/// Puts the public model name back where the replica wrote its own (`"model":"<upstream>"`), so
/// that clients see the name they asked for.
#[derive(Debug, Clone)]
pub struct Rename {
    from: memmem::Finder<'static>,
    to: Vec<u8>,
}

impl Rename {
    pub fn new(upstream: &str, public: &str) -> Rename {
        let field = |name: &str| format!("\"model\":{}", serde_json::Value::from(name)).into_bytes();
        Rename {
            from: memmem::Finder::new(&field(upstream)).into_owned(),
            to: field(public),
        }
    }

    pub fn apply(&self, event: Bytes) -> Bytes {
        let Some(pos) = self.from.find(&event) else {
            return event;
        };
        let mut out = BytesMut::with_capacity(event.len() + self.to.len());
        out.extend_from_slice(&event[..pos]);
        out.extend_from_slice(&self.to);
        out.extend_from_slice(&event[pos + self.from.needle().len()..]);
        out.freeze()
    }
}

/// The state of one relayed stream; the response body owns it, and dropping it (the client left)
/// drops the upstream body, which makes the replica abort the request.
pub struct Relay {
    pub rename: Option<Rename>,
    pub upstream: Incoming,
    pub splitter: EventSplitter,
    /// Events already read (the first chunk, read before the response head was sent).
    pub pending: Vec<Bytes>,
    pub strip_usage: bool,
    pub idle: Duration,
    pub deadline: Instant,
    pub exchange: Exchange,
    pub done: bool,
}

impl Relay {
    /// Handles one complete event at `now`; returns it if it is to be forwarded.
    pub fn event(&mut self, event: Bytes, now: Instant) -> Option<Bytes> {
        let event = match &self.rename {
            Some(r) => r.apply(event),
            None => event,
        };
        match classify(&event) {
            EventKind::Tokens => {
                self.exchange.token_chunk(now);
                Some(event)
            }
            EventKind::Usage => {
                self.exchange.usage = parse_usage(&event);
                (!self.strip_usage).then_some(event)
            }
            EventKind::Done => {
                self.exchange.finished = true;
                Some(event)
            }
            EventKind::Other => Some(event),
        }
    }

    /// The next bytes for the client, or `None` at the end.
    pub async fn next(&mut self) -> Option<Result<Bytes, std::io::Error>> {
        if !self.pending.is_empty() {
            let mut out = BytesMut::new();
            for e in std::mem::take(&mut self.pending) {
                out.extend_from_slice(&e);
            }
            return Some(Ok(out.freeze()));
        }
        if self.done {
            return None;
        }
        loop {
            let now = Instant::now();
            let until = (now + self.idle).min(self.deadline);
            match tokio::time::timeout_at(until, self.upstream.frame()).await {
                Ok(Some(Ok(frame))) => {
                    let Ok(data) = frame.into_data() else { continue };
                    let now = Instant::now();
                    let mut events = Vec::new();
                    self.splitter.feed(&data, |e| events.push(e));
                    let mut out = BytesMut::new();
                    for e in events {
                        if let Some(b) = self.event(e, now) {
                            out.extend_from_slice(&b);
                        }
                    }
                    if !out.is_empty() {
                        return Some(Ok(out.freeze()));
                    }
                }
                Ok(None) => {
                    self.done = true;
                    let rest = self.splitter.rest();
                    if !self.exchange.finished {
                        // The upstream closed without `[DONE]`: tell the client rather than end quietly.
                        return Some(Ok(self.fail(
                            Cut::Upstream,
                            "the replica ended the stream early",
                            rest,
                        )));
                    }
                    return (!rest.is_empty()).then_some(Ok(rest));
                }
                Ok(Some(Err(e))) => {
                    self.done = true;
                    let msg = format!("the replica's stream failed: {e}");
                    return Some(Ok(self.fail(Cut::Upstream, &msg, Bytes::new())));
                }
                Err(_) => {
                    self.done = true;
                    let (cut, msg) = if Instant::now() >= self.deadline {
                        (
                            Cut::Deadline,
                            "the request's total time budget ran out".to_owned(),
                        )
                    } else {
                        (
                            Cut::StreamIdle,
                            format!("no chunk from the replica for {:?} (stream_idle)", self.idle),
                        )
                    };
                    return Some(Ok(self.fail(cut, &msg, Bytes::new())));
                }
            }
        }
    }

    /// Ends the stream with an SSE error event (after whatever partial bytes were pending).
    fn fail(&mut self, cut: Cut, message: &str, before: Bytes) -> Bytes {
        self.exchange.cut = Some(cut);
        let code = match cut {
            Cut::StreamIdle => "stream_idle_timeout",
            Cut::Deadline => "deadline_exceeded",
            Cut::Upstream | Cut::ClientDisconnect => "upstream_stream_error",
        };
        let err = GatewayError::upstream(code, message);
        let mut out = BytesMut::from(&before[..]);
        if !out.is_empty() && !out.ends_with(b"\n\n") {
            out.extend_from_slice(b"\n\n");
        }
        out.extend_from_slice(&err.sse_event());
        out.freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_anywhere_come_out_whole() {
        let stream = b"data: {\"a\":1}\n\ndata: {\"b\":2}\r\n\r\n: keep-alive\n\ndata: [DONE]\n\n";
        for cut in 0..stream.len() {
            let mut s = EventSplitter::default();
            let mut events = Vec::new();
            s.feed(&stream[..cut], |e| events.push(e));
            s.feed(&stream[cut..], |e| events.push(e));
            let joined: Vec<u8> = events.iter().flat_map(|e| e.to_vec()).collect();
            assert_eq!(joined, stream.to_vec(), "cut at {cut}");
            assert_eq!(events.len(), 4, "cut at {cut}");
            assert!(s.rest().is_empty());
        }
    }

    #[test]
    fn kinds_are_told_apart_without_parsing() {
        assert_eq!(classify(b"data: [DONE]\n\n"), EventKind::Done);
        assert_eq!(
            classify(
                br#"data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}}"#
            ),
            EventKind::Usage
        );
        assert_eq!(
            classify(br#"data: {"choices":[{"index":0,"delta":{"content":" hi"}}]}"#),
            EventKind::Tokens
        );
        assert_eq!(
            classify(br#"data: {"choices":[{"index":0,"text":"x"}]}"#),
            EventKind::Tokens
        );
        assert_eq!(
            classify(br#"data: {"choices":[{"delta":{"role":"assistant","content":""}}]}"#),
            EventKind::Other
        );
        assert_eq!(
            classify(br#"data: {"choices":[{"delta":{},"finish_reason":"stop"}]}"#),
            EventKind::Other
        );
        assert_eq!(classify(b": ping\n\n"), EventKind::Other);
    }

    #[test]
    fn the_public_model_name_replaces_the_upstream_one() {
        let r = Rename::new("spark-chat", "corp-chat");
        let e = Bytes::from_static(b"data: {\"id\":\"x\",\"model\":\"spark-chat\",\"choices\":[]}\n\n");
        assert_eq!(
            &r.apply(e)[..],
            b"data: {\"id\":\"x\",\"model\":\"corp-chat\",\"choices\":[]}\n\n"
        );
        let other = Bytes::from_static(b"data: {\"model\":\"other\"}\n\n");
        assert_eq!(r.apply(other.clone()), other);
    }

    #[test]
    fn usage_is_read_from_a_chunk_or_a_body() {
        let chunk = b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":5,\"total_tokens\":8}}\n\n";
        assert_eq!(parse_usage(chunk), Some((3, 5)));
        assert_eq!(
            parse_usage(br#"{"id":"x","usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}"#),
            Some((1, 2))
        );
        assert_eq!(parse_usage(b"not json"), None);
    }
}
