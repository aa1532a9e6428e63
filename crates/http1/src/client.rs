//! HTTP/1.1 to the replicas, on the request's own task. hyper's client runs every connection as a
//! task of its own and hands each chunk of a stream across a channel: a task wake-up and a
//! refcounted buffer per SSE chunk, and a second task per stream. Here the request's task writes
//! the request, parses the answer's head and decodes its body straight out of one read buffer,
//! which goes back to the replica's pool with the connection: a relayed stream costs one read and
//! one write per wake-up. Connections are reused (most recent first) when an answer was read to
//! its end; dropping a [`Body`] before that closes its connection, which is how a replica learns
//! that the client left.

use bytes::{Buf, Bytes, BytesMut};
use http::StatusCode;
use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::io::{self, IoSlice, Write as _};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Each connection's read buffer: SSE chunks are a few hundred bytes, and decoded data never waits
/// in it, so it grows only for an answer's head.
const READ_BUF: usize = 4096;
/// An answer's head (status line and headers) may be at most this large.
const MAX_HEAD: usize = 64 * 1024;
const MAX_HEADERS: usize = 100;
/// A chunk-size line may be at most this long; a longer trailer line cuts the trailers
/// ([`Framing::TrailersCut`]).
const MAX_LINE: usize = 4096;
/// A chunk may be at most this large, unless its caller bounds the whole body lower
/// ([`Body::collect`]): a larger size is refused at its line, before any of its data is handed
/// over. Left unbounded, a replica's size of 2^64 − 1 had its own framing and everything after
/// it read as data until it closed (16 MiB is `server.max_response_bytes`' default).
const MAX_CHUNK: usize = 16 * 1024 * 1024;
/// A chunked body's extensions may add up to less than this (hyper's client's limit).
const MAX_EXTENSIONS: usize = 16 * 1024;
/// hyper's client's limits on a trailer section: its bytes (the trailer lines and the blank line
/// after them) under 16 KiB, and fewer than 100 fields (its `h1_max_headers`). Past them, hyper
/// fails the whole answer; here the body, whole at its last chunk, is kept, and the rest of the
/// section is not read ([`Framing::TrailersCut`]).
const MAX_TRAILER: usize = 16 * 1024;
const MAX_TRAILERS: usize = MAX_HEADERS;
/// Idle connections kept per replica; past it, the oldest is closed.
const MAX_IDLE: usize = 1024;
/// An idle connection older than this is closed rather than reused: uvicorn, under vLLM, closes
/// its own after 5 s, and a close that crosses a request is a request lost ([`send`]).
const IDLE_TIMEOUT: Duration = Duration::from_secs(4);
/// A connection whose read buffer grew past this (a large head) goes back to the pool with a
/// new one of the usual size.
const MAX_POOLED_BUF: usize = 4 * READ_BUF;

/// Why a call to a replica failed.
#[derive(Debug)]
pub enum Error {
    /// No connection could be opened (refused, unreachable, or over the connect timeout).
    Connect(io::Error),
    /// The connection failed or closed in the middle of the exchange.
    Io(io::Error),
    /// The replica closed the connection before the answer was whole.
    Closed,
    /// The replica's answer is not valid HTTP/1.1.
    Protocol(&'static str),
    /// The answer's body is over the caller's limit, or a chunk of it says it would be (over
    /// [`MAX_CHUNK`] when the caller set none).
    TooLarge(usize),
}

impl Error {
    pub fn is_connect(&self) -> bool {
        matches!(self, Error::Connect(_))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Connect(e) => write!(f, "cannot connect: {e}"),
            Error::Io(e) => write!(f, "connection error: {e}"),
            Error::Closed => f.write_str("the connection closed before the answer was whole"),
            Error::Protocol(what) => write!(f, "invalid HTTP answer: {what}"),
            Error::TooLarge(limit) => write!(f, "the answer is over {limit} bytes"),
        }
    }
}

impl std::error::Error for Error {}

/// How a pool reaches its replica: it opens connections, and tells whether an idle one can still
/// carry a request. [`Tcp`] in the gateway; a test's script elsewhere.
pub trait Transport: Send + Sync + 'static {
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    /// A new connection, ready for a request.
    fn connect(&self) -> impl Future<Output = io::Result<Self::Stream>> + Send;

    /// Whether an idle connection still looks open: the peer has not closed it and sent
    /// nothing unasked.
    fn looks_open(stream: &Self::Stream) -> bool;
}

