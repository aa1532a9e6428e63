//! The gateway's own cost, side by side with going straight to the engine, in one run.
//!
//! `cargo bench -p spillway --bench gateway_overhead [-- LEVELS]` (default `1,64,512`). A
//! `spillway engine --preset zero` (steps cost nothing) is the upstream; `spillway serve --workers 1`
//! runs in front of it with its whole admission path on (a class with C and Q, cost caps, access log to
//! /dev/null). Each level runs closed-loop streaming clients (16-token chat completions on
//! keep-alive connections) for a fixed window against the engine directly, then through the
//! gateway, and reports TTFT p50/p99, throughput, and the gateway's CPU and memory.
//!
//! With `SPILLWAY_BENCH_BASELINE=/path/to/an/older/spillway`, that build runs beside this one on
//! the same config, for a before/after in one run.
//!
//! With `SPILLWAY_BENCH_REDIS=1` (and `redis-server` on the PATH), a second Spillway runs the same
//! config with its limits shared through a local `redis-server` (`redis: { gateways: 1 }`), and
//! each of its rows also says how many Redis round trips a request took.

mod common;

use common::{chat_request, free_port, proc_stat, streamed_request};
use hdrhistogram::Histogram;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::Instant;

const WINDOW: Duration = Duration::from_secs(5);

async fn wait_for(addr: &str) {
    let t = Instant::now();
    while TcpStream::connect(addr).await.is_err() {
        assert!(t.elapsed() < Duration::from_secs(90), "{addr} did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

struct Shared {
    stop: AtomicBool,
    measuring: AtomicBool,
    done: AtomicU64,
    errors: AtomicU64,
}

/// One client: streamed chat completions back to back on one connection; records TTFT (request
/// written → first body bytes) while `measuring`.
async fn client(addr: String, model: &'static str, shared: Arc<Shared>) -> Histogram<u64> {
    let mut ttft = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
    let Ok(mut s) = TcpStream::connect(&addr).await else {
        shared.errors.fetch_add(1, Ordering::Relaxed);
        return ttft;
    };
    let _ = s.set_nodelay(true);
    let req = chat_request(model, "hello there", 16);
    let mut buf = vec![0u8; 64 * 1024];
    while !shared.stop.load(Ordering::Relaxed) {
        let Some(first) = streamed_request(&mut s, &req, &mut buf).await else {
            shared.errors.fetch_add(1, Ordering::Relaxed);
            return ttft;
        };
        if shared.measuring.load(Ordering::Relaxed) {
            let _ = ttft.record(first.as_micros().max(1) as u64);
            shared.done.fetch_add(1, Ordering::Relaxed);
        }
    }
    ttft
}

struct Level {
    ttft_p50_us: u64,
    ttft_p99_us: u64,
    rps: f64,
    errors: u64,
    gateway_cpu_s: f64,
    gateway_rss_kb: u64,
}

async fn level(addr: &str, model: &'static str, concurrency: usize, gateway_pid: u32) -> Level {
    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        measuring: AtomicBool::new(false),
        done: AtomicU64::new(0),
        errors: AtomicU64::new(0),
    });
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| tokio::spawn(client(addr.to_owned(), model, shared.clone())))
        .collect();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let (cpu0, _) = proc_stat(gateway_pid);
    shared.measuring.store(true, Ordering::Relaxed);
    let t0 = Instant::now();
    tokio::time::sleep(WINDOW).await;
    shared.measuring.store(false, Ordering::Relaxed);
    let elapsed = t0.elapsed().as_secs_f64();
    let (cpu1, rss) = proc_stat(gateway_pid);
    shared.stop.store(true, Ordering::Relaxed);
    let mut ttft = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
    for t in tasks {
        if let Ok(h) = t.await {
            ttft.add(h).unwrap();
        }
    }
    Level {
        ttft_p50_us: ttft.value_at_quantile(0.5),
        ttft_p99_us: ttft.value_at_quantile(0.99),
        rps: shared.done.load(Ordering::Relaxed) as f64 / elapsed,
        errors: shared.errors.load(Ordering::Relaxed),
        gateway_cpu_s: cpu1 - cpu0,
        gateway_rss_kb: rss,
    }
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let levels: Vec<usize> = args
        .first()
        .map(|a| a.split(',').filter_map(|v| v.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 64, 512]);
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(levels));
}

/// A proxy under test: where it listens, the model name it routes, its process.
struct Proxy {
    name: &'static str,
    addr: String,
    model: &'static str,
    child: tokio::process::Child,
    rss_idle_kb: u64,
}

