//! The server half's pieces (scan, framing, the connection's writes, its timed socket), and a
//! whole connection served over scripted in-memory I/O: the request-head checklist of pingora's
//! HTTP/1 server tests, each request cut at every byte.

use super::head::{blank_lines, head_end, may_be_head};
use super::write::LAST_CHUNK;
use super::*;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

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

/// Every string of `a`, CR and LF up to nine bytes long: the two searches find the first blank
/// line (LF LF or LF CR LF) as a look at each line in turn does.
#[test]
fn a_heads_end_is_the_first_blank_line() {
    let reference =
        |buf: &[u8]| (2..=buf.len()).find(|&p| buf[..p].ends_with(b"\n\n") || buf[..p].ends_with(b"\n\r\n"));
    for len in 0..=9u32 {
        for n in 0..3usize.pow(len) {
            let buf: Vec<u8> = (0..len).map(|i| b"a\r\n"[n / 3usize.pow(i) % 3]).collect();
            assert_eq!(head_end(&buf), reference(&buf), "{buf:?}");
        }
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
    // A window for what must not happen (the write ending while nobody reads): no state shows it,
    // and the paused clock would not do, its jumps racing the loopback's real socket buffers.
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

/// Alone (the only request its `Load` counts), a stream's first chunk is written before the
/// second is taken, though it was ready; with another request counted, even one with nothing to
/// write yet (waiting on its replica), both share one write.
#[tokio::test]
async fn a_lone_streams_first_chunk_is_written_before_the_rest_is_taken() {
    for (counted, seen) in [(1, &b"3\r\none\r\n"[..]), (2, b"")] {
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
        let load = Load::default();
        let served: Vec<_> = (0..counted).map(|_| load.start()).collect();
        let alone = served[0].alone();
        let written = tokio::time::timeout(Duration::from_secs(10), conn.write_stream(source, alone));
        assert!(written.await.expect("the source is asked again, not waited on"));
        assert_eq!(*before_second.lock().unwrap(), seen, "{counted} counted");
    }
}

fn test_conn(io: ClientIo<TcpStream>) -> Connection<TcpStream> {
    Connection {
        io,
        buf: BytesMut::new(),
        out: BytesMut::new(),
    }
}

/// A peer's socket, connected to ours as a client's socket with a 60 s send timeout whose cuts
/// are counted in the returned counter.
async fn connected() -> (TcpStream, ClientIo<TcpStream>, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let peer = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
    let (tcp, _) = listener.accept().await.unwrap();
    let cut = Arc::new(AtomicUsize::new(0));
    let counted = cut.clone();
    let on_cut = Arc::new(move || {
        counted.fetch_add(1, Ordering::Relaxed);
    });
    (peer, ClientIo::new(tcp, Duration::from_secs(60), on_cut), cut)
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
    assert_eq!(cut.load(Ordering::Relaxed), 1);
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
    assert_eq!(cut.load(Ordering::Relaxed), 1);
}

/// A handler for scripted connections: it serves any POST whose head [`RequestHead::parse`]
/// takes, answering `<method> <target> <body>` whole (or as a stream of one chunk per body
/// byte when the target is `/stream`, with the status `N` when it is `/status/N`), and notes
/// what it saw and what was handed over.
#[derive(Clone, Default)]
struct Script {
    seen: Arc<std::sync::Mutex<Vec<String>>>,
    handed: Arc<std::sync::Mutex<Option<Vec<u8>>>>,
    load: Arc<Load>,
}

/// A body of one piece, or none.
#[derive(Default)]
struct Text(Option<Bytes>);

impl http_body::Body for Text {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.0.take().map(|b| Ok(http_body::Frame::data(b))))
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.0.as_ref().map_or(0, |b| b.len() as u64))
    }
}

/// One chunk per byte, then the end.
struct Bytewise(Vec<u8>);

impl Chunks for Bytewise {
    fn poll_chunk_into(
        &mut self,
        _: &mut Context<'_>,
        out: &mut BytesMut,
    ) -> Poll<Result<Framed, StreamCut>> {
        if self.0.is_empty() {
            return Poll::Ready(Ok(Framed::End));
        }
        let b = self.0.remove(0);
        encode_chunk(out, &[b]);
        Poll::Ready(Ok(Framed::More))
    }

