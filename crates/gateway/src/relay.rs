//! Stage 10: the answer. A stream's response head is held until the upstream's first token (so a
//! failure before it, an error event included, is still a clean status), then the stream is relayed without buffering: all
//! the bytes ready when the relay wakes go out in one write (the first token's, with the head, may
//! go out ahead of what was read with it: `front`), each SSE event is timed (TTFT, ITL),
//! the usage chunk is read (and dropped if the client did not ask for it), and a stall, a failure,
//! the total budget or the end of a drain ends it with an SSE error event.

use crate::error::GatewayError;
use crate::outcome::{Cut, Ending, Exchange};
use crate::upstream::h1::{self, Body, Pieces, Read};
use bytes::{Bytes, BytesMut};
use memchr::memmem;
use protocol::sse::EventSplitter;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};

/// The relay's output buffer: about eight events' worth, reused write after write.
const OUT_CAPACITY: usize = 2 * 1024;

/// One SSE event from a replica may be at most this large (a token's event with 20 top logprobs
/// is a few KiB): past it, the stream ends rather than hold an event that never ends.
const MAX_EVENT: usize = 1024 * 1024;

/// After `[DONE]`, how long the replica has to end its body before the stream is ended for it:
/// the client has its whole answer, and its slot is not held for `stream_idle` meanwhile.
const DONE_GRACE: Duration = Duration::from_secs(1);

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
/// without parsing the rest (three quarters of the work for a usage chunk): what comes before the
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

/// A usage object read without serde (2,021 → 1,602 instructions for a stream's usage chunk,
/// under callgrind), and how many bytes it took, where it is as plain as vLLM and OpenAI write
/// it: members whose values are whole numbers, `null`, or objects of those
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
    fn append(&self, event: &[u8], out: &mut BytesMut) {
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

/// A stream's upstream side and what the client gets of it: the replica's body, the splitter,
/// how events are passed on, and the bytes not yet written. [`open`] fills it until the first
/// event; the [`Relay`] then owns it.
pub(crate) struct Events {
    upstream: Body,
    splitter: EventSplitter,
    /// Shared with the route: a `Rename` (a searcher and two names) is ten times the pointer.
    rename: Option<Arc<Rename>>,
    strip_usage: bool,
    /// Bytes for the client, until written: the front writes them from here and clears them,
    /// hyper's body takes them as pieces split off the front.
    out: BytesMut,
    /// An error event that came before any token ([`open`] answers it in place of the stream).
    early_error: Option<Bytes>,
}

/// What one read of the upstream brought.
struct Got {
    read: Read,
    /// When its data came; events handed over together share it (docs/metrics.md on ITL).
    at: Option<Instant>,
    /// It brought an event with tokens, usage or the end (or an error before them).
    token: bool,
}

impl Events {
    /// One read of the upstream, each event it completes passed on (timed, its usage read,
    /// renamed) into `out`; if `until_token`, only what the read brought up to the first event
    /// with tokens, usage or the end.
    fn poll_read(
        &mut self,
        cx: &mut Context<'_>,
        ex: &mut Exchange,
        until_token: bool,
    ) -> Poll<Result<Got, h1::Error>> {
        let Events {
            upstream,
            splitter,
            rename,
            strip_usage,
            out,
            early_error,
        } = self;
        let mut at = None;
        let token = std::cell::Cell::new(false);
        let each = &mut |data: &[u8]| {
            let now = *at.get_or_insert_with(Instant::now);
            // Room for what this piece's events become, taken at once: growing `out` event by
            // event would copy what it holds each time it doubles. An empty buffer too small is
            // replaced, not grown (a reallocation copies the old room, used or not).
            if out.capacity() - out.len() < data.len() {
                if out.is_empty() {
                    *out = BytesMut::with_capacity(data.len().max(OUT_CAPACITY));
                } else {
                    out.reserve(data.len());
                }
            }
            splitter.feed_slices(data, |e| {
                if early_error.is_some() {
                    return;
                }
                // Only before the first token (`open`'s reads): an error there is answered as
                // the status it names, so it is kept back rather than passed on.
                if until_token && !token.get() && is_error_event(e) {
                    *early_error = Some(Bytes::copy_from_slice(e));
                    token.set(true);
                    return;
                }
                if pass_on(ex, e, now, rename.as_deref(), *strip_usage, out) != EventKind::Other {
                    token.set(true);
                }
            });
        };
        let pieces = if until_token {
            Pieces::Until(&token)
        } else {
            Pieces::All
        };
        let read = upstream.poll_pieces(cx, each, pieces);
        let token = token.get();
        read.map(|r| r.map(|read| Got { read, at, token }))
    }

    /// An event still incomplete has passed [`MAX_EVENT`].
    fn event_too_large(&self) -> bool {
        self.splitter.held() > MAX_EVENT
    }
}

/// Whether an SSE event is an error object (`data: {"error": …}`), as vLLM and OpenAI send
/// one inside a 200 stream.
fn is_error_event(event: &[u8]) -> bool {
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
    pub(crate) status: Option<u16>,
    /// The event's JSON (`{"error": …}`), to relay as a body.
    pub(crate) body: Bytes,
}

impl EarlyError {
    fn parse(event: &[u8]) -> EarlyError {
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
                .filter(|s| (400..600).contains(s)),
            body: Bytes::copy_from_slice(body),
        }
    }
}

