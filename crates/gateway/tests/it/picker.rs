//! The endpoint picker behind a real Envoy, set up as the Gateway API Inference Extension sets it
//! up (testkit::envoy): Envoy proxies, Spillway decides — which replica, and whether at all.

use crate::support::{Stack, chat, engine, eventually, http, read_stream, sse_data, tiny};
use std::net::SocketAddr;
use std::time::Duration;
use testkit::envoy::{Envoy, EnvoyOptions};

/// The gateway's configuration for `engines` replicas: C = 2, Q = 2, Wq = 300 ms.
fn config(engines: usize) -> String {
    let replicas: Vec<String> = (0..engines).map(|i| format!("{{E{i}}}")).collect();
    format!(
        r#"
listen: 127.0.0.1:0
endpoint_picker: {{ listen: 127.0.0.1:0, fallbacks: 1 }}
routes:
  - model: chat
    upstream_model: sim
    replicas: [{}]
    balance: least_outstanding
    classes:
      - name: interactive
        concurrency: 2
        queue: 2
        queue_wait: 300ms
"#,
        replicas.join(", ")
    )
}

/// Envoy asking `gateway`'s picker about `endpoints`: FailClose, no retries, plaintext.
fn asking(gateway: &testkit::Gateway, endpoints: Vec<SocketAddr>) -> EnvoyOptions {
    EnvoyOptions {
        picker: gateway.gateway.picker_addr.get().copied(),
        endpoints,
        fail_open: false,
        retries: 0,
        picker_tls: false,
    }
}

/// The engines, a gateway serving `yaml` with its picker, and Envoy asking it.
struct Picked {
    stack: Stack,
    envoy: Envoy,
}

