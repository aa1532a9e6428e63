//! Every scripted fault does what it says: through the handle on a paused clock, and over HTTP.

use crate::support::{MODEL, eventually, finish, http, start, submit, tiny};
use spillway_engine::{Engine, FaultPatch, FinishReason};
use std::time::Duration;

fn patch(json: &str) -> FaultPatch {
    serde_json::from_str(json).expect("valid patch")
}

#[tokio::test(start_paused = true)]
async fn stall_after_k_tokens_holds_the_slot_until_the_client_leaves() {
    let (engine, _steps) = Engine::start(tiny()).unwrap();
    engine
        .apply_faults(&patch(r#"{"stall_after_tokens": 3}"#))
        .unwrap();
    let g = submit(&engine, 10, 100);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(g.choices[0].borrow().tokens, 3);
    assert_eq!(g.choices[0].borrow().finish, None);
    assert_eq!(engine.snapshot().running, 1, "a stalled request keeps its slot");
    drop(g);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(engine.snapshot().aborts, 1);
    assert_eq!(engine.snapshot().running, 0);
}

#[tokio::test(start_paused = true)]
async fn never_first_token_sends_nothing() {
    let mut cfg = tiny();
    cfg.faults.stall_after_tokens = Some(0);
    let (engine, _steps) = Engine::start(cfg).unwrap();
    let g = submit(&engine, 10, 100);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(*g.choices[0].borrow(), Default::default());
    engine.apply_faults(&patch(r#"{"clear": true}"#)).unwrap();
    let mut g2 = submit(&engine, 10, 5);
    assert_eq!(
        finish(&mut g2).await,
        5,
        "requests after the fault is cleared are served"
    );
}

#[tokio::test(start_paused = true)]
async fn fail_every_nth_request_with_a_status() {
    let (engine, _steps) = Engine::start(tiny()).unwrap();
    engine
        .apply_faults(&patch(r#"{"fail_every": {"nth": 3, "status": 503}}"#))
        .unwrap();
    let failed: Vec<u16> = (0..9)
        .filter_map(|_| {
            engine
                .submit(spillway_engine::GenerateParams {
                    prompt: vec![1; 4],
                    max_tokens: Some(1),
                    n: 1,
                    ignore_eos: true,
                })
                .err()
                .map(|e| e.status)
        })
        .collect();
    assert_eq!(failed, vec![503, 503, 503]);
}

#[tokio::test(start_paused = true)]
async fn slow_factor_stretches_every_step() {
    let (engine, _steps) = Engine::start(tiny()).unwrap();
    let mut g = submit(&engine, 100, 20);
    finish(&mut g).await;
    engine.apply_faults(&patch(r#"{"slow_factor": 2.0}"#)).unwrap();
    let mut g = submit(&engine, 100, 20);
    finish(&mut g).await;
    engine.apply_faults(&patch(r#"{"slow_factor": 1.0}"#)).unwrap();
    let mut g = submit(&engine, 100, 20);
    finish(&mut g).await;
    let r = engine.records();
    let (healthy, slow, back) = (r[0].e2e, r[1].e2e, r[2].e2e);
    assert!(
        slow.abs_diff(healthy * 2) < Duration::from_micros(5),
        "{healthy:?} ×2 vs {slow:?}"
    );
    assert!(
        back.abs_diff(healthy) < Duration::from_micros(5),
        "{healthy:?} vs {back:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn slow_start_answers_503_until_loaded() {
    let (engine, _steps) = Engine::start(tiny()).unwrap();
    engine.apply_faults(&patch(r#"{"loading": "2s"}"#)).unwrap();
    assert!(!engine.healthy());
    let err = engine
        .submit(spillway_engine::GenerateParams {
            prompt: vec![1; 4],
            max_tokens: Some(1),
            n: 1,
            ignore_eos: true,
        })
        .unwrap_err();
    assert_eq!(err.status, 503);
    tokio::time::sleep(Duration::from_millis(2001)).await;
    assert!(engine.healthy());
    let mut g = submit(&engine, 4, 2);
    assert_eq!(finish(&mut g).await, 2);
}

#[tokio::test(start_paused = true)]
async fn crash_loses_everything_and_restart_serves_again() {
    let (engine, _steps) = Engine::start(tiny()).unwrap();
    let mut g = submit(&engine, 10, 1000);
    g.choices[0].wait_for(|p| p.tokens > 2).await.unwrap();
    engine.crash();
    let p = *g.choices[0].wait_for(|p| p.finish.is_some()).await.unwrap();
    assert_eq!(p.finish, Some(FinishReason::Error));
    assert!(!engine.healthy());
    assert_eq!(submit_err(&engine), 503);
    engine.restart();
    let mut g = submit(&engine, 10, 3);
    assert_eq!(finish(&mut g).await, 3);
}

fn submit_err(engine: &Engine) -> u16 {
    engine
        .submit(spillway_engine::GenerateParams {
            prompt: vec![1; 4],
            max_tokens: Some(1),
            n: 1,
            ignore_eos: true,
        })
        .unwrap_err()
        .status
}

async fn post_faults(url: &str, body: &str) -> reqwest::Response {
    http()
        .post(format!("{url}/admin/faults"))
        .body(body.to_owned())
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn refused_connections_over_http_and_back() {
    let e = start(tiny()).await;
    let url = e.url();
    let r = post_faults(&url, r#"{"refuse_connections": true}"#).await;
    assert_eq!(r.status(), 200);
    let refused = eventually(Duration::from_secs(5), || {
        std::net::TcpStream::connect(e.addr).is_err()
    })
    .await;
    assert!(refused, "connections are refused");
    e.engine
        .apply_faults(&patch(r#"{"refuse_connections": false}"#))
        .unwrap();
    let back = eventually(Duration::from_secs(5), || {
        std::net::TcpStream::connect(e.addr).is_ok()
    })
    .await;
    assert!(back, "the same port serves again");
    let r = http().get(format!("{url}/health")).send().await.unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn crash_over_http_cuts_open_streams() {
    let e = start(tiny()).await;
    let body = serde_json::json!({"model": MODEL, "prompt": "x", "max_tokens": 3000, "stream": true});
    let mut resp = http()
        .post(format!("{}/v1/completions", e.url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.chunk().await.unwrap().is_some());
    let r = post_faults(&e.url(), r#"{"crash": true}"#).await;
    assert_eq!(r.status(), 200);
    let mut cut = false;
    loop {
        match resp.chunk().await {
            Ok(Some(_)) => continue,
            Ok(None) => break,
            Err(_) => {
                cut = true;
                break;
            }
        }
    }
    assert!(cut, "the stream ends with a transport error, not a clean end");
    let refused = eventually(Duration::from_secs(5), || {
        std::net::TcpStream::connect(e.addr).is_err()
    })
    .await;
    assert!(refused, "a crashed replica refuses connections");
}

#[tokio::test]
async fn a_bad_fault_patch_is_refused_and_changes_nothing() {
    let e = start(tiny()).await;
    for bad in [
        r#"{"slow_factor": 0}"#,
        r#"{"fail_every": {"nth": 0, "status": 503}}"#,
        r#"{"nope": 1}"#,
        "{",
    ] {
        let r = post_faults(&e.url(), bad).await;
        assert_eq!(r.status(), 400, "{bad}");
        let v: serde_json::Value = r.json().await.unwrap();
        assert!(v["error"]["message"].is_string());
    }
    assert_eq!(e.engine.faults(), spillway_engine::Faults::default());
    let v: serde_json::Value = http()
        .get(format!("{}/admin/faults", e.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["slow_factor"], 1.0);
}

#[tokio::test(start_paused = true)]
async fn a_starved_api_server_takes_requests_in_one_at_a_time_behind_its_tokens() {
    let (engine, _steps) = Engine::start(tiny()).unwrap();
    let t0 = tokio::time::Instant::now();
    engine.frontend_admit().await;
    assert_eq!(
        t0.elapsed(),
        Duration::ZERO,
        "the presets' API server costs nothing"
    );
    engine
        .apply_faults(&patch(
            r#"{"frontend": {"per_request": "10ms", "per_output_token": "1ms"}}"#,
        ))
        .unwrap();
    let admitted: Vec<_> = (0..4)
        .map(|_| {
            let engine = engine.clone();
            tokio::spawn(async move {
                engine.frontend_admit().await;
                t0.elapsed()
            })
        })
        .collect();
    let mut at = Vec::new();
    for a in admitted {
        at.push(a.await.unwrap());
    }
    at.sort();
    let ms: Vec<u128> = at.iter().map(|d| d.as_millis()).collect();
    assert_eq!(ms, [10, 20, 30, 40], "serial: each waits for the ones before it");
    // Tokens written to streams hold the server too: 8 streams' tokens (8 ms a step) outrun the
    // ~1.2 ms steps, so a request arriving behind them waits for that backlog, then its own 10 ms.
    let gens: Vec<_> = (0..8).map(|_| submit(&engine, 10, 20)).collect();
    tokio::time::sleep(Duration::from_millis(10)).await;
    let before = tokio::time::Instant::now();
    engine.frontend_admit().await;
    let waited = before.elapsed();
    assert!(waited >= Duration::from_millis(40), "{waited:?}");
    drop(gens);
    engine.apply_faults(&patch(r#"{"frontend": null}"#)).unwrap();
    let before = tokio::time::Instant::now();
    engine.frontend_admit().await;
    assert_eq!(before.elapsed(), Duration::ZERO, "cleared");
}
