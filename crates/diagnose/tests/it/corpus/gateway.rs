//! The corpus's scenarios with a gateway in front: deadlines that cut healthy streams, limits
//! that refuse by design, an API server starved of CPU. The gateway speaks HTTP, so these run on
//! the real clock (about a quarter of an hour for all); each window is labelled from what the
//! clients saw. Regenerate with
//! `cargo test -p spillway-diagnose --test it corpus::gateway -- --ignored`.

use super::generate::{p95, secs};
use super::{Kind, Label, RunWriter, dir, seed_base, thresholds};
use crate::support::{MODEL, Served, dcgm, engine, gateway, tiny};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use spillway_diagnose::Suspect;
use spillway_diagnose::catalog::SIGNALS;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use testkit::{Engine, Gateway};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// What a client saw of one request.
#[derive(Debug, Clone)]
struct Req {
    arrival: Instant,
    first: Option<Instant>,
    end: Option<Instant>,
    status: u16,
    /// The stream reached `[DONE]`.
    done: bool,
    events: u32,
}

type Log = Arc<Mutex<Vec<Req>>>;

#[derive(Clone)]
struct Load {
    url: String,
    client: reqwest::Client,
    log: Log,
}

impl Load {
    async fn one(&self, prompt: usize, max_tokens: u32) {
        let arrival = Instant::now();
        let i = {
            let mut log = self.log.lock().unwrap();
            log.push(Req {
                arrival,
                first: None,
                end: None,
                status: 0,
                done: false,
                events: 0,
            });
            log.len() - 1
        };
        let body = serde_json::json!({
            "model": MODEL,
            "prompt": "abcd ".repeat(prompt),
            "max_tokens": max_tokens,
            "ignore_eos": true,
            "stream": true,
        });
        let sent = self
            .client
            .post(format!("{}/v1/completions", self.url))
            .json(&body)
            .send()
            .await;
        let mut r = match sent {
            Ok(r) => r,
            Err(_) => {
                self.log.lock().unwrap()[i].end = Some(Instant::now());
                return;
            }
        };
        self.log.lock().unwrap()[i].status = r.status().as_u16();
        let mut text = String::new();
        while let Ok(Some(chunk)) = r.chunk().await {
            let now = Instant::now();
            text.push_str(&String::from_utf8_lossy(&chunk));
            let mut log = self.log.lock().unwrap();
            let q = &mut log[i];
            if q.first.is_none() && text.contains("\"text\"") {
                q.first = Some(now);
            }
        }
        let mut log = self.log.lock().unwrap();
        let q = &mut log[i];
        q.end = Some(Instant::now());
        q.done = text.contains("[DONE]");
        q.events = text.matches("data:").count() as u32;
    }

    fn open(
        &self,
        set: &mut JoinSet<()>,
        t0: Instant,
        span: (f64, f64),
        per_s: f64,
        prompt: usize,
        out: u32,
    ) {
        let load = self.clone();
        set.spawn(async move {
            tokio::time::sleep_until(t0 + secs(span.0)).await;
            let mut inflight = JoinSet::new();
            let mut tick = tokio::time::interval(secs(1.0 / per_s));
            while Instant::now() < t0 + secs(span.1) {
                tick.tick().await;
                while inflight.try_join_next().is_some() {}
                let load = load.clone();
                inflight.spawn(async move { load.one(prompt, out).await });
            }
            while inflight.join_next().await.is_some() {}
        });
    }

    fn closed(
        &self,
        set: &mut JoinSet<()>,
        t0: Instant,
        span: (f64, f64),
        clients: u32,
        prompt: usize,
        out: u32,
    ) {
        for c in 0..clients {
            let load = self.clone();
            set.spawn(async move {
                tokio::time::sleep_until(t0 + secs(span.0) + Duration::from_millis(10) * c).await;
                while Instant::now() < t0 + secs(span.1) {
                    load.one(prompt, out).await;
                }
            });
        }
    }
}

/// Every target's `/metrics`, only the series diagnose reads, named by `host:port` as
/// Prometheus names a target (the gateway's per-replica series join the engines' by it).
async fn scrape(client: &reqwest::Client, targets: &[String]) -> Vec<(String, String)> {
    let mut keep: HashSet<String> = HashSet::from(["spillway_limits_mode".to_owned()]);
    for s in SIGNALS {
        for n in s.names {
            keep.insert((*n).to_owned());
            for suffix in ["_bucket", "_sum", "_count"] {
                keep.insert(format!("{n}{suffix}"));
            }
        }
    }
    let mut out = Vec::new();
    for t in targets {
        let text = match client.get(format!("{t}/metrics")).send().await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        let kept: String = text
            .lines()
            .filter(|l| !l.starts_with('#') && keep.contains(l.split(['{', ' ']).next().unwrap_or_default()))
            .map(|l| format!("{l}\n"))
            .collect();
        out.push((spillway_diagnose::source::instance_of(t), kept));
    }
    out
}