/// What the upstream's stream began with.
pub(crate) enum Opened {
    /// Its first event (a token, or the events before it): the stream goes on.
    Stream(Events),
    /// An error event before any token, which the client never sees as a stream.
    Error(EarlyError),
}

/// Waits for the upstream's first event with tokens (or usage, or the end), at most until
/// `deadline` (the end of the `budget` for the first token), and handles the events read
/// meanwhile as the relay would; those before it (a role chunk sent ahead, comments) are held
/// with the head, so that an error event after them is still answered as its status.
pub(crate) async fn open(
    upstream: Body,
    rename: Option<Arc<Rename>>,
    strip_usage: bool,
    ex: &mut Exchange,
    deadline: Instant,
    budget: Duration,
) -> Result<Opened, GatewayError> {
    let mut events = Events {
        upstream,
        splitter: EventSplitter::default(),
        rename,
        strip_usage,
        out: BytesMut::with_capacity(OUT_CAPACITY),
        early_error: None,
    };
    loop {
        // The first event with tokens (or the end) goes out with the head as soon as it is
        // whole, with what came before it (a role chunk, comments); events that came after it in
        // the same read wait for the relay, which passes them on straight after.
        let read = std::future::poll_fn(|cx| events.poll_read(cx, ex, true));
        match tokio::time::timeout_at(deadline, read).await {
            Ok(Ok(_)) if events.early_error.is_some() => {
                let event = events.early_error.take().unwrap_or_default();
                return Ok(Opened::Error(EarlyError::parse(&event)));
            }
            Ok(Ok(_)) if events.event_too_large() => {
                return Err(GatewayError::upstream("upstream_error", too_large_message()));
            }
            // What comes ahead of the first token is held with the head: as much as one event.
            Ok(Ok(Got {
                read: Read::Data,
                token: false,
                ..
            })) if events.out.len() > MAX_EVENT => {
                return Err(GatewayError::upstream(
                    "upstream_error",
                    format!(
                        "the replica sent over {} KiB before its first token",
                        MAX_EVENT / 1024
                    ),
                ));
            }
            Ok(Ok(Got {
                read: Read::Data,
                token: false,
                ..
            })) => {}
            Ok(Ok(Got { read: Read::Data, .. })) => return Ok(Opened::Stream(events)),
            Ok(Ok(Got { read: Read::End, .. })) => {
                return Err(GatewayError::upstream(
                    "upstream_error",
                    "the replica closed the stream before the first token",
                ));
            }
            Ok(Err(e)) => {
                return Err(GatewayError::upstream(
                    "upstream_error",
                    format!("the replica's stream failed before the first token: {e}"),
                ));
            }
            Err(_) => return Err(GatewayError::FirstTokenTimeout(budget)),
        }
    }
}

/// Handles one complete event at `now`: times it, reads its usage, and appends what the client
/// gets of it to `out`. Returns what kind of event it was.
fn pass_on(
    ex: &mut Exchange,
    event: &[u8],
    now: Instant,
    rename: Option<&Rename>,
    strip_usage: bool,
    out: &mut BytesMut,
) -> EventKind {
    let kind = classify(event);
    match kind {
        EventKind::Tokens => ex.token_chunk(now),
        EventKind::Usage => {
            ex.usage = parse_usage(event);
            if strip_usage {
                return kind;
            }
        }
        EventKind::Done => ex.end(Ending::Finished, 200),
        EventKind::Other => {}
    }
    if matches!(ex.trace, crate::traces::Trace::Record(_)) {
        ex.trace.finish_reasons(event);
    }
    match rename {
        Some(r) => r.append(event, out),
        None => out.extend_from_slice(event),
    }
    kind
}

fn too_large_message() -> String {
    format!("the replica sent an SSE event over {} KiB", MAX_EVENT / 1024)
}

