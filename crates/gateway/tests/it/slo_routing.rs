//! Per-request SLO routing (`balance: slo`): two replicas, one four times slower, 8 clients that
//! need a first token within 100 ms and 20 that accept 2 s. Under least outstanding the tight
//! ones share both replicas' queues and miss; under `slo` they keep the fast one and meet it.
//!
//! Where a request ran is read from the engines' own records (the tight clients' prompt is a
//! few tokens longer), so the routing claim does not rest on this machine's clock; the TTFT met
//! is asserted with room for a CPU shared with the rest of the suite.

use crate::support::{Stack, engine, http};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

const TIGHT: Duration = Duration::from_millis(100);
const LOOSE: Duration = Duration::from_secs(2);

fn config(balance: &str) -> String {
    format!(
        r#"
listen: 127.0.0.1:0
routes:
  - model: chat
    upstream_model: sim
    replicas: [{{E0}}, {{E1}}]
    balance: {balance}
    timeouts: {{ connect: 1s, first_token: 10s, stream_idle: 5s, total: 60s }}
    classes:
      - name: default
        concurrency: 64
        queue: 64
        queue_wait: 2s
"#
    )
}

#[derive(Default, Debug)]
struct Tally {
    ttft: Vec<Duration>,
    refused: u32,
}

impl Tally {
    fn met(&self, objective: Duration) -> f64 {
        let met = self.ttft.iter().filter(|t| **t <= objective).count();
        met as f64 / self.ttft.len().max(1) as f64
    }
}

/// The prompt's repeats for a client with `objective`: about three hundred tokens (prefill is a
/// good part of the first token), the tight ones' a little longer to be told apart.
fn repeats(objective: Duration) -> usize {
    if objective == TIGHT { 101 } else { 100 }
}

/// Closed-loop clients with `objective`, counted from `from` (after the models' warm-up) to `end`.
fn clients(
    url: &str,
    n: usize,
    objective: Duration,
    (from, end): (Instant, Instant),
    tally: &Arc<Mutex<Tally>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|_| {
            let (url, tally) = (format!("{url}/v1/chat/completions"), tally.clone());
            let body = serde_json::json!({
                "model": "chat",
                "messages": [{"role": "user", "content": "tell me more ".repeat(repeats(objective))}],
                "max_tokens": 24,
                "stream": true,
            });
            tokio::spawn(async move {
                let client = http();
                while Instant::now() < end {
                    let start = Instant::now();
                    let mut r = client
                        .post(&url)
                        .header("x-spillway-slo-ttft-ms", objective.as_millis().to_string())
                        .json(&body)
                        .send()
                        .await
                        .unwrap();
                    let status = r.status().as_u16();
                    let mut first = None;
                    while let Ok(Some(_)) = r.chunk().await {
                        first.get_or_insert(start.elapsed());
                    }
                    if start < from {
                        continue;
                    }
                    let mut t = tally.lock().unwrap();
                    match (status, first) {
                        (200, Some(ttft)) => t.ttft.push(ttft),
                        _ => t.refused += 1,
                    }
                }
            })
        })
        .collect()
}

/// Runs the mixed load for `run` and returns (tight, loose, the stack, the window's start).
async fn mixed(balance: &str, run: Duration) -> (Tally, Tally, Stack, Instant) {
    // An 8B model on an H100 as the simulator models it, and one four times slower.
    let replica = || {
        let mut c = engine::EngineConfig::preset(engine::Preset::Llama31_8bH100);
        c.model = "sim".into();
        // Prefill linear in the prompt, as `balance: slo`'s model sees it (its features hold the
        // prompt's length, not its square): with the preset's attention term (issue 51) the
        // routing kept 85.7–100% of the tight requests on the fast replica (one run in three
        // under 97%) against 99.6–100% without it — a limit of the model, not tested here.
        c.cost.prefill_attention_per_million_pairs = Duration::ZERO;
        c
    };
    let mut slow = replica();
    slow.faults.slow_factor = 4.0;
    let stack = Stack::start(
        vec![engine(replica()).await, engine(slow).await],
        &config(balance),
    )
    .await;
    let (tight, loose) = (Arc::default(), Arc::default());
    // Two seconds for each replica's models to see their first streams, then `run` counted.
    let from = Instant::now() + Duration::from_secs(2);
    let window = (from, from + run);
    let mut tasks = clients(&stack.url, 8, TIGHT, window, &tight);
    tasks.extend(clients(&stack.url, 20, LOOSE, window, &loose));
    for t in tasks {
        t.await.unwrap();
    }
    let take = |t: Arc<Mutex<Tally>>| std::mem::take(&mut *t.lock().unwrap());
    (take(tight), take(loose), stack, from)
}

/// The share of the tight requests that arrived at the fast replica (engine 0) from `from` on,
/// as the engines recorded them, and how many there were.
fn on_the_fast_replica(stack: &Stack, from: Instant) -> (f64, usize) {
    let longest = stack
        .engines
        .iter()
        .flat_map(|e| e.engine.records())
        .map(|r| r.prompt_tokens)
        .max()
        .unwrap_or(0);
    let tight = |i: usize| {
        stack.engines[i]
            .engine
            .records()
            .iter()
            .filter(|r| r.arrival >= from && r.prompt_tokens == longest)
            .count()
    };
    let (fast, slow) = (tight(0), tight(1));
    (fast as f64 / (fast + slow).max(1) as f64, fast + slow)
}

