//! The gateway's own cost, side by side with going straight to the engine, in one run.
//!
//! `cargo bench -p spillway --bench gateway_overhead [-- LEVELS]` (default `1,64,512`). A
//! `spillway engine --preset zero` (steps cost nothing) is the upstream; `spillway serve --workers 1`
//! runs in front of it with its whole admission path on (a class with C and Q, cost caps, access log to
//! /dev/null). Each level runs closed-loop streaming clients (16-token chat completions on
//! keep-alive connections) for a fixed window against the engine directly, then through the
//! gateway, and reports TTFT p50/p99, throughput, and the gateway's CPU and memory.

mod common;

use common::{free_port, proc_stat};
use hdrhistogram::Histogram;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

const WINDOW: Duration = Duration::from_secs(5);

async fn wait_for(addr: &str) {
    let t = Instant::now();
    while TcpStream::connect(addr).await.is_err() {
        assert!(t.elapsed() < Duration::from_secs(20), "{addr} did not start");
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
    let body = format!(
        r#"{{"model":"{model}","messages":[{{"role":"user","content":"hello there"}}],"max_tokens":16,"stream":true}}"#
    );
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut buf = vec![0u8; 64 * 1024];
    while !shared.stop.load(Ordering::Relaxed) {
        let sent = Instant::now();
        if s.write_all(req.as_bytes()).await.is_err() {
            shared.errors.fetch_add(1, Ordering::Relaxed);
            return ttft;
        }
        let mut first = None;
        let mut seen_headers = false;
        let mut tail: Vec<u8> = Vec::new();
        loop {
            let n = match s.read(&mut buf).await {
                Ok(0) | Err(_) => {
                    shared.errors.fetch_add(1, Ordering::Relaxed);
                    return ttft;
                }
                Ok(n) => n,
            };
            let chunk = &buf[..n];
            if !seen_headers {
                // Every answer must be a 200; anything else is counted as an error.
                if !chunk.starts_with(b"HTTP/1.1 200") {
                    shared.errors.fetch_add(1, Ordering::Relaxed);
                    return ttft;
                }
                seen_headers = true;
            }
            if first.is_none() && chunk.windows(6).any(|w| w == b"data: ") {
                first = Some(sent.elapsed());
            }
            tail.extend_from_slice(&chunk[n.saturating_sub(5)..]);
            if tail.len() > 5 {
                tail.drain(..tail.len() - 5);
            }
            if tail == b"0\r\n\r\n" {
                break;
            }
        }
        if shared.measuring.load(Ordering::Relaxed) {
            if let Some(f) = first {
                let _ = ttft.record(f.as_micros().max(1) as u64);
            }
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

async fn run(levels: Vec<usize>) {
    let bin = env!("CARGO_BIN_EXE_spillway");
    let engine_addr = format!("127.0.0.1:{}", free_port());
    let gateway_addr = format!("127.0.0.1:{}", free_port());
    let _engine = tokio::process::Command::new(bin)
        .args([
            "engine",
            "--listen",
            &engine_addr,
            "--model",
            "sim",
            "--preset",
            "zero",
            "--max-num-seqs",
            "4096",
        ])
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let dir = std::env::temp_dir().join(format!("spillway-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("gateway.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: {gateway_addr}\nroutes:\n  - model: chat\n    upstream_model: sim\n    replicas: [http://{engine_addr}]\n    limits: {{ max_input_tokens: 4000, max_tokens: {{ default: 16, cap: 1024 }}, max_n: 1 }}\n    timeouts: {{ connect: 1s, first_token: 10s, stream_idle: 10s, total: 60s }}\n    classes:\n      - name: interactive\n        concurrency: 2048\n        queue: 1024\n        queue_wait: 5s\n        slo: {{ ttft: 1s, itl: 50ms }}\n"
        ),
    )
    .unwrap();
    let gateway = tokio::process::Command::new(bin)
        .args(["serve", "--workers", "1", "--config", config.to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let gpid = gateway.id().unwrap();
    wait_for(&engine_addr).await;
    wait_for(&gateway_addr).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, rss_idle) = proc_stat(gpid);
    println!("gateway_overhead: 16-token streamed chat completions, zero-cost engine, {WINDOW:?} per run");
    println!(
        "| streams | direct TTFT p50/p99 µs | gateway TTFT p50/p99 µs | added p50/p99 µs | direct req/s | gateway req/s | ratio | gateway CPU µs/req | cores per 1k req/s | gateway RSS KB/stream |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for c in levels {
        let d = level(&engine_addr, "sim", c, gpid).await;
        let g = level(&gateway_addr, "chat", c, gpid).await;
        let cpu_per_req = g.gateway_cpu_s * 1e6 / (g.rps * WINDOW.as_secs_f64()).max(1.0);
        println!(
            "| {c} | {}/{} | {}/{} | {}/{} | {:.0} | {:.0} | {:.2} | {:.1} | {:.3} | {:.1} |{}",
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
            cpu_per_req * 1000.0 / 1e6,
            (g.gateway_rss_kb.saturating_sub(rss_idle)) as f64 / c as f64,
            if d.errors + g.errors > 0 {
                format!(" errors: direct {} gateway {}", d.errors, g.errors)
            } else {
                String::new()
            }
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