/// TCP to a host and port.
pub struct Tcp {
    host: String,
    port: u16,
}

impl Transport for Tcp {
    type Stream = TcpStream;

    async fn connect(&self) -> io::Result<TcpStream> {
        let stream = TcpStream::connect((self.host.as_str(), self.port)).await?;
        // Each SSE event must leave at once, not wait for the previous one's ACK.
        stream.set_nodelay(true)?;
        Ok(stream)
    }

    /// Asked of the socket itself, not of the reactor's readiness, which a close that came
    /// since the reactor's last turn has not reached yet: a request sent into that close would
    /// be lost, since it cannot be sent again ([`send`]).
    fn looks_open(stream: &TcpStream) -> bool {
        let mut byte = [std::mem::MaybeUninit::<u8>::uninit(); 1];
        matches!(socket2::SockRef::from(stream).peek(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }
}

/// One open connection and its read buffer, which travel together through the pool.
struct Pooled<S> {
    stream: S,
    buf: BytesMut,
}

/// A replica's address and its idle connections.
pub struct Conns<T: Transport = Tcp> {
    transport: T,
    /// The `Host` header's value and the request-target's prefix, as the configured URL says.
    authority: String,
    prefix: String,
    /// Oldest first; reuse takes from the back.
    idle: Mutex<VecDeque<(Pooled<T::Stream>, Instant)>>,
}

impl Conns<Tcp> {
    /// `url` is a replica's base URL as configuration checked it (`http://host:port[/prefix]`).
    pub fn new(url: &str) -> Conns<Tcp> {
        let uri: http::Uri = url.parse().unwrap_or_default();
        // Host and port only: never credentials a URL might carry.
        let authority = uri.authority().map_or_else(String::new, |a| {
            let s = a.as_str();
            s.rsplit_once('@').map_or(s, |(_, hostport)| hostport).to_owned()
        });
        let host = uri.host().unwrap_or("localhost");
        let tcp = Tcp {
            host: host.trim_start_matches('[').trim_end_matches(']').to_owned(),
            port: uri.port_u16().unwrap_or(80),
        };
        Conns::with(tcp, authority, uri.path())
    }
}

impl<T: Transport> Conns<T> {
    /// A pool over `transport`: requests say `Host: authority` and go to `prefix` + their path.
    pub fn with(transport: T, authority: String, prefix: &str) -> Conns<T> {
        Conns {
            transport,
            authority,
            prefix: prefix.trim_end_matches('/').to_owned(),
            idle: Mutex::new(VecDeque::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(Pooled<T::Stream>, Instant)>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The most recently used idle connection that still looks open.
    fn reuse(&self) -> Option<Pooled<T::Stream>> {
        let now = Instant::now();
        loop {
            let (conn, since) = {
                let mut idle = self.lock();
                expire(&mut idle, now);
                idle.pop_back()?
            };
            if now.saturating_duration_since(since) < IDLE_TIMEOUT && T::looks_open(&conn.stream) {
                return Some(conn);
            }
        }
    }

    async fn connect(&self, timeout: Duration) -> Result<Pooled<T::Stream>, Error> {
        let stream = match tokio::time::timeout(timeout, self.transport.connect()).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(Error::Connect(e)),
            Err(_) => {
                return Err(Error::Connect(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no connection within {timeout:?}"),
                )));
            }
        };
        Ok(Pooled {
            stream,
            buf: BytesMut::with_capacity(READ_BUF),
        })
    }

    /// Keeps a connection whose answer was read whole; the oldest go first when there are too
    /// many, and those idle too long are closed here rather than left half-closed.
    fn put_back(&self, mut conn: Pooled<T::Stream>) {
        if conn.buf.capacity() > MAX_POOLED_BUF {
            conn.buf = BytesMut::with_capacity(READ_BUF);
        }
        let now = Instant::now();
        let mut idle = self.lock();
        expire(&mut idle, now);
        if idle.len() >= MAX_IDLE {
            idle.pop_front();
        }
        idle.push_back((conn, now));
    }

    /// Idle connections right now, for tests.
    #[cfg(test)]
    fn idle_count(&self) -> usize {
        self.lock().len()
    }
}

/// Closes the idle connections that have waited longer than [`IDLE_TIMEOUT`] (the oldest are at
/// the front).
fn expire<S>(idle: &mut VecDeque<(Pooled<S>, Instant)>, now: Instant) {
    while idle
        .front()
        .is_some_and(|(_, since)| now.saturating_duration_since(*since) >= IDLE_TIMEOUT)
    {
        idle.pop_front();
    }
}

/// A request to a replica: its method, its path under the replica's URL, extra headers, and the JSON
/// body.
pub struct Request<'a> {
    /// `POST` for the request path; `GET` to read a stored response.
    pub method: &'a str,
    pub path: &'a str,
    pub headers: &'a [(&'a str, &'a [u8])],
    pub body: &'a Bytes,
}

/// Sends `request` and reads the answer's head; the body is read from the returned [`Body`].
/// A request is sent a second time only when it provably never reached the replica: a reused
/// connection whose write failed is replaced by a new one, once. Once written, a request is the
/// replica's: a connection that then fails or closes without an answer (even at once, an idle
/// close crossing the request) is an error, as with hyper's client, since the replica may have
/// started on it; if the new connection cannot be opened, the first failure is the one reported.
pub async fn send<T: Transport>(
    conns: &Arc<Conns<T>>,
    request: &Request<'_>,
    connect_timeout: Duration,
) -> Result<Response<T>, Error> {
    let head = request_head(conns, request);
    if let Some(mut conn) = conns.reuse() {
        match exchange(&mut conn, &head, request.body).await {
            Ok(parsed) => return Ok(parsed.into_response(conn, conns)),
            Err(Failure { error, sent: true }) => return Err(error),
            Err(Failure { error, sent: false }) => {
                let mut conn = match conns.connect(connect_timeout).await {
                    Ok(conn) => conn,
                    Err(_) => return Err(error),
                };
                return match exchange(&mut conn, &head, request.body).await {
                    Ok(parsed) => Ok(parsed.into_response(conn, conns)),
                    Err(f) => Err(f.error),
                };
            }
        }
    }
    let mut conn = conns.connect(connect_timeout).await?;
    match exchange(&mut conn, &head, request.body).await {
        Ok(parsed) => Ok(parsed.into_response(conn, conns)),
        Err(f) => Err(f.error),
    }
}

/// Why an exchange failed, and whether the whole request had been written when it did.
struct Failure {
    error: Error,
    sent: bool,
}

fn request_head<T: Transport>(conns: &Conns<T>, request: &Request<'_>) -> Vec<u8> {
    let mut head = Vec::with_capacity(256);
    let mut put = |parts: &[&[u8]]| parts.iter().for_each(|p| head.extend_from_slice(p));
    put(&[
        request.method.as_bytes(),
        b" ",
        conns.prefix.as_bytes(),
        request.path.as_bytes(),
        b" HTTP/1.1\r\nhost: ",
        conns.authority.as_bytes(),
        b"\r\ncontent-type: application/json\r\ncontent-length: ",
    ]);
    let _ = write!(head, "{}\r\n", request.body.len());
    let mut put = |parts: &[&[u8]]| parts.iter().for_each(|p| head.extend_from_slice(p));
    for (name, value) in request.headers {
        // Values come from checked headers; a line break would still split the request.
        if !value.iter().any(|b| *b == b'\r' || *b == b'\n') {
            put(&[name.as_bytes(), b": ", value, b"\r\n"]);
        }
    }
    head.extend_from_slice(b"\r\n");
    head
}

/// A replica's answer: what the gateway reads of its head, and its body to read on.
pub struct Response<T: Transport = Tcp> {
    status: StatusCode,
    retry_after: Option<u64>,
    body: Body<T>,
}

impl<T: Transport> Response<T> {
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// `Retry-After` in seconds, when the replica sent it as a number.
    pub fn retry_after(&self) -> Option<u64> {
        self.retry_after
    }

    pub fn into_body(self) -> Body<T> {
        self.body
    }
}

/// The parts of an answer's head the gateway uses, and how its body is framed. No header map:
/// the relay forwards none of the replica's headers.
#[derive(Debug)]
struct ResponseHead {
    status: StatusCode,
    retry_after: Option<u64>,
    framing: Framing,
    reusable: bool,
}

impl ResponseHead {
    fn into_response<T: Transport>(self, conn: Pooled<T::Stream>, conns: &Arc<Conns<T>>) -> Response<T> {
        Response {
            status: self.status,
            retry_after: self.retry_after,
            body: Body {
                conn: Some(conn),
                framing: self.framing,
                reusable: self.reusable,
                max_chunk: MAX_CHUNK,
                conns: conns.clone(),
            },
        }
    }
}

/// Writes the request and reads the answer's head.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut Pooled<S>,
    head: &[u8],
    body: &[u8],
) -> Result<ResponseHead, Failure> {
    if let Err(e) = write_all(&mut conn.stream, head, body).await {
        return Err(Failure {
            error: Error::Io(e),
            sent: false,
        });
    }
    let failed = |error: Error| Failure { error, sent: true };
    conn.buf.clear();
    loop {
        if !conn.buf.is_empty() {
            match parse_head(&conn.buf) {
                Ok(Some((n, head))) => {
                    conn.buf.advance(n);
                    match head {
                        Some(head) => return Ok(head),
                        // An interim 1xx answer: the real one follows.
                        None => continue,
                    }
                }
                Ok(None) if conn.buf.len() >= MAX_HEAD => {
                    return Err(failed(Error::Protocol("the head is over 64 KiB")));
                }
                Ok(None) => {}
                Err(e) => return Err(failed(e)),
            }
        }
        conn.buf.reserve(READ_BUF);
        match conn.stream.read_buf(&mut conn.buf).await {
            Ok(0) => return Err(failed(Error::Closed)),
            Ok(_) => {}
            Err(e) => return Err(failed(Error::Io(e))),
        }
    }
}

async fn write_all<S: AsyncWrite + Unpin>(stream: &mut S, mut a: &[u8], mut b: &[u8]) -> io::Result<()> {
    while !a.is_empty() || !b.is_empty() {
        let n = stream.write_vectored(&[IoSlice::new(a), IoSlice::new(b)]).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        let from_a = n.min(a.len());
        a = &a[from_a..];
        b = &b[n - from_a..];
    }
    // A stream that buffers (TLS) sends what it holds; TCP's flush does nothing.
    stream.flush().await
}

/// Parses a complete head at the start of `buf`: its length, and the head (`None` for a 1xx).
/// `Ok(None)` when more bytes are needed.
fn parse_head(buf: &[u8]) -> Result<Option<(usize, Option<ResponseHead>)>, Error> {
    // Left uninitialised: httparse writes the slots it fills, and zeroing them all would cost more
    // than parsing a replica's usual handful.
    let mut slots = [const { std::mem::MaybeUninit::uninit() }; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut []);
    let config = httparse::ParserConfig::default();
    let n = match config.parse_response_with_uninit_headers(&mut parsed, buf, &mut slots) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(Error::Protocol("more than 100 headers")),
        Err(_) => return Err(Error::Protocol("malformed status line or header")),
    };
    let status = parsed
        .code
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or(Error::Protocol("bad status code"))?;
    if status == StatusCode::SWITCHING_PROTOCOLS {
        return Err(Error::Protocol("101 Switching Protocols"));
    }
    if status.is_informational() {
        return Ok(Some((n, None)));
    }
    let http10 = parsed.version == Some(0);
    let mut encoded = false;
    let mut chunked = false;
    let mut length: Option<u64> = None;
    let mut retry_after = None;
    let mut close = http10;

