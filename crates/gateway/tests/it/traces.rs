//! OpenTelemetry traces, checked at a real OTLP/HTTP receiver (tests/python/otlp_receiver.py,
//! which decodes with OpenTelemetry's own protobuf package): the span tree of a request, the W3C
//! context passed on to the replica, and a collector that is down or slow costing spans, not
//! requests.

use crate::support::{Stack, engine, http, tiny};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use serde_json::Value;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};

/// The receiver, printing the spans it decodes; killed when dropped.
struct Receiver {
    _child: tokio::process::Child,
    port: u16,
    spans: Arc<Mutex<Vec<Value>>>,
}

impl Receiver {
    async fn start(args: &[&str]) -> Receiver {
        let mut child = tokio::process::Command::new(testkit::python())
            .arg(testkit::repo_root().join("tests/python/otlp_receiver.py"))
            .args(args)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the OTLP receiver starts (scripts/test.sh installs opentelemetry-proto)");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines
            .next_line()
            .await
            .unwrap()
            .expect("the receiver says its port");
        let port = first
            .strip_prefix("listening ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line: {first}"));
        let spans = Arc::new(Mutex::new(Vec::new()));
        let sink = spans.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let span: Value = serde_json::from_str(&line).expect("one JSON span per line");
                sink.lock().unwrap().push(span);
            }
        });
        Receiver {
            _child: child,
            port,
            spans,
        }
    }

    /// The spans of `trace_id`, once `count` of them have arrived (within 15 s).
    async fn trace(&self, trace_id: &str, count: usize) -> Vec<Value> {
        let of_trace = || -> Vec<Value> {
            let spans = self.spans.lock().unwrap();
            spans
                .iter()
                .filter(|s| s["trace_id"] == trace_id)
                .cloned()
                .collect()
        };
        let arrived = testkit::eventually(Duration::from_secs(15), || of_trace().len() >= count).await;
        let spans = of_trace();
        assert!(arrived, "{count} spans of {trace_id}; got {spans:#?}");
        spans
    }
}

/// What each call to the replica carried.
type Seen = Arc<Mutex<Vec<(Option<String>, Option<String>)>>>;