/// Reads a non-streamed answer whole within the total budget and `limit` bytes
/// (`server.max_response_bytes`).
pub(crate) async fn whole(
    upstream: Body,
    deadline: Instant,
    budget: Duration,
    limit: usize,
    rename: Option<&Rename>,
) -> Result<Bytes, GatewayError> {
    let body = collect(upstream, deadline, limit, GatewayError::DeadlineExceeded(budget)).await?;
    Ok(match rename {
        Some(r) => r.apply(body),
        None => body,
    })
}

/// A replica's body, whole, by `deadline` (else `late`) and within `limit` bytes.
pub(crate) async fn collect(
    upstream: Body,
    deadline: Instant,
    limit: usize,
    late: GatewayError,
) -> Result<Bytes, GatewayError> {
    match tokio::time::timeout_at(deadline, upstream.collect(limit)).await {
        Ok(Ok(body)) => Ok(body),
        Ok(Err(h1::Error::TooLarge(limit))) => Err(GatewayError::upstream(
            "upstream_response_too_large",
            format!("the replica's answer is over {limit} bytes (server.max_response_bytes)"),
        )),
        Ok(Err(e)) => Err(GatewayError::upstream(
            "upstream_error",
            format!("the replica's answer failed: {e}"),
        )),
        Err(_) => Err(late),
    }
}

/// What a relayed stream needs to know besides its bytes.
pub(crate) struct RelayConfig {
    pub(crate) idle: Duration,
    pub(crate) deadline: Instant,
    /// Turns true when the gateway's drain runs out: open streams end with an error event.
    pub(crate) stop: watch::Receiver<bool>,
}

