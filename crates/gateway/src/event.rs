//! One SSE event of an OpenAI stream, judged and rewritten without parsing its JSON: what kind it
//! is (tokens, usage, the end), the usage it carries, whether it is an error, and the public
//! model name put back where the replica wrote its own. The relay reads every event through here.

use bytes::{Bytes, BytesMut};
use memchr::memmem;

/// Needles built once: building a searcher costs more than searching one event.
struct Needles {
    usage: memmem::Finder<'static>,
    usage_key: memmem::FinderRev<'static>,
    no_choices: memmem::Finder<'static>,
    content: memmem::Finder<'static>,
    text: memmem::Finder<'static>,
    /// `"reasoning":"` (vLLM 0.32) and `"reasoning_content":"` (older) in one search.
    reasoning: memmem::Finder<'static>,
    tool_calls: memmem::Finder<'static>,
}

static NEEDLES: std::sync::LazyLock<Needles> = std::sync::LazyLock::new(|| Needles {
    usage: memmem::Finder::new(b"\"usage\":{"),
    usage_key: memmem::FinderRev::new(b"\"usage\":"),
    no_choices: memmem::Finder::new(b"\"choices\":[]"),
    content: memmem::Finder::new(b"\"content\":\""),
    text: memmem::Finder::new(b"\"text\":\""),
    reasoning: memmem::Finder::new(b"\"reasoning"),
    tool_calls: memmem::Finder::new(b"\"tool_calls\":["),
});

/// What one SSE event of an OpenAI stream is, judged without parsing its JSON.
#[derive(Debug, PartialEq, Eq)]
pub enum EventKind {
    Done,
    /// The usage-only chunk (`"choices":[]` with `usage`).
    Usage,
    /// A chunk carrying generated tokens: text, reasoning or tool calls.
    Tokens,
    /// Anything else: the role chunk, the finish chunk, comments, errors.
    Other,
}

pub fn classify(event: &[u8]) -> EventKind {
    // Blank lines before an event's fields dispatch nothing (a replica's stray extra line feeds
    // land there): `[DONE]` after them is still the end.
    let start = event.iter().position(|b| !matches!(b, b'\n' | b'\r'));
    let event = &event[start.unwrap_or(event.len())..];
    if event.starts_with(b"data: [DONE]") || event.starts_with(b"data:[DONE]") {
        return EventKind::Done;
    }
    let n = &*NEEDLES;
    // Text first: nearly every event carries some, and a usage-only chunk carries none (a chunk
    // with both, as vLLM's continuous usage stats send, counts as tokens either way). Reasoning
    // and tool calls are tokens too, searched last: a usage-only chunk has no choice to carry
    // them, and the events that carry them are the fewest.
    let not_empty = |f: &memmem::Finder<'_>, empty: u8| {
        f.find(event)
            .is_some_and(|p| event.get(p + f.needle().len()).is_some_and(|c| *c != empty))
    };
    let reasoning = || {
        n.reasoning.find(event).is_some_and(|p| {
            let rest = &event[p + n.reasoning.needle().len()..];
            let value = rest
                .strip_prefix(b"\":\"")
                .or_else(|| rest.strip_prefix(b"_content\":\""));
            value.and_then(|v| v.first()).is_some_and(|c| *c != b'"')
        })
    };
    if not_empty(&n.content, b'"') || not_empty(&n.text, b'"') {
        EventKind::Tokens
    } else if n.usage.find(event).is_some() && n.no_choices.find(event).is_some() {
        EventKind::Usage
    } else if reasoning() || not_empty(&n.tool_calls, b']') {
        EventKind::Tokens
    } else {
        EventKind::Other
    }
}

#[derive(serde::Deserialize)]
struct Usage {
    prompt_tokens: u32,
    /// Absent from an embeddings answer, which generates nothing.
    #[serde(default)]
    completion_tokens: u32,
}

/// Reads `prompt_tokens` and `completion_tokens` out of a usage chunk (or a whole response).
pub fn parse_usage(json: &[u8]) -> Option<(u32, u32)> {
    #[derive(serde::Deserialize)]
    struct WithUsage {
        usage: Option<Usage>,
    }
    let body = json.strip_prefix(b"data: ").unwrap_or(json).trim_ascii_end();
    if let Some(usage) = usage_last(body) {
        return Some(usage);
    }
    let parsed: WithUsage = serde_json::from_slice(body).ok()?;
    parsed.usage.map(|u| (u.prompt_tokens, u.completion_tokens))
}

/// The usage of a body whose last member is `"usage":{…}`, as vLLM and OpenAI write it, read
/// without parsing the rest (most of the work for a usage chunk): what comes before the
/// key is not checked. A usage elsewhere, nested deeper included (its object is not followed by
/// the body's end), is left to the whole parse.
fn usage_last(body: &[u8]) -> Option<(u32, u32)> {
    let key = NEEDLES.usage_key.rfind(body)?;
    let from = key + NEEDLES.usage_key.needle().len();
    let (usage, len) = match flat_usage(&body[from..]) {
        Some(read) => read,
        None => {
            let mut objects = serde_json::Deserializer::from_slice(&body[from..]).into_iter::<Usage>();
            let usage = objects.next()?.ok()?;
            (
                (usage.prompt_tokens, usage.completion_tokens),
                objects.byte_offset(),
            )
        }
    };
    (body[from + len..].trim_ascii() == b"}").then_some(usage)
}

