//! Any bytes as a client's request head, arriving in two reads cut anywhere: what the public
//! port's own HTTP/1.1 (`front`) serves itself, it reads as it would whole, and as hyper's server
//! reads it (method, target, length, version, where the body starts). What it does not serve goes
//! to hyper, or is refused, and needs no comparison.
#![no_main]

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use libfuzzer_sys::fuzz_target;
use spillway_gateway::fuzzing::front_head;
use std::sync::{Arc, Mutex};
use tokio::io::AsyncWriteExt;

thread_local! {
    // A paused clock: a connection hyper keeps waiting on ends at once, not after a real second.
    static RT: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
}

/// What hyper's server read of the first request in `data`.
#[derive(Debug)]
struct Seen {
    method: String,
    target: String,
    version: hyper::Version,
    content_length: Option<String>,
    connection: Vec<String>,
    /// The body, if it arrived whole before the end of `data`.
    body: Option<Bytes>,
}

fn hyper_reads(data: &[u8]) -> Option<Seen> {
    RT.with(|rt| {
        rt.block_on(async {
            let (mut client, server) = tokio::io::duplex(data.len() + 1024);
            client.write_all(data).await.ok()?;
            client.shutdown().await.ok()?;
            let seen: Arc<Mutex<Option<Seen>>> = Arc::default();
            let keep = seen.clone();
            let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                let keep = keep.clone();
                async move {
                    let (parts, body) = req.into_parts();
                    let body = body.collect().await.ok().map(|b| b.to_bytes());
                    let header = |name: &str| {
                        parts
                            .headers
                            .get_all(name)
                            .iter()
                            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                            .collect::<Vec<_>>()
                    };
                    let mut slot = keep.lock().unwrap();
                    if slot.is_none() {
                        *slot = Some(Seen {
                            method: parts.method.to_string(),
                            target: parts.uri.to_string(),
                            version: parts.version,
                            content_length: header("content-length").into_iter().next(),
                            connection: header("connection"),
                            body,
                        });
                    }
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(Empty::<Bytes>::new()))
                }
            });
            // half_close: the client has sent everything and shut its side, which would otherwise
            // end the request before the service has run.
            let conn = hyper::server::conn::http1::Builder::new()
                .half_close(true)
                .serve_connection(TokioIo::new(server), service);
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), conn).await;
            seen.lock().unwrap().take()
        })
    })
}

fuzz_target!(|input: &[u8]| {
    let Some((&cut, data)) = input.split_first() else {
        return;
    };
    let cut = usize::from(cut) * (data.len() + 1) / 256;
    let Some(front) = front_head(data, cut) else {
        return;
    };
    let whole = front_head(data, data.len()).expect("served in two reads, not whole");
    assert_eq!(
        (
            &front.target,
            front.content_length,
            front.close,
            front.body_offset
        ),
        (
            &whole.target,
            whole.content_length,
            whole.close,
            whole.body_offset
        ),
        "the same head read otherwise"
    );
    let seen = hyper_reads(data).expect("front serves a head hyper's server refuses");
    assert_eq!(seen.method, "POST");
    assert_eq!(seen.version, hyper::Version::HTTP_11);
    assert_eq!(seen.target, front.target);
    let length = seen
        .content_length
        .as_deref()
        .and_then(|v| v.trim().parse::<usize>().ok());
    assert_eq!(length, Some(front.content_length));
    let close = seen
        .connection
        .iter()
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("close"));
    assert_eq!(close, front.close);
    if let Some(body) = seen.body {
        let end = front.body_offset + front.content_length;
        assert!(end <= data.len(), "hyper read a body past the bytes sent");
        assert_eq!(
            &body[..],
            &data[front.body_offset..end],
            "the body starts where front says"
        );
    }
});
