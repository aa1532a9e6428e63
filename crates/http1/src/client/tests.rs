use super::*;
use testkit_wire::serve_script;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Decodes `wire` fed in pieces cut at `cuts`, each fed piece decoded by calls handing over
/// `pieces` until one hands nothing, returning the data and the framing at the end.
fn decode_in_pieces(
    framing: Framing,
    wire: &[u8],
    cuts: &[usize],
    pieces: Pieces,
) -> Result<(Vec<u8>, Framing), Error> {
    let mut framing = framing;
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let mut from = 0;
    for &to in cuts.iter().chain(std::iter::once(&wire.len())) {
        buf.extend_from_slice(&wire[from..to]);
        from = to;
        while decode(
            &mut framing,
            &mut buf,
            &mut |d| out.extend_from_slice(d),
            pieces,
            MAX_CHUNK,
        )? {}
    }
    Ok((out, framing))
}

#[test]
fn a_chunked_body_decodes_the_same_however_it_is_cut() {
    let second = b": ping\n\ndata: {\"x\":1}\n\n";
    let wire = [
        // Lines longer than the first look of `line_end`, and shorter.
        &b"0005;ext=1;name=a-long-extension\r\nhello\r\n"[..],
        format!("{:X} \r\n", second.len()).as_bytes(),
        second,
        b"\r\n0\r\nx-trailer: y\r\nx-longer-trailer: with a longer value\r\n\r\n",
    ]
    .concat();
    let wire = &wire[..];
    let want = [&b"hello"[..], second].concat();
    for (name, pieces) in [
        ("all", Pieces::All),
        ("one", Pieces::Until(&std::cell::Cell::new(true))),
    ] {
        for a in 0..=wire.len() {
            for b in a..=wire.len() {
                let chunked = Framing::Chunked(Chunk::Size, 0);
                let (data, framing) = decode_in_pieces(chunked, wire, &[a, b], pieces).unwrap();
                assert_eq!(data, want, "{name}, cut at {a} and {b}");
                assert_eq!(framing, Framing::Done, "{name}, cut at {a} and {b}");
            }
        }
    }
}

#[test]
fn bad_chunks_are_errors_not_hangs() {
    for wire in [
        &b"zz\r\nhello\r\n"[..],
        b"\r\n",
        b"5\r\nhelloX\r\n",
        b"fffffffffffffffff\r\n",
        // Found by the fuzz target `upstream_answer`: a trailer line that is no header field,
        // which hyper's client refuses.
        b"0\r\n: chunked\r\n\r\n",
        b"0\r\nno colon\r\n\r\n",
        // Found by `upstream_answer`: a bare LF after a chunk's data, or in the trailers, which
        // hyper's client refuses.
        b"5\r\nhello\n0\r\n\r\n",
        b"0\r\nx: y\n\r\n",
        b"0\r\n\n",
    ] {
        let r = decode_in_pieces(Framing::Chunked(Chunk::Size, 0), wire, &[], Pieces::All);
        assert!(
            matches!(r, Err(Error::Protocol(_))),
            "{:?}: {r:?}",
            String::from_utf8_lossy(wire)
        );
    }
    let long = vec![b'1'; MAX_LINE + 1];
    let r = decode_in_pieces(Framing::Chunked(Chunk::Size, 0), &long, &[], Pieces::All);
    assert!(matches!(r, Err(Error::Protocol(_))), "{r:?}");
}

/// One piece per call leaves the rest in the buffer for the next call, untouched.
#[test]
fn one_piece_at_a_time_leaves_the_rest_for_the_next_call() {
    let mut framing = Framing::Chunked(Chunk::Size, 0);
    let mut buf = BytesMut::from(&b"5\r\nhello\r\n3\r\nabc\r\n0\r\n\r\n"[..]);
    let mut calls = Vec::new();
    loop {
        let mut got = Vec::new();
        if !decode(
            &mut framing,
            &mut buf,
            &mut |d| got.push(d.to_vec()),
            Pieces::Until(&std::cell::Cell::new(true)),
            MAX_CHUNK,
        )
        .unwrap()
        {
            break;
        }
        calls.push(got);
    }
    assert_eq!(calls, [vec![b"hello".to_vec()], vec![b"abc".to_vec()]]);
    assert_eq!(framing, Framing::Done);
    assert!(buf.is_empty());
}

