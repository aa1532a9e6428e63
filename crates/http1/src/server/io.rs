//! The client's connection as the server half uses it and hands it over, and the request body
//! it reads.

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// A client's connection. Writes are cut when one stays blocked for `send_timeout` (nginx's
/// `send_timeout`): the timer runs only while a write is blocked, and each byte taken restarts
/// it. Without it a client that stops reading would hold its slot and its replica's stream for
/// ever, since a blocked write stops the answer's source from being polled, timers and all. Once
/// handed over, reads first give back the bytes the server half had already read.
pub struct ClientIo<IO> {
    pub(crate) io: IO,
    pub(crate) read: Bytes,
    send_timeout: Duration,
    /// Made the first time a write blocks, then reused.
    sleep: Option<Pin<Box<Sleep>>>,
    /// Whether `sleep` runs for the write now blocked.
    armed: bool,
    /// Told of each write cut (the gateway counts them).
    on_cut: Arc<dyn Fn() + Send + Sync>,
}

impl<IO> ClientIo<IO> {
    pub fn new(io: IO, send_timeout: Duration, on_cut: Arc<dyn Fn() + Send + Sync>) -> ClientIo<IO> {
        ClientIo {
            io,
            read: Bytes::new(),
            send_timeout,
            sleep: None,
            armed: false,
            on_cut,
        }
    }

    /// `write` (one write of the connection), with the timer armed while it is pending.
    fn poll_timed(
        &mut self,
        cx: &mut Context<'_>,
        write: impl FnOnce(&mut IO, &mut Context<'_>) -> Poll<std::io::Result<usize>>,
    ) -> Poll<std::io::Result<usize>> {
        if let Poll::Ready(r) = write(&mut self.io, cx) {
            self.armed = false;
            return Poll::Ready(r);
        }
        let sleep = match &mut self.sleep {
            Some(sleep) if self.armed => sleep,
            Some(sleep) => {
                sleep.as_mut().reset(Instant::now() + self.send_timeout);
                sleep
            }
            None => self.sleep.insert(Box::pin(tokio::time::sleep(self.send_timeout))),
        };
        self.armed = true;
        if sleep.as_mut().poll(cx).is_ready() {
            self.armed = false;
            (self.on_cut)();
            return Poll::Ready(Err(std::io::ErrorKind::TimedOut.into()));
        }
        Poll::Pending
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for ClientIo<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.read.is_empty() {
            let n = self.read.len().min(buf.remaining());
            buf.put_slice(&self.read[..n]);
            self.read.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for ClientIo<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.poll_timed(cx, |io, cx| Pin::new(io).poll_write(cx, buf))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.poll_timed(cx, |io, cx| Pin::new(io).poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A request body read whole before the handler is called, or one that did not arrive in time.
pub enum Upload {
    Whole(Option<Bytes>),
    TimedOut,
}

/// The error of an [`Upload`] that ran out of time; a server answers it with 408.
#[derive(Debug)]
pub struct BodyTimedOut;

impl std::fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request body did not arrive in time")
    }
}

impl std::error::Error for BodyTimedOut {}

impl Body for Upload {
    type Data = Bytes;
    type Error = BodyTimedOut;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyTimedOut>>> {
        Poll::Ready(match &mut *self {
            Upload::Whole(body) => body.take().map(|b| Ok(Frame::data(b))),
            Upload::TimedOut => Some(Err(BodyTimedOut)),
        })
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Upload::Whole(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Upload::Whole(Some(b)) => SizeHint::with_exact(b.len() as u64),
            _ => SizeHint::default(),
        }
    }
}
