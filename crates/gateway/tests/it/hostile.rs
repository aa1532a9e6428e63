//! Hostile and unlucky traffic: slow and idle connections, too many connections, busy replicas,
//! a drain that runs out, requests that ask for too much, and what answers must not leak.

use crate::support::{Stack, chat, engine, http, read_stream, stalling, tiny};
use serde_json::{Value, json};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

const SLOW: &str = r#"
listen: 127.0.0.1:0
server: { header_timeout: 300ms, body_timeout: 300ms }
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}]
"#;

fn addr(stack: &Stack) -> String {
    stack.url.trim_start_matches("http://").to_owned()
}

/// Reads until the peer closes (or 5 s pass): what the server sent, and whether it closed.
async fn read_until_closed(tcp: &mut TcpStream) -> (String, bool) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match tokio::time::timeout_at(deadline, tcp.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&got).into_owned(), true),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => return (String::from_utf8_lossy(&got).into_owned(), false),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_heads_slow_bodies_and_idle_connections_are_closed() {
    let stack = Stack::start(vec![engine(tiny()).await], SLOW).await;
    // A head that never ends (slowloris).
    let mut partial = TcpStream::connect(addr(&stack)).await.unwrap();
    partial
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: 1\r\n")
        .await
        .unwrap();
    // A body that never ends.
    let mut body = TcpStream::connect(addr(&stack)).await.unwrap();
    body.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\":",
    )
    .await
    .unwrap();
    // A keep-alive connection that goes idle after one answer.
    let mut idle = TcpStream::connect(addr(&stack)).await.unwrap();
    idle.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();

    let (sent, closed) = read_until_closed(&mut partial).await;
    assert!(
        closed,
        "a partial head is closed after header_timeout (got {sent:?})"
    );
    let (sent, closed) = read_until_closed(&mut body).await;
    assert!(closed, "an unfinished body ends the connection");
    assert!(sent.starts_with("HTTP/1.1 408"), "{sent}");
    assert!(sent.contains("\"code\":\"body_timeout\""), "{sent}");
    let (sent, closed) = read_until_closed(&mut idle).await;
    assert!(sent.starts_with("HTTP/1.1 200"), "{sent}");
    assert!(
        closed,
        "an idle keep-alive connection is closed after header_timeout"
    );
    assert!(
        stack.engines[0].engine.records().is_empty(),
        "nothing reached the replica"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_max_connections_health_answers_and_the_rest_is_refused_fast() {
    let yaml = r#"
listen: 127.0.0.1:0
server: { max_connections: 4 }
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}]
"#;
    let stack = Stack::start(vec![engine(tiny()).await], yaml).await;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(TcpStream::connect(addr(&stack)).await.unwrap());
    }
    let get = |path: &'static str| {
        let a = addr(&stack);
        async move {
            let mut tcp = TcpStream::connect(a).await.unwrap();
            tcp.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
                .await
                .unwrap();
            read_until_closed(&mut tcp).await
        }
    };
    let (health, closed) = get("/health").await;
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(closed, "the connection over the limit closes after its answer");
    let (models, _) = get("/v1/models").await;
    assert!(models.starts_with("HTTP/1.1 503"), "{models}");
    assert!(models.contains("too_many_connections"), "{models}");
    assert!(models.to_ascii_lowercase().contains("retry-after: 1"), "{models}");
    drop(held);
    // Back under the limit: served as usual as soon as the held connections are gone.
    let served = testkit::poll(
        Duration::from_secs(2),
        || async { stack.stream("chat", 2).await.status() == 200 },
        |served| *served,
    )
    .await;
    assert!(served, "service recovers once connections close");
    let metrics = stack.metrics().await;
    let over = metrics
        .lines()
        .find(|l| l.starts_with("spillway_connections_over_limit_total"))
        .expect("the counter is exposed");
    assert!(!over.ends_with(" 0"), "{over}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_replica_gets_no_first_attempts_until_its_retry_after() {
    let yaml = r#"
listen: 127.0.0.1:0
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}, {E1}]
    retry: { attempts: 2, budget: { ratio: 0.1, min_per_second: 1 } }
