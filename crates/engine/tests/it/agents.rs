//! The agents' APIs against vLLM 0.32's own answers (`tests/fixtures/vllm-0.32/`, captured from
//! the CPU build with the tiny model): the same events in the same order, the same fields at every
//! level of every body, the same errors. Values differ (ids, text), shapes do not.

use crate::support::{MODEL, http, start, tiny};
use serde_json::{Value, json};
use std::collections::BTreeMap;

pub(crate) fn fixture(name: &str) -> String {
    let path = format!("{}/tests/fixtures/vllm-0.32/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

pub(crate) use testkit::json_shape as shape;

/// A stream's events: (name, data) in order.
pub(crate) fn events(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let name = e
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .unwrap_or_default();
            let data = e
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .unwrap_or_default();
            let data = serde_json::from_str(data).unwrap_or_else(|err| panic!("{err}: {data}"));
            (name.to_owned(), data)
        })
        .collect()
}

/// The event names with runs of one name written once, and each name's first data's shape.
pub(crate) fn stream_shape(text: &str) -> (Vec<String>, BTreeMap<String, Vec<String>>) {
    let all = events(text);
    let mut names: Vec<String> = all.iter().map(|(n, _)| n.clone()).collect();
    names.dedup();
    let mut shapes = BTreeMap::new();
    for (n, d) in &all {
        shapes.entry(n.clone()).or_insert_with(|| shape(d));
    }
    (names, shapes)
}

pub(crate) async fn post(url: String, body: Value) -> (u16, String) {
    let r = http().post(url).json(&body).send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// `body` streamed: its events as vLLM's in `fixture`, in the same order, of the same shape.
async fn streamed_like(url: String, mut body: Value, fixture_name: &str) -> String {
    body["stream"] = json!(true);
    let (status, text) = post(url, body).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        stream_shape(&text),
        stream_shape(&fixture(fixture_name)),
        "{text}"
    );
    text
}

#[tokio::test]
async fn messages_answer_as_vllm_does() {
    let e = start(tiny()).await;
    let url = format!("{}/v1/messages", e.url());
    let body = json!({"model": MODEL, "max_tokens": 5, "ignore_eos": true,
        "messages": [{"role": "user", "content": "hello there"}]});
    let (status, whole) = post(url.clone(), body.clone()).await;
    assert_eq!(status, 200, "{whole}");
    let whole: Value = serde_json::from_str(&whole).unwrap();
    let real: Value = serde_json::from_str(&fixture("messages.json")).unwrap();
    assert_eq!(shape(&whole), shape(&real), "{whole}");
    assert_eq!(
        (&whole["stop_reason"], &whole["usage"]["output_tokens"]),
        (&json!("max_tokens"), &json!(5))
    );
    let text = streamed_like(url, body, "messages-stream.sse").await;
    let deltas = events(&text)
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .count();
    assert_eq!(deltas, 5, "one delta a token: {text}");
    let count = post(
        format!("{}/v1/messages/count_tokens", e.url()),
        json!({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hello there"}]}),
    )
    .await;
    let count: Value = serde_json::from_str(&count.1).unwrap();
    assert_eq!(
        shape(&count),
        shape(&serde_json::from_str(&fixture("messages-count-tokens.json")).unwrap())
    );
    assert_eq!(count["input_tokens"], whole["usage"]["input_tokens"]);
}

#[tokio::test]
async fn responses_answer_as_vllm_does() {
    let e = start(tiny()).await;
    let url = format!("{}/v1/responses", e.url());
    let body = json!({"model": MODEL, "max_output_tokens": 4, "ignore_eos": true, "input": "hello there"});
    let (status, whole) = post(url.clone(), body.clone()).await;
    assert_eq!(status, 200, "{whole}");
    let whole: Value = serde_json::from_str(&whole).unwrap();
    let real: Value = serde_json::from_str(&fixture("responses.json")).unwrap();
    assert_eq!(shape(&whole), shape(&real), "{whole}");
    assert_eq!(
        (
            &whole["status"],
            &whole["incomplete_details"]["reason"],
            &whole["usage"]["output_tokens"]
        ),
        (&json!("incomplete"), &json!("max_output_tokens"), &json!(4))
    );
    let text = streamed_like(url, body, "responses-stream.sse").await;
    let numbers: Vec<u64> = events(&text)
        .iter()
        .map(|(_, d)| d["sequence_number"].as_u64().unwrap())
        .collect();
    assert_eq!(numbers, (0..numbers.len() as u64).collect::<Vec<_>>());
}

#[tokio::test]
async fn refusals_answer_as_vllm_does() {
    let e = start(tiny()).await;
    let (status, body) = post(
        format!("{}/v1/messages", e.url()),
        json!({"model": "nope", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(status, 404);
    let real: Value = serde_json::from_str(&fixture("messages-unknown-model.json")).unwrap();
    let ours: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(shape(&ours), shape(&real), "{body}");
    assert_eq!(ours["error"]["type"], real["error"]["type"]);
    let (status, body) = post(
        format!("{}/v1/responses", e.url()),
        json!({"model": MODEL, "input": "hi", "previous_response_id": "resp_0"}),
    )
    .await;
    assert_eq!(status, 404);
    let real: Value = serde_json::from_str(&fixture("responses-previous-unknown.json")).unwrap();
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap(), real);
    let (status, body) = post(
        format!("{}/v1/messages", e.url()),
        json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(status, 400, "max_tokens is required: {body}");
}