    for h in parsed.headers.iter() {
        let (name, value) = (h.name, h.value);
        if name.eq_ignore_ascii_case("transfer-encoding") {
            // Only the last coding frames the body; anything but chunked runs to the close.
            encoded = true;
            chunked = value
                .rsplit(|b| *b == b',')
                .next()
                .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
            close |= !chunked;
        } else if name.eq_ignore_ascii_case("content-length") {
            // A list of one value repeated ("5, 5") is one length, as hyper takes it.
            for item in value.split(|b| *b == b',') {
                let n = decimal(item).ok_or(Error::Protocol("bad content-length"))?;
                if length.is_some_and(|l| l != n) {
                    return Err(Error::Protocol("two different content-lengths"));
                }
                length = Some(n);
            }
        } else if name.eq_ignore_ascii_case("connection") {
            for token in value.split(|b| *b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") && http10 {
                    close = false;
                }
            }
        } else if name.eq_ignore_ascii_case("retry-after") {
            retry_after = decimal(value);
        }
    }
    // An HTTP/1.0 message with a transfer coding has faulty framing (RFC 9112 §6.1): refused,
    // as hyper's client refuses it, and its connection closed with it.
    if http10 && encoded {
        return Err(Error::Protocol("an HTTP/1.0 answer with a transfer coding"));
    }
    let framing = if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        Framing::Length(0)
    } else if encoded {
        // Both framings at once may be a smuggling attempt (RFC 9112 §6.3): the body is read by
        // its transfer coding and the connection is not used again.
        close |= length.is_some();
        if chunked {
            Framing::Chunked(Chunk::Size, 0)
        } else {
            Framing::UntilClose
        }
    } else if let Some(n) = length {
        Framing::Length(n)
    } else {
        close = true;
        Framing::UntilClose
    };
    Ok(Some((
        n,
        Some(ResponseHead {
            status,
            retry_after,
            framing,
            reusable: !close,
        }),
    )))
}