fn p(t: &Tally, q: f64) -> Duration {
    let mut v = t.ttft.clone();
    v.sort();
    v.get(((v.len() as f64 * q) as usize).min(v.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default()
}

fn line(what: &str, tight: &Tally, loose: &Tally) -> String {
    format!(
        "{what}: tight met {:.1}% of {} (TTFT p50 {:?} p99 {:?}), loose met {:.1}% of {} (p50 {:?} p99 {:?})",
        100.0 * tight.met(TIGHT),
        tight.ttft.len(),
        p(tight, 0.5),
        p(tight, 0.99),
        100.0 * loose.met(LOOSE),
        loose.ttft.len(),
        p(loose, 0.5),
        p(loose, 0.99),
    )
}

/// Timing-bound: the engines' steps are in this process, and a CPU shared with other tests delays
/// them (under a second copy of the suite the tight requests met 92%; on a cold CI machine alone,
/// 95.1% with every one of them on the fast replica's side of the verdicts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "timing-bound: run alone by scripts/test.sh"]
async fn tight_requests_keep_the_fast_replica() {
    let run = Duration::from_secs(8);
    let (lo_tight, lo_loose, lo, lo_from) = mixed("least_outstanding", run).await;
    let (lo_fast, lo_n) = on_the_fast_replica(&lo, lo_from);
    let before = format!(
        "{}; {:.1}% of {lo_n} tight on the fast replica",
        line("least_outstanding", &lo_tight, &lo_loose),
        100.0 * lo_fast
    );
    eprintln!("{before}");
    let (tight, loose, stack, from) = mixed("slo", run).await;
    let (fast, n) = on_the_fast_replica(&stack, from);
    let after = format!(
        "{}; {:.1}% of {n} tight on the fast replica",
        line("slo", &tight, &loose),
        100.0 * fast
    );
    eprintln!("{after}");
    let m = stack.metrics().await;
    for l in m.lines().filter(|l| l.starts_with("spillway_slo_")) {
        eprintln!("{l}");
    }
    // Where they ran is the routing's doing; whether 100 ms was met is also the machine's.
    assert!(n >= 50 && fast >= 0.97, "{before}\n{after}");
    assert!(tight.met(TIGHT) >= 0.85, "{before}\n{after}");
    assert!(tight.met(TIGHT) > lo_tight.met(TIGHT) + 0.3, "{before}\n{after}");
    assert!(loose.met(LOOSE) >= 0.99, "{before}\n{after}");
    assert_eq!(
        tight.refused + loose.refused,
        0,
        "standard requests are never refused for it"
    );
    let m = stack.metrics().await;
    for series in [
        r#"spillway_slo_routing_total{class="default",route="chat",verdict="meets"}"#,
        r#"spillway_slo_prediction_error_ratio{replica=""#,
    ] {
        assert!(m.contains(series), "{series} missing\n{m}");
    }
}

/// Sends one streamed request with `headers`, returning (status, Retry-After, body).
async fn one(url: &str, headers: &[(&str, &str)]) -> (u16, Option<String>, String) {
    let mut req = http()
        .post(format!("{url}/v1/chat/completions"))
        .json(&serde_json::json!({
            "model": "chat",
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 8,
            "stream": true,
        }));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let retry_after = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, retry_after, r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sheddable_request_no_replica_can_serve_in_time_is_refused_at_once() {
    // One replica, so that every warm-up stream teaches its model (with two, the split between
    // them is the balancer's, and one may still be warming up).
    let stack = Stack::start(
        vec![engine(crate::support::tiny()).await],
        &config("slo").replace(", {E1}", ""),
    )
    .await;
    for _ in 0..12 {
        assert_eq!(one(&stack.url, &[]).await.0, 200);
    }
    let before = stack
        .engines
        .iter()
        .map(|e| e.engine.records().len())
        .sum::<usize>();
    // No replica gives a first token within 1 µs: a sheddable request is refused, a standard one
    // is sent to the closest replica and counted as a miss.
    let llm_d = [
        ("x-llm-d-slo-ttft-ms", "0.001"),
        ("x-spillway-priority", "sheddable"),
    ];
    let (status, retry_after, body) = one(&stack.url, &llm_d).await;
    assert_eq!(status, 503, "{body}");
    assert!(retry_after.is_some(), "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], "slo_unattainable", "{body}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no replica is predicted to give a first token within"),
        "{body}"
    );
    let after = stack
        .engines
        .iter()
        .map(|e| e.engine.records().len())
        .sum::<usize>();
    assert_eq!(after, before, "the refused request reached no replica");
    let (status, _, body) = one(&stack.url, &[("x-spillway-slo-ttft-ms", "0.001")]).await;
    assert_eq!(status, 200, "{body}");
    let m = stack.metrics().await;
    for series in [
        r#"spillway_slo_routing_total{class="default",route="chat",verdict="refused"} 1"#,
        r#"spillway_slo_routing_total{class="default",route="chat",verdict="unattainable_sent"} 1"#,
        r#"spillway_rejections_total{class="default",reason="slo_unattainable",route="chat",team="anonymous"} 1"#,
    ] {
        assert!(m.contains(series), "{series} missing\n{m}");
    }
    // A header that is not a positive number of milliseconds is the client's mistake.
    let (status, _, body) = one(&stack.url, &[("x-spillway-slo-tpot-ms", "fast")]).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("x-spillway-slo-tpot-ms must be a number of milliseconds"),
        "{body}"
    );
}
