//! The server half: HTTP/1.1 for the requests that make up the hot path, served on the
//! connection's own task. The head is parsed with httparse, the body read into the connection's
//! buffer, the answer written as it comes, whatever is ready in one write.
//!
//! hyper's server costs, per client connection, two 8 KiB buffers, and per relayed chunk a pass
//! through its dispatcher and the body's layers. Everything else is the [`Handler`]'s to hand
//! over (the gateway gives it to hyper): HTTP/2, HTTP/1.0, chunked or `Expect` uploads,
//! `Upgrade`, heads too large or malformed, whatever the handler does not serve. The first such
//! request hands the connection, with every byte read so far, over for the rest of its life.

mod head;
mod io;
mod write;

#[cfg(test)]
mod tests;

pub use head::{MAX_HEADERS, RequestHead, Scan, header_size, scan, valid_host};
pub use io::{BodyTimedOut, ClientIo, Upload};
pub use write::{Chunks, Framed, StreamCut, encode_chunk};

use bytes::{Bytes, BytesMut};
use std::future::{Future, poll_fn};
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::time::Instant;
use write::{BodyChunks, LAST_CHUNK, encode_bad_request, encode_field, encode_head, has_body};

/// What one read asks for.
const READ_SIZE: usize = 4096;
/// The most room made for a body before its bytes arrive, the most a stream's write gathers of
/// what is ready, and the most buffer capacity a connection keeps between requests.
const MAX_ROOM: usize = 64 * 1024;
/// What one look at a waiting client reads at most, on the stack: a connection streaming an
/// answer holds no read buffer.
const PEEK_SIZE: usize = 1024;

/// The answer to a request: a stream framed straight from its source, or a body.
pub enum Reply<S, B> {
    Body(B),
    Stream(S),
}

impl<S, B> From<B> for Reply<S, B> {
    fn from(body: B) -> Self {
        Reply::Body(body)
    }
}

/// Requests being served, from their body's arrival to their answer's end, among those its
/// handlers share (the gateway keeps one for the process). A stream written alone is a sign of
/// an idle server only with those waiting on their replica counted: a stream of back-to-back
/// tokens is written whole in one poll, so streams being written hardly overlap.
#[derive(Debug, Default)]
pub struct Load(AtomicUsize);

impl Load {
    fn start(&self) -> Counted<'_> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Counted(self)
    }

    /// Requests being served now.
    pub fn serving(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// One request counted in its [`Load`] while it is served.
struct Counted<'a>(&'a Load);

impl Counted<'_> {
    /// No other request is being served: the server has nothing else to do.
    fn alone(&self) -> bool {
        self.0.serving() <= 1
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The limits in force for a request.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A whole head must arrive within this.
    pub header_timeout: Duration,
    /// A body, within this of its head.
    pub body_timeout: Duration,
    /// A head larger than this is handed over (hyper answers 431).
    pub max_head: usize,
}

/// A head the handler serves: its request, and what the server reads and writes for it.
pub struct Served<R> {
    pub request: R,
    pub content_length: usize,
    /// The client asked to close after the answer.
    pub close: bool,
}

/// What the server half calls: everything that is not HTTP/1.1 framing.
pub trait Handler<IO>: Send {
    /// A request as the handler reads it from its head.
    type Request: Send;
    /// A streamed answer's source.
    type Stream: Chunks + Send;
    /// Any other answer's body.
    type Body: http_body::Body<Data = Bytes> + Default + Unpin + Send;

    /// The limits for the next request.
    fn limits(&self) -> Limits;

    /// The load the write policy reads (see [`Load`]).
    fn load(&self) -> std::sync::Arc<Load>;

    /// A whole head: `Some` to serve it here, `None` to hand the connection over, this head
    /// first.
    fn head(&mut self, head: &Bytes) -> Option<Served<Self::Request>>;

    /// The answer to a request whose body arrived (or ran out of time). Dropped unfinished when
    /// the client leaves first, with whatever it holds.
    fn call(
        &mut self,
        head: &Bytes,
        request: Self::Request,
        body: Upload,
    ) -> impl Future<Output = http::Response<Reply<Self::Stream, Self::Body>>> + Send;

    /// Resolves once the server is closing: idle connections close, busy ones after their
    /// answer.
    fn closed(&mut self) -> impl Future<Output = ()> + Send;

    fn is_closing(&self) -> bool;

