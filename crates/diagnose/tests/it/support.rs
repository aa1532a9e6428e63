//! A stack for one scenario: engines, their DCGM listener, a gateway, load, and the diagnosis.

use engine::EngineConfig;
use spillway_diagnose::{Cluster, Snapshot, Thresholds, Verdict, diagnose};
use std::time::Duration;
use testkit::{Engine, Gateway};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinSet;

pub(crate) const MODEL: &str = "sim";

/// The objectives every scenario is judged by: tight enough for the tiny preset's millisecond steps.
pub(crate) fn thresholds() -> Thresholds {
    Thresholds {
        ttft_p95: 0.25,
        itl_p95: 0.025,
        queue_time: 0.0625,
        ..Thresholds::default()
    }
}

/// The tiny preset with its step loop on a thread of its own, as `spillway engine` runs it, so that
/// the load's HTTP work on the test's runtime does not make steps late (and the GPU look idle).
pub(crate) fn tiny() -> EngineConfig {
    let mut c = testkit::tiny_engine(MODEL);
    c.core_thread = true;
    c
}

/// The simulator in-process (testkit's), stopped when dropped.
pub(crate) async fn engine(config: EngineConfig) -> Engine {
    Engine::start(config).await
}

/// A server task stopped when this is dropped.
pub(crate) struct Served {
    pub(crate) url: String,
    _stop: oneshot::Sender<()>,
}

/// A healthy stack kept busy: one engine, its DCGM listener, a gateway with room for the load,
/// and 20 closed-loop clients for its 16 slots. Judged the same by direct scraping and through
/// Prometheus.
pub(crate) struct Busy {
    engine: Engine,
    dcgm: Served,
    gateway: Gateway,
    _load: Load,
}

impl Busy {
    /// Gateway, engine and DCGM `/metrics`, in that order.
    pub(crate) fn targets(&self) -> [String; 3] {
        [self.gateway.url.clone(), self.engine.url(), self.dcgm.url.clone()]
    }
}

pub(crate) async fn busy_but_healthy() -> Busy {
    let engine = engine(tiny()).await;
    let dcgm = dcgm(&[&engine]).await;
    let gateway = gateway(
        &[&engine],
        "",
        "{ name: interactive, concurrency: 16, queue: 16, queue_wait: 1s }",
    )
    .await;
    // More clients than C: the gateway's queue covers a client's turn between two requests,
    // so in flight stays at C whenever it is sampled. With exactly C clients, a machine slow
    // enough to stretch those turns sampled 10 of 16 once, under the 80% that "busy" asks.
    // Their answers are of different lengths: with one length, the batch fell into step and
    // finished together, and CI sampled 7 of 16 in the gap before the clients came back.
    let _load = closed_spread(&gateway.url, 20, 100, 30..=70);
    Busy {
        engine,
        dcgm,
        gateway,
        _load,
    }
}

/// dcgm-exporter's shape over the engines' GPUs, on a listener of its own.
pub(crate) async fn dcgm(engines: &[&Engine]) -> Served {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = oneshot::channel();
    let handles = engines.iter().map(|e| e.engine.clone()).collect();
    tokio::spawn(engine::server::serve_dcgm(
        listener,
        handles,
        "node-1".into(),
        async move {
            let _ = stopped.await;
        },
    ));
    Served { url, _stop: stop }
}

/// A gateway with one route, of [`MODEL`], to `engines`: the route's `timeouts` (a YAML flow map,
/// or "" for the defaults) and one class (a YAML flow map).
pub(crate) async fn gateway(engines: &[&Engine], timeouts: &str, class: &str) -> Gateway {
    let timeouts = if timeouts.is_empty() {
        String::new()
    } else {
        format!("    timeouts: {timeouts}\n")
    };
    let replicas: Vec<String> = engines.iter().map(|e| e.url()).collect();
    let list = (0..replicas.len())
        .map(|i| format!("{{E{i}}}"))
        .collect::<Vec<_>>()
        .join(", ");
    let yaml = format!(
        "listen: 127.0.0.1:0\nroutes:\n  - model: {MODEL}\n    replicas: [{list}]\n{timeouts}    classes:\n      - {class}\n"
    );
    Gateway::start(&yaml, &replicas).await
}

