//! Stage 8: the answer. A stream's response head is held until the upstream's first token (so a
//! failure before it, an error event included, is still a clean status), then the stream is relayed without buffering: all
//! the bytes ready when the relay wakes go out in one write (the first token's, with the head, may
//! go out ahead of what was read with it: `front`), each SSE event is timed (TTFT, ITL),
//! the usage chunk is read (and dropped if the client did not ask for it), and a stall, a failure,
//! the total budget or the end of a drain ends it with an SSE error event.

mod alarms;
mod detached;
mod events;
#[cfg(test)]
mod tests;

pub(crate) use detached::detached;
pub(crate) use events::{Events, Opening, Rang};

use crate::error::GatewayError;
use crate::event::{EarlyError, Event, EventKind, Reader, Rename};
use crate::path::ledger::{Ending, Ledger};
use crate::route::transport::Body;
use alarms::Alarms;
use axum::http::StatusCode;
use bytes::{Bytes, BytesMut};
use http1::client::{self as h1, Pieces, Read};
use std::pin::Pin;
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

/// A stream whose head may go: the replica's body, and the [`Events`] read from it so far.
pub(crate) struct Streamed {
    body: Body,
    events: Events,
}

/// Polls one read of `body` into `events`, each piece fed with the instant its data came
/// (events handed over together share it: docs/metrics.md on ITL); if `until_token`, only the
/// pieces up to the first that opens the stream.
fn poll_read(
    body: &mut Body,
    events: &mut Events,
    cx: &mut Context<'_>,
    ex: &mut Ledger,
    until_token: bool,
) -> Poll<Result<Read, h1::Error>> {
    let mut at = None;
    let token = std::cell::Cell::new(false);
    let each = &mut |data: &[u8]| {
        let now = *at.get_or_insert_with(Instant::now);
        if events.feed(ex, data, now) {
            token.set(true);
        }
    };
    let pieces = if until_token {
        Pieces::Until(&token)
    } else {
        Pieces::All
    };
    body.poll_pieces(cx, each, pieces)
}

/// What the upstream's stream began with.
// Lives for one `match` on the stack; boxing the stream would cost an allocation per request.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Opened {
    /// Its first event (a token, or the events before it): the stream goes on.
    Stream(Streamed),
    /// An error event before any token, which the client never sees as a stream.
    Error(EarlyError),
}

