//! The public port's HTTP/1.1 and the replicas' answers, as an attacker or a broken replica would
//! send them, under both servers (`server.http1: fast`, the gateway's own, and `hyper`): what each
//! answers, and that both answer alike (the differential corpus at the end).

use crate::support::{Stack, chat, engine, http, read_stream, tiny};
use crate::wire::{Answer, read_answer};
use serde_json::Value;
use std::time::Duration;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::time::Instant;

const MODES: [&str; 2] = ["fast", "hyper"];

/// One route to `{E0}`, served by the `http1` server, with `server` settings added.
fn config(http1: &str, server: &str) -> String {
    format!(
        r#"
listen: 127.0.0.1:0
server: {{ http1: {http1}, max_body_bytes: 2000{server} }}
routes:
  - model: chat
    upstream_model: sim
    replicas: [{{E0}}]
    timeouts: {{ connect: 500ms, first_token: 1s, stream_idle: 5s, total: 600s }}
"#
    )
}

async fn stack(http1: &str, server: &str) -> Stack {
    Stack::start(vec![engine(tiny()).await], &config(http1, server)).await
}

fn addr(stack: &Stack) -> String {
    stack.url.trim_start_matches("http://").to_owned()
}

/// Sends `bytes` on a new connection and reads the first answer; `None` if the server closed
/// without one. Panics if neither comes within `within`.
async fn first_answer(stack: &Stack, bytes: &[u8], within: Duration) -> Option<Answer> {
    let tcp = TcpStream::connect(addr(stack)).await.unwrap();
    let mut r = BufReader::new(tcp);
    r.get_mut().write_all(bytes).await.unwrap();
    tokio::time::timeout(within, read_answer(&mut r))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "no answer nor close within {within:?} to {:?}",
                String::from_utf8_lossy(bytes)
            )
        })
}

fn post(path: &str, host: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\n{host}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

fn small_chat() -> String {
    chat("chat", 2, false).to_string()
}

fn error_code(a: &Answer) -> Option<String> {
    let v: Value = serde_json::from_str(&a.body).ok()?;
    v["error"]["code"].as_str().map(str::to_owned)
}

/// B01: bytes that are not HTTP (a TLS handshake, garbage, bare CR line ends) were held until
/// `header_timeout` (30 s); they get hyper's 400, or a close, at once. hyper itself waits on
/// some bare-CR heads (past its first 24 bytes): under `http1: hyper` those are left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_that_are_not_http_are_answered_at_once() {
    let client_hello: &[u8] = &[
        0x16, 0x03, 0x01, 0x00, 0xa5, 0x01, 0x00, 0x00, 0xa1, 0x03, 0x03, 0x00, 0x01, 0x02, 0x03,
    ];
    for mode in MODES {
        let stack = stack(mode, "").await;
        for bytes in [
            client_hello,
            b"\x00\x00\x00\x00garbage",
            b"POST /v1/chat/completions HTTP/1.1\rHost: x\rContent-Length: 2\r\r{}",
            b"GET / HTTP/1.1\r\nHo st: x\r\n",
        ] {
            if mode == "hyper" && bytes.contains(&b'\r') {
                continue;
            }
            let start = Instant::now();
            let answer = first_answer(&stack, bytes, Duration::from_secs(5)).await;
            if let Some(a) = &answer {
                assert_eq!(a.status, 400, "{mode}: {bytes:?}");
            }
            assert!(start.elapsed() < Duration::from_secs(5), "{mode}");
        }
    }
}

/// B02: a lone CR before the request line was skipped as a blank line and the request served;
/// hyper answers 400, and so does the gateway whichever server parses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_cr_before_the_request_line_is_refused() {
    for mode in MODES {
        let stack = stack(mode, "").await;
        let bytes = format!("\r{}", post("/v1/chat/completions", "Host: x\r\n", &small_chat()));
        let a = first_answer(&stack, bytes.as_bytes(), Duration::from_secs(5)).await;
        assert_eq!(a.map(|a| a.status), Some(400), "{mode}");
        // Blank lines (CR LF, LF) before it are still ignored.
        let bytes = format!(
            "\r\n\n{}",
            post("/v1/chat/completions", "Host: x\r\n", &small_chat())
        );
        let a = first_answer(&stack, bytes.as_bytes(), Duration::from_secs(20)).await;
        assert_eq!(a.map(|a| a.status), Some(200), "{mode}");
    }
}

