//! The corpus's windows from a real vLLM 0.32 (its CPU build, the tiny dummy-weight model that
//! `scripts/vllm.sh` installs): a flood over the engine's measured capacity, KV pressure in a
//! cache of a few blocks, and a hung engine core (SIGSTOP; its API server still serves
//! `/metrics`). The load and the labels are the gateway scenarios' (`corpus/gateway.rs`): each
//! window is labelled from what the clients saw. The objectives are written in each run's header,
//! drawn from the healthy speed measured first, since a CPU's speed is not a GPU's. Regenerate
//! with `SPILLWAY_CORPUS_WRITE=1 cargo test -p spillway-diagnose --test it corpus::vllm -- --ignored --nocapture`
//! (`CORPUS_VLLM=flood|kv` for one server's runs; a few minutes; skipped with a note where vLLM is not installed).

use super::dir;
use super::gateway::{Load, Log, Span, Truth, record};
use super::generate::{p95, secs};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use spillway_diagnose::Suspect;
use std::time::Duration;
use testkit::vllm::{MODEL, Vllm};
use tokio::task::JoinSet;
use tokio::time::Instant;

fn load_on(v: &Vllm) -> Load {
    Load {
        url: v.url(),
        model: MODEL,
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap(),
        log: Log::default(),
    }
}

/// Waits until the engine holds nothing (what a run left behind has finished).
async fn drained(v: &Vllm) {
    for _ in 0..600 {
        let m = v.metrics();
        let held = |name| testkit::vllm::metric_in(&m, name).unwrap_or(0.0);
        if held("vllm:num_requests_running") == 0.0 && held("vllm:num_requests_waiting") == 0.0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("vLLM on {} did not drain", v.port);
}

/// The engine's healthy speed at `clients` closed-loop clients of `out` tokens: requests
/// finished a second, and the clients' TTFT p95 and the p95 of their gaps between tokens.
async fn measure(v: &Vllm, clients: u32, out: u32) -> (f64, f64, f64) {
    let load = load_on(v);
    let mut set = JoinSet::new();
    let at = Instant::now();
    let run = 4.0;
    load.closed(&mut set, at, (0.0, run), clients, 16, out);
    while set.join_next().await.is_some() {}
    let log = load.log.lock().unwrap().clone();
    let done: Vec<_> = log.iter().filter(|r| r.done).collect();
    let rate = done.len() as f64 / at.elapsed().as_secs_f64();
    let ttft = p95(done
        .iter()
        .filter_map(|r| Some((r.first? - r.arrival).as_secs_f64()))
        .collect());
    // Each gap between tokens, as the windows' labels count them.
    let itl = p95(done.iter().flat_map(|r| r.gaps.iter().map(|(_, g)| *g)).collect());
    drained(v).await;
    (rate, ttft.unwrap_or(0.0), itl.unwrap_or(0.0))
}

/// Objectives a healthy engine meets with room (twice its measured p95, rounded up to 10 ms),
/// written into the run's header.
fn objectives(ttft: f64, itl: f64) -> (f64, f64) {
    let up = |v: f64| ((v * 2.0 * 100.0).ceil() / 100.0).max(0.01);
    (up(ttft), up(itl))
}

/// The engine core's process (SIGSTOP on it freezes the engine; the API server answers on).
fn engine_core(v: &Vllm) -> Option<String> {
    let out = std::process::Command::new("pgrep")
        .args(["-g", &v.pgid().to_string(), "-f", "EngineCore"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().next().map(str::to_owned)
}

fn signal(pid: &str, sig: &str) {
    let _ = std::process::Command::new("kill").args([sig, pid]).status();
}

/// One run of `scenario` against `v`, whose healthy speed is `speed` (requests a second at its
/// sequence cap, TTFT and ITL p95).
async fn run(v: &Vllm, name: &str, scenario: &str, seed: u64, seqs: u32, speed: (f64, f64, f64)) -> String {
    let mut rng = SmallRng::seed_from_u64(seed);
    let (t0, t1) = (2.0, 2.0 + rng.random_range(3.0..5.0));
    let end = t1 + 3.0;
    let (cap, ttft, itl) = speed;
    let (slo_ttft, slo_itl) = objectives(ttft, itl);
    let load = load_on(v);
    let mut set = JoinSet::new();
    let at = Instant::now();
    let mut named_by = None;
    let (suspect, extra) = match scenario {
        "vllm_flood" => {
            let factor = rng.random_range(1.5..4.0);
            load.open(&mut set, at, (0.3, end), cap * 0.2, 16, 32);
            load.open(&mut set, at, (t0, t1), cap * (factor - 0.2), 16, 32);
            (
                Suspect::ArrivalsExceedThroughput,
                format!(
                    "max_num_seqs={seqs} capacity={cap:.1}/s arrivals={:.1}/s",
                    cap * factor
                ),
            )
        }
        "vllm_kv_pressure" => {
            let clients = rng.random_range(8..=16);
            let out = rng.random_range(300..=600);
            load.open(&mut set, at, (0.3, end), 1.0, 16, 16);
            load.closed(&mut set, at, (t0, t1), clients, 16, out);
            named_by = Some("vllm:num_preemptions_total");
            (
                Suspect::KvPressure,
                format!("max_num_seqs={seqs} clients={clients} out={out}"),
            )
        }
        _ => {
            let clients = rng.random_range(2..=seqs);
            load.closed(&mut set, at, (0.3, end), clients, 16, 32);
            let core = engine_core(v).expect("vLLM's engine core process");
            let stop = core.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(at + secs(t0)).await;
                signal(&stop, "-STOP");
            });
            tokio::spawn(async move {
                tokio::time::sleep_until(at + secs(t1)).await;
                signal(&core, "-CONT");
            });
            (
                Suspect::ProcessHealth,
                format!("max_num_seqs={seqs} clients={clients} stopped={:.1}s", t1 - t0),
            )
        }
    };
    let header = format!("seed={seed} {extra} slo_ttft_p95={slo_ttft} slo_itl_p95={slo_itl}");
    let mut th = super::thresholds();
    (th.ttft_p95, th.itl_p95) = (slo_ttft, slo_itl);
    let truth = Truth {
        suspect,
        deadline: None,
        th,
        named_by,
    };
    let span = Span { t0, t1, end, at };
    let targets = [v.url()];
    let text = record(name, scenario, &header, &mut rng, span, &targets, &load, &truth).await;
    set.abort_all();
    drained(v).await;
    text
}

/// One vLLM server of the corpus: its name, its flags, its sequence cap, and the scenarios run
/// on it with how many runs each.
struct Server {
    name: &'static str,
    args: &'static [&'static str],
    seqs: u32,
    scenarios: &'static [(&'static str, u64)],
}

