//! Balancers side by side on the workloads they exist for, in one run.
//!
//! `cargo bench -p spillway --bench balancers`
//! - Shared prefixes: 3 replicas (`llama-3.1-8b-h100`, prefix caching on, a KV cache with room for
//!   about three prefixes each), 8 tenants each with its
//!   own ~2,000-token system prompt, 24 closed-loop clients: prefix affinity vs least outstanding —
//!   prefix-cache hit rate (from the engines' own counters) and TTFT.
//! - Unequal replicas: 2 replicas, one 3× slower (`--fault-slow 3`), 16 clients: engine-aware vs
//!   least outstanding — TTFT and throughput.

#[allow(dead_code)]
mod common;

use common::{chat_request, free_port, streamed_request};
use hdrhistogram::Histogram;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio::time::Instant;

const WINDOW: Duration = Duration::from_secs(12);

fn spawn(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn spillway")
}

async fn wait_for(addr: &str) {
    let t = Instant::now();
    while TcpStream::connect(addr).await.is_err() {
        assert!(t.elapsed() < Duration::from_secs(20), "{addr} did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn metric_sum(addr: &str, name: &str) -> f64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = TcpStream::connect(addr).await else {
        return 0.0;
    };
    let _ = s
        .write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await;
    let mut out = String::new();
    let _ = s.read_to_string(&mut out).await;
    out.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

struct Run {
    ttft: Histogram<u64>,
    done: u64,
}

/// `clients` closed-loop clients through the gateway at `gateway`; client i sends `prompts[i % n]`.
async fn load(gateway: &str, clients: usize, prompts: &[String], max_tokens: u32) -> Run {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..clients)
        .map(|i| {
            let (addr, stop, done) = (gateway.to_owned(), stop.clone(), done.clone());
            let req = chat_request("chat", &prompts[i % prompts.len()], max_tokens);
            tokio::spawn(async move {
                let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
                let Ok(mut s) = TcpStream::connect(&addr).await else {
                    return h;
                };
                let mut buf = vec![0u8; 64 * 1024];
                while !stop.load(Ordering::Relaxed) {
                    let Some(first) = streamed_request(&mut s, &req, &mut buf).await else {
                        break;
                    };
                    let _ = h.record(first.as_micros().max(1) as u64);
                    done.fetch_add(1, Ordering::Relaxed);
                }
                h
            })
        })
        .collect();
    tokio::time::sleep(WINDOW).await;
    stop.store(true, Ordering::Relaxed);
    let mut ttft = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
    for t in tasks {
        if let Ok(h) = t.await {
            ttft.add(h).unwrap();
        }
    }
    Run {
        ttft,
        done: done.load(Ordering::Relaxed),
    }
}

fn gateway_config(
    dir: &std::path::Path,
    port: u16,
    replicas: &[String],
    balance: &str,
) -> std::path::PathBuf {
    let path = dir.join(format!("{balance}.yaml"));
    let list = replicas
        .iter()
        .map(|r| format!("http://{r}"))
        .collect::<Vec<_>>()
        .join(", ");
    std::fs::write(
        &path,
        format!(
            "listen: 127.0.0.1:{port}\nserver: {{ access_log: false, drain_delay: 0s }}\nroutes:\n  - model: chat\n    upstream_model: sim\n    replicas: [{list}]\n    balance: {balance}\n    classes: [ {{ name: all, concurrency: 256, queue: 256, queue_wait: 5s }} ]\n"
        ),
    )
    .unwrap();
    path
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

fn main() {
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let dir = std::env::temp_dir().join(format!("spillway-balancers-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        println!("balancers: {WINDOW:?} per run, closed-loop streaming clients through `spillway serve`");
        println!("| workload | balancer | TTFT p50 ms | TTFT p95 ms | requests/s | prefix-cache hit rate |");
        println!("|---|---|---:|---:|---:|---:|");

        // Shared prefixes.
        let prompts: Vec<String> = (0..8)
            .map(|t| {
                format!(
                    "You are tenant {t}'s assistant. {} Question: what is bounded?",
                    format!("Policy clause {t}. ").repeat(450)
                )
            })
            .collect();
        for balance in ["least_outstanding", "prefix_affinity"] {
            let base = free_port();
            let _engines = spawn(&[
                "engine",
                "--listen",
                &format!("127.0.0.1:{base}"),
                "--replicas",
                "3",
                "--model",
                "sim",
                "--preset",
                "llama-3.1-8b-h100",
                "--enable-prefix-caching",
                // Room for about three of the eight prefixes per replica: where they land matters.
                "--kv-cache-tokens",
                "10000",
                "--max-model-len",
                "4096",
            ]);
            let replicas: Vec<String> = (0..3).map(|i| format!("127.0.0.1:{}", base + i)).collect();
            for r in &replicas {
                wait_for(r).await;
            }
            let port = free_port();
            let config = gateway_config(&dir, port, &replicas, balance);
            let _gateway = spawn(&["serve", "--config", config.to_str().unwrap()]);
            let gw = format!("127.0.0.1:{port}");
            wait_for(&gw).await;
            let run = load(&gw, 24, &prompts, 32).await;
            let (mut hits, mut queries) = (0.0, 0.0);
            for r in &replicas {
                hits += metric_sum(r, "vllm:prefix_cache_hits_total").await;
                queries += metric_sum(r, "vllm:prefix_cache_queries_total").await;
            }
            println!(
                "| 8 shared 2k-token prefixes, 3 replicas | {balance} | {:.1} | {:.1} | {:.1} | {:.1}% |",
                ms(run.ttft.value_at_quantile(0.5)),
                ms(run.ttft.value_at_quantile(0.95)),
                run.done as f64 / WINDOW.as_secs_f64(),
                100.0 * hits / queries.max(1.0)
            );
        }

        // Unequal replicas.
        let prompts = vec!["Summarise the operations chapter in two lines.".to_owned()];
        for balance in ["least_outstanding", "engine_aware"] {
            let (a, b) = (free_port(), free_port());
            let _fast = spawn(&[
                "engine",
                "--listen",
                &format!("127.0.0.1:{a}"),
                "--model",
                "sim",
                "--preset",
                "llama-3.1-8b-h100",
            ]);
            let _slow = spawn(&[
                "engine",
                "--listen",
                &format!("127.0.0.1:{b}"),
                "--model",
                "sim",
                "--preset",
                "llama-3.1-8b-h100",
                "--fault-slow",
                "3",
                "--max-num-seqs",
                "8",
            ]);
            let replicas = vec![format!("127.0.0.1:{a}"), format!("127.0.0.1:{b}")];
            for r in &replicas {
                wait_for(r).await;
            }
            let port = free_port();
            let config = gateway_config(&dir, port, &replicas, balance);
            let _gateway = spawn(&["serve", "--config", config.to_str().unwrap()]);
            let gw = format!("127.0.0.1:{port}");
            wait_for(&gw).await;
            tokio::time::sleep(Duration::from_millis(1200)).await;
            let run = load(&gw, 32, &prompts, 64).await;
            println!(
                "| 2 replicas, one 3× slower with max-num-seqs 8 | {balance} | {:.1} | {:.1} | {:.1} | — |",
                ms(run.ttft.value_at_quantile(0.5)),
                ms(run.ttft.value_at_quantile(0.95)),
                run.done as f64 / WINDOW.as_secs_f64()
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    });
}