/// B03 (RFC 9112 §3.2): an HTTP/1.1 request without Host, with two, or with an invalid one was
/// served on every path; it gets 400 `invalid_host` in the OpenAI shape, with its request ID.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_one_valid_host_gets_400_on_every_path() {
    for mode in MODES {
        let stack = stack(mode, "").await;
        let chat = small_chat();
        for host in [
            "",
            "Host: a\r\nHost: a\r\n",
            "Host: a b\r\n",
            "Host: u@gw\r\n",
            "Host: gw:port\r\n",
        ] {
            let requests = [
                post("/v1/chat/completions", host, &chat),
                format!("GET /v1/models HTTP/1.1\r\n{host}\r\n"),
                format!("GET /health HTTP/1.1\r\n{host}\r\n"),
            ];
            for request in requests {
                let a = first_answer(&stack, request.as_bytes(), Duration::from_secs(5))
                    .await
                    .expect("an answer");
                assert_eq!(a.status, 400, "{mode}: {request:?}");
                assert_eq!(
                    error_code(&a).as_deref(),
                    Some("invalid_host"),
                    "{mode}: {}",
                    a.body
                );
                assert!(a.header("x-request-id").is_some(), "{mode}: {request:?}");
            }
        }
        // A valid one, an empty one, and HTTP/1.0 without one are served.
        for request in [
            post("/v1/chat/completions", "Host: gw.example:8080\r\n", &chat),
            post("/v1/chat/completions", "Host: \r\n", &chat),
            "GET /health HTTP/1.0\r\n\r\n".to_owned(),
        ] {
            let a = first_answer(&stack, request.as_bytes(), Duration::from_secs(20)).await;
            assert_eq!(a.map(|a| a.status), Some(200), "{mode}: {request:?}");
        }
    }
}

/// B04: a Content-Length over `max_body_bytes` was handed to hyper, which said 100 Continue and
/// answered 413 only once the limit's worth had arrived (408 if it never did). It is refused
/// at once, before any of the body is asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_content_length_is_refused_before_the_body() {
    for mode in MODES {
        let stack = stack(mode, "").await;
        for expect in ["Expect: 100-continue\r\n", ""] {
            let head = format!(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{expect}Content-Length: 1000000\r\n\r\n{{\"model\":"
            );
            let tcp = TcpStream::connect(addr(&stack)).await.unwrap();
            let mut r = BufReader::new(tcp);
            r.get_mut().write_all(head.as_bytes()).await.unwrap();
            let mut first = String::new();
            let line = tokio::time::timeout(
                Duration::from_secs(5),
                tokio::io::AsyncBufReadExt::read_line(&mut r, &mut first),
            )
            .await;
            assert!(line.is_ok(), "{mode} {expect:?}: no answer within 5 s");
            assert!(first.starts_with("HTTP/1.1 413"), "{mode} {expect:?}: {first:?}");
        }
    }
}

/// B13: the 503 of a connection over `max_connections` had no `x-request-id` and no
/// `Server-Timing`; every answer carries both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_carries_its_request_id_and_server_timing() {
    for mode in MODES {
        let stack = stack(mode, ", max_connections: 1").await;
        // The one connection allowed, held open.
        let mut held = BufReader::new(TcpStream::connect(addr(&stack)).await.unwrap());
        held.get_mut()
            .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let a = read_answer(&mut held)
            .await
            .expect("the first connection is served");
        assert_eq!(a.status, 200);
        assert!(a.header("server-timing").is_some(), "{mode}: {:?}", a.headers);
        let request = post(
            "/v1/chat/completions",
            "Host: x\r\nX-Request-Id: over-1\r\n",
            &small_chat(),
        );
        let a = first_answer(&stack, request.as_bytes(), Duration::from_secs(5))
            .await
            .expect("an answer");
        assert_eq!(a.status, 503, "{mode}");
        assert_eq!(error_code(&a).as_deref(), Some("too_many_connections"));
        assert_eq!(
            a.header("x-request-id"),
            Some("over-1"),
            "{mode}: {:?}",
            a.headers
        );
        assert!(a.header("server-timing").is_some(), "{mode}: {:?}", a.headers);
        drop(held);
    }
}