/// What [`decode_answer`] read of an answer.
#[derive(Debug, PartialEq, Eq)]
pub struct Decoded {
    pub status: u16,
    pub body: Vec<u8>,
    /// Its connection could carry another request.
    pub reusable: bool,
    /// The bytes the answer took (anything after it was not part of it).
    pub consumed: usize,
    /// Where the trailer section began, when it went past hyper's limits: the body ended at its
    /// last chunk, and what the answer took ends part way through the section.
    pub trailers_cut: Option<usize>,
}

/// An answer from `data` read in pieces cut at `cuts` and then the connection's close: the head
/// parsed and the body decoded by the functions a [`Body`] calls, without a socket (the fuzz
/// target `upstream_answer` compares it with hyper's client).
pub fn decode_answer(data: &[u8], cuts: &[usize]) -> Result<Decoded, Error> {
    let mut buf = BytesMut::new();
    let mut ends = cuts
        .iter()
        .copied()
        .filter(|&c| c <= data.len())
        .chain(std::iter::once(data.len()));
    let fed = std::cell::Cell::new(0);
    let next = |buf: &mut BytesMut| match ends.next() {
        Some(to) => {
            if to > fed.get() {
                buf.extend_from_slice(&data[fed.get()..to]);
                fed.set(to);
            }
            true
        }
        None => false,
    };
    let mut next = next;
    let head = loop {
        match parse_head(&buf)? {
            Some((n, Some(head))) => {
                buf.advance(n);
                break head;
            }
            Some((n, None)) => buf.advance(n),
            None if buf.len() >= MAX_HEAD => return Err(Error::Protocol("the head is over 64 KiB")),
            None if !next(&mut buf) => return Err(Error::Closed),
            None => {}
        }
    };
    let mut framing = head.framing;
    let mut body = Vec::new();
    let status = head.status.as_u16();
    loop {
        decode(
            &mut framing,
            &mut buf,
            &mut |d| body.extend_from_slice(d),
            Pieces::All,
            MAX_CHUNK,
        )?;
        if framing.is_done() {
            let reusable = head.reusable && buf.is_empty() && framing == Framing::Done;
            let consumed = fed.get() - buf.len();
            let trailers_cut = match framing {
                Framing::TrailersCut(read) => Some(consumed - usize::from(read)),
                _ => None,
            };
            return Ok(Decoded {
                status,
                body,
                reusable,
                consumed,
                trailers_cut,
            });
        }
        if !next(&mut buf) {
            return match framing {
                Framing::UntilClose => Ok(Decoded {
                    status,
                    body,
                    reusable: false,
                    consumed: data.len(),
                    trailers_cut: None,
                }),
                _ => Err(Error::Closed),
            };
        }
    }
}

