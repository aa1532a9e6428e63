//! An HTTP/2 stream's relay on a task of its own, so that a client that stops reading one stream
//! cannot stop its relay's timers with it.

use super::Relay;
use bytes::Bytes;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

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
pub(crate) struct ClientStalled;

impl std::fmt::Display for ClientStalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the stream was cut: its client took nothing for send_timeout")
    }
}

impl std::error::Error for ClientStalled {}

impl hyper::body::Body for Detached {
    type Data = Bytes;
    type Error = ClientStalled;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, ClientStalled>>> {
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
                Poll::Ready(Some(Err(ClientStalled)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }
}