/// Issue 47: a 400 `invalid_host` and a 431 `headers_too_large` wrote no access-log line, and
/// neither did the other answers made before the request path (the router's 404 and 405, the
/// 503 of a connection over `max_connections`). Each is logged with its request's ID, status
/// and code, whichever server read it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_before_the_request_path_are_logged() {
    let chat = small_chat();
    let big = format!("Host: x\r\nX-Big: {}\r\n", "b".repeat(3000));
    let cases = [
        (
            post(
                "/v1/chat/completions",
                "Host: a\r\nHost: b\r\nX-Request-Id: host-1\r\n",
                &chat,
            ),
            "host-1",
            400,
            "invalid_host",
        ),
        (
            "GET /v1/models HTTP/1.1\r\nX-Request-Id: host-2\r\n\r\n".to_owned(),
            "host-2",
            400,
            "invalid_host",
        ),
        (
            post(
                "/v1/chat/completions",
                &format!("{big}X-Request-Id: big-1\r\n"),
                &chat,
            ),
            "big-1",
            431,
            "headers_too_large",
        ),
        (
            format!("GET /health HTTP/1.1\r\n{big}X-Request-Id: big-2\r\n\r\n"),
            "big-2",
            431,
            "headers_too_large",
        ),
        (
            post("/nope", "Host: x\r\nX-Request-Id: path-1\r\n", &chat),
            "path-1",
            404,
            "not_found",
        ),
        (
            "GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: method-1\r\n\r\n".to_owned(),
            "method-1",
            405,
            "method_not_allowed",
        ),
    ];
    let logged = |stack: &Stack, id: &'static str, status: u16, code: &'static str| {
        let records = stack.records();
        let found = records
            .iter()
            .any(|r| r.id == id && r.status == status && r.outcome == code);
        (found, records)
    };
    for mode in MODES {
        let limited = stack(mode, ", max_header_bytes: 2048").await;
        for (request, id, status, code) in &cases {
            let (id, status, code) = (*id, *status, *code);
            let a = first_answer(&limited, request.as_bytes(), Duration::from_secs(5)).await;
            assert_eq!(a.map(|a| a.status), Some(status), "{mode}: {id}");
            let (found, records) = logged(&limited, id, status, code);
            assert!(found, "{mode}: no line for {id} ({status} {code}): {records:?}");
        }
        // The one connection allowed, held open: the next gets 503.
        let full = stack(mode, ", max_connections: 1").await;
        let mut held = BufReader::new(TcpStream::connect(addr(&full)).await.unwrap());
        held.get_mut()
            .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        assert_eq!(read_answer(&mut held).await.map(|a| a.status), Some(200));
        let request = post(
            "/v1/chat/completions",
            "Host: x\r\nX-Request-Id: over-1\r\n",
            &chat,
        );
        let a = first_answer(&full, request.as_bytes(), Duration::from_secs(5)).await;
        assert_eq!(a.map(|a| a.status), Some(503), "{mode}");
        let (found, records) = logged(&full, "over-1", 503, "too_many_connections");
        assert!(found, "{mode}: {records:?}");
        drop(held);
    }
}

/// A gateway in front of one scripted replica that answers every POST with `answer` (and
/// keeps the connection: an answer cut short stalls there).
async fn in_front_of(answer: Vec<u8>, server: &str) -> Stack {
    let (replica, _) = crate::vllm::scripted("sim", None, move |_| answer.clone()).await;
    let yaml = config("fast", server).replace("{E0}", &replica);
    Stack::start(vec![], &yaml).await
}

