//! `--honor-retry-after`: closed-loop clients refused with `Retry-After` wait before sending again,
//! and the waits are counted apart; without it they send again at once, as before.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use bench::client::{Client, Outcome};
use bench::load::{Driver, Sink, Stop};
use bench::spec::{Arrivals, LengthDist, Load, Slo};
use bench::stats::LevelStats;
use bench::workload::{Source, Workload};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use crate::support::options;

/// A server that refuses every request with a 503 and `Retry-After: 1`, on kept-alive connections.
async fn refusing_server() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse().unwrap());
                    while buf.len() < end + 4 + len {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    buf.drain(..end + 4 + len);
                    let body =
                        r#"{"error":{"message":"queue full","type":"overloaded","code":"queue_full"}}"#;
                    let answer = format!(
                        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if s.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    url
}

async fn level(url: &str, honor: bool, stop: Stop) -> LevelStats {
    let opts = options(url, 8, 8, "ttft_p95=1s");
    let client = Client::new(opts.target).unwrap().honoring_retry_after(honor);
    let driver = Driver {
        client,
        epoch: Instant::now(),
        arrivals: Arrivals::Poisson,
        max_in_flight: 100,
        seed: 1,
        levels: Arc::new(AtomicU64::new(0)),
    };
    let fixed = LengthDist::Fixed { tokens: 8 };
    let workload = Workload {
        source: Source::Synthetic {
            input: fixed,
            output: fixed,
        },
        long: None,
    };
    let run = driver
        .run(Load::Concurrency(2), stop, &workload, None, Sink::default())
        .await;
    assert!(
        run.records
            .iter()
            .all(|r| r.outcome == Outcome::Status { code: 503 }
                && r.retry_after == Some(Duration::from_secs(1))),
        "every answer is a 503 with Retry-After: 1"
    );
    let records: Vec<_> = run.records.iter().collect();
    LevelStats::compute(
        &records,
        run.end - run.start,
        &"ttft_p95=1s".parse::<Slo>().unwrap(),
    )
}

#[tokio::test]
async fn refused_clients_wait_what_retry_after_says_only_when_asked() {
    let url = refusing_server().await;
    // Two clients over 1.5 s, each refused at once: they send at 0 s and 1 s, then the level ends
    // during their second wait.
    let polite = level(&url, true, Stop::After(Duration::from_millis(1500))).await;
    assert_eq!(polite.requests, 4, "{polite:?}");
    let waits = polite.retry_waits.expect("the waits are reported");
    assert_eq!(waits.waits, 4);
    assert!(
        (2.8..3.2).contains(&waits.waited_seconds),
        "two full waits of 1 s and two cut at the level's end (0.5 s): {waits:?}"
    );
    // The default: the next request goes at once, and nothing is reported as waited.
    let eager = level(&url, false, Stop::Requests(40)).await;
    assert_eq!(eager.requests, 40);
    assert!(eager.retry_waits.is_none());
    assert!(
        eager.wall_seconds < 1.0,
        "no client waited: {}",
        eager.wall_seconds
    );
}
