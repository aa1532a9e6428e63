//! Admission end to end: C, Q and Wq hold under overload, classes isolate, sheddable goes first,
//! and the slot is held until the stream ends.

use crate::support::{Stack, chat, engine, eventually, http, read_stream, tiny};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tokio::time::Instant;

const OVERLOAD: &str = r#"
listen: 127.0.0.1:0
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}]
    timeouts: { connect: 1s, first_token: 10s, stream_idle: 5s, total: 60s }
    classes:
      - name: interactive
        concurrency: 4
        queue: 4
        queue_wait: 1s
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_never_exceeds_c_or_q_and_rejects_fast_with_retry_after() {
    let stack = Stack::start(vec![engine(tiny()).await], OVERLOAD).await;
    let gate = stack.gateway.admission("chat", "interactive").unwrap();
    let max_queued = Arc::new(AtomicU32::new(0));
    let sampler = {
        let (gate, max_queued) = (gate.clone(), max_queued.clone());
        tokio::spawn(async move {
            loop {
                max_queued.fetch_max(gate.queued(), Ordering::Relaxed);
                // The sampling interval of the peak, not a wait.
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
        })
    };
    // 10 × (C + Q) clients at once, each streaming 60 tokens (about 70 ms on the tiny preset).
    let clients: Vec<_> = (0..80)
        .map(|_| {
            let url = format!("{}/v1/chat/completions", stack.url);
            tokio::spawn(async move {
                let start = Instant::now();
                let r = http()
                    .post(url)
                    .json(&chat("chat", 60, true))
                    .send()
                    .await
                    .unwrap();
                let head = start.elapsed();
                let status = r.status().as_u16();
                let retry_after = r
                    .headers()
                    .get("retry-after")
                    .map(|v| v.to_str().unwrap().to_owned());
                let body = r.text().await.unwrap();
                (status, head, retry_after, body)
            })
        })
        .collect();
    let mut ok = 0;
    let mut rejected = 0;
    for c in clients {
        let (status, head, retry_after, body) = c.await.unwrap();
        match status {
            200 => {
                ok += 1;
                assert!(body.ends_with("data: [DONE]\n\n"), "a complete stream");
            }
            503 => {
                rejected += 1;
                let after: u64 = retry_after
                    .expect("every rejection carries Retry-After")
                    .parse()
                    .unwrap();
                assert!((1..=60).contains(&after));
                let v: serde_json::Value = serde_json::from_str(&body).unwrap();
                let code = v["error"]["code"].as_str().unwrap().to_owned();
                assert!(
                    ["queue_full", "queue_timeout", "predicted_wait"].contains(&code.as_str()),
                    "{code}"
                );
                if code == "queue_full" || code == "predicted_wait" {
                    assert!(
                        head < Duration::from_millis(500),
                        "a full queue answers at once, took {head:?}"
                    );
                }
                assert!(v["error"]["message"].as_str().unwrap().contains("at capacity"));
            }
            s => panic!("unexpected status {s}: {body}"),
        }
    }
    sampler.abort();
    assert_eq!(ok + rejected, 80);
    assert!(ok >= 8, "at least C + Q were served, got {ok}");
    let truth = stack.engines[0].engine.snapshot();
    assert!(
        truth.max_running <= 4,
        "the engine saw {} running at once; C = 4",
        truth.max_running
    );
    assert!(
        max_queued.load(Ordering::Relaxed) <= 4,
        "queue reached {}",
        max_queued.load(Ordering::Relaxed)
    );
    for r in stack.records().iter().filter(|r| r.status == 200) {
        assert!(
            r.queue_ms.unwrap() <= 1000.0 + 50.0,
            "admitted after waiting {:?} ms (Wq = 1 s)",
            r.queue_ms
        );
    }
    // Every line is a trace record, the refused ones too: when, which model, what was asked.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(eventually(Duration::from_secs(1), || stack.records().len() == 80).await);
    let records = stack.records();
    assert!(records.iter().any(|r| r.status == 503));
    let prompt_ids = &records[0].hash_ids;
    assert_eq!(prompt_ids.len(), 1, "one partial block of a short prompt");
    for r in &records {
        let at = r.arrival_ms.expect("arrival time");
        assert!(
            at <= now_ms && now_ms - at < 120_000,
            "arrived at {at}, now {now_ms}"
        );
        assert_eq!(r.model.as_deref(), Some("chat"));
        assert_eq!(r.max_tokens, Some(60));
        assert_eq!(r.tokens_in, records[0].tokens_in);
        assert!(r.tokens_in.is_some());
        assert_eq!(r.priority, Some("standard"));
        assert_eq!(&r.hash_ids, prompt_ids, "the same prompt, the same block ids");
    }
    assert_eq!(gate.in_flight(), 0, "every slot came back");
}

const CLASSES: &str = r#"
listen: 127.0.0.1:0
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}]
    timeouts: { connect: 1s, first_token: 10s, stream_idle: 5s, total: 60s }
    classes:
      - name: interactive
        concurrency: 8
        queue: 8
        queue_wait: 2s
      - name: long
        when: { max_tokens_over: 500 }
        concurrency: 2
        queue: 2
        queue_wait: 200ms
      - name: batch
        when: { header: { name: x-workload, value: batch } }
        concurrency: 1
        queue: 2
        queue_wait: 3s
"#;

