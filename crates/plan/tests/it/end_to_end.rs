//! End to end: bench an engine, plan from the bench's JSON, serve the planned Spillway config, and
//! drive ten times C through it — the engine never runs more than C, the gateway's queue never
//! holds more than Q, and the requests it admits meet the SLO the bench used.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bench::client::{Client, Outcome, Record};
use bench::load::Stop;
use bench::spec::{Arrivals, LengthDist, Load, Phase, Slo};
use bench::stats::LevelStats;
use bench::workload::{Prompt, Source, Workload};
use bench::{Api, Options};
use engine::EngineConfig;
use engine::cost::CostModel;
use rand::{Rng, SeedableRng};
use spillway_plan::arith::Pinned;
use spillway_plan::emit::render;
use spillway_plan::{Deployment, Measurement, Names, Target, plan};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

/// Generous on purpose: a request that waits for a whole request time (~330 ms) breaks it, one
/// that waits a step or two (8–16 ms) on a busy machine does not.
const SLO: &str = "ttft_p95=200ms,itl_p95=50ms";
const MODEL: &str = "sim";
const OUTPUT_TOKENS: u32 = 40;

/// The engine's capacity by construction: at most 16 sequences, every step 8 ms whatever its batch,
/// so a request of 40 tokens takes ~330 ms and a 17th client waits that long for a slot.
fn engine_config() -> EngineConfig {
    let mut cfg = EngineConfig::preset(engine::Preset::Tiny);
    cfg.model = MODEL.into();
    cfg.max_num_seqs = 16;
    cfg.cost = CostModel {
        overhead: Duration::from_millis(8),
        ..CostModel::ZERO
    };
    cfg.core_thread = true;
    cfg
}

fn target(url: &str) -> bench::Target {
    bench::Target {
        url: url.to_owned(),
        model: MODEL.into(),
        api_key: None,
        api: Api::Chat,
        ignore_eos: true,
        timeout: Duration::from_secs(30),
        ca_cert: None,
    }
}

fn bench_options(url: &str) -> Options {
    let input_len = LengthDist::Fixed { tokens: 16 };
    let output_len = LengthDist::Fixed {
        tokens: OUTPUT_TOKENS,
    };
    Options {
        target: target(url),
        api_key_env: None,
        // Past the engine's 16 quickly: the staircase's search is the bench's own tests' subject.
        loads: [4, 8, 16, 20].map(Load::Concurrency).to_vec(),
        arrivals: Arrivals::Poisson,
        stop: Stop::After(Duration::from_millis(1500)),
        warmup: Duration::ZERO,
        workload: Workload {
            source: Source::Synthetic {
                input: input_len,
                output: output_len,
            },
            long: None,
        },
        input_len,
        output_len,
        dataset: None,
        slo: SLO.parse::<Slo>().unwrap(),
        metrics_urls: vec![format!("{url}/metrics")],
        phases: vec![Phase::Baseline, Phase::Staircase, Phase::Burst],
        long_share: 0.0,
        long_input: Some(input_len),
        long_output: Some(output_len),
        burst_factor: 2.0,
        burst_length: Duration::from_millis(500),
        recovery_timeout: Duration::from_secs(3),
        max_concurrency: 32,
        max_in_flight: 1000,
        seed: 7,
        keep_records: false,
        quiet: true,
    }
}

