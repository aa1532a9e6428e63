//! What operators see: promtool-clean metrics with bounded labels, request IDs end to end,
//! goodput and the access log.

use crate::support::{Stack, chat, engine, eventually, http, read_stream, tiny};
use std::time::Duration;

const ROUTE: &str = r#"
listen: 127.0.0.1:0
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}]
    classes:
      - name: interactive
        concurrency: 8
        queue: 8
        queue_wait: 1s
        slo: { ttft: 2s, itl: 500ms }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_pass_promtool_and_never_take_labels_from_clients() {
    let stack = Stack::start(vec![engine(tiny()).await], ROUTE).await;
    for _ in 0..3 {
        let r = stack.stream("chat", 5).await;
        assert!(read_stream(r).await.2);
    }
    let r = stack.stream("zzz-made-up-model", 5).await;
    assert_eq!(r.status(), 404);
    let r = http()
        .post(format!("{}/v1/chat/completions", stack.url))
        .header("x-request-id", "rid-7")
        .header("x-spillway-priority", "critical")
        .json(&chat("chat", 5, false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = stack.metrics().await;
    assert!(
        !text.contains("zzz-made-up-model") && !text.contains("rid-7"),
        "client input never becomes a label"
    );
    assert!(text.contains("route=\"_unknown\""));
    assert!(
        text.contains("spillway_goodput_requests_total{class=\"interactive\",route=\"chat\"} 4"),
        "{text}"
    );
    assert!(text.contains("spillway_slo_requests_total{class=\"interactive\",route=\"chat\"} 4"));
    assert!(text.contains("spillway_concurrency_limit{class=\"interactive\",route=\"chat\"} 8"));
    assert!(text.contains("spillway_queue_limit{class=\"interactive\",route=\"chat\"} 8"));
    assert!(text.contains(
        "spillway_completion_tokens_total{class=\"interactive\",route=\"chat\",team=\"anonymous\"} 20"
    ));

    let report = testkit::promtool_check(&text).await;
    assert!(report.trim().is_empty(), "promtool: {report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_round_trip_and_reach_the_access_log() {
    let stack = Stack::start(vec![engine(tiny()).await], ROUTE).await;
    let send = |id: String| {
        let url = format!("{}/v1/chat/completions", stack.url);
        async move {
            http()
                .post(url)
                .header("x-request-id", id)
                .json(&chat("chat", 3, true))
                .send()
                .await
                .unwrap()
        }
    };
    let r = send("req-abc.123".into()).await;
    assert_eq!(r.headers()["x-request-id"], "req-abc.123");
    read_stream(r).await;
    for hostile in ["a".repeat(300), "no spaces/or slashes".into()] {
        let r = send(hostile.clone()).await;
        let given = r.headers()["x-request-id"].to_str().unwrap().to_owned();
        assert_ne!(given, hostile);
        assert_eq!(given.len(), 32, "a fresh ID instead");
        read_stream(r).await;
    }
    assert!(eventually(Duration::from_secs(1), || stack.records().len() == 3).await);
    let rec = stack
        .records()
        .into_iter()
        .find(|r| r.id == "req-abc.123")
        .expect("logged under its ID");
    assert_eq!(
        (&*rec.route, &*rec.class, &*rec.team),
        ("chat", "interactive", "anonymous")
    );
    assert_eq!(rec.status, 200);
    assert!(rec.replica.as_deref().unwrap().starts_with("http://127.0.0.1:"));
    assert!(rec.ttft_ms.unwrap() > 0.0 && rec.queue_ms.is_some());
    assert_eq!(rec.tokens_out, Some(3));
    let line = serde_json::to_string(&rec).unwrap();
    assert!(!line.contains("hello there"), "no prompt text in the access log");
}

/// `spillway bench` through the gateway splits TTFT by the gateway's `Server-Timing`: with 8
/// clients against C = 2 the queue takes a visible share, and queue + upstream + the rest add up
/// to the TTFT the client saw. "The rest" is the time neither part holds: the request's way in
/// (parse, route) and the first chunk's way out, in an unoptimised build. It was under 1 ms on
/// the machine this was written on and 1.1–1.2 ms on a slower one, even alone. A missing or
/// doubled part would be off by the upstream's ≥ 2.8 ms or the queue's ~60 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "timing-bound: run alone by scripts/test.sh"]
async fn bench_splits_ttft_by_server_timing() {
    let stack = Stack::start(
        vec![engine(tiny()).await],
        r#"
listen: 127.0.0.1:0
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}]
    classes:
      - { name: interactive, concurrency: 2, queue: 16, queue_wait: 10s }
"#,
    )
    .await;
    let len = bench::spec::LengthDist::Fixed { tokens: 16 };
    let opts = bench::Options {
        target: bench::Target {
            url: stack.url.clone(),
            model: "chat".into(),
            api_key: None,
            api: bench::Api::Chat,
            ignore_eos: true,
            timeout: Duration::from_secs(60),
            ca_cert: None,
        },
        api_key_env: None,
        loads: vec![bench::spec::Load::Concurrency(8)],
        arrivals: bench::spec::Arrivals::Poisson,
        stop: bench::load::Stop::After(Duration::from_millis(1500)),
        warmup: Duration::from_millis(200),
        workload: bench::workload::Workload {
            source: bench::workload::Source::Synthetic {
                input: len,
                output: len,
            },
            long: None,
        },
        input_len: len,
        output_len: len,
        dataset: None,
        slo: "ttft_p95=60s,error_rate=100%".parse().unwrap(),
        metrics_urls: Vec::new(),
        phases: vec![bench::spec::Phase::Staircase],
        long_share: 0.0,
        long_input: Some(len),
        long_output: Some(len),
        burst_factor: 2.0,
        burst_length: Duration::from_secs(1),
        recovery_timeout: Duration::from_secs(3),
        max_concurrency: 8,
        max_in_flight: 1000,
        seed: 1,
        keep_records: false,
        quiet: true,
    };
    let report = bench::run(opts).await.unwrap();
    let table = bench::report::table(&report);
    let s = &report.levels[0].stats;
    let (ttft, queue, upstream) = (
        s.ttft.unwrap(),
        s.gateway_queue.expect("the split is there"),
        s.upstream_first_byte.expect("the split is there"),
    );
    assert_eq!(queue.count, s.ok, "every answer carried Server-Timing");
    assert!(
        queue.p50 > 0.001,
        "8 clients on C = 2 wait in the queue:\n{table}"
    );
    let rest = ttft.mean - queue.mean - upstream.mean;
    assert!(
        (-0.0005..0.002).contains(&rest),
        "queue {:.4}s + upstream {:.4}s vs ttft {:.4}s: the split adds up within 2 ms\n{table}",
        queue.mean,
        upstream.mean,
        ttft.mean
    );
    assert!(table.contains("ttft split (Server-Timing)"), "{table}");
    let json = serde_json::to_value(&report).unwrap();
    assert!(json["levels"][0]["stats"]["gateway_queue"]["p95"].is_number());
    println!("{table}");
}

/// Every refusal and cut the configuration makes possible is a series at 0 before its first
/// event, as Prometheus advises: a rate over it reads 0, not absent, and diagnose does not call
/// it missing. Fails before (neither family had a series until something was refused or cut).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn known_label_sets_are_exported_at_zero_before_any_request() {
    let stack = Stack::start(vec![engine(tiny()).await], ROUTE).await;
    let text = stack.metrics().await;
    for reason in ["queue_full", "queue_timeout", "predicted_wait", "shed"] {
        let line = format!(
            "spillway_rejections_total{{class=\"interactive\",reason=\"{reason}\",route=\"chat\",team=\"anonymous\"}} 0"
        );
        assert!(text.contains(&line), "{line}\n{text}");
    }
    for reason in [
        "client_disconnect",
        "stream_idle_timeout",
        "first_token_timeout",
        "deadline_exceeded",
        "gateway_shutdown",
        "upstream_stream_error",
    ] {
        let line = format!(
            "spillway_cancellations_total{{class=\"interactive\",reason=\"{reason}\",route=\"chat\"}} 0"
        );
        assert!(text.contains(&line), "{line}\n{text}");
    }
    assert!(
        !text.contains("reason=\"tenant_rpm\""),
        "no tenant quota configured, so none declared"
    );
    let report = testkit::promtool_check(&text).await;
    assert!(report.trim().is_empty(), "promtool: {report}");
}