fn spawn(program: &str, args: &[&str]) -> tokio::process::Child {
    spawn_with(program, args, &[])
}

fn spawn_with(program: &str, args: &[&str], env: &[(&str, &str)]) -> tokio::process::Child {
    tokio::process::Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .env("RUST_LOG", "warn")
        .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        .env("LITELLM_LOG", "ERROR")
        // LiteLLM refuses to start without a master key; the clients send it (others ignore it).
        .env("LITELLM_MASTER_KEY", "sk-bench")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {program}: {e}"))
}

/// Envoy in front of the engine: one worker, no route timeout (the default 15 s kills streams),
/// circuit breakers out of the way.
fn envoy_config(port: u16, engine_port: u16) -> String {
    format!(
        r#"static_resources:
  listeners:
  - name: ingress
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{ prefix: "/" }}
                route: {{ cluster: engine, timeout: 0s }}
          http_filters:
          - name: envoy.filters.http.router
            typed_config: {{ "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }}
  clusters:
  - name: engine
    connect_timeout: 1s
    type: STATIC
    circuit_breakers:
      thresholds: [ {{ max_connections: 100000, max_pending_requests: 100000, max_requests: 100000 }} ]
    load_assignment:
      cluster_name: engine
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {engine_port} }} }} }}
"#
    )
}

