//! Any request body, on either endpoint, with or without headers: parsing, cost caps, class
//! choice and re-encoding must answer (a request or a 4xx) and never panic.
#![no_main]

use axum::http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use spillway_gateway::config::Config;
use spillway_gateway::fuzzing::{FuzzRoute, caller_deadline, request_id};
use spillway_protocol::error::parse_json;
use spillway_protocol::openai::{ChatCompletionRequest, CompletionRequest};
use std::sync::LazyLock;

static ROUTE: LazyLock<FuzzRoute> = LazyLock::new(|| {
    let config = Config::from_yaml(
        "listen: 127.0.0.1:1\nroutes:\n  - model: m\n    upstream_model: up\n    replicas: [http://127.0.0.1:2]\n    limits: { max_input_tokens: 500, max_tokens: { default: 16, cap: 64 }, max_n: 2, over_cap: clamp }\n    classes:\n      - { name: a, concurrency: 1, queue: 1, queue_wait: 1s }\n      - { name: b, when: { max_tokens_over: 8, input_tokens_over: 100, header: { name: x-c, value: b } }, concurrency: 1, queue: 1, queue_wait: 1s }\n",
    )
    .expect("fuzz config");
    FuzzRoute::new(&config).expect("route")
});

/// A route that changes nothing in a request: the body goes upstream as the client wrote it,
/// with at most the usage member appended.
static AS_SENT: LazyLock<FuzzRoute> = LazyLock::new(|| {
    let config = Config::from_yaml(
        "listen: 127.0.0.1:1\nroutes:\n  - model: m\n    replicas: [http://127.0.0.1:2]\n    classes:\n      - { name: a, concurrency: 1, queue: 1, queue_wait: 1s }\n",
    )
    .expect("fuzz config");
    FuzzRoute::new(&config).expect("route")
});

fuzz_target!(|data: &[u8]| {
    let (head, body) = data.split_at(data.len().min(2));
    let chat = head.first().is_some_and(|b| b & 1 == 1);
    let mut headers = HeaderMap::new();
    if let Some(&b) = head.get(1) {
        let value = String::from_utf8_lossy(&body[..body.len().min(usize::from(b % 40))]).into_owned();
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.insert("x-spillway-priority", v.clone());
            headers.insert("x-spillway-deadline", v.clone());
            headers.insert("x-request-id", v.clone());
            headers.insert("x-c", v);
        }
    }
    let _ = caller_deadline(&headers);
    let id = request_id(&headers);
    assert!(!id.is_empty() && id.len() <= 128);
    if let Ok(p) = ROUTE.prepare(chat, &headers, body) {
        // What goes upstream is valid JSON naming the upstream model, within the caps.
        let v: serde_json::Value = serde_json::from_slice(&p.body).expect("re-encoded body is JSON");
        assert_eq!(v["model"], "up");
        assert!(p.max_tokens.is_none_or(|m| m <= 64));
    }
    if let Ok(p) = AS_SENT.prepare(chat, &headers, body) {
        // Parsed again as strictly as the gateway parses (a repeated key is refused): a stream
        // asks for usage, and nothing else changed.
        let again = if chat {
            let c: ChatCompletionRequest = parse_json(&p.body).expect("sent body parses");
            (c.stream, c.stream_options.and_then(|o| o.include_usage), c.model)
        } else {
            let c: CompletionRequest = parse_json(&p.body).expect("sent body parses");
            (c.stream, c.stream_options.and_then(|o| o.include_usage), c.model)
        };
        if again.0 == Some(true) {
            assert_eq!(again.1, Some(true));
        }
        assert_eq!(again.2, "m");
    }
});