/// A header's decimal number: digits only, no sign (Rust's parse takes a `+`, which would let a
/// replica's length mean what a proxy beside us reads otherwise), whitespace around it ignored.
fn decimal(value: &[u8]) -> Option<u64> {
    let digits = value.trim_ascii();
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// How the rest of a body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// This many bytes are left.
    Length(u64),
    /// Where the decoder stands, and the extension bytes of the chunk lines so far.
    Chunked(Chunk, u16),
    /// Until the replica closes the connection.
    UntilClose,
    Done,
    /// The body is whole, but its trailer section went past [`MAX_TRAILERS`] fields or
    /// [`MAX_TRAILER`] bytes: the trailers are dropped anyway, so the answer stands, but what is
    /// left of them is never read and the connection is not used again. Holds the section's
    /// bytes taken before the cut.
    TrailersCut(u16),
}

impl Framing {
    /// The body is whole (its connection may still be unfit for another request).
    fn is_done(self) -> bool {
        matches!(self, Framing::Done | Framing::TrailersCut(_))
    }
}

/// Where a chunked body's decoder stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Expecting a chunk-size line.
    Size,
    /// This many bytes of the current chunk are left.
    Data(u64),
    /// Expecting the line break after a chunk's data.
    DataEnd,
    /// After the last chunk: trailer lines until an empty one; those so far, and their bytes.
    Trailer { fields: u8, bytes: u16 },
}