/// Resolves when the drain runs out; never if the gateway that would say so is gone.
async fn stopped(mut stop: watch::Receiver<bool>) {
    if stop.wait_for(|stop| *stop).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// What can end a stream besides its upstream: the idle/total timer and the drain's signal.
/// Each is polled (which registers the task's waker) once per setting, and later wake-ups read
/// its state: a chunk then costs no timer update and no lock on the signal's waiter list.
struct Alarms {
    /// Set at the idle or total deadline, and moved only when it fires early.
    timer: Pin<Box<Sleep>>,
    timer_armed: bool,
    stop: Pin<Box<dyn Future<Output = ()> + Send>>,
    stop_seen: watch::Receiver<bool>,
    stop_waiting: bool,
}

impl Alarms {
    fn new(at: Instant, stop: watch::Receiver<bool>) -> Alarms {
        Alarms {
            timer: Box::pin(tokio::time::sleep_until(at)),
            timer_armed: false,
            stop_seen: stop.clone(),
            stop: Box::pin(stopped(stop)),
            stop_waiting: false,
        }
    }

    /// Whether the drain has run out.
    fn stopping(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.stop_waiting {
            // A poll made once the task's budget is spent returns Pending without registering
            // anything (tokio's coop); it counts as waiting only if it could register.
            self.stop_waiting = tokio::task::coop::has_budget_remaining();
            return self.stop.as_mut().poll(cx).is_ready();
        }
        self.stop_seen.has_changed().unwrap_or(false) && self.stop.as_mut().poll(cx).is_ready()
    }

    /// Whether the timer has fired.
    fn timer_due(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.timer_armed {
            self.timer_armed = tokio::task::coop::has_budget_remaining();
            return self.timer.as_mut().poll(cx).is_ready();
        }
        self.timer.is_elapsed() && self.timer.as_mut().poll(cx).is_ready()
    }

    fn reset(&mut self, at: Instant) {
        self.timer.as_mut().reset(at);
        self.timer_armed = false;
    }
}

/// The state of one relayed stream, which is the response body's stream; dropping it (the client
/// left) drops the upstream body, whose connection closes, which makes the replica abort the
/// request.
pub(crate) struct Relay {
    events: Events,
    exchange: Exchange,
    idle: Duration,
    deadline: Instant,
    /// When the last data came: `stream_idle` counts from here.
    last_read: Instant,
    alarms: Alarms,
    done: bool,
    /// Once `[DONE]` has come, when the body must have ended.
    done_by: Option<Instant>,
}

impl Relay {
    pub(crate) fn new(events: Events, config: RelayConfig, exchange: Exchange) -> Relay {
        let now = Instant::now();
        Relay {
            events,
            exchange,
            idle: config.idle,
            deadline: config.deadline,
            last_read: now,
            alarms: Alarms::new((now + config.idle).min(config.deadline), config.stop),
            done: false,
            done_by: None,
        }
    }

    /// Ready once there are bytes for the client in [`Relay::out`] or the stream has ended
    /// ([`Relay::is_done`]; both can hold): everything the upstream has ready when the relay
    /// wakes (what one read of its connection brings), without ever waiting for more.
    pub(crate) fn poll_out(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if !self.events.out.is_empty() || self.done {
            return Poll::Ready(());
        }
        loop {
            if self.alarms.stopping(cx) {
                self.fail(
                    Cut::DrainTimeout,
                    "gateway_shutdown",
                    "the gateway is shutting down and its drain time ran out",
                );
                return Poll::Ready(());
            }
            match self.events.poll_read(cx, &mut self.exchange, false) {
                Poll::Ready(Ok(Got {
                    read: Read::Data, at, ..
                })) => {
                    if let Some(at) = at {
                        self.last_read = at;
                    }
                    if self.exchange.ended() && self.done_by.is_none() {
                        // `[DONE]` has come: the body's end should follow at once.
                        let by = (self.last_read + DONE_GRACE).min(self.deadline);
                        self.done_by = Some(by);
                        self.alarms.reset(by);
                    }
                    if self.events.event_too_large() {
                        // What came before it goes out, then the error event.
                        self.fail(Cut::Upstream, "upstream_stream_error", &too_large_message());
                        return Poll::Ready(());
                    }
                    if !self.events.out.is_empty() {
                        return Poll::Ready(());
                    }
                }
                Poll::Ready(Ok(Got { read: Read::End, .. })) => {
                    self.ended();
                    return Poll::Ready(());
                }
                Poll::Ready(Err(e)) => {
                    let msg = format!("the replica's stream failed: {e}");
                    self.fail(Cut::Upstream, "upstream_stream_error", &msg);
                    return Poll::Ready(());
                }
                Poll::Pending => {
                    if !self.alarms.timer_due(cx) {
                        return Poll::Pending;
                    }
                    let now = Instant::now();
                    if let Some(by) = self.done_by
                        && now >= by
                    {
                        // The client has its whole stream: it ends as if the body had, and the
                        // replica's connection, its body unfinished, is closed.
                        self.done = true;
                        self.exchange.record.note = Some("upstream_body_not_ended");
                        return Poll::Ready(());
                    }
                    if now >= self.deadline {
                        self.fail(
                            Cut::Deadline,
                            "deadline_exceeded",
                            "the request's total time budget ran out",
                        );
                        return Poll::Ready(());
                    }
                    let due = (self.last_read + self.idle)
                        .min(self.deadline)
                        .min(self.done_by.unwrap_or(self.deadline));
                    if now >= due {
                        let msg = format!("no chunk from the replica for {:?} (stream_idle)", self.idle);
                        self.fail(Cut::StreamIdle, "stream_idle_timeout", &msg);
                        return Poll::Ready(());
                    }
                    // Data came since the timer was set: it moves to the new deadline, and the
                    // next turn of the loop waits on it again.
                    self.alarms.reset(due);
                }
            }
        }
    }

    /// The request's record: what the stream's head says of it (`server::stream_fields`).
    pub(crate) fn exchange(&self) -> &Exchange {
        &self.exchange
    }

    /// The bytes [`Relay::poll_out`] made ready, until [`Relay::written`].
    pub(crate) fn out(&self) -> &[u8] {
        &self.events.out
    }

    /// The bytes of [`Relay::out`] are written: the buffer is kept for the next ones, unless a
    /// burst made it large.
    pub(crate) fn written(&mut self) {
        let out = &mut self.events.out;
        out.clear();
        if out.capacity() > 32 * OUT_CAPACITY {
            *out = BytesMut::with_capacity(OUT_CAPACITY);
        }
    }

    /// The stream has ended: what is left in [`Relay::out`] is its last bytes.
    pub(crate) fn is_done(&self) -> bool {
        self.done
    }

    /// The next bytes for the client as one piece, or `None` at the end.
    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        std::task::ready!(self.poll_out(cx));
        let out = &mut self.events.out;
        if out.is_empty() {
            return Poll::Ready(None);
        }
        let chunk = out.split().freeze();
        // Each piece is split off the front, so one allocation serves many: once the earlier
        // pieces are sent (and dropped), `reserve` takes the space back.
        if out.capacity() < OUT_CAPACITY / 4 {
            out.reserve(OUT_CAPACITY);
        }
        Poll::Ready(Some(chunk))
    }

    /// The upstream's body ended: what is left goes to the client, with an error event if the
    /// stream ended without `[DONE]`.
    fn ended(&mut self) {
        self.done = true;
        let rest = self.events.splitter.rest();
        let out = &mut self.events.out;
        out.extend_from_slice(&rest);
        if !self.exchange.ended() {
            // The upstream closed without `[DONE]`: tell the client rather than end quietly.
            if !rest.is_empty() && !rest.ends_with(b"\n\n") {
                out.extend_from_slice(b"\n\n");
            }
            self.fail(
                Cut::Upstream,
                "upstream_stream_error",
                "the replica ended the stream early",
            );
        }
    }

    /// Ends the stream: the exchange records the cut, the client gets one SSE error event after
    /// what [`Relay::out`] holds.
    fn fail(&mut self, cut: Cut, code: &'static str, message: &str) {
        self.done = true;
        self.exchange.end(Ending::Cut(cut), 200);
        self.events
            .out
            .extend_from_slice(&GatewayError::upstream(code, message).sse_event());
    }
}

