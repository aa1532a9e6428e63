//! The agents' APIs through the request path: OpenAI's Responses and Anthropic's Messages streamed
//! and whole (usage, TTFT, the public model name), refusals and cuts in each API's own shape,
//! `count_tokens` without a slot, stored responses asked of the replica that made them, and an
//! agent's session kept on one replica.

use crate::support::{Stack, engine, eventually, header, http, read_stream, sse_data, stalling, tiny};
use serde_json::{Value, json};
use std::time::Duration;

const ROUTE: &str = r#"
listen: 127.0.0.1:0
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}]
    timeouts: { connect: 200ms, first_token: 2s, stream_idle: 1s, total: 20s }
"#;

/// One slot and no queue: a second request while one runs is refused at once.
const ONE_SLOT: &str = r#"
listen: 127.0.0.1:0
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}]
    timeouts: { connect: 200ms, first_token: 5s, stream_idle: 5s, total: 20s }
    classes:
      - { name: default, concurrency: 1, queue: 0, queue_wait: 1s }
"#;

const TWO: &str = r#"
listen: 127.0.0.1:0
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}, {E1}]
    timeouts: { connect: 200ms, first_token: 2s, stream_idle: 2s, total: 20s }
"#;

fn responses(max: u32, stream: bool) -> Value {
    json!({"model": "chat", "input": "tell me about gateways", "max_output_tokens": max, "stream": stream})
}

fn messages(max: u32, stream: bool) -> Value {
    json!({
        "model": "chat",
        "max_tokens": max,
        "stream": stream,
        "system": "be brief",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "tell me about gateways"}]}],
    })
}

async fn post(stack: &Stack, path: &str, body: &Value) -> reqwest::Response {
    http()
        .post(format!("{}{path}", stack.url))
        .header("anthropic-version", "2023-06-01")
        .json(body)
        .send()
        .await
        .expect("the gateway answers")
}

/// The JSON of each event of a stream, with its `event:` name.
fn events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let name = e
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .unwrap_or("")
                .to_owned();
            let data = sse_data(&format!("{e}\n\n")).concat();
            (name, serde_json::from_str(&data).unwrap_or(Value::Null))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_apis_stream_and_answer_whole_with_their_usage_and_the_public_name() {
    let stack = Stack::start(vec![engine(tiny()).await], ROUTE).await;
    let (body, _, clean) = read_stream(post(&stack, "/v1/responses", &responses(6, true)).await).await;
    assert!(clean, "{body}");
    let evs = events(&body);
    let deltas = evs
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .count();
    assert_eq!(deltas, 6, "{body}");
    let (last, done) = evs.last().unwrap();
    assert_eq!(last, "response.completed", "{body}");
    assert_eq!(done["response"]["usage"]["output_tokens"], 6);
    assert!(
        evs.iter()
            .all(|(_, v)| v["response"]["model"].is_null() || v["response"]["model"] == "chat"),
        "{body}"
    );
    assert!(
        !body.contains("\"sim\""),
        "the replica's own name never reaches the client: {body}"
    );

    let (body, _, clean) = read_stream(post(&stack, "/v1/messages", &messages(5, true)).await).await;
    assert!(clean, "{body}");
    let evs = events(&body);
    assert_eq!(evs[0].1["message"]["model"], "chat", "{body}");
    assert_eq!(
        evs.iter().filter(|(n, _)| n == "content_block_delta").count(),
        5,
        "{body}"
    );
    assert_eq!(evs.last().unwrap().0, "message_stop");

    let whole: Value = post(&stack, "/v1/responses", &responses(4, false))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (&whole["model"], &whole["usage"]["output_tokens"]),
        (&json!("chat"), &json!(4)),
        "{whole}"
    );
    let whole: Value = post(&stack, "/v1/messages", &messages(3, false))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (&whole["model"], &whole["usage"]["output_tokens"]),
        (&json!("chat"), &json!(3)),
        "{whole}"
    );

    assert!(eventually(Duration::from_secs(2), || stack.records().len() == 4).await);
    let records = stack.records();
    let apis: Vec<_> = records.iter().map(|r| r.api.unwrap()).collect();
    assert_eq!(apis, ["responses", "messages", "responses", "messages"]);
    for (r, out) in records.iter().zip([6, 5, 4, 3]) {
        assert_eq!(
            (r.status, r.outcome, r.tokens_out),
            (200, "ok", Some(out)),
            "{r:?}"
        );
        assert!(r.tokens_in.is_some_and(|t| t > 0), "{r:?}");
    }
    assert!(
        records[0].ttft_ms.is_some() && records[1].ttft_ms.is_some(),
        "TTFT from the delta events"
    );
    assert_eq!(
        records[0].max_tokens,
        Some(6),
        "max_output_tokens is the answer's cap"
    );
    let metrics = stack.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("spillway_completion_tokens_total") && l.ends_with(" 18")),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_and_cuts_come_in_each_apis_own_shape() {
    let stack = Stack::start(vec![engine(stalling(2)).await], ONE_SLOT).await;
    // One request holds the only slot (its replica stalls after two tokens).
    let held = post(&stack, "/v1/messages", &messages(50, true)).await;
    assert_eq!(held.status(), 200);
    let refused = post(&stack, "/v1/messages", &messages(5, true)).await;
    assert_eq!(refused.status(), 503);
    let after = header(&refused, "retry-after");
    assert!(after.parse::<u64>().unwrap() >= 1, "{after}");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(
        (&body["type"], &body["error"]["type"]),
        (&json!("error"), &json!("overloaded_error")),
        "{body}"
    );
    assert!(
        body["error"]["message"].as_str().unwrap().contains("chat"),
        "{body}"
    );
    let refused = post(&stack, "/v1/responses", &responses(5, false)).await;
    assert_eq!(refused.status(), 503);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(
        body["error"]["type"], "service_unavailable_error",
        "OpenAI's shape: {body}"
    );
    // A token count takes no slot: answered while the slot is held.
    let counted = post(&stack, "/v1/messages/count_tokens", &messages(5, false)).await;
    assert_eq!(counted.status(), 200);
    let counted: Value = counted.json().await.unwrap();
    assert!(counted["input_tokens"].as_u64().unwrap() > 0, "{counted}");
    // Bad requests and unknown models, in Anthropic's shape.
    let bad = post(
        &stack,
        "/v1/messages",
        &json!({"model": "chat", "messages": "nope"}),
    )
    .await;
    assert_eq!(bad.status(), 400);
    let body: Value = bad.json().await.unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    let unknown = post(
        &stack,
        "/v1/messages",
        &json!({"model": "x", "max_tokens": 1, "messages": []}),
    )
    .await;
    assert_eq!(unknown.status(), 404);
    let body: Value = unknown.json().await.unwrap();
    assert_eq!(body["error"]["type"], "not_found_error", "{body}");
    let background = post(
        &stack,
        "/v1/responses",
        &json!({"model": "chat", "input": "x", "background": true}),
    )
    .await;
    assert_eq!(background.status(), 400);
    let body: Value = background.json().await.unwrap();
    assert_eq!(body["error"]["param"], "background", "{body}");
    // The held stream is cut after stream_idle in its own API's event.
    let (body, _, _) = read_stream(held).await;
    let evs = events(&body);
    let (name, cut) = evs.last().unwrap();
    assert_eq!(
        (name.as_str(), &cut["type"]),
        ("error", &json!("error")),
        "{body}"
    );
    assert_eq!(cut["error"]["type"], "api_error", "{body}");
    assert!(eventually(Duration::from_secs(2), || stack.records().len() == 7).await);
    let counted = stack
        .records()
        .into_iter()
        .find(|r| r.api == Some("count_tokens"))
        .unwrap();
    assert_eq!(
        (counted.status, &*counted.class),
        (200, "_none"),
        "no class, no slot: {counted:?}"
    );
}

