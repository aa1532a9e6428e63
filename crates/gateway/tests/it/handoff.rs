//! The handoff of a freed slot through a real `redis-server`: granted inside the release to the
//! next waiter in order and told to its gateway alone, so Redis's work per served request does not
//! grow with the queue; a slow Redis (behind a delaying proxy) is not a Redis down.

use crate::shared::{Gw, Redis, gateways, metrics};
use crate::support::{chat, engine, http, read_stream, tiny};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

const CLASS: &str = r#"
listen: 127.0.0.1:0
redis: { gateways: G, lease_ttl: 10s, timeout: 100ms, namespace: NS }
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}]
    timeouts: { connect: 1s, first_token: 30s, stream_idle: 10s, total: 60s }
    classes:
      - name: interactive
        concurrency: C
        queue: 256
        queue_wait: 10s
"#;

fn config(namespace: &str, gateways: usize, c: usize) -> String {
    CLASS
        .replace("NS", namespace)
        .replace("G,", &format!("{gateways},"))
        .replace("concurrency: C", &format!("concurrency: {c}"))
}

/// One streamed request read whole: its status.
async fn one(url: &str, max_tokens: u32, priority: &str) -> u16 {
    match http()
        .post(format!("{url}/v1/chat/completions"))
        .header("x-spillway-priority", priority)
        .json(&chat("chat", max_tokens, true))
        .send()
        .await
    {
        Ok(r) => {
            let status = r.status().as_u16();
            let _ = read_stream(r).await;
            status
        }
        Err(_) => 0,
    }
}

/// Script calls Redis has run since its stats were last reset.
async fn script_calls(redis: &Redis) -> u64 {
    let mut conn = redis.conn().await;
    let text: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            let calls = l.split("calls=").nth(1)?.split(',').next()?;
            calls.parse::<u64>().ok()
        })
        .sum()
}

