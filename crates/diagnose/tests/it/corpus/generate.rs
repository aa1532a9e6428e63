//! The corpus generator: scenarios run on the simulator in-process on a paused clock (fast and
//! repeatable), with parameters drawn at random from a seed, each run scraped at the ends of
//! windows placed in five phases around the incident, and each window labelled from the ground
//! truth of the requests the load sent (not from `diagnose`). Regenerate with
//! `SPILLWAY_CORPUS_WRITE=1 cargo test -p spillway-diagnose --test it corpus::generate -- --ignored`.

use super::{Kind, Label, RunWriter, dir, seed_base, thresholds};
use engine::cost::CostModel;
use engine::{EngineConfig, FaultPatch, GenerateParams};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use spillway_diagnose::Suspect;
use spillway_diagnose::catalog::SIGNALS;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// What the load saw of one request.
#[derive(Debug, Clone)]
struct Req {
    arrival: Instant,
    first: Option<Instant>,
    end: Option<Instant>,
    tokens: u32,
}

type Log = Arc<Mutex<Vec<Req>>>;

/// The replicas of one run and what their load saw.
#[derive(Clone)]
struct Sim {
    engines: Vec<engine::Engine>,
    log: Log,
    next: Arc<Mutex<u64>>,
}

impl Sim {
    /// Sends one request to the next replica (round robin) and follows it to its end.
    fn send(&self, prompt: u32, max_tokens: u32) -> tokio::task::JoinHandle<()> {
        let sim = self.clone();
        tokio::spawn(async move {
            let n = {
                let mut next = sim.next.lock().unwrap();
                *next += 1;
                *next
            };
            let e = &sim.engines[(n as usize) % sim.engines.len()];
            // Prompts differ from the first token on: no prefix-cache hits between requests.
            let tokens = (0..prompt).map(|k| ((n * 7919 + u64::from(k)) % 30_000) as u32 + 10);
            let arrival = Instant::now();
            let i = {
                let mut log = sim.log.lock().unwrap();
                log.push(Req {
                    arrival,
                    first: None,
                    end: None,
                    tokens: 0,
                });
                log.len() - 1
            };
            let Ok(generation) = e.submit(GenerateParams {
                prompt: tokens.collect(),
                max_tokens: Some(max_tokens),
                n: 1,
                ignore_eos: true,
            }) else {
                sim.log.lock().unwrap()[i].end = Some(Instant::now());
                return;
            };
            let mut rx = generation.choices[0].clone();
            while rx.changed().await.is_ok() {
                let p = *rx.borrow();
                let mut log = sim.log.lock().unwrap();
                let r = &mut log[i];
                r.tokens = p.tokens;
                if p.tokens >= 1 && r.first.is_none() {
                    r.first = Some(Instant::now());
                }
                if p.finish.is_some() {
                    r.end = Some(Instant::now());
                    break;
                }
            }
            drop(generation);
        })
    }

    /// `per_s` requests a second from `from` to `until` (seconds since `t0`).
    fn open(&self, t0: Instant, from: f64, until: f64, per_s: f64, prompt: u32, max_tokens: u32) {
        let sim = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(t0 + secs(from)).await;
            let mut tick = tokio::time::interval(secs(1.0 / per_s));
            while Instant::now() < t0 + secs(until) {
                tick.tick().await;
                sim.send(prompt, max_tokens);
            }
        });
    }

    /// `clients` clients each sending its next request when the last ends, from `from` to `until`.
    fn closed(&self, t0: Instant, from: f64, until: f64, clients: u32, prompt: u32, max_tokens: u32) {
        for c in 0..clients {
            let sim = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(t0 + secs(from) + Duration::from_millis(7) * c).await;
                while Instant::now() < t0 + secs(until) {
                    let _ = sim.send(prompt, max_tokens).await;
                }
            });
        }
    }

    /// Every target's exposition now: the engines' (only the series diagnose reads) and one
    /// DCGM exporter over their GPUs.
    fn scrape(&self) -> Vec<(String, String)> {
        let keep = catalogue();
        let mut out: Vec<(String, String)> = self
            .engines
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let text = String::from_utf8(e.metrics_text()).unwrap_or_default();
                let kept: String = text
                    .lines()
                    .filter(|l| {
                        let name = l.split(['{', ' ']).next().unwrap_or_default();
                        !l.starts_with('#') && keep.contains(name)
                    })
                    .map(|l| format!("{l}\n"))
                    .collect();
                (format!("e:{}", i + 1), kept)
            })
            .collect();
        let gpus: Vec<(String, engine::GpuReading)> = self
            .engines
            .iter()
            .map(|e| (e.config().gpu.name.clone(), e.gpu_reading()))
            .collect();
        let refs: Vec<(&str, engine::GpuReading)> = gpus.iter().map(|(n, r)| (n.as_str(), *r)).collect();
        out.push(("d:1".into(), engine::metrics::dcgm_exposition("node-1", &refs)));
        out
    }

    fn preemptions(&self) -> u64 {
        self.engines.iter().map(|e| e.snapshot().preemptions).sum()
    }
}

