//! The corpus's scenarios with a gateway in front: deadlines that cut healthy streams, limits
//! that refuse by design, an API server starved of CPU. The gateway speaks HTTP, so these run on
//! the real clock (about a quarter of an hour for all); each window is labelled from what the
//! clients saw. Regenerate with
//! `SPILLWAY_CORPUS_WRITE=1 cargo test -p spillway-diagnose --test it corpus::gateway -- --ignored`.

use super::generate::{p95, secs};
use super::{Kind, Label, RunWriter, dir, seed_base, thresholds};
use crate::support::{MODEL, Served, dcgm, engine, gateway, tiny};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use spillway_diagnose::catalog::SIGNALS;
use spillway_diagnose::{Suspect, Thresholds};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use testkit::{Engine, Gateway};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// What a client saw of one request.
#[derive(Debug, Clone)]
pub(super) struct Req {
    pub(super) arrival: Instant,
    pub(super) first: Option<Instant>,
    pub(super) end: Option<Instant>,
    pub(super) status: u16,
    /// The stream reached `[DONE]`.
    pub(super) done: bool,
    pub(super) events: u32,
    /// The longest silence after the first token: from one read to the next.
    pub(super) stall: Option<(Instant, Instant)>,
    /// The last read after the first token.
    pub(super) last: Option<Instant>,
    /// After the first token, each read's time and its gap from the last read per event in
    /// it: the gaps between tokens as the client saw them.
    pub(super) gaps: Vec<(Instant, f64)>,
}

pub(super) type Log = Arc<Mutex<Vec<Req>>>;