/// The tiny engine with vLLM's response store on (`VLLM_ENABLE_RESPONSES_API_STORE=1`).
fn storing() -> engine::EngineConfig {
    let mut c = tiny();
    c.responses_store = Some(engine::StoreLimit { max_bytes: 1 << 20 });
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_response_is_asked_of_the_replica_that_made_it() {
    // Each replica keeps its own responses: a turn sent to the other one would be a 404.
    let stack = Stack::start(vec![engine(storing()).await, engine(storing()).await], TWO).await;
    // An id the gateway never saw: vLLM's not-found, and no replica is asked.
    let r = post(
        &stack,
        "/v1/responses",
        &json!({"model": "chat", "input": "x", "previous_response_id": "resp_nope"}),
    )
    .await;
    assert_eq!(r.status(), 404);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "response_not_found", "{body}");
    let r = http()
        .get(format!("{}/v1/responses/resp_nope", stack.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    // Responses made, streamed and whole, each learned with its replica.
    let (mut made, mut makers) = (Vec::new(), Vec::new());
    for i in 0..6 {
        let stream = i % 2 == 0;
        let r = post(&stack, "/v1/responses", &responses(2, stream)).await;
        let id = if stream {
            let (body, _, _) = read_stream(r).await;
            events(&body)[0].1["response"]["id"].as_str().unwrap().to_owned()
        } else {
            r.json::<Value>().await.unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned()
        };
        made.push(id);
        // Logged when its answer has gone out: waited for, so that each line is its own.
        assert!(eventually(Duration::from_secs(2), || stack.records().len() == 3 + i).await);
        makers.push(stack.records()[2 + i].replica.clone().unwrap());
    }
    // Every turn that continues one, and every read of it, goes where it was made.
    for (k, (id, maker)) in made.iter().zip(&makers).enumerate() {
        for _ in 0..3 {
            let body = json!({"model": "chat", "input": "and then?", "max_output_tokens": 2, "previous_response_id": id});
            let _ = post(&stack, "/v1/responses", &body).await.bytes().await;
        }
        let _ = http()
            .get(format!("{}/v1/responses/{id}", stack.url))
            .send()
            .await
            .unwrap()
            .bytes()
            .await;
        let n = 8 + 4 * (k + 1);
        assert!(eventually(Duration::from_secs(2), || stack.records().len() == n).await);
        let records = stack.records();
        for r in &records[records.len() - 4..] {
            assert_eq!(r.replica.as_ref(), Some(maker), "{r:?}");
        }
    }
    assert!(
        makers.iter().any(|m| m != &makers[0]),
        "balanced by load, the responses were made on both"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_session_stays_on_one_replica() {
    let stack = Stack::start(vec![engine(tiny()).await, engine(tiny()).await], TWO).await;
    for session in ["a", "b", "c", "d", "e", "f"] {
        for _ in 0..4 {
            let r = http()
                .post(format!("{}/v1/messages", stack.url))
                .header("x-claude-code-session-id", session)
                .json(&messages(2, false))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
        }
    }
    assert!(eventually(Duration::from_secs(2), || stack.records().len() == 24).await);
    let records = stack.records();
    let replicas: Vec<_> = records.iter().map(|r| r.replica.clone().unwrap()).collect();
    for turns in replicas.chunks(4) {
        assert!(
            turns.iter().all(|r| r == &turns[0]),
            "one session, one replica: {turns:?}"
        );
    }
    assert!(
        replicas.iter().any(|r| r != &replicas[0]),
        "sessions spread over both replicas"
    );
}

const HOLD: &str = r#"
listen: 127.0.0.1:0
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}]
    agents: { background: hold }
    timeouts: { connect: 200ms, first_token: 5s, stream_idle: 5s, total: 30s }
    classes:
      - { name: default, concurrency: 1, queue: 0, queue_wait: 1s }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_response_holds_its_slot_until_the_replica_finishes_it() {
    // 10 ms a step: 100 tokens take about a second, generated with nobody connected.
    let mut slow = storing();
    slow.cost.overhead = Duration::from_millis(10);
    let stack = Stack::start(vec![engine(slow).await], HOLD).await;
    let asked = json!({"model": "chat", "input": "go on", "max_output_tokens": 100, "background": true});
    let r = post(&stack, "/v1/responses", &asked).await;
    assert_eq!(r.status(), 200);
    let queued: Value = r.json().await.unwrap();
    assert_eq!(queued["status"], "queued", "{queued}");
    let id = queued["id"].as_str().unwrap().to_owned();
    let busy = post(&stack, "/v1/messages", &messages(2, false)).await;
    assert_eq!(busy.status(), 503, "the background response holds the only slot");
    let done = testkit::poll(
        Duration::from_secs(20),
        || async {
            let r = http()
                .get(format!("{}/v1/responses/{id}", stack.url))
                .send()
                .await
                .unwrap();
            r.json::<Value>().await.unwrap()
        },
        |v: &Value| v["status"] == "incomplete" || v["status"] == "completed",
    )
    .await;
    assert_eq!(done["usage"]["output_tokens"], 100, "{done}");
    // Given back once the replica says it finished (asked every 250 ms).
    let mut served = false;
    for _ in 0..40 {
        if post(&stack, "/v1/messages", &messages(2, false)).await.status() == 200 {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(served, "the slot came back");
    let held = stack
        .records()
        .into_iter()
        .find(|r| r.tokens_out == Some(100))
        .expect("its line");
    assert_eq!((held.status, held.outcome), (200, "ok"), "{held:?}");
    assert!(held.duration_ms >= 900.0, "held while it generated: {held:?}");
    // Refused where the slot cannot be followed: with a stream.
    let mut streamed = asked.clone();
    streamed["stream"] = json!(true);
    assert_eq!(post(&stack, "/v1/responses", &streamed).await.status(), 400);
}

/// A team over its quota on `/v1/messages` gets 429 `rate_limit_error` in Anthropic's shape with
/// `Retry-After` (the anthropic SDK retries it after that); its usage counts against `tpm`. The
/// key is read as the SDK sends it, `x-api-key`, or as a bearer token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_over_its_quota_is_told_in_anthropics_shape() {
    let stack = Stack::start(vec![engine(tiny()).await], crate::support::TEAMS).await;
    let keyed = |header: &'static str, value: &'static str| {
        http()
            .post(format!("{}/v1/messages", stack.url))
            .header(header, value)
            .json(&messages(4, false))
            .send()
    };
    for _ in 0..3 {
        assert_eq!(keyed("authorization", "Bearer test").await.unwrap().status(), 200);
    }
    let r = keyed("x-api-key", "test").await.unwrap();
    assert_eq!(r.status(), 429, "the same team, by the SDK's header");
    assert!(header(&r, "retry-after").parse::<u64>().unwrap() >= 1);
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        (&body["type"], &body["error"]["type"]),
        (&json!("error"), &json!("rate_limit_error")),
        "{body}"
    );
    let unkeyed = post(&stack, "/v1/messages", &messages(4, false)).await;
    assert_eq!(unkeyed.status(), 401);
    let body: Value = unkeyed.json().await.unwrap();
    assert_eq!(body["error"]["type"], "authentication_error", "{body}");
}
