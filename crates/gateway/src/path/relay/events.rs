//! A stream's relay as a machine that is fed, not one that reads: the replica's bytes and the time
//! go in, and it answers what the client gets — the events to pass on, when the head may go (the
//! first token), and when and how the stream is cut. The proxy's relay polls the replica's body
//! into it; the endpoint picker feeds it Envoy's body messages: one behaviour, written once.

use super::{DONE_GRACE, MAX_EVENT, OUT_CAPACITY, last_event, pass_on, too_large_message};
use crate::error::{Cut, GatewayError};
use crate::event::{EarlyError, EventKind, Reader, Rename};
use crate::path::ledger::{Ending, Ledger};
use crate::path::upstream::Budgets;
use axum::http::StatusCode;
use bytes::{Bytes, BytesMut};
use protocol::sse::EventSplitter;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// One stream's events and what the client gets of them: the splitter, how events are passed
/// on, the bytes not yet written, and the clocks that may cut it.
pub(crate) struct Events {
    splitter: EventSplitter,
    reader: Reader,
    /// Shared with the route: a `Rename` (a searcher and two names) is ten times the pointer.
    rename: Option<Arc<Rename>>,
    strip_usage: bool,
    /// Bytes for the client, until written: the front writes them from here and clears them,
    /// hyper's body and the picker take them as pieces split off the front.
    pub(super) out: BytesMut,
    /// An error event that came before any token, answered in place of the stream.
    /// (Boxed: it is rare, and the relay's state stays small.)
    early_error: Option<Box<EarlyError>>,
    /// An event with tokens, usage or the end (or an error before them) has been fed.
    token: bool,
    /// The head may go, and has gone or is going: [`Events::opening`] said so.
    opened: bool,
    /// The stream has ended: what `out` holds is its last bytes.
    done: bool,
    clock: Clock,
    /// The agents' API the stream is in (its events' rules, its cut's form); `None` for OpenAI's
    /// completions.
    dialect: Option<protocol::agents::Dialect>,
}

/// The budgets of a stream as instants, and when the replica last sent anything.
#[derive(Clone, Copy)]
struct Clock {
    first_token: Duration,
    first_token_deadline: Instant,
    deadline: Instant,
    idle: Duration,
    /// When the last data came: `stream_idle` counts from here.
    last_data: Instant,
    /// Once `[DONE]` has come, when the body must have ended.
    done_by: Option<Instant>,
}

/// What the events fed so far make of a stream whose head has not gone out.
pub(crate) enum Opening {
    /// Nothing yet decides: the head, and what came before the first token, are held.
    Hold,
    /// The first token (or usage, or the end) has come: the head goes out with [`Events::out`].
    Stream,
    /// An error event came in its place, which the client never sees as a stream.
    Error(EarlyError),
}

/// What the timer found when it rang.
pub(crate) enum Rang {
    /// Nothing is due before this: the timer moves there.
    NotYet(Instant),
    /// Before the head: the request fails with this.
    Late(GatewayError),
    /// After the head: the stream has ended ([`Events::is_done`]), cut (which way), or after
    /// `[DONE]` as if the body had (`None`).
    Ended(#[cfg_attr(not(feature = "picker"), allow(dead_code))] Option<Cut>),
}

impl Events {
    /// A stream's events, timed from `now` by `budgets` and `idle` (`stream_idle`).
    pub(crate) fn new(
        dialect: Option<protocol::agents::Dialect>,
        rename: Option<Arc<Rename>>,
        strip_usage: bool,
        budgets: &Budgets,
        idle: Duration,
        now: Instant,
    ) -> Events {
        Events {
            splitter: EventSplitter::default(),
            reader: Reader::new(dialect),
            rename,
            strip_usage,
            out: BytesMut::with_capacity(OUT_CAPACITY),
            early_error: None,
            token: false,
            opened: false,
            done: false,
            clock: Clock {
                first_token: budgets.first_token,
                first_token_deadline: budgets.first_token_deadline,
                deadline: budgets.deadline,
                idle,
                last_data: now,
                done_by: None,
            },
            dialect,
        }
    }

