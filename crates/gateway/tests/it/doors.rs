//! One table of cases run against both front doors — the proxy's own port, and Envoy asking the
//! endpoint picker — where they must behave alike: a busy replica, a stream cut before and after
//! its first token, an answer over `max_response_bytes`, a stalled stream, the total deadline,
//! and the drain. Each case scripts the replica's bytes; the client's answer and the access
//! record must be the same through either door.

use crate::support::{chat, eventually, http, read_stream, sse_data};
use std::net::SocketAddr;
use std::time::Duration;
use testkit::envoy::{Envoy, EnvoyOptions};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Door {
    Proxy,
    Picker,
}

/// What the client gets.
#[derive(Debug)]
enum Expect {
    /// A refusal in place of the answer: its status and OpenAI error code.
    Refused(u16, &'static str),
    /// A 200 stream whose last event is an error with this code.
    Cut(&'static str),
}

struct Case {
    name: &'static str,
    /// The route's timeouts.
    timeouts: &'static str,
    stream: bool,
    /// What the replica writes once it has read the request.
    answer: String,
    /// It closes the connection after the answer (else it holds it open, writing nothing more).
    close: bool,
    /// The gateway shuts down once the client has the stream's first bytes.
    drain: bool,
    expect: Expect,
    /// The access record's outcome.
    outcome: &'static str,
}

const TOKEN: &str =
    "data: {\"model\":\"sim\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t0 \"}}]}\n\n";
const SSE_HEAD: &str = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
const SLOW: &str = "{ connect: 200ms, first_token: 2s, stream_idle: 10s, total: 20s }";

fn cases() -> Vec<Case> {
    let busy_event =
        r#"data: {"error":{"message":"the queue is full","type":"ServiceUnavailableError","code":503}}"#;
    let role = "data: {\"model\":\"sim\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n";
    let large = format!(
        "{{\"model\":\"sim\",\"choices\":[{{\"index\":0,\"message\":{{\"role\":\"assistant\",\"content\":\"{}\"}}}}]}}",
        "x".repeat(4096)
    );
    vec![
        Case {
            name: "a busy replica's error event in place of the first token",
            timeouts: SLOW,
            stream: true,
            answer: format!("{SSE_HEAD}{busy_event}\n\n"),
            close: true,
            drain: false,
            expect: Expect::Refused(503, "upstream_busy"),
            outcome: "upstream_busy",
        },
        Case {
            name: "a stream closed before its first token",
            timeouts: SLOW,
            stream: true,
            answer: format!("{SSE_HEAD}{role}"),
            close: true,
            drain: false,
            expect: Expect::Refused(502, "upstream_error"),
            outcome: "upstream_error",
        },
        Case {
            name: "no first token within first_token",
            timeouts: "{ connect: 200ms, first_token: 500ms, stream_idle: 10s, total: 20s }",
            stream: true,
            answer: format!("{SSE_HEAD}{role}"),
            close: false,
            drain: false,
            expect: Expect::Refused(504, "first_token_timeout"),
            outcome: "first_token_timeout",
        },
        Case {
            name: "a stream closed after its first token, without [DONE]",
            timeouts: SLOW,
            stream: true,
            answer: format!("{SSE_HEAD}{TOKEN}"),
            close: true,
            drain: false,
            expect: Expect::Cut("upstream_stream_error"),
            outcome: "upstream_stream_error",
        },
        Case {
            name: "a whole answer over max_response_bytes",
            timeouts: SLOW,
            stream: false,
            answer: format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{large}",
                large.len()
            ),
            close: false,
            drain: false,
            expect: Expect::Refused(502, "upstream_response_too_large"),
            outcome: "upstream_response_too_large",
        },
        Case {
            name: "a stream that stalls after its first token",
            timeouts: "{ connect: 200ms, first_token: 2s, stream_idle: 400ms, total: 20s }",
            stream: true,
            answer: format!("{SSE_HEAD}{TOKEN}"),
            close: false,
            drain: false,
            expect: Expect::Cut("stream_idle_timeout"),
            outcome: "stream_idle_timeout",
        },
        Case {
            name: "a stream past the total budget",
            timeouts: "{ connect: 200ms, first_token: 500ms, stream_idle: 800ms, total: 800ms }",
            stream: true,
            answer: format!("{SSE_HEAD}{TOKEN}"),
            close: false,
            drain: false,
            expect: Expect::Cut("deadline_exceeded"),
            outcome: "deadline_exceeded",
        },
        Case {
            name: "a stream open when the drain runs out",
            timeouts: SLOW,
            stream: true,
            answer: format!("{SSE_HEAD}{TOKEN}"),
            close: false,
            drain: true,
            expect: Expect::Cut("gateway_shutdown"),
            outcome: "gateway_shutdown",
        },
    ]
}

/// One replica, health checks off, the case's timeouts; the picker beside the proxy.
fn config(timeouts: &str) -> String {
    format!(
        r#"
listen: 127.0.0.1:0
server: {{ drain_delay: 50ms, drain_timeout: 500ms, max_response_bytes: 1024 }}
endpoint_picker: {{ listen: 127.0.0.1:0, fallbacks: 0 }}
routes:
  - model: chat
    upstream_model: sim
    replicas: [{{E0}}]
    health: {{ enabled: false }}
    timeouts: {timeouts}
    classes:
      - {{ name: interactive, concurrency: 2, queue: 2, queue_wait: 300ms }}
"#
    )
}

/// A replica for one request: it reads the request's head and body, writes `answer`, and
/// closes the connection if `close`, else holds it open, writing nothing more, whatever its
/// client does.
async fn script(answer: String, close: bool) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        let body_read = |got: &[u8]| {
            let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
                return false;
            };
            let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            got.len() >= end + 4 + len
        };
        while !body_read(&got) {
            let n = conn.read(&mut buf).await.unwrap_or(0);
            if n == 0 {
                return;
            }
            got.extend_from_slice(&buf[..n]);
        }
        conn.write_all(answer.as_bytes()).await.unwrap();
        if !close {
            std::future::pending::<()>().await;
        }
    });
    url
}

