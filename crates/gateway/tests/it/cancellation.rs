//! Cancellation at every stage: a client that leaves, a hung engine, a stream that stalls, and a
//! caller's own deadline — each drops the upstream request, which the engine counts as an abort.

use crate::support::{Stack, chat, engine, eventually, http, read_stream, sse_data, stalling, tiny};
use std::time::Duration;
use tokio::time::Instant;

const ROUTE: &str = r#"
listen: 127.0.0.1:0
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}]
    timeouts: { connect: 200ms, first_token: 500ms, stream_idle: 300ms, total: 20s }
    classes:
      - name: interactive
        concurrency: 8
        queue: 8
        queue_wait: 200ms
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_mid_stream_aborts_the_engine_request() {
    let stack = Stack::start(vec![engine(tiny()).await], ROUTE).await;
    let mut r = stack.stream("chat", 3000).await;
    for _ in 0..3 {
        r.chunk().await.unwrap();
    }
    let left = Instant::now();
    drop(r);
    let truth = &stack.engines[0].engine;
    assert!(
        eventually(Duration::from_secs(5), || truth.snapshot().aborts == 1).await,
        "the engine aborts"
    );
    let took = left.elapsed();
    println!("client gone → engine abort: {took:?}");
    assert!(took < Duration::from_millis(500), "abort took {took:?}");
    let gate = stack.gateway.admission("chat", "interactive").unwrap();
    assert!(eventually(Duration::from_secs(1), || gate.in_flight() == 0).await);
    assert!(eventually(Duration::from_secs(1), || stack.records().len() == 1).await);
    let rec = &stack.records()[0];
    assert_eq!(rec.outcome, "client_disconnect");
    let m = stack.metrics().await;
    assert!(m.contains("spillway_cancellations_total{class=\"interactive\",reason=\"client_disconnect\",route=\"chat\"} 1"), "{m}");
    assert!(m.lines().any(|l| {
        l.starts_with("spillway_wasted_tokens_total{class=\"interactive\",reason=\"client_disconnect\"")
    }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_engine_gets_a_clean_504_at_first_token_and_an_abort() {
    let cfg = stalling(0);
    let stack = Stack::start(vec![engine(cfg).await], ROUTE).await;
    let t = Instant::now();
    let r = stack.stream("chat", 50).await;
    let took = t.elapsed();
    assert_eq!(r.status(), 504, "not a 200 followed by a cut stream");
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_millis(1500),
        "{took:?}"
    );
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "first_token_timeout");
    let truth = &stack.engines[0].engine;
    assert!(
        eventually(Duration::from_secs(2), || truth.snapshot().aborts == 1).await,
        "the engine request is dropped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_mid_stream_ends_with_an_sse_error_event() {
    let cfg = stalling(3);
    let stack = Stack::start(vec![engine(cfg).await], ROUTE).await;
    let r = stack.stream("chat", 50).await;
    assert_eq!(r.status(), 200);
    let (body, _, _) = read_stream(r).await;
    let events = sse_data(&body);
    let last: serde_json::Value = serde_json::from_str(events.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "stream_idle_timeout", "{body}");
    assert_eq!(last["error"]["type"], "timeout_error", "{body}");
    assert!(!body.contains("[DONE]"));
    let tokens = events
        .iter()
        .filter(|e| e.contains("\"content\":\"") && !e.contains("\"content\":\"\""))
        .count();
    assert_eq!(tokens, 3);
    let truth = &stack.engines[0].engine;
    assert!(eventually(Duration::from_secs(2), || truth.snapshot().aborts == 1).await);
    assert!(eventually(Duration::from_secs(1), || stack.records().len() == 1).await);
    assert_eq!(stack.records()[0].outcome, "stream_idle_timeout");
}

/// The relay's one timer is set at stream_idle and moved only when it fires early: a stream many
/// idle periods long whose chunks come well within it must finish whole, and the total budget
/// must still cut one whose chunks keep coming.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_idle_counts_from_the_last_chunk_and_total_cuts_a_flowing_stream() {
    let yaml = ROUTE.replace("stream_idle: 300ms", "stream_idle: 100ms");
    let stack = Stack::start(vec![engine(tiny()).await], &yaml).await;
    let t = Instant::now();
    let (body, _, _) = read_stream(stack.stream("chat", 600).await).await;
    let took = t.elapsed();
    assert!(body.contains("[DONE]"), "{body}");
    assert!(!body.contains("\"error\""), "{body}");
    assert!(
        took >= Duration::from_millis(300),
        "several idle periods long: {took:?}"
    );
    println!("a {took:?} stream under a 100 ms stream_idle finished whole");

    let yaml = yaml.replace("total: 20s", "total: 700ms");
    let stack = Stack::start(vec![engine(tiny()).await], &yaml).await;
    let t = Instant::now();
    let r = stack.stream("chat", 3000).await;
    assert_eq!(r.status(), 200);
    let (body, _, _) = read_stream(r).await;
    let took = t.elapsed();
    let events = sse_data(&body);
    let last: serde_json::Value = serde_json::from_str(events.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "deadline_exceeded", "{body}");
    assert_eq!(last["error"]["type"], "timeout_error", "{body}");
    assert!(
        events.len() > 100,
        "tokens flowed until the cut: {}",
        events.len()
    );
    assert!(
        took >= Duration::from_millis(650) && took < Duration::from_millis(2500),
        "{took:?}"
    );
    assert!(eventually(Duration::from_secs(1), || stack.records().len() == 1).await);
    assert_eq!(stack.records()[0].outcome, "deadline_exceeded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_callers_deadline_shrinks_every_budget() {
    let cfg = stalling(0);
    let stack = Stack::start(vec![engine(cfg).await], ROUTE).await;
    let t = Instant::now();
    let r = http()
        .post(format!("{}/v1/chat/completions", stack.url))
        .header("x-spillway-deadline", "150ms")
        .json(&chat("chat", 50, true))
        .send()
        .await
        .unwrap();
    let took = t.elapsed();
    assert_eq!(r.status(), 504);
    assert!(
        took < Duration::from_millis(450),
        "the caller's 150 ms, not the route's 500 ms: {took:?}"
    );
    let r = http()
        .post(format!("{}/v1/chat/completions", stack.url))
        .header("x-spillway-deadline", "soon")
        .json(&chat("chat", 5, true))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_while_queued_leaves_the_queue() {
    let yaml = ROUTE
        .replace("concurrency: 8", "concurrency: 1")
        .replace("queue_wait: 200ms", "queue_wait: 400ms");
    let stack = Stack::start(vec![engine(tiny()).await], &yaml).await;
    let holder = stack.stream("chat", 3000).await;
    assert_eq!(holder.status(), 200);
    let gate = stack.gateway.admission("chat", "interactive").unwrap();
    let url = format!("{}/v1/chat/completions", stack.url);
    let waiter = tokio::spawn(async move { http().post(url).json(&chat("chat", 5, true)).send().await });
    assert!(eventually(Duration::from_secs(1), || gate.queued() == 1).await);
    waiter.abort();
    assert!(
        eventually(Duration::from_millis(300), || gate.queued() == 0).await,
        "gone from the queue at once"
    );
    drop(holder);
}
