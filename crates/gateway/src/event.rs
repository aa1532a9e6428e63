//! One SSE event of an OpenAI stream, or a whole answer, as the relay reads it: what kind it is
//! (tokens, usage, the end, an error), the usage it carries, and the public model name put back
//! where the replica wrote its own. The reading is `protocol::judge`'s — one parse of the event's
//! data, whatever the replica's JSON style or line ends — shared with the load tester.

use bytes::{Bytes, BytesMut};
use protocol::agents::{self, Dialect};
use protocol::judge::{self, Data, Judgement};

pub use protocol::judge::Kind as EventKind;

/// One event, judged once: everything the relay does with it reads this.
pub struct Event<'a> {
    raw: &'a [u8],
    judgement: Judgement,
    data: Option<Data<'a>>,
    /// The agents' API it is in; `None` for OpenAI's completions.
    dialect: Option<Dialect>,
    /// The response or message it announces (an agents' stream's first event names it).
    named: Option<String>,
}

impl<'a> Event<'a> {
    pub fn read(raw: &'a [u8]) -> Event<'a> {
        let (judgement, data) = judge::judge(raw);
        Event {
            raw,
            judgement,
            data,
            dialect: None,
            named: None,
        }
    }

    /// An event of a stream in `dialect` (an agents' API), or of OpenAI's completions.
    pub fn read_in(dialect: Option<Dialect>, raw: &'a [u8]) -> Event<'a> {
        let Some(d) = dialect else {
            return Event::read(raw);
        };
        let data = judge::data(raw);
        let (judgement, named) = match &data {
            Some(data) => agents::judge_event(d, data.bytes()),
            None => agents::judge_event(d, b""),
        };
        Event {
            raw,
            judgement,
            data,
            dialect,
            named,
        }
    }

    /// The id of the response or message the event announces, if it does.
    pub fn named(&self) -> Option<&str> {
        self.named.as_deref()
    }

    pub fn kind(&self) -> EventKind {
        self.judgement.kind
    }

    /// The event's data (its JSON), empty for an event without data.
    pub fn data(&self) -> &[u8] {
        self.data.as_ref().map_or(&[][..], Data::bytes)
    }

    /// `(prompt, completion)` from the event's `usage`, if it has one the gateway can count: the
    /// usage chunk's, or a chunk's that counts what was generated so far (vLLM's continuous usage
    /// stats); a count of the prompt alone on a token's chunk is not taken for "nothing
    /// generated".
    pub fn usage(&self) -> Option<(u32, u32)> {
        let u = self.judgement.usage?;
        if self.kind() != EventKind::Usage && u.completion_tokens.is_none() {
            return None;
        }
        u.pair()
    }

    /// The event as an answer in place of the stream: the status its error's `code` names, and
    /// its JSON as the body.
    pub(crate) fn early_error(&self) -> EarlyError {
        let body = self.data().trim_ascii();
        EarlyError {
            status: self
                .judgement
                .error
                .as_ref()
                .and_then(|e| e.status)
                .and_then(|s| axum::http::StatusCode::from_u16(s).ok()),
            body: Bytes::copy_from_slice(body),
        }
    }

    /// Appends the event to `out`, the public model name in place of the replica's.
    pub fn append(&self, rename: Option<&Rename>, out: &mut BytesMut) {
        let (Some(r), Some(data)) = (rename, self.data.as_ref()) else {
            out.extend_from_slice(self.raw);
            return;
        };
        if self.dialect.is_some() {
            let renamed = memchr::memmem::find(data.bytes(), r.upstream.as_bytes())
                .and_then(|_| agents::renamed(data.bytes(), &r.upstream, &r.public_name));
            match renamed {
                Some(new) => write_data(self.raw, &new, out),
                None => out.extend_from_slice(self.raw),
            }
            return;
        }
        let models = &self.judgement.models;
        if let Data::Line { at, .. } = data {
            // The name spliced straight into `out`: no copy of the event but the one.
            let mut copied = 0;
            for span in judge::matching(data.bytes(), models, &r.upstream) {
                out.extend_from_slice(&self.raw[copied..at + span.start]);
                out.extend_from_slice(&r.public);
                copied = at + span.end;
            }
            out.extend_from_slice(&self.raw[copied..]);
            return;
        }
        match judge::renamed(data.bytes(), models, &r.upstream, &r.public) {
            None => out.extend_from_slice(self.raw),
            Some(new) => write_data(self.raw, &new, out),
        }
    }
}

/// `raw`, an event, with `new` as its data: its other fields as they were, then the new data, a
/// `data:` line per line of it, and the blank line.
fn write_data(raw: &[u8], new: &[u8], out: &mut BytesMut) {
    for (_, line) in judge::lines(raw) {
        if !line.is_empty() && !line.starts_with(b"data") {
            out.extend_from_slice(line);
            out.extend_from_slice(b"\n");
        }
    }
    for line in new.split(|b| *b == b'\n') {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(line);
        out.extend_from_slice(b"\n");
    }
    out.extend_from_slice(b"\n");
}

/// Reads a stream's events, each as [`Event::read`] would, with a short way for the common case:
/// a replica writes every token's chunk with the same bytes around its text (vLLM: the same id,
/// time, model and choice), so a chunk that differs from the last one read in full only inside
/// that text — and there by characters that need no escape — is judged as that one was, without
/// a parse. Anything else is read in full (and becomes the template when it can).
#[derive(Default)]
pub struct Reader {
    /// Boxed: the relay's state stays small, and a stream allocates it once or twice.
    template: Option<Box<Template>>,
    /// The agents' API the stream is in, read by its own rules (no short way).
    dialect: Option<Dialect>,
    /// Messages: the prompt's count from `message_start`, for a `message_delta` that gives only
    /// the output's (as Anthropic's own API writes it).
    prompt_tokens: Option<u32>,
}

/// The last event read in full whose bytes a next chunk may share.
struct Template {
    raw: Vec<u8>,
    judgement: Judgement,
    /// Where its data begins, and how long it is.
    at: usize,
    len: usize,
    /// Where its token string lies in `raw`.
    token: std::ops::Range<usize>,
}

impl Reader {
    /// A reader of a stream in `dialect` (an agents' API), or of OpenAI's completions.
    pub fn new(dialect: Option<Dialect>) -> Reader {
        Reader {
            dialect,
            ..Reader::default()
        }
    }

    pub fn read<'a>(&mut self, raw: &'a [u8]) -> Event<'a> {
        if self.dialect.is_some() {
            let mut e = Event::read_in(self.dialect, raw);
            if let Some(u) = e.judgement.usage.as_mut() {
                match (u.prompt_tokens, u.completion_tokens) {
                    (Some(p), None) => self.prompt_tokens = Some(p),
                    (None, Some(_)) => u.prompt_tokens = self.prompt_tokens,
                    _ => {}
                }
            }
            return e;
        }
        if let Some(e) = self.short(raw) {
            return e;
        }
        let event = Event::read(raw);
        let kept = self.template.take();
        if let (Some(Data::Line { value, at }), Some(token)) = (&event.data, &event.judgement.token) {
            let j = &event.judgement;
            // The spans a judgement carries (id, model) must stand before the token's string,
            // where a chunk read the short way has the same bytes.
            let before = |r: &std::ops::Range<usize>| r.end <= token.start;
            if j.id.as_ref().is_none_or(before) && j.models.iter().flatten().all(before) {
                let mut t = kept.unwrap_or_else(|| {
                    Box::new(Template {
                        raw: Vec::new(),
                        judgement: j.clone(),
                        at: 0,
                        len: 0,
                        token: 0..0,
                    })
                });
                t.raw.clear();
                t.raw.extend_from_slice(raw);
                t.judgement = j.clone();
                t.at = *at;
                t.len = value.len();
                t.token = at + token.start..at + token.end;
                self.template = Some(t);
            }
        }
        event
    }

