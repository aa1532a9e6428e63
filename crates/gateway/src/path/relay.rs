//! Stage 10: the answer. A stream's response head is held until the upstream's first token (so a
//! failure before it, an error event included, is still a clean status), then the stream is relayed without buffering: all
//! the bytes ready when the relay wakes go out in one write (the first token's, with the head, may
//! go out ahead of what was read with it: `front`), each SSE event is timed (TTFT, ITL),
//! the usage chunk is read (and dropped if the client did not ask for it), and a stall, a failure,
//! the total budget or the end of a drain ends it with an SSE error event.

mod alarms;
mod detached;
#[cfg(test)]
mod tests;

pub(crate) use detached::detached;

use crate::error::Cut;
use crate::error::GatewayError;
use crate::event::{EarlyError, Event, EventKind, Reader, Rename};
use crate::path::ledger::{Ending, Ledger};
use crate::route::transport::Body;
use alarms::Alarms;
use axum::http::StatusCode;
use bytes::{Bytes, BytesMut};
use http1::client::{self as h1, Pieces, Read};
use protocol::sse::EventSplitter;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// The relay's output buffer: about eight events' worth, reused write after write.
const OUT_CAPACITY: usize = 2 * 1024;

/// One SSE event from a replica may be at most this large (a token's event with 20 top logprobs
/// is a few KiB): past it, the stream ends rather than hold an event that never ends.
pub(crate) const MAX_EVENT: usize = 1024 * 1024;

/// After `[DONE]`, how long the replica has to end its body before the stream is ended for it:
/// the client has its whole answer, and its slot is not held for `stream_idle` meanwhile.
pub(crate) const DONE_GRACE: Duration = Duration::from_secs(1);

/// A stream's upstream side and what the client gets of it: the replica's body, the splitter,
/// how events are passed on, and the bytes not yet written. [`open`] fills it until the first
/// event; the [`Relay`] then owns it.
pub(crate) struct Events {
    upstream: Body,
    splitter: EventSplitter,
    reader: Reader,
    /// SharedLimits with the route: a `Rename` (a searcher and two names) is ten times the pointer.
    rename: Option<Arc<Rename>>,
    strip_usage: bool,
    /// Bytes for the client, until written: the front writes them from here and clears them,
    /// hyper's body takes them as pieces split off the front.
    out: BytesMut,
    /// An error event that came before any token ([`open`] answers it in place of the stream).
    /// (Boxed: it is rare, and the relay's state stays small.)
    early_error: Option<Box<EarlyError>>,
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
        ex: &mut Ledger,
        until_token: bool,
    ) -> Poll<Result<Got, h1::Error>> {
        let Events {
            upstream,
            splitter,
            reader,
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
                let e = reader.read(e);
                // Only before the first token (`open`'s reads): an error there is answered as
                // the status it names, so it is kept back rather than passed on.
                if until_token && !token.get() && e.kind() == EventKind::Error {
                    *early_error = Some(Box::new(e.early_error()));
                    token.set(true);
                    return;
                }
                if pass_on(ex, &e, now, rename.as_deref(), *strip_usage, out) != EventKind::Other {
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
    ex: &mut Ledger,
    deadline: Instant,
    budget: Duration,
) -> Result<Opened, GatewayError> {
    let mut events = Events {
        upstream,
        splitter: EventSplitter::default(),
        reader: Reader::default(),
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
                if let Some(early) = events.early_error.take() {
                    return Ok(Opened::Error(*early));
                }
            }
            Ok(Ok(_)) if events.event_too_large() => {
                return Err(GatewayError::upstream(too_large_message()));
            }
            // What comes ahead of the first token is held with the head: as much as one event.
            Ok(Ok(Got {
                read: Read::Data,
                token: false,
                ..
            })) if events.out.len() > MAX_EVENT => {
                return Err(GatewayError::upstream(format!(
                    "the replica sent over {} KiB before its first token",
                    MAX_EVENT / 1024
                )));
            }
            Ok(Ok(Got {
                read: Read::Data,
                token: false,
                ..
            })) => {}
            Ok(Ok(Got { read: Read::Data, .. })) => return Ok(Opened::Stream(events)),
            Ok(Ok(Got { read: Read::End, .. })) => {
                return Err(GatewayError::upstream(
                    "the replica closed the stream before the first token",
                ));
            }
            Ok(Err(e)) => {
                return Err(GatewayError::upstream(format!(
                    "the replica's stream failed before the first token: {e}"
                )));
            }
            Err(_) => return Err(GatewayError::FirstTokenTimeout(budget)),
        }
    }
}

/// Handles one complete event at `now`: times it, reads its usage, and appends what the client
/// gets of it to `out`. Returns what kind of event it was.
pub(crate) fn pass_on(
    ex: &mut Ledger,
    event: &Event<'_>,
    now: Instant,
    rename: Option<&Rename>,
    strip_usage: bool,
    out: &mut BytesMut,
) -> EventKind {
    let kind = event.kind();
    if let Some(usage) = event.usage() {
        ex.usage = Some(usage);
    }
    match kind {
        EventKind::Tokens => ex.token_chunk(now),
        EventKind::Usage if strip_usage => return kind,
        EventKind::Done => ex.end(Ending::Finished, StatusCode::OK),
        EventKind::Usage | EventKind::Error | EventKind::Other => {}
    }
    if matches!(ex.trace, crate::traces::Trace::Record(_)) {
        ex.trace.finish_reasons(event.data());
    }
    event.append(rename, out);
    kind
}

