//! What vLLM 0.32 answers that `spillway engine` once did not: error events inside a 200 stream,
//! `max_model_len` in `/v1/models`; replicas scripted to answer as vLLM does.

use crate::support::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// vLLM's answer to a streamed request its full queue (`--max-num-queued-reqs`) refuses.
pub(crate) const BUSY_EVENT: &str = "{\"error\": {\"message\": \"The server is overloaded, please retry later.\", \"type\": \"ServiceUnavailableError\", \"param\": null, \"code\": 503}}";

/// A 200 SSE answer of `events` (each a `data:` payload), chunked as vLLM's server sends it.
pub(crate) fn sse_answer(events: &[&str]) -> Vec<u8> {
    let mut wire = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    for e in events {
        let e = format!("data: {e}\n\n");
        wire.extend_from_slice(format!("{:x}\r\n{e}\r\n", e.len()).as_bytes());
    }
    wire.extend_from_slice(b"0\r\n\r\n");
    wire
}

/// A JSON answer with `status`.
pub(crate) fn json_answer(status: u16, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A replica on a loopback port that answers every POST with `post` (given how many came
/// before), `GET /v1/models` with a card of `model` and `max_model_len`, and any other GET
/// with 200; connections are kept alive. Returns its URL and the number of POSTs it took.
pub(crate) async fn scripted(
    model: &'static str,
    max_model_len: Option<u32>,
    post: impl Fn(usize) -> Vec<u8> + Send + Sync + 'static,
) -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let posts = Arc::new(AtomicUsize::new(0));
    let post = Arc::new(post);
    let counted = posts.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let (post, posts) = (post.clone(), counted.clone());
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 8192];
                loop {
                    // A whole request: its head, then content-length bytes of body.
                    let head_end = loop {
                        if let Some(p) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                            break p + 4;
                        }
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&got[..head_end]).to_ascii_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    while got.len() < head_end + length {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    }
                    got.drain(..head_end + length);
                    let answer = if head.starts_with("post") {
                        post(posts.fetch_add(1, Ordering::SeqCst))
                    } else if head.starts_with("get /v1/models") {
                        let len = max_model_len.map_or(String::new(), |l| format!(",\"max_model_len\":{l}"));
                        json_answer(
                            200,
                            &format!(
                                "{{\"object\":\"list\",\"data\":[{{\"id\":\"{model}\",\"object\":\"model\",\"owned_by\":\"vllm\"{len}}}]}}"
                            ),
                        )
                    } else {
                        json_answer(200, "{}")
                    };
                    if s.write_all(&answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, posts)
}

fn one_replica(url: &str) -> String {
    format!(
        "listen: 127.0.0.1:0\nroutes:\n  - model: chat\n    upstream_model: sim\n    replicas: [{url}]\n    timeouts: {{ connect: 1s, first_token: 3s, stream_idle: 2s, total: 10s }}\n    retry: {{ attempts: 2, backoff: {{ base: 5ms, max: 20ms }}, budget: {{ ratio: 0.1, min_per_second: 5 }} }}\n"
    )
}

/// vLLM's in-stream overload answer is the replica's backpressure, like its 503: another
/// replica is tried, and the client gets that one's stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_stream_503_is_retried_on_another_replica() {
    let (busy, posts) = scripted("sim", None, |_| sse_answer(&[BUSY_EVENT, "[DONE]"])).await;
    let yaml = format!(
        "listen: 127.0.0.1:0\nroutes:\n  - model: chat\n    upstream_model: sim\n    replicas: [{busy}, {{E0}}]\n    timeouts: {{ connect: 1s, first_token: 3s, stream_idle: 2s, total: 10s }}\n    retry: {{ attempts: 2, backoff: {{ base: 5ms, max: 20ms }}, budget: {{ ratio: 0.1, min_per_second: 5 }} }}\n"
    );
    let stack = Stack::start(vec![engine(tiny()).await], &yaml).await;
    // Ties are broken from a random start: send until the busy replica has been tried.
    let mut sent = 0;
    while posts.load(Ordering::SeqCst) == 0 {
        assert!(sent < 30, "the busy replica was never picked in {sent} requests");
        let r = stack.stream("chat", 3).await;
        assert_eq!(r.status(), 200);
        let (body, _, _) = read_stream(r).await;
        assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
        assert!(!body.contains("error"), "the refusal is not relayed: {body}");
        sent += 1;
    }
    assert!(
        eventually(Duration::from_secs(5), || stack
            .records()
            .iter()
            .any(|r| r.retries == 1))
        .await
    );
    let retried = stack.records().into_iter().find(|r| r.retries == 1).unwrap();
    assert_eq!(retried.outcome, "ok");
    assert_eq!(retried.status, 200);
    assert!(retried.ttft_ms.is_some());
    let m = stack.metrics().await;
    assert!(
        m.lines()
            .any(|l| l.starts_with("spillway_upstream_requests_total{") && l.contains("result=\"busy\"")),
        "counted as the replica's busy answer"
    );
}