    fn head_fields(&self, each: &mut dyn FnMut(&[u8], &[u8])) {
        each(b"content-type", b"text/event-stream");
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin + Send> Handler<IO> for Script {
    type Request = RequestHead;
    type Stream = Bytewise;
    type Body = Text;

    fn limits(&self) -> Limits {
        Limits {
            header_timeout: Duration::from_secs(5),
            body_timeout: Duration::from_secs(5),
            max_head: 1024,
        }
    }

    fn load(&self) -> Arc<Load> {
        self.load.clone()
    }

    fn head(&mut self, head: &Bytes) -> Option<Served<RequestHead>> {
        let parsed = RequestHead::parse(head, |_| false)?;
        (parsed.method == http::Method::POST).then(|| Served {
            content_length: parsed.content_length,
            close: parsed.close,
            request: parsed,
        })
    }

    async fn call(
        &mut self,
        _: &Bytes,
        request: RequestHead,
        body: Upload,
    ) -> http::Response<Reply<Bytewise, Text>> {
        let body = match body {
            Upload::Whole(b) => b.unwrap_or_default(),
            Upload::TimedOut => return http::Response::new(Reply::Body(Text(Some("timed out".into())))),
        };
        let text = format!("POST {} {}", request.uri, String::from_utf8_lossy(&body));
        self.seen.lock().unwrap().push(text.clone());
        if request.uri.path() == "/stream" {
            return http::Response::new(Reply::Stream(Bytewise(body.to_vec())));
        }
        let mut response = http::Response::new(Reply::Body(Text(Some(text.into()))));
        if let Some(status) = request.uri.path().strip_prefix("/status/") {
            *response.status_mut() = status.parse().unwrap();
        }
        response
    }

    async fn closed(&mut self) {
        std::future::pending::<()>().await;
    }

    fn is_closing(&self) -> bool {
        false
    }

    async fn hand_off(self, mut io: ClientIo<IO>) {
        let mut got = Vec::new();
        let _ = io.read_to_end(&mut got).await;
        *self.handed.lock().unwrap() = Some(got);
    }
}

/// Serves one scripted connection: `wire` is written in pieces cut at `cuts` (each piece sent
/// on its own, the server given time to read it), then the client's side closes; returns what
/// the server wrote, with each `date` value blanked, and the handler's notes.
async fn converse(wire: &[u8], cuts: &[usize]) -> (String, Script) {
    let (mut client, server) = tokio::io::duplex(1 << 16);
    let script = Script::default();
    let on_cut: Arc<dyn Fn() + Send + Sync> = Arc::new(|| {});
    let task = tokio::spawn(serve(
        ClientIo::new(server, Duration::from_secs(5), on_cut),
        script.clone(),
    ));
    let mut from = 0;
    for &to in cuts.iter().chain(std::iter::once(&wire.len())) {
        let to = to.clamp(from, wire.len());
        // The server may have answered and closed already (bytes that cannot begin a request).
        let _ = client.write_all(&wire[from..to]).await;
        from = to;
        tokio::task::yield_now().await;
    }
    let _ = client.shutdown().await;
    let mut out = Vec::new();
    client.read_to_end(&mut out).await.unwrap();
    task.await.unwrap();
    let out = String::from_utf8(out).unwrap();
    let blanked: Vec<String> = out
        .split("\r\n")
        .map(|l| {
            if l.starts_with("date: ") {
                "date: -".to_owned()
            } else {
                l.to_owned()
            }
        })
        .collect();
    (blanked.join("\r\n"), script)
}

/// What [`Script`] answers to `POST <target>` with `body`, whole.
fn whole(target: &str, body: &str) -> String {
    let text = format!("POST {target} {body}");
    format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\ndate: -\r\n\r\n{text}",
        text.len()
    )
}

/// Valid requests, whole or cut at every byte, are served alike: the body by its length, what
/// follows it as the next request.
#[tokio::test]
async fn requests_cut_at_every_byte_are_served_alike() {
    let two = "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloPOST /b?q=1 HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n";
    let want = [whole("/a", "hello"), whole("/b?q=1", "")].concat();
    for cut in 0..=two.len() {
        let (out, script) = converse(two.as_bytes(), &[cut]).await;
        assert_eq!(out, want, "cut at {cut}");
        assert!(script.handed.lock().unwrap().is_none(), "cut at {cut}");
    }
}

/// The request-head checklist: what is served here, and what is handed over whole (these bytes
/// first, then the rest), for the other server to answer.
#[tokio::test]
async fn heads_this_half_does_not_serve_are_handed_over_with_every_byte() {
    let served: [(&str, &str); 5] = [
        ("leading zeros", "Content-Length: 005"),
        ("blank lines first", "Content-Length: 5"),
        ("close", "Content-Length: 5\r\nConnection: keep-alive, close"),
        ("empty host is one host", "Content-Length: 5"),
        ("bare LF lines", "Content-Length: 5"),
    ];
    for (name, fields) in served {
        let wire = match name {
            "blank lines first" => format!("\r\n\nPOST /a HTTP/1.1\r\nHost: x\r\n{fields}\r\n\r\nhello"),
            "empty host is one host" => format!("POST /a HTTP/1.1\r\nHost: \r\n{fields}\r\n\r\nhello"),
            "bare LF lines" => format!("POST /a HTTP/1.1\nHost: x\n{fields}\n\nhello"),
            _ => format!("POST /a HTTP/1.1\r\nHost: x\r\n{fields}\r\n\r\nhello"),
        };
        let (out, script) = converse(wire.as_bytes(), &[]).await;
        let mut want = whole("/a", "hello");
        if name == "close" {
            want = want.replace("date: -", "connection: close\r\ndate: -");
        }
        assert_eq!(out, want, "{name}");
        assert!(script.handed.lock().unwrap().is_none(), "{name}");
    }
    let handed: [(&str, &str); 14] = [
        ("two lengths", "Content-Length: 5\r\nContent-Length: 5"),
        ("a list of lengths", "Content-Length: 5, 5"),
        ("a signed length", "Content-Length: +5"),
        ("a negative length", "Content-Length: -5"),
        ("no length", "X-A: 1"),
        (
            "length and chunked",
            "Content-Length: 5\r\nTransfer-Encoding: chunked",
        ),
        ("chunked", "Transfer-Encoding: chunked"),
        ("chunked not last", "Transfer-Encoding: chunked, gzip"),
        ("expect", "Content-Length: 5\r\nExpect: 100-continue"),
        (
            "upgrade",
            "Content-Length: 5\r\nConnection: upgrade\r\nUpgrade: h2c",
        ),
        ("obs-fold", "Content-Length: 5\r\nX-A: 1\r\n folded"),
        ("space before colon", "Content-Length : 5"),
        ("two hosts", "Content-Length: 5\r\nHost: y"),
        ("a host with userinfo", "Content-Length: 5\r\nHost: u@y"),
    ];
    for (name, fields) in handed {
        let wire = format!("POST /a HTTP/1.1\r\nHost: x\r\n{fields}\r\n\r\nhello");
        let (out, script) = converse(wire.as_bytes(), &[]).await;
        assert_eq!(out, "", "{name}: nothing answered here");
        let got = script.handed.lock().unwrap().clone();
        assert_eq!(got.as_deref(), Some(wire.as_bytes()), "{name}");
        assert!(script.seen.lock().unwrap().is_empty(), "{name}");
    }
    for (name, wire) in [
        (
            "HTTP/1.0",
            "POST /a HTTP/1.0\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
        ),
        (
            "HTTP/1.0 and chunked",
            "POST /a HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        ),
        ("no host", "POST /a HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"),
        ("GET", "GET /a HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"),
        ("HTTP/2's preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
    ] {
        let (out, script) = converse(wire.as_bytes(), &[]).await;
        assert_eq!(out, "", "{name}");
        assert_eq!(
            script.handed.lock().unwrap().as_deref(),
            Some(wire.as_bytes()),
            "{name}"
        );
    }
}

/// Bytes that cannot begin a request get a bare 400 and the close, at once (no blank line
/// awaited), however they are cut; a whole head that does not parse, or one over the limit, is
/// handed over (hyper answers 400 or 431).
#[tokio::test]
async fn garbage_is_refused_at_once_and_a_large_head_is_handed_over() {
    for wire in [
        &b"\x16\x03\x01\x02\x00\x01\x00"[..],
        b"\rPOST / HTTP/1.1\r\n",
        b"POST /a b HTTP/1.1\r\n",
    ] {
        for cut in 0..=wire.len() {
            let (out, script) = converse(wire, &[cut]).await;
            assert!(
                out.starts_with("HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n"),
                "{wire:?} cut at {cut}: {out:?}"
            );
            assert!(script.handed.lock().unwrap().is_none());
        }
    }
    let large = format!("POST /a HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n", "y".repeat(2000));
    for wire in [large.as_bytes(), b"\rPOST / HTTP/1.1\r\n\r\n"] {
        let (out, script) = converse(wire, &[]).await;
        assert_eq!(out, "");
        assert_eq!(script.handed.lock().unwrap().as_deref(), Some(wire));
    }
}

/// A stream goes out chunked, its head fields first; a client that closes mid-body is never
/// answered, and its request never reaches the handler.
#[tokio::test]
async fn streams_are_chunked_and_a_body_cut_short_is_not_served() {
    let (out, _) = converse(
        b"POST /stream HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nab",
        &[],
    )
    .await;
    assert_eq!(
        out,
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\ndate: -\r\n\r\n1\r\na\r\n1\r\nb\r\n0\r\n\r\n"
    );
    let wire = b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello";
    for end in 0..wire.len() {
        let (out, script) = converse(&wire[..end], &[]).await;
        assert_eq!(out, "", "closed after {end} bytes");
        assert!(script.seen.lock().unwrap().is_empty(), "closed after {end} bytes");
    }
}

/// Issue 47: a 204 went out with `content-length: 0` (and any body the handler gave), which RFC
/// 9110 §8.6 forbids; hyper's server writes none. A 204 or 304 says nothing of a body and has
/// none, and the connection goes on to the next request.
#[tokio::test]
async fn a_204_or_304_has_no_framing_field_and_no_body() {
    let post = |target: &str| format!("POST {target} HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello");
    let wire = [post("/status/204"), post("/status/304"), post("/a")].concat();
    let (out, _) = converse(wire.as_bytes(), &[]).await;
    let want = [
        "HTTP/1.1 204 No Content\r\ndate: -\r\n\r\n",
        "HTTP/1.1 304 Not Modified\r\ndate: -\r\n\r\n",
        &whole("/a", "hello"),
    ]
    .concat();
    assert_eq!(out, want);
}
