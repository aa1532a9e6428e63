//! The endpoint picker behind a real Envoy, set up as the Gateway API Inference Extension sets it
//! up (testkit::envoy): Envoy proxies, Spillway decides — which replica, and whether at all.

use crate::support::{Stack, chat, engine, eventually, http, read_stream, sse_data, tiny};
use std::net::SocketAddr;
use std::time::Duration;
use testkit::envoy::{Envoy, EnvoyOptions};

const PICKED: &str = r#"
listen: 127.0.0.1:0
endpoint_picker: { listen: 127.0.0.1:0, fallbacks: 1 }
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}, {E1}, {E2}]
    balance: least_outstanding
    classes:
      - name: interactive
        concurrency: 2
        queue: 2
        queue_wait: 300ms
"#;

/// The engines, a gateway serving `yaml` with its picker, and Envoy asking it.
struct Picked {
    stack: Stack,
    envoy: Envoy,
}

async fn picked(engines: usize, yaml: &str, fail_open: bool) -> Picked {
    let mut es = Vec::new();
    for _ in 0..engines {
        es.push(engine(tiny()).await);
    }
    let stack = Stack::start(es, yaml).await;
    let picker = *stack
        .gateway
        .picker_addr
        .get()
        .expect("the picker listens once the gateway serves");
    let envoy = Envoy::start(&EnvoyOptions {
        picker,
        endpoints: stack.engines.iter().map(|e| e.addr).collect(),
        fail_open,
        retries: 1,
    })
    .await;
    Picked { stack, envoy }
}

impl Picked {
    async fn post(&self, body: &serde_json::Value) -> reqwest::Response {
        http()
            .post(format!("{}/v1/chat/completions", self.envoy.url))
            .json(body)
            .send()
            .await
            .expect("Envoy answers")
    }
}

fn replica_of(url: &str, engines: &[SocketAddr]) -> usize {
    engines
        .iter()
        .position(|a| url.ends_with(&a.to_string()))
        .unwrap_or(usize::MAX)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_through_envoy_reach_every_replica_and_are_accounted_as_the_proxys() {
    let p = picked(3, PICKED, false).await;
    let mut answered = Vec::new();
    for i in 0..12 {
        let stream = i % 2 == 0;
        let r = p.post(&chat("chat", 8, stream)).await;
        assert_eq!(r.status(), 200, "{:?}", r.text().await);
        assert!(r.headers().contains_key("x-request-id"));
        assert!(
            r.headers()
                .get("server-timing")
                .is_some_and(|v| v.to_str().unwrap().starts_with("queue;dur=")),
            "{:?}",
            r.headers()
        );
        if stream {
            let (body, _, clean) = read_stream(r).await;
            assert!(clean);
            let events = sse_data(&body);
            assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{body}");
            let first: serde_json::Value = serde_json::from_str(&events[0]).unwrap();
            assert_eq!(first["model"], "chat", "the model is renamed back: {body}");
            assert!(
                !body.contains("\"usage\""),
                "the usage chunk the client did not ask for is dropped: {body}"
            );
        } else {
            let v: serde_json::Value = r.json().await.unwrap();
            assert_eq!(v["model"], "chat", "{v}");
            assert!(v["usage"]["completion_tokens"].as_u64().unwrap() > 0);
        }
        answered.push(i);
    }
    let stack = &p.stack;
    assert!(eventually(Duration::from_secs(3), || stack.records().len() == 12).await);
    let addrs: Vec<SocketAddr> = stack.engines.iter().map(|e| e.addr).collect();
    let mut per = [0usize; 3];
    for rec in stack.records() {
        assert_eq!(rec.status, 200, "{rec:?}");
        assert_eq!(rec.outcome, "ok", "{rec:?}");
        assert_eq!(&*rec.route, "chat");
        assert!(rec.tokens_out.unwrap_or(0) > 0, "{rec:?}");
        if rec.stream {
            assert!(rec.ttft_ms.is_some(), "{rec:?}");
        }
        let i = replica_of(rec.replica.as_deref().unwrap(), &addrs);
        per[i] += 1;
    }
    println!("requests per replica through Envoy: {per:?}");
    assert!(per.iter().all(|n| *n > 0), "{per:?}");
    for (i, e) in stack.engines.iter().enumerate() {
        assert!(e.engine.snapshot().generated_tokens > 0, "engine {i} served nothing");
    }
    let gate = stack.gateway.admission("chat", "interactive").unwrap();
    assert_eq!(gate.in_flight(), 0);
    let m = stack.metrics().await;
    assert!(
        m.contains("spillway_endpoint_picker_requests_total{result=\"picked\"} 12"),
        "{m}"
    );
}