    /// Feeds a piece of the replica's body that came at `now`: each event it completes is passed
    /// on into [`Events::out`] (timed, its usage read, renamed); before the head, an error event
    /// is kept back to answer in place of the stream. True once the piece brought an event that
    /// opens the stream (tokens, usage, the end, or such an error): a reader may stop there.
    pub(crate) fn feed(&mut self, ex: &mut Ledger, data: &[u8], now: Instant) -> bool {
        let Events {
            splitter,
            reader,
            rename,
            strip_usage,
            out,
            early_error,
            opened,
            clock,
            token: fed,
            ..
        } = self;
        clock.last_data = now;
        // Room for what this piece's events become, taken at once: growing `out` event by event
        // would copy what it holds each time it doubles. An empty buffer too small is replaced,
        // not grown (a reallocation copies the old room, used or not).
        if out.capacity() - out.len() < data.len() {
            if out.is_empty() {
                *out = BytesMut::with_capacity(data.len().max(OUT_CAPACITY));
            } else {
                out.reserve(data.len());
            }
        }
        let opening = !*opened;
        let mut token = false;
        splitter.feed_slices(data, |e| {
            if early_error.is_some() {
                return;
            }
            let e = reader.read(e);
            // Only before the head: an error there is answered as the status it names, so it is
            // kept back rather than passed on.
            if opening && !token && e.kind() == EventKind::Error {
                *early_error = Some(Box::new(e.early_error()));
                token = true;
                return;
            }
            if pass_on(ex, &e, now, rename.as_deref(), *strip_usage, out) != EventKind::Other {
                token = true;
            }
        });
        *fed |= token;
        token
    }

    /// Before the head: what the events fed so far decide. What comes ahead of the first token is
    /// held with the head, as much as one event; an event over [`MAX_EVENT`] ends the request.
    pub(crate) fn opening(&mut self, ex: &mut Ledger) -> Result<Opening, GatewayError> {
        if let Some(early) = self.early_error.take() {
            return Ok(Opening::Error(*early));
        }
        if self.event_too_large() {
            return Err(GatewayError::upstream(too_large_message()));
        }
        if !self.token {
            if self.out.len() > MAX_EVENT {
                return Err(GatewayError::upstream(format!(
                    "the replica sent over {} KiB before its first token",
                    MAX_EVENT / 1024
                )));
            }
            return Ok(Opening::Hold);
        }
        self.opened = true;
        self.streamed(ex);
        Ok(Opening::Stream)
    }

    /// The replica's body ended before the head went out.
    pub(crate) fn closed_before_first_token() -> GatewayError {
        GatewayError::upstream("the replica closed the stream before the first token")
    }

    /// The replica's body failed before the head went out.
    pub(crate) fn failed_before_first_token(e: &dyn std::fmt::Display) -> GatewayError {
        GatewayError::upstream(format!("the replica's stream failed before the first token: {e}"))
    }

    /// After the head: what the events fed decide. `[DONE]` starts the body's grace; an event
    /// over [`MAX_EVENT`] cuts the stream after what came before it. True if the timer must move
    /// earlier ([`Events::due`]).
    pub(crate) fn streamed(&mut self, ex: &mut Ledger) -> bool {
        let mut sooner = false;
        if ex.ended() && self.clock.done_by.is_none() {
            // `[DONE]` has come: the body's end should follow at once.
            self.clock.done_by = Some((self.clock.last_data + DONE_GRACE).min(self.clock.deadline));
            sooner = true;
        }
        if self.event_too_large() {
            self.cut(ex, Cut::Upstream, &too_large_message());
        }
        sooner
    }