/// Pieces are handed over until the caller has enough (here, once a piece was `x`); the rest
/// stays in the buffer.
#[test]
fn pieces_are_handed_over_until_the_caller_has_enough() {
    let mut framing = Framing::Chunked(Chunk::Size, 0);
    let mut buf = BytesMut::from(&b"1\r\na\r\n1\r\nx\r\n1\r\nb\r\n0\r\n\r\n"[..]);
    let seen = std::cell::Cell::new(false);
    let mut got = Vec::new();
    let mut each = |d: &[u8]| {
        seen.set(seen.get() || d == b"x");
        got.push(d.to_vec());
    };
    assert!(decode(&mut framing, &mut buf, &mut each, Pieces::Until(&seen), MAX_CHUNK).unwrap());
    assert_eq!(got, [b"a".to_vec(), b"x".to_vec()]);
    assert_eq!(&buf[..], b"\r\n1\r\nb\r\n0\r\n\r\n");
}

#[test]
fn a_length_body_stops_at_its_length() {
    let (data, framing) = decode_in_pieces(Framing::Length(5), b"hello", &[2], Pieces::All).unwrap();
    assert_eq!(data, b"hello");
    assert_eq!(framing, Framing::Done);
    let (data, framing) = decode_in_pieces(Framing::Length(5), b"hel", &[], Pieces::All).unwrap();
    assert_eq!(data, b"hel");
    assert_eq!(framing, Framing::Length(2));
}

