//! `/metrics`: exactly vLLM's names, types, labels and buckets; clean under promtool; scraped by a
//! real Prometheus server.

use crate::support::{MODEL, http, start, submit, tiny};
use spillway_engine::metrics::{ITERATION_TOKEN_BUCKETS, ITL_BUCKETS, REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS};
use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

fn expected() -> BTreeMap<&'static str, &'static str> {
    BTreeMap::from([
        ("vllm:num_requests_running", "gauge"),
        ("vllm:num_requests_waiting", "gauge"),
        ("vllm:num_requests_waiting_by_reason", "gauge"),
        ("vllm:kv_cache_usage_perc", "gauge"),
        ("vllm:cache_config_info", "gauge"),
        ("vllm:num_preemptions_total", "counter"),
        ("vllm:prompt_tokens_total", "counter"),
        ("vllm:generation_tokens_total", "counter"),
        ("vllm:prefix_cache_queries_total", "counter"),
        ("vllm:prefix_cache_hits_total", "counter"),
        ("vllm:request_success_total", "counter"),
        ("vllm:admission_rejections_total", "counter"),
        ("vllm:time_to_first_token_seconds", "histogram"),
        ("vllm:inter_token_latency_seconds", "histogram"),
        ("vllm:e2e_request_latency_seconds", "histogram"),
        ("vllm:request_queue_time_seconds", "histogram"),
        ("vllm:request_inference_time_seconds", "histogram"),
        ("vllm:request_prefill_time_seconds", "histogram"),
        ("vllm:request_decode_time_seconds", "histogram"),
        ("vllm:iteration_tokens_total", "histogram"),
    ])
}

fn types(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| {
            let (name, kind) = l.split_once(' ').unwrap();
            (name.to_owned(), kind.to_owned())
        })
        .collect()
}

fn buckets(text: &str, name: &str) -> Vec<String> {
    let prefix = format!("{name}_bucket{{");
    text.lines()
        .filter(|l| l.starts_with(&prefix))
        .map(|l| {
            let le = l.split("le=\"").nth(1).unwrap();
            le[..le.find('"').unwrap()].to_owned()
        })
        .collect()
}

fn fmt(bs: &[f64]) -> Vec<String> {
    bs.iter()
        .map(|b| b.to_string())
        .chain(["+Inf".to_owned()])
        .collect()
}

async fn scrape(url: &str) -> String {
    let r = http().get(format!("{url}/metrics")).send().await.unwrap();
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain; version=0.0.4")
    );
    r.text().await.unwrap()
}

#[tokio::test]
async fn exactly_vllms_names_types_labels_and_buckets() {
    let e = start(tiny()).await;
    let mut g = submit(&e.engine, 10, 3);
    crate::support::finish(&mut g).await;
    let text = scrape(&e.url()).await;
    let want: BTreeMap<String, String> = expected()
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect();
    assert_eq!(types(&text), want);
    for (name, bs) in [
        ("vllm:time_to_first_token_seconds", TTFT_BUCKETS),
        ("vllm:inter_token_latency_seconds", ITL_BUCKETS),
        ("vllm:e2e_request_latency_seconds", REQUEST_LATENCY_BUCKETS),
        ("vllm:request_queue_time_seconds", REQUEST_LATENCY_BUCKETS),
        ("vllm:request_inference_time_seconds", REQUEST_LATENCY_BUCKETS),
        ("vllm:request_prefill_time_seconds", REQUEST_LATENCY_BUCKETS),
        ("vllm:request_decode_time_seconds", REQUEST_LATENCY_BUCKETS),
        ("vllm:iteration_tokens_total", ITERATION_TOKEN_BUCKETS),
    ] {
        assert_eq!(buckets(&text, name), fmt(bs), "{name}");
    }
    assert_eq!(TTFT_BUCKETS.len(), 22);
    assert_eq!(&TTFT_BUCKETS[..3], &[0.001, 0.005, 0.01]);
    assert_eq!(
        ITL_BUCKETS[0], 0.01,
        "vLLM's first ITL bucket is 10 ms, a trap diagnosis must know"
    );
    for line in text.lines().filter(|l| l.starts_with("vllm:")) {
        // vLLM 0.32 labels its admission refusals by model and reason only.
        let engine = !line.starts_with("vllm:admission_rejections_total");
        assert!(
            line.contains(&format!("model_name=\"{MODEL}\"")) && line.contains("engine=\"0\"") == engine,
            "{line}"
        );
    }
    assert!(text.contains("vllm:generation_tokens_total{engine=\"0\",model_name=\"sim\"} 3"));
    assert!(text.contains(
        "vllm:request_success_total{engine=\"0\",finished_reason=\"length\",model_name=\"sim\"} 1"
    ));
    assert!(!text.contains("DCGM_"), "GPU metrics only with --dcgm");
}