/// Clients of one run: streamed completions to `url`, each logged.
#[derive(Clone)]
pub(super) struct Load {
    pub(super) url: String,
    pub(super) model: &'static str,
    pub(super) client: reqwest::Client,
    pub(super) log: Log,
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
                stall: None,
                last: None,
                gaps: Vec::new(),
            });
            log.len() - 1
        };
        let body = serde_json::json!({
            "model": self.model,
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
        let mut last = None;
        while let Ok(Some(chunk)) = r.chunk().await {
            let now = Instant::now();
            let read = String::from_utf8_lossy(&chunk);
            let events = read.matches("data:").count().max(1);
            text.push_str(&read);
            let mut log = self.log.lock().unwrap();
            let q = &mut log[i];
            if let Some(from) = last.filter(|_| q.first.is_some()) {
                let gap: Duration = now - from;
                q.gaps.push((now, gap.as_secs_f64() / events as f64));
                let longest = q.stall.map_or(Duration::ZERO, |(a, b)| b - a);
                if now - from > longest {
                    q.stall = Some((from, now));
                }
            }
            if q.first.is_none() && text.contains("\"text\"") {
                q.first = Some(now);
            }
            if q.first.is_some() {
                q.last = Some(now);
            }
            last = Some(now);
        }
        let mut log = self.log.lock().unwrap();
        let q = &mut log[i];
        q.end = Some(Instant::now());
        q.done = text.contains("[DONE]");
        q.events = text.matches("data:").count() as u32;
    }

    pub(super) fn open(
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

    pub(super) fn closed(
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
pub(super) async fn scrape(client: &reqwest::Client, targets: &[String]) -> Vec<(String, String)> {
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
pub(super) fn label(
    log: &[Req],
    a: Instant,
    b: Instant,
    run_end: Instant,
    suspect: Suspect,
    deadline: Option<Duration>,
    th: &Thresholds,
) -> Label {
    let (mut ttft, mut itl) = (Vec::new(), Vec::new());
    let (mut answered, mut failed, mut refused) = (0u32, 0u32, 0u32);
    let mut traffic = false;
    // A stream silent inside the window for longer than a stall (a preemption's recompute or a
    // burst of prefills is shorter).
    let mut stalled = false;
    for r in log {
        traffic |= r.arrival <= b && r.end.is_none_or(|e| e >= a);
        let cut = !(matches!(r.status, 429 | 503) || (r.status == 200 && r.done));
        let counted = match (r.end, deadline) {
            (Some(e), Some(d)) if cut => Some(e.min(r.arrival + d)),
            (e, _) => e,
        };
        if let (Some(_), true) = (r.end, counted.is_some_and(|c| c >= a && c <= b)) {
            answered += 1;
            match r.status {
                429 | 503 => refused += 1,
                200 if r.done => {}
                _ => failed += 1,
            }
        }
        if !matches!(r.status, 429 | 503) {
            let inside = r.gaps.iter().filter(|(t, _)| *t >= a && *t <= b);
            itl.extend(inside.map(|(_, g)| *g));
        }
        let admitted = !matches!(r.status, 429 | 503);
        let arrived_in = r.arrival >= a && r.arrival <= b;
        let first_in = r.first.is_some_and(|f| f >= a && f <= b);
        // Still without a first token at the window's end: it has waited at least that long.
        let waiting_at_b = r.arrival <= b && r.first.is_none_or(|f| f > b) && r.end.is_none_or(|e| e > b);
        // The longest silence between reads, and one a stream never ended (cut, or the run
        // over first).
        let open = r.last.filter(|_| !r.done).map(|l| (l, r.end.unwrap_or(run_end)));
        for (from, to) in r.stall.into_iter().chain(open) {
            let inside = to.min(b).saturating_duration_since(from.max(a));
            stalled |= inside.as_secs_f64() > STALL.max(4.0 * th.ttft_p95);
        }
        if admitted && (arrived_in || first_in || waiting_at_b) {
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
    let kinds = if level == 2 || stalled {
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
            "ttft_p95={} itl_p95={} failed={:.3} refused={:.3}{}",
            ttft.map_or("-".into(), |v| format!("{v:.3}")),
            itl.map_or("-".into(), |v| format!("{v:.4}")),
            errors,
            share(refused),
            if stalled { " stalled" } else { "" }
        ),
    }
}

/// A silence in a stream, seconds, that a person calls a stall (or four first-token objectives,
/// if longer).
const STALL: f64 = 0.75;

/// Scrapes a loaded machine bunched closer than this make no window worth judging.
const MIN_WINDOW: f64 = 0.5;

pub(super) const PHASES: &[&str] = &["before", "onset", "mid", "settled", "recovering"];

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
        model: MODEL,
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
    let span = Span { t0, t1, end, at };
    let header = format!("seed={seed} {params} {extra}");
    let truth = Truth {
        suspect,
        deadline,
        th: thresholds(),
        named_by: None,
    };
    let text = record(name, scenario, &header, &mut rng, span, &targets, &load, &truth).await;
    set.abort_all();
    text
}

/// A run's incident, seconds from `at`: it starts at `t0`, ends at `t1`, the load at `end`.
pub(super) struct Span {
    pub(super) t0: f64,
    pub(super) t1: f64,
    pub(super) end: f64,
    pub(super) at: Instant,
}

/// What the windows are labelled by: the suspect of the scenario, the gateway's deadline (a
/// cut counts when it was made), the objectives.
pub(super) struct Truth {
    pub(super) suspect: Suspect,
    pub(super) deadline: Option<Duration>,
    pub(super) th: Thresholds,
    /// A counter whose increase in a window names the cause whatever the objectives (the
    /// simulator's corpus calls preemptions so).
    pub(super) named_by: Option<&'static str>,
}

/// Scrapes `targets` at the ends of a window in each phase around `span`'s incident (drawn from
/// `rng`), waits for the load to end, and writes the run with each window labelled from what the
/// clients saw.
#[allow(clippy::too_many_arguments)]
pub(super) async fn record(
    name: &str,
    scenario: &str,
    header: &str,
    rng: &mut SmallRng,
    span: Span,
    targets: &[String],
    load: &Load,
    truth: &Truth,
) -> String {
    let Span { t0, t1, end, at } = span;
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
    let mut w = RunWriter::new(name, scenario, header);
    let client = reqwest::Client::new();
    let mut index = Vec::new();
    let mut counts: Vec<f64> = Vec::new();
    for t in &times {
        tokio::time::sleep_until(at + secs(*t)).await;
        // A scrape of a loaded server takes a while: its moment is the middle of the request.
        let sent = at.elapsed().as_secs_f64();
        let texts = scrape(&client, targets).await;
        let taken = (sent + at.elapsed().as_secs_f64()) / 2.0;
        let count: f64 = truth.named_by.map_or(0.0, |name| {
            texts
                .iter()
                .flat_map(|(_, text)| text.lines())
                .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        });
        counts.push(count);
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
        let mut l = label(
            &log,
            at + secs(a),
            at + secs(b),
            run_end,
            truth.suspect,
            truth.deadline,
            &truth.th,
        );
        if counts[ib] > counts[ia] {
            l.kinds = vec![Kind::Incident];
            l.truth.push_str(" named");
        }
        w.window(phase, ia, ib, &l);
    }
    w.finish()
}

const SCENARIOS: &[(&str, u64)] = &[
    ("gateway_timeouts", 6),
    ("designed_shedding", 6),
    ("starved_api_server", 6),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "regenerates the gateway's part of tests/corpus on the real clock; run with SPILLWAY_CORPUS_WRITE=1 and --ignored"]
async fn generate() {
    if !super::writing("corpus::gateway") {
        return;
    }
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