/// An OpenAI-compatible replica that answers its first call with 503 (so the gateway retries on
/// another replica) and streams three tokens after that; `calls` is shared between replicas.
async fn replica(calls: Arc<AtomicUsize>, seen: Seen) -> String {
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move |headers: HeaderMap| {
            let calls = calls.clone();
            let seen = seen.clone();
            async move {
                let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
                seen.lock().unwrap().push((header("traceparent"), header("tracestate")));
                if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                    return (
                        StatusCode::SERVICE_UNAVAILABLE,
                        [("retry-after", "1")],
                        r#"{"error":{"message":"busy","type":"server_error","code":"busy"}}"#,
                    )
                        .into_response();
                }
                let chunk = |delta: &str, finish: &str| {
                    format!(
                        "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"sim\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n"
                    )
                };
                let body = [
                    chunk(r#"{"role":"assistant","content":""}"#, "null"),
                    chunk(r#"{"content":"a"}"#, "null"),
                    chunk(r#"{"content":" b"}"#, "null"),
                    chunk(r#"{"content":" c"}"#, "null"),
                    chunk("{}", "\"stop\""),
                    "data: {\"id\":\"c1\",\"model\":\"sim\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3,\"total_tokens\":8}}\n\n".into(),
                    "data: [DONE]\n\n".into(),
                ]
                .concat();
                ([("content-type", "text/event-stream")], body).into_response()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

fn attr<'a>(span: &'a Value, key: &str) -> &'a Value {
    &span["attributes"][key]
}

fn named<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["name"] == name).collect()
}

/// The value of the series `name{labels}` exactly as written in the exposition, 0 if absent.
fn series(metrics: &str, name_and_labels: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.trim().parse().ok())
        .unwrap_or(0.0)
}

const SERVER: i64 = 2;
const CLIENT: i64 = 3;
const STATUS_ERROR: i64 = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_leaves_its_span_tree_at_the_collector_and_its_context_at_the_replica() {
    let receiver = Receiver::start(&[]).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let seen: Seen = Arc::default();
    let (r0, r1) = (
        replica(calls.clone(), seen.clone()).await,
        replica(calls.clone(), seen.clone()).await,
    );
    let yaml = format!(
        r#"
listen: 127.0.0.1:0
tracing: {{ otlp_endpoint: "http://127.0.0.1:{port}", service_name: gw-under-test }}
routes:
  - model: chat
    upstream_model: sim
    replicas: [{r0}, {r1}]
    timeouts: {{ connect: 200ms, first_token: 3s, stream_idle: 2s, total: 20s }}
    retry: {{ attempts: 2, backoff: {{ base: 5ms, max: 20ms }}, budget: {{ ratio: 0.5, min_per_second: 5 }} }}
"#,
        port = receiver.port
    );
    let stack = Stack::start(vec![], &yaml).await;
    let send = |traceparent: String| {
        http()
            .post(format!("{}/v1/chat/completions", stack.url))
            .header("traceparent", traceparent)
            .header("tracestate", "vendor=1")
            .json(&serde_json::json!({
                "model": "chat", "max_tokens": 3, "stream": true,
                "messages": [{"role": "user", "content": "hello"}],
            }))
            .send()
    };

    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let r = send(format!("00-{trace_id}-{caller_span}-01")).await.unwrap();
    assert_eq!(r.status(), 200);
    let body = r.text().await.unwrap();
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");

    // The request, its queue, two upstream attempts, the first token and the stream.
    let spans = receiver.trace(trace_id, 6).await;
    let roots = named(&spans, "chat chat");
    assert_eq!(roots.len(), 1, "{spans:#?}");
    let root = roots[0];
    assert_eq!(
        root["parent_span_id"], caller_span,
        "the caller's span is the parent"
    );
    assert_eq!(root["kind"], SERVER);
    assert_eq!(root["service"], "gw-under-test");
    assert_eq!(
        root["flags"].as_i64().unwrap() & 0x301,
        0x301,
        "sampled, with a remote parent"
    );
    for (key, want) in [
        ("gen_ai.operation.name", serde_json::json!("chat")),
        ("gen_ai.request.model", serde_json::json!("chat")),
        ("gen_ai.request.max_tokens", serde_json::json!(3)),
        ("gen_ai.usage.input_tokens", serde_json::json!(5)),
        ("gen_ai.usage.output_tokens", serde_json::json!(3)),
        ("gen_ai.response.finish_reasons", serde_json::json!(["stop"])),
        ("http.response.status_code", serde_json::json!(200)),
        ("spillway.route", serde_json::json!("chat")),
        ("spillway.class", serde_json::json!("default")),
        ("spillway.outcome", serde_json::json!("ok")),
        ("spillway.retries", serde_json::json!(1)),
    ] {
        assert_eq!(attr(root, key), &want, "{key} on {root:#}");
    }
    let root_id = root["span_id"].as_str().unwrap();
    for s in spans.iter().filter(|s| s["span_id"] != root_id) {
        assert_eq!(
            s["parent_span_id"], root_id,
            "a child of the request's span: {s:#}"
        );
        assert!(
            s["start"].as_u64() >= root["start"].as_u64() && s["end"].as_u64() <= root["end"].as_u64(),
            "within the request's span: {s:#}"
        );
    }
    for name in ["queue", "first_token", "stream"] {
        assert_eq!(named(&spans, name).len(), 1, "one {name} span: {spans:#?}");
    }
    assert_eq!(attr(named(&spans, "stream")[0], "spillway.stream.chunks"), 3);
    let mut attempts = named(&spans, "upstream");
    attempts.sort_by_key(|s| s["attributes"]["http.request.resend_count"].as_i64());
    assert_eq!(attempts.len(), 2, "{spans:#?}");
    assert!(attempts.iter().all(|a| a["kind"] == CLIENT));
    assert_eq!(attr(attempts[0], "http.response.status_code"), 503);
    assert_eq!(attempts[0]["status"], STATUS_ERROR);
    assert_eq!(attr(attempts[1], "http.response.status_code"), 200);

    // Each call to a replica carried its attempt's span as the parent, and the caller's tracestate.
    let calls_seen = seen.lock().unwrap().clone();
    assert_eq!(calls_seen.len(), 2, "the 503, then the retry: {calls_seen:?}");
    for (call, attempt) in calls_seen.iter().zip(&attempts) {
        let want = format!("00-{trace_id}-{}-01", attempt["span_id"].as_str().unwrap());
        assert_eq!(call.0.as_deref(), Some(want.as_str()));
        assert_eq!(call.1.as_deref(), Some("vendor=1"));
    }
    // The caller decided not to sample: the replica gets the caller's context as it came, and
    // nothing is recorded here. (Spans leave in order: had it been recorded, its spans would be
    // at the receiver before those of the refusal below.)
    let unsampled_trace = "0af7651916cd43dd8448eb211c80319c";
    let unsampled = format!("00-{unsampled_trace}-b7ad6b7169203331-00");
    let r = send(unsampled.clone()).await.unwrap();
    assert_eq!(r.status(), 200);
    r.text().await.unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert_eq!(seen[2].0.as_deref(), Some(unsampled.as_str()));
    assert_eq!(seen[2].1.as_deref(), Some("vendor=1"));

    // A refusal is traced too: its reason, and no upstream attempt.
    let r = http()
        .post(format!("{}/v1/chat/completions", stack.url))
        .header(
            "traceparent",
            "00-11112222333344445555666677778888-00f067aa0ba902b7-01",
        )
        .json(&serde_json::json!({"model": "nope", "messages": [{"role": "user", "content": "x"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let refused = receiver.trace("11112222333344445555666677778888", 1).await;
    assert_eq!(refused.len(), 1, "{refused:#?}");
    assert_eq!(attr(&refused[0], "http.response.status_code"), 404);
    assert!(
        attr(&refused[0], "spillway.rejection_reason").is_string(),
        "{refused:#?}"
    );
    assert_eq!(
        attr(&refused[0], "spillway.rejection_reason"),
        attr(&refused[0], "error.type")
    );
    assert!(
        receiver
            .spans
            .lock()
            .unwrap()
            .iter()
            .all(|s| s["trace_id"] != unsampled_trace),
        "the unsampled request left no span"
    );

    // The exporter counts a batch once the collector has answered, which can be just after the
    // receiver has its spans: the count is waited for, within seconds.
    let metrics = testkit::poll(
        Duration::from_secs(5),
        || stack.metrics(),
        |m| series(m, "spillway_trace_spans_exported_total") >= 7.0,
    )
    .await;
    assert_eq!(
        series(
            &metrics,
            "spillway_trace_spans_dropped_total{reason=\"queue_full\"}"
        ),
        0.0
    );
    assert!(
        series(&metrics, "spillway_trace_spans_exported_total") >= 7.0,
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_down_or_slow_costs_spans_not_requests() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let slow = Receiver::start(&["--delay", "3"]).await;
    for (endpoint, reason, queued) in [
        (format!("http://{closed}"), "export_failed", 2048),
        (format!("http://127.0.0.1:{}", slow.port), "queue_full", 2),
    ] {
        let yaml = format!(
            r#"
listen: 127.0.0.1:0
tracing: {{ otlp_endpoint: "{endpoint}", max_queued: {queued}, export_timeout: 1s }}
routes:
  - model: chat
    upstream_model: sim
    replicas: [{{E0}}]
    timeouts: {{ connect: 200ms, first_token: 3s, stream_idle: 2s, total: 20s }}
"#
        );
        let stack = Stack::start(vec![engine(tiny()).await], &yaml).await;
        let requests: Vec<_> = (0..40)
            .map(|_| {
                let url = format!("{}/v1/chat/completions", stack.url);
                tokio::spawn(async move {
                    let r = http()
                        .post(url)
                        .json(&crate::support::chat("chat", 2, true))
                        .send()
                        .await
                        .unwrap();
                    let status = r.status();
                    r.text().await.unwrap();
                    status
                })
            })
            .collect();
        for r in requests {
            assert_eq!(r.await.unwrap(), 200, "{reason}: requests are served");
        }
        let dropped = format!("spillway_trace_spans_dropped_total{{reason=\"{reason}\"}}");
        let metrics = testkit::poll(
            Duration::from_secs(10),
            || stack.metrics(),
            |m| series(m, &dropped) > 0.0,
        )
        .await;
        assert!(
            series(&metrics, &dropped) > 0.0,
            "{reason}: drops counted\n{metrics}"
        );
    }
}
