//! Each scenario builds one situation from engine presets, faults, a gateway and load, and checks
//! that the suspect named first is the right one (and that the healthy case names none).

use crate::support::{
    busy_but_healthy, closed, dcgm, diagnose_scraped, gateway, open, thresholds, tiny, verdict,
};
use engine::cost::CostModel;
use spillway_diagnose::{Status, Suspect, Verdict, source};
use std::time::Duration;

fn first(v: &Verdict) -> Option<Suspect> {
    v.findings.first().map(|f| f.suspect)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arrivals_above_throughput() {
    let mut cfg = tiny();
    cfg.max_num_seqs = 2;
    let e = engine::spawn_local(cfg).await.unwrap();
    let d = dcgm(&[&e]).await;
    // Two sequences of ~33 steps of ~1 ms: ~60 requests/s of throughput, 120/s arriving.
    let _load = open(&e.url(), 120.0, 16, 32);
    let v = diagnose_scraped(&[&e.url(), &d.url]).await;
    assert_eq!(first(&v), Some(Suspect::ArrivalsExceedThroughput));
    assert!(v.saturation.declared, "TTFT breached and the queue growing");
    assert_eq!(v.exit_code(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_prompts_are_prefill_bound() {
    let mut cfg = tiny();
    // A slow prefill: 3,000 prompt tokens take ~300 ms before the first token.
    cfg.cost = CostModel {
        prefill_token: Duration::from_micros(100),
        ..cfg.cost
    };
    cfg.max_num_batched_tokens = 4096;
    let e = engine::spawn_local(cfg).await.unwrap();
    let d = dcgm(&[&e]).await;
    let _load = closed(&e.url(), 1, 3000, 4);
    let v = diagnose_scraped(&[&e.url(), &d.url]).await;
    assert_eq!(first(&v), Some(Suspect::LongPrompts));
    assert!(!v.saturation.declared, "one signal is not saturation");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decode_contention() {
    let mut cfg = tiny();
    // Every running sequence adds 3 ms to a step: 24 of them make ~73 ms between tokens.
    cfg.cost = CostModel {
        decode_seq: Duration::from_micros(3000),
        ..cfg.cost
    };
    let e = engine::spawn_local(cfg).await.unwrap();
    let d = dcgm(&[&e]).await;
    let _load = closed(&e.url(), 24, 16, 20);
    let v = diagnose_scraped(&[&e.url(), &d.url]).await;
    assert_eq!(first(&v), Some(Suspect::DecodeContention));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_pressure_with_preemptions() {
    let mut cfg = tiny();
    cfg.max_model_len = 2048;
    cfg.kv_cache_tokens = 4096;
    let e = engine::spawn_local(cfg).await.unwrap();
    let d = dcgm(&[&e]).await;
    // 24 sequences growing to 500 tokens want 12,000 tokens of a 4,096-token cache.
    let _load = closed(&e.url(), 24, 200, 300);
    let v = diagnose_scraped(&[&e.url(), &d.url]).await;
    assert_eq!(first(&v), Some(Suspect::KvPressure));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_timeouts_while_the_engine_is_healthy() {
    let e = engine::spawn_local(tiny()).await.unwrap();
    let d = dcgm(&[&e]).await;
    // 400 tokens take ~0.5 s; the route's total deadline cuts every stream at 150 ms.
    let g = gateway(
        &[&e],
        "{ connect: 50ms, first_token: 100ms, stream_idle: 100ms, total: 150ms }",
        "{ name: interactive, concurrency: 16, queue: 16, queue_wait: 50ms }",
    )
    .await;
    let _load = closed(&g.url, 8, 16, 400);
    let v = diagnose_scraped(&[&g.url, &e.url(), &d.url]).await;
    assert_eq!(first(&v), Some(Suspect::GatewayTimeouts));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_growing_with_the_gpu_idle() {
    let mut cfg = tiny();
    // A hung engine: requests are accepted and never served; the GPU has nothing to do.
    cfg.faults.stall_after_tokens = Some(0);
    let e = engine::spawn_local(cfg).await.unwrap();
    let d = dcgm(&[&e]).await;
    let g = gateway(
        &[&e],
        "{ connect: 1s, first_token: 30s, stream_idle: 30s, total: 60s }",
        "{ name: interactive, concurrency: 4, queue: 200, queue_wait: 20s }",
    )
    .await;
    let _load = open(&g.url, 20.0, 16, 16);
    let v = diagnose_scraped(&[&g.url, &e.url(), &d.url]).await;
    assert_eq!(first(&v), Some(Suspect::ProcessHealth));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_hung_replica_among_healthy_ones_is_named() {
    let mut hung = tiny();
    hung.faults.stall_after_tokens = Some(0);
    let (bad, good) = (
        engine::spawn_local(hung).await.unwrap(),
        engine::spawn_local(tiny()).await.unwrap(),
    );
    let d = dcgm(&[&bad, &good]).await;
    // Each replica behind a plain round-robin Service: half the load each. (Spillway's balancer
    // would steer around the hung one; its slices then show it running with no tokens.)
    let _load = (open(&bad.url(), 20.0, 16, 16), open(&good.url(), 20.0, 16, 16));
    let v = diagnose_scraped(&[&bad.url(), &good.url(), &d.url]).await;
    let f = v.findings.first().expect("a finding");
    assert_eq!(f.suspect, Suspect::ProcessHealth);
    let (bad, good) = (
        format!("replica {}", source::instance_of(&bad.url())),
        format!("replica {}", source::instance_of(&good.url())),
    );
    assert!(f.at.contains(&bad), "{:?} names {bad}", f.at);
    assert!(!f.at.contains(&good), "{:?} spares {good}", f.at);
    let slice = |label: &str| v.breakdown.slices.iter().find(|s| s.label() == label).unwrap();
    assert!(slice(&good).suspects.is_empty(), "{:#?}", slice(&good));
    assert!(slice(&good).generation_tokens_per_s > Some(0.0));
    assert_eq!(slice(&bad).generation_tokens_per_s, Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xid_and_ecc_with_a_restart() {
    let e = engine::spawn_local(tiny()).await.unwrap();
    let addr = e.addr;
    let gpu = e.engine.clone();
    let d = dcgm(&[&e]).await;
    let load = closed(&e.url(), 4, 16, 16);
    tokio::time::sleep(crate::support::WINDOW).await;
    let targets = [e.url(), d.url.clone()];
    let c = source::client(Duration::from_secs(5)).unwrap();
    let (start, _) = source::scrape(&c, &targets).await;
    // The GPU reports XID 79 (fallen off the bus) and double-bit ECC errors; the engine process
    // dies and comes back on the same port with fresh counters, as a restarted pod does.
    gpu.apply_faults(&serde_json::from_str(r#"{"xid": 79, "ecc_dbe": 2}"#).unwrap())
        .unwrap();
    drop(load);
    e.shutdown().await;
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let e2 = engine::spawn(listener, tiny()).unwrap();
    // Traffic mostly routed away: one client where there were four, so the counters, restarted
    // from zero, stay below where they were.
    let _load = closed(&e2.url(), 1, 16, 16);
    tokio::time::sleep(crate::support::WARM_UP).await;
    let (end, errors) = source::scrape(&c, &targets).await;
    assert!(errors.is_empty(), "{errors:?}");
    let v = verdict(&start, &end);
    assert_eq!(first(&v), Some(Suspect::GpuFault));
    let ev = &v.findings[0].evidence;
    assert!(
        ev.iter().any(|e| e.stat == "restart"),
        "the restart is evidence: {ev:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_but_healthy_is_no_incident() {
    let busy = busy_but_healthy().await;
    let targets = busy.targets();
    let v = diagnose_scraped(&targets.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(v.findings.len(), 0, "no suspect when the objectives hold");
    assert_eq!(v.status, Status::BusyButHealthy);
    assert_eq!(v.exit_code(), 0);
    let _ = thresholds();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_growing_behind_a_starved_api_server() {
    let mut cfg = tiny();
    // The API server takes 50 ms of CPU per request: 20 a second, while 40 arrive and the GPU
    // needs ~5 ms for each.
    cfg.faults.frontend = Some(engine::cost::FrontendCost {
        per_request: Duration::from_millis(50),
        per_output_token: Duration::ZERO,
    });
    let e = engine::spawn_local(cfg).await.unwrap();
    let d = dcgm(&[&e]).await;
    let g = gateway(
        &[&e],
        "{ connect: 1s, first_token: 30s, stream_idle: 30s, total: 60s }",
        "{ name: interactive, concurrency: 8, queue: 200, queue_wait: 20s }",
    )
    .await;
    let _load = open(&g.url, 40.0, 16, 4);
    let v = diagnose_scraped(&[&g.url, &e.url(), &d.url]).await;
    assert_eq!(first(&v), Some(Suspect::ProcessHealth));
    let waiting = v.rows.engine.waiting.map(|l| l.end);
    assert!(
        waiting < Some(1.0),
        "the engine's own queue stays empty: {waiting:?}"
    );
}