/// Waits for the upstream's first event with tokens (or usage, or the end), at most until the
/// first token's budget runs out, feeding `events` what it reads; those before it (a role chunk
/// sent ahead, comments) are held with the head, so that an error event after them is still
/// answered as its status.
pub(crate) async fn open(
    mut body: Body,
    mut events: Events,
    ex: &mut Ledger,
) -> Result<Opened, GatewayError> {
    loop {
        // The first event with tokens (or the end) goes out with the head as soon as it is
        // whole, with what came before it (a role chunk, comments); events that came after it in
        // the same read wait for the relay, which passes them on straight after.
        let due = events.due();
        let read = std::future::poll_fn(|cx| poll_read(&mut body, &mut events, cx, ex, true));
        match tokio::time::timeout_at(due, read).await {
            Ok(Ok(Read::Data)) => match events.opening(ex)? {
                Opening::Hold => {}
                Opening::Stream => return Ok(Opened::Stream(Streamed { body, events })),
                Opening::Error(early) => return Ok(Opened::Error(early)),
            },
            Ok(Ok(Read::End)) => return Err(Events::closed_before_first_token()),
            Ok(Err(e)) => return Err(Events::failed_before_first_token(&e)),
            Err(_) => {
                if let Rang::Late(e) = events.rang(ex, Instant::now()) {
                    return Err(e);
                }
            }
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
        ex.reported(usage);
    }
    if let Some(id) = event.named() {
        ex.made_response(id);
    }
    match kind {
        EventKind::Tokens => ex.token_chunk(now),
        EventKind::Usage if strip_usage => return kind,
        EventKind::Done => ex.end(Ending::Finished, StatusCode::OK),
        EventKind::Usage | EventKind::Error | EventKind::Other => {}
    }
    if matches!(ex.trace(), crate::traces::Trace::Record(_)) {
        ex.trace().finish_reasons(event.data());
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
    reader: &mut Reader,
    rename: Option<&Rename>,
    strip_usage: bool,
    out: &mut BytesMut,
) {
    if !rest.is_empty() && protocol::sse::whole_at_end(rest) {
        pass_on(ex, &reader.read(rest), Instant::now(), rename, strip_usage, out);
    } else {
        out.extend_from_slice(rest);
    }
}

pub(crate) fn too_large_message() -> String {
    format!("the replica sent an SSE event over {} KiB", MAX_EVENT / 1024)
}

pub(crate) use crate::event::Whole as WholeAnswer;

/// Reads a non-streamed answer whole within the total budget and `limit` bytes
/// (`server.max_response_bytes`).
pub(crate) async fn whole(
    upstream: Body,
    deadline: Instant,
    budget: Duration,
    limit: usize,
    rename: Option<&Rename>,
    dialect: Option<protocol::agents::Dialect>,
) -> Result<WholeAnswer, GatewayError> {
    let body = collect(upstream, deadline, limit, GatewayError::DeadlineExceeded(budget)).await?;
    Ok(crate::event::read_whole_in(dialect, body, rename))
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

/// A whole answer as the ledger takes it: its finish reasons, its usage, the response it made,
/// its end.
pub(crate) fn whole_answered(ex: &mut Ledger, status: StatusCode, answer: &WholeAnswer) {
    ex.trace().finish_reasons(&answer.body);
    ex.whole_answer(Instant::now(), answer.usage);
    if let Some(id) = &answer.made {
        ex.made_response(id);
    }
    ex.end(Ending::Finished, status);
}

/// A whole answer fed in pieces (the picker's: Envoy's body messages), held within `limit`
/// bytes (`server.max_response_bytes`) as [`collect`] holds the proxy's.
#[cfg_attr(not(feature = "picker"), allow(dead_code))]
pub(crate) struct Whole {
    held: BytesMut,
    limit: usize,
}

#[cfg_attr(not(feature = "picker"), allow(dead_code))]
impl Whole {
    pub(crate) fn new(limit: usize) -> Whole {
        Whole {
            held: BytesMut::new(),
            limit,
        }
    }

    /// One piece; an answer past the limit is refused (502), as the proxy refuses it.
    pub(crate) fn feed(&mut self, data: &[u8]) -> Result<(), GatewayError> {
        if self.held.len() + data.len() > self.limit {
            return Err(GatewayError::UpstreamTooLarge { limit: self.limit });
        }
        self.held.extend_from_slice(data);
        Ok(())
    }

    /// The answer is whole: its body with the public model name, settled in the ledger.
    pub(crate) fn finish(self, ex: &mut Ledger, rename: Option<&Rename>) -> Bytes {
        let answer = crate::event::read_whole_in(ex.dialect(), self.held.freeze(), rename);
        whole_answered(ex, StatusCode::OK, &answer);
        answer.body
    }
}

/// The state of one relayed stream, which is the response body's stream; dropping it (the client
/// left) drops the upstream body, whose connection closes, which makes the replica abort the
/// request. It polls the replica's body into its [`Events`], which decide.
pub(crate) struct Relay {
    body: Body,
    events: Events,
    ledger: Ledger,
    alarms: Alarms,
}

impl Relay {
    /// `stop` turns true when the gateway's drain runs out: open streams end with an error event.
    pub(crate) fn new(streamed: Streamed, stop: watch::Receiver<bool>, ledger: Ledger) -> Relay {
        let Streamed { body, events } = streamed;
        Relay {
            alarms: Alarms::new(events.due(), stop),
            body,
            events,
            ledger,
        }
    }

    /// Ready once there are bytes for the client in [`Relay::out`] or the stream has ended
    /// ([`Relay::is_done`]; both can hold): everything the upstream has ready when the relay
    /// wakes (what one read of its connection brings), without ever waiting for more.
    pub(crate) fn poll_out(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if !self.events.out.is_empty() || self.events.is_done() {
            return Poll::Ready(());
        }
        let Relay {
            body,
            events,
            ledger,
            alarms,
        } = self;
        loop {
            if alarms.stopping(cx) {
                events.drained(ledger);
                return Poll::Ready(());
            }
            match poll_read(body, events, cx, ledger, false) {
                Poll::Ready(Ok(Read::Data)) => {
                    if events.streamed(ledger) {
                        alarms.reset(events.due());
                    }
                    if events.is_done() || !events.out.is_empty() {
                        return Poll::Ready(());
                    }
                }
                Poll::Ready(Ok(Read::End)) => {
                    events.ended(ledger);
                    return Poll::Ready(());
                }
                Poll::Ready(Err(e)) => {
                    events.failed(ledger, &e);
                    return Poll::Ready(());
                }
                Poll::Pending => {
                    if !alarms.timer_due(cx) {
                        return Poll::Pending;
                    }
                    match events.rang(ledger, Instant::now()) {
                        // Data came since the timer was set: it moves to the new deadline, and
                        // the next turn of the loop waits on it again.
                        Rang::NotYet(due) => alarms.reset(due),
                        Rang::Late(_) | Rang::Ended(_) => return Poll::Ready(()),
                    }
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
        self.events.is_done()
    }

    /// The next bytes for the client as one piece, or `None` at the end.
    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        std::task::ready!(self.poll_out(cx));
        if self.events.out.is_empty() {
            return Poll::Ready(None);
        }
        Poll::Ready(Some(self.events.take_out()))
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
        self.events.is_done() && self.events.out.is_empty()
    }
}
