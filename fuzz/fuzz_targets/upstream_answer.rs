//! Any bytes as a replica's answer, read in two pieces cut anywhere and then the connection's
//! close: the gateway's replica client decodes them as it would in one piece, and what it takes
//! as an answer, hyper's client takes too, with the same status and body (never laxer than hyper:
//! a laxer client is a desync with the proxies around it). The one difference allowed is a
//! trailer section past hyper's limits, whose body is kept and whose connection is dropped.
#![no_main]

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use libfuzzer_sys::fuzz_target;
use spillway_gateway::fuzzing::upstream_answer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

thread_local! {
    static RT: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
}

/// hyper's client's reading of `data` as the answer to a POST: its status and body.
fn hyper_reads(data: &[u8]) -> Result<(u16, Vec<u8>), String> {
    RT.with(|rt| {
        rt.block_on(async {
            let (client, mut server) = tokio::io::duplex(data.len() + 4096);
            let answer = data.to_vec();
            let replica = tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 1024];
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match server.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = server.write_all(&answer).await;
                let _ = server.shutdown().await;
                // Held open for reading until the client is done, as a socket would be.
                let _ = server.read(&mut buf).await;
            });
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(client))
                .await
                .map_err(|e| e.to_string())?;
            let conn = tokio::spawn(conn);
            let request = hyper::Request::post("/v1/chat/completions")
                .header("host", "replica")
                .body(Empty::<Bytes>::new())
                .map_err(|e| e.to_string())?;
            let read = async {
                let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
                let status = response.status().as_u16();
                let body = response.into_body().collect().await.map_err(|e| e.to_string())?;
                Ok((status, body.to_bytes().to_vec()))
            };
            let out = tokio::time::timeout(std::time::Duration::from_secs(5), read)
                .await
                .unwrap_or_else(|_| Err("no answer".into()));
            conn.abort();
            replica.abort();
            out
        })
    })
}

fuzz_target!(|input: &[u8]| {
    let Some((&cut, data)) = input.split_first() else {
        return;
    };
    let cut = usize::from(cut) * (data.len() + 1) / 256;
    let ours = upstream_answer(data, &[cut]);
    let whole = upstream_answer(data, &[]);
    match (&ours, &whole) {
        // Reuse aside: bytes after the answer make its connection unfit for reuse only once
        // they are read, and a cut may fall between them and the answer (the next use's peek
        // sees them then).
        (Ok(a), Ok(b)) => assert_eq!(
            (a.status, &a.body, a.consumed, a.trailers_cut),
            (b.status, &b.body, b.consumed, b.trailers_cut),
            "the same answer read otherwise"
        ),
        (Err(_), Err(_)) => {}
        _ => panic!("cut at {cut}: {ours:?}, whole: {whole:?}"),
    }
    if let Ok(ours) = ours {
        // A final answer hyper hands over as such, from the bytes it took: what followed it
        // (a broken replica's extra bytes) only stops the connection's reuse, here and there.
        // A trailer section past hyper's limits (100 fields, 16 KiB) fails the whole answer
        // there; ours keeps the body, whole at its last chunk, and drops the connection
        // (issue 47). The framing up to that chunk is what must agree: hyper is given the
        // answer with an empty trailer section in its place.
        let taken = match ours.trailers_cut {
            Some(at) => {
                assert!(
                    !ours.reusable,
                    "a connection whose trailers were cut is not reused"
                );
                [&data[..at], &b"\r\n"[..]].concat()
            }
            None => data[..ours.consumed].to_vec(),
        };
        let theirs = hyper_reads(&taken)
            .unwrap_or_else(|e| panic!("ours {} {} bytes, hyper: {e}", ours.status, ours.body.len()));
        assert_eq!(
            theirs,
            (ours.status, ours.body),
            "hyper's client reads another answer"
        );
    }
});