    fn short<'a>(&self, raw: &'a [u8]) -> Option<Event<'a>> {
        let Template {
            raw: t,
            judgement,
            at,
            len,
            token,
        } = self.template.as_deref()?;
        let tail = &t[token.end..];
        if raw.len() <= token.start + tail.len()
            || raw[..token.start] != t[..token.start]
            || !raw.ends_with(tail)
        {
            return None;
        }
        let text = &raw[token.start..raw.len() - tail.len()];
        // A JSON string's inside as it stands: no quote, no escape, no control character, UTF-8.
        if text.iter().any(|b| *b < 0x20 || *b == b'"' || *b == b'\\') || std::str::from_utf8(text).is_err() {
            return None;
        }
        let len = len + raw.len() - t.len();
        Some(Event {
            raw,
            judgement: judgement.clone(),
            data: Some(Data::Line {
                value: &raw[*at..at + len],
                at: *at,
            }),
            dialect: None,
            named: None,
        })
    }
}

/// What kind of event `event` is (the benches and fuzz targets ask this alone).
pub fn classify(event: &[u8]) -> EventKind {
    Event::read(event).kind()
}

/// A whole (non-streamed) answer: its usage, and its body with the public model name put back,
/// from one parse.
pub fn read_whole(body: Bytes, rename: Option<&Rename>) -> (Bytes, Option<(u32, u32)>) {
    let whole = read_whole_in(None, body, rename);
    (whole.body, whole.usage)
}

