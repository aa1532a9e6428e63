//! The server half's pieces (scan, framing, the connection's writes, its timed socket), and a
//! whole connection served over scripted in-memory I/O: the request-head checklist of pingora's
//! HTTP/1 server tests, each request cut at every byte.

use super::head::{blank_lines, head_end, may_be_head};
use super::write::LAST_CHUNK;
use super::*;
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
/// yet (waiting on its replica): its first chunk shares the write.
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
    let load = Load::default();
    let (this, _waiting) = (load.start(), load.start());
    let written = tokio::time::timeout(Duration::from_secs(10), conn.write_stream(source, this.alone()));
    assert!(written.await.expect("the source is asked again, not waited on"));
    assert_eq!(*before_second.lock().unwrap(), b"");
}

fn test_conn(io: ClientIo<TcpStream>) -> Conn<TcpStream> {
    Conn {
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