async fn picked(engines: usize, fail_open: bool) -> Picked {
    let yaml = &config(engines);
    let mut es = Vec::new();
    for _ in 0..engines {
        es.push(engine(tiny()).await);
    }
    let stack = Stack::start(es, yaml).await;
    assert!(
        stack.gateway.picker_addr.get().is_some(),
        "the picker listens once the gateway serves"
    );
    let endpoints = stack.engines.iter().map(|e| e.addr).collect();
    let envoy = Envoy::start(&EnvoyOptions {
        fail_open,
        retries: 1,
        ..asking(&stack, endpoints)
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
        .unwrap_or_else(|| panic!("{url} is none of the engines {engines:?}"))
}

/// One request through Envoy, streamed or not, checked as a client would see it.
async fn check(p: &Picked, stream: bool) {
    let r = p.post(&chat("chat", 8, stream)).await;
    assert_eq!(r.status(), 200);
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_through_envoy_reach_every_replica_and_are_accounted_as_the_proxys() {
    let p = std::sync::Arc::new(picked(3, false).await);
    // Four at a time (C + Q): 30 picks leave no replica out but by a chance of about 1e-5.
    for round in 0..8 {
        let mut batch = Vec::new();
        for i in 0..(if round < 7 { 4 } else { 2 }) {
            let p = p.clone();
            batch.push(tokio::spawn(async move { check(&p, (round + i) % 2 == 0).await }));
        }
        for b in batch {
            b.await.unwrap();
        }
    }
    let stack = &p.stack;
    assert!(eventually(Duration::from_secs(3), || stack.records().len() == 30).await);
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
        assert!(
            e.engine.snapshot().generated_tokens > 0,
            "engine {i} served nothing"
        );
    }
    let gate = stack.gateway.admission("chat", "interactive").unwrap();
    assert_eq!(gate.in_flight(), 0);
    let m = stack.metrics().await;
    assert!(
        m.contains("spillway_endpoint_picker_requests_total{result=\"picked\"} 30"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_reach_the_client_through_envoy_in_the_openai_shape() {
    let p = picked(1, false).await;
    let r = p.post(&chat("no-such-model", 8, false)).await;
    assert_eq!(r.status(), 404);
    assert!(r.headers().contains_key("x-request-id"));
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "model_not_found", "{v}");
    let r = http()
        .post(format!("{}/v1/chat/completions", p.envoy.url))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    // `/v1/models` is answered by the picker itself, with the public names.
    let r = http()
        .get(format!("{}/v1/models", p.envoy.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["data"][0]["id"], "chat", "{v}");
    // Any other path is refused, never passed on unadmitted: a `%`-encoded completion path a
    // replica would decode, and vLLM's other endpoints.
    for (method, path) in [
        (reqwest::Method::POST, "/v1/chat%2Fcompletions"),
        (reqwest::Method::POST, "/tokenize"),
        (reqwest::Method::GET, "/v1/chat/completions"),
    ] {
        let r = http()
            .request(method.clone(), format!("{}{path}", p.envoy.url))
            .json(&chat("chat", 4, false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{method} {path}");
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "not_found", "{v}");
    }
    assert_eq!(
        p.stack.engines[0].engine.snapshot().steps,
        0,
        "nothing reached the replica"
    );
    let m = p.stack.metrics().await;
    assert!(
        m.contains("spillway_endpoint_picker_requests_total{result=\"refused\"} 5"),
        "{m}"
    );
    assert!(
        m.contains("spillway_endpoint_picker_requests_total{result=\"answered\"} 1"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_through_envoy_holds_c_across_the_engines_and_refuses_the_overflow() {
    let p = std::sync::Arc::new(picked(3, false).await);
    let watch = p.clone();
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    // The most requests the engines ran at once, summed over them, sampled through the flood.
    let peak = tokio::spawn(async move {
        let mut peak = 0;
        loop {
            let running: usize = watch
                .stack
                .engines
                .iter()
                .map(|e| e.engine.snapshot().running)
                .sum();
            peak = peak.max(running);
            tokio::select! {
                _ = &mut stopped => return peak,
                () = tokio::time::sleep(Duration::from_millis(2)) => {}
            }
        }
    });
    let mut flood = Vec::new();
    for _ in 0..16 {
        let p = p.clone();
        flood.push(tokio::spawn(async move {
            let r = p.post(&chat("chat", 400, true)).await;
            let status = r.status().as_u16();
            let retry_after = r
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_owned());
            let (body, _, _) = read_stream(r).await;
            (status, retry_after, body)
        }));
    }
    let mut served = 0;
    let mut refused = Vec::new();
    for f in flood {
        let (status, retry_after, body) = f.await.unwrap();
        if status == 200 {
            assert!(body.contains("[DONE]"), "{body}");
            served += 1;
        } else {
            refused.push((status, retry_after, body));
        }
    }
    let _ = stop.send(());
    let peak = peak.await.unwrap();
    println!(
        "flood of 16 through Envoy: {served} served, {} refused, peak running on the engines {peak}",
        refused.len()
    );
    assert!(peak <= 2, "C = 2 held across the engines: peak {peak}");
    assert!(served >= 2, "{served}");
    assert!(!refused.is_empty());
    for (status, retry_after, body) in &refused {
        assert_eq!(*status, 503, "{body}");
        let secs: u64 = retry_after
            .as_deref()
            .expect("Retry-After on a refusal")
            .parse()
            .expect("whole seconds");
        assert!((1..=60).contains(&secs), "{secs}");
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        let code = v["error"]["code"].as_str().unwrap();
        assert!(["queue_full", "queue_timeout"].contains(&code), "{v}");
    }
    let gate = p.stack.gateway.admission("chat", "interactive").unwrap();
    assert!(eventually(Duration::from_secs(2), || gate.in_flight() == 0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_through_envoy_frees_its_slot_and_the_engine_stops() {
    let p = picked(1, false).await;
    let mut r = p.post(&chat("chat", 3000, true)).await;
    assert_eq!(r.status(), 200);
    for _ in 0..3 {
        r.chunk().await.unwrap();
    }
    let gate = p.stack.gateway.admission("chat", "interactive").unwrap();
    assert_eq!(gate.in_flight(), 1);
    drop(r);
    assert!(
        eventually(Duration::from_secs(5), || gate.in_flight() == 0).await,
        "the slot is given back when Envoy resets the stream"
    );
    let truth = &p.stack.engines[0].engine;
    assert!(
        eventually(Duration::from_secs(5), || truth.snapshot().aborts == 1).await,
        "Envoy closes the replica's request"
    );
    assert!(eventually(Duration::from_secs(2), || p.stack.records().len() == 1).await);
    let rec = &p.stack.records()[0];
    assert_eq!(rec.outcome, "client_disconnect", "{rec:?}");
    assert!(rec.tokens_out.unwrap_or(0) > 0, "{rec:?}");
}

/// An address where nothing listens: the picker's process is gone.
fn nobody() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// What Envoy answers a request when the picker is down: with no endpoint for it (in Kubernetes,
/// its Service without a ready pod), `failure_mode_allow` decides (FailOpen: Envoy balances by
/// itself; FailClose: 500); with an endpoint that refuses connections (the process gone before
/// its readiness says so), Envoy has already streamed the body to the picker in full-duplex mode
/// and answers 500 either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_picker_down_envoy_fails_closed_or_open_as_configured() {
    let e = engine(tiny()).await;
    for (picker, fail_open, expected) in [
        (None, false, 500),
        (None, true, 200),
        (Some(nobody()), false, 500),
        (Some(nobody()), true, 500),
    ] {
        let envoy = Envoy::start(&EnvoyOptions {
            picker,
            endpoints: vec![e.addr],
            fail_open,
            retries: 0,
            picker_tls: false,
        })
        .await;
        let r = http()
            .post(format!("{}/v1/chat/completions", envoy.url))
            .json(&chat("sim", 4, false))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        println!("picker {picker:?}, fail_open {fail_open}: {status}");
        assert_eq!(status, expected, "picker {picker:?}, fail_open {fail_open}");
    }
}

/// In full-duplex mode Envoy sets no `message_timeout` on the picker's answers (its default is
/// 200 ms in the other modes): a request waits in the class's queue past it, and is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_queued_longer_than_envoys_message_timeout_is_served() {
    let yaml = config(1)
        .replace("concurrency: 2", "concurrency: 1")
        .replace("queue_wait: 300ms", "queue_wait: 5s");
    let p = Stack::start(vec![engine(tiny()).await], &yaml).await;
    let envoy = Envoy::start(&asking(&p, vec![p.engines[0].addr])).await;
    let send = |tokens: u32| {
        http()
            .post(format!("{}/v1/chat/completions", envoy.url))
            .json(&chat("chat", tokens, true))
            .send()
    };
    let first = send(2000).await.unwrap();
    assert_eq!(first.status(), 200);
    let gate = p.gateway.admission("chat", "interactive").unwrap();
    let second = tokio::spawn(send(4));
    assert!(eventually(Duration::from_secs(2), || gate.queued() == 1).await);
    tokio::time::sleep(Duration::from_millis(600)).await; // past Envoy's 200 ms default
    drop(first);
    let second = second.await.unwrap().unwrap();
    assert_eq!(second.status(), 200);
    let (body, _, _) = read_stream(second).await;
    assert!(body.contains("[DONE]"), "{body}");
    assert!(eventually(Duration::from_secs(2), || p.records().len() == 2).await);
    let waited = p.records().iter().filter_map(|r| r.queue_ms).fold(0.0, f64::max);
    println!("queued through Envoy for {waited} ms, then served");
    assert!(waited >= 600.0, "{waited}");
}

/// A replica that cannot be reached: Envoy retries on the fallback the picker named, and the
/// request is counted on the replica that served it (Envoy's `upstream.address`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_retries_on_the_fallback_endpoint_and_the_picker_follows() {
    let live = engine(tiny()).await;
    let dead = nobody();
    // No health checks: the unreachable replica stays a candidate, as between two checks.
    let yaml = config(2).replace(
        "    balance: least_outstanding",
        "    balance: least_outstanding\n    health: { enabled: false }",
    );
    let gateway = testkit::Gateway::start(&yaml, &[live.url(), format!("http://{dead}")]).await;
    let envoy = Envoy::start(&EnvoyOptions {
        retries: 1,
        ..asking(&gateway, vec![live.addr, dead])
    })
    .await;
    for _ in 0..16 {
        let r = http()
            .post(format!("{}/v1/chat/completions", envoy.url))
            .json(&chat("chat", 4, false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{:?}", r.text().await);
    }
    assert!(eventually(Duration::from_secs(2), || gateway.records().len() == 16).await);
    let records = gateway.records();
    let retried = records.iter().filter(|r| r.retries > 0).count();
    println!("16 requests, {retried} first sent to the unreachable replica and retried by Envoy");
    for r in &records {
        assert_eq!(r.replica.as_deref(), Some(&*live.url()), "{r:?}");
        assert_eq!(r.outcome, "ok");
    }
    assert!(
        retried > 0,
        "least_outstanding picks the unreachable one first now and then"
    );
    assert!(envoy.stat("cluster.pool.upstream_rq_retry").await >= retried as u64);
}

/// The protocol's health services over gRPC on the picker's port: all serving, then readiness
/// and the processor's own not serving once the gateway drains (liveness still serving).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_health_says_serving_then_not_ready_while_draining() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let yaml = format!("{}server: {{ drain_delay: 3s }}\n", config(1));
    let mut p = Stack::start(vec![engine(tiny()).await], &yaml).await;
    let addr = *p.gateway.picker_addr.get().unwrap();
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    let mut status = async |service: &str| {
        let r = client
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap();
        ServingStatus::try_from(r.into_inner().status).unwrap()
    };
    let services = [
        "",
        "liveness",
        "readiness",
        "envoy.service.ext_proc.v3.ExternalProcessor",
    ];
    for s in services {
        assert_eq!(status(s).await, ServingStatus::Serving, "{s:?}");
    }
    p.shutdown();
    let mut drained = false;
    for _ in 0..100 {
        if status("readiness").await == ServingStatus::NotServing {
            drained = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(drained, "readiness turns NOT_SERVING in the drain");
    assert_eq!(status("liveness").await, ServingStatus::Serving);
    assert_eq!(
        status("envoy.service.ext_proc.v3.ExternalProcessor").await,
        ServingStatus::NotServing
    );
}

/// The data plane's subset hint (`envoy.lb.subset_hint`, here set from a header by Envoy's
/// header-to-metadata filter) confines the pick; a subset with no replica of the pool is a 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subset_hint_confines_the_pick() {
    let p = picked(3, false).await;
    let only = p.stack.engines[1].addr;
    for subset in [only.to_string(), format!("10.255.0.1:80, {only}")] {
        for _ in 0..4 {
            let r = http()
                .post(format!("{}/v1/chat/completions", p.envoy.url))
                .header("x-test-subset", &subset)
                .json(&chat("chat", 4, false))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
        }
    }
    assert!(eventually(Duration::from_secs(2), || p.stack.records().len() == 8).await);
    for r in p.stack.records() {
        assert_eq!(r.replica.as_deref(), Some(&*format!("http://{only}")), "{r:?}");
    }
    let r = http()
        .post(format!("{}/v1/chat/completions", p.envoy.url))
        .header("x-test-subset", "10.255.0.1:80")
        .json(&chat("chat", 4, false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "no_healthy_replica", "{v}");
}

/// A team over its quota is shed through Envoy as the proxy sheds it: 429, `Retry-After`, the
/// `x-ratelimit-*` headers, OpenAI's body; a request without a key never names a replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_over_its_quota_gets_429_with_retry_after_through_envoy() {
    let yaml = format!(
        "endpoint_picker: {{ listen: 127.0.0.1:0 }}\n{}",
        crate::support::TEAMS
    );
    let p = Stack::start(vec![engine(tiny()).await], &yaml).await;
    let envoy = Envoy::start(&asking(&p, vec![p.engines[0].addr])).await;
    let send = |key: Option<&'static str>| {
        let mut r = http()
            .post(format!("{}/v1/chat/completions", envoy.url))
            .json(&chat("chat", 4, false));
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        r.send()
    };
    let r = send(None).await.unwrap();
    assert_eq!(r.status(), 401);
    for _ in 0..3 {
        let r = send(Some("test")).await.unwrap();
        assert_eq!(r.status(), 200);
        assert!(
            r.headers().contains_key("x-ratelimit-remaining-requests"),
            "{:?}",
            r.headers()
        );
    }
    let r = send(Some("test")).await.unwrap();
    assert_eq!(r.status(), 429);
    let secs: u64 = r.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&secs), "{secs}");
    assert_eq!(r.headers()["x-ratelimit-remaining-requests"], "0");
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "rate_limit_error", "{v}");
}

/// Several Gateways reach a picker only over TLS, without checking its certificate (the
/// reference picker makes its own): `tls: self_signed`, and Envoy connecting so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_picker_serves_over_tls_with_a_certificate_of_its_own() {
    let yaml = config(1).replace("fallbacks: 1 }", "fallbacks: 1, tls: self_signed }");
    let p = Stack::start(vec![engine(tiny()).await], &yaml).await;
    let envoy = Envoy::start(&EnvoyOptions {
        picker_tls: true,
        ..asking(&p, vec![p.engines[0].addr])
    })
    .await;
    let r = http()
        .post(format!("{}/v1/chat/completions", envoy.url))
        .json(&chat("chat", 4, true))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (body, _, _) = read_stream(r).await;
    assert!(body.contains("[DONE]"), "{body}");
    assert!(eventually(Duration::from_secs(2), || p.records().len() == 1).await);
    // A plaintext client gets no gRPC answer from a TLS port.
    let plain =
        tonic::transport::Channel::from_shared(format!("http://{}", p.gateway.picker_addr.get().unwrap()))
            .unwrap()
            .connect()
            .await;
    if let Ok(channel) = plain {
        let answer = tonic_health::pb::health_client::HealthClient::new(channel)
            .check(tonic_health::pb::HealthCheckRequest::default())
            .await;
        assert!(answer.is_err(), "{answer:?}");
    }
}

/// The route's budgets hold through Envoy too (Envoy's own timeouts may be longer, or none): a
/// replica that stalls mid-stream is cut at `stream_idle` with the proxy's SSE error event, and
/// one that never sends a token gets a 504 at `first_token`; either way its slot comes back and
/// Envoy closes the replica's request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_replicas_are_cut_at_the_routes_budgets_through_envoy() {
    for (tokens, expected) in [(3, "stream_idle_timeout"), (0, "first_token_timeout")] {
        let yaml = config(1).replace(
            "    balance: least_outstanding",
            "    balance: least_outstanding\n    timeouts: { connect: 200ms, first_token: 1s, stream_idle: 400ms, total: 20s }",
        );
        let p = Stack::start(vec![engine(crate::support::stalling(tokens)).await], &yaml).await;
        let envoy = Envoy::start(&asking(&p, vec![p.engines[0].addr])).await;
        let started = tokio::time::Instant::now();
        let r = http()
            .post(format!("{}/v1/chat/completions", envoy.url))
            .json(&chat("chat", 50, true))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let (body, _, _) = read_stream(r).await;
        let took = started.elapsed();
        println!("stalled after {tokens} tokens: {status} in {took:?}: {body}");
        let error: serde_json::Value = if tokens == 0 {
            assert_eq!(status, 504, "{body}");
            serde_json::from_str(&body).unwrap()
        } else {
            assert_eq!(status, 200);
            let last = sse_data(&body).pop().unwrap();
            serde_json::from_str(&last).unwrap()
        };
        assert_eq!(error["error"]["code"], expected, "{body}");
        assert!(took < Duration::from_secs(5), "{took:?}");
        let gate = p.gateway.admission("chat", "interactive").unwrap();
        assert!(eventually(Duration::from_secs(2), || gate.in_flight() == 0).await);
        let truth = &p.engines[0].engine;
        assert!(
            eventually(Duration::from_secs(5), || truth.snapshot().aborts == 1).await,
            "Envoy closes the replica's request"
        );
        assert!(eventually(Duration::from_secs(2), || p.records().len() == 1).await);
        assert_eq!(p.records()[0].outcome, expected);
    }
}

/// An error event in place of the first token (vLLM's full queue answers so inside a 200) is
/// answered as the proxy answers it: the head was held, so the client gets a 503 with
/// `Retry-After` rather than a 200 whose stream says it failed. The replica never sees the
/// client's key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_event_before_the_first_token_becomes_a_503_through_envoy() {
    let event =
        r#"data: {"error":{"message":"the queue is full","type":"ServiceUnavailableError","code":503}}"#;
    let answer =
        format!("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n{event}\n\n");
    let (replica, seen) = testkit::serve_script(vec![answer], true).await;
    let yaml = config(1).replace(
        "    balance: least_outstanding",
        "    balance: least_outstanding\n    health: { enabled: false }",
    );
    let gateway = testkit::Gateway::start(&yaml, std::slice::from_ref(&replica)).await;
    let addr: SocketAddr = replica.trim_start_matches("http://").parse().unwrap();
    let envoy = Envoy::start(&asking(&gateway, vec![addr])).await;
    let r = http()
        .post(format!("{}/v1/chat/completions", envoy.url))
        .bearer_auth("sk-the-clients-own-key")
        .json(&chat("chat", 8, true))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"), "{:?}", r.headers());
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "upstream_busy", "{v}");
    let seen = seen.await.unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let head = seen[0].to_ascii_lowercase();
    assert!(
        !head.contains("authorization"),
        "the key reached the replica: {head}"
    );
    assert!(!head.contains("sk-the-clients-own-key"), "{head}");
    assert!(head.contains("x-request-id"), "{head}");
    assert!(eventually(Duration::from_secs(2), || gateway.records().len() == 1).await);
    assert_eq!(gateway.records()[0].outcome, "upstream_busy");
}

/// `[DONE]` with the first token, then a body that never ends, in every replica style: through
/// Envoy, the client's stream ends cleanly a moment after `[DONE]` (not at `stream_idle` with an
/// error event), the model renamed, and the log says what happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn done_then_no_end_of_body_ends_the_stream_through_envoy_in_every_style() {
    for style in engine::SseStyle::ALL {
        let name = style.name();
        let events = style.restyle(
            b"data: {\"model\":\"sim\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t0 \"}}]}\n\ndata: [DONE]\n\n",
        );
        // A body delimited by the connection's close, which never comes.
        let mut answer =
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n".to_vec();
        answer.extend_from_slice(&events);
        // Answers the first request and holds its connection open, reading on, until the test ends.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let replica = format!("http://{}", listener.local_addr().unwrap());
        let _held = tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = conn.read(&mut buf).await.unwrap_or(0);
                if n == 0 {
                    return;
                }
                got.extend_from_slice(&buf[..n]);
            }
            conn.write_all(&answer).await.unwrap();
            while conn.read(&mut buf).await.unwrap_or(0) > 0 {}
        });
        let yaml = config(1).replace(
            "    balance: least_outstanding",
            "    balance: least_outstanding\n    health: { enabled: false }\n    timeouts: { connect: 200ms, first_token: 2s, stream_idle: 10s, total: 20s }",
        );
        let gateway = testkit::Gateway::start(&yaml, std::slice::from_ref(&replica)).await;
        let addr: SocketAddr = replica.trim_start_matches("http://").parse().unwrap();
        let envoy = Envoy::start(&asking(&gateway, vec![addr])).await;
        let started = tokio::time::Instant::now();
        let r = http()
            .post(format!("{}/v1/chat/completions", envoy.url))
            .json(&chat("chat", 8, true))
            .send()
            .await
            .unwrap();
        let status = r.status();
        let (body, _, clean) = read_stream(r).await;
        let took = started.elapsed();
        assert_eq!(status, 200, "{name}: {body}");
        assert!(clean, "{name}: {body}");
        let kinds: Vec<_> = {
            let mut s = protocol::sse::EventSplitter::default();
            let mut k = Vec::new();
            s.feed(body.as_bytes(), |e| k.push(protocol::judge::reference::judge(&e)));
            k.into_iter()
                .filter(|e| e.kind != protocol::judge::Kind::Other)
                .collect()
        };
        assert_eq!(kinds.len(), 2, "{name}: {body}");
        assert_eq!(kinds[0].model.as_deref(), Some("chat"), "{name}: {body}");
        assert_eq!(kinds[1].kind, protocol::judge::Kind::Done, "{name}: {body}");
        assert!(
            took < Duration::from_secs(5),
            "{name}: ended after {took:?}, not at stream_idle"
        );
        assert!(eventually(Duration::from_secs(2), || gateway.records().len() == 1).await);
        let rec = &gateway.records()[0];
        assert_eq!(
            (rec.outcome, rec.note),
            ("ok", Some("upstream_body_not_ended")),
            "{name}"
        );
    }
}