/// A non-streamed answer, read: its body with the public model name, its usage, and the id of
/// the response it made (the agents' APIs).
pub struct Whole {
    pub body: Bytes,
    pub usage: Option<(u32, u32)>,
    pub made: Option<String>,
}

/// A whole answer in `dialect` (an agents' API's, or OpenAI's completions').
pub fn read_whole_in(dialect: Option<Dialect>, body: Bytes, rename: Option<&Rename>) -> Whole {
    if let Some(d) = dialect {
        let (j, made) = agents::judge_answer(d, &body);
        let usage = j.usage.and_then(|u| u.pair());
        let renamed = rename.and_then(|r| agents::renamed(&body, &r.upstream, &r.public_name));
        return Whole {
            body: renamed.map_or(body, Bytes::from),
            usage,
            made,
        };
    }
    let j = judge::judge_whole(&body);
    let usage = j.usage.and_then(|u| u.pair());
    let body = match rename.and_then(|r| judge::renamed(&body, &j.models, &r.upstream, &r.public)) {
        Some(new) => Bytes::from(new),
        None => body,
    };
    Whole {
        body,
        usage,
        made: None,
    }
}

/// Reads `prompt_tokens` and `completion_tokens` out of a whole answer.
pub fn parse_usage(json: &[u8]) -> Option<(u32, u32)> {
    judge::judge_whole(json).usage.and_then(|u| u.pair())
}

/// Puts the public model name back where the replica wrote its own (the top-level `model`), so
/// that clients see the name they asked for.
#[derive(Debug, Clone)]
pub struct Rename {
    upstream: String,
    /// The public name as a JSON string, quotes included.
    public: Vec<u8>,
    /// The public name as it is.
    public_name: String,
}

impl Rename {
    pub fn new(upstream: &str, public: &str) -> Rename {
        Rename {
            upstream: upstream.to_owned(),
            public: serde_json::Value::from(public).to_string().into_bytes(),
            public_name: public.to_owned(),
        }
    }

    /// A whole answer with the name replaced.
    pub fn apply(&self, body: Bytes) -> Bytes {
        read_whole(body, Some(self)).0
    }
}

/// An SSE error event that came in place of a stream's first token: vLLM refuses a request its
/// full queue (`--max-num-queued-reqs`) cannot take so, inside a `200 text/event-stream`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EarlyError {
    /// The status its `code` names (an integer, or digits in a string); `None` if it names none.
    pub(crate) status: Option<axum::http::StatusCode>,
    /// The event's JSON (`{"error": …}`), to relay as a body.
    pub(crate) body: Bytes,
}