/// A usage object read without serde (fewer instructions per usage chunk:
/// bench/runs/2026-12-03-rust-2core-hand-written-readers.md), and how many bytes it took, where
/// it is as plain as vLLM and OpenAI write it: members whose values are whole numbers, `null`, or
/// objects of those
/// (`prompt_tokens_details`). Anything else, however valid, is `None`, and serde reads it
/// instead: this never accepts what serde would refuse (a test holds the two equal).
fn flat_usage(json: &[u8]) -> Option<((u32, u32), usize)> {
    let (mut prompt, mut completion) = (None, None);
    let mut fields = |key: &[u8], value: Option<u64>| {
        let slot = match key {
            b"prompt_tokens" => &mut prompt,
            b"completion_tokens" => &mut completion,
            _ => return true,
        };
        // Twice, or not a u32: serde's to judge.
        let value = value.and_then(|v| u32::try_from(v).ok());
        if slot.is_some() || value.is_none() {
            return false;
        }
        *slot = value;
        true
    };
    let end = members(json, 0, 0, &mut fields)?;
    Some(((prompt?, completion?), end))
}

/// The members of the object at `json[at..]` (after blanks), each key with its value when that
/// is a whole number; nested objects, to one level, are passed over. Where the object ends, or
/// `None` for anything else, or when `each` says false.
fn members(
    json: &[u8],
    at: usize,
    depth: u8,
    each: &mut dyn FnMut(&[u8], Option<u64>) -> bool,
) -> Option<usize> {
    let blanks = |mut at: usize| {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = json.get(at) {
            at += 1;
        }
        at
    };
    // The index just past `b`, the next byte after blanks.
    let past = |at: usize, b: u8| {
        let at = blanks(at);
        (json.get(at) == Some(&b)).then_some(at + 1)
    };
    let mut at = past(at, b'{')?;
    if let Some(end) = past(at, b'}') {
        return Some(end);
    }
    loop {
        at = past(at, b'"')?;
        // An escape, a control character or a byte outside ASCII ends the plain reading.
        let len = json[at..]
            .iter()
            .position(|b| *b == b'"' || *b == b'\\' || *b < 0x20 || *b >= 0x80)?;
        let key = &json[at..at + len];
        at = past(at + len, b'"')?;
        at = blanks(past(at, b':')?);
        let value = match *json.get(at)? {
            b'0'..=b'9' => {
                let digits = json[at..].iter().take_while(|b| b.is_ascii_digit()).count();
                // JSON has no leading zeros; a fraction or an exponent goes to serde.
                if digits > 15 || (digits > 1 && json[at] == b'0') {
                    return None;
                }
                let n = json[at..at + digits]
                    .iter()
                    .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
                at += digits;
                if let Some(b'.' | b'e' | b'E') = json.get(at) {
                    return None;
                }
                Some(n)
            }
            b'n' if json[at..].starts_with(b"null") => {
                at += 4;
                None
            }
            b'{' if depth == 0 => {
                at = members(json, at, 1, &mut |_, _| true)?;
                None
            }
            _ => return None,
        };
        if !each(key, value) {
            return None;
        }
        at = blanks(at);
        match json.get(at)? {
            b',' => at += 1,
            b'}' => return Some(at + 1),
            _ => return None,
        }
    }
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

    /// Appends `event` to `out` with the name replaced, without copying it twice.
    pub(crate) fn append(&self, event: &[u8], out: &mut BytesMut) {
        match self.from.find(event) {
            Some(pos) => {
                out.extend_from_slice(&event[..pos]);
                out.extend_from_slice(&self.to);
                out.extend_from_slice(&event[pos + self.from.needle().len()..]);
            }
            None => out.extend_from_slice(event),
        }
    }

    pub fn apply(&self, body: Bytes) -> Bytes {
        if self.from.find(&body).is_none() {
            return body;
        }
        let mut out = BytesMut::with_capacity(body.len() + self.to.len());
        self.append(&body, &mut out);
        out.freeze()
    }
}

/// Whether an SSE event is an error object (`data: {"error": …}`), as vLLM and OpenAI send
/// one inside a 200 stream.
pub(crate) fn is_error_event(event: &[u8]) -> bool {
    let blank = |b: &u8| b.is_ascii_whitespace();
    let start = event.iter().position(|b| !blank(b)).unwrap_or(event.len());
    let Some(data) = event[start..].strip_prefix(b"data:") else {
        return false;
    };
    let start = data.iter().position(|b| !blank(b)).unwrap_or(data.len());
    let Some(object) = data[start..].strip_prefix(b"{") else {
        return false;
    };
    let start = object.iter().position(|b| !blank(b)).unwrap_or(object.len());
    object[start..].starts_with(b"\"error\"")
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

impl EarlyError {
    pub(crate) fn parse(event: &[u8]) -> EarlyError {
        let start = event
            .iter()
            .position(|b| !b.is_ascii_whitespace())
            .unwrap_or(event.len());
        let data = event[start..].strip_prefix(b"data:").unwrap_or(&event[start..]);
        let body = data.trim_ascii();
        let code = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v.pointer("/error/code").cloned());
        let status = match code {
            Some(serde_json::Value::Number(n)) => n.as_u64(),
            Some(serde_json::Value::String(s)) => s.parse().ok(),
            _ => None,
        };
        EarlyError {
            status: status
                .and_then(|s| u16::try_from(s).ok())
                .filter(|s| (400..600).contains(s))
                .and_then(|s| axum::http::StatusCode::from_u16(s).ok()),
            body: Bytes::copy_from_slice(body),
        }
    }
}

#[cfg(test)]
mod tests;