/// What the splitter held when the replica's body ended: an event complete by the specification
/// (its blank line may be a CR that waited for an LF that never came) is passed on as any other
/// — a `[DONE]` there is the stream's end — and anything else goes out as it came.
pub(crate) fn last_event(
    ex: &mut Ledger,
    rest: &[u8],
    rename: Option<&Rename>,
    strip_usage: bool,
    out: &mut BytesMut,
) {
    if !rest.is_empty() && protocol::sse::whole_at_end(rest) {
        pass_on(ex, &Event::read(rest), Instant::now(), rename, strip_usage, out);
    } else {
        out.extend_from_slice(rest);
    }
}

pub(crate) fn too_large_message() -> String {
    format!("the replica sent an SSE event over {} KiB", MAX_EVENT / 1024)
}

/// Reads a non-streamed answer whole within the total budget and `limit` bytes
/// (`server.max_response_bytes`): the body with the public model name, and its usage.
pub(crate) async fn whole(
    upstream: Body,
    deadline: Instant,
    budget: Duration,
    limit: usize,
    rename: Option<&Rename>,
) -> Result<(Bytes, Option<(u32, u32)>), GatewayError> {
    let body = collect(upstream, deadline, limit, GatewayError::DeadlineExceeded(budget)).await?;
    Ok(crate::event::read_whole(body, rename))
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
        Ok(Err(h1::Error::TooLarge(limit))) => Err(GatewayError::UpstreamTooLarge { limit }),
        Ok(Err(e)) => Err(GatewayError::upstream(format!(
            "the replica's answer failed: {e}"
        ))),
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

/// The state of one relayed stream, which is the response body's stream; dropping it (the client
/// left) drops the upstream body, whose connection closes, which makes the replica abort the
/// request.
pub(crate) struct Relay {
    events: Events,
    ledger: Ledger,
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
    pub(crate) fn new(events: Events, config: RelayConfig, ledger: Ledger) -> Relay {
        let now = Instant::now();
        // `[DONE]` may have come with the first token, in `open`'s read: the body's end is due
        // from now, as after a `[DONE]` read by the relay.
        let done_by = ledger.ended().then(|| (now + DONE_GRACE).min(config.deadline));
        let first = done_by.unwrap_or(now + config.idle).min(config.deadline);
        Relay {
            events,
            ledger,
            idle: config.idle,
            deadline: config.deadline,
            last_read: now,
            alarms: Alarms::new(first, config.stop),
            done: false,
            done_by,
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
                self.cut(
                    Cut::Drain,
                    "the gateway is shutting down and its drain time ran out",
                );
                return Poll::Ready(());
            }
            match self.events.poll_read(cx, &mut self.ledger, false) {
                Poll::Ready(Ok(Got {
                    read: Read::Data, at, ..
                })) => {
                    if let Some(at) = at {
                        self.last_read = at;
                    }
                    if self.ledger.ended() && self.done_by.is_none() {
                        // `[DONE]` has come: the body's end should follow at once.
                        let by = (self.last_read + DONE_GRACE).min(self.deadline);
                        self.done_by = Some(by);
                        self.alarms.reset(by);
                    }
                    if self.events.event_too_large() {
                        // What came before it goes out, then the error event.
                        self.cut(Cut::Upstream, &too_large_message());
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
                    self.cut(Cut::Upstream, &msg);
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
                        self.ledger.record.note = Some("upstream_body_not_ended");
                        return Poll::Ready(());
                    }
                    if now >= self.deadline {
                        self.cut(Cut::Deadline, "the request's total time budget ran out");
                        return Poll::Ready(());
                    }
                    let due = (self.last_read + self.idle)
                        .min(self.deadline)
                        .min(self.done_by.unwrap_or(self.deadline));
                    if now >= due {
                        let msg = format!("no chunk from the replica for {:?} (stream_idle)", self.idle);
                        self.cut(Cut::Idle, &msg);
                        return Poll::Ready(());
                    }
                    // Data came since the timer was set: it moves to the new deadline, and the
                    // next turn of the loop waits on it again.
                    self.alarms.reset(due);
                }
            }
        }
    }

    /// The request's record: what the stream's head says of it (`respond::stream_fields`).
    pub(crate) fn ledger(&self) -> &Ledger {
        &self.ledger
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
        let rename = self.events.rename.as_deref();
        last_event(&mut self.ledger, &rest, rename, self.events.strip_usage, out);
        if !self.ledger.ended() {
            // The upstream closed without `[DONE]`: tell the client rather than end quietly.
            if !rest.is_empty() && !rest.ends_with(b"\n\n") {
                out.extend_from_slice(b"\n\n");
            }
            self.cut(Cut::Upstream, "the replica ended the stream early");
        }
    }

    /// Ends the stream: the ledger records the cut, the client gets one SSE error event after
    /// what [`Relay::out`] holds.
    fn cut(&mut self, cut: Cut, message: &str) {
        self.done = true;
        self.ledger.end(Ending::Cut(cut), StatusCode::OK);
        self.events
            .out
            .extend_from_slice(&GatewayError::stream_cut(cut, message));
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