/// Requests in flight until dropped.
pub(crate) struct Load(#[allow(dead_code)] JoinSet<()>);

impl Load {
    /// Two loads as one.
    pub(crate) fn both(a: Load, b: Load) -> Load {
        let mut set = a.0;
        let mut b = b.0;
        // Moving tasks between sets is not possible: keep `b`'s set alive inside one of `a`'s.
        set.spawn(async move { while b.join_next().await.is_some() {} });
        Load(set)
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// One streamed completion of `prompt_tokens` (one token per 4 bytes without a tokenizer) and
/// exactly `max_tokens`, read to the end; failures are part of the scenario, not of the test.
async fn one(client: &reqwest::Client, url: &str, prompt_tokens: usize, max_tokens: u32) {
    let body = serde_json::json!({
        "model": MODEL,
        "prompt": "abcd".repeat(prompt_tokens),
        "max_tokens": max_tokens,
        "ignore_eos": true,
        "stream": true,
    });
    if let Ok(r) = client
        .post(format!("{url}/v1/completions"))
        .json(&body)
        .send()
        .await
    {
        let _ = r.bytes().await;
    }
}

/// `clients` clients, each sending its next request when the last one ends. Their first requests
/// are 10 ms apart: clients started in the same instant would stay in lockstep, and the GPU would
/// idle between their waves.
pub(crate) fn closed(url: &str, clients: usize, prompt_tokens: usize, max_tokens: u32) -> Load {
    closed_spread(url, clients, prompt_tokens, max_tokens..=max_tokens)
}

/// Like [`closed`], but client `i`'s answers are of a length of its own, spread over
/// `max_tokens`, so that their requests do not end in the same engine step.
pub(crate) fn closed_spread(
    url: &str,
    clients: usize,
    prompt_tokens: usize,
    max_tokens: std::ops::RangeInclusive<u32>,
) -> Load {
    let mut set = JoinSet::new();
    let c = client();
    let (low, span) = (*max_tokens.start(), max_tokens.end() - max_tokens.start() + 1);
    for i in 0..clients {
        let (c, url) = (c.clone(), url.to_owned());
        // 17 is prime to any span used here: consecutive clients land far apart in the range.
        let tokens = low + (i as u32 * 17) % span;
        set.spawn(async move {
            tokio::time::sleep(Duration::from_millis(10) * i as u32).await;
            loop {
                one(&c, &url, prompt_tokens, tokens).await;
            }
        });
    }
    Load(set)
}

/// Requests arriving at `per_s`, whatever the server does with them.
pub(crate) fn open(url: &str, per_s: f64, prompt_tokens: usize, max_tokens: u32) -> Load {
    let mut set = JoinSet::new();
    let (c, url) = (client(), url.to_owned());
    set.spawn(async move {
        // Dropped with this task, which aborts every request still in flight.
        let mut inflight = JoinSet::new();
        let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / per_s));
        loop {
            tick.tick().await;
            while inflight.try_join_next().is_some() {}
            let (c, url) = (c.clone(), url.clone());
            inflight.spawn(async move { one(&c, &url, prompt_tokens, max_tokens).await });
        }
    });
    Load(set)
}

/// Longer than the simulated DCGM's one-second activity window, so that the window's first sample
/// does not still see the idle moment before the load started.
pub(crate) const WARM_UP: Duration = Duration::from_millis(1200);
pub(crate) const WINDOW: Duration = Duration::from_millis(1500);

pub(crate) fn verdict(start: &Snapshot, end: &Snapshot) -> Verdict {
    let v = diagnose(start, end, &thresholds(), &Cluster::default());
    // What the operator would read, printed so a failing scenario explains itself.
    println!(
        "{}",
        spillway_diagnose::render::text(&v, spillway_diagnose::render::Style { colour: false })
    );
    v
}