"#;
    let stack = Stack::start(vec![engine(tiny()).await, engine(tiny()).await], yaml).await;
    stack.engines[0]
        .engine
        .apply_faults(&serde_json::from_str(r#"{"fail_every": {"nth": 1, "status": 503}}"#).unwrap())
        .unwrap();
    let mut failed = 0;
    for _ in 0..150 {
        let r = stack.stream("chat", 2).await;
        if r.status() != 200 {
            failed += 1;
        }
        read_stream(r).await;
    }
    assert_eq!(
        failed, 0,
        "the idle replica takes the load while the busy one backs off"
    );
    let metrics = stack.metrics().await;
    let busy_answers: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("spillway_upstream_requests_total") && l.contains("result=\"busy\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(
        busy_answers < 20.0,
        "the busy replica was asked {busy_answers} times for 150 requests"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_that_runs_out_ends_streams_with_an_error_and_exits() {
    let yaml = r#"
listen: 127.0.0.1:0
server: { drain_delay: 100ms, drain_timeout: 500ms }
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}]
    timeouts: { stream_idle: 60s }
"#;
    let mut stack = Stack::start(vec![engine(stalling(2)).await], yaml).await;
    let mut r = stack.stream("chat", 50).await;
    assert_eq!(r.status(), 200);
    r.chunk().await.unwrap();
    let t = Instant::now();
    stack.shutdown();
    let (body, _, _) = tokio::time::timeout(Duration::from_secs(10), read_stream(r))
        .await
        .expect("the stream ends");
    assert!(body.contains("\"code\":\"gateway_shutdown\""), "{body}");
    let server = stack.server.take().unwrap();
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("the gateway exits right after its drain")
        .unwrap()
        .unwrap();
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    let records = stack.records();
    // One word for the cut: the client's event and the log say the same.
    assert_eq!(records[0].outcome, "gateway_shutdown", "{records:?}");
    assert!(body.contains("\"type\":\"service_unavailable_error\""), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_gateway_exits_right_after_its_drain_delay() {
    let yaml = r#"
listen: 127.0.0.1:0
server: { drain_delay: 200ms, drain_timeout: 10s }
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}]
"#;
    let mut stack = Stack::start(vec![engine(tiny()).await], yaml).await;
    // A keep-alive connection left open by a client must not hold the exit up.
    let r = stack.stream("chat", 2).await;
    read_stream(r).await;
    let t = Instant::now();
    stack.shutdown();
    let server = stack.server.take().unwrap();
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("exits")
        .unwrap()
        .unwrap();
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_lists_and_best_of_count_against_the_caps() {
    let yaml = r#"
listen: 127.0.0.1:0
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}]
    limits: { max_n: 4, max_tokens: { cap: 64 } }
"#;
    let stack = Stack::start(vec![engine(tiny()).await], yaml).await;
    let url = format!("{}/v1/completions", stack.url);
    let post = |body: Value| {
        let url = url.clone();
        async move { http().post(url).json(&body).send().await.unwrap() }
    };
    let prompts: Vec<String> = (0..1000).map(|i| format!("prompt {i}")).collect();
    let r = post(json!({"model": "chat", "prompt": prompts, "max_tokens": 8})).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "n_over_cap");
    assert_eq!(v["error"]["param"], "prompt");
    testkit::assert_error_mentions(&v, "1000 sequences (1000 prompts × n = 1)");
    let r = post(json!({"model": "chat", "prompt": "x", "best_of": 1000, "max_tokens": 8})).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["param"], "best_of");
    testkit::assert_error_mentions(&v, "max_n");
    let r = post(json!({"model": "chat", "prompt": "x", "n": 2, "best_of": 1})).await;
    assert_eq!(r.status(), 400);
    let r = post(json!({"model": "chat", "prompt": "x", "n": 4, "max_tokens": 4})).await;
    assert_eq!(r.status(), 200, "n = 4 is at the cap");
    assert_eq!(
        stack.engines[0].engine.records().len(),
        4,
        "only the last one went upstream (its 4 sequences)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_told_before_authentication_and_metrics_can_stay_private() {
    let yaml = r#"
listen: 127.0.0.1:0
admin: { listen: 127.0.0.1:0, token_env: SPILLWAY_TEST_ADMIN_TOKEN }
server: { metrics: admin }
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}]
tenants:
  - team: search
    key_sha256: [ "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08" ]