#[test]
fn heads_say_how_the_body_is_framed_and_whether_the_connection_lives_on() {
    let head = |wire: &str| parse_head(wire.as_bytes()).unwrap().unwrap().1.unwrap();
    let h = head("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n");
    assert_eq!((h.framing, h.reusable), (Framing::Chunked(Chunk::Size, 0), true));
    let h = head("HTTP/1.1 503 Service Unavailable\r\ncontent-length: 2\r\nretry-after: 3\r\n\r\n");
    assert_eq!(
        (h.status.as_u16(), h.framing, h.reusable),
        (503, Framing::Length(2), true)
    );
    assert_eq!(h.retry_after, Some(3));
    let h = head("HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n");
    assert!(!h.reusable);
    let h = head("HTTP/1.1 200 OK\r\n\r\n");
    assert_eq!((h.framing, h.reusable), (Framing::UntilClose, false));
    let h = head("HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\n");
    assert!(!h.reusable);
    let h = head("HTTP/1.0 200 OK\r\ncontent-length: 1\r\nconnection: keep-alive\r\n\r\n");
    assert!(h.reusable);
    let h = head("HTTP/1.1 204 No Content\r\n\r\n");
    assert_eq!(h.framing, Framing::Length(0));
    assert!(matches!(
        parse_head(b"HTTP/1.1 100 Continue\r\n\r\n"),
        Ok(Some((25, None)))
    ));
    assert!(matches!(parse_head(b"HTTP/1.1 200 OK\r\ncontent-le"), Ok(None)));
    assert!(parse_head(b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n").is_err());
    assert!(parse_head(b"garbage\r\n\r\n").is_err());
}

#[test]
fn a_head_may_have_as_many_headers_as_the_limit_and_no_more() {
    let wire = |n: usize| {
        let mut w = String::from("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n");
        for i in 1..n {
            w.push_str(&format!("x-h{i}: {i}\r\n"));
        }
        w + "\r\n"
    };
    let (n, head) = parse_head(wire(MAX_HEADERS).as_bytes()).unwrap().unwrap();
    assert_eq!(
        (n, head.unwrap().framing),
        (wire(MAX_HEADERS).len(), Framing::Length(0))
    );
    match parse_head(wire(MAX_HEADERS + 1).as_bytes()) {
        Err(Error::Protocol(what)) => assert_eq!(what, format!("more than {MAX_HEADERS} headers")),
        other => panic!(
            "expected a protocol error, got {:?}",
            other.map(|h| h.map(|h| h.0))
        ),
    }
}

/// One POST of `{}` with an `x-request-id`, as the gateway sends them, on `conns`.
async fn call<T: Transport>(conns: &Arc<Conns<T>>) -> Result<Response<T>, Error> {
    let body = Bytes::from_static(b"{}");
    let request = Request {
        method: "POST",
        path: "/v1/chat/completions",
        headers: &[("x-request-id", b"abc")],
        body: &body,
    };
    send(conns, &request, Duration::from_secs(1)).await
}

#[tokio::test]
async fn a_connection_is_reused_once_its_answer_was_read_whole() {
    let ok: &[u8] = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
    let (url, server) = serve_script(vec![ok, ok, ok], true).await;
    let conns = Arc::new(Conns::new(&url));
    for _ in 0..3 {
        let r = call(&conns).await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(&r.into_body().collect(100).await.unwrap()[..], b"abc");
        assert_eq!(conns.idle_count(), 1);
    }
    let seen = server.await.unwrap();
    let peers: std::collections::HashSet<_> = seen
        .iter()
        .map(|s| s.split(' ').next().unwrap().to_owned())
        .collect();
    assert_eq!(peers.len(), 1, "one connection for three requests: {seen:?}");
    assert!(
        seen[0].contains("POST /v1/chat/completions HTTP/1.1\r\n"),
        "{}",
        seen[0]
    );
    assert!(seen[0].contains(&format!("host: {}\r\n", url.trim_start_matches("http://"))));
    assert!(seen[0].contains("content-length: 2\r\n"), "{}", seen[0]);
    assert!(seen[0].contains("x-request-id: abc\r\n"), "{}", seen[0]);
}

#[tokio::test]
async fn a_connection_the_replica_closed_while_idle_is_replaced() {
    let ok: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
    // The server answers once per connection and then closes it without saying so.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let mut buf = [0u8; 1024];
            let mut got = Vec::new();
            while !got.windows(4).any(|w| w == b"\r\n\r\n") || !got.ends_with(b"{}") {
                let n = s.read(&mut buf).await.unwrap();
                got.extend_from_slice(&buf[..n]);
            }
            s.write_all(ok).await.unwrap();
            drop(s);
        }
    });
    let conns = Arc::new(Conns::new(&url));
    for i in 0..5 {
        let r = call(&conns).await.unwrap();
        assert_eq!(
            &r.into_body().collect(100).await.unwrap()[..],
            b"ok",
            "request {i}"
        );
        // Whether the close is seen before the next request or only by it, the request succeeds.
        if i % 2 == 1 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A server that answers `ok` once per connection, then, when the next request arrives on that
/// connection, waits `linger` and closes it without a word; it counts the requests it read.
async fn answer_once_then_close(linger: Duration) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                for answered in 0.. {
                    let mut got = Vec::new();
                    while !(got.windows(4).any(|w| w == b"\r\n\r\n") && got.ends_with(b"{}")) {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    }
                    counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if answered > 0 {
                        tokio::time::sleep(linger).await;
                        return;
                    }
                    s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                        .await
                        .unwrap();
                }
            });
        }
    });
    (url, seen)
}

/// A request the replica has read is never sent again, however soon after it the connection
/// closes with no answer: the replica may have started on it, and `retry.attempts` alone says
/// whether another replica is asked (B05: within 100 ms it was sent again on a new connection).
#[tokio::test]
async fn a_request_the_replica_read_is_not_sent_again_however_soon_it_closes() {
    for linger in [Duration::ZERO, Duration::from_millis(300)] {
        let (url, seen) = answer_once_then_close(linger).await;
        let conns = Arc::new(Conns::new(&url));
        let r = call(&conns).await.unwrap();
        assert_eq!(&r.into_body().collect(100).await.unwrap()[..], b"ok");
        let Err(e) = call(&conns).await else {
            panic!("a request the replica dropped was answered");
        };
        assert!(matches!(e, Error::Closed | Error::Io(_)), "{e}");
        assert_eq!(
            seen.load(std::sync::atomic::Ordering::SeqCst),
            2,
            "the dropped request reached the replica once (linger {linger:?})"
        );
    }
}

