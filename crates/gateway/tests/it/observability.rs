//! What operators see: promtool-clean metrics with bounded labels, request IDs end to end,
//! goodput and the access log.

use crate::support::{Stack, chat, engine, eventually, http, read_stream, tiny};
use std::time::Duration;

const ROUTE: &str = r#"
listen: 127.0.0.1:0
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}]
    classes:
      - name: interactive
        concurrency: 8
        queue: 8
        queue_wait: 1s
        slo: { ttft: 2s, itl: 500ms }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_pass_promtool_and_never_take_labels_from_clients() {
    let stack = Stack::start(vec![engine(tiny()).await], ROUTE).await;
    for _ in 0..3 {
        let r = stack.stream("chat", 5).await;
        assert!(read_stream(r).await.2);
    }
    let r = stack.stream("zzz-made-up-model", 5).await;
    assert_eq!(r.status(), 404);
    let r = http()
        .post(format!("{}/v1/chat/completions", stack.url))
        .header("x-request-id", "rid-7")
        .header("x-spillway-priority", "critical")
        .json(&chat("chat", 5, false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = stack.metrics().await;
    assert!(
        !text.contains("zzz-made-up-model") && !text.contains("rid-7"),
        "client input never becomes a label"
    );
    assert!(text.contains("route=\"_unknown\""));
    assert!(
        text.contains("spillway_goodput_requests_total{class=\"interactive\",route=\"chat\"} 4"),
        "{text}"
    );
    assert!(text.contains("spillway_slo_requests_total{class=\"interactive\",route=\"chat\"} 4"));
    assert!(text.contains("spillway_concurrency_limit{class=\"interactive\",route=\"chat\"} 8"));
    assert!(text.contains("spillway_queue_limit{class=\"interactive\",route=\"chat\"} 8"));
    assert!(text.contains(
        "spillway_completion_tokens_total{class=\"interactive\",route=\"chat\",team=\"anonymous\"} 20"
    ));

    let report = testkit::promtool_check(&text).await;
    assert!(report.trim().is_empty(), "promtool: {report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_round_trip_and_reach_the_access_log() {
    let stack = Stack::start(vec![engine(tiny()).await], ROUTE).await;
    let send = |id: String| {
        let url = format!("{}/v1/chat/completions", stack.url);
        async move {
            http()
                .post(url)
                .header("x-request-id", id)
                .json(&chat("chat", 3, true))
                .send()
                .await
                .unwrap()
        }
    };
    let r = send("req-abc.123".into()).await;
    assert_eq!(r.headers()["x-request-id"], "req-abc.123");
    read_stream(r).await;
    for hostile in ["a".repeat(300), "no spaces/or slashes".into()] {
        let r = send(hostile.clone()).await;
        let given = r.headers()["x-request-id"].to_str().unwrap().to_owned();
        assert_ne!(given, hostile);
        assert_eq!(given.len(), 32, "a fresh ID instead");
        read_stream(r).await;
    }
    assert!(eventually(Duration::from_secs(1), || stack.records().len() == 3).await);
    let rec = stack
        .records()
        .into_iter()
        .find(|r| r.id == "req-abc.123")
        .expect("logged under its ID");
    assert_eq!(
        (rec.route.as_str(), rec.class.as_str(), rec.team.as_str()),
        ("chat", "interactive", "anonymous")
    );
    assert_eq!(rec.status, 200);
    assert!(rec.replica.as_deref().unwrap().starts_with("http://127.0.0.1:"));
    assert!(rec.ttft_ms.unwrap() > 0.0 && rec.queue_ms.is_some());
    assert_eq!(rec.tokens_out, Some(3));
    let line = serde_json::to_string(&rec).unwrap();
    assert!(!line.contains("hello there"), "no prompt text in the access log");
}
