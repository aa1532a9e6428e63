//! Fair share between teams end to end: the issue's flood — C = 4, a deep queue, team a with 24
//! closed-loop clients and team b with 4 — through one gateway under `fifo` and `teams`, through
//! three gateways sharing C through Redis, and with weights 3:1.

use crate::shared::{Redis, gateways, metrics};
use crate::support::{Stack, chat, engine, eventually, http, tiny};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// sha256("key-a"), sha256("key-b").
const KEY_A: &str = "f10f781241e2246678b6b45c857069208152a53863e47fac33f607ab405006f4";
const KEY_B: &str = "a30534a53b23547377ddccbd1ac85a8a84c13db43493c16e55a6abc7b0eba634";

fn config(fairness: &str, weight_a: f64, redis: &str) -> String {
    format!(
        r#"
listen: 127.0.0.1:0
{redis}
routes:
  - model: chat
    upstream_model: sim
    replicas: [{{E0}}]
    timeouts: {{ connect: 1s, first_token: 30s, stream_idle: 5s, total: 60s }}
    classes:
      - name: shared
        concurrency: 4
        queue: 64
        queue_wait: 20s
        fairness: {fairness}
tenants:
  - team: a
    key_sha256: [ "{KEY_A}" ]
    weight: {weight_a}
  - team: b
    key_sha256: [ "{KEY_B}" ]
"#
    )
}

#[derive(Default, Debug)]
struct Tally {
    served: u64,
    other: u64,
    ttft: Vec<Duration>,
}

impl Tally {
    fn p95(&self) -> Duration {
        let mut t = self.ttft.clone();
        t.sort();
        t.get(t.len() * 95 / 100).copied().unwrap_or_default()
    }
}

type Tallies = Arc<Mutex<HashMap<&'static str, Tally>>>;