/// RFC 9112 §6.1: an HTTP/1.0 answer with a transfer coding has faulty framing: it is refused
/// (hyper's client refuses it too) and its connection with it, keep-alive or not (B06: it went
/// back to the pool).
#[test]
fn an_http10_answer_with_a_transfer_coding_is_refused() {
    for coding in ["chunked", "gzip"] {
        let wire =
            format!("HTTP/1.0 200 OK\r\ntransfer-encoding: {coding}\r\nconnection: keep-alive\r\n\r\n");
        assert!(
            matches!(parse_head(wire.as_bytes()), Err(Error::Protocol(_))),
            "{coding}"
        );
    }
    let h = parse_head(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n");
    assert!(h.unwrap().unwrap().1.unwrap().reusable);
}

/// A length is digits only (B07: `+2` was taken for 2, which hyper refuses); a list of one value
/// repeated is that value, as hyper reads it.
#[test]
fn a_content_length_is_digits_only() {
    for bad in ["+2", "-2", "2a", "0x2", "", "2, 3", "2,", "1_0", "\u{663}"] {
        let wire = format!("HTTP/1.1 200 OK\r\ncontent-length: {bad}\r\n\r\n");
        assert!(parse_head(wire.as_bytes()).is_err(), "{bad:?} was taken");
    }
    for (good, n) in [("2", 2), (" 2 ", 2), ("2, 2", 2), ("002", 2), ("0", 0)] {
        let wire = format!("HTTP/1.1 200 OK\r\ncontent-length: {good}\r\n\r\n");
        let h = parse_head(wire.as_bytes()).unwrap().unwrap().1.unwrap();
        assert_eq!(h.framing, Framing::Length(n), "{good:?}");
    }
}

#[tokio::test]
async fn only_connections_left_clean_go_back_to_the_pool() {
    let cases: [(&'static [u8], &[u8], usize); 4] = [
        // An interim answer first, then the real one.
        (
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
            b"ok",
            1,
        ),
        // Both framings: read as chunked, and the connection is not used again.
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 2\r\n\r\n2\r\nok\r\n0\r\n\r\n",
            b"ok",
            0,
        ),
        // Bytes after the answer's end: not a connection to send anything else on.
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n",
            b"ok",
            0,
        ),
        // No length: the body runs to the close.
        (b"HTTP/1.1 200 OK\r\n\r\nuntil the end", b"until the end", 0),
    ];
    for (answer, want, pooled) in cases {
        let (url, _server) = serve_script(vec![answer], true).await;
        let conns = Arc::new(Conns::new(&url));
        let r = call(&conns).await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(&r.into_body().collect(100).await.unwrap()[..], want);
        assert_eq!(conns.idle_count(), pooled, "{}", String::from_utf8_lossy(answer));
    }
}

#[tokio::test(start_paused = true)]
async fn idle_connections_expire_when_one_is_returned_or_taken() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let _keep = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            held.push(s);
        }
    });
    let conns = Conns::new(&url);
    conns.put_back(conns.connect(Duration::from_secs(1)).await.unwrap());
    tokio::time::advance(IDLE_TIMEOUT / 2).await;
    conns.put_back(conns.connect(Duration::from_secs(1)).await.unwrap());
    tokio::time::advance(IDLE_TIMEOUT / 2).await;
    // The first has waited IDLE_TIMEOUT: the next return closes it.
    conns.put_back(conns.connect(Duration::from_secs(1)).await.unwrap());
    assert_eq!(conns.idle_count(), 2);
    tokio::time::advance(IDLE_TIMEOUT).await;
    assert!(conns.reuse().is_none(), "every idle connection has expired");
    assert_eq!(conns.idle_count(), 0);
}