#[tokio::test]
async fn dcgm_metrics_follow_the_batch() {
    let mut cfg = tiny();
    cfg.dcgm = true;
    let e = start(cfg).await;
    let value = |text: &str, name: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(name))
            .unwrap()
            .rsplit(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let idle = scrape(&e.url()).await;
    assert_eq!(value(&idle, "DCGM_FI_DEV_GPU_UTIL"), 0.0);
    let gens: Vec<_> = (0..32).map(|_| submit(&e.engine, 500, 3000)).collect();
    // The utilisation is a mean over the last second: waited for until it shows the batch.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut busy = scrape(&e.url()).await;
    while value(&busy, "DCGM_FI_DEV_GPU_UTIL") <= 50.0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        busy = scrape(&e.url()).await;
    }
    assert!(
        value(&busy, "DCGM_FI_DEV_GPU_UTIL") > 50.0,
        "{}",
        value(&busy, "DCGM_FI_DEV_GPU_UTIL")
    );
    assert!(
        value(&busy, "DCGM_FI_DEV_FB_USED") > value(&idle, "DCGM_FI_DEV_FB_USED"),
        "KV blocks take memory"
    );
    drop(gens);
    e.engine
        .apply_faults(&serde_json::from_str(r#"{"xid": 79, "ecc_dbe": 2}"#).unwrap())
        .unwrap();
    let after = scrape(&e.url()).await;
    assert_eq!(value(&after, "DCGM_FI_DEV_XID_ERRORS"), 79.0);
    assert_eq!(value(&after, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"), 2.0);
    for name in [
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_DEV_FB_FREE",
    ] {
        assert!(after.contains(&format!("# TYPE {name} gauge")), "{name}");
    }
}

#[tokio::test]
async fn a_dcgm_listener_of_its_own_serves_every_replicas_gpu() {
    let (a, b) = (start(tiny()).await, start(tiny()).await);
    b.engine
        .apply_faults(&serde_json::from_str(r#"{"xid": 48}"#).unwrap())
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(spillway_engine::server::serve_dcgm(
        listener,
        vec![a.engine.clone(), b.engine.clone()],
        "node-1".into(),
        async move {
            let _ = stopped.await;
        },
    ));
    let text = scrape(&url).await;
    assert!(
        !scrape(&a.url()).await.contains("DCGM_"),
        "not on the engine's /metrics without --dcgm"
    );
    let xid: Vec<(String, f64)> = protocol::prom::samples(&text)
        .filter(|s| s.name == "DCGM_FI_DEV_XID_ERRORS")
        .map(|s| (s.label("gpu").unwrap().into_owned(), s.value))
        .collect();
    assert_eq!(xid, [("0".to_owned(), 0.0), ("1".to_owned(), 48.0)]);
    for s in protocol::prom::samples(&text) {
        for label in ["gpu", "UUID", "modelName", "Hostname"] {
            assert!(s.label(label).is_some(), "{} lacks {label}", s.name);
        }
        assert_eq!(s.label("Hostname").as_deref(), Some("node-1"));
    }
    let report = testkit::promtool_check(&text).await;
    for line in report.lines().filter(|l| !l.trim().is_empty()) {
        assert!(
            line.ends_with("label names should be written in 'snake_case' not 'camelCase'"),
            "promtool: {line}"
        );
    }
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

#[tokio::test]
async fn promtool_flags_only_vllms_own_naming() {
    let mut cfg = tiny();
    cfg.dcgm = true;
    let e = start(cfg).await;
    let mut g = submit(&e.engine, 10, 3);
    crate::support::finish(&mut g).await;
    let text = scrape(&e.url()).await;
    let report = testkit::promtool_check(&text).await;
    let mut colon = 0;
    for line in report.lines().filter(|l| !l.trim().is_empty()) {
        if line.ends_with("metric names should not contain ':'") {
            colon += 1;
        } else if line
            .starts_with("vllm:iteration_tokens_total non-counter metrics should not have \"_total\" suffix")
            || (line.starts_with("DCGM_")
                && line.ends_with("label names should be written in 'snake_case' not 'camelCase'"))
        {
            // vLLM's own histogram name, and the DCGM exporter's own label names (UUID, modelName).
        } else {
            panic!("promtool found a problem: {line}\n{report}");
        }
    }
    assert_eq!(colon, expected().len(), "{report}");
}

struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn a_real_prometheus_scrapes_it_without_errors() {
    let prometheus = testkit::tool("prometheus");
    let e = start(tiny()).await;
    let mut g = submit(&e.engine, 10, 3);
    crate::support::finish(&mut g).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: engine\n    static_configs:\n      - targets: ['{}']\n",
            e.addr
        ),
    )
    .unwrap();
    let port = free_port();
    let _server = Child(
        std::process::Command::new(prometheus)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let api = format!("http://127.0.0.1:{port}/api/v1");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut last = String::new();
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no successful scrape: {last}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        let Ok(r) = http().get(format!("{api}/targets")).send().await else {
            continue;
        };
        let v: serde_json::Value = r.json().await.unwrap_or_default();
        last = v.to_string();
        let Some(t) = v["data"]["activeTargets"].get(0) else {
            continue;
        };
        if t["health"] == "up" {
            assert_eq!(t["lastError"], "", "{t}");
            break;
        }
    }
    let v: serde_json::Value = http()
        .get(format!("{api}/query"))
        .query(&[("query", "vllm:generation_tokens_total")])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["status"], "success", "{v}");
    assert_eq!(v["data"]["result"][0]["value"][1], "3", "{v}");
}