/// A non-streamed (or streamed) chat completion of two tokens through `stack`.
async fn chat_through(stack: &Stack, stream: bool) -> reqwest::Response {
    http()
        .post(format!("{}/v1/chat/completions", stack.url))
        .json(&chat("chat", 2, stream))
        .send()
        .await
        .unwrap()
}

/// B08: a replica's 204 reached a non-streaming client as 200 with an empty JSON body; it is
/// relayed as it came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_2xx_is_relayed_as_it_came() {
    let stack = in_front_of(b"HTTP/1.1 204 No Content\r\n\r\n".to_vec(), "").await;
    let r = chat_through(&stack, false).await;
    assert_eq!(r.status(), 204);
    assert!(r.headers().get("content-type").is_none(), "{:?}", r.headers());
    assert!(r.headers().get("x-request-id").is_some());
    assert_eq!(r.bytes().await.unwrap().len(), 0);
}

/// Issue 47: the gateway's own HTTP/1.1 answered a replica's 204 with `content-length: 0`, which
/// RFC 9110 §8.6 forbids (hyper's server sends none). Under either server the 204 has no framing
/// field, and the connection serves the next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relayed_204_says_nothing_of_a_body() {
    let (replica, _) =
        crate::vllm::scripted("sim", None, |_| b"HTTP/1.1 204 No Content\r\n\r\n".to_vec()).await;
    for mode in MODES {
        let stack = Stack::start(vec![], &config(mode, "").replace("{E0}", &replica)).await;
        let mut r = BufReader::new(TcpStream::connect(addr(&stack)).await.unwrap());
        let request = post("/v1/chat/completions", "Host: x\r\n", &small_chat());
        for i in 0..2 {
            r.get_mut().write_all(request.as_bytes()).await.unwrap();
            let a = read_answer(&mut r).await.expect("an answer");
            assert_eq!(a.status, 204, "{mode}, request {i}");
            for field in ["content-length", "transfer-encoding"] {
                assert_eq!(a.header(field), None, "{mode}, request {i}: {:?}", a.headers);
            }
        }
    }
}

/// B09: a replica's 4xx whose body was over 64 KiB reached the client with an empty body; it is
/// relayed whole, up to `max_response_bytes`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_4xx_body_is_relayed_whole() {
    let message = "x".repeat(100 * 1024);
    let body =
        format!(r#"{{"error":{{"message":"{message}","type":"BadRequestError","param":null,"code":400}}}}"#);
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let stack = in_front_of(answer.into_bytes(), "").await;
    let r = chat_through(&stack, false).await;
    assert_eq!(r.status(), 400);
    assert_eq!(r.text().await.unwrap(), body);
}

/// B10: a replica that sends an error head and stalls its body held a streaming client for the
/// total budget (600 s here), with its slot; the first-token budget (1 s) bounds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_head_with_a_stalled_body_is_bounded_by_the_first_token_budget() {
    let answer = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 100\r\n\r\n{\"error\":".to_vec();
    let stack = in_front_of(answer, "").await;
    let start = Instant::now();
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        http()
            .post(format!("{}/v1/chat/completions", stack.url))
            .json(&chat("chat", 2, true))
            .send(),
    )
    .await
    .expect("answered within 20 s, not the 600 s total budget")
    .unwrap();
    assert_eq!(r.status(), 504);
    assert!(start.elapsed() < Duration::from_secs(10));
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "first_token_timeout", "{v}");
}