/// The case through `door`, checked; the two doors' answers must match `case.expect`.
async fn run(case: &Case, door: Door) {
    let replica = script(case.answer.clone(), case.close).await;
    let mut gateway = testkit::Gateway::start(&config(case.timeouts), std::slice::from_ref(&replica)).await;
    let addr: SocketAddr = replica.trim_start_matches("http://").parse().unwrap();
    let envoy;
    let url = match door {
        Door::Proxy => gateway.url.clone(),
        Door::Picker => {
            envoy = Envoy::start(&EnvoyOptions {
                picker: gateway.gateway.picker_addr.get().copied(),
                endpoints: vec![addr],
                fail_open: false,
                retries: 0,
                picker_tls: false,
            })
            .await;
            envoy.url.clone()
        }
    };
    let what = format!("{} through the {door:?}", case.name);
    let mut r = http()
        .post(format!("{url}/v1/chat/completions"))
        .json(&chat("chat", 8, case.stream))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let mut body = String::new();
    if case.drain {
        // The stream is under way: its first bytes are here before the gateway drains.
        let first = r.chunk().await.unwrap().unwrap_or_default();
        body.push_str(&String::from_utf8_lossy(&first));
        gateway.shutdown();
    }
    let retry_after = r.headers().get("retry-after").cloned();
    let (rest, _, _) = read_stream(r).await;
    body.push_str(&rest);
    match case.expect {
        Expect::Refused(expected, code) => {
            assert_eq!(status, expected, "{what}: {body}");
            let v: serde_json::Value =
                serde_json::from_str(&body).unwrap_or_else(|e| panic!("{what}: {e}: {body}"));
            assert_eq!(v["error"]["code"], code, "{what}: {body}");
            if expected == 503 {
                assert_eq!(
                    retry_after.as_ref().and_then(|v| v.to_str().ok()),
                    Some("1"),
                    "{what}"
                );
            }
        }
        Expect::Cut(code) => {
            assert_eq!(status, 200, "{what}: {body}");
            let events = sse_data(&body);
            assert!(
                events.iter().any(|e| e.contains("t0 ")),
                "{what}: the first token went out: {body}"
            );
            let last: serde_json::Value = serde_json::from_str(events.last().unwrap())
                .unwrap_or_else(|e| panic!("{what}: {e}: {body}"));
            assert_eq!(last["error"]["code"], code, "{what}: {body}");
        }
    }
    assert!(
        eventually(Duration::from_secs(3), || gateway.records().len() == 1).await,
        "{what}: one record"
    );
    assert_eq!(gateway.records()[0].outcome, case.outcome, "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_front_doors_answer_each_case_alike() {
    for case in cases() {
        for door in [Door::Proxy, Door::Picker] {
            run(&case, door).await;
        }
    }
}
