//! Operating a running gateway: reload under load, a refused reload, draining a replica, and the
//! admin API's token.

use crate::support::{Stack, chat, engine, eventually, http, read_stream, tiny};
use serde_json::{Value, json};
use spillway_gateway::Config;
use std::time::Duration;

pub(crate) const TOKEN: &str = "test-admin-token";

fn yaml(c: u32) -> String {
    format!(
        r#"
listen: 127.0.0.1:0
admin: {{ listen: 127.0.0.1:0, token_env: SPILLWAY_TEST_ADMIN_TOKEN }}
routes:
  - model: chat
    upstream_model: sim
    replicas: [{{E0}}, {{E1}}]
    classes: [ {{ name: interactive, concurrency: {c}, queue: 8, queue_wait: 5s }} ]
"#
    )
}

async fn stack() -> Stack {
    Stack::start(vec![engine(tiny()).await, engine(tiny()).await], &yaml(1)).await
}

fn config(stack: &Stack, c: u32) -> Config {
    Config::from_yaml(&stack.fill(&yaml(c))).unwrap()
}

/// The admin API's base URL, once its listener is up.
pub(crate) async fn admin_url(stack: &Stack) -> String {
    assert!(
        eventually(Duration::from_secs(2), || stack
            .gateway
            .admin_addr
            .get()
            .is_some())
        .await
    );
    format!("http://{}", stack.gateway.admin_addr.get().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_raises_c_under_load_without_dropping_a_stream() {
    let stack = stack().await;
    let url = format!("{}/v1/chat/completions", stack.url);
    let first = stack.stream("chat", 600).await;
    assert_eq!(first.status(), 200);
    let gate = stack.gateway.admission("chat", "interactive").unwrap();
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                http()
                    .post(url)
                    .json(&chat("chat", 5, true))
                    .send()
                    .await
                    .unwrap()
            })
        })
        .collect();
    assert!(eventually(Duration::from_secs(2), || gate.queued() == 2).await);
    stack.gateway.reload(config(&stack, 3)).unwrap();
    assert_eq!(gate.limits().concurrency, 3, "the same gate, new limits");
    for w in waiting {
        let r = w.await.unwrap();
        assert_eq!(
            r.status(),
            200,
            "admitted by the larger C while the first stream still runs"
        );
        read_stream(r).await;
    }
    let (body, _, clean) = read_stream(first).await;
    assert!(
        clean && body.ends_with("data: [DONE]\n\n"),
        "the stream in flight across the reload finished"
    );
    let m = stack.metrics().await;
    assert!(m.contains("spillway_concurrency_limit{class=\"interactive\",route=\"chat\"} 3"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_reload_is_refused_and_changes_nothing() {
    let stack = stack().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spillway.yaml");
    std::fs::write(&path, "listen: 127.0.0.1:0\nroutes: []\n").unwrap();
    stack.gateway.set_config_path(path.clone());
    let admin = admin_url(&stack).await;
    let r = http()
        .post(format!("{admin}/admin/reload"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    testkit::assert_error_mentions(&v, "at least one route");
    assert_eq!(
        stack
            .gateway
            .admission("chat", "interactive")
            .unwrap()
            .limits()
            .concurrency,
        1,
        "nothing changed"
    );
    let mut other_listen = config(&stack, 2);
    other_listen.listen = "127.0.0.1:1".parse().unwrap();
    assert!(
        stack
            .gateway
            .reload(other_listen)
            .unwrap_err()
            .to_string()
            .contains("without a restart")
    );
    // A good file through the admin API applies.
    let mut good = yaml(4);
    for (i, e) in stack.engines.iter().enumerate() {
        good = good.replace(&format!("{{E{i}}}"), &e.url());
    }
    std::fs::write(&path, good).unwrap();
    let r = http()
        .post(format!("{admin}/admin/reload"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        stack
            .gateway
            .admission("chat", "interactive")
            .unwrap()
            .limits()
            .concurrency,
        4
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_replica_finishes_its_streams_and_gets_no_new_ones() {
    let stack = stack().await;
    stack.gateway.reload(config(&stack, 8)).unwrap();
    let admin = admin_url(&stack).await;
    let long = stack.stream("chat", 500).await;
    let on = |i: usize| stack.engines[i].engine.snapshot().running;
    assert!(eventually(Duration::from_secs(1), || on(0) + on(1) == 1).await);
    let busy = if on(0) == 1 { 0 } else { 1 };
    let r = http()
        .post(format!("{admin}/admin/replicas/drain"))
        .bearer_auth(TOKEN)
        .json(&json!({"route": "chat", "replica": stack.engines[busy].url()}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let before = stack.engines[busy].engine.records().len();
    for _ in 0..6 {
        read_stream(stack.stream("chat", 3).await).await;
    }
    let (body, _, _) = read_stream(long).await;
    assert!(
        body.ends_with("data: [DONE]\n\n"),
        "the drained replica's stream finished"
    );
    let after = stack.engines[busy].engine.records().len();
    assert_eq!(
        after,
        before + 1,
        "only the stream it already had; no new request"
    );
    let state: Value = http()
        .get(format!("{admin}/admin/state"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let drained: Vec<bool> = state["routes"][0]["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["drained"].as_bool().unwrap())
        .collect();
    assert_eq!(drained.iter().filter(|d| **d).count(), 1);
    assert_eq!(state["routes"][0]["classes"][0]["concurrency"], 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_needs_its_token() {
    let stack = stack().await;
    let admin = admin_url(&stack).await;
    for token in [None, Some("wrong")] {
        let mut req = http().get(format!("{admin}/admin/state"));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        assert_eq!(req.send().await.unwrap().status(), 401);
    }
    let r = http()
        .get(format!("{}/admin/state", stack.url))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404, "the admin API is not on the public listener");
}