/// B11: a replica that sends `[DONE]` and never ends its body gave the client an SSE error
/// event after `[DONE]` (at `stream_idle`) while the log said `ok`. The stream ends cleanly
/// soon after `[DONE]`, and the access log notes what the replica did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_done_without_the_bodys_end_ends_the_stream_cleanly() {
    let event = |data: &str| {
        let e = format!("data: {data}\n\n");
        format!("{:x}\r\n{e}\r\n", e.len())
    };
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{}{}",
        event(r#"{"choices":[{"index":0,"delta":{"content":"hi"}}]}"#),
        event("[DONE]")
    );
    let stack = in_front_of(answer.into_bytes(), "").await;
    let start = Instant::now();
    let r = chat_through(&stack, true).await;
    assert_eq!(r.status(), 200);
    let (body, _, clean) = tokio::time::timeout(Duration::from_secs(20), read_stream(r))
        .await
        .expect("the stream ends");
    assert!(clean, "the stream ended as a whole one: {body}");
    assert!(
        body.trim_end().ends_with("data: [DONE]"),
        "nothing after [DONE]: {body}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "before stream_idle (5 s)"
    );
    let ok = crate::support::eventually(Duration::from_secs(5), || {
        stack
            .records()
            .iter()
            .any(|r| r.outcome == "ok" && r.note == Some("upstream_body_not_ended"))
    })
    .await;
    assert!(ok, "{:?}", stack.records());
}

/// B12: a whole answer had no bound (a 40 MB answer cost about three times its size); one over
/// `max_response_bytes` gets a clear 502, one within it is relayed byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_answer_is_bounded_by_max_response_bytes() {
    for (size, status) in [(900 * 1024, 200), (2 * 1024 * 1024, 502)] {
        let body = format!(r#"{{"id":"x","pad":"{}"}}"#, "p".repeat(size));
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let stack = in_front_of(answer.into_bytes(), ", max_response_bytes: 1048576").await;
        let r = chat_through(&stack, false).await;
        assert_eq!(r.status(), status, "{size}");
        let text = r.text().await.unwrap();
        if status == 200 {
            assert!(text == body, "relayed byte for byte");
        } else {
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["error"]["code"], "upstream_response_too_large", "{v}");
            assert!(
                v["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("max_response_bytes")
            );
        }
    }
}

/// A replica's chunked answer to a chat completion: `chunks` (each a size line and its data, as
/// written), then the last chunk and `trailer` (its fields and the blank line).
fn chunked_answer(stream: bool, chunks: &str, trailer: &str) -> Vec<u8> {
    let kind = if stream {
        "text/event-stream"
    } else {
        "application/json"
    };
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: {kind}\r\ntransfer-encoding: chunked\r\n\r\n{chunks}0\r\n{trailer}"
    )
    .into_bytes()
}

/// What a replica says in a stream of one token, or in a whole answer.
fn answer_data(stream: bool) -> &'static str {
    if stream {
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n"
    } else {
        r#"{"id":"x","object":"chat.completion","choices":[]}"#
    }
}

/// Issue 47: a replica's chunk size of up to 2^64 − 1 was taken, so its data ran on until the
/// replica closed: a whole answer waited for the total budget (600 s here), and a stream's
/// client got `[DONE]`, then the replica's own framing (`\r\n0\r\n\r\n`) in its SSE body, then an
/// error event. The size is refused at once: 502, and no framing byte reaches the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_size_no_answer_could_have_is_refused_at_once() {
    for (stream, code) in [(true, "upstream_error"), (false, "upstream_response_too_large")] {
        let data = answer_data(stream);
        let chunks = format!("ffffffffffffffff\r\n{data}\r\n");
        let stack = in_front_of(chunked_answer(stream, &chunks, "\r\n"), "").await;
        let r = tokio::time::timeout(Duration::from_secs(20), async {
            let r = chat_through(&stack, stream).await;
            (r.status().as_u16(), r.text().await.unwrap_or_default())
        })
        .await
        .expect("answered at once, not at the total budget (600 s)");
        let (status, text) = r;
        assert!(
            !text.contains("\r\n0\r\n"),
            "stream {stream}: framing in the body: {text:?}"
        );
        assert_eq!(status, 502, "stream {stream}: {text:?}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["code"], code, "stream {stream}: {v}");
    }
}