/// The value of a counter line of `g`'s metrics, summed over the lines that contain `matching`.
async fn counter(g: &Gw, name: &str, matching: &str) -> u64 {
    metrics(g)
        .await
        .lines()
        .filter(|l| l.starts_with(name) && l.contains(matching))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// The most slots Redis held at once, sampled until aborted.
fn watch_slots(redis: &Redis, key: String, peak: Arc<AtomicUsize>) -> tokio::task::JoinHandle<()> {
    let url = redis.url();
    tokio::spawn(async move {
        let mut conn = redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        loop {
            let n: usize = redis::cmd("ZCARD")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .unwrap_or(0);
            peak.fetch_max(n, Ordering::Relaxed);
            // The sampling interval of the peak, not a wait.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
}

/// 60 clients over three gateways, C = 4: about 56 wait at any time. Every freed slot goes to one
/// waiter, whose gateway alone is told, so Redis runs about two scripts per served request (its
/// admission and its release) plus each gateway's renewals and backstop polls — not one per
/// waiter per release, as when every waiter was woken to ask (the code before this handoff ran
/// 50–70 per served request here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_waiters_on_three_gateways_hold_c_and_cost_redis_two_calls_per_request() {
    let Some(redis) = Redis::start().await else { return };
    let engine = engine(tiny()).await;
    let gws = gateways(3, &config("herd", 3, 4), &engine, &redis).await;
    let mut conn = redis.conn().await;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    let peak = Arc::new(AtomicUsize::new(0));
    let watcher = watch_slots(
        &redis,
        "spillway:{herd}:slots:chat:interactive".into(),
        peak.clone(),
    );
    let clients: Vec<_> = (0..60)
        .map(|i| {
            let url = gws[i % 3].url.clone();
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                for _ in 0..3 {
                    statuses.push(one(&url, 8, "standard").await);
                }
                statuses
            })
        })
        .collect();
    let mut served = 0;
    for c in clients {
        for status in c.await.unwrap() {
            assert_eq!(status, 200, "every request is served within its queue_wait");
            served += 1;
        }
    }
    watcher.abort();
    let calls = script_calls(&redis).await;
    let per_request = calls as f64 / f64::from(served);
    eprintln!("{calls} script calls for {served} served: {per_request:.2} per request");
    assert!(
        per_request <= 4.0,
        "{per_request:.2} script calls per served request ({calls} for {served})"
    );
    let mut failed = 0;
    for g in &gws {
        failed += counter(g, "spillway_redis_calls_total{", "outcome=\"error\"").await
            + counter(g, "spillway_redis_calls_total{", "outcome=\"timeout\"").await;
    }
    // Waiters handed a slot by a release count from that release to their first attempt
    // upstream: most of the 180 requests waited.
    let (mut handed, mut handed_fast) = (0, 0);
    for g in &gws {
        handed += counter(g, "spillway_redis_grant_to_upstream_seconds_count", "").await;
        handed_fast += counter(
            g,
            "spillway_redis_grant_to_upstream_seconds_bucket{",
            "le=\"0.025\"",
        )
        .await;
    }
    eprintln!("{handed} waiters handed a slot, {handed_fast} of them upstream within 25 ms of the release");
    assert!(handed >= 60, "waiters handed a slot are counted: {handed}");
    let bound = if failed == 0 { 4 } else { 4 + 1 };
    assert!(
        peak.load(Ordering::Relaxed) <= 4,
        "Redis held {} slots",
        peak.load(Ordering::Relaxed)
    );
    assert!(
        engine.engine.snapshot().max_running <= bound,
        "the engine ran {} at once ({failed} calls failed)",
        engine.engine.snapshot().max_running
    );
}

/// Critical waiters come before standard ones whichever gateway they wait in: the release hands
/// the slot to the head of the critical lane.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_critical_waiter_on_another_gateway_gets_the_freed_slot_first() {
    let Some(redis) = Redis::start().await else { return };
    let engine = engine(tiny()).await;
    let gws = gateways(2, &config("lanes", 2, 1), &engine, &redis).await;
    let holder = http()
        .post(format!("{}/v1/chat/completions", gws[0].url))
        .json(&chat("chat", 1500, true))
        .send()
        .await
        .unwrap();
    assert_eq!(holder.status(), 200);
    let done = |url: String, priority: &'static str| {
        tokio::spawn(async move {
            let status = one(&url, 8, priority).await;
            (status, Instant::now())
        })
    };
    let queued = |n: usize| {
        let redis_url = redis.url();
        async move {
            let conn = redis::Client::open(redis_url)
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            testkit::poll(
                Duration::from_secs(5),
                || {
                    let mut conn = conn.clone();
                    async move {
                        redis::cmd("ZCARD")
                            .arg("spillway:{lanes}:queue:chat:interactive")
                            .query_async::<usize>(&mut conn)
                            .await
                            .unwrap()
                    }
                },
                |q| *q == n,
            )
            .await
                == n
        }
    };
    let standard = done(gws[0].url.clone(), "standard");
    assert!(queued(1).await, "the standard request waits");
    let critical = done(gws[1].url.clone(), "critical");
    assert!(queued(2).await, "the critical request waits too");
    // The client leaves: the holder's slot is released, and handed on.
    drop(holder);
    let (standard, critical) = (standard.await.unwrap(), critical.await.unwrap());
    assert_eq!((standard.0, critical.0), (200, 200));
    assert!(
        critical.1 < standard.1,
        "the critical request, queued last, was served first"
    );
}

/// A slot whose lease expired (its gateway died) is handed on by the next call that sees it
/// free — here the waiting gateway's backstop poll, as nothing else runs — and a waiter of a dead
/// gateway ahead in line is dropped, not granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_goes_to_the_next_live_waiter() {
    let Some(redis) = Redis::start().await else { return };
    let engine = engine(tiny()).await;
    let gws = gateways(1, &config("dead", 1, 1), &engine, &redis).await;
    let mut conn = redis.conn().await;
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let now = secs * 1000 + micros / 1000;
    let dead = "00000000deadbeef";
    let (slots, queue, until) = (
        "spillway:{dead}:slots:chat:interactive",
        "spillway:{dead}:queue:chat:interactive",
        "spillway:{dead}:until:chat:interactive",
    );
    // A dead gateway's slot, renewed for the last time, and its waiter first in line.
    let _: () = redis::pipe()
        .zadd(slots, format!("{dead}:1:0:"), now + 1500)
        .zadd(queue, format!("{dead}:2:0:"), 1e13 + (now - 1000) as f64)
        .hset(until, format!("{dead}:2:0:"), now + 60_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    let sent = Instant::now();
    let status = one(&gws[0].url, 8, "standard").await;
    let took = sent.elapsed();
    assert_eq!(status, 200, "served once the dead gateway's lease expired");
    assert!(
        took >= Duration::from_millis(1000),
        "it waited for the lease to expire ({took:?})"
    );
    let (left, deadline): (usize, Option<u64>) = redis::pipe()
        .zcard(queue)
        .hget(until, format!("{dead}:2:0:"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        (left, deadline),
        (0, None),
        "the dead gateway's waiter left the line"
    );
}

/// A TCP proxy in front of Redis that holds every chunk Redis sends for a random 20–200 ms (in
/// order): each answer and message comes that much later.
async fn delaying_proxy(redis_port: u16) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(("127.0.0.1", redis_port)).await else {
                    return;
                };
                let (mut client_read, client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
                });
                let (tx, mut rx) = tokio::sync::mpsc::channel::<(Instant, Vec<u8>)>(4096);
                tokio::spawn(async move {
                    let mut client_write = client_write;
                    while let Some((due, bytes)) = rx.recv().await {
                        tokio::time::sleep_until(due).await;
                        if client_write.write_all(&bytes).await.is_err() {
                            return;
                        }
                    }
                });
                let mut last = Instant::now();
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = match server_read.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    let delay = Duration::from_millis(rand::random_range(20..=200));
                    last = last.max(Instant::now() + delay);
                    if tx.send((last, buf[..n].to_vec())).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// Redis 20–200 ms away (every call late against `timeout: 100ms`): the three gateways stay in