#[tokio::test]
async fn a_body_dropped_before_its_end_closes_its_connection() {
    let part: &[u8] = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n";
    let (url, server) = serve_script(vec![part], false).await;
    let conns = Arc::new(Conns::new(&url));
    let r = call(&conns).await.unwrap();
    let mut body = r.into_body();
    let mut got = Vec::new();
    assert_eq!(
        body.read(&mut |d| got.extend_from_slice(d)).await.unwrap(),
        Read::Data
    );
    assert_eq!(got, b"abc");
    drop(body);
    assert_eq!(conns.idle_count(), 0);
    // The server sees the connection close (its read returns 0) and ends.
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn nothing_listening_is_a_connect_error_and_a_cut_answer_is_not() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let conns = Arc::new(Conns::new(&url));
    let Err(e) = call(&conns).await else {
        panic!("connected to a closed port");
    };
    assert!(e.is_connect(), "{e}");

    let cut: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc";
    let (url, _server) = serve_script(vec![cut], true).await;
    let conns = Arc::new(Conns::new(&url));
    let r = call(&conns).await.unwrap();
    let e = r.into_body().collect(100).await.unwrap_err();
    assert!(matches!(e, Error::Closed), "{e}");
    assert!(!e.is_connect());
}

#[tokio::test]
async fn a_body_over_the_limit_is_refused() {
    let big: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n0123456789";
    let (url, _server) = serve_script(vec![big], false).await;
    let conns = Arc::new(Conns::new(&url));
    let r = call(&conns).await.unwrap();
    assert!(matches!(r.into_body().collect(4).await, Err(Error::TooLarge(4))));
}

