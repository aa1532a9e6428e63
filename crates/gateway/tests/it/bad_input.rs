//! Bad input gets the right status and an OpenAI-shaped body naming the field or the limit, and
//! never reaches a replica.

use crate::support::{Stack, engine, http, tiny};
use serde_json::{Value, json};

const ROUTE: &str = r#"
listen: 127.0.0.1:0
server: { max_body_bytes: 65536 }
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}]
    limits: { max_input_tokens: 200, max_tokens: { default: 16, cap: 256 }, max_n: 2 }
  - model: clamped
    upstream_model: sim
    replicas: [{E0}]
    limits: { max_tokens: { cap: 8 }, over_cap: clamp }
tenants:
  - team: search
    key_sha256: [ "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08" ]
    models: [ chat ]
  - team: other
    key_sha256: [ "580843d03d2216ff1a275d0991bad66e4d1af871171d929e9de604b7959f9bca" ]
    models: [ clamped ]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_request_gets_its_status_and_a_named_reason() {
    let stack = Stack::start(vec![engine(tiny()).await], ROUTE).await;
    let url = format!("{}/v1/chat/completions", stack.url);
    let msg = |content: &str| json!([{"role": "user", "content": content}]);
    let long = "word ".repeat(400);
    // (key, body, status, code, param, words the message must contain)
    type Case<'a> = (Option<&'a str>, String, u16, &'a str, Option<&'a str>, &'a str);
    let cases: Vec<Case> = vec![
        (
            Some("test"),
            "{\"model\":".into(),
            400,
            "invalid_request",
            None,
            "invalid JSON",
        ),
        (
            Some("test"),
            json!({"model": "chat", "messages": "hi"}).to_string(),
            400,
            "invalid_request",
            None,
            "messages",
        ),
        (
            Some("test"),
            json!({"model": "chat", "messages": msg("x"), "max_tokens": "5"}).to_string(),
            400,
            "invalid_request",
            None,
            "max_tokens",
        ),
        (
            Some("test"),
            json!({"model": "chat", "messages": msg("x"), "stream": "yes"}).to_string(),
            400,
            "invalid_request",
            None,
            "stream",
        ),
        (
            Some("test"),
            json!({"model": "chat", "messages": []}).to_string(),
            400,
            "invalid_request",
            Some("messages"),
            "must not be empty",
        ),
        (
            Some("test"),
            json!({"model": "chat", "messages": msg(&long)}).to_string(),
            400,
            "input_too_long",
            Some("messages"),
            "limit of 200 (max_input_tokens)",
        ),
        (
            Some("test"),
            json!({"model": "chat", "messages": msg("x"), "max_tokens": 5000}).to_string(),
            400,
            "max_tokens_over_cap",
            Some("max_tokens"),
            "cap of 256",
        ),
        (
            Some("test"),
            json!({"model": "chat", "messages": msg("x"), "max_tokens": 0}).to_string(),
            400,
            "invalid_request",
            Some("max_tokens"),
            "at least 1",
        ),
        (
            Some("test"),
            json!({"model": "chat", "messages": msg("x"), "n": 3}).to_string(),
            400,
            "n_over_cap",
            Some("n"),
            "limit of 2",
        ),
        (
            Some("test"),
            json!({"model": "gpt-9", "messages": msg("x")}).to_string(),
            404,
            "model_not_found",
            Some("model"),
            "does not exist",
        ),
        (
            None,
            json!({"model": "chat", "messages": msg("x")}).to_string(),
            401,
            "missing_api_key",
            None,
            "Authorization",
        ),
        (
            Some("wrong"),
            json!({"model": "chat", "messages": msg("x")}).to_string(),
            401,
            "invalid_api_key",
            None,
            "invalid API key",
        ),
        (
            Some("test"),
            json!({"model": "clamped", "messages": msg("x")}).to_string(),
            403,
            "model_not_allowed",
            Some("model"),
            "may not use",
        ),
    ];
    for (key, body, status, code, param, needle) in cases {
        let mut req = http()
            .post(&url)
            .header("content-type", "application/json")
            .body(body.clone());
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status().as_u16(), status, "{body:.100}");
        assert!(r.headers().contains_key("x-request-id"));
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], code, "{v}");
        assert!(v["error"]["type"].is_string(), "{v}");
        testkit::assert_error_mentions(&v, needle);
        if let Some(p) = param {
            assert_eq!(v["error"]["param"], p, "{v}");
        }
    }
    let r = http()
        .post(&url)
        .bearer_auth("test")
        .body(vec![b' '; 70_000])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    let v: Value = r.json().await.unwrap();
    testkit::assert_error_mentions(&v, "65536 bytes (server.max_body_bytes)");
    assert_eq!(
        stack.engines[0].engine.snapshot().steps,
        0,
        "nothing reached the engine"
    );
    let m = stack.metrics().await;
    for reason in [
        "input_too_long",
        "max_tokens_over_cap",
        "n_over_cap",
        "invalid_api_key",
        "body_too_large",
    ] {
        assert!(
            m.contains(&format!("reason=\"{reason}\"")),
            "rejection reason {reason} missing"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_cap_clamps_where_the_route_says_so_and_defaults_apply() {
    let stack = Stack::start(vec![engine(tiny()).await], ROUTE).await;
    let r: Value = http()
        .post(format!("{}/v1/chat/completions", stack.url))
        .bearer_auth("other-key")
        .json(&json!({"model": "clamped", "messages": [{"role": "user", "content": "x"}], "max_tokens": 100}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["usage"]["completion_tokens"], 8, "clamped to the cap: {r}");
    assert_eq!(r["model"], "clamped", "the public name, not the upstream's");
    let r: Value = http()
        .post(format!("{}/v1/chat/completions", stack.url))
        .bearer_auth("test")
        .json(&json!({"model": "chat", "messages": [{"role": "user", "content": "x"}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        r["usage"]["completion_tokens"], 16,
        "the route's default max_tokens: {r}"
    );
}

/// Input tokens are counted with the route's `tokenizer.json` when it has one: a word-level
/// tokenizer counts four long words as four tokens, where the byte estimate would count many more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_tokens_are_counted_with_the_routes_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    let path = testkit::word_tokenizer(dir.path(), &["extraordinarily"]);
    let yaml = format!(
        "listen: 127.0.0.1:0\nroutes:\n  - model: chat\n    upstream_model: sim\n    replicas: [{{E0}}]\n    tokenizer: {}\n    limits: {{ max_input_tokens: 4 }}\n",
        path.display()
    );
    let stack = Stack::start(vec![engine(tiny()).await], &yaml).await;
    let send = |words: usize| {
        let url = format!("{}/v1/completions", stack.url);
        let prompt = vec!["extraordinarily"; words].join(" ");
        async move {
            http()
                .post(url)
                .json(&json!({"model": "chat", "prompt": prompt, "max_tokens": 1}))
                .send()
                .await
                .unwrap()
        }
    };
    // 4 words, 63 bytes: within 4 tokens by the tokenizer (16 by the estimate).
    assert_eq!(send(4).await.status(), 200);
    let r = send(5).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    testkit::assert_error_mentions(&v, "the input is 5 tokens");
}

/// Every header the gateway reads is checked the same way on every route: a malformed value is a
/// 400 naming the header, whether or not the route acts on it (an SLO header on a route without
/// `balance: slo` was answered 200).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_header_read_is_checked_on_every_route() {
    let config = r#"
listen: 127.0.0.1:0
routes:
  - model: plain
    upstream_model: sim
    replicas: [{E0}]
  - model: by-slo
    upstream_model: sim
    replicas: [{E0}]
    balance: slo
"#;
    let stack = Stack::start(vec![engine(tiny()).await], config).await;
    let url = format!("{}/v1/chat/completions", stack.url);
    let cases = [
        ("x-spillway-slo-ttft-ms", "abc", "invalid_slo"),
        ("x-llm-d-slo-ttft-ms", "-5", "invalid_slo"),
        ("x-spillway-slo-tpot-ms", "0", "invalid_slo"),
        ("x-llm-d-slo-tpot-ms", "fast", "invalid_slo"),
        ("x-spillway-deadline", "soon", "invalid_deadline"),
        ("x-spillway-priority", "urgent", "invalid_priority"),
    ];
    for model in ["plain", "by-slo"] {
        let body = json!({"model": model, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2});
        for (name, value, code) in cases {
            let r = http()
                .post(&url)
                .header(name, value)
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), 400, "{model}: {name}: {value}");
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["error"]["code"], code, "{model}: {v}");
            testkit::assert_error_mentions(&v, name);
        }
        // The llm-d name is checked even when ours is sent too (ours wins when both are good).
        let r = http()
            .post(&url)
            .header("x-spillway-slo-ttft-ms", "500")
            .header("x-llm-d-slo-ttft-ms", "abc")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 400, "{model}");
        let good = http()
            .post(&url)
            .header("x-spillway-slo-ttft-ms", "500")
            .header("x-spillway-deadline", "5s")
            .header("x-spillway-priority", "standard")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(good.status().as_u16(), 200, "{model}");
    }
}