/// With no other replica to try, the client gets the gateway's own 503 with Retry-After, never
/// a 200 whose stream is an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_stream_503_with_no_replica_left_is_the_gateways_503() {
    let (busy, posts) = scripted("sim", None, |_| sse_answer(&[BUSY_EVENT, "[DONE]"])).await;
    let stack = Stack::start(vec![], &one_replica(&busy)).await;
    let r = stack.stream("chat", 3).await;
    assert_eq!(r.status(), 503);
    assert_eq!(header(&r, "retry-after"), "1");
    assert!(header(&r, "content-type").starts_with("application/json"));
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "upstream_busy", "{v}");
    assert_eq!(posts.load(Ordering::SeqCst), 1);
    assert!(eventually(Duration::from_secs(5), || !stack.records().is_empty()).await);
    let record = stack.records().remove(0);
    assert_eq!((record.status, record.outcome), (503, "upstream_busy"));
}

/// An in-stream 429 is backpressure too; a 400 is the client's (relayed as vLLM's own error
/// body, with its status); a 500 is a failure (the gateway's 502).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_stream_error_is_answered_with_the_status_it_names() {
    let event = |code: u16, kind: &str| {
        format!(
            "{{\"error\": {{\"message\": \"refused\", \"type\": \"{kind}\", \"param\": null, \"code\": {code}}}}}"
        )
    };
    for (code, kind, status, gateway_code) in [
        (429, "RateLimitError", 503, Some("upstream_busy")),
        (400, "BadRequestError", 400, None),
        (500, "InternalServerError", 502, Some("upstream_error")),
    ] {
        let e = event(code, kind);
        let (url, posts) = scripted("sim", None, move |_| sse_answer(&[&e, "[DONE]"])).await;
        let stack = Stack::start(vec![], &one_replica(&url)).await;
        let r = stack.stream("chat", 3).await;
        assert_eq!(r.status(), status, "in-stream {code}");
        let v: serde_json::Value = r.json().await.unwrap();
        match gateway_code {
            Some(c) => assert_eq!(v["error"]["code"], c, "{v}"),
            None => {
                assert_eq!(v["error"]["code"], code, "vLLM's own body: {v}");
                assert_eq!(v["error"]["type"], kind);
            }
        }
        assert_eq!(posts.load(Ordering::SeqCst), 1, "in-stream {code} is tried once");
    }
}

fn with_slo(url: &str) -> String {
    format!(
        "listen: 127.0.0.1:0\nroutes:\n  - model: chat\n    upstream_model: sim\n    replicas: [{url}]\n    classes:\n      - name: interactive\n        concurrency: 4\n        queue: 4\n        queue_wait: 1s\n        slo: {{ ttft: 2s, itl: 1s }}\n"
    )
}

/// The sum of every series of `name` in a Prometheus exposition.
fn total(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// vLLM 0.32 streams a reasoning model's thinking in `delta.reasoning`, and tool calls in
/// `delta.tool_calls`: the first of them is the first token (TTFT, the adaptive limit's
/// samples), the rest are inter-token gaps, and the request is measured against the SLO.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_and_tool_call_deltas_are_tokens() {
    let (url, _) = scripted("sim", None, |_| {
        sse_answer(&[
            r#"{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
            r#"{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"reasoning":"Let"}}]}"#,
            r#"{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"reasoning":" me think"}}]}"#,
            r#"{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]}"#,
            r#"{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop","stop_reason":null}]}"#,
            "[DONE]",
        ])
    })
    .await;
    let stack = Stack::start(vec![], &with_slo(&url)).await;
    let r = stack.stream("chat", 8).await;
    assert_eq!(r.status(), 200);
    read_stream(r).await;
    assert!(eventually(Duration::from_secs(5), || !stack.records().is_empty()).await);
    let record = stack.records().remove(0);
    assert_eq!(record.outcome, "ok");
    assert!(
        record.ttft_ms.is_some(),
        "the first reasoning delta is the first token"
    );
    assert_eq!(
        record.tokens_out,
        Some(4),
        "counted from the chunks without usage"
    );
    let m = stack.metrics().await;
    assert_eq!(total(&m, "spillway_time_to_first_token_seconds_count"), 1.0);
    assert_eq!(total(&m, "spillway_inter_token_latency_seconds_count"), 3.0);
    assert_eq!(total(&m, "spillway_goodput_requests_total"), 1.0);
}