async fn ttft(url: &str) -> Duration {
    let r = http()
        .post(format!("{url}/v1/chat/completions"))
        .json(&chat("chat", 5, true))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (_, first, _) = read_stream(r).await;
    first.unwrap()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flooding_the_long_class_leaves_interactive_ttft_alone() {
    let mut cfg = tiny();
    cfg.max_num_seqs = 16;
    let stack = Stack::start(vec![engine(cfg).await], CLASSES).await;
    let mut unloaded = Vec::new();
    for _ in 0..7 {
        unloaded.push(ttft(&stack.url).await);
    }
    let flood: Vec<_> = (0..40)
        .map(|_| {
            let url = format!("{}/v1/chat/completions", stack.url);
            // Each flooding client reads its stream to the end: a client that hung up would have
            // its engine sequence aborted a step later, briefly overlapping the next admitted one.
            tokio::spawn(async move {
                let r = http()
                    .post(url)
                    .json(&chat("chat", 2000, true))
                    .send()
                    .await
                    .unwrap();
                let status = r.status().as_u16();
                read_stream(r).await;
                status
            })
        })
        .collect();
    let long = stack.gateway.admission("chat", "long").unwrap();
    assert!(eventually(Duration::from_secs(5), || long.in_flight() == 2).await);
    let mut loaded = Vec::new();
    for _ in 0..7 {
        loaded.push(ttft(&stack.url).await);
    }
    let (u, l) = (median(unloaded), median(loaded));
    assert!(
        l <= u * 3 + Duration::from_millis(25),
        "interactive TTFT p50 {u:?} unloaded, {l:?} while long floods"
    );
    let statuses: Vec<u16> = futures::future::join_all(flood)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert!(
        statuses.iter().filter(|s| **s == 503).count() >= 30,
        "the long class shed its flood: {statuses:?}"
    );
    assert!(
        stack.engines[0].engine.snapshot().max_running <= 2 + 1,
        "long never took more than its C"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sheddable_is_shed_before_standard_waits_and_the_header_picks_a_class() {
    let stack = Stack::start(vec![engine(tiny()).await], CLASSES).await;
    let batch = |prio: &'static str, tokens: u32| {
        let url = format!("{}/v1/chat/completions", stack.url);
        async move {
            http()
                .post(url)
                .header("x-workload", "batch")
                .header("x-spillway-priority", prio)
                .json(&chat("chat", tokens, true))
                .send()
                .await
                .unwrap()
        }
    };
    let holder = batch("standard", 300).await;
    assert_eq!(holder.status(), 200);
    let gate = stack.gateway.admission("chat", "batch").unwrap();
    assert_eq!(gate.in_flight(), 1, "the header chose the batch class");
    let t = Instant::now();
    let shed = batch("sheddable", 5).await;
    assert_eq!(shed.status(), 503);
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "shed without waiting (Wq is 3 s)"
    );
    let v: serde_json::Value = shed.json().await.unwrap();
    assert_eq!(v["error"]["code"], "shed");
    let waiting = tokio::spawn(batch("standard", 5));
    assert!(
        eventually(Duration::from_secs(2), || gate.queued() == 1).await,
        "standard waits in the queue"
    );
    let (_, _, clean) = read_stream(holder).await;
    assert!(clean);
    let served = waiting.await.unwrap();
    assert_eq!(served.status(), 200, "the waiting standard request got the slot");
    let bad = batch("urgent", 5).await;
    assert_eq!(bad.status(), 400, "an unknown priority is refused, not ignored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slot_is_held_until_the_stream_ends() {
    let stack = Stack::start(vec![engine(tiny()).await], OVERLOAD).await;
    let gate = stack.gateway.admission("chat", "interactive").unwrap();
    let mut r = stack.stream("chat", 400).await;
    assert_eq!(r.status(), 200);
    r.chunk().await.unwrap();
    assert_eq!(
        gate.in_flight(),
        1,
        "headers are out but the stream is not: the slot is held"
    );
    let (_, _, clean) = read_stream(r).await;
    assert!(clean);
    assert!(
        eventually(Duration::from_secs(1), || gate.in_flight() == 0).await,
        "released at the end of the body"
    );
}

/// The engine can run 4 sequences at once (its knee, by construction); the class starts at C = 32
/// with a TTFT objective that a request waiting in the engine's own queue misses. Driven by 24
/// closed-loop clients, the adaptive C comes down to the knee's neighbourhood and the gateway's
/// queue, not the engine's, holds the rest. Timing-bound: with the other tests of this binary on
/// the same two cores, TTFTs passed the 12 ms objective at any C and it settled at 1, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "timing-bound: run alone by scripts/test.sh"]
async fn adaptive_concurrency_settles_near_the_engines_knee() {
    let mut cfg = tiny();
    cfg.max_num_seqs = 4;
    let yaml = r#"
listen: 127.0.0.1:0
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}]
    classes:
      - name: interactive
        concurrency: { adaptive: { min: 1, max: 32, initial: 32, interval: 300ms } }
        queue: 64
        queue_wait: 10s
        slo: { ttft: 12ms }
"#;
    let stack = Stack::start(vec![engine(cfg).await], yaml).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..24)
        .map(|_| {
            let (url, stop) = (format!("{}/v1/chat/completions", stack.url), stop.clone());
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let r = http()
                        .post(&url)
                        .json(&chat("chat", 40, true))
                        .send()
                        .await
                        .unwrap();
                    read_stream(r).await;
                }
            })
        })
        .collect();
    // The settling time is what this test measures: C is read after 6 s of load, not waited for.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let gate = stack.gateway.admission("chat", "interactive").unwrap();
    let c = gate.limits().concurrency;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in clients {
        t.await.unwrap();
    }
    println!("adaptive C after 6 s: {c} (engine knee: 4)");
    assert!((2..=8).contains(&c), "C settled at {c}, the knee is 4");
}
