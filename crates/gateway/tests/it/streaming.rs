//! The relay: streams and whole answers as the client asked for them, replica failures mapped to
//! clean errors, least-outstanding balance, and a drain that lets streams finish.

use crate::support::{Stack, chat, engine, eventually, http, post_json, read_stream, sse_data, tiny};
use engine::{FailEvery, Faults};
use serde_json::{Value, json};
use std::num::NonZeroU32;
use std::time::Duration;

const ROUTE: &str = r#"
listen: 127.0.0.1:0
server: { drain_delay: 300ms, drain_timeout: 10s }
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}]
    timeouts: { connect: 200ms, first_token: 2s, stream_idle: 2s, total: 20s }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_carry_usage_only_when_asked_and_the_public_model_name() {
    let stack = Stack::start(vec![engine(tiny()).await], ROUTE).await;
    let url = format!("{}/v1/chat/completions", stack.url);
    let r = stack.stream("chat", 7).await;
    let (body, _, clean) = read_stream(r).await;
    assert!(clean && body.ends_with("data: [DONE]\n\n"));
    assert!(
        !body.contains("\"usage\""),
        "the gateway asked for usage; the client did not: stripped"
    );
    assert!(!body.contains("\"model\":\"sim\""), "{body}");
    let events = sse_data(&body);
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert!(chunks.iter().all(|c| c["model"] == "chat"));
    let mut with_usage = chat("chat", 7, true);
    with_usage["stream_options"] = json!({"include_usage": true});
    let (body, _, _) = read_stream(http().post(&url).json(&with_usage).send().await.unwrap()).await;
    let events = sse_data(&body);
    let usage: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 7, "{body}");
    assert!(eventually(Duration::from_secs(1), || stack.records().len() == 2).await);
    for rec in stack.records() {
        assert_eq!((rec.status, rec.outcome, rec.tokens_out), (200, "ok", Some(7)));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_answers_and_legacy_completions_pass_through() {
    let stack = Stack::start(vec![engine(tiny()).await], ROUTE).await;
    let mut req = chat("chat", 4, false);
    req["n"] = json!(2);
    let r: Value = post_json(format!("{}/v1/chat/completions", stack.url), &req).await;
    assert_eq!(r["choices"].as_array().unwrap().len(), 2);
    assert_eq!(r["model"], "chat");
    let r: Value = post_json(
        format!("{}/v1/completions", stack.url),
        &json!({"model": "chat", "prompt": "once", "max_tokens": 3}),
    )
    .await;
    assert_eq!(r["usage"]["completion_tokens"], 3, "{r}");
    let models: Value = http()
        .get(format!("{}/v1/models", stack.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], "chat");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_failures_become_clean_errors() {
    // A client error from the replica is relayed as it is.
    let stack = Stack::start(vec![engine(tiny()).await], ROUTE).await;
    let long = "word ".repeat(6000);
    let r = http()
        .post(format!("{}/v1/chat/completions", stack.url))
        .json(&json!({"model": "chat", "messages": [{"role": "user", "content": long}], "max_tokens": 5}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    testkit::assert_error_mentions(&v, "maximum context length");

    // A busy replica (503) is backpressure: 503 with Retry-After. A failing one (500) is a 502.
    for (status, want, code) in [(503u16, 503u16, "upstream_busy"), (500, 502, "upstream_error")] {
        let mut cfg = tiny();
        cfg.faults = Faults {
            fail_every: Some(FailEvery {
                nth: NonZeroU32::MIN,
                status,
            }),
            ..Faults::default()
        };
        let stack = Stack::start(vec![engine(cfg).await], ROUTE).await;
        let r = stack.stream("chat", 5).await;
        assert_eq!(r.status().as_u16(), want);
        if want == 503 {
            assert!(r.headers().contains_key("retry-after"));
        }
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], code, "{v}");
        let result = if want == 503 { "busy" } else { "error" };
        let counted: f64 = stack
            .metrics()
            .await
            .lines()
            .filter(|l| {
                l.starts_with("spillway_upstream_requests_total{")
                    && l.contains(&format!("result=\"{result}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        assert_eq!(counted, 1.0, "one upstream answer, counted once as {result}");
    }

    // Nothing listening: 502 naming the replica, quickly.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let yaml = ROUTE.replace("{E0}", &format!("http://{closed}"));
    let stack = Stack::start(vec![], &yaml).await;
    let t = tokio::time::Instant::now();
    let r = stack.stream("chat", 5).await;
    assert_eq!(r.status(), 502);
    assert!(t.elapsed() < Duration::from_secs(1));
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "upstream_connect", "{v}");
    testkit::assert_error_mentions(&v, "replica 0");
    assert!(
        !v.to_string().contains(&closed.to_string()),
        "the replica's address stays in the gateway's log: {v}"
    );
    let ready = http().get(format!("{}/ready", stack.url)).send().await.unwrap();
    assert_eq!(ready.status(), 503, "no replica of the route answers: not ready");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_outstanding_spreads_streams_over_replicas() {
    let yaml = ROUTE.replace("replicas: [{E0}]", "replicas: [{E0}, {E1}]");
    let stack = Stack::start(vec![engine(tiny()).await, engine(tiny()).await], &yaml).await;
    let streams: Vec<_> = (0..20)
        .map(|_| {
            let url = format!("{}/v1/chat/completions", stack.url);
            tokio::spawn(async move {
                read_stream(
                    http()
                        .post(url)
                        .json(&chat("chat", 200, true))
                        .send()
                        .await
                        .unwrap(),
                )
                .await
            })
        })
        .collect();
    for s in streams {
        assert!(s.await.unwrap().2);
    }
    let counts: Vec<usize> = stack.engines.iter().map(|e| e.engine.records().len()).collect();
    assert_eq!(counts.iter().sum::<usize>(), 20);
    assert!(counts.iter().all(|c| (8..=12).contains(c)), "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_ready_fails_new_requests_get_503_streams_finish() {
    let mut stack = Stack::start(vec![engine(tiny()).await], ROUTE).await;
    let mut r = stack.stream("chat", 300).await;
    r.chunk().await.unwrap();
    assert_eq!(
        http()
            .get(format!("{}/ready", stack.url))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    stack.shutdown();
    assert!(eventually(Duration::from_secs(1), || stack.gateway.is_draining()).await);
    assert_eq!(
        http()
            .get(format!("{}/ready", stack.url))
            .send()
            .await
            .unwrap()
            .status(),
        503
    );
    let refused = stack.stream("chat", 5).await;
    assert_eq!(refused.status(), 503);
    let v: Value = refused.json().await.unwrap();
    assert_eq!(v["error"]["code"], "draining");
    let (body, _, clean) = read_stream(r).await;
    assert!(
        clean && body.ends_with("data: [DONE]\n\n"),
        "the stream in flight finished"
    );
    let server = stack.server.take().unwrap();
    let done = tokio::time::timeout(Duration::from_secs(5), server).await;
    assert!(
        matches!(done, Ok(Ok(Ok(())))),
        "the server stopped after draining"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routing_rule_sends_short_requests_to_a_smaller_model() {
    let yaml = r#"
listen: 127.0.0.1:0
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}]
    redirect: [ { when: { max_tokens_under: 20 }, to: small } ]
  - model: small
    upstream_model: sim
    replicas: [{E1}]
"#;
    let stack = Stack::start(vec![engine(tiny()).await, engine(tiny()).await], yaml).await;
    read_stream(stack.stream("chat", 5).await).await;
    read_stream(stack.stream("chat", 100).await).await;
    let served: Vec<usize> = stack.engines.iter().map(|e| e.engine.records().len()).collect();
    assert_eq!(
        served,
        vec![1, 1],
        "the short request went to the small model's replica"
    );
    assert!(eventually(Duration::from_secs(1), || stack.records().len() == 2).await);
    let routes: Vec<String> = stack.records().iter().map(|r| r.route.to_string()).collect();
    assert!(
        routes.contains(&"small".to_owned()) && routes.contains(&"chat".to_owned()),
        "{routes:?}"
    );
    let bad = yaml
        .replace("to: small", "to: nowhere")
        .replace("{E0}", "http://127.0.0.1:1")
        .replace("{E1}", "http://127.0.0.1:2");
    let e = spillway_gateway::Config::from_yaml(&bad).unwrap_err();
    assert_eq!(e.path, "routes[0].redirect[0].to");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_class_with_its_own_replicas_uses_only_them() {
    let yaml = r#"
listen: 127.0.0.1:0
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}]
    classes:
      - { name: interactive, concurrency: 8, queue: 8, queue_wait: 1s }
      - { name: long, when: { max_tokens_over: 100 }, concurrency: 2, queue: 2, queue_wait: 1s, replicas: [{E1}] }
"#;
    let stack = Stack::start(vec![engine(tiny()).await, engine(tiny()).await], yaml).await;
    for tokens in [5, 200, 5, 200, 5] {
        read_stream(stack.stream("chat", tokens).await).await;
    }
    let lengths = |i: usize| -> Vec<u32> {
        stack.engines[i]
            .engine
            .records()
            .iter()
            .map(|r| r.output_tokens)
            .collect()
    };
    assert_eq!(
        lengths(0),
        vec![5, 5, 5],
        "interactive stays on the route's replica"
    );
    assert_eq!(
        lengths(1),
        vec![200, 200],
        "long requests run on their own replica"
    );
}