"#;
    let stack = Stack::start(vec![engine(tiny()).await], yaml).await;
    let url = format!("{}/v1/chat/completions", stack.url);
    for model in ["chat", "no-such-model"] {
        let r = http()
            .post(&url)
            .json(&chat(model, 2, false))
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            401,
            "{model}: unknown and known models look the same without a key"
        );
    }
    let r = http()
        .post(&url)
        .bearer_auth("test")
        .json(&chat("no-such-model", 2, false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let public = http().get(format!("{}/metrics", stack.url)).send().await.unwrap();
    assert_eq!(
        public.status(),
        404,
        "metrics: admin keeps /metrics off the public listener"
    );
    let admin = stack.gateway.admin_addr.get().copied().expect("admin listens");
    let private = http()
        .get(format!("http://{admin}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(private.status(), 200);
    assert!(private.text().await.unwrap().contains("spillway_requests_total"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_below_the_handlers_are_openai_shaped_with_a_request_id() {
    let yaml = r#"
listen: 127.0.0.1:0
server: { max_body_bytes: 4096, max_header_bytes: 2048 }
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}]
"#;
    let stack = Stack::start(vec![engine(tiny()).await], yaml).await;
    let url = format!("{}/v1/chat/completions", stack.url);
    let check = |r: reqwest::Response, status: u16, code: &'static str| async move {
        assert_eq!(r.status(), status);
        assert!(r.headers().contains_key("x-request-id"), "{:?}", r.headers());
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], code, "{v}");
    };
    let big_header = "x".repeat(3000);
    let r = http()
        .post(&url)
        .header("x-big", big_header)
        .json(&chat("chat", 2, false))
        .send()
        .await
        .unwrap();
    check(r, 431, "headers_too_large").await;
    let r = http().get(&url).send().await.unwrap();
    check(r, 405, "method_not_allowed").await;
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let r = h2
        .post(&url)
        .header("content-type", "application/json")
        .body(vec![b' '; 10_000])
        .send()
        .await
        .unwrap();
    assert_eq!(r.version(), reqwest::Version::HTTP_2);
    check(r, 413, "body_too_large").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_timeout_logs_how_long_it_waited() {
    let yaml = r#"
listen: 127.0.0.1:0
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}]
    classes:
      - { name: interactive, concurrency: 1, queue: 1, queue_wait: 200ms }
"#;
    let stack = Stack::start(vec![engine(stalling(1)).await], yaml).await;
    let mut holder = stack.stream("chat", 50).await;
    holder.chunk().await.unwrap();
    let r = stack.stream("chat", 2).await;
    assert_eq!(r.status(), 503);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "queue_timeout");
    let timed_out = stack
        .records()
        .into_iter()
        .find(|r| r.outcome == "queue_timeout")
        .expect("logged");
    let waited = timed_out.queue_ms.expect("queue_ms is logged");
    assert!((190.0..2000.0).contains(&waited), "{waited}");
    drop(holder);
}

/// A replica whose stream starts well, then sends one event that never ends: the gateway holds at
/// most 1 MiB of it, then ends the stream with an SSE error and drops the replica's connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_that_never_ends_is_cut_at_its_bound() {
    let replica = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", replica.local_addr().unwrap());
    let (closed_tx, closed) = tokio::sync::oneshot::channel::<usize>();
    tokio::spawn(async move {
        let (mut s, _) = replica.accept().await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !got.windows(4).any(|w| w == b"\r\n\r\n") || !got.ends_with(b"}") {
            let n = s.read(&mut buf).await.unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        let first = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n";
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n",
            first.len()
        );
        s.write_all(head.as_bytes()).await.unwrap();
        s.write_all(first).await.unwrap();
        s.write_all(b"\r\n6\r\ndata: \r\n").await.unwrap();
        // Then 8 KiB chunks of an event with no end, until the gateway hangs up.
        let piece = [b'x'; 8192];
        let mut sent = 0;
        loop {
            let chunk = [format!("{:x}\r\n", piece.len()).as_bytes(), &piece[..], b"\r\n"].concat();
            if s.write_all(&chunk).await.is_err() || sent > 64 << 20 {
                break;
            }
            sent += piece.len();
        }
        let _ = closed_tx.send(sent);
    });
    let yaml = format!(
        "listen: 127.0.0.1:0\nroutes:\n  - model: chat\n    replicas: [{url}]\n    health: {{ enabled: false }}\n    timeouts: {{ connect: 1s, first_token: 2s, stream_idle: 2s, total: 20s }}\n"
    );
    let stack = Stack::start(vec![], &yaml).await;
    let r = stack.stream("chat", 10).await;
    let status = r.status();
    let (body, _, _) = read_stream(r).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.starts_with("data: {\"choices\""),
        "{}",
        &body[..body.len().min(200)]
    );
    assert!(
        body.contains("\"code\":\"upstream_stream_error\""),
        "{}",
        &body[..body.len().min(400)]
    );
    assert!(body.contains("over 1024 KiB"), "{}", &body[..body.len().min(400)]);
    assert!(
        body.len() < 4096,
        "the endless event is not relayed: {} bytes",
        body.len()
    );
    let sent = tokio::time::timeout(Duration::from_secs(10), closed)
        .await
        .expect("the replica sees its connection closed")
        .unwrap();
    println!("the replica sent {} KiB before the gateway hung up", sent / 1024);
    assert!(sent < 16 << 20, "{sent}");
    assert_eq!(stack.records()[0].outcome, "upstream_stream_error");
}