/// The answer-decoding checklist (after pingora's tests of its HTTP/1 client), each answer read
/// whole and cut at every byte: what the client takes, and what it refuses.
#[test]
fn answers_decode_alike_however_they_are_cut() {
    type Want = Option<(u16, &'static [u8], bool)>;
    let cases: [(&str, &[u8], Want); 16] = [
        ("length", b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello", Some((200, b"hello", true))),
        ("length zero", b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", Some((200, b"", true))),
        ("length repeated", b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\nok", Some((200, b"ok", true))),
        ("lengths that differ", b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nok", None),
        ("signed length", b"HTTP/1.1 200 OK\r\ncontent-length: +2\r\n\r\nok", None),
        ("length and chunked: chunked wins, no reuse", b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", Some((200, b"ok", false))),
        ("HTTP/1.0 and chunked", b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n2\r\nok\r\n0\r\n\r\n", None),
        ("chunked not last: until close", b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, gzip\r\n\r\nraw", Some((200, b"raw", false))),
        ("several 1xx first", b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", Some((200, b"ok", true))),
        ("101 is no answer", b"HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\n\r\n", None),
        ("obs-fold", b"HTTP/1.1 200 OK\r\nx-a: 1\r\n folded\r\ncontent-length: 2\r\n\r\nok", None),
        ("trailers", b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nx-t: 1\r\nx-u: 2\r\n\r\n", Some((200, b"ok", true))),
        ("no framing: until close", b"HTTP/1.1 200 OK\r\n\r\nall of it", Some((200, b"all of it", false))),
        ("204 has no body", b"HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n", Some((204, b"", true))),
        ("cut short by length", b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nshort", None),
        ("cut short by chunks", b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel", None),
    ];
    for (name, wire, want) in cases {
        for cut in 0..=wire.len() {
            let got = decode_answer(wire, &[cut]);
            match want {
                Some((status, body, reusable)) => {
                    let d = got.unwrap_or_else(|e| panic!("{name}, cut at {cut}: {e}"));
                    assert_eq!(
                        (d.status, &d.body[..], d.reusable),
                        (status, body, reusable),
                        "{name}, cut at {cut}"
                    );
                    assert_eq!(d.consumed, wire.len(), "{name}, cut at {cut}");
                }
                None => assert!(got.is_err(), "{name}, cut at {cut}: {got:?}"),
            }
        }
    }
}

/// A connection's script: for each request, the answer's pieces.
type Answers = Vec<Vec<Vec<u8>>>;

/// A transport whose connections are scripts over in-memory pipes: for each of its answers, a
/// connection reads a request, checks it is the one [`call`] sends, and writes the answer in
/// the pieces it lists, the client given time to read each; after the last it closes.
struct Scripted(Mutex<VecDeque<Answers>>);

impl Transport for Scripted {
    type Stream = tokio::io::DuplexStream;

    async fn connect(&self) -> io::Result<tokio::io::DuplexStream> {
        let Some(answers) = self.0.lock().unwrap().pop_front() else {
            return Err(io::ErrorKind::ConnectionRefused.into());
        };
        let (client, mut replica) = tokio::io::duplex(1 << 16);
        tokio::spawn(async move {
            for pieces in answers {
                let mut request = vec![0u8; SCRIPTED_HEAD.len() + 2];
                if replica.read_exact(&mut request).await.is_err() {
                    return;
                }
                assert_eq!(request, [SCRIPTED_HEAD, b"{}"].concat(), "the request as sent");
                for piece in pieces {
                    if replica.write_all(&piece).await.is_err() {
                        return;
                    }
                    tokio::task::yield_now().await;
                }
            }
        });
        Ok(client)
    }

    fn looks_open(_: &tokio::io::DuplexStream) -> bool {
        true
    }
}

/// The request [`call`] sends, as the replica reads it.
const SCRIPTED_HEAD: &[u8] =
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: replica:8000\r\ncontent-type: application/json\r\ncontent-length: 2\r\nx-request-id: abc\r\n\r\n";

/// An answer in pieces cut at `cuts`.
fn script(answer: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
    let mut pieces = Vec::new();
    let mut from = 0;
    for &to in cuts.iter().chain(std::iter::once(&answer.len())) {
        let to = to.clamp(from, answer.len());
        if to > from {
            pieces.push(answer[from..to].to_vec());
        }
        from = to;
    }
    pieces
}

/// One call over scripted connections (one answer each): the answer's status and whole body,
/// and whether its connection went back to the pool.
async fn call_on(scripts: Vec<Vec<Vec<u8>>>) -> Result<(u16, Vec<u8>, bool), Error> {
    let conns = Arc::new(Conns::with(
        Scripted(Mutex::new(scripts.into_iter().map(|s| vec![s]).collect())),
        "replica:8000".into(),
        "/",
    ));
    scripted_call(&conns).await
}

/// One call on `conns`, its answer read whole.
async fn scripted_call(conns: &Arc<Conns<Scripted>>) -> Result<(u16, Vec<u8>, bool), Error> {
    let answer = call(conns).await?;
    let status = answer.status().as_u16();
    let body = answer.into_body().collect(1 << 20).await?;
    Ok((status, body.to_vec(), conns.idle_count() == 1))
}

/// The answer checklist of pingora's HTTP/1 client tests, each answer read from a scripted
/// connection whole and cut in two at every byte: what the client takes (status, body, and
/// whether the connection lives on), and what it refuses.
#[tokio::test]
async fn answers_from_a_scripted_replica_read_alike_however_they_are_cut() {
    type Case = (&'static str, &'static str, Result<(u16, &'static str, bool), ()>);
    let cases: [Case; 14] = [
        (
            "length",
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
            Ok((200, "hello", true)),
        ),
        (
            "length with spaces",
            "HTTP/1.1 200 OK\r\nContent-Length:  5 \r\n\r\nhello",
            Ok((200, "hello", true)),
        ),
        (
            "a list of one length",
            "HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello",
            Ok((200, "hello", true)),
        ),
        (
            "a signed length",
            "HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello",
            Err(()),
        ),
        (
            "two lengths",
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
            Err(()),
        ),
        (
            "length and chunked: chunked wins, the connection closes",
            "HTTP/1.1 200 OK\r\nContent-Length: 99\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            Ok((200, "hello", false)),
        ),
        (
            "HTTP/1.0 with a transfer coding",
            "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            Err(()),
        ),
        (
            "several 1xx first",
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
            Ok((200, "ok", true)),
        ),
        (
            "obs-fold",
            "HTTP/1.1 200 OK\r\nX-A: 1\r\n folded\r\nContent-Length: 2\r\n\r\nok",
            Err(()),
        ),
        (
            "trailers, dropped",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-T: 1\r\nX-U: 2\r\n\r\n",
            Ok((200, "ok", true)),
        ),
        (
            "chunked not last: read to the close",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\nraw bytes",
            Ok((200, "raw bytes", false)),
        ),
        (
            "no length: read to the close",
            "HTTP/1.1 200 OK\r\n\r\nraw",
            Ok((200, "raw", false)),
        ),
        (
            "204 has no body",
            "HTTP/1.1 204 No Content\r\n\r\n",
            Ok((204, "", true)),
        ),
        (
            "cut short",
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel",
            Err(()),
        ),
    ];
    for (name, answer, want) in cases {
        for cut in 0..=answer.len() {
            let got = call_on(vec![script(answer.as_bytes(), &[cut])]).await;
            let got = got
                .map(|(status, body, reused)| (status, String::from_utf8(body).unwrap(), reused))
                .map_err(|_| ());
            let want = want.map(|(status, body, reused)| (status, body.to_owned(), reused));
            assert_eq!(got, want, "{name}, cut at {cut}");
        }
    }
}

/// B05: a reused connection the replica closes once it has the request, with no answer, is an
/// error: the request is not sent again on a new connection, since the replica may have started
/// on it.
#[tokio::test]
async fn a_request_a_reused_connection_took_is_not_sent_again() {
    let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec();
    let conns = Arc::new(Conns::with(
        Scripted(Mutex::new(
            vec![vec![vec![ok.clone()], vec![]], vec![vec![ok.clone()]]].into(),
        )),
        "replica:8000".into(),
        "",
    ));
    assert_eq!(scripted_call(&conns).await.unwrap(), (200, b"ok".to_vec(), true));
    let r = scripted_call(&conns).await;
    assert!(matches!(r, Err(Error::Closed)), "{r:?}");
    assert_eq!(conns.transport.0.lock().unwrap().len(), 1, "no second connection");
}

/// hyper's client's limits on a chunked body's metadata, which the fuzz target
/// `upstream_answer` found missing here (fuzz/findings/upstream_answer-trailer-section: 150
/// short trailer fields, which hyper refuses): fewer than 100 trailer fields, a trailer section
/// under 16 KiB, extensions under 16 KiB over the whole body. Past a trailer limit the body,
/// whole at its last chunk, is kept (issue 47: the answer was refused whole, a 502), the rest
/// of the section is not read and the connection is not reused.
#[test]
fn trailers_and_extensions_are_bounded_as_hyper_bounds_them() {
    let answer = |body: &[u8]| {
        let mut a = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        a.extend_from_slice(body);
        decode_answer(&a, &[])
    };
    // The body, whether the connection lives on, and where a cut trailer section began.
    let kept = |d: Decoded| (d.body, d.reusable, d.trailers_cut);
    let head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n".len();
    let trailers = |n: usize| {
        let lines: String = (0..n).map(|i| format!("x-t{i}: v\r\n")).collect();
        answer(format!("2\r\nok\r\n0\r\n{lines}\r\n").as_bytes())
    };
    assert_eq!(kept(trailers(99).unwrap()), (b"ok".to_vec(), true, None));
    for n in [100, 150] {
        let d = trailers(n).unwrap();
        assert_eq!(
            d.consumed - head,
            (0..99).map(|i| format!("x-t{i}: v\r\n").len()).sum::<usize>()
        );
        assert_eq!(kept(d), (b"ok".to_vec(), false, Some(head)), "{n} fields");
    }
    // Lines are at most 4 KiB: the section is made of several.
    let long = |total: usize| {
        let mut lines = String::new();
        let mut left = total - 2;
        let mut i = 0;
        while left > 0 {
            let len = left.min(4000);
            let name = format!("x{i:03}: ");
            lines.push_str(&name);
            lines.push_str(&"v".repeat(len - name.len() - 2));
            lines.push_str("\r\n");
            left -= len;
            i += 1;
        }
        answer(format!("2\r\nok\r\n0\r\n{lines}\r\n").as_bytes())
    };
    assert_eq!(kept(long(16 * 1024 - 1).unwrap()), (b"ok".to_vec(), true, None));
    assert_eq!(
        kept(long(16 * 1024).unwrap()),
        (b"ok".to_vec(), false, Some(head))
    );
    // A trailer line over 4 KiB, which hyper would take, cuts the section too.
    let d = answer(format!("2\r\nok\r\n0\r\nx: {}\r\n\r\n", "v".repeat(5000)).as_bytes());
    assert_eq!(kept(d.unwrap()), (b"ok".to_vec(), false, Some(head)));
    // A malformed field is still refused: the framing itself is in doubt.
    assert!(matches!(
        answer(b"2\r\nok\r\n0\r\nno colon\r\n\r\n"),
        Err(Error::Protocol(_))
    ));
    let extensions = |total: usize| {
        let per = 4000;
        let mut body = String::new();
        let mut left = total;
        while left > 0 {
            let n = left.min(per);
            body.push_str(&format!("1;{}\r\na\r\n", "e".repeat(n)));
            left -= n;
        }
        body.push_str("0\r\n\r\n");
        answer(body.as_bytes()).map(|d| d.body)
    };
    assert!(extensions(16 * 1024 - 1).is_ok());
    assert!(matches!(extensions(16 * 1024), Err(Error::Protocol(_))));
}

/// Issue 47: a chunk size of up to 2^64 − 1 was taken, so the data read on until the replica
/// closed: a whole answer waited for the total budget, and a stream's client got the replica's
/// own framing (`\r\n0\r\n\r\n`) as data. A size over what the body may hold is refused at its
/// line, with the connection still open and before any of the chunk is handed over.
#[tokio::test]
async fn a_chunk_size_no_answer_could_have_is_refused_at_once() {
    let answer = |size: &str| {
        format!(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n{size}\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"
        )
    };
    // Whole, within a limit of 1,000 bytes: the replica keeps the connection open.
    let (url, _server) = serve_script(vec![answer("ffffffffffffffff")], false).await;
    let conns = Arc::new(Conns::new(&url));
    let body = call(&conns).await.unwrap().into_body();
    let r = tokio::time::timeout(Duration::from_secs(5), body.collect(1000))
        .await
        .expect("refused at once, not read until the replica closes");
    assert!(matches!(r, Err(Error::TooLarge(1000))), "{r:?}");
    // Read as a stream is: one chunk over 16 MiB.
    let (url, _server) = serve_script(vec![answer(&format!("{:x}", MAX_CHUNK + 1))], false).await;
    let conns = Arc::new(Conns::new(&url));
    let mut body = call(&conns).await.unwrap().into_body();
    let mut data = Vec::new();
    let r = tokio::time::timeout(
        Duration::from_secs(5),
        body.read(&mut |d| data.extend_from_slice(d)),
    )
    .await
    .expect("refused at once");
    assert!(matches!(r, Err(Error::TooLarge(_))), "{r:?}");
    assert!(
        data.is_empty(),
        "handed over: {:?}",
        String::from_utf8_lossy(&data)
    );
    // As the fuzz target reads answers; a chunk of the most allowed is taken.
    let r = decode_answer(answer("ffffffffffffffff").as_bytes(), &[]);
    assert!(matches!(r, Err(Error::TooLarge(_))), "{r:?}");
    let (url, _server) = serve_script(vec![answer("e")], false).await;
    let conns = Arc::new(Conns::new(&url));
    let body = call(&conns).await.unwrap().into_body();
    assert_eq!(&body.collect(14).await.unwrap()[..], b"data: [DONE]\n\n");
}

/// Issue 47: an answer whose trailer section went past hyper's limits was refused whole (a 502
/// for a body already whole). Its body is read whole, and its connection closed, not pooled,
/// with the rest of the section unread.
#[tokio::test]
async fn a_body_whose_trailers_are_cut_is_whole_and_its_connection_closed() {
    let fields: String = (0..150).map(|i| format!("x-t{i}: v\r\n")).collect();
    let answer = format!("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n{fields}\r\n");
    let (url, _server) = serve_script(vec![answer], false).await;
    let conns = Arc::new(Conns::new(&url));
    let body = call(&conns).await.unwrap().into_body();
    assert_eq!(&body.collect(100).await.unwrap()[..], b"ok");
    assert_eq!(conns.idle_count(), 0, "not pooled");
}
