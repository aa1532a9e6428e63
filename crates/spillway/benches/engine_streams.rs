//! One engine process holding thousands of concurrent streams: step lateness against the cost
//! model, CPU per generated token, and memory per active stream.
//!
//! `cargo bench -p spillway --bench engine_streams [-- STREAMS [PRESET]]` (default 2000,
//! llama-3.1-8b-h100); each stream asks for 160 tokens and asks again when it ends. The engine runs as its own process (the release binary) so that its CPU and
//! RSS are its own; the load is raw HTTP/1.1 streams that are read and discarded, so the client
//! spends as little of the shared CPU as it can.

#[allow(dead_code)]
mod common;

use common::{free_port, proc_stat};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

async fn get(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default()
}

async fn reset_lateness(addr: &str) {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let req =
        "POST /admin/lateness/reset HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
}

async fn state(addr: &str) -> serde_json::Value {
    serde_json::from_str(&get(addr, "/admin/state").await).unwrap_or_default()
}

/// Keeps one streamed completion open at all times on a keep-alive connection: when an answer ends
/// (the chunked body's terminator), the next request goes out at once. Returns bytes read.
async fn stream(addr: String, max_tokens: u32, stop: tokio::sync::watch::Receiver<bool>) -> u64 {
    let Ok(mut s) = TcpStream::connect(&addr).await else {
        return 0;
    };
    let body = format!(r#"{{"model":"sim","prompt":"hello there","max_tokens":{max_tokens},"stream":true}}"#);
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut buf = vec![0u8; 16 * 1024];
    let mut total = 0;
    let mut stop = stop;
    'requests: loop {
        if s.write_all(req.as_bytes()).await.is_err() {
            return total;
        }
        let mut tail = Vec::with_capacity(8);
        loop {
            tokio::select! {
                r = s.read(&mut buf) => match r {
                    Ok(0) | Err(_) => return total,
                    Ok(n) => {
                        total += n as u64;
                        tail.extend_from_slice(&buf[n.saturating_sub(5)..n]);
                        if tail.len() > 5 {
                            tail.drain(..tail.len() - 5);
                        }
                        if tail == b"0\r\n\r\n" {
                            continue 'requests;
                        }
                    }
                },
                _ = stop.changed() => return total,
            }
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let streams: u32 = args.first().and_then(|a| a.parse().ok()).unwrap_or(2000);
    let preset = args.get(1).cloned().unwrap_or_else(|| "llama-3.1-8b-h100".into());
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(streams, preset));
}

async fn run(streams: u32, preset: String) {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args(["engine", "--listen", &addr, "--model", "sim", "--preset", &preset])
        .args(["--max-num-seqs", "2048", "--max-num-batched-tokens", "8192"])
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the engine");
    let pid = child.id().unwrap();
    let t0 = Instant::now();
    while TcpStream::connect(&addr).await.is_err() {
        assert!(t0.elapsed() < Duration::from_secs(10), "engine did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, rss_idle) = proc_stat(pid);

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    // Ramp up over two seconds, as clients arrive; long answers keep every stream active.
    for i in 0..streams {
        tasks.push(tokio::spawn(stream(addr.clone(), 160, stop_rx.clone())));
        if i % 100 == 99 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let ramp = Instant::now();
    loop {
        let s = state(&addr).await;
        let held = s["running"].as_u64().unwrap_or(0) + s["waiting"].as_u64().unwrap_or(0);
        if held * 100 >= u64::from(streams) * 95 || ramp.elapsed() > Duration::from_secs(30) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    reset_lateness(&addr).await;
    let before = state(&addr).await;
    let (cpu0, _) = proc_stat(pid);
    let (client0, _) = proc_stat(std::process::id());
    let w0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (cpu1, rss_busy) = proc_stat(pid);
    let (client1, _) = proc_stat(std::process::id());
    let after = state(&addr).await;
    let window = w0.elapsed().as_secs_f64();
    let _ = stop_tx.send(true);
    let mut bytes = 0;
    for t in tasks {
        bytes += t.await.unwrap_or(0);
    }
    let tokens =
        after["generated_tokens"].as_u64().unwrap_or(0) - before["generated_tokens"].as_u64().unwrap_or(0);
    let steps = after["steps"].as_u64().unwrap_or(0) - before["steps"].as_u64().unwrap_or(0);
    let cpu = cpu1 - cpu0;
    println!("engine_streams: preset {preset}, {streams} streams, window {window:.1} s");
    println!(
        "  in the engine at the end  {} running, {} waiting; {} preemptions in the window",
        after["running"],
        after["waiting"],
        after["preemptions"].as_u64().unwrap_or(0) - before["preemptions"].as_u64().unwrap_or(0)
    );
    println!(
        "  steps                     {steps} ({:.1} ms/step)",
        window * 1e3 / steps.max(1) as f64
    );
    println!(
        "  generated tokens          {tokens} ({:.0} tok/s)",
        tokens as f64 / window
    );
    println!(
        "  step lateness µs (window) p50 {} p99 {} max {}",
        after["step_lateness_us"]["p50"], after["step_lateness_us"]["p99"], after["step_lateness_us"]["max"]
    );
    println!(
        "  engine CPU                {:.2} cores ({:.2} µs per generated token)",
        cpu / window,
        cpu * 1e6 / tokens.max(1) as f64
    );
    println!(
        "  engine RSS                idle {:.1} MiB, busy {:.1} MiB: {:.1} KB per active stream",
        rss_idle as f64 / 1024.0,
        rss_busy as f64 / 1024.0,
        (rss_busy.saturating_sub(rss_idle)) as f64 / f64::from(streams)
    );
    println!(
        "  load generator CPU        {:.2} cores (same machine)",
        (client1 - client0) / window
    );
    println!(
        "  client read               {:.1} MiB",
        bytes as f64 / 1_048_576.0
    );
    let _ = child.kill().await;
}