const SERVERS: &[Server] = &[
    Server {
        name: "flood",
        args: &["--max-num-seqs", "4"],
        seqs: 4,
        scenarios: &[("vllm_flood", 4), ("vllm_hung", 3)],
    },
    // 24 blocks of 128 tokens: the 2,048-token context (17 blocks, vLLM's check) and a third more.
    Server {
        name: "kv",
        args: &["--max-num-seqs", "16", "--num-gpu-blocks-override", "24"],
        seqs: 16,
        scenarios: &[("vllm_kv_pressure", 4)],
    },
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "regenerates the real-vLLM part of tests/corpus (needs scripts/vllm.sh install); run with SPILLWAY_CORPUS_WRITE=1 and --ignored"]
async fn generate() {
    if !testkit::vllm::installed() {
        return;
    }
    if !super::writing("corpus::vllm") {
        return;
    }
    std::fs::create_dir_all(dir()).unwrap();
    // `CORPUS_VLLM=kv` regenerates one server's runs.
    let only = std::env::var("CORPUS_VLLM").ok();
    for Server {
        name,
        args,
        seqs,
        scenarios,
    } in SERVERS
    {
        if only.as_deref().is_some_and(|o| o != *name) {
            continue;
        }
        let (server, args) = (name.to_string(), args.to_vec());
        let v = tokio::task::spawn_blocking(move || Vllm::start(&format!("corpus-{server}"), false, &args))
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("{e}"));
        let speed = measure(&v, *seqs, 32).await;
        println!(
            "{}: {:.1} finished/s, TTFT p95 {:.3} s, ITL p95 {:.4} s",
            v.url(),
            speed.0,
            speed.1,
            speed.2
        );
        for (scenario, runs) in *scenarios {
            for i in 0..*runs {
                let name = format!("{scenario}-{i:02}");
                let seed = super::seed_base(70_000) + i * 101 + scenario.len() as u64;
                let text = run(&v, &name, scenario, seed, *seqs, speed).await;
                std::fs::write(dir().join(format!("{name}.run")), text).unwrap();
                println!("{name}");
            }
        }
    }
}