/// A stream whose first token the gateway never saw has no TTFT to hold against the SLO: it is
/// measured (in the denominator) but never goodput.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_a_measured_first_token_is_not_goodput() {
    let (url, _) = scripted("sim", None, |_| {
        sse_answer(&[
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":""},"finish_reason":"stop"}]}"#,
            "[DONE]",
        ])
    })
    .await;
    let stack = Stack::start(vec![], &with_slo(&url)).await;
    let r = stack.stream("chat", 8).await;
    assert_eq!(r.status(), 200);
    read_stream(r).await;
    assert!(eventually(Duration::from_secs(5), || !stack.records().is_empty()).await);
    let record = stack.records().remove(0);
    assert_eq!((record.outcome, record.ttft_ms), ("ok", None));
    let m = stack.metrics().await;
    assert_eq!(total(&m, "spillway_slo_requests_total"), 1.0);
    assert_eq!(total(&m, "spillway_goodput_requests_total"), 0.0);
}

/// The gateway's `/v1/models` card of each route.
async fn cards(url: &str) -> serde_json::Value {
    http()
        .get(format!("{url}/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// A bench through the gateway fits its long requests to the context the gateway publishes:
/// the smallest its replicas state in their own `/v1/models` (read when they pass a health
/// check), and none while no replica has said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_carry_the_smallest_context_of_the_routes_replicas() {
    let (a, _) = scripted("sim", Some(4096), |_| json_answer(500, "{}")).await;
    let (b, _) = scripted("sim", Some(2048), |_| json_answer(500, "{}")).await;
    let (silent, _) = scripted("other", None, |_| json_answer(500, "{}")).await;
    let health = "    health: { interval: 100ms, timeout: 100ms, unhealthy_after: 2, healthy_after: 1 }\n";
    let yaml = format!(
        "listen: 127.0.0.1:0\nroutes:\n  - model: chat\n    upstream_model: sim\n    replicas: [{a}, {b}]\n{health}  - model: quiet\n    replicas: [{silent}]\n{health}  - model: sim\n    replicas: [{{E0}}]\n{health}"
    );
    let stack = Stack::start(vec![engine(tiny()).await], &yaml).await;
    let len = |v: &serde_json::Value, id: &str| {
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == id)
            .unwrap()
            .get("max_model_len")
            .cloned()
    };
    let v = testkit::poll(
        Duration::from_secs(4),
        || cards(&stack.url),
        |v| len(v, "chat").is_some() && len(v, "sim").is_some(),
    )
    .await;
    assert_eq!(len(&v, "chat"), Some(2048.into()), "{v}");
    let engine_len = stack.engines[0].engine.config().max_model_len;
    assert_eq!(
        len(&v, "sim"),
        Some(engine_len.into()),
        "spillway engine states it too"
    );
    assert_eq!(len(&v, "quiet"), None, "absent while unknown: {v}");
}

/// What a client sees from each layer (docs/errors.md): the gateway's own errors carry a string
/// `code` and OpenAI's `type`s; a replica's own 4xx is relayed as vLLM wrote it (`code` the
/// status, an integer; `type` like `BadRequestError`), from a status or from an error event in
/// place of a stream's first token; a replica's 5xx or busy answer becomes the gateway's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_bodies_say_which_layer_answered() {
    let (failing, _) = scripted("sim", None, |_| {
        json_answer(
            500,
            r#"{"error":{"message":"engine died","type":"InternalServerError","param":null,"code":500}}"#,
        )
    })
    .await;
    let yaml = format!(
        "listen: 127.0.0.1:0\nroutes:\n  - model: chat\n    upstream_model: sim\n    replicas: [{{E0}}]\n  - model: broken\n    upstream_model: sim\n    replicas: [{failing}]\n    retry: {{ attempts: 1 }}\n"
    );
    let stack = Stack::start(vec![engine(tiny()).await], &yaml).await;
    let body = |model: &str, max_tokens: u32, stream: bool| chat(model, max_tokens, stream);
    let send = |b: serde_json::Value| {
        let url = format!("{}/v1/chat/completions", stack.url);
        async move {
            let r = http().post(url).json(&b).send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<serde_json::Value>().await.unwrap())
        }
    };
    // The gateway's own: a string code.
    let (status, v) = send(body("nope", 4, false)).await;
    assert_eq!(status, 404);
    assert_eq!(v["error"]["code"], "model_not_found", "{v}");
    assert_eq!(v["error"]["type"], "not_found_error");
    // vLLM's own 400 (max_tokens over the context), relayed as it was: an integer code.
    for stream in [false, true] {
        let (status, v) = send(body("chat", 100_000, stream)).await;
        assert_eq!(status, 400, "{v}");
        assert_eq!(v["error"]["code"], 400, "{v}");
        assert_eq!(v["error"]["type"], "BadRequestError");
        assert_eq!(v["error"]["param"], "max_tokens");
    }
    // A replica's 500 is the gateway's 502; vLLM's words stay in the log.
    let (status, v) = send(body("broken", 4, false)).await;
    assert_eq!(status, 502);
    assert_eq!(v["error"]["code"], "upstream_error", "{v}");
    assert_eq!(v["error"]["type"], "upstream_error");
    assert!(!v.to_string().contains("engine died"));
}