/// What the clients of a window lived through: the admitted requests' first tokens (those that
/// arrived in it, eventually; those given in it) and gaps; the share cut or failed; the share
/// refused. A stream cut by a deadline counts when the gateway cut it (`deadline` after its
/// arrival), not when the client noticed: the gateway's counter moved then.
fn label(
    log: &[Req],
    a: Instant,
    b: Instant,
    run_end: Instant,
    suspect: Suspect,
    deadline: Option<Duration>,
) -> Label {
    let th = thresholds();
    let (mut ttft, mut itl) = (Vec::new(), Vec::new());
    let (mut answered, mut failed, mut refused) = (0u32, 0u32, 0u32);
    let mut traffic = false;
    for r in log {
        traffic |= r.arrival <= b && r.end.is_none_or(|e| e >= a);
        let cut = !(matches!(r.status, 429 | 503) || (r.status == 200 && r.done));
        let counted = match (r.end, deadline) {
            (Some(e), Some(d)) if cut => Some(e.min(r.arrival + d)),
            (e, _) => e,
        };
        if let (Some(e), true) = (r.end, counted.is_some_and(|c| c >= a && c <= b)) {
            answered += 1;
            match r.status {
                429 | 503 => refused += 1,
                200 if r.done => {}
                _ => failed += 1,
            }
            if let Some(f) = r.first.filter(|_| r.done && r.events > 2) {
                itl.push((e - f).as_secs_f64() / f64::from(r.events - 2));
            }
        }
        let admitted = !matches!(r.status, 429 | 503);
        let arrived_in = r.arrival >= a && r.arrival <= b;
        let first_in = r.first.is_some_and(|f| f >= a && f <= b);
        if admitted && (arrived_in || first_in) {
            let first = r.first.or(r.end).unwrap_or(run_end);
            ttft.push((first - r.arrival).as_secs_f64());
        }
    }
    let share = |n: u32| f64::from(n) / f64::from(answered.max(1));
    let (ttft, itl) = (p95(ttft), p95(itl));
    let over = |v: Option<f64>, objective: f64| match v {
        Some(v) if v > objective * 1.25 => 2,
        Some(v) if v > objective * 0.8 => 1,
        _ => 0,
    };
    let errors = share(failed);
    let level = over(ttft, th.ttft_p95)
        .max(over(itl, th.itl_p95))
        .max(over(Some(errors), th.error_ratio));
    let kinds = if level == 2 {
        vec![Kind::Incident]
    } else if !traffic {
        vec![Kind::Idle]
    } else if refused > 0 && level == 0 {
        vec![Kind::Protected]
    } else if refused > 0 {
        vec![Kind::Protected, Kind::Incident]
    } else if level == 1 {
        vec![Kind::Ok, Kind::Incident]
    } else {
        vec![Kind::Ok]
    };
    Label {
        kinds,
        suspects: vec![suspect],
        truth: format!(
            "ttft_p95={} itl_p95={} failed={:.3} refused={:.3}",
            ttft.map_or("-".into(), |v| format!("{v:.3}")),
            itl.map_or("-".into(), |v| format!("{v:.4}")),
            errors,
            share(refused)
        ),
    }
}

/// Scrapes a loaded machine bunched closer than this make no window worth judging.
const MIN_WINDOW: f64 = 0.5;

const PHASES: &[&str] = &["before", "onset", "mid", "settled", "recovering"];