    /// Serves the connection from here on; its reads give back the bytes already read first.
    fn hand_off(self, io: ClientIo<IO>) -> impl Future<Output = ()> + Send;
}

/// Serves one client connection until it closes, the server closes it, or it is handed over.
pub async fn serve<IO, H>(io: ClientIo<IO>, mut handler: H)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send,
    H: Handler<IO>,
{
    let mut conn = Connection {
        io,
        buf: BytesMut::new(),
        out: BytesMut::new(),
    };
    let load = handler.load();
    loop {
        let limits = handler.limits();
        let head_deadline = Instant::now() + limits.header_timeout;
        // A head already read ahead is taken first; a partial one does not hold up the close.
        let head = tokio::select! {
            biased;
            h = tokio::time::timeout_at(head_deadline, conn.read_head(limits.max_head)) => match h {
                Ok(h) => h,
                Err(_) => return,
            },
            () = handler.closed() => return,
        };
        let (head, served) = match head {
            Head::Closed => return,
            Head::Other => return conn.hand_off(None, handler).await,
            Head::Invalid => return conn.refuse_invalid().await,
            Head::Complete(head) => match handler.head(&head) {
                Some(served) => (head, served),
                None => return conn.hand_off(Some(head), handler).await,
            },
        };
        let body_deadline = Instant::now() + limits.body_timeout;
        let body = match tokio::time::timeout_at(body_deadline, conn.read_body(served.content_length)).await {
            Ok(Some(body)) => Upload::Whole(Some(body)),
            Ok(None) => return,
            Err(_) => Upload::TimedOut,
        };
        let close = served.close || matches!(body, Upload::TimedOut);
        let counted = load.start();
        // Boxed: a request's future may be large (the gateway's is over 4 KB), and a
        // connection's task would otherwise hold that much for as long as it lives.
        let mut answer = Box::pin(handler.call(&head, served.request, body));
        let Some(response) = conn.or_gone(answer.as_mut()).await else {
            return;
        };
        drop(answer);
        let close = close || handler.is_closing();
        if !conn.respond(response, close, counted.alone()).await || close {
            return;
        }
        drop(counted);
        conn.shrink();
    }
}

/// A client connection while the server half serves it.
struct Connection<IO> {
    /// Read through `io.io` directly; written through `io` and its send timer.
    io: ClientIo<IO>,
    /// Bytes read and not yet taken: a head, a body, what a client sent ahead.
    buf: BytesMut,
    /// What goes out next, in one write.
    out: BytesMut,
}

enum Head {
    /// The client closed, or its connection failed, before a whole head.
    Closed,
    /// Not a head this module parses: too large, or HTTP/2's preface.
    Other,
    /// Bytes that cannot begin a request.
    Invalid,
    Complete(Bytes),
}

impl<IO: AsyncRead + AsyncWrite + Unpin> Connection<IO> {
    /// Reads until `buf` starts with a whole head, which is split off.
    async fn read_head(&mut self, max_head: usize) -> Head {
        // Where the search for a head's end resumes: a head sent a byte at a time is not parsed
        // again from its start with every byte.
        let mut searched: usize = 0;
        loop {
            let (blank, scanned) = scan(&self.buf, &mut searched, max_head);
            bytes::Buf::advance(&mut self.buf, blank);
            match scanned {
                Scan::Complete(end) => return Head::Complete(self.buf.split_to(end).freeze()),
                Scan::Other => return Head::Other,
                Scan::Invalid => return Head::Invalid,
                Scan::More => {}
            }
            self.buf.reserve(READ_SIZE);
            match self.io.io.read_buf(&mut self.buf).await {
                Ok(0) | Err(_) => return Head::Closed,
                Ok(_) => {}
            }
        }
    }