/// `GET path` over a fresh connection: the gateway's /metrics while it is under load.
async fn get(addr: &str, path: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .expect("the gateway accepts");
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

/// The sum of a gauge over its label sets.
fn gauge(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_gateway_holds_ten_times_c_to_c_and_q() {
    let measured = testkit::Engine::start(engine_config()).await;
    let report = bench::run(bench_options(&measured.url())).await.unwrap();
    let table = bench::report::table(&report);
    drop(measured);
    let json = serde_json::to_string_pretty(&report).unwrap();
    let m = Measurement::from_bench_json(&json, "bench.json", 1).unwrap_or_else(|e| panic!("{e}\n{table}"));

    let served = testkit::Engine::start(engine_config()).await;
    let d = Deployment {
        replicas: 1,
        gateway_replicas: 1,
        // Wq + the engine's TTFT tail stays inside the 200 ms objective: the plan warns otherwise.
        wait_budget: Some(Duration::from_millis(100)),
        headroom: 0.8,
        caller_deadline: Duration::from_secs(60),
        pinned: Pinned::default(),
        tenant_quotas: Vec::new(),
        names: Names {
            model: MODEL.into(),
            served_model: MODEL.into(),
            hf_model: MODEL.into(),
            namespace: "default".into(),
            route: MODEL.into(),
            listen: "127.0.0.1:0".into(),
            upstreams: vec![served.url()],
            api_base: "http://127.0.0.1:0/v1".into(),
            class: "interactive".into(),
            max_model_len: None,
            max_num_batched_tokens: None,
            unmeasured: Vec::new(),
        },
        litellm: true,
        envoy: true,
    };
    let p = plan(&m, &d).unwrap_or_else(|e| panic!("{e}\n{table}"));
    let shown = format!("{}\n{table}", spillway_plan::report::text(&p));
    assert!(
        !p.warnings.iter().any(|w| w.contains("objective")),
        "admitted requests should fit the objective:\n{shown}"
    );
    assert!(
        shown.starts_with(&format!("spillway plan: {MODEL} on "))
            && shown.contains("measured with the chat API"),
        "the plan names the API the bench drove:\n{shown}"
    );
    let (c, q) = (p.concurrency, p.queue);
    assert!(c >= 2, "a plan worth driving:\n{shown}");

    let yaml = render(&p, Target::Spillway).unwrap().text;
    let mut gw = testkit::Gateway::start(&yaml, &[]).await;
    let addr = gw.url.trim_start_matches("http://").to_owned();

    let running = Arc::new(AtomicBool::new(true));
    let sampler = tokio::spawn({
        let (addr, running) = (addr.clone(), running.clone());
        async move {
            let mut most_queued = 0.0f64;
            while running.load(Ordering::Relaxed) {
                most_queued = most_queued.max(gauge(&get(&addr, "/metrics").await, "spillway_queued"));
                // The sampling interval of the peak, not a wait.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            most_queued
        }
    });

    // 10 × C clients for a few seconds; a rejected one backs off 100–300 ms, as a client honouring
    // the gateway's Retry-After would, instead of spinning.
    let client = Client::new(target(&format!("http://{addr}"))).unwrap();
    let epoch = Instant::now();
    let window = Duration::from_millis(2500);
    let clients: Vec<_> = (0..10 * c)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let mut rng = rand::rngs::SmallRng::seed_from_u64(u64::from(i));
                let mut records: Vec<Record> = Vec::new();
                while epoch.elapsed() < window {
                    let prompt = Prompt {
                        text: bench::workload::synthetic_text(16, &mut rng).into(),
                        max_tokens: OUTPUT_TOKENS,
                        long: false,
                        input_tokens: Some(16),
                    };
                    let rec = client.send(&prompt, Instant::now(), epoch).await;
                    let rejected = matches!(rec.outcome, Outcome::Status { code: 503 | 429 });
                    records.push(rec);
                    if rejected {
                        tokio::time::sleep(Duration::from_millis(rng.random_range(100..300))).await;
                    }
                }
                records
            })
        })
        .collect();
    let mut records = Vec::new();
    for t in clients {
        records.extend(t.await.unwrap());
    }
    let wall = epoch.elapsed();
    running.store(false, Ordering::Relaxed);
    let most_queued = sampler.await.unwrap();
    let metrics = get(&addr, "/metrics").await;
    gw.shutdown();
    let _ = gw.server.take().expect("the server task").await;

    let engine = served.engine.snapshot();
    let admitted: Vec<&Record> = records.iter().filter(|r| r.ok()).collect();
    let rejected = records
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Status { code: 503 | 429 }))
        .count();
    let failed: Vec<String> = records
        .iter()
        .filter(|r| !r.ok() && !matches!(r.outcome, Outcome::Status { code: 503 | 429 }))
        .map(|r| format!("{:?} {:?}", r.outcome, r.error))
        .collect();
    let summary = format!(
        "C {c}, Q {q}: {} requests, {} admitted, {rejected} rejected, {} failed {:?}; engine max running {}; most queued seen {most_queued}\n{shown}",
        records.len(),
        admitted.len(),
        failed.len(),
        failed.iter().take(3).collect::<Vec<_>>(),
        engine.max_running,
    );
    println!("{summary}");

    assert_eq!(
        gauge(&metrics, "spillway_concurrency_limit"),
        f64::from(c),
        "{summary}"
    );
    assert_eq!(gauge(&metrics, "spillway_queue_limit"), f64::from(q), "{summary}");
    assert!(engine.max_running >= 1, "{summary}");
    assert!(
        engine.max_running <= c as usize,
        "the engine ran more than C: {summary}"
    );
    assert!(
        most_queued <= f64::from(q),
        "the queue held more than Q: {summary}"
    );
    assert!(
        admitted.len() >= c as usize && rejected > 0,
        "ten times C overloads the gateway: {summary}"
    );
    // Overload is answered by rejections, not by admitted requests timing out (a little slack for a
    // busy machine).
    assert!(failed.len() * 50 <= admitted.len(), "{summary}");
    let slo: Slo = SLO.parse().unwrap();
    let stats = LevelStats::compute(&admitted, wall, &slo);
    for v in &stats.verdicts {
        assert!(
            v.pass,
            "admitted requests miss {} (observed {:?}): {summary}",
            v.target, v.observed
        );
    }
}