/// On hyper's paths the relay is the response's body itself: a stream adapter between them costs
/// a layer of calls per relayed chunk. A failure reaches the client as an SSE error event, never
/// as an error.
impl hyper::body::Body for Relay {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        self.get_mut()
            .poll_chunk(cx)
            .map(|chunk| chunk.map(|c| Ok(hyper::body::Frame::data(c))))
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.events.out.is_empty()
    }
}

/// What an HTTP/2 stream's relay task hands its body: the next bytes, or the stream's proper end.
enum Piece {
    Data(Bytes),
    End,
}

/// An HTTP/2 stream's relay, on a task of its own. hyper's HTTP/2 server polls a body only while
/// the client's flow-control window for that stream is open, and the socket itself never blocks:
/// a client that stopped reading one stream would stop the relay, and its stall and total timers,
/// with it, and hold its slot for as long as it kept the connection. Here the relay runs on, and
/// a chunk the client has not taken within `send_timeout` (the next one waits behind it) ends the
/// request as the client's disconnect, counted in `cut`, as on HTTP/1.1: its slot and its
/// replica's stream are freed at once. The HTTP/2 stream itself is reset when hyper next polls
/// the body (the client reads or resets it, or the connection closes): hyper, waiting for window,
/// does not poll it before.
pub(crate) fn detached(mut relay: Relay, send_timeout: Duration, cut: prometheus::IntCounter) -> Detached {
    // Two chunks ahead at most: what the client has not taken stays with the relay's budgets.
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                chunk = std::future::poll_fn(|cx| relay.poll_chunk(cx)) => chunk,
                // The body is gone (the client reset the stream or left): dropping the relay
                // records it and closes the replica's stream.
                () = tx.closed() => return,
            };
            let piece = next.map_or(Piece::End, Piece::Data);
            let end = matches!(piece, Piece::End);
            match tokio::time::timeout(send_timeout, tx.send(piece)).await {
                Ok(Ok(())) if !end => {}
                Ok(_) => return,
                Err(_) => {
                    cut.inc();
                    return;
                }
            }
        }
    });
    Detached { rx, ended: false }
}

/// The body of a [`detached`] relay.
pub(crate) struct Detached {
    rx: tokio::sync::mpsc::Receiver<Piece>,
    ended: bool,
}

/// A detached stream cut before its end: hyper resets the HTTP/2 stream rather than end it as
/// whole.
#[derive(Debug)]
pub(crate) struct StreamCut;

impl std::fmt::Display for StreamCut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the stream was cut: its client took nothing for send_timeout")
    }
}

impl std::error::Error for StreamCut {}