/// shared mode the whole time, C holds, and no request waits longer than its queue budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_redis_keeps_the_fleet_shared() {
    let Some(redis) = Redis::start().await else { return };
    let engine = engine(tiny()).await;
    let proxy = delaying_proxy(redis.port()).await;
    let yaml = config("slow", 3, 4).replace("queue_wait: 10s", "queue_wait: 3s");
    let mut gws = Vec::new();
    for _ in 0..3 {
        let options = testkit::GatewayOptions {
            replicas: vec![engine.url()],
            env: vec![("SPILLWAY_REDIS_URL".into(), format!("redis://127.0.0.1:{proxy}/"))],
            ..testkit::GatewayOptions::default()
        };
        gws.push(testkit::Gateway::start_with(&yaml, options).await);
    }
    for g in &gws {
        assert!(
            crate::support::eventually(Duration::from_secs(10), || g.gateway.limits_shared()
                == Some(true))
            .await,
            "each gateway reaches Redis through the proxy"
        );
    }
    // Each gateway's switch to shared at start-up is counted: the run is counted from here.
    let mut changes_before = 0;
    for g in &gws {
        changes_before += counter(g, "spillway_limits_mode_changes_total{", "").await;
    }
    let left_shared = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (left, stop) = (left_shared.clone(), stop.clone());
        let gateways: Vec<_> = gws.iter().map(|g| g.gateway.clone()).collect();
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if gateways.iter().any(|g| g.limits_shared() != Some(true)) {
                    left.store(true, Ordering::Relaxed);
                }
                // The sampling interval of the mode, not a wait.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let started = Instant::now();
    let clients: Vec<_> = (0..12)
        .map(|i| {
            let (url, stop) = (gws[i % 3].url.clone(), stop.clone());
            tokio::spawn(async move {
                let mut out = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let sent = Instant::now();
                    let status = one(&url, 8, "standard").await;
                    out.push((status, sent.elapsed()));
                }
                out
            })
        })
        .collect();
    // The length of the slow period under load.
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.store(true, Ordering::Relaxed);
    let mut answers = Vec::new();
    for c in clients {
        answers.extend(c.await.unwrap());
    }
    watcher.await.unwrap();
    let ran = started.elapsed();
    let mut changes = 0;
    let mut late = 0;
    for g in &gws {
        changes += counter(g, "spillway_limits_mode_changes_total{", "").await;
        late += counter(g, "spillway_redis_calls_total{", "outcome=\"late\"").await;
    }
    let served = answers.iter().filter(|(s, _)| *s == 200).count();
    let longest = answers.iter().map(|(_, t)| *t).max().unwrap_or_default();
    eprintln!(
        "{served} of {} served in {ran:?}, {late} calls late, {} mode changes, longest answer {longest:?}, engine peak {}",
        answers.len(),
        changes - changes_before,
        engine.engine.snapshot().max_running
    );
    assert!(late > 0, "the proxy made calls late");
    assert!(
        !left_shared.load(Ordering::Relaxed),
        "no gateway left shared mode"
    );
    assert_eq!(
        changes - changes_before,
        0,
        "spillway_limits_mode_changes_total does not move"
    );
    assert!(served >= 20, "service goes on: {served} served");
    for (status, took) in &answers {
        assert!(
            [200, 503].contains(status),
            "an answer or a fast refusal: {status}"
        );
        // Its queue budget (3 s), a stream of 8 tokens and a release's round trip: generous.
        assert!(*took <= Duration::from_secs(5), "a request took {took:?}");
    }
    assert!(
        engine.engine.snapshot().max_running <= 4,
        "C held: the engine ran {} at once",
        engine.engine.snapshot().max_running
    );
    drop(gws);
}