/// `spillway_redis_calls_total` summed over operations and outcomes (0 without Redis).
async fn redis_calls(addr: &str) -> f64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = TcpStream::connect(addr).await else {
        return 0.0;
    };
    let _ = s
        .write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await;
    let mut text = String::new();
    let _ = s.read_to_string(&mut text).await;
    text.lines()
        .filter(|l| l.starts_with("spillway_redis_calls_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn run(levels: Vec<usize>) {
    let bin = env!("CARGO_BIN_EXE_spillway");
    let engine_port = free_port();
    let engine_addr = format!("127.0.0.1:{engine_port}");
    let _engine = spawn(
        bin,
        &[
            "engine",
            "--listen",
            &engine_addr,
            "--model",
            "sim",
            "--preset",
            "zero",
            "--max-num-seqs",
            "4096",
        ],
    );
    let dir = std::env::temp_dir().join(format!("spillway-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut proxies = Vec::new();

    let port = free_port();
    let config = dir.join("gateway.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: 127.0.0.1:{port}\nroutes:\n  - model: chat\n    upstream_model: sim\n    replicas: [http://{engine_addr}]\n    limits: {{ max_input_tokens: 4000, max_tokens: {{ default: 16, cap: 1024 }}, max_n: 1 }}\n    timeouts: {{ connect: 1s, first_token: 10s, stream_idle: 10s, total: 60s }}\n    classes:\n      - name: interactive\n        concurrency: 2048\n        queue: 1024\n        queue_wait: 5s\n        slo: {{ ttft: 1s, itl: 50ms }}\n"
        ),
    )
    .unwrap();
    let child = spawn(
        bin,
        &["serve", "--workers", "1", "--config", config.to_str().unwrap()],
    );
    proxies.push(Proxy {
        name: "spillway",
        addr: format!("127.0.0.1:{port}"),
        model: "chat",
        child,
        rss_idle_kb: 0,
    });

    // Another build of Spillway on the same config, to compare two versions in one run.
    if let Ok(baseline) = std::env::var("SPILLWAY_BENCH_BASELINE") {
        let port = free_port();
        let text = std::fs::read_to_string(&config).unwrap().replace(
            &format!(
                "listen: 127.0.0.1:{}\n",
                proxies[0].addr.rsplit(':').next().unwrap()
            ),
            &format!("listen: 127.0.0.1:{port}\n"),
        );
        let baseline_config = dir.join("gateway-baseline.yaml");
        std::fs::write(&baseline_config, text).unwrap();
        let child = spawn(
            &baseline,
            &[
                "serve",
                "--workers",
                "1",
                "--config",
                baseline_config.to_str().unwrap(),
            ],
        );
        proxies.push(Proxy {
            name: "spillway (baseline)",
            addr: format!("127.0.0.1:{port}"),
            model: "chat",
            child,
            rss_idle_kb: 0,
        });
    }

    // The same gateway with its limits kept in Redis.
    let mut _redis = None;
    if std::env::var_os("SPILLWAY_BENCH_REDIS").is_some() {
        let redis_port = free_port();
        _redis = Some(spawn(
            "redis-server",
            &[
                "--port",
                &redis_port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
        ));
        let shared_port = free_port();
        let text = std::fs::read_to_string(&config).unwrap().replace(
            &format!("listen: 127.0.0.1:{port}\n"),
            &format!("listen: 127.0.0.1:{shared_port}\nredis: {{ gateways: 1 }}\n"),
        );
        let shared_config = dir.join("gateway-redis.yaml");
        std::fs::write(&shared_config, text).unwrap();
        wait_for(&format!("127.0.0.1:{redis_port}")).await;
        let url = format!("redis://127.0.0.1:{redis_port}/");
        let child = spawn_with(
            bin,
            &[
                "serve",
                "--workers",
                "1",
                "--config",
                shared_config.to_str().unwrap(),
            ],
            &[("SPILLWAY_REDIS_URL", &url)],
        );
        proxies.push(Proxy {
            name: "spillway+redis",
            addr: format!("127.0.0.1:{shared_port}"),
            model: "chat",
            child,
            rss_idle_kb: 0,
        });
    }

    // Optional: the proxies people use today, when their binaries are given (bench/compare.sh).
    if let Ok(envoy) = std::env::var("SPILLWAY_BENCH_ENVOY") {
        let port = free_port();
        let config = dir.join("envoy.yaml");
        std::fs::write(&config, envoy_config(port, engine_port)).unwrap();
        let child = spawn(
            &envoy,
            &[
                "-c",
                config.to_str().unwrap(),
                "--concurrency",
                "1",
                "--log-level",
                "error",
                "--base-id",
                &port.to_string(),
            ],
        );
        proxies.push(Proxy {
            name: "envoy",
            addr: format!("127.0.0.1:{port}"),
            model: "sim",
            child,
            rss_idle_kb: 0,
        });
    }
    if let Ok(litellm) = std::env::var("SPILLWAY_BENCH_LITELLM") {
        let port = free_port();
        let config = dir.join("litellm.yaml");
        std::fs::write(
            &config,
            format!(
                "model_list:\n  - model_name: chat\n    litellm_params:\n      model: openai/sim\n      api_base: http://{engine_addr}/v1\n      api_key: none\n"
            ),
        )
        .unwrap();
        let child = spawn(
            &litellm,
            &[
                "--config",
                config.to_str().unwrap(),
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--num_workers",
                "1",
            ],
        );
        proxies.push(Proxy {
            name: "litellm",
            addr: format!("127.0.0.1:{port}"),
            model: "chat",
            child,
            rss_idle_kb: 0,
        });
    }

    wait_for(&engine_addr).await;
    for p in &mut proxies {
        wait_for(&p.addr).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for p in &mut proxies {
        p.rss_idle_kb = proc_stat(p.child.id().unwrap()).1;
    }
    println!(
        "gateway_overhead: 16-token streamed chat completions, zero-cost engine, {WINDOW:?} per run, one worker per proxy"
    );
    println!(
        "| streams | proxy | direct TTFT p50/p99 µs | via proxy TTFT p50/p99 µs | added p50/p99 µs | direct req/s | via proxy req/s | ratio | proxy CPU µs/req | proxy RSS KB/stream |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for c in levels {
        for p in &proxies {
            let pid = p.child.id().unwrap();
            let d = level(&engine_addr, "sim", c, pid).await;
            let calls0 = redis_calls(&p.addr).await;
            let g = level(&p.addr, p.model, c, pid).await;
            let calls = redis_calls(&p.addr).await - calls0;
            let cpu_per_req = g.gateway_cpu_s * 1e6 / (g.rps * WINDOW.as_secs_f64()).max(1.0);
            println!(
                "| {c} | {} | {}/{} | {}/{} | {}/{} | {:.0} | {:.0} | {:.2} | {:.1} | {:.1} |{}",
                p.name,
                d.ttft_p50_us,
                d.ttft_p99_us,
                g.ttft_p50_us,
                g.ttft_p99_us,
                g.ttft_p50_us as i64 - d.ttft_p50_us as i64,
                g.ttft_p99_us as i64 - d.ttft_p99_us as i64,
                d.rps,
                g.rps,
                g.rps / d.rps.max(1.0),
                cpu_per_req,
                (g.gateway_rss_kb.saturating_sub(p.rss_idle_kb)) as f64 / c as f64,
                if d.errors + g.errors > 0 {
                    format!(" errors: direct {} via proxy {}", d.errors, g.errors)
                } else {
                    String::new()
                }
            );
            if calls > 0.0 {
                // Counted over the 0.7 s warm-up and the window: per request of both, at the
                // window's rate.
                let requests = g.rps * (WINDOW.as_secs_f64() + 0.7);
                println!(
                    "|   | ↳ Redis round trips per request: {:.2} |",
                    calls / requests.max(1.0)
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