/// What one call to [`Body::read`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    /// Some of the body was handed over.
    Data,
    /// The body is whole.
    End,
}

/// An answer's body, read on the caller's task.
pub struct Body<T: Transport = Tcp> {
    /// `None` once the body is whole (the connection went back to the pool, or was closed).
    conn: Option<Pooled<T::Stream>>,
    framing: Framing,
    reusable: bool,
    /// The largest chunk this body may still take ([`MAX_CHUNK`], or what is left of
    /// [`Body::collect`]'s limit).
    max_chunk: usize,
    conns: Arc<Conns<T>>,
}

impl<T: Transport> Body<T> {
    /// Waits until some of the body is here (one read of the socket at most), then hands every
    /// decoded piece of what the buffer holds to `each`, in order, without copying it.
    pub async fn read(&mut self, each: &mut (dyn FnMut(&[u8]) + Send)) -> Result<Read, Error> {
        std::future::poll_fn(|cx| self.poll_read(cx, each)).await
    }

    /// [`Body::read`] for a caller that polls: `Pending` (with the task woken later) when the
    /// buffer holds no data and the socket has none ready.
    pub fn poll_read(
        &mut self,
        cx: &mut Context<'_>,
        each: &mut dyn FnMut(&[u8]),
    ) -> Poll<Result<Read, Error>> {
        self.poll_pieces(cx, each, Pieces::All)
    }

    /// [`Body::poll_read`], handing over pieces only until `pieces` says it has enough: what the
    /// buffer holds after them waits for the next call, without a read of the socket.
    pub fn poll_pieces(
        &mut self,
        cx: &mut Context<'_>,
        each: &mut dyn FnMut(&[u8]),
        pieces: Pieces,
    ) -> Poll<Result<Read, Error>> {
        loop {
            let Some(conn) = self.conn.as_mut() else {
                return Poll::Ready(Ok(Read::End));
            };
            let handed = decode(&mut self.framing, &mut conn.buf, each, pieces, self.max_chunk)?;
            if self.framing.is_done() {
                self.reusable &= self.framing == Framing::Done;
                self.finish();
                return Poll::Ready(Ok(if handed { Read::Data } else { Read::End }));
            }
            if handed {
                return Poll::Ready(Ok(Read::Data));
            }
            // What is left is part of a line, or nothing: only more bytes can move it on.
            if conn.buf.capacity() - conn.buf.len() < READ_BUF / 4 {
                conn.buf.reserve(READ_BUF);
            }
            // tokio's read marks the socket drained when it returns less than asked, so the next
            // poll waits for the reactor instead of trying a read that would fail.
            let read = std::pin::pin!(conn.stream.read_buf(&mut conn.buf));
            let n = match read.poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(r) => r.map_err(Error::Io)?,
            };
            if n == 0 {
                if self.framing == Framing::UntilClose {
                    self.framing = Framing::Done;
                    self.reusable = false;
                    self.finish();
                    return Poll::Ready(Ok(Read::End));
                }
                self.conn = None;
                return Poll::Ready(Err(Error::Closed));
            }
        }
    }

    /// The whole body, up to `limit` bytes.
    pub async fn collect(mut self, limit: usize) -> Result<Bytes, Error> {
        // A known length is taken at once, in a buffer of its size: grown by doubling, a large
        // answer's buffer would reach twice its size, and three times while it is copied.
        let mut out = match self.framing {
            Framing::Length(n) if n > limit as u64 => return Err(Error::TooLarge(limit)),
            Framing::Length(n) => BytesMut::with_capacity(n as usize),
            _ => BytesMut::new(),
        };
        loop {
            // A chunk larger than the room left is refused at its size line, not read up to it.
            self.max_chunk = limit - out.len();
            let mut over = false;
            let read = self
                .read(&mut |data| {
                    if out.len() + data.len() > limit {
                        over = true;
                    } else {
                        out.extend_from_slice(data);
                    }
                })
                .await
                .map_err(|e| match e {
                    Error::TooLarge(_) => Error::TooLarge(limit),
                    e => e,
                })?;
            if over {
                return Err(Error::TooLarge(limit));
            }
            if read == Read::End {
                return Ok(out.freeze());
            }
        }
    }

    /// The body is whole: its connection goes back to the pool if it can carry another request.
    fn finish(&mut self) {
        if let Some(conn) = self.conn.take()
            && self.reusable
            && conn.buf.is_empty()
        {
            self.conns.put_back(conn);
        }
    }
}