/// Issue 47: more than 99 trailer fields after a body already whole failed the answer (a 502 for
/// a whole answer; a stream got `[DONE]`, then `upstream_stream_error`). The body, whole at its
/// last chunk, reaches the client whole, and the answer is logged `ok`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailers_past_the_limit_do_not_discard_a_whole_answer() {
    let fields: String = (0..150).map(|i| format!("x-t{i}: v\r\n")).collect();
    for stream in [false, true] {
        let data = answer_data(stream);
        let chunks = format!("{:x}\r\n{data}\r\n", data.len());
        let stack = in_front_of(chunked_answer(stream, &chunks, &format!("{fields}\r\n")), "").await;
        let r = chat_through(&stack, stream).await;
        let status = r.status();
        let (body, _, clean) = tokio::time::timeout(Duration::from_secs(20), read_stream(r))
            .await
            .expect("the answer ends");
        assert_eq!(status, 200, "stream {stream}: {body}");
        assert!(clean, "stream {stream}: ended as a whole one: {body}");
        if stream {
            assert!(
                body.trim_end().ends_with("data: [DONE]"),
                "nothing after [DONE]: {body}"
            );
            assert!(!body.contains("error"), "{body}");
        } else {
            assert_eq!(body, data);
        }
        let ok = crate::support::eventually(Duration::from_secs(5), || {
            stack.records().iter().any(|r| r.outcome == "ok")
        })
        .await;
        assert!(ok, "stream {stream}: {:?}", stack.records());
    }
}

/// What one request got, as the differential test compares it: the status, the error code,
/// and the presence of the headers every answer has.
#[derive(Debug, PartialEq)]
struct Seen {
    status: Option<u16>,
    code: Option<String>,
    request_id: bool,
    timing: bool,
    content_type: Option<String>,
}

fn seen(a: Option<Answer>) -> Seen {
    match a {
        None => Seen {
            status: None,
            code: None,
            request_id: false,
            timing: false,
            content_type: None,
        },
        Some(a) => Seen {
            status: Some(a.status),
            code: error_code(&a),
            request_id: a.header("x-request-id").is_some(),
            timing: a.header("server-timing").is_some(),
            content_type: a.header("content-type").map(str::to_owned),
        },
    }
}