    /// After the head, the replica's body ended: what is left goes to the client, with an error
    /// event if the stream ended without `[DONE]`.
    pub(crate) fn ended(&mut self, ex: &mut Ledger) {
        self.done = true;
        let rest = self.splitter.rest();
        last_event(
            ex,
            &rest,
            &mut self.reader,
            self.rename.as_deref(),
            self.strip_usage,
            &mut self.out,
        );
        if !ex.ended() {
            // The upstream closed without `[DONE]`: tell the client rather than end quietly.
            if !rest.is_empty() && !rest.ends_with(b"\n\n") {
                self.out.extend_from_slice(b"\n\n");
            }
            self.cut(ex, Cut::Upstream, "the replica ended the stream early");
        }
    }

    /// After the head, the replica's body failed.
    pub(crate) fn failed(&mut self, ex: &mut Ledger, e: &dyn std::fmt::Display) {
        self.cut(ex, Cut::Upstream, &format!("the replica's stream failed: {e}"));
    }

    /// The gateway's drain ran out.
    pub(crate) fn drained(&mut self, ex: &mut Ledger) {
        self.cut(
            ex,
            Cut::Drain,
            "the gateway is shutting down and its drain time ran out",
        );
    }

    /// When the next budget runs out: the first token's, then `stream_idle` since the last data
    /// (or the body's grace after `[DONE]`), never past the total.
    pub(crate) fn due(&self) -> Instant {
        let c = &self.clock;
        if !self.opened {
            return c.first_token_deadline.min(c.deadline);
        }
        (c.last_data + c.idle)
            .min(c.deadline)
            .min(c.done_by.unwrap_or(c.deadline))
    }

    /// The timer rang at `now`.
    pub(crate) fn rang(&mut self, ex: &mut Ledger, now: Instant) -> Rang {
        let due = self.due();
        if now < due {
            // Data came since the timer was set: it moves to the new deadline.
            return Rang::NotYet(due);
        }
        if !self.opened {
            return Rang::Late(GatewayError::FirstTokenTimeout(self.clock.first_token));
        }
        if self.clock.done_by.is_some_and(|by| now >= by) {
            // The client has its whole stream: it ends as if the body had, and the replica's
            // connection, its body unfinished, is closed.
            self.done = true;
            ex.note("upstream_body_not_ended");
            return Rang::Ended(None);
        }
        if now >= self.clock.deadline {
            self.cut(ex, Cut::Deadline, "the request's total time budget ran out");
            return Rang::Ended(Some(Cut::Deadline));
        }
        let msg = format!(
            "no chunk from the replica for {:?} (stream_idle)",
            self.clock.idle
        );
        self.cut(ex, Cut::Idle, &msg);
        Rang::Ended(Some(Cut::Idle))
    }

    /// Ends the stream: the ledger records the cut, the client gets one SSE error event after
    /// what [`Events::out`] holds.
    pub(crate) fn cut(&mut self, ex: &mut Ledger, cut: Cut, message: &str) {
        self.done = true;
        ex.end(Ending::Cut(cut), StatusCode::OK);
        self.out
            .extend_from_slice(&GatewayError::stream_cut(cut, message, self.dialect));
    }

    /// The stream has ended: what is left in [`Events::out`] is its last bytes.
    pub(crate) fn is_done(&self) -> bool {
        self.done
    }

    /// The bytes ready for the client, taken: the buffer keeps its room for the next ones.
    pub(crate) fn take_out(&mut self) -> Bytes {
        let chunk = self.out.split().freeze();
        // Each piece is split off the front, so one allocation serves many: once the earlier
        // pieces are sent (and dropped), `reserve` takes the space back.
        if self.out.capacity() < OUT_CAPACITY / 4 {
            self.out.reserve(OUT_CAPACITY);
        }
        chunk
    }

    /// An event still incomplete has passed [`MAX_EVENT`].
    fn event_too_large(&self) -> bool {
        self.splitter.held() > MAX_EVENT
    }
}
