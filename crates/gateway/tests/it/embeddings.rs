//! `/v1/embeddings` through the gateway: routed by `model`, relayed as the replica answers it, and
//! admitted as completions are (class slots, Retry-After, a team's quota), costing its input.

use crate::support::{Stack, TEAMS, chat, engine, header, http, tiny};
use serde_json::{Value, json};
use std::time::Duration;

const ROUTES: &str = r#"
listen: 127.0.0.1:0
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}]
    limits: { max_tokens: { default: 64 }, max_n: 1 }
  - model: tight
    upstream_model: sim
    replicas: [{E0}]
    classes: [ { name: only, concurrency: 1, queue: 0, queue_wait: 0s } ]
  - model: tight429
    upstream_model: sim
    replicas: [{E0}]
    overflow_status: 429
    classes: [ { name: only, concurrency: 1, queue: 0, queue_wait: 0s } ]
"#;

async fn embed(url: &str, body: &Value) -> reqwest::Response {
    http()
        .post(format!("{url}/v1/embeddings"))
        .json(body)
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_are_relayed_as_the_replica_answers_them() {
    let stack = Stack::start(vec![engine(tiny()).await], ROUTES).await;
    // A batch of two under a route whose max_n is 1 and whose max_tokens default is 64: an
    // embedding generates nothing, so neither applies.
    let input = json!(["the first input", "and the second"]);
    let r = embed(&stack.url, &json!({"model": "chat", "input": input})).await;
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/json")
    );
    let via: Value = r.json().await.unwrap();
    assert_eq!(
        via["model"], "chat",
        "the replica's name for the model is not shown: {via}"
    );
    let direct: Value = testkit::post_json(
        format!("{}/v1/embeddings", stack.engines[0].url()),
        &json!({"model": "sim", "input": input}),
    )
    .await;
    assert_eq!(
        via["data"], direct["data"],
        "the vectors as the replica made them"
    );
    assert_eq!(via["usage"], direct["usage"]);
    let prompt = via["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt > 0, "{via}");
    // Token ids, and the accounting: the replica's count of the input, nothing generated.
    let r = embed(&stack.url, &json!({"model": "chat", "input": [[1, 2, 3, 4, 5]]})).await;
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["usage"], json!({"prompt_tokens": 5, "total_tokens": 5}));
    let records = stack.records();
    let last = records.last().unwrap();
    assert_eq!(
        (last.status, last.stream, last.tokens_in, last.tokens_out),
        (200, false, Some(5), Some(0)),
        "{last:?}"
    );
    // Bad input is named, and a model no route serves is 404, as for completions.
    let r = embed(&stack.url, &json!({"model": "chat", "input": []})).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["param"], "input", "{v}");
    let r = embed(&stack.url, &json!({"model": "chat"})).await;
    assert_eq!(r.status(), 400);
    let r = embed(&stack.url, &json!({"model": "nope", "input": "x"})).await;
    assert_eq!(r.status(), 404);
}

/// With the class's only slot held, an embedding waits for nothing it cannot have: refused at
/// once with the route's overload status and `Retry-After`, as a completion would be.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_take_a_class_slot_and_are_refused_when_it_is_busy() {
    let stack = Stack::start(vec![engine(tiny()).await], ROUTES).await;
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
    for (model, status) in [("tight", 503), ("tight429", 429)] {
        let r = http()
            .post(format!("{}/v1/embeddings", stack.url))
            .header("x-spillway-priority", "sheddable")
            .json(&json!({"model": model, "input": "hello"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), status, "{model}");
        let after: u64 = header(&r, "retry-after").parse().unwrap();
        assert!(after >= 1, "{after}");
        let v: Value = r.json().await.unwrap();
        assert!(v["error"]["code"].is_string(), "{v}");
    }
    drop(holders);
    let gate = stack.gateway.admission("tight", "only").unwrap();
    assert!(
        testkit::eventually(Duration::from_secs(10), || gate.in_flight() == 0).await,
        "the held slot is freed when its client leaves"
    );
    let r = embed(&stack.url, &json!({"model": "tight", "input": "hello"})).await;
    assert_eq!(r.status(), 200, "the free slot serves it");
    assert_eq!(gate.in_flight(), 0, "and it gave the slot back");
}

/// An embedding costs its team its input tokens, reserved at admission with no `max_tokens` on
/// top: 600 of the team's 1000 a minute leave 400, and 600 more are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embeddings_input_counts_toward_the_teams_tokens_per_minute() {
    let stack = Stack::start(vec![engine(tiny()).await], TEAMS).await;
    let ids: Vec<u32> = (1..=600).collect();
    let send = || {
        http()
            .post(format!("{}/v1/embeddings", stack.url))
            .bearer_auth("test")
            .json(&json!({"model": "chat", "input": ids}))
            .send()
    };
    let r = send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-ratelimit-remaining-tokens"), "400");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["usage"]["prompt_tokens"], 600);
    let r = send().await.unwrap();
    assert_eq!(r.status(), 429, "600 more would pass the minute's 1000 tokens");
    assert!(header(&r, "retry-after").parse::<u64>().unwrap() >= 1);
    let v: Value = r.json().await.unwrap();
    testkit::assert_error_mentions(&v, "1000 tokens per minute");
}
