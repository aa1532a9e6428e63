//! Replicas that write their SSE in other styles than vLLM's compact JSON — `json.dumps`' spaces,
//! pretty JSON over several `data:` lines, CR LF line ends — streamed as vLLM's are: the held head
//! and TTFT, the public model name, usage, the first-token and idle cuts, cancellation and the
//! drain, each against every style (`spillway engine --sse-style`).

use crate::support::{Stack, chat, engine, eventually, http, read_stream, stalling, tiny};
use engine::{EngineConfig, SseStyle};
use protocol::judge::{Kind, reference};
use protocol::sse::EventSplitter;
use serde_json::json;
use std::time::Duration;

const ROUTE: &str = r#"
listen: 127.0.0.1:0
server: { drain_delay: 100ms, drain_timeout: 10s }
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}]
    timeouts: { connect: 200ms, first_token: 1s, stream_idle: 400ms, total: 20s }
    classes:
      - name: interactive
        concurrency: 8
        queue: 8
        queue_wait: 200ms
"#;

fn styled(mut c: EngineConfig, style: SseStyle) -> EngineConfig {
    c.sse_style = style;
    c
}

/// The client's events, each as a parse reads it.
fn events_of(body: &str) -> Vec<reference::Summary> {
    let mut s = EventSplitter::default();
    let mut out = Vec::new();
    s.feed(body.as_bytes(), |e| out.push(reference::judge(&e)));
    out.extend(
        Some(s.rest())
            .filter(|r| !r.is_empty())
            .map(|r| reference::judge(&r)),
    );
    out.into_iter()
        .filter(|e| e.kind != Kind::Other || e.model.is_some())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_style_streams_with_ttft_the_public_name_and_usage() {
    for style in SseStyle::ALL {
        let stack = Stack::start(vec![engine(styled(tiny(), style)).await], ROUTE).await;
        let name = style.name();
        let r = stack.stream("chat", 7).await;
        assert_eq!(r.status(), 200, "{name}: a healthy stream is not held to a 504");
        let (body, first, clean) = read_stream(r).await;
        assert!(clean && first.is_some(), "{name}: {body}");
        let seen = events_of(&body);
        let tokens = seen.iter().filter(|e| e.kind == Kind::Tokens).count();
        assert_eq!(tokens, 7, "{name}: {body}");
        assert_eq!(seen.last().map(|e| e.kind), Some(Kind::Done), "{name}: {body}");
        assert!(
            seen.iter().all(|e| e.usage.is_none()),
            "{name}: usage stripped: {body}"
        );
        let models: Vec<_> = seen.iter().filter_map(|e| e.model.as_deref()).collect();
        assert!(
            !models.is_empty() && models.iter().all(|m| *m == "chat"),
            "{name}: {body}"
        );
        // Asked for: the usage chunk comes through, read by the gateway for its tokens.
        let mut with_usage = chat("chat", 7, true);
        with_usage["stream_options"] = json!({"include_usage": true});
        let url = format!("{}/v1/chat/completions", stack.url);
        let (body, _, _) = read_stream(http().post(&url).json(&with_usage).send().await.unwrap()).await;
        let usage = events_of(&body).iter().find_map(|e| e.usage);
        assert_eq!(usage.and_then(|u| u.completion_tokens), Some(7), "{name}: {body}");
        assert!(eventually(Duration::from_secs(2), || stack.records().len() == 2).await);
        for rec in stack.records() {
            assert_eq!(
                (rec.status, rec.outcome, rec.tokens_out),
                (200, "ok", Some(7)),
                "{name}"
            );
            assert!(rec.ttft_ms.is_some(), "{name}: TTFT measured");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_style_is_cut_at_first_token_and_at_stream_idle() {
    for style in SseStyle::ALL {
        let name = style.name();
        // No first token: the held head lets the gateway answer a clean 504.
        let stack = Stack::start(vec![engine(styled(stalling(0), style)).await], ROUTE).await;
        let r = stack.stream("chat", 50).await;
        assert_eq!(r.status(), 504, "{name}");
        assert!(
            eventually(Duration::from_secs(5), || stack.engines[0]
                .engine
                .snapshot()
                .aborts
                == 1)
            .await
        );
        // Three tokens, then nothing: cut at stream_idle with an error event.
        let stack = Stack::start(vec![engine(styled(stalling(3), style)).await], ROUTE).await;
        let r = stack.stream("chat", 50).await;
        assert_eq!(r.status(), 200, "{name}");
        let (body, _, _) = read_stream(r).await;
        let seen = events_of(&body);
        assert_eq!(
            seen.iter().filter(|e| e.kind == Kind::Tokens).count(),
            3,
            "{name}: {body}"
        );
        assert_eq!(seen.last().map(|e| e.kind), Some(Kind::Error), "{name}: {body}");
        assert!(body.contains("stream_idle_timeout"), "{name}: {body}");
        assert!(
            eventually(Duration::from_secs(5), || stack.engines[0]
                .engine
                .snapshot()
                .aborts
                == 1)
            .await
        );
        assert!(eventually(Duration::from_secs(2), || stack.records().len() == 1).await);
        assert_eq!(
            stack.records()[0].tokens_out,
            Some(3),
            "{name}: the tokens relayed before the cut"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_style_cancels_and_drains() {
    for style in SseStyle::ALL {
        let name = style.name();
        let mut stack = Stack::start(vec![engine(styled(tiny(), style)).await], ROUTE).await;
        let mut r = stack.stream("chat", 3000).await;
        assert_eq!(r.status(), 200, "{name}");
        for _ in 0..3 {
            r.chunk().await.unwrap();
        }
        drop(r);
        let truth = &stack.engines[0].engine;
        assert!(
            eventually(Duration::from_secs(5), || truth.snapshot().aborts == 1).await,
            "{name}: the engine aborts"
        );
        let gate = stack.gateway.admission("chat", "interactive").unwrap();
        assert!(
            eventually(Duration::from_secs(2), || gate.in_flight() == 0).await,
            "{name}"
        );
        assert!(eventually(Duration::from_secs(2), || stack.records().len() == 1).await);
        assert_eq!(stack.records()[0].outcome, "client_disconnect", "{name}");
        // A stream in flight when the drain begins finishes whole.
        let r = stack.stream("chat", 40).await;
        assert_eq!(r.status(), 200, "{name}");
        stack.shutdown();
        let (body, _, clean) = read_stream(r).await;
        let seen = events_of(&body);
        assert!(clean, "{name}");
        assert_eq!(
            seen.iter().filter(|e| e.kind == Kind::Tokens).count(),
            40,
            "{name}: {body}"
        );
        assert_eq!(seen.last().map(|e| e.kind), Some(Kind::Done), "{name}: {body}");
    }
}

/// `[DONE]` in the same read as the first token, then a body that never ends: the client's stream
/// ends cleanly a moment after `[DONE]` (not at `stream_idle`, with an error event), and the log
/// says what happened. The clean end used to arm only when `[DONE]` came in a later read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn done_in_the_first_read_ends_the_stream_though_the_body_never_ends() {
    for style in SseStyle::ALL {
        let name = style.name();
        let events = style.restyle(
            b"data: {\"model\":\"sim\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t0 \"}}]}\n\ndata: [DONE]\n\n",
        );
        let mut answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n",
            events.len()
        )
        .into_bytes();
        answer.extend_from_slice(&events);
        answer.extend_from_slice(b"\r\n");
        let gateway = scripted(
            answer,
            false,
            &ROUTE.replace("stream_idle: 400ms", "stream_idle: 10s"),
        )
        .await;
        let started = tokio::time::Instant::now();
        let r = ask(&gateway, true).await;
        let status = r.status();
        let (body, _, _) = read_stream(r).await;
        assert_eq!(status, 200, "{name}: {body}");
        let took = started.elapsed();
        let seen = events_of(&body);
        assert_eq!(
            seen.iter().map(|e| e.kind).collect::<Vec<_>>(),
            [Kind::Tokens, Kind::Done],
            "{name}: {body}"
        );
        assert!(!body.contains("stream_idle_timeout"), "{name}: {body}");
        assert!(
            took < Duration::from_secs(5),
            "{name}: ended after {took:?}, not at stream_idle"
        );
        assert!(eventually(Duration::from_secs(2), || gateway.records().len() == 1).await);
        let rec = &gateway.records()[0];
        assert_eq!(
            (rec.outcome, rec.note),
            ("ok", Some("upstream_body_not_ended")),
            "{name}"
        );
    }
}

/// A CR LF replica whose body ends right after `[DONE]`'s blank line's CR (the LF never comes):
/// by the specification the event is whole, so the stream ended cleanly, not "early".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn done_whose_last_line_feed_never_comes_still_ends_the_stream() {
    let answer = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n\
        data: {\"model\":\"sim\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t0 \"}}]}\r\n\r\n\
        data: [DONE]\r\n\r";
    let gateway = scripted(answer, true, ROUTE).await;
    let r = ask(&gateway, true).await;
    assert_eq!(r.status(), 200);
    let (body, _, _) = read_stream(r).await;
    assert!(
        !body.contains("upstream_stream_error") && !body.contains("early"),
        "{body}"
    );
    assert!(eventually(Duration::from_secs(2), || gateway.records().len() == 1).await);
    assert_eq!(gateway.records()[0].outcome, "ok", "{body}");
}

/// A busy replica that advises a wait of days: the proxy passes on at most a minute, as the
/// endpoint picker does (one policy for both doors).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_replicas_retry_after_is_passed_on_within_a_minute() {
    let answer = "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 100000\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}";
    let gateway = scripted(answer, true, ROUTE).await;
    let r = ask(&gateway, false).await;
    assert_eq!(r.status(), 503);
    let advised: u64 = r.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&advised), "Retry-After: {advised}");
}

/// A gateway before one replica that answers `answer` (closing after it when `close`), its health
/// checks off so that the scripted answer goes to the request.
async fn scripted(answer: impl Into<Vec<u8>>, close: bool, route: &str) -> testkit::Gateway {
    let (replica, _seen) = testkit::serve_script(vec![answer.into()], close).await;
    let yaml = route.replace(
        "    replicas: [{E0}]",
        "    replicas: [{E0}]\n    health: { enabled: false }",
    );
    testkit::Gateway::start(&yaml, &[replica]).await
}

/// One chat request for 5 tokens through `gateway`.
async fn ask(gateway: &testkit::Gateway, stream: bool) -> reqwest::Response {
    http()
        .post(format!("{}/v1/chat/completions", gateway.url))
        .json(&chat("chat", 5, stream))
        .send()
        .await
        .unwrap()
}
