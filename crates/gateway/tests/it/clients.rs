//! The official `openai` Python client through the gateway: streams, whole answers, and the
//! 429/503/504 errors it must be able to parse.

use crate::support::{Stack, chat, engine, http, stalling, tiny};

const ROUTES: &str = r#"
listen: 127.0.0.1:0
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}]
  - model: tight
    upstream_model: sim
    replicas: [{E0}]
    classes: [ { name: only, concurrency: 1, queue: 0, queue_wait: 0s } ]
  - model: tight429
    upstream_model: sim
    replicas: [{E0}]
    overflow_status: 429
    classes: [ { name: only, concurrency: 1, queue: 0, queue_wait: 0s } ]
  - model: hung
    upstream_model: sim
    replicas: [{E1}]
    timeouts: { connect: 100ms, first_token: 300ms, stream_idle: 1s, total: 10s }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_client_gets_answers_and_parseable_errors() {
    let hung = stalling(0);
    let stack = Stack::start(vec![engine(tiny()).await, engine(hung).await], ROUTES).await;
    // Hold the only slot of `tight` and `tight429` while the client runs.
    let mut holders = Vec::new();
    for model in ["tight", "tight429"] {
        let r = http()
            .post(format!("{}/v1/chat/completions", stack.url))
            .json(&chat(model, 4000, true))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        holders.push(r);
    }
    let report = testkit::run_python("openai_gateway.py", &[&format!("{}/v1", stack.url)]).await;
    assert!(report.contains("ok: 6 checks"), "{report}");
    drop(holders);
}

const AGENTS: &str = r#"
listen: 127.0.0.1:0
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}]
  - model: tight
    upstream_model: sim
    replicas: [{E1}]
    timeouts: { connect: 200ms, first_token: 5s, stream_idle: 10s, total: 30s }
    classes: [ { name: only, concurrency: 1, queue: 0, queue_wait: 0s } ]
"#;

/// The official `openai` client's Responses and the official `anthropic` SDK's Messages through
/// the gateway: answers, streams, a token count, errors each SDK types, and an overload each
/// recognises and retries after `Retry-After` (tests/python/agents_gateway.py).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_agent_sdks_get_answers_and_retry_an_overload() {
    // `tight`'s replica takes 20 ms a step: the holder's long stream keeps the slot while it is
    // open, and the SDKs' four-token retries are served once it has gone.
    let mut slow = tiny();
    slow.cost.overhead = std::time::Duration::from_millis(20);
    let stack = Stack::start(vec![engine(tiny()).await, engine(slow).await], AGENTS).await;
    let report = testkit::run_python("agents_gateway.py", &[&stack.url, "chat", &stack.url]).await;
    assert!(report.contains("ok: 8 checks"), "{report}");
}