/// The agents' APIs through Envoy and the picker as through the proxy: the official SDKs' calls
/// (tests/python/agents_gateway.py: Responses and Messages, streamed and whole, a token count,
/// Anthropic's not-found), and a response continued on the replica that made it, with no fallback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_apis_through_envoy_and_a_response_continued_where_it_was_made() {
    let p = picked(2, false).await;
    let report = testkit::run_python("agents_gateway.py", &[&p.envoy.url, "chat"]).await;
    assert!(report.contains("ok: 6 checks"), "{report}");
    let engines: Vec<SocketAddr> = p.stack.engines.iter().map(|e| e.addr).collect();
    let before = p.stack.records().len();
    let mut makers = Vec::new();
    for _ in 0..8 {
        let body = serde_json::json!({"model": "chat", "input": "hi", "max_output_tokens": 2});
        let r = http()
            .post(format!("{}/v1/responses", p.envoy.url))
            .json(&body)
            .send()
            .await
            .unwrap();
        let made: serde_json::Value = r.json().await.unwrap();
        let id = made["id"].as_str().unwrap().to_owned();
        let n = before + makers.len() * 4 + 1;
        assert!(eventually(Duration::from_secs(2), || p.stack.records().len() == n).await);
        let maker = replica_of(p.stack.records()[n - 1].replica.as_deref().unwrap(), &engines);
        for _ in 0..2 {
            let next = serde_json::json!({"model": "chat", "input": "on", "max_output_tokens": 2, "previous_response_id": id});
            let _ = http()
                .post(format!("{}/v1/responses", p.envoy.url))
                .json(&next)
                .send()
                .await
                .unwrap()
                .bytes()
                .await;
        }
        // Read by its id through Envoy: the picker asks the replica that made it.
        let read = http()
            .get(format!("{}/v1/responses/{id}", p.envoy.url))
            .send()
            .await
            .unwrap();
        assert!(read.status() == 200 || read.status() == 404, "{}", read.status());
        assert!(eventually(Duration::from_secs(2), || p.stack.records().len() == n + 3).await);
        for r in &p.stack.records()[n..n + 3] {
            assert_eq!(
                replica_of(r.replica.as_deref().unwrap(), &engines),
                maker,
                "{r:?}"
            );
        }
        makers.push(maker);
    }
    assert!(
        makers.iter().any(|m| *m != makers[0]),
        "made on both replicas: {makers:?}"
    );
    let unknown = serde_json::json!({"model": "chat", "input": "x", "previous_response_id": "resp_none"});
    let r = http()
        .post(format!("{}/v1/responses", p.envoy.url))
        .json(&unknown)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}