/// The corpus: valid requests and hostile ones (framing, smuggling, Host, lengths, methods,
/// targets, versions).
fn corpus() -> Vec<Vec<u8>> {
    let chat = small_chat();
    let stream = chat.replace("\"stream\":false", "\"stream\":true");
    let mut c: Vec<String> = vec![
        post("/v1/chat/completions", "Host: x\r\n", &chat),
        post("/v1/chat/completions", "host: x\r\n", &stream),
        post(
            "/v1/completions",
            "Host: x\r\n",
            r#"{"model":"chat","prompt":"hi","max_tokens":2}"#,
        ),
        post(
            "/v1/embeddings",
            "Host: x\r\n",
            r#"{"model":"chat","input":["hi","there"]}"#,
        ),
        post("/v1/embeddings", "Host: x\r\n", r#"{"model":"chat","input":[]}"#),
        post("/v1/chat/completions?x=1", "Host: x\r\n", &chat),
        post("/v1/chat/completions", "Host: x\r\nConnection: close\r\n", &chat),
        post("/v1/chat/completions", "Host: x\r\nX-Request-Id: abc\r\n", &chat),
        post("/v1/chat/completions", "Host: x\r\nX-Request-Id: a b\r\n", &chat),
        post("/v1/chat/completions", "Host: x\r\n", "{"),
        post("/v1/chat/completions", "Host: x\r\n", "{}"),
        post(
            "/v1/chat/completions",
            "Host: x\r\n",
            r#"{"model":"nope","messages":[]}"#,
        ),
        post("/v1/chat/completions", "Host: x\r\n", &"a".repeat(2001)),
        post("/v1/chat/completions", "", &chat),
        post("/v1/chat/completions", "Host: a\r\nHost: b\r\n", &chat),
        post("/v1/chat/completions", "Host: [::1\r\n", &chat),
        post("/v1/chat/completions/", "Host: x\r\n", &chat),
        post("/v1/models", "Host: x\r\n", &chat),
        post("/nope", "Host: x\r\n", &chat),
        format!("\r\n{}", post("/v1/chat/completions", "Host: x\r\n", &chat)),
        format!("\r{}", post("/v1/chat/completions", "Host: x\r\n", &chat)),
        format!("GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n"),
        "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n".into(),
        "GET /health HTTP/1.1\r\nHost: x\r\n\r\n".into(),
        "GET /ready HTTP/1.1\r\nHost: x\r\n\r\n".into(),
        "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".into(),
        "DELETE /v1/models HTTP/1.1\r\nHost: x\r\n\r\n".into(),
        "GET /health HTTP/1.0\r\n\r\n".into(),
        "GET /health HTTP/1.1\r\n\r\n".into(),
        "GET /health HTTP/2.0\r\nHost: x\r\n\r\n".into(),
        "GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n".into(),
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nContent-Length: {}\r\n\r\n{chat}",
            chat.len(),
            chat.len() + 1
        ),
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: +{}\r\n\r\n{chat}",
            chat.len()
        ),
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n{:x}\r\n{chat}\r\n0\r\n\r\n",
            chat.len()
        ),
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{chat}\r\n0\r\n\r\n",
            chat.len()
        ),
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n{:x}\r\n{chat}\r\n0\r\n\r\n",
            chat.len()
        ),
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, gzip\r\n\r\n{:x}\r\n{chat}\r\n0\r\n\r\n",
            chat.len()
        ),
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n{chat}",
            chat.len()
        ),
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n".into(),
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Folded: a\r\n b\r\nContent-Length: {}\r\n\r\n{chat}",
            chat.len()
        ),
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length : {}\r\n\r\n{chat}",
            chat.len()
        ),
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\nContent-Length: {}\n\n{chat}",
            chat.len()
        ),
        format!(
            "POST http://x/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{chat}",
            chat.len()
        ),
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\nConnection: Upgrade\r\nContent-Length: {}\r\n\r\n{chat}",
            chat.len()
        ),
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Spillway-Deadline: soon\r\nContent-Length: {}\r\n\r\n{chat}",
            chat.len()
        ),
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\nContent-Length: {}\r\n\r\n{chat}",
            "b".repeat(40_000),
            chat.len()
        ),
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}".into(),
        "\u{16}\u{3}\u{1}\u{0}".into(),
        "GET /health\r\n\r\n".into(),
        "GET  /health HTTP/1.1\r\nHost: x\r\n\r\n".into(),
        "get /health HTTP/1.1\r\nHost: x\r\n\r\n".into(),
    ];
    // Every request also in lower-case header names and with an extra header, as clients vary.
    c.push(post(
        "/v1/chat/completions",
        "HOST: x\r\nAUTHORIZATION: Bearer k\r\n",
        &chat,
    ));
    c.into_iter().map(String::into_bytes).collect()
}

/// The same corpus to a gateway of each server: each request gets the same status, the same
/// error code and the same kinds of headers, whichever server parses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_servers_answer_the_corpus_alike() {
    let server = ", header_timeout: 2s, body_timeout: 2s";
    let fast = stack("fast", server).await;
    let hyper = stack("hyper", server).await;
    let corpus = corpus();
    let mut differ = Vec::new();
    for request in &corpus {
        let a = seen(first_answer(&fast, request, Duration::from_secs(10)).await);
        let b = seen(first_answer(&hyper, request, Duration::from_secs(10)).await);
        if a != b {
            differ.push(format!(
                "{:?}\n  fast:  {a:?}\n  hyper: {b:?}",
                String::from_utf8_lossy(&request[..request.len().min(120)])
            ));
        }
    }
    println!(
        "differential corpus: {} requests, {} differ",
        corpus.len(),
        differ.len()
    );
    assert!(differ.is_empty(), "{}", differ.join("\n"));
}