/// Holds the reading of `bytes` (as one event, and as the events the splitter cuts them into) to a
/// parse's (`protocol::judge::check`), and the rewrite of each event with a rename to the same
/// parse but for the model. Panics on a disagreement: the `sse_judge` fuzz target and the tests
/// replaying its corpus call it.
pub fn check(bytes: &[u8]) {
    use protocol::judge::reference;
    judge::check(bytes);
    let mut events = Vec::new();
    let mut s = protocol::sse::EventSplitter::default();
    s.feed(bytes, |e| events.push(e));
    events.push(s.rest());
    // The stream's reader, short way included, reads each as a parse does.
    let mut reader = Reader::default();
    for e in &events {
        let read = reader.read(e);
        let data = read.data();
        let ours = reference::Summary {
            kind: read.kind(),
            usage: read.judgement.usage,
            error: read.judgement.error.clone(),
            id: read.judgement.id(data),
            model: read.judgement.models.last(data),
        };
        assert_eq!(
            ours,
            reference::judge(e),
            "read in a stream: {:?}",
            String::from_utf8_lossy(e)
        );
    }
    for e in events {
        judge::check(&e);
        let before = reference::judge(&e);
        let from = before.model.clone().unwrap_or_else(|| "up".into());
        let mut out = BytesMut::new();
        Event::read(&e).append(Some(&Rename::new(&from, "public")), &mut out);
        let after = reference::judge(&out);
        let expected = reference::Summary {
            model: before.model.as_ref().map(|_| "public".to_owned()),
            ..before
        };
        assert_eq!(
            after,
            expected,
            "{:?} became {:?}",
            String::from_utf8_lossy(&e),
            String::from_utf8_lossy(&out)
        );
    }
}

/// The agents' streams' counterpart of [`check`]: `bytes` as events of each agents' API, read
/// as the relay reads them, then renamed and appended; the rewritten event is read the same
/// (kind, usage, error, the response it names), and every `model` it held that named the replica's
/// model names the public one. Panics on a difference: the `agents_judge` fuzz target calls it.
pub fn check_agents(bytes: &[u8]) {
    for dialect in [Dialect::Responses, Dialect::Messages] {
        let mut events = Vec::new();
        let mut s = protocol::sse::EventSplitter::default();
        s.feed(bytes, |e| events.push(e));
        events.push(s.rest());
        let rename = Rename::new("up", "public");
        for e in &events {
            let read = Event::read_in(Some(dialect), e);
            let mut out = BytesMut::new();
            read.append(Some(&rename), &mut out);
            let again = Event::read_in(Some(dialect), &out);
            assert_eq!(
                (
                    &read.judgement.kind,
                    &read.judgement.usage,
                    &read.judgement.error,
                    &read.named
                ),
                (
                    &again.judgement.kind,
                    &again.judgement.usage,
                    &again.judgement.error,
                    &again.named
                ),
                "{dialect:?}: {:?} became {:?}",
                String::from_utf8_lossy(e),
                String::from_utf8_lossy(&out)
            );
            let models = |data: &[u8]| -> Vec<Option<String>> {
                let v: serde_json::Value = serde_json::from_slice(data).unwrap_or_default();
                let at = |p: Option<&serde_json::Value>| {
                    p.and_then(|x| x.get("model"))
                        .and_then(|m| m.as_str())
                        .map(str::to_owned)
                };
                vec![at(Some(&v)), at(v.get("response")), at(v.get("message"))]
            };
            if out[..] != e[..] {
                let (before, after) = (models(read.data()), models(again.data()));
                for (b, a) in before.iter().zip(&after) {
                    let expected = b
                        .as_ref()
                        .map(|m| if m == "up" { "public".to_owned() } else { m.clone() });
                    assert_eq!(a, &expected, "{dialect:?}: {:?}", String::from_utf8_lossy(&out));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