/// How much of what the buffer holds one call hands over. A piece is a chunk's data, or what
/// the buffer holds of a body without chunks.
#[derive(Clone, Copy)]
pub enum Pieces<'a> {
    /// Every decoded piece.
    All,
    /// Pieces until, after one, the flag is set (by the caller's handling of them).
    Until(&'a std::cell::Cell<bool>),
}

impl Pieces<'_> {
    fn enough(&self) -> bool {
        match self {
            Pieces::All => false,
            Pieces::Until(enough) => enough.get(),
        }
    }
}

/// Decodes what `buf` holds, handing data to `each` and consuming it; true if any data was
/// handed over. Stops when it needs more bytes or the body is whole, or once `pieces` has
/// enough. A chunk over `max_chunk` bytes is [`Error::TooLarge`].
fn decode(
    framing: &mut Framing,
    buf: &mut BytesMut,
    each: &mut dyn FnMut(&[u8]),
    pieces: Pieces,
    max_chunk: usize,
) -> Result<bool, Error> {
    // What is consumed is advanced past once, not piece by piece: a stream's read brings a chunk
    // line, data and an end of data for each event.
    let mut at = 0;
    let decoded = decode_from(framing, buf, &mut at, each, pieces, max_chunk);
    if at == buf.len() {
        buf.clear();
    } else {
        buf.advance(at);
    }
    decoded
}

/// [`decode`] of `buf` from `at`, which it moves past what it consumed.
fn decode_from(
    framing: &mut Framing,
    buf: &[u8],
    at: &mut usize,
    each: &mut dyn FnMut(&[u8]),
    pieces: Pieces,
    max_chunk: usize,
) -> Result<bool, Error> {
    let mut handed = false;
    loop {
        if handed && !framing.is_done() && pieces.enough() {
            return Ok(true);
        }
        let rest = &buf[*at..];
        match framing {
            Framing::Done | Framing::TrailersCut(_) => return Ok(handed),
            Framing::Length(0) => *framing = Framing::Done,
            Framing::Length(left) => {
                let n = take(rest, left, each);
                *at += n;
                handed |= n > 0;
                if n == 0 {
                    return Ok(handed);
                }
            }
            Framing::UntilClose => {
                if rest.is_empty() {
                    return Ok(handed);
                }
                each(rest);
                *at = buf.len();
                handed = true;
            }
            Framing::Chunked(Chunk::Data(left), _) => {
                let n = take(rest, left, each);
                *at += n;
                handed |= n > 0;
                if *left == 0 {
                    let Framing::Chunked(chunk, _) = framing else {
                        unreachable!()
                    };
                    *chunk = Chunk::DataEnd;
                } else if n == 0 {
                    return Ok(handed);
                }
            }
            Framing::Chunked(state, extensions) => {
                let Some(end) = line_end(rest) else {
                    if rest.len() >= MAX_LINE {
                        if let Chunk::Trailer { bytes, .. } = state {
                            *framing = Framing::TrailersCut(*bytes);
                            return Ok(handed);
                        }
                        return Err(Error::Protocol("a chunk line is over 4 KiB"));
                    }
                    return Ok(handed);
                };
                // Every line of the chunked framing ends in CR LF, as hyper requires: a bare LF
                // would end a line here that a proxy beside us reads on.
                let Some(line) = rest[..end].strip_suffix(b"\r") else {
                    return Err(Error::Protocol("a chunked body's line ends without CR LF"));
                };
                let extensions = *extensions;
                *framing = match *state {
                    Chunk::Size => {
                        let size = chunk_size(&rest[..=end])?;
                        if size > max_chunk as u64 {
                            return Err(Error::TooLarge(max_chunk));
                        }
                        // What follows the first `;`, as hyper counts it over the whole body.
                        let more = line
                            .iter()
                            .position(|b| *b == b';')
                            .map_or(0, |i| line.len() - i - 1);
                        let extensions = usize::from(extensions) + more;
                        if extensions >= MAX_EXTENSIONS {
                            return Err(Error::Protocol("the chunk extensions are over 16 KiB"));
                        }
                        let extensions = extensions as u16;
                        match size {
                            0 => Framing::Chunked(Chunk::Trailer { fields: 0, bytes: 0 }, extensions),
                            n => Framing::Chunked(Chunk::Data(n), extensions),
                        }
                    }
                    Chunk::DataEnd if line.is_empty() => Framing::Chunked(Chunk::Size, extensions),
                    Chunk::DataEnd => return Err(Error::Protocol("a chunk is longer than its size")),
                    Chunk::Trailer {
                        fields,
                        bytes: before,
                    } => {
                        // The trailer section's bytes, its blank line included when there are
                        // trailers, as hyper counts them.
                        let bytes = usize::from(before)
                            + if fields == 0 && line.is_empty() {
                                0
                            } else {
                                end + 1
                            };
                        let too_many = !line.is_empty() && usize::from(fields) + 1 >= MAX_TRAILERS;
                        if bytes >= MAX_TRAILER || too_many {
                            // This line is left unread, and the body ends whole.
                            *framing = Framing::TrailersCut(before);
                            return Ok(handed);
                        }
                        if line.is_empty() {
                            Framing::Done
                        } else if trailer_field(&rest[..=end]) {
                            let trailer = Chunk::Trailer {
                                fields: fields + 1,
                                bytes: bytes as u16,
                            };
                            Framing::Chunked(trailer, extensions)
                        } else {
                            return Err(Error::Protocol("a malformed trailer field"));
                        }
                    }
                    Chunk::Data(_) => unreachable!("handled above"),
                };
                *at += end + 1;
            }
        }
    }
}