pub(super) fn secs(v: f64) -> Duration {
    Duration::from_secs_f64(v.max(0.0))
}

/// The metric names the catalogue reads, histograms by their three series.
fn catalogue() -> HashSet<String> {
    let mut names = HashSet::new();
    for s in SIGNALS {
        for n in s.names {
            names.insert((*n).to_owned());
            for suffix in ["_bucket", "_sum", "_count"] {
                names.insert(format!("{n}{suffix}"));
            }
        }
    }
    names
}

pub(super) fn p95(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 * 0.95).ceil() as usize).clamp(1, v.len()) - 1;
    Some(v[i])
}

/// What users of the window lived through, from the load's own log over the whole run: the
/// first tokens the window's arrivals eventually got (or their wait until the run's end) and
/// those given in it, and the gaps between tokens of requests decoding in it.
struct Truth {
    traffic: bool,
    ttft_p95: Option<f64>,
    itl_p95: Option<f64>,
}

fn truth(log: &[Req], a: Instant, b: Instant, run_end: Instant) -> Truth {
    let mut ttft = Vec::new();
    let mut itl = Vec::new();
    let mut traffic = false;
    for r in log {
        let active = r.arrival <= b && r.end.is_none_or(|e| e >= a);
        traffic |= active;
        let first = r.first.unwrap_or(run_end);
        let arrived_in = r.arrival >= a && r.arrival <= b;
        let first_in = r.first.is_some_and(|f| f >= a && f <= b);
        let waiting_at_b = r.arrival <= b && r.first.is_none_or(|f| f > b);
        if arrived_in || first_in || waiting_at_b {
            ttft.push((first - r.arrival).as_secs_f64());
        }
        if let (Some(f), Some(e)) = (r.first, r.end)
            && r.tokens >= 2
            && f <= b
            && e >= a
        {
            itl.push((e - f).as_secs_f64() / f64::from(r.tokens - 1));
        }
    }
    Truth {
        traffic,
        ttft_p95: p95(ttft),
        itl_p95: p95(itl),
    }
}

/// The kinds a person would call the window from its truth: a cause named whatever the
/// objectives (`named`: a GPU fault, preemptions) or an objective clearly breached is an
/// incident, clearly met is not, and within a quarter of the objective either may be said.
fn kinds(t: &Truth, named: bool) -> (Vec<Kind>, String) {
    let th = thresholds();
    let over = |v: Option<f64>, objective: f64| match v {
        Some(v) if v > objective * 1.25 => 2,
        Some(v) if v > objective * 0.8 => 1,
        _ => 0,
    };
    let text = format!(
        "ttft_p95={} itl_p95={}",
        t.ttft_p95.map_or("-".into(), |v| format!("{v:.3}")),
        t.itl_p95.map_or("-".into(), |v| format!("{v:.4}"))
    );
    let level = over(t.ttft_p95, th.ttft_p95).max(over(t.itl_p95, th.itl_p95));
    let kinds = if named || level == 2 {
        vec![Kind::Incident]
    } else if !t.traffic {
        vec![Kind::Idle]
    } else if level == 1 {
        vec![Kind::Incident, Kind::Ok]
    } else {
        vec![Kind::Ok]
    };
    (kinds, text)
}

/// Starts a run's load and faults, given its replicas and the moment it began.
type Start = Box<dyn FnOnce(&Sim, Instant)>;

/// One scenario run: the engines, the load around the incident, the fault at its start.
struct Plan {
    scenario: &'static str,
    params: String,
    engines: Vec<EngineConfig>,
    /// The incident's start and end, seconds from the run's start.
    t0: f64,
    t1: f64,
    /// Starts the load (baseline and incident) and the faults.
    start: Start,
    suspect: Suspect,
    /// The phases to place windows in.
    phases: &'static [&'static str],
}

const PHASES: &[&str] = &["before", "onset", "mid", "settled", "recovering"];

fn tiny() -> EngineConfig {
    testkit::tiny_engine(crate::support::MODEL)
}

