//! One overload burst through the gateway, and what it did: who was admitted, how fast the others
//! were turned away, and how long the engines' own queues grew.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bench::client::{Client, Outcome, Record, Target};
use bench::load::{Driver, Sink, Stop};
use bench::spec::{Arrivals, Load};
use bench::stats::percentile;
use bench::workload::Workload;
use engine::Engine;
use gateway::Gateway;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

/// What one burst measured; every figure comes from this run's records and samples.
#[derive(Debug, Clone)]
pub(crate) struct Outcomes {
    pub sent: usize,
    pub admitted: usize,
    pub rejected: usize,
    /// Answers that were neither a 200 stream nor a 503/429 (timeouts, 504s, broken streams).
    pub failed: usize,
    pub ttft_p50: Option<f64>,
    pub ttft_p95: Option<f64>,
    /// Admitted requests whose TTFT met the objective, out of those admitted.
    pub inside_slo: Option<f64>,
    pub max_engine_waiting: usize,
    pub max_gateway_queued: u32,
    pub reject_p50: Option<f64>,
    pub reject_max: Option<f64>,
    /// The `Retry-After` of a 503 seen by a probe mid-burst, when one was refused.
    pub retry_after: Option<String>,
    /// From the first request sent until the last answer ended.
    pub wall: f64,
}

/// The burst both runs send: the same requests at the same times.
#[derive(Debug, Clone)]
pub(crate) struct Shape {
    pub target: Target,
    pub workload: Workload,
    /// Requests per second, evenly spaced.
    pub rate: f64,
    pub length: Duration,
    pub ttft_slo: Duration,
}

/// Sends the burst and samples the engines' waiting queues and the gateway's queue while its
/// requests run; with `probe`, also reads a refusal's `Retry-After` mid-burst.
pub(crate) async fn run(
    shape: &Shape,
    engines: &[Engine],
    gateway: &Arc<Gateway>,
    probe: Option<std::net::SocketAddr>,
) -> Result<Outcomes, bench::BenchError> {
    let length = shape.length;
    let driver = Driver {
        client: Client::new(shape.target.clone())?,
        epoch: Instant::now(),
        arrivals: Arrivals::Constant,
        max_in_flight: 100_000,
        seed: 7,
        levels: Arc::default(),
    };
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let engines = engines.to_vec();
        let gateway = gateway.clone();
        let done = done.clone();
        tokio::spawn(async move {
            let (mut waiting, mut queued) = (0usize, 0u32);
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            while !done.load(Ordering::Relaxed) {
                tick.tick().await;
                waiting = waiting.max(engines.iter().map(|e| e.snapshot().waiting).sum());
                queued = queued.max(
                    gateway
                        .admission(super::MODEL, super::CLASS)
                        .map_or(0, |a| a.queued()),
                );
            }
            (waiting, queued)
        })
    };
    let prober = probe.map(|addr| {
        tokio::spawn(async move {
            // Into the burst, when the queue has had time to fill.
            tokio::time::sleep(length / 2).await;
            for _ in 0..20 {
                if let Some(v) = refused_retry_after(addr).await {
                    return Some(v);
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            None
        })
    });
    let run = driver
        .run(
            Load::Rate(shape.rate),
            Stop::After(length),
            &shape.workload,
            None,
            Sink::default(),
        )
        .await;
    done.store(true, Ordering::Relaxed);
    let (max_engine_waiting, max_gateway_queued) = sampler.await.unwrap_or((0, 0));
    let retry_after = match prober {
        Some(p) => p.await.ok().flatten(),
        None => None,
    };
    Ok(summarize(
        &run.records,
        shape.ttft_slo,
        max_engine_waiting,
        max_gateway_queued,
        retry_after,
        (run.end - run.start).as_secs_f64(),
    ))
}

fn summarize(
    records: &[Record],
    ttft_slo: Duration,
    max_engine_waiting: usize,
    max_gateway_queued: u32,
    retry_after: Option<String>,
    wall: f64,
) -> Outcomes {
    let refused = |r: &&Record| matches!(r.outcome, Outcome::Status { code: 503 | 429 });
    let mut ttft: Vec<f64> = records
        .iter()
        .filter(|r| r.ok())
        .filter_map(|r| r.ttft.map(|t| t.as_secs_f64()))
        .collect();
    ttft.sort_by(f64::total_cmp);
    let mut reject: Vec<f64> = records
        .iter()
        .filter(refused)
        .map(|r| r.e2e.as_secs_f64())
        .collect();
    reject.sort_by(f64::total_cmp);
    let admitted = records.iter().filter(|r| r.ok()).count();
    let rejected = reject.len();
    let slo = ttft_slo.as_secs_f64();
    Outcomes {
        sent: records.len(),
        admitted,
        rejected,
        failed: records.len() - admitted - rejected,
        ttft_p50: percentile(&ttft, 50.0),
        ttft_p95: percentile(&ttft, 95.0),
        inside_slo: (!ttft.is_empty())
            .then(|| ttft.iter().filter(|t| **t <= slo).count() as f64 / ttft.len() as f64),
        max_engine_waiting,
        max_gateway_queued,
        reject_p50: percentile(&reject, 50.0),
        reject_max: reject.last().copied(),
        retry_after,
        wall,
    }
}

/// One streamed request by hand, to read the head bytes the load generator does not keep: the
/// `Retry-After` of a 503, or `None` when the request was admitted (then it is dropped at once).
async fn refused_retry_after(addr: std::net::SocketAddr) -> Option<String> {
    let body = format!(
        r#"{{"model":"{}","messages":[{{"role":"user","content":"probe"}}],"max_tokens":4,"stream":true}}"#,
        super::MODEL
    );
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let exchange = async {
        let mut conn = tokio::net::TcpStream::connect(addr).await.ok()?;
        conn.write_all(request.as_bytes()).await.ok()?;
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = conn.read(&mut buf).await.ok()?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8_lossy(&head).into_owned();
        if !text.starts_with("HTTP/1.1 503") {
            return None;
        }
        text.lines().find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("retry-after")
                .then(|| value.trim().to_owned())
        })
    };
    tokio::time::timeout(Duration::from_secs(2), exchange)
        .await
        .ok()
        .flatten()
}