    /// The body, once `len` bytes of it have arrived; `None` if the client left first.
    async fn read_body(&mut self, len: usize) -> Option<Bytes> {
        while self.buf.len() < len {
            // Room for what has arrived, not for what the head claims will.
            self.buf.reserve((len - self.buf.len()).min(MAX_ROOM));
            match self.io.io.read_buf(&mut self.buf).await {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
        Some(self.buf.split_to(len).freeze())
    }

    /// `fut`'s output, unless the client closes its side first: then it has left, and its
    /// request is dropped with whatever it holds (a queue place, a replica's stream). That is
    /// hyper's default too (`half_close` off).
    async fn or_gone<F: Future>(&mut self, mut fut: Pin<&mut F>) -> Option<F::Output> {
        self.watching(false, |cx, _| fut.as_mut().poll(cx)).await
    }

    /// [`Connection::or_gone`] for a poll function, which may write to `out`. With `polled`, its first
    /// call is skipped: it has just answered `Pending` in this same poll of the task, so its
    /// wake-up is arranged.
    async fn watching<T>(
        &mut self,
        mut polled: bool,
        mut poll: impl FnMut(&mut Context<'_>, &mut BytesMut) -> Poll<T>,
    ) -> Option<T> {
        poll_fn(|cx| {
            if !std::mem::take(&mut polled)
                && let Poll::Ready(v) = poll(cx, &mut self.out)
            {
                return Poll::Ready(Some(v));
            }
            if self.client_left(cx) {
                return Poll::Ready(None);
            }
            Poll::Pending
        })
        .await
    }

    /// Reads what the client sends while it waits for its answer (a next request, kept for
    /// later, or the end of its side), and registers to hear of more.
    fn client_left(&mut self, cx: &mut Context<'_>) -> bool {
        // Once a next request has been read ahead, the client is no longer watched, as with
        // hyper: a client that sends it and then closes its side still gets this answer.
        while self.buf.is_empty() {
            let mut room = [MaybeUninit::<u8>::uninit(); PEEK_SIZE];
            let mut read = ReadBuf::uninit(&mut room);
            match Pin::new(&mut self.io.io).poll_read(cx, &mut read) {
                Poll::Pending => return false,
                Poll::Ready(Err(_)) => return true,
                Poll::Ready(Ok(())) if read.filled().is_empty() => return true,
                Poll::Ready(Ok(())) => self.buf.extend_from_slice(read.filled()),
            }
        }
        false
    }

    /// Writes the answer; false when the connection cannot carry another one. `alone`: no
    /// other request is being served (see [`Connection::write_stream`]).
    async fn respond<S, B>(&mut self, response: http::Response<Reply<S, B>>, close: bool, alone: bool) -> bool
    where
        S: Chunks,
        B: http_body::Body<Data = Bytes> + Default + Unpin,
    {
        let (parts, reply) = response.into_parts();
        self.out.clear();
        if !has_body(parts.status) {
            encode_head(&mut self.out, &parts, None, close, |out| {
                if let Reply::Stream(source) = &reply {
                    source.head_fields(&mut |name, value| encode_field(out, name, value));
                }
            });
            // Dropped before the head goes out, as a body that has ended is (`write_whole`).
            drop(reply);
            return self.flush().await.is_some();
        }
        match reply {
            Reply::Stream(source) => {
                encode_head(&mut self.out, &parts, None, close, |out| {
                    source.head_fields(&mut |name, value| encode_field(out, name, value));
                });
                self.write_stream(source, alone).await
            }
            Reply::Body(mut body) => {
                let length = body.size_hint().exact();
                encode_head(&mut self.out, &parts, length, close, |_| {});
                match length {
                    Some(_) => self.write_whole(&mut body).await,
                    None => self.write_stream(BodyChunks(&mut body), alone).await,
                }
            }
        }
    }

    /// A body of known length: its bytes after the head, then one write. A large piece (a whole
    /// answer read from a replica is one) is written from its own buffer, not copied after the
    /// head.
    async fn write_whole<B>(&mut self, body: &mut B) -> bool
    where
        B: http_body::Body<Data = Bytes> + Default + Unpin,
    {
        let mut large: Option<Bytes> = None;
        loop {
            match poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await {
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else { continue };
                    if let Some(before) = large.take() {
                        self.out.extend_from_slice(&before);
                    }
                    if data.len() > MAX_ROOM {
                        large = Some(data);
                    } else {
                        self.out.extend_from_slice(&data);
                    }
                }
                Some(Err(_)) => return false,
                None => {
                    // Dropped once it has ended, before its last bytes go out: a body's owner may
                    // record the request when it drops (the gateway writes its access log line
                    // then), and a client that has the whole answer must find it there. hyper
                    // drops a body as soon as it ends, too.
                    *body = B::default();
                    return match large {
                        Some(data) => self.flush().await.is_some() && self.write_all(&data).await,
                        None => self.flush().await.is_some(),
                    };
                }
            }
        }
    }

    /// Writes `data` whole; false when the connection failed or the client stopped taking bytes.
    async fn write_all(&mut self, data: &[u8]) -> bool {
        let mut written = 0;
        poll_fn(|cx| {
            while written < data.len() {
                match Pin::new(&mut self.io).poll_write(cx, &data[written..]) {
                    Poll::Ready(Ok(0) | Err(_)) => return Poll::Ready(false),
                    Poll::Ready(Ok(n)) => written += n,
                    Poll::Pending => return Poll::Pending,
                }
            }
            Poll::Ready(true)
        })
        .await
    }

    /// A stream: whatever is ready goes out in one write (the head with the first chunk, the
    /// last chunk with the end), up to [`MAX_ROOM`] a write: for a source faster than its
    /// client, each turn would otherwise gather as many reads as tokio's budget allows. The
    /// client is watched while the next chunk is awaited. The source is dropped once it has
    /// ended, before its last bytes go out, as [`Connection::write_whole`] drops a body.
    ///
    /// A stream alone in the server (`first_alone`: no other request served) sends its first
    /// chunk (and the head) at once, whatever else is ready: that is the client's time to first
    /// token, and an idle server has nothing to gain from one write fewer. Under load it shares
    /// the write too.
    async fn write_stream(&mut self, mut source: impl Chunks, first_alone: bool) -> bool {
        if self.buf.is_empty() {
            // A stream can last minutes: its connection holds no read buffer meanwhile (one
            // comes back if the client sends more).
            self.buf = BytesMut::new();
        }
        // True when the source has answered `Pending` in this very poll of the task, with no
        // wait since: it need not be asked again before the task is woken.
        let mut polled = false;
        let mut first = first_alone;
        loop {
            let next = self.watching(polled, |cx, out| source.poll_chunk_into(cx, out));
            let Some(mut next) = next.await else {
                return false;
            };
            // Take what else is ready now, so that it shares the write.
            let mut pending = false;
            loop {
                match next {
                    Ok(Framed::More) => {}
                    Ok(Framed::End) => {
                        drop(source);
                        self.out.extend_from_slice(LAST_CHUNK);
                        return self.flush().await.is_some();
                    }
                    // A stream cut short: the client must not take it for a whole one.
                    Err(StreamCut) => return false,
                }
                if std::mem::take(&mut first) || self.out.len() >= MAX_ROOM {
                    break;
                }
                let out = &mut self.out;
                match poll_fn(|cx| Poll::Ready(source.poll_chunk_into(cx, out))).await {
                    Poll::Ready(more) => next = more,
                    Poll::Pending => {
                        pending = true;
                        break;
                    }
                }
            }
            match self.flush().await {
                Some(waited) => polled = pending && !waited,
                None => return false,
            }
        }
    }

    /// Buffers grown by a large upload or answer go back to nothing between requests.
    fn shrink(&mut self) {
        if self.buf.capacity() > MAX_ROOM {
            self.buf = BytesMut::from(&self.buf[..]);
        }
        if self.out.capacity() > MAX_ROOM {
            self.out = BytesMut::new();
        }
    }

    /// Writes `out`: `None` when the connection failed or the client stopped taking bytes, else
    /// whether the write had to wait for the connection (the task was parked meanwhile).
    async fn flush(&mut self) -> Option<bool> {
        let (io, out) = (&mut self.io, &self.out);
        let (mut written, mut waited) = (0, false);
        let ok = poll_fn(|cx| {
            while written < out.len() {
                match Pin::new(&mut *io).poll_write(cx, &out[written..]) {
                    Poll::Ready(Ok(0) | Err(_)) => return Poll::Ready(false),
                    Poll::Ready(Ok(n)) => written += n,
                    Poll::Pending => {
                        waited = true;
                        return Poll::Pending;
                    }
                }
            }
            Poll::Ready(true)
        })
        .await;
        self.out.clear();
        ok.then_some(waited)
    }

    /// hyper's answer to a head it cannot parse, then the close: hyper itself waits for more
    /// bytes after some heads httparse has already refused (bare CRs past the first 24 bytes).
    async fn refuse_invalid(mut self) {
        self.out.clear();
        encode_bad_request(&mut self.out);
        let _ = self.flush().await;
    }

    /// The handler serves the connection from here on, starting with the bytes already read.
    async fn hand_off<H: Handler<IO>>(mut self, head: Option<Bytes>, handler: H) {
        let mut read = BytesMut::with_capacity(head.as_ref().map_or(0, Bytes::len) + self.buf.len());
        if let Some(head) = head {
            read.extend_from_slice(&head);
        }
        read.extend_from_slice(&self.buf);
        self.io.read = read.freeze();
        handler.hand_off(self.io).await;
    }
}
