//! The public port's HTTP/1.1 for the requests that make up the hot path: a POST to one of the
//! two completion endpoints, with a `Content-Length` body. They are served on the connection's
//! own task: the head parsed with httparse, the body read into the connection's buffer, the
//! answer written as it comes, whatever is ready in one write.
//!
//! hyper's server costs, per client connection, two 8 KiB buffers, and per relayed chunk a pass
//! through its dispatcher and the body's layers. Everything else keeps hyper: HTTP/2, other
//! paths and methods, HTTP/1.0, chunked or `Expect` uploads, `Upgrade`, heads too large or
//! malformed. The first such request hands the connection, with every byte read so far, to hyper
//! for the rest of its life, which then answers it as it always did.

use crate::gateway::Gateway;
use crate::prepare::{Api, DEADLINE_HEADER, PRIORITY_HEADER, REQUEST_ID_HEADER};
use crate::server::{Front, Reply};
use crate::traces::TRACE_HEADERS;
use axum::http::header::{CONNECTION, CONTENT_LENGTH, EXPECT, HOST, TRANSFER_ENCODING, UPGRADE};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Uri, Version};
use axum::response::Response;
use bytes::{Buf, Bytes, BytesMut};
use hyper::body::{Body, Frame, SizeHint};
use hyper_util::rt::TokioExecutor;
use hyper_util::rt::TokioIo;
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::Watcher;
use memchr::memmem;
use prometheus::IntCounter;
use std::cell::RefCell;
use std::future::{Future, poll_fn};
use std::io::Write as _;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};

/// Header lines a head may have, as hyper allows.
const MAX_HEADERS: usize = 100;
/// What one read asks for.
const READ_SIZE: usize = 4096;
/// The most room made for a body before its bytes arrive, the most a stream's write gathers of
/// what is ready, and the most buffer capacity a connection keeps between requests.
const MAX_ROOM: usize = 64 * 1024;
/// The end of a chunked body.
const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// Requests this module's connections are serving, in the whole process, from their body's
/// arrival to their answer's end (those hyper serves are not counted). A stream written alone
/// is a sign of an idle gateway only with those waiting on their replica counted: a stream of
/// back-to-back tokens is written whole in one poll, so streams being written hardly overlap.
static SERVING: AtomicUsize = AtomicUsize::new(0);

/// One request counted in [`SERVING`] while it is served.
struct Counted;

impl Counted {
    fn start() -> Counted {
        SERVING.fetch_add(1, Ordering::Relaxed);
        Counted
    }