/// The time one request of `tokens` output tokens takes on the tiny preset with `seqs` running.
fn request_secs(cfg: &EngineConfig, tokens: u32, seqs: f64) -> f64 {
    let step = cfg.cost.overhead.as_secs_f64() + seqs * cfg.cost.decode_seq.as_secs_f64();
    step * f64::from(tokens + 1)
}

fn plan(scenario: &'static str, rng: &mut SmallRng) -> Plan {
    let t0 = 3.0;
    let t1 = t0 + rng.random_range(4.0..7.0);
    let end = t1 + 4.0;
    match scenario {
        "flood" | "recovery" => {
            let mut cfg = tiny();
            cfg.max_num_seqs = rng.random_range(2..=8);
            let out = rng.random_range(16..=64);
            let cap = cfg.max_num_seqs as f64 / request_secs(&cfg, out, cfg.max_num_seqs as f64);
            let factor = rng.random_range(1.5..4.0);
            let t1 = if scenario == "recovery" {
                t0 + rng.random_range(1.5..3.0)
            } else {
                t1
            };
            Plan {
                scenario,
                params: format!(
                    "max_num_seqs={} out={out} capacity={cap:.1}/s arrivals={:.1}/s",
                    cfg.max_num_seqs,
                    cap * factor
                ),
                engines: vec![cfg],
                t0,
                t1,
                start: Box::new(move |sim, at| {
                    sim.open(at, 0.5, end, cap * 0.2, 16, out);
                    sim.open(at, t0, t1, cap * (factor - 0.2), 16, out);
                }),
                suspect: Suspect::ArrivalsExceedThroughput,
                phases: if scenario == "recovery" {
                    &["recovering", "recovering", "recovering", "recovering"]
                } else {
                    PHASES
                },
            }
        }
        "backlog" => {
            // A burst arrived just before the window: the engine at its cap, many times as many
            // waiting, long answers, so the few completions in the window waited little.
            let mut cfg = tiny();
            cfg.max_num_seqs = rng.random_range(2..=8);
            let out = rng.random_range(1500..=3500);
            let per_request = request_secs(&cfg, out, cfg.max_num_seqs as f64);
            let cap = cfg.max_num_seqs as f64 / per_request;
            let burst = (cfg.max_num_seqs as f64 * rng.random_range(5.0..12.0)).round() as u32;
            let drained = t0 + f64::from(burst) / cap;
            Plan {
                scenario,
                params: format!(
                    "max_num_seqs={} out={out} capacity={cap:.1}/s burst={burst} drains_at={drained:.1}s",
                    cfg.max_num_seqs
                ),
                engines: vec![cfg],
                t0,
                t1: drained,
                start: Box::new(move |sim, at| {
                    sim.open(at, 0.5, end.max(drained + 4.0), cap * 0.2, 16, out);
                    let sim = sim.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep_until(at + secs(t0)).await;
                        for _ in 0..burst {
                            sim.send(16, out);
                        }
                    });
                }),
                suspect: Suspect::ArrivalsExceedThroughput,
                phases: PHASES,
            }
        }
        "long_prompts" => {
            let mut cfg = tiny();
            let cost = rng.random_range(80..=160);
            cfg.cost = CostModel {
                prefill_token: Duration::from_micros(cost),
                ..cfg.cost
            };
            cfg.max_num_batched_tokens = 4096;
            let clients = rng.random_range(1..=2);
            let prompt = rng.random_range(2000..=3500);
            Plan {
                scenario,
                params: format!("prefill_token={cost}us clients={clients} prompt={prompt}"),
                engines: vec![cfg],
                t0,
                t1,
                start: Box::new(move |sim, at| {
                    sim.open(at, 0.5, end, 3.0, 16, 16);
                    sim.closed(at, t0, t1, clients, prompt, 4);
                }),
                suspect: Suspect::LongPrompts,
                phases: PHASES,
            }
        }
        "long_outputs" => {
            let mut cfg = tiny();
            let decode = rng.random_range(2000..=4000);
            cfg.cost = CostModel {
                decode_seq: Duration::from_micros(decode),
                ..cfg.cost
            };
            let clients = rng.random_range(12..=32);
            let out = rng.random_range(20..=60);
            Plan {
                scenario,
                params: format!("decode_seq={decode}us clients={clients} out={out}"),
                engines: vec![cfg],
                t0,
                t1,
                start: Box::new(move |sim, at| {
                    sim.closed(at, 0.5, end, 2, 16, 20);
                    sim.closed(at, t0, t1, clients, 16, out);
                }),
                suspect: Suspect::DecodeContention,
                phases: PHASES,
            }
        }
        "kv_pressure" => {
            let mut cfg = tiny();
            cfg.max_model_len = 2048;
            cfg.kv_cache_tokens = rng.random_range(2048..=4096);
            let clients = rng.random_range(16..=32);
            let prompt = rng.random_range(150..=250);
            let out = rng.random_range(250..=350);
            Plan {
                scenario,
                params: format!(
                    "kv_cache_tokens={} clients={clients} prompt={prompt} out={out}",
                    cfg.kv_cache_tokens
                ),
                engines: vec![cfg],
                t0,
                t1,
                start: Box::new(move |sim, at| {
                    sim.closed(at, 0.5, end, 2, 200, 100);
                    sim.closed(at, t0, t1, clients, prompt, out);
                }),
                suspect: Suspect::KvPressure,
                phases: PHASES,
            }
        }
        "kv_few_long" => {
            // A few long sequences outgrow the cache: after each preemption the survivors hold
            // well under 90% of it, with the preempted waiting (issue 50's second situation).
            let mut cfg = tiny();
            cfg.max_model_len = 4096;
            cfg.kv_cache_tokens = rng.random_range(4096..=6144);
            let clients = rng.random_range(2..=4);
            let prompt = rng.random_range(800..=1600);
            let out = rng.random_range(1200..=2400);
            Plan {
                scenario,
                params: format!(
                    "kv_cache_tokens={} clients={clients} prompt={prompt} out={out}",
                    cfg.kv_cache_tokens
                ),
                engines: vec![cfg],
                t0,
                t1,
                start: Box::new(move |sim, at| {
                    sim.open(at, 0.5, end, 3.0, 16, 16);
                    sim.closed(at, t0, t1, clients, prompt, out);
                }),
                suspect: Suspect::KvPressure,
                phases: PHASES,
            }
        }
        "hung_replica" => {
            let replicas = rng.random_range(1..=3);
            let rate = rng.random_range(5.0..20.0) * replicas as f64;
            Plan {
                scenario,
                params: format!("replicas={replicas} arrivals={rate:.1}/s"),
                engines: vec![tiny(); replicas],
                t0,
                t1: end,
                start: Box::new(move |sim, at| {
                    sim.open(at, 0.5, end, rate, 16, 16);
                    let e = sim.engines[0].clone();
                    tokio::spawn(async move {
                        tokio::time::sleep_until(at + secs(t0)).await;
                        let patch = FaultPatch {
                            stall_after_tokens: Some(Some(0)),
                            ..FaultPatch::default()
                        };
                        e.apply_faults(&patch).unwrap();
                    });
                }),
                suspect: Suspect::ProcessHealth,
                phases: &["before", "onset", "mid", "settled"],
            }
        }
        "gpu_fault" => {
            let xid = [48, 63, 74, 79, 94][rng.random_range(0..5)];
            let ecc = rng.random_range(0..=3u64);
            let rate = rng.random_range(3.0..30.0);
            Plan {
                scenario,
                params: format!("xid={xid} ecc_dbe={ecc} arrivals={rate:.1}/s"),
                engines: vec![tiny()],
                t0,
                t1: end,
                start: Box::new(move |sim, at| {
                    sim.open(at, 0.5, end, rate, 16, 16);
                    let e = sim.engines[0].clone();
                    tokio::spawn(async move {
                        tokio::time::sleep_until(at + secs(t0)).await;
                        let patch = FaultPatch {
                            xid: Some(xid),
                            ecc_dbe: Some(ecc),
                            ..FaultPatch::default()
                        };
                        e.apply_faults(&patch).unwrap();
                    });
                }),
                suspect: Suspect::GpuFault,
                phases: &["before", "onset", "mid", "settled"],
            }
        }
        _ => Plan {
            scenario: "idle",
            params: String::new(),
            engines: vec![tiny()],
            t0,
            t1,
            start: Box::new(|_, _| {}),
            suspect: Suspect::ArrivalsExceedThroughput,
            phases: PHASES,
        },
    }
}