/// `n` closed-loop streaming clients of `team` for `run`, spread over `urls`.
fn clients(
    urls: &[String],
    team: &'static str,
    n: usize,
    run: Duration,
    tallies: &Tallies,
) -> Vec<tokio::task::JoinHandle<()>> {
    let key = format!("key-{team}");
    (0..n)
        .map(|i| {
            let url = format!("{}/v1/chat/completions", urls[i % urls.len()]);
            let (key, tallies) = (key.clone(), tallies.clone());
            tokio::spawn(async move {
                let client = http();
                let end = Instant::now() + run;
                while Instant::now() < end {
                    let start = Instant::now();
                    let r = client
                        .post(&url)
                        .bearer_auth(&key)
                        .json(&chat("chat", 60, true))
                        .send()
                        .await
                        .unwrap();
                    let status = r.status().as_u16();
                    let mut r = r;
                    let mut first = None;
                    while let Ok(Some(_)) = r.chunk().await {
                        first.get_or_insert(start.elapsed());
                    }
                    let served = {
                        let mut t = tallies.lock().unwrap();
                        let t = t.entry(team).or_default();
                        match (status, first) {
                            (200, Some(ttft)) => {
                                t.served += 1;
                                t.ttft.push(ttft);
                                true
                            }
                            _ => {
                                t.other += 1;
                                false
                            }
                        }
                    };
                    if !served {
                        // A refused client pauses before asking again, as a polite one does.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            })
        })
        .collect()
}

async fn flood(urls: &[String], urls_b: &[String], a: usize, b: usize) -> HashMap<&'static str, Tally> {
    let tallies = Tallies::default();
    let run = Duration::from_secs(8);
    let mut tasks = clients(urls, "a", a, run, &tallies);
    tasks.extend(clients(urls_b, "b", b, run, &tallies));
    for t in tasks {
        t.await.unwrap();
    }
    std::mem::take(&mut *tallies.lock().unwrap())
}

fn share(t: &HashMap<&str, Tally>, team: &str) -> f64 {
    let all: u64 = t.values().map(|t| t.served).sum();
    t.get(team).map_or(0, |t| t.served) as f64 / all.max(1) as f64
}

fn report(what: &str, t: &HashMap<&str, Tally>) -> String {
    let mut out = format!("{what}:");
    for team in ["a", "b"] {
        let x = &t[team];
        out += &format!(
            " {team} served {} ({:.1}%) other {} TTFT p95 {:?};",
            x.served,
            100.0 * share(t, team),
            x.other,
            x.p95()
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_team_no_longer_takes_the_others_turn() {
    let mut seen = Vec::new();
    for fairness in ["fifo", "teams"] {
        let stack = Stack::start(vec![engine(tiny()).await], &config(fairness, 1.0, "")).await;
        let urls = [stack.url.clone()];
        let t = flood(&urls, &urls, 24, 4).await;
        let line = report(fairness, &t);
        eprintln!("{line}");
        seen.push(line);
        let (b, pa, pb) = (share(&t, "b"), t["a"].p95(), t["b"].p95());
        if fairness == "fifo" {
            // What the issue measured: first come, first served.
            assert!(b < 0.25, "{seen:?}");
        } else {
            assert!(b >= 0.35, "{seen:?}");
            assert!(pb * 2 < pa, "b's TTFT p95 is not under half of a's: {seen:?}");
            let m = stack.metrics().await;
            let gate = stack.gateway.admission("chat", "shared").unwrap();
            assert_eq!(gate.fairness(), admission::Fairness::Teams);
            let shares = gate.shares();
            assert_eq!(shares.len(), 2, "{shares:?}");
            assert!(shares.iter().all(|s| s.service > 0.0), "{shares:?}");
            // The access log says how far back in the order each waiter joined: b's short line.
            let ahead = |team: &str| {
                let mut v: Vec<u32> = stack
                    .records()
                    .iter()
                    .filter(|r| &*r.team == team)
                    .filter_map(|r| r.queue_ahead)
                    .collect();
                v.sort();
                v.get(v.len() / 2).copied().unwrap_or_default()
            };
            assert!(ahead("b") < ahead("a"), "b {} a {}", ahead("b"), ahead("a"));
            for series in [
                r#"spillway_team_attained_service{class="shared",route="chat",team="b"}"#,
                r#"spillway_weighted_fairness_index{class="shared",route="chat"}"#,
                r#"spillway_team_service_tokens_total{class="shared",route="chat",team="a"}"#,
                r#"spillway_team_queue_wait_seconds_count{class="shared",route="chat",team="b"}"#,
            ] {
                assert!(m.contains(series), "{series} missing:\n{m}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_three_to_one_give_three_to_one_when_both_are_backlogged() {
    let stack = Stack::start(vec![engine(tiny()).await], &config("teams", 3.0, "")).await;
    let urls = [stack.url.clone()];
    let t = flood(&urls, &urls, 12, 12).await;
    let ratio = t["a"].served as f64 / t["b"].served.max(1) as f64;
    eprintln!("{} ratio {ratio:.2}", report("weights 3:1", &t));
    assert!((2.4..=3.6).contains(&ratio), "{}", report("weights 3:1", &t));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_on_one_redis_share_fairly() {
    let Some(redis) = Redis::start().await else {
        return;
    };
    let engine = engine(tiny()).await;
    let redis_section = "redis: { gateways: 3, lease_ttl: 3s, timeout: 200ms, namespace: fair }";
    let gws = gateways(3, &config("teams", 1.0, redis_section), &engine, &redis).await;
    let urls: Vec<String> = gws.iter().map(|g| g.url.clone()).collect();
    // a floods through all three gateways; b comes through one of them only.
    let t = flood(&urls, &urls[2..], 24, 4).await;
    let line = report("three gateways, teams", &t);
    eprintln!("{line}");
    assert!(share(&t, "b") >= 0.35, "{line}");
    assert!(t["b"].p95() * 2 < t["a"].p95(), "{line}");
    // Redis stayed up: the limits were shared the whole run.
    for g in &gws {
        let m = metrics(g).await;
        assert!(m.contains("spillway_limits_mode{mode=\"shared\"} 1"), "{m}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_redis_each_gateway_shares_its_own_slots_fairly() {
    let Some(mut redis) = Redis::start().await else {
        return;
    };
    let engine = engine(tiny()).await;
    // C = 12 shared; each gateway's share without Redis is 4.
    let redis_section = "redis: { gateways: 3, lease_ttl: 3s, timeout: 100ms, namespace: fair-out }";
    let yaml = config("teams", 1.0, redis_section).replace("concurrency: 4", "concurrency: 12");
    let gws = gateways(3, &yaml, &engine, &redis).await;
    redis.kill().await;
    let one = [gws[0].url.clone()];
    // The first request finds Redis gone and turns the gateway to its share.
    let t = flood(&one, &one, 24, 4).await;
    let line = report("Redis gone, one gateway on its share", &t);
    eprintln!("{line}");
    assert!(
        metrics(&gws[0])
            .await
            .contains("spillway_limits_mode{mode=\"local\"} 1"),
        "{line}"
    );
    assert!(share(&t, "b") >= 0.35, "{line}");
    assert!(t["b"].p95() * 2 < t["a"].p95(), "{line}");
}

/// Sends one streamed request of `team` and reads it to the end: (status, body).
fn send(url: &str, team: &str, max_tokens: u32) -> tokio::task::JoinHandle<(u16, String)> {
    let (url, key) = (format!("{url}/v1/chat/completions"), format!("key-{team}"));
    tokio::spawn(async move {
        let r = http()
            .post(url)
            .bearer_auth(key)
            .json(&chat("chat", max_tokens, true))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.text().await.unwrap())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_shared_queue_pushes_out_the_newest_waiter_of_the_team_holding_it() {
    let Some(redis) = Redis::start().await else {
        return;
    };
    let engine = engine(tiny()).await;
    let redis_section = "redis: { gateways: 2, lease_ttl: 3s, timeout: 200ms, namespace: fair-full }";
    let yaml = config("teams", 1.0, redis_section)
        .replace("concurrency: 4", "concurrency: 1")
        .replace("queue: 64", "queue: 2");
    let gws = gateways(2, &yaml, &engine, &redis).await;
    let gate = |i: usize| gws[i].gateway.admission("chat", "shared").unwrap();
    // a holds the one slot with a long stream and fills the queue through both gateways.
    let holder = send(&gws[0].url, "a", 1500);
    assert!(eventually(Duration::from_secs(5), || gate(0).in_flight() == 1).await);
    let older = send(&gws[0].url, "a", 8);
    assert!(eventually(Duration::from_secs(5), || gate(0).queued() == 1).await);
    let newest = send(&gws[1].url, "a", 8);
    assert!(eventually(Duration::from_secs(5), || gate(1).queued() == 1).await);
    // b holds none of the full queue: a's newest waiter makes room for it, on the other gateway.
    let b = send(&gws[0].url, "b", 8);
    let (status, body) = newest.await.unwrap();
    assert_eq!(status, 503, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(
        v["error"]["message"].as_str().unwrap().contains("queue"),
        "{body}"
    );
    for (what, r) in [("holder", holder), ("older", older), ("b", b)] {
        let (status, body) = r.await.unwrap();
        assert_eq!(status, 200, "{what}: {body}");
    }
}

/// With objectives (`balance: slo` reads them), the queue shared through Redis serves the
/// earliest deadline first: a tight request that came last goes before a loose one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_queue_serves_the_earliest_deadline_first() {
    let Some(redis) = Redis::start().await else {
        return;
    };
    let engine = engine(tiny()).await;
    let redis_section = "redis: { gateways: 1, lease_ttl: 3s, timeout: 200ms, namespace: edf }";
    let yaml = config("fifo", 1.0, redis_section)
        .replace("concurrency: 4", "concurrency: 1")
        .replace("    timeouts:", "    balance: slo\n    timeouts:");
    let gws = gateways(1, &yaml, &engine, &redis).await;
    let url = format!("{}/v1/chat/completions", gws[0].url);
    let gate = gws[0].gateway.admission("chat", "shared").unwrap();
    let send = |objective_ms: &'static str, max_tokens: u32| {
        let url = url.clone();
        tokio::spawn(async move {
            let r = http()
                .post(url)
                .bearer_auth("key-a")
                .header("x-spillway-slo-ttft-ms", objective_ms)
                .json(&chat("chat", max_tokens, true))
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let _ = r.text().await;
            (status, tokio::time::Instant::now())
        })
    };
    let holder = send("20000", 1500);
    assert!(eventually(Duration::from_secs(5), || gate.in_flight() == 1).await);
    let loose = send("15000", 8);
    assert!(eventually(Duration::from_secs(5), || gate.queued() == 1).await);
    let tight = send("3000", 8);
    assert!(eventually(Duration::from_secs(5), || gate.queued() == 2).await);
    holder.await.unwrap();
    let (loose, tight) = (loose.await.unwrap(), tight.await.unwrap());
    assert_eq!((loose.0, tight.0), (200, 200));
    assert!(
        tight.1 < loose.1,
        "the tight request, queued last, was served first"
    );
}