    /// No other request is being served: the gateway has nothing else to do.
    fn alone() -> bool {
        SERVING.load(Ordering::Relaxed) <= 1
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        SERVING.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What a connection's task needs besides its socket.
pub(crate) struct Serving {
    pub(crate) gateway: Arc<Gateway>,
    pub(crate) front: Front,
    pub(crate) hyper: Arc<auto::Builder<TokioExecutor>>,
    /// For the connection once it is hyper's.
    pub(crate) watcher: Watcher,
    /// True once the listener has closed: idle connections close, busy ones after their answer.
    pub(crate) closing: watch::Receiver<bool>,
}

/// Serves one client connection until it closes, the drain closes it, or it is handed to hyper.
pub(crate) async fn serve(tcp: TcpStream, mut s: Serving) {
    let server = s.gateway.config.server.clone();
    let mut conn = Conn {
        io: client_io(tcp, &s.gateway),
        buf: BytesMut::new(),
        out: BytesMut::new(),
    };
    // hyper's own limit on a head; past it, hyper answers 431 itself.
    let max_head = crate::listener::max_head_buffer(&server);
    loop {
        let head_deadline = Instant::now() + server.header_timeout;
        // A head already read ahead is taken first; a partial one does not hold up the drain.
        let head = tokio::select! {
            biased;
            h = tokio::time::timeout_at(head_deadline, conn.read_head(max_head)) => match h {
                Ok(h) => h,
                Err(_) => return,
            },
            () = closed(&mut s.closing) => return,
        };
        let (head, request, read_for) = match head {
            Head::Closed => return,
            Head::Other => return conn.hand_to_hyper(None, s).await,
            Head::Invalid => return conn.refuse_invalid().await,
            Head::Complete(head) => {
                // The table in force says which headers its routes' rules read.
                let table = s.gateway.table();
                match Request::from_head(&head, &table.rule_headers, server.max_header_bytes) {
                    Some(r) => (head, r, table),
                    None => return conn.hand_to_hyper(Some(head), s).await,
                }
            }
        };
        if request.content_length > server.max_body_bytes {
            // hyper's path answers 413, reading no more than the limit.
            return conn.hand_to_hyper(Some(head), s).await;
        }
        let body_deadline = Instant::now() + server.body_timeout;
        let body = match tokio::time::timeout_at(body_deadline, conn.read_body(request.content_length)).await
        {
            Ok(Some(body)) => Upload::Whole(Some(body)),
            Ok(None) => return,
            Err(_) => Upload::TimedOut,
        };
        // The request is served by the table in force once its body is in, as on hyper's path (a
        // key a reload removed meanwhile is refused). A reload that changed the rules' headers
        // meanwhile has the head read again for them.
        let table = s.gateway.table();
        let request = if Arc::ptr_eq(&table, &read_for) || table.rule_headers == read_for.rule_headers {
            request
        } else {
            Request::from_head(&head, &table.rule_headers, server.max_header_bytes).unwrap_or(request)
        };
        drop(read_for);
        let close = request.close || matches!(body, Upload::TimedOut);
        let api = request.api;
        let req = request.with_body(body);
        let _counted = Counted::start();
        // Boxed: the request path's future is over 4 KB, and a connection's task would otherwise
        // hold that much for as long as it lives, streaming or idle.
        let mut answer = Box::pin(crate::server::completion(
            s.gateway.clone(),
            Some(table),
            api,
            req,
        ));
        let Some(response) = conn.or_gone(answer.as_mut()).await else {
            return;
        };
        drop(answer);
        let close = close || *s.closing.borrow();
        if !conn.respond(response, close).await || close {
            return;
        }
        conn.shrink();
    }
}

/// Resolves once the listener is closing.
async fn closed(closing: &mut watch::Receiver<bool>) {
    let _ = closing.wait_for(|closing| *closing).await;
}

/// A client connection while this module serves it.
struct Conn {
    /// Read here through `io.tcp` directly; written through `io` and its send timer.
    io: ClientIo,
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

impl Conn {
    /// Reads until `buf` starts with a whole head, which is split off.
    async fn read_head(&mut self, max_head: usize) -> Head {
        // Where the search for a head's end resumes: a head sent a byte at a time is not parsed
        // again from its start with every byte.
        let mut searched: usize = 0;
        loop {
            let (blank, scanned) = scan(&self.buf, &mut searched, max_head);
            self.buf.advance(blank);
            match scanned {
                Scan::Complete(end) => return Head::Complete(self.buf.split_to(end).freeze()),
                Scan::Other => return Head::Other,
                Scan::Invalid => return Head::Invalid,
                Scan::More => {}
            }
            self.buf.reserve(READ_SIZE);
            match self.io.tcp.read_buf(&mut self.buf).await {
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
            match self.io.tcp.read_buf(&mut self.buf).await {
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

    /// [`Conn::or_gone`] for a poll function, which may write to `out`. With `polled`, its first
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
            match self.io.tcp.poll_read_ready(cx) {
                Poll::Pending => return false,
                Poll::Ready(Err(_)) => return true,
                Poll::Ready(Ok(())) => {}
            }
            self.buf.reserve(READ_SIZE);
            match self.io.tcp.try_read_buf(&mut self.buf) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => return true,
            }
        }
        false
    }

    /// Writes the answer; false when the connection cannot carry another one.
    async fn respond(&mut self, response: Response<Reply>, close: bool) -> bool {
        let (parts, reply) = response.into_parts();
        self.out.clear();
        match reply {
            Reply::Stream(relay) => {
                encode_head(&mut self.out, &parts, None, close, |out| {
                    crate::server::stream_fields(relay.exchange(), &mut |name, value| {
                        encode_field(out, name.as_str().as_bytes(), value);
                    });
                });
                self.write_chunked(relay).await
            }
            Reply::Body(mut body) => {
                let length = body.size_hint().exact();
                encode_head(&mut self.out, &parts, length, close, |_| {});
                match length {
                    Some(_) => self.write_whole(&mut body).await,
                    None => self.write_chunked(body).await,
                }
            }
        }
    }

    /// A body of known length: its bytes after the head, then one write. A large piece (a whole
    /// answer read from a replica is one) is written from its own buffer, not copied after the
    /// head.
    async fn write_whole(&mut self, body: &mut axum::body::Body) -> bool {
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
                    end(body);
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
    /// last chunk with the end), up to [`MAX_ROOM`] a write: for a replica faster than its
    /// client, each turn would otherwise gather as many reads as tokio's budget allows. The
    /// client is watched while the next chunk is awaited. The
    /// source is dropped once it has ended, before its last bytes go out, for the reason [`end`]
    /// gives.
    ///
    /// A stream alone in the gateway (no other request served) sends its first chunk (and the
    /// head) at once, whatever else is ready: that is the client's time to first token, and an
    /// idle gateway has nothing to gain from one write fewer. Under load it shares the write too.
    async fn write_chunked(&mut self, source: impl Chunks) -> bool {
        self.write_stream(source, Counted::alone()).await
    }

    /// [`Conn::write_chunked`], the first chunk written on its own if `first_alone`.
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
    /// whether the write had to wait for the socket (the task was parked meanwhile).
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
        self.out.extend_from_slice(
            b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\ndate: ",
        );
        DATE.with_borrow_mut(|d| self.out.extend_from_slice(d.now()));
        self.out.extend_from_slice(b"\r\n\r\n");
        let _ = self.flush().await;
    }

    /// hyper serves the connection from here on, starting with the bytes already read.
    async fn hand_to_hyper(mut self, head: Option<Bytes>, s: Serving) {
        if *s.closing.borrow() {
            // hyper would be told to stop before it read the request: close instead.
            return;
        }
        let mut read = BytesMut::with_capacity(head.as_ref().map_or(0, Bytes::len) + self.buf.len());
        if let Some(head) = head {
            read.extend_from_slice(&head);
        }
        read.extend_from_slice(&self.buf);
        self.io.read = read.freeze();
        // hyper's drain watches it from here on.
        drop(s.closing);
        let serving = s.hyper.serve_connection(TokioIo::new(self.io), s.front);
        // Boxed: hyper's connection would otherwise make every connection's task that large.
        let _ = Box::pin(s.watcher.watch(serving)).await;
    }
}

/// What the bytes read so far hold, as [`scan`] finds it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Scan {
    /// A whole head, this long (after the blank lines skipped).
    Complete(usize),
    /// Not a head this module parses: too large, or HTTP/2's preface.
    Other,
    /// Bytes that cannot begin a request.
    Invalid,
    /// Not yet a whole head.
    More,
}

/// Looks at what a connection has read: how many bytes of blank lines to skip first, then what
/// follows them. `searched` is how far an earlier call looked for the head's end (0 at first), so
/// that a head sent a byte at a time is not searched again from its start with every byte.
/// Parsing apart from the socket: the fuzz target `front_head` runs this very function.
pub(crate) fn scan(buf: &[u8], searched: &mut usize, max_head: usize) -> (usize, Scan) {
    // Blank lines before a request line are ignored (RFC 9112 2.2), as hyper does: CR LF or LF,
    // never a lone CR, which hyper answers with 400.
    let blank = blank_lines(buf);
    let buf = &buf[blank..];
    if buf.starts_with(b"PRI ") {
        return (blank, Scan::Other);
    }
    let from = searched.saturating_sub(blank).saturating_sub(2);
    *searched = buf.len();
    // A head ends at its first blank line, as an SSE event does; it is parsed once, by
    // `Request::from_head` (one that does not parse goes to hyper, these bytes first).
    if let Some(end) = head_end(&buf[from..]) {
        return (blank, Scan::Complete(from + end));
    }
    if buf.len() > max_head {
        return (blank, Scan::Other);
    }
    // Bytes that cannot begin a request (a TLS handshake, a lone CR, garbage) are refused at
    // once, instead of waiting for a blank line until `header_timeout`.
    if !may_be_head(buf) {
        return (blank, Scan::Invalid);
    }
    (blank, Scan::More)
}

/// How many bytes of blank lines (CR LF or LF) `buf` starts with.
fn blank_lines(buf: &[u8]) -> usize {
    let mut at = 0;
    loop {
        match &buf[at..] {
            [b'\n', ..] => at += 1,
            [b'\r', b'\n', ..] => at += 2,
            _ => return at,
        }
    }
}

/// Whether `buf`, which holds no whole head, may be the start of one: httparse finds nothing
/// wrong in it so far. Run only while a head is incomplete after a read, which a client's head
/// seldom is.
fn may_be_head(buf: &[u8]) -> bool {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    match httparse::Request::new(&mut headers).parse(buf) {
        Ok(_) | Err(httparse::Error::TooManyHeaders) => true,
        Err(_) => false,
    }
}

/// Whether a `Host` value is one RFC 9112 §3.2 lets a server take: `uri-host [ ":" port ]`, or
/// empty (a target without an authority).
pub(crate) fn valid_host(value: &[u8]) -> bool {
    if value.is_empty() {
        return true;
    }
    // `http` takes any text for a port; RFC 3986's is digits.
    let port = match value.iter().rposition(|b| *b == b':') {
        Some(i) if !value[i..].contains(&b']') => &value[i + 1..],
        _ => b"",
    };
    port.iter().all(u8::is_ascii_digit)
        && !value.contains(&b'@')
        && axum::http::uri::Authority::try_from(value).is_ok()
}

/// The index just past the first blank line, as [`protocol::sse::event_end`] finds it (a line
/// feed, then an empty line ended by LF or CR LF), in two vector searches: that one takes a
/// search per line, and a head has many (seventeen from OpenAI's client, 2,000 instructions).
fn head_end(buf: &[u8]) -> Option<usize> {
    static LF_LF: LazyLock<memmem::Finder<'static>> = LazyLock::new(|| memmem::Finder::new(b"\n\n"));
    static LF_CRLF: LazyLock<memmem::Finder<'static>> = LazyLock::new(|| memmem::Finder::new(b"\n\r\n"));
    // CR LF heads are the rule: a bare LF LF is looked for only before the CR LF blank line
    // (not through the body bytes read with the head). Both cannot start at the same byte.
    match LF_CRLF.find(buf) {
        Some(crlf) => Some(LF_LF.find(&buf[..crlf + 1]).map_or(crlf + 3, |lf| lf + 2)),
        None => LF_LF.find(buf).map(|lf| lf + 2),
    }
}

/// Drops an answer's body once it has ended, before its last bytes go out: the request's access
/// log line and metrics are written when its exchange drops, and a client that has the whole
/// answer must find them there (hyper drops a body as soon as it ends, too).
fn end(body: &mut axum::body::Body) {
    *body = axum::body::Body::empty();
}

/// The status line, the fields `fields` writes, the headers, then hyper's framing and `date`.
fn encode_head(
    out: &mut BytesMut,
    parts: &axum::http::response::Parts,
    length: Option<u64>,
    close: bool,
    fields: impl FnOnce(&mut BytesMut),
) {
    let status = parts.status;
    if status == axum::http::StatusCode::OK {
        out.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
    } else {
        let _ = write!(
            Writer(out),
            "HTTP/1.1 {} {}\r\n",
            status.as_str(),
            status.canonical_reason().unwrap_or("")
        );
    }
    fields(out);
    for (name, value) in &parts.headers {
        if name == CONTENT_LENGTH || name == TRANSFER_ENCODING || name == CONNECTION {
            continue;
        }
        encode_field(out, name.as_str().as_bytes(), value.as_bytes());
    }
    match length {
        Some(n) => {
            let _ = write!(Writer(out), "content-length: {n}\r\n");
        }
        None => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"date: ");
    DATE.with_borrow_mut(|d| out.extend_from_slice(d.now()));
    out.extend_from_slice(b"\r\n\r\n");
}

fn encode_field(out: &mut BytesMut, name: &[u8], value: &[u8]) {
    // What `HeaderValue` would take: a value written raw must not end the line (or the head).
    debug_assert!(
        value.iter().all(|&b| b == b'\t' || (0x20..0x7f).contains(&b)),
        "{value:?}"
    );
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// What a chunked answer's bytes come from.
trait Chunks {
    /// Appends the next chunk, framed, to `out` (nothing if it is empty), or says the answer has
    /// ended (its last bytes appended first) or failed.
    fn poll_chunk_into(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut BytesMut,
    ) -> Poll<Result<Framed, StreamCut>>;
}

enum Framed {
    More,
    End,
}

/// A chunked answer that failed before its end.
struct StreamCut;

/// A stream's relay, framed straight from its buffer: no piece of it split off, boxed or
/// dropped per chunk.
impl Chunks for Box<crate::relay::Relay> {
    fn poll_chunk_into(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut BytesMut,
    ) -> Poll<Result<Framed, StreamCut>> {
        std::task::ready!(self.poll_out(cx));
        encode_chunk(out, self.out());
        self.written();
        Poll::Ready(Ok(if self.is_done() { Framed::End } else { Framed::More }))
    }
}

impl Chunks for axum::body::Body {
    fn poll_chunk_into(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut BytesMut,
    ) -> Poll<Result<Framed, StreamCut>> {
        Poll::Ready(match std::task::ready!(Pin::new(self).poll_frame(cx)) {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    encode_chunk(out, &data);
                }
                Ok(Framed::More)
            }
            Some(Err(_)) => Err(StreamCut),
            None => Ok(Framed::End),
        })
    }
}

fn encode_chunk(out: &mut BytesMut, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    let mut size = [0u8; 16];
    let mut at = size.len();
    let mut n = data.len();
    while n > 0 || at == size.len() {
        at -= 1;
        size[at] = b"0123456789abcdef"[n % 16];
        n /= 16;
    }
    out.extend_from_slice(&size[at..]);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// `io::Write` into a `BytesMut`, for `write!`.
struct Writer<'a>(&'a mut BytesMut);

impl std::io::Write for Writer<'_> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

thread_local! {
    static DATE: RefCell<Date> = const { RefCell::new(Date { second: u64::MAX, text: String::new() }) };
}

/// The `date` header's value, formatted once a second.
struct Date {
    second: u64,
    text: String,
}

impl Date {
    fn now(&mut self) -> &[u8] {
        let now = std::time::SystemTime::now();
        let second = now
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if second != self.second {
            self.second = second;
            self.text = httpdate::fmt_http_date(now);
        }
        self.text.as_bytes()
    }
}

/// The request headers the request path reads, besides those the routes' rules name: the API key
/// (`server::auth`), the request's ID, deadline and priority (`prepare`), and the W3C trace
/// context (`traces`). A header read anywhere else on the request path belongs here: this module
/// passes on no other.
const READ_HEADERS: [&str; 6] = [
    "authorization",
    REQUEST_ID_HEADER,
    DEADLINE_HEADER,
    PRIORITY_HEADER,
    TRACE_HEADERS[0],
    TRACE_HEADERS[1],
];

/// A completion request's head, parsed once: what this module acts on, and the headers the
/// request path reads, their values sharing the head's bytes.
pub(crate) struct Request {
    pub(crate) api: Api,
    pub(crate) uri: Uri,
    headers: HeaderMap,
    pub(crate) content_length: usize,
    /// The client asked to close after the answer.
    pub(crate) close: bool,
}

impl Request {
    /// `None` for a head hyper answers instead, one over `max_header_bytes` included (431, as
    /// `server` counts a head). Of the headers, only those the request path reads are kept
    /// ([`READ_HEADERS`] and `rule_headers`): each kept costs a name check, a hash and an
    /// insertion, and a client such as OpenAI's sends seventeen.
    pub(crate) fn from_head(
        head: &Bytes,
        rule_headers: &[String],
        max_header_bytes: usize,
    ) -> Option<Request> {
        // Uninitialised, as in the replica's head (upstream::h1).
        let mut slots = [const { std::mem::MaybeUninit::uninit() }; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut []);
        if !req
            .parse_with_uninit_headers(head, &mut slots)
            .ok()?
            .is_complete()
        {
            return None;
        }
        if req.method? != "POST" || req.version? != 1 {
            return None;
        }
        let path = req.path?;
        // A target httparse takes and `http` does not (raw UTF-8, say) gets hyper's 400.
        let uri = Uri::from_maybe_shared(head.slice_ref(path.as_bytes())).ok()?;
        let api = match uri.path() {
            "/v1/chat/completions" => Api::Chat,
            "/v1/completions" => Api::Completions,
            _ => return None,
        };
        let mut content_length = None;
        let mut close = false;
        // RFC 9112 §3.2: one Host, valid; hyper's path answers any other head with 400.
        let mut hosts = 0;
        // As `server::head_size` counts a head against `max_header_bytes`.
        let mut size = uri.path_and_query().map_or(0, |p| p.as_str().len());
        let mut headers = HeaderMap::new();
        for h in req.headers.iter() {
            size += crate::server::header_size(h.name.as_bytes(), h.value);
            let read = |n: &&str| h.name.eq_ignore_ascii_case(n);
            if (READ_HEADERS.iter().any(read) || rule_headers.iter().any(|n| read(&n.as_str())))
                && let (Ok(name), Ok(value)) = (
                    HeaderName::from_bytes(h.name.as_bytes()),
                    HeaderValue::from_maybe_shared(head.slice_ref(h.value)),
                )
            {
                headers.append(name, value);
            }
            if h.name.eq_ignore_ascii_case(HOST.as_str()) {
                hosts += 1;
                if !valid_host(h.value) {
                    return None;
                }
            } else if h.name.eq_ignore_ascii_case(CONTENT_LENGTH.as_str()) {
                let n = std::str::from_utf8(h.value).ok()?;
                if content_length.is_some() || n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                content_length = Some(n.parse::<usize>().ok()?);
            } else if h.name.eq_ignore_ascii_case(TRANSFER_ENCODING.as_str())
                || h.name.eq_ignore_ascii_case(EXPECT.as_str())
                || h.name.eq_ignore_ascii_case(UPGRADE.as_str())
            {
                return None;
            } else if h.name.eq_ignore_ascii_case(CONNECTION.as_str()) {
                let v = std::str::from_utf8(h.value).ok()?;
                if v.split(',').any(|t| t.trim().eq_ignore_ascii_case("upgrade")) {
                    return None;
                }
                close |= v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close"));
            }
        }
        if size > max_header_bytes || hosts != 1 {
            return None;
        }
        Some(Request {
            api,
            uri,
            headers,
            content_length: content_length?,
            close,
        })
    }

    /// The request as the request path takes it.
    fn with_body(self, body: Upload) -> axum::http::Request<Upload> {
        let mut req = axum::http::Request::new(body);
        *req.method_mut() = Method::POST;
        *req.uri_mut() = self.uri;
        *req.version_mut() = Version::HTTP_11;
        *req.headers_mut() = self.headers;
        req
    }
}

/// A request body read whole before the request path starts, or one that did not arrive within
/// `server.body_timeout`.
pub(crate) enum Upload {
    Whole(Option<Bytes>),
    TimedOut,
}

/// The error of an [`Upload`] that ran out of time; the request path answers it with 408.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive in time")]
pub(crate) struct BodyTimedOut;

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

/// A client's socket. Writes are cut when one stays blocked for `server.send_timeout` (nginx's
/// `send_timeout`): the timer runs only while a write is blocked, and each byte taken restarts
/// it. Without it a client that stops reading would hold its slot and its replica's stream for
/// ever, since a blocked write stops the relay from being polled, timers and all. Once hyper
/// serves the connection, reads first give back the bytes `front` had already read (`read`).
pub(crate) struct ClientIo {
    tcp: TcpStream,
    read: Bytes,
    send_timeout: Duration,
    /// Made the first time a write blocks, then reused.
    sleep: Option<Pin<Box<Sleep>>>,
    /// Whether `sleep` runs for the write now blocked.
    armed: bool,
    cut: IntCounter,
}

/// A client connection's socket, for `front` or for hyper from its start (a connection over
/// `server.max_connections`).
pub(crate) fn client_io(tcp: TcpStream, gateway: &Gateway) -> ClientIo {
    ClientIo::new(
        tcp,
        gateway.config.server.send_timeout,
        gateway.metrics.send_timeouts.clone(),
    )
}

impl ClientIo {
    fn new(tcp: TcpStream, send_timeout: Duration, cut: IntCounter) -> ClientIo {
        ClientIo {
            tcp,
            read: Bytes::new(),
            send_timeout,
            sleep: None,
            armed: false,
            cut,
        }
    }

    /// `write` (one socket write), with the timer armed while it is pending.
    fn poll_timed(
        &mut self,
        cx: &mut Context<'_>,
        write: impl FnOnce(&mut TcpStream, &mut Context<'_>) -> Poll<std::io::Result<usize>>,
    ) -> Poll<std::io::Result<usize>> {
        if let Poll::Ready(r) = write(&mut self.tcp, cx) {
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
            self.cut.inc();
            return Poll::Ready(Err(std::io::ErrorKind::TimedOut.into()));
        }
        Poll::Pending
    }
}

impl AsyncRead for ClientIo {
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
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for ClientIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.poll_timed(cx, |tcp, cx| Pin::new(tcp).poll_write(cx, buf))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.poll_timed(cx, |tcp, cx| Pin::new(tcp).poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    fn head(lines: &str) -> Option<Request> {
        Request::from_head(&Bytes::from(format!("{lines}\r\n\r\n")), &[], usize::MAX)
    }

    #[test]
    fn only_plain_completion_posts_are_served_here() {
        let r = head("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 12").unwrap();
        assert_eq!((r.api, r.content_length, r.close), (Api::Chat, 12, false));
        let r =
            head("POST /v1/completions?a=b HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nConnection: keep-alive, Close")
                .unwrap();
        assert_eq!((r.api, r.content_length, r.close), (Api::Completions, 0, true));
        for other in [
            "GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1",
            "POST /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: 1",
            "POST /v1/chat/completions/ HTTP/1.1\r\nHost: x\r\nContent-Length: 1",
            "POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nContent-Length: 1",
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x",
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 1",
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: +1",
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999",
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nTransfer-Encoding: chunked",
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nExpect: 100-continue",
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nConnection: Upgrade",
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nUpgrade: h2c",
        ] {
            assert!(head(other).is_none(), "{other}");
        }
        // Up to MAX_HEADERS headers are read here; a head with more goes to hyper, whose own limit
        // answers it.
        let with = |n: usize| {
            let extra: String = (3..=n).map(|i| format!("\r\nx-h{i}: {i}")).collect();
            head(&format!(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3{extra}"
            ))
        };
        let r = with(MAX_HEADERS).unwrap();
        assert_eq!(r.content_length, 3);
        assert!(with(MAX_HEADERS + 1).is_none());
    }

    /// RFC 9112 §3.2 (B03: a missing, repeated or invalid Host was served): such a head goes to
    /// hyper's path, which answers 400.
    #[test]
    fn a_head_without_exactly_one_valid_host_is_not_served_here() {
        let with = |hosts: &str| {
            head(&format!(
                "POST /v1/completions HTTP/1.1\r\n{hosts}Content-Length: 0"
            ))
        };
        for good in [
            "Host: x\r\n",
            "host: gw.example:8080\r\n",
            "Host: [::1]:80\r\n",
            "Host: \r\n",
        ] {
            assert!(with(good).is_some(), "{good:?}");
        }
        for bad in [
            "",
            "Host: a\r\nHost: a\r\n",
            "Host: a b\r\n",
            "Host: user@gw\r\n",
            "Host: gw:port\r\n",
            "Host: gw/path\r\n",
        ] {
            assert!(with(bad).is_none(), "{bad:?}");
        }
    }

    /// The request-head checklist (after pingora's tests of its HTTP/1 server), each head read
    /// in two pieces cut at every byte, as a connection reads it: what `front` serves itself,
    /// and what it leaves to hyper (`None`), which answers it as it always did.
    #[test]
    fn heads_scan_and_parse_alike_however_they_are_cut() {
        // A head, and what `front` reads of it: its length and `close`, or `None` for hyper's.
        type Case = (&'static str, &'static str, Option<(usize, bool)>);
        let cases: [Case; 14] = [
            (
                "plain",
                "POST /v1/chat/completions HTTP/1.1
Host: x
Content-Length: 2

",
                Some((2, false)),
            ),
            (
                "blank lines first",
                "

POST /v1/completions HTTP/1.1
Host: x
Content-Length: 0

",
                Some((0, false)),
            ),
            (
                "bare LF lines",
                "POST /v1/completions HTTP/1.1
Host: x
Content-Length: 3

",
                Some((3, false)),
            ),
            (
                "close",
                "POST /v1/completions HTTP/1.1
Host: x
Connection: close
Content-Length: 1

",
                Some((1, true)),
            ),
            (
                "length with leading zeros",
                "POST /v1/completions HTTP/1.1
Host: x
Content-Length: 007

",
                Some((7, false)),
            ),
            (
                "two lengths",
                "POST /v1/completions HTTP/1.1
Host: x
Content-Length: 1
Content-Length: 1

",
                None,
            ),
            (
                "signed length",
                "POST /v1/completions HTTP/1.1
Host: x
Content-Length: +1

",
                None,
            ),
            (
                "length list",
                "POST /v1/completions HTTP/1.1
Host: x
Content-Length: 1, 1

",
                None,
            ),
            (
                "length and chunked",
                "POST /v1/completions HTTP/1.1
Host: x
Content-Length: 1
Transfer-Encoding: chunked

",
                None,
            ),
            (
                "chunked not last",
                "POST /v1/completions HTTP/1.1
Host: x
Transfer-Encoding: chunked, gzip

",
                None,
            ),
            (
                "HTTP/1.0",
                "POST /v1/completions HTTP/1.0
Host: x
Content-Length: 1

",
                None,
            ),
            (
                "obs-fold",
                "POST /v1/completions HTTP/1.1
Host: x
X-A: 1
 folded
Content-Length: 1

",
                None,
            ),
            (
                "space before colon",
                "POST /v1/completions HTTP/1.1
Host: x
Content-Length : 1

",
                None,
            ),
            (
                "no length",
                "POST /v1/completions HTTP/1.1
Host: x

",
                None,
            ),
        ];
        for (name, head, want) in cases {
            let wire = format!("{head}body");
            for cut in 0..=wire.len() {
                let got = crate::fuzzing::front_head(wire.as_bytes(), cut);
                let got = got.map(|h| {
                    assert_eq!(h.body_offset, head.len(), "{name}, cut at {cut}");
                    (h.content_length, h.close)
                });
                assert_eq!(got, want, "{name}, cut at {cut}");
            }
        }
    }

    /// Only CR LF and LF are blank lines; a lone CR is not (B02: `\rPOST …` was served).
    #[test]
    fn blank_lines_before_a_head_are_cr_lf_or_lf_never_a_lone_cr() {
        assert_eq!(blank_lines(b"\r\n\n\r\nPOST"), 5);
        assert_eq!(blank_lines(b"\rPOST"), 0);
        assert_eq!(blank_lines(b"\n\rPOST"), 1);
        assert_eq!(blank_lines(b"\r"), 0, "a CR whose LF has not come yet is kept");
    }

    /// B01: what cannot start a request is handed over at once, not held until header_timeout.
    #[test]
    fn bytes_that_cannot_start_a_request_are_seen_before_a_blank_line() {
        for partial in [
            &b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le"[..],
            b"PO",
            b"",
            b"\r",
        ] {
            assert!(may_be_head(partial), "{partial:?}");
        }
        let client_hello = [0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03];
        for garbage in [
            &client_hello[..],
            b"\rPOST / HTTP/1.1",
            b"POST / HTTP/1.1\rHost: x\r",
            b"POST /v1/chat/completions HTTP/1.1\rHost: x\rContent-Length: 2\r\r{}",
            b"POST / HTTP/1.1\r\nHost: x\r\r",
            b"\x00\x01\x02",
            b"POST /a b HTTP/1.1\r\n",
        ] {
            assert!(!may_be_head(garbage), "{garbage:?}");
        }
    }

    #[test]
    fn the_request_shares_the_heads_bytes_and_keeps_the_headers_read() {
        let raw = Bytes::from_static(
            b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: gw\r\nX-Request-Id: abc\r\nX-Tag: 1\r\nX-Tag: 2\r\nAuthorization: Bearer k\r\nX-Spillway-Priority: low\r\nContent-Length: 2\r\n\r\n",
        );
        let r = Request::from_head(&raw, &[], usize::MAX).unwrap();
        let req = r.with_body(Upload::Whole(Some(Bytes::from_static(b"{}"))));
        assert_eq!(req.uri().path(), "/v1/chat/completions");
        assert_eq!(req.uri().query(), Some("x=1"));
        assert_eq!(req.headers()["x-request-id"], "abc");
        assert_eq!(req.headers()["authorization"], "Bearer k");
        assert_eq!(req.headers()[PRIORITY_HEADER], "low");
        assert_eq!(req.headers().len(), 3, "{:?}", req.headers());
        assert_eq!(req.body().size_hint().exact(), Some(2));
        // A header a routing or class rule names is kept, every line of it.
        let r = Request::from_head(&raw, &["x-tag".to_string()], usize::MAX).unwrap();
        assert_eq!(r.headers.get_all("x-tag").iter().count(), 2);
        assert!(!r.headers.contains_key("host"));
    }

    #[test]
    fn a_head_over_max_header_bytes_goes_to_hyper_counted_as_server_counts_it() {
        let raw = Bytes::from_static(
            b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: gw\r\nX-Tag: 1\r\nContent-Length: 2\r\n\r\n",
        );
        // The path and query, then each header's name and value and 4: 24 + 10 + 10 + 19, every
        // header counted, kept or not.
        assert!(Request::from_head(&raw, &[], 63).is_some());
        assert!(Request::from_head(&raw, &[], 62).is_none());
    }

    #[test]
    fn a_heads_end_is_the_first_blank_line_as_an_events_is() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        for _ in 0..20_000 {
            let len = rng.random_range(0..24);
            let buf: Vec<u8> = (0..len).map(|_| b"a\r\n"[rng.random_range(0..3)]).collect();
            assert_eq!(head_end(&buf), protocol::sse::event_end(&buf), "{buf:?}");
        }
        let head = b"POST / HTTP/1.1\r\nA: b\r\n\r\nnext\n\n";
        assert_eq!(head_end(head), Some(25));
    }

    #[test]
    fn chunks_are_framed_in_hex_and_empty_ones_are_not_written() {
        let mut out = BytesMut::new();
        encode_chunk(&mut out, b"");
        assert!(out.is_empty(), "an empty chunk would end the stream");
        encode_chunk(&mut out, b"hi");
        encode_chunk(&mut out, &[b'a'; 0x1f3]);
        assert!(out.starts_with(b"2\r\nhi\r\n1f3\r\naaa"), "{:?}", &out[..16]);
        assert!(out.ends_with(b"a\r\n"));
    }

    /// A source fed through a channel: `Pending`, its waker kept, while the channel is empty.
    struct Fed(tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>);

    impl Chunks for Fed {
        fn poll_chunk_into(
            &mut self,
            cx: &mut Context<'_>,
            out: &mut BytesMut,
        ) -> Poll<Result<Framed, StreamCut>> {
            Poll::Ready(match std::task::ready!(self.0.poll_recv(cx)) {
                Some(data) => {
                    encode_chunk(out, &data);
                    Ok(Framed::More)
                }
                None => Ok(Framed::End),
            })
        }
    }

    /// A chunk that becomes ready while a write waits for the client goes out once that write is
    /// done: the wake-up it gave was spent on the write, so the source is asked again.
    #[tokio::test]
    async fn a_chunk_ready_while_a_write_waits_goes_out_after_it() {
        let (mut client, io, _) = connected().await;
        let mut conn = test_conn(io);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        // Far more than the loopback's socket buffers hold: the write waits for the client.
        let big = vec![b'a'; 32 << 20];
        tx.send(big.clone()).unwrap();
        // Not alone: the path where the source is asked again after a write, not the process's
        // count of streams, decides what this test sees.
        let writer = tokio::spawn(async move { conn.write_stream(Fed(rx), false).await });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!writer.is_finished(), "the write waits for the client");
        tx.send(b"late".to_vec()).unwrap();
        drop(tx);
        let mut got = Vec::new();
        let end = b"\r\n4\r\nlate\r\n0\r\n\r\n";
        let read_all = async {
            let mut piece = vec![0u8; 1 << 16];
            while !got.ends_with(end) {
                let n = client.read(&mut piece).await.unwrap();
                assert!(n > 0, "closed early");
                got.extend_from_slice(&piece[..n]);
            }
        };
        tokio::time::timeout(Duration::from_secs(20), read_all)
            .await
            .expect("the late chunk and the end follow the big one");
        assert!(writer.await.unwrap());
        let mut expected = format!("{:x}\r\n", big.len()).into_bytes();
        expected.extend_from_slice(&big);
        expected.extend_from_slice(end);
        assert!(got == expected, "the stream's bytes, framed, in order");
    }

    /// A source whose next chunk is always ready, `left` of them.
    struct Endless {
        left: usize,
    }

    impl Chunks for Endless {
        fn poll_chunk_into(
            &mut self,
            _: &mut Context<'_>,
            out: &mut BytesMut,
        ) -> Poll<Result<Framed, StreamCut>> {
            if self.left == 0 {
                return Poll::Ready(Ok(Framed::End));
            }
            self.left -= 1;
            encode_chunk(out, &[b'x'; 1000]);
            Poll::Ready(Ok(Framed::More))
        }
    }

    /// A source that always has more ready (a replica faster than its client) is written in
    /// pieces of about [`MAX_ROOM`], not gathered whole first.
    #[tokio::test]
    async fn a_source_that_is_always_ready_is_written_in_bounded_pieces() {
        let (mut client, io, _) = connected().await;
        let mut conn = test_conn(io);
        let reader = tokio::spawn(async move {
            let mut all = Vec::new();
            client.read_to_end(&mut all).await.map(|_| all.len())
        });
        let chunks = 4_000;
        assert!(conn.write_stream(Endless { left: chunks }, false).await);
        let largest = conn.out.capacity();
        drop(conn);
        // Each chunk is 1,000 bytes framed in 7 more ("3e8\r\n" before, "\r\n" after).
        assert_eq!(reader.await.unwrap().unwrap(), chunks * 1_007 + LAST_CHUNK.len());
        assert!(largest <= 2 * MAX_ROOM, "a write of {largest} bytes' room");
    }

    /// A source of two chunks that notes, when asked for the second, what the client has been
    /// sent so far.
    struct Noting {
        peer: Arc<std::net::TcpStream>,
        asked: usize,
        before_second: Arc<std::sync::Mutex<Vec<u8>>>,
    }

    impl Chunks for Noting {
        fn poll_chunk_into(
            &mut self,
            _: &mut Context<'_>,
            out: &mut BytesMut,
        ) -> Poll<Result<Framed, StreamCut>> {
            self.asked += 1;
            Poll::Ready(match self.asked {
                1 => {
                    encode_chunk(out, b"one");
                    Ok(Framed::More)
                }
                2 => {
                    // Loopback: a write is in the peer's receive queue when it returns.
                    let mut seen = [0u8; 64];
                    let n = std::io::Read::read(&mut &*self.peer, &mut seen).unwrap_or(0);
                    self.before_second.lock().unwrap().extend_from_slice(&seen[..n]);
                    encode_chunk(out, b"two");
                    Ok(Framed::More)
                }
                _ => Ok(Framed::End),
            })
        }
    }

    /// Alone, the first chunk is written before the second is taken, though it was ready;
    /// otherwise both share one write.
    #[tokio::test]
    async fn a_lone_streams_first_chunk_is_written_before_the_rest_is_taken() {
        for (alone, seen) in [(true, &b"3\r\none\r\n"[..]), (false, b"")] {
            let (client, io, _) = connected().await;
            // Kept open past the source's end, when the last chunk is written.
            let client = Arc::new(client.into_std().unwrap());
            let mut conn = test_conn(io);
            let before_second = Arc::new(std::sync::Mutex::new(Vec::new()));
            let source = Noting {
                peer: client.clone(),
                asked: 0,
                before_second: before_second.clone(),
            };
            let written = tokio::time::timeout(Duration::from_secs(10), conn.write_stream(source, alone));
            assert!(written.await.expect("the source is asked again, not waited on"));
            assert_eq!(*before_second.lock().unwrap(), seen, "alone: {alone}");
        }
    }

    /// A stream is not alone while another request is served, even one with nothing to write
    /// yet (waiting on its replica): its first chunk shares the write. Other tests running
    /// meanwhile can only add to the count, so this holds whatever they do.
    #[tokio::test]
    async fn a_stream_is_not_alone_while_another_request_waits_on_its_replica() {
        let (client, io, _) = connected().await;
        let client = Arc::new(client.into_std().unwrap());
        let mut conn = test_conn(io);
        let before_second = Arc::new(std::sync::Mutex::new(Vec::new()));
        let source = Noting {
            peer: client.clone(),
            asked: 0,
            before_second: before_second.clone(),
        };
        let (_this, _waiting) = (Counted::start(), Counted::start());
        let written = tokio::time::timeout(Duration::from_secs(10), conn.write_chunked(source));
        assert!(written.await.expect("the source is asked again, not waited on"));
        assert_eq!(*before_second.lock().unwrap(), b"");
    }

    fn test_conn(io: ClientIo) -> Conn {
        Conn {
            io,
            buf: BytesMut::new(),
            out: BytesMut::new(),
        }
    }

    /// A peer's socket, connected to ours as a client's socket with a 60 s send timeout whose cuts
    /// are counted in the returned counter.
    async fn connected() -> (TcpStream, ClientIo, IntCounter) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let peer = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (tcp, _) = listener.accept().await.unwrap();
        let cut = IntCounter::new("cut", "cut").unwrap();
        (
            peer,
            ClientIo::new(tcp, Duration::from_secs(60), cut.clone()),
            cut,
        )
    }

    #[tokio::test]
    async fn a_handed_over_socket_gives_back_what_was_read_first() {
        let (mut client, mut io, _) = connected().await;
        client.write_all(b" world").await.unwrap();
        io.read = Bytes::from_static(b"hello");
        let mut got = [0u8; 11];
        io.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello world");
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_takes_nothing_for_send_timeout_fails_the_write_and_is_counted() {
        let (_client, mut io, cut) = connected().await;
        let start = Instant::now();
        let chunk = vec![b'x'; 64 * 1024];
        let mut sent = 0usize;
        let err = loop {
            match io.write(&chunk).await {
                Ok(n) => sent += n,
                Err(e) => break e,
            }
        };
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        assert!(sent > 0, "the socket's buffers took some first");
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(60),
            "one timeout, from the blocked write"
        );
        assert_eq!(cut.get(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_taken_restart_the_send_timeout() {
        let (client, mut io, cut) = connected().await;
        let start = Instant::now();
        let writer = tokio::spawn(async move {
            let chunk = vec![b'x'; 64 * 1024];
            loop {
                if let Err(e) = io.write_vectored(&[std::io::IoSlice::new(&chunk)]).await {
                    return (e.kind(), start.elapsed());
                }
            }
        });
        // The writer blocks at once; 40 s later the client reads what is there.
        tokio::time::sleep(Duration::from_secs(40)).await;
        let mut buf = vec![0u8; 64 * 1024];
        let mut taken = 0;
        while taken == 0 {
            match client.try_read(&mut buf) {
                Ok(n) => taken += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => client.readable().await.unwrap(),
                Err(e) => panic!("{e}"),
            }
        }
        loop {
            match client.try_read(&mut buf) {
                Ok(n) if n > 0 => {}
                _ => break,
            }
        }
        let (kind, at) = writer.await.unwrap();
        assert_eq!(kind, std::io::ErrorKind::TimedOut);
        assert_eq!(
            at,
            Duration::from_secs(100),
            "60 s from the last bytes taken, at 40 s"
        );
        assert_eq!(cut.get(), 1);
    }
}