/// The same through `spillway engine`'s `--max-num-queued-reqs`, which refuses a streamed
/// request as vLLM 0.32 does: one engine refusing everything, the other serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engines_in_stream_refusal_is_retried_on_another_replica() {
    let mut full = tiny();
    full.max_num_queued_reqs = Some(0);
    let yaml = "listen: 127.0.0.1:0\nroutes:\n  - model: chat\n    upstream_model: sim\n    replicas: [{E0}, {E1}]\n    retry: { attempts: 2, backoff: { base: 5ms, max: 20ms }, budget: { ratio: 0.1, min_per_second: 5 } }\n";
    let stack = Stack::start(vec![engine(full).await, engine(tiny()).await], yaml).await;
    let served = || stack.engines[0].engine.records().len() + stack.engines[1].engine.records().len();
    let mut sent = 0;
    while total(&stack.metrics().await, "spillway_retries_total") < 1.0 {
        assert!(sent < 30, "the full engine was never picked in {sent} requests");
        let r = stack.stream("chat", 3).await;
        assert_eq!(r.status(), 200);
        let (body, _, _) = read_stream(r).await;
        assert!(
            body.ends_with("data: [DONE]\n\n") && !body.contains("error"),
            "{body}"
        );
        sent += 1;
    }
    assert!(
        stack.engines[0].engine.records().is_empty(),
        "the full engine ran nothing"
    );
    assert_eq!(served(), sent, "each request served once, by the other engine");
    let alone =
        "listen: 127.0.0.1:0\nroutes:\n  - model: chat\n    upstream_model: sim\n    replicas: [{E0}]\n";
    let mut full = tiny();
    full.max_num_queued_reqs = Some(0);
    let stack = Stack::start(vec![engine(full).await], alone).await;
    let r = stack.stream("chat", 3).await;
    assert_eq!(r.status(), 503);
    assert_eq!(header(&r, "retry-after"), "1");
}

/// A replica that answers each POST with a 200 stream written in `writes`, 200 ms apart (each
/// write a list of `data:` payloads; after the last, the stream ends unless `hang`).
async fn paced(writes: Vec<Vec<&'static str>>, hang: bool) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let writes = writes.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 8192];
                while !(got.windows(4).any(|w| w == b"\r\n\r\n") && got.ends_with(b"}")) {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
                let _ = s.write_all(head).await;
                for (i, events) in writes.iter().enumerate() {
                    if i > 0 {
                        // The replica's pacing is the behaviour under test.
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    for e in events {
                        let e = format!("data: {e}\n\n");
                        let _ = s.write_all(format!("{:x}\r\n{e}\r\n", e.len()).as_bytes()).await;
                    }
                }
                if hang {
                    // A replica that hangs: the behaviour under test.
                    tokio::time::sleep(Duration::from_secs(30)).await;
                }
                let _ = s.write_all(b"0\r\n\r\n").await;
            });
        }
    });
    url
}

const ROLE: &str = r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#;

/// A server that sends its role chunk ahead of the first token (vLLM sends it with the token;
/// others do not): the head is still held until a token, so an error event after the role chunk
/// is answered as its status, and a stall after it is a first-token timeout, not a 200 stream
/// cut later by `stream_idle`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_chunk_sent_ahead_does_not_release_the_head() {
    let url = paced(vec![vec![ROLE], vec![BUSY_EVENT, "[DONE]"]], false).await;
    let stack = Stack::start(vec![], &one_replica(&url)).await;
    let r = stack.stream("chat", 3).await;
    assert_eq!(r.status(), 503);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "upstream_busy", "{v}");

    let url = paced(vec![vec![ROLE]], true).await;
    let yaml = one_replica(&url).replace(
        "connect: 1s, first_token: 3s",
        "connect: 100ms, first_token: 500ms",
    );
    let stack = Stack::start(vec![], &yaml).await;
    let r = stack.stream("chat", 3).await;
    assert_eq!(r.status(), 504);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "first_token_timeout", "{v}");

    // The role chunk goes out with the head and the first token once it comes.
    let token = r#"{"choices":[{"index":0,"delta":{"content":"hi"}}]}"#;
    let url = paced(vec![vec![ROLE], vec![token, "[DONE]"]], false).await;
    let stack = Stack::start(vec![], &one_replica(&url)).await;
    let r = stack.stream("chat", 3).await;
    assert_eq!(r.status(), 200);
    let (body, _, _) = read_stream(r).await;
    assert_eq!(sse_data(&body), [ROLE, token, "[DONE]"]);
}