async fn run(name: &str, scenario: &'static str, seed: u64) -> String {
    let mut rng = SmallRng::seed_from_u64(seed);
    let (t0, t1) = (2.0, 2.0 + rng.random_range(3.0..5.0));
    let end = t1 + 3.0;
    let mut cfg = tiny();
    cfg.seed = seed;
    let (timeouts, class, suspect, params);
    let mut deadline = None;
    match scenario {
        "gateway_timeouts" => {
            let total = rng.random_range(150..=300);
            timeouts =
                format!("{{ connect: 50ms, first_token: 100ms, stream_idle: 100ms, total: {total}ms }}");
            class = "{ name: interactive, concurrency: 16, queue: 16, queue_wait: 50ms }".to_owned();
            suspect = Suspect::GatewayTimeouts;
            params = format!("total={total}ms");
            deadline = Some(Duration::from_millis(total));
        }
        "designed_shedding" => {
            let c = rng.random_range(2..=6);
            let wait = rng.random_range(30..=80);
            timeouts = String::new();
            class = format!("{{ name: interactive, concurrency: {c}, queue: {c}, queue_wait: {wait}ms }}");
            // Refusals by design are no suspect: the label's kind is the verdict.
            suspect = Suspect::ArrivalsExceedThroughput;
            params = format!("concurrency={c} queue_wait={wait}ms");
        }
        _ => {
            timeouts = "{ connect: 1s, first_token: 30s, stream_idle: 30s, total: 60s }".to_owned();
            let c = rng.random_range(4..=8);
            class = format!("{{ name: interactive, concurrency: {c}, queue: 500, queue_wait: 20s }}");
            suspect = Suspect::ProcessHealth;
            params = format!("concurrency={c}");
        }
    }
    let e: Engine = engine(cfg).await;
    let d: Served = dcgm(&[&e]).await;
    let g: Gateway = gateway(&[&e], &timeouts, &class).await;
    let targets = vec![g.url.clone(), e.url(), d.url.clone()];
    let load = Load {
        url: g.url.clone(),
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap(),
        log: Log::default(),
    };
    let mut set = JoinSet::new();
    let at = Instant::now();
    load.open(&mut set, at, (0.3, end), 5.0, 16, 16);
    let extra = match scenario {
        "gateway_timeouts" => {
            let clients = rng.random_range(4..=12);
            let out = rng.random_range(300..=600);
            load.closed(&mut set, at, (t0, t1), clients, 16, out);
            format!("clients={clients} out={out}")
        }
        "designed_shedding" => {
            let rate = rng.random_range(200.0..500.0);
            load.open(&mut set, at, (t0, t1), rate, 16, 32);
            format!("arrivals={rate:.0}/s")
        }
        _ => {
            let per_request: u64 = rng.random_range(30..=60);
            let rate = rng.random_range(1.5..3.0) * 1000.0 / per_request as f64;
            load.open(&mut set, at, (t0, t1), rate, 16, 4);
            let engine = e.engine.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(at + secs(t0)).await;
                let patch = engine::FaultPatch {
                    frontend: Some(Some(engine::cost::FrontendCost {
                        per_request: Duration::from_millis(per_request),
                        per_output_token: Duration::ZERO,
                    })),
                    ..engine::FaultPatch::default()
                };
                engine.apply_faults(&patch).unwrap();
            });
            format!("frontend_per_request={per_request}ms arrivals={rate:.0}/s")
        }
    };
    let grid = |v: f64| (v * 4.0).round() / 4.0;
    let mut ws = Vec::new();
    for (k, phase) in PHASES.iter().enumerate() {
        let l = grid(rng.random_range(1.0..2.0));
        let (a, b) = match *phase {
            "before" => (t0 - 0.25 - l.min(1.25), t0 - 0.25),
            "onset" => (t0 - 0.25, t0 + l.min(1.25)),
            "mid" => (t0 + 0.75, t0 + 0.75 + l),
            "settled" => (t1 - l, t1),
            _ => (t1 + 0.25 * k as f64 - 0.75, t1 + 0.25 * k as f64 - 0.75 + l),
        };
        ws.push((*phase, grid(a), grid(b)));
    }
    let mut times: Vec<f64> = ws.iter().flat_map(|(_, a, b)| [*a, *b]).collect();
    times.sort_by(f64::total_cmp);
    times.dedup();
    let mut w = RunWriter::new(name, scenario, &format!("seed={seed} {params} {extra}"));
    let client = reqwest::Client::new();
    let mut index = Vec::new();
    for t in &times {
        tokio::time::sleep_until(at + secs(*t)).await;
        let taken = at.elapsed().as_secs_f64();
        let texts = scrape(&client, &targets).await;
        index.push((*t, w.scrape(taken, &texts), taken));
    }
    tokio::time::sleep_until(at + secs(end + 2.0)).await;
    let run_end = Instant::now();
    let log = load.log.lock().unwrap().clone();
    let find = |t: f64| {
        index
            .iter()
            .find(|(x, ..)| *x == t)
            .map_or((0, t), |(_, i, taken)| (*i, *taken))
    };
    for (phase, a, b) in ws {
        // Labelled at the moments the scrapes were taken: on a loaded machine they come late.
        let ((ia, a), (ib, b)) = (find(a), find(b));
        if b - a < MIN_WINDOW {
            println!("{name} {phase}: scrapes {:.3} s apart, left out", b - a);
            continue;
        }
        let l = label(&log, at + secs(a), at + secs(b), run_end, suspect, deadline);
        w.window(phase, ia, ib, &l);
    }
    set.abort_all();
    w.finish()
}

const SCENARIOS: &[(&str, u64)] = &[
    ("gateway_timeouts", 6),
    ("designed_shedding", 6),
    ("starved_api_server", 6),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "regenerates the gateway's part of tests/corpus on the real clock; run with --ignored"]
async fn generate() {
    std::fs::create_dir_all(dir()).unwrap();
    for (scenario, runs) in SCENARIOS {
        for i in 0..*runs {
            let name = format!("{scenario}-{i:02}");
            let seed = seed_base(60_000) + i * 101 + scenario.len() as u64;
            let text = run(&name, scenario, seed).await;
            std::fs::write(dir().join(format!("{name}.run")), text).unwrap();
            println!("{name}");
        }
    }
}