/// Where the line at the start of `rest` ends (its line feed), within [`MAX_LINE`]. A chunk's
/// lines are short (a size in hex, an empty line after its data): a plain look at the first bytes
/// finds the end before `memchr` would have set up; longer lines (extensions) go to `memchr`.
fn line_end(rest: &[u8]) -> Option<usize> {
    match rest.iter().take(16).position(|b| *b == b'\n') {
        Some(end) => Some(end),
        None if rest.len() <= 16 => None,
        None => memchr::memchr(b'\n', &rest[16..rest.len().min(MAX_LINE)]).map(|end| 16 + end),
    }
}

/// Hands up to `left` bytes from the front of `rest` to `each`; how many.
fn take(rest: &[u8], left: &mut u64, each: &mut dyn FnMut(&[u8])) -> usize {
    let n = rest.len().min(usize::try_from(*left).unwrap_or(usize::MAX));
    if n > 0 {
        each(&rest[..n]);
        *left -= n as u64;
    }
    n
}

/// Whether a trailer line (its line end included) is a header field as httparse reads one:
/// trailers are dropped, but one hyper's client would refuse is refused here too. Trailers are
/// rare, so the copy this takes costs nothing on a stream's way.
fn trailer_field(line: &[u8]) -> bool {
    let mut field = Vec::with_capacity(line.len() + 2);
    field.extend_from_slice(line);
    field.extend_from_slice(b"\r\n");
    let mut one = [httparse::EMPTY_HEADER; 1];
    matches!(
        httparse::parse_headers(&field, &mut one),
        Ok(httparse::Status::Complete(_))
    )
}

/// A chunk-size line, its CR LF included: hex digits, then optional extensions after `;`, as
/// httparse parses it (fuzzed there). An empty line, which httparse takes for a last chunk, is
/// refused, as hyper refuses it.
fn chunk_size(line: &[u8]) -> Result<u64, Error> {
    if !line.first().is_some_and(u8::is_ascii_hexdigit) {
        return Err(Error::Protocol("bad chunk size"));
    }
    match httparse::parse_chunk_size(line) {
        Ok(httparse::Status::Complete((_, size))) => Ok(size),
        _ => Err(Error::Protocol("bad chunk size")),
    }
}

#[cfg(test)]
pub mod tests;