impl hyper::body::Body for Detached {
    type Data = Bytes;
    type Error = StreamCut;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, StreamCut>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        match std::task::ready!(self.rx.poll_recv(cx)) {
            Some(Piece::Data(chunk)) => Poll::Ready(Some(Ok(hyper::body::Frame::data(chunk)))),
            Some(Piece::End) => {
                self.ended = true;
                Poll::Ready(None)
            }
            None => {
                self.ended = true;
                Poll::Ready(Some(Err(StreamCut)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// One POST of `{}` on `conns`, as the gateway sends them.
    async fn call(conns: &Arc<h1::Conns>) -> Result<h1::Response, h1::Error> {
        let body = Bytes::from_static(b"{}");
        let request = h1::Request {
            path: "/v1/chat/completions",
            headers: &[],
            body: &body,
        };
        h1::send(conns, &request, Duration::from_secs(1)).await
    }

    /// What a lone stream's first write gets: the events up to the first with tokens (a role
    /// chunk sent apart, as vLLM sends it, comes along), not those read after it; the relay
    /// passes those on next, without another read.
    #[tokio::test]
    async fn the_first_write_ends_with_the_first_token_and_the_rest_follows() {
        let events = [
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n",
            "data: [DONE]\n\n",
        ];
        let mut wire = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        for e in events {
            wire.extend_from_slice(format!("{:x}\r\n{e}\r\n", e.len()).as_bytes());
        }
        wire.extend_from_slice(b"0\r\n\r\n");
        // One write: the whole answer reaches the gateway's first read.
        let (url, _replica) = testkit::serve_script(vec![wire], false).await;
        let conns = Arc::new(h1::Conns::new(&url));
        let answer = call(&conns).await.unwrap();
        let mut ex = Exchange::new(
            Arc::new(crate::metrics::Metrics::new()),
            crate::access_log::AccessLog::discard(),
            "id".into(),
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        let Opened::Stream(opened) = open(
            answer.into_body(),
            None,
            false,
            &mut ex,
            deadline,
            Duration::from_secs(5),
        )
        .await
        .unwrap() else {
            panic!("a stream")
        };
        assert_eq!(&opened.out[..], [events[0], events[1]].concat().as_bytes());
        let (_stop_tx, stop) = watch::channel(false);
        let config = RelayConfig {
            idle: Duration::from_secs(5),
            deadline,
            stop,
        };
        let mut relay = Relay::new(opened, config, ex);
        relay.written();
        let mut rest = Vec::new();
        while !relay.is_done() {
            std::future::poll_fn(|cx| relay.poll_out(cx)).await;
            rest.extend_from_slice(relay.out());
            relay.written();
        }
        assert_eq!(rest, [events[2], events[3]].concat().as_bytes());
    }

    /// `events`, each a chunk of one 200 stream written at once, opened as the gateway opens
    /// a stream.
    async fn open_script(events: &[&str]) -> (Result<Opened, GatewayError>, Exchange) {
        let mut wire = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        for e in events {
            wire.extend_from_slice(format!("{:x}\r\n{e}\r\n", e.len()).as_bytes());
        }
        wire.extend_from_slice(b"0\r\n\r\n");
        let (url, _replica) = testkit::serve_script(vec![wire], false).await;
        let conns = Arc::new(h1::Conns::new(&url));
        let answer = call(&conns).await.unwrap();
        let mut ex = Exchange::new(
            Arc::new(crate::metrics::Metrics::new()),
            crate::access_log::AccessLog::discard(),
            "id".into(),
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        let opened = open(
            answer.into_body(),
            None,
            false,
            &mut ex,
            deadline,
            Duration::from_secs(5),
        )
        .await;
        (opened, ex)
    }

    /// vLLM 0.32 refuses a request its full queue cannot take with a 200 stream of one error
    /// event (`code` an integer) and `[DONE]`: the stream does not open, and the error says
    /// which status it names; nothing of it is timed or ends the exchange.
    #[tokio::test]
    async fn an_error_event_before_the_first_token_is_not_a_stream() {
        let busy = "data: {\"error\": {\"message\": \"The server is overloaded\", \"type\": \"ServiceUnavailableError\", \"param\": null, \"code\": 503}}\n\n";
        let (opened, ex) = open_script(&[busy, "data: [DONE]\n\n"]).await;
        let Ok(Opened::Error(early)) = opened else {
            panic!("an error, not a stream")
        };
        assert_eq!(early.status, Some(503));
        assert_eq!(
            &early.body[..],
            busy.trim_start_matches("data: ").trim_end().as_bytes()
        );
        assert!(!ex.ended(), "[DONE] after it does not finish the exchange");
        // The same in one write, after a role chunk.
        let role = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n";
        let bad = "data: {\"error\":{\"message\":\"max_tokens is too large\",\"type\":\"BadRequestError\",\"param\":null,\"code\":400}}\n\ndata: [DONE]\n\n";
        let (opened, ex) = open_script(&[&format!("{role}{bad}")]).await;
        let Ok(Opened::Error(early)) = opened else {
            panic!("an error, not a stream")
        };
        assert_eq!(early.status, Some(400));
        assert!(!ex.ended());
        // After a token, an error event is the stream's own: relayed as it is.
        let token = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n";
        let (opened, _) = open_script(&[&format!("{token}{bad}")]).await;
        assert!(matches!(opened, Ok(Opened::Stream(_))));
    }

    /// Comments (or role chunks) without end ahead of the first token are held only up to one
    /// event's bound.
    #[tokio::test]
    async fn what_comes_ahead_of_the_first_token_is_bounded() {
        let ping = ": ping\n\n";
        let many = ping.repeat(2 * MAX_EVENT / ping.len());
        let (opened, _) = open_script(&[&many, "data: [DONE]\n\n"]).await;
        match opened {
            Err(GatewayError::Upstream { message, .. }) => {
                assert!(message.contains("before its first token"), "{message}")
            }
            _ => panic!("refused"),
        }
        let (opened, _) = open_script(&[&ping.repeat(100), "data: [DONE]\n\n"]).await;
        assert!(matches!(opened, Ok(Opened::Stream(_))));
    }

    #[test]
    fn an_error_events_status_is_its_code() {
        let status = |json: &str| EarlyError::parse(format!("data: {json}\n\n").as_bytes()).status;
        assert_eq!(status(r#"{"error":{"message":"x","code":429}}"#), Some(429));
        assert_eq!(status(r#"{"error":{"message":"x","code":"503"}}"#), Some(503));
        assert_eq!(
            status(r#"{"error":{"message":"x","code":"upstream_busy"}}"#),
            None
        );
        assert_eq!(status(r#"{"error":{"message":"x","code":200}}"#), None);
        assert_eq!(status(r#"{"error":{"message":"x"}}"#), None);
        assert_eq!(status(r#"{"error":"#), None);
        assert!(is_error_event(b"data: {\"error\": {}}\n\n"));
        assert!(is_error_event(b"\ndata:{ \"error\":{}}\n\n"));
        assert!(!is_error_event(b"data: {\"id\":\"x\",\"error\":null}\n\n"));
        assert!(!is_error_event(b": error\n\n"));
    }

    /// Waits until `alarm` says yes, polling it the way the relay does.
    async fn until(alarms: &mut Alarms, alarm: fn(&mut Alarms, &mut Context<'_>) -> bool) {
        std::future::poll_fn(|cx| {
            if alarm(alarms, cx) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
    }

    /// A task that spent its budget (a backlog relayed in one go) before it first looked at the
    /// alarms must still be woken by them: tokio answers such a poll Pending without registering
    /// the waker, so that look cannot count as the one that arms them.
    #[tokio::test(start_paused = true)]
    async fn alarms_first_looked_at_without_budget_still_wake_the_task() {
        let (stop_tx, stop) = watch::channel(false);
        let mut alarms = Alarms::new(Instant::now() + Duration::from_millis(100), stop);
        let (backlog_tx, mut backlog) = tokio::sync::mpsc::unbounded_channel::<u32>();
        for i in 0..1000 {
            backlog_tx.send(i).unwrap();
        }
        std::future::poll_fn(|cx| {
            while backlog.poll_recv(cx).is_ready() {}
            assert!(!tokio::task::coop::has_budget_remaining());
            assert!(!alarms.timer_due(cx));
            assert!(!alarms.stopping(cx));
            Poll::Ready(())
        })
        .await;
        let t = Instant::now();
        tokio::time::timeout(Duration::from_secs(5), until(&mut alarms, Alarms::timer_due))
            .await
            .expect("the timer wakes the task");
        assert_eq!(t.elapsed(), Duration::from_millis(100));

        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            stop_tx.send_replace(true);
            std::future::pending::<()>().await;
        });
        let t = Instant::now();
        // The timeout also wakes the task, at 5 s: the signal must have done so at 50 ms.
        tokio::time::timeout(Duration::from_secs(5), until(&mut alarms, Alarms::stopping))
            .await
            .expect("the drain's signal is seen");
        assert_eq!(
            t.elapsed(),
            Duration::from_millis(50),
            "woken by the signal itself"
        );
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
        // Reasoning (vLLM 0.32's field and the older one) and tool calls are generated tokens.
        for delta in [
            r#"{"reasoning":"Let"}"#,
            r#"{"reasoning_content":"Let"}"#,
            r#"{"content":null,"reasoning":" me"}"#,
            r#"{"tool_calls":[{"index":0,"function":{"arguments":"{\"a"}}]}"#,
        ] {
            let event = format!(r#"data: {{"choices":[{{"index":0,"delta":{delta}}}]}}"#);
            assert_eq!(classify(event.as_bytes()), EventKind::Tokens, "{delta}");
        }
        for delta in [
            r#"{"reasoning":""}"#,
            r#"{"reasoning_content":""}"#,
            r#"{"reasoning":null}"#,
            r#"{"tool_calls":[]}"#,
        ] {
            let event = format!(r#"data: {{"choices":[{{"index":0,"delta":{delta}}}]}}"#);
            assert_eq!(classify(event.as_bytes()), EventKind::Other, "{delta}");
        }
        assert_eq!(
            classify(br#"data: {"choices":[{"delta":{},"finish_reason":"stop"}]}"#),
            EventKind::Other
        );
        assert_eq!(classify(b": ping\n\n"), EventKind::Other);
        // After a stray blank line, which the splitter leaves at the next event's start.
        assert_eq!(classify(b"\r\ndata: [DONE]\n\n"), EventKind::Done);
        assert_eq!(classify(b"\ndata: [DONE]\n\n"), EventKind::Done);
        assert_eq!(classify(b"\n"), EventKind::Other);
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

    /// The short way (usage last) and the whole parse agree; a usage nested deeper, or not last,
    /// is read by the whole parse, which takes the top level's; a truncated body has none.
    #[test]
    fn usage_is_the_top_levels_wherever_it_stands() {
        let u = r#"{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}"#;
        let nested = r#"{"prompt_tokens":70,"completion_tokens":90,"total_tokens":160}"#;
        for (body, expected) in [
            (
                format!(r#"data: {{"id":"x","choices":[],"usage":{u}}}"#),
                Some((3, 5)),
            ),
            (
                format!("data: {{\"choices\":[], \"usage\" : {u} }}\n\n"),
                Some((3, 5)),
            ),
            (format!(r#"{{"usage":{u},"id":"x"}}"#), Some((3, 5))),
            (
                format!(r#"{{"usage":{u},"x":{{"usage":{nested}}}}}"#),
                Some((3, 5)),
            ),
            (
                format!(r#"{{"x":{{"usage":{nested}}},"usage":{u}}}"#),
                Some((3, 5)),
            ),
            (format!(r#"{{"x":{{"usage":{nested}}}}}"#), None),
            (r#"{"id":"x","usage":null}"#.to_string(), None),
            (r#"{"id":"x","usage":{"prompt_tokens":3}}"#.to_string(), None),
            (format!(r#"{{"id":"x","usage":{u}"#), None),
        ] {
            assert_eq!(parse_usage(body.as_bytes()), expected, "{body}");
        }
        assert_eq!(usage_last(format!(r#"{{"usage":{u}}}"#).as_bytes()), Some((3, 5)));
        assert_eq!(usage_last(format!(r#"{{"x":{{"usage":{u}}}}}"#).as_bytes()), None);
    }

    /// The hand-read usage is serde's wherever the hand reading answers, and answers for what
    /// vLLM and OpenAI write: every body here, and each cut short or with one byte changed.
    #[test]
    fn flat_usage_agrees_with_serde() {
        let serde = |json: &[u8]| -> Option<((u32, u32), usize)> {
            let mut objects = serde_json::Deserializer::from_slice(json).into_iter::<Usage>();
            let usage = objects.next()?.ok()?;
            Some((
                (usage.prompt_tokens, usage.completion_tokens),
                objects.byte_offset(),
            ))
        };
        let bodies = [
            r#"{"prompt_tokens":5,"total_tokens":21,"completion_tokens":16,"prompt_tokens_details":null}"#,
            r#"{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}"#,
            r#" { "prompt_tokens" : 0 ,
                "completion_tokens":4294967295 } "#,
            r#"{"prompt_tokens":4294967296,"completion_tokens":1}"#,
            r#"{"prompt_tokens":1,"completion_tokens":2,"prompt_tokens":3}"#,
            r#"{"prompt_tokens":1.0,"completion_tokens":2}"#,
            r#"{"prompt_tokens":1e2,"completion_tokens":2}"#,
            r#"{"prompt_tokens":-1,"completion_tokens":2}"#,
            r#"{"prompt_tokens":01,"completion_tokens":2}"#,
            r#"{"prompt_tokens":"1","completion_tokens":2}"#,
            r#"{"prompt_tokens":null,"completion_tokens":2}"#,
            r#"{"completion_tokens":2}"#,
            r#"{"prompt_t\u006fkens":1,"completion_tokens":2}"#,
            r#"{"prompt_tokens":1,"completion_tokens":2,"x":[1,2],"y":"z","w":true}"#,
            r#"{"prompt_tokens":1,"completion_tokens":2,"d":{"a":{"b":1}}}"#,
            r#"{"prompt_tokens":1,"completion_tokens":2,}"#,
            r#"{}"#,
        ];
        let mut answered = 0;
        for body in bodies {
            let body = body.as_bytes();
            let mut variants = vec![body.to_vec()];
            for i in 0..body.len() {
                variants.push(body[..i].to_vec());
                for b in [
                    b'}', b'{', b'"', b',', b':', b'0', b'9', b' ', b'x', b'\\', b'.', b'-', 0xff,
                ] {
                    let mut v = body.to_vec();
                    v[i] = b;
                    variants.push(v);
                }
            }
            for v in variants {
                if let Some(read) = flat_usage(&v) {
                    answered += 1;
                    assert_eq!(Some(read), serde(&v), "{}", String::from_utf8_lossy(&v));
                }
            }
        }
        for body in &bodies[..3] {
            assert!(flat_usage(body.as_bytes()).is_some(), "{body}");
        }
        assert!(answered > 500, "{answered}");
    }
}