/// A window of each phase, on the quarter-second grid: (phase, start, end) in seconds.
fn windows(p: &Plan, rng: &mut SmallRng) -> Vec<(&'static str, f64, f64)> {
    let grid = |v: f64| (v * 4.0).round() / 4.0;
    let mut len = || grid(rng.random_range(1.0..2.5));
    let (t0, t1) = (p.t0, p.t1);
    let mut out = Vec::new();
    let mut k = 0.0;
    for phase in p.phases {
        let l = len();
        let (a, b) = match *phase {
            "before" => (t0 - 0.25 - l.min(1.5), t0 - 0.25),
            // A burst's rise is over before a window can open on it.
            "onset" if p.scenario == "backlog" => (t0 + 0.25, t0 + 0.25 + l),
            "onset" => (t0 - 0.25, t0 + l.min(1.5)),
            "mid" => (t0 + 0.75, t0 + 0.75 + l),
            "settled" => (t1 - l, t1),
            _ => {
                k += 1.0;
                (t1 - 0.25 + 0.5 * (k - 1.0), t1 - 0.25 + 0.5 * (k - 1.0) + l)
            }
        };
        out.push((*phase, grid(a), grid(b)));
    }
    out
}

async fn run(name: &str, scenario: &'static str, seed: u64) -> String {
    let mut rng = SmallRng::seed_from_u64(seed);
    let p = plan(scenario, &mut rng);
    let ws = windows(&p, &mut rng);
    let mut loops = Vec::new();
    let mut engines = Vec::new();
    for mut cfg in p.engines.clone() {
        cfg.seed = seed;
        let (e, l) = engine::Engine::start(cfg).unwrap();
        engines.push(e);
        loops.push(l);
    }
    let sim = Sim {
        engines,
        log: Log::default(),
        next: Arc::default(),
    };
    let at = Instant::now();
    (p.start)(&sim, at);
    let mut times: Vec<f64> = ws.iter().flat_map(|(_, a, b)| [*a, *b]).collect();
    times.sort_by(f64::total_cmp);
    times.dedup();
    let mut w = RunWriter::new(name, p.scenario, &format!("seed={seed} {}", p.params));
    let mut index = Vec::new();
    let mut preempted = Vec::new();
    for t in &times {
        tokio::time::sleep_until(at + secs(*t)).await;
        let targets = sim.scrape();
        index.push((*t, w.scrape(*t, &targets)));
        preempted.push(sim.preemptions());
    }
    // Past the last window, so that the waits of its last arrivals are known.
    let last = times.last().copied().unwrap_or(0.0);
    tokio::time::sleep_until(at + secs(last + 5.0)).await;
    let run_end = Instant::now();
    let log = sim.log.lock().unwrap().clone();
    let find = |t: f64| index.iter().position(|(x, _)| *x == t).unwrap_or(0);
    for (phase, a, b) in ws {
        let (ia, ib) = (find(a), find(b));
        let fault = matches!(p.scenario, "gpu_fault") && b > p.t0;
        let t = truth(&log, at + secs(a), at + secs(b), run_end);
        // vLLM preempts only when the cache is full: a preemption is "KV cache high ·
        // preemptions up" whatever the objectives, as vLLM's own warning says.
        let preemptions = preempted[ib] - preempted[ia];
        let (kinds, text) = kinds(&t, fault || preemptions > 0);
        let suspects = match p.scenario {
            "idle" => Vec::new(),
            "kv_pressure" | "kv_few_long" if preemptions == 0 => {
                vec![Suspect::KvPressure, Suspect::ArrivalsExceedThroughput]
            }
            _ => vec![p.suspect],
        };
        let label = Label {
            kinds,
            suspects,
            truth: format!("{text} preempted={preemptions}"),
        };
        w.window(phase, index[ia].1, index[ib].1, &label);
    }
    drop(loops);
    w.finish()
}

const SCENARIOS: &[(&str, u64)] = &[
    ("idle", 3),
    ("flood", 10),
    ("backlog", 8),
    ("recovery", 6),
    ("long_prompts", 8),
    ("long_outputs", 8),
    ("kv_pressure", 8),
    ("kv_few_long", 6),
    ("hung_replica", 8),
    ("gpu_fault", 8),
];

#[test]
#[ignore = "regenerates tests/corpus (a minute or two); run with SPILLWAY_CORPUS_WRITE=1 and --ignored"]
fn generate() {
    if !super::writing("corpus::generate") {
        return;
    }
    std::fs::create_dir_all(dir()).unwrap();
    for (scenario, runs) in SCENARIOS {
        for i in 0..*runs {
            let name = format!("{scenario}-{i:02}");
            let seed = seed_base(50_000) + i * 101 + scenario.len() as u64;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            let text = rt.block_on(run(&name, scenario, seed));
            std::fs::write(dir().join(format!("{name}.run")), text).unwrap();
            println!("{name}");
        }
    }
}
