//! The floor of the workspace's test helpers: servers that answer scripted bytes on loopback
//! ports, and polling on the runtime's clock. Nothing here knows the gateway or the engine, so the
//! crates below them (`http1`) test with these alone; `testkit` re-exports them for the rest.

use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Polls `cond` every 2 ms until it holds or `within` passes; returns whether it held.
pub async fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    cond()
}

/// Calls `probe` every 20 ms until what it returns satisfies `done` or `within` passes (on the
/// runtime's clock); returns the last value, for the test's assertion on it. For state a test
/// reads through a request (a metric, an endpoint), where [`eventually`] takes a plain condition.
pub async fn poll<T, F, Fut>(within: Duration, mut probe: F, done: impl Fn(&T) -> bool) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let value = probe().await;
        if done(&value) || tokio::time::Instant::now() >= deadline {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A server for one connection: it reads one request (head, and body by content-length) per
/// step and writes `answers[i]`; after the last it keeps the connection open, or closes it if
/// `close_after`. It ends, returning each request's peer and head, when its client closes.
pub async fn serve_script<A: AsRef<[u8]> + Send + 'static>(
    answers: Vec<A>,
    close_after: bool,
) -> (String, tokio::task::JoinHandle<Vec<String>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let mut seen = Vec::new();
        let mut answers = answers.into_iter();
        let (mut s, peer) = listener.accept().await.unwrap();
        loop {
            let mut got = Vec::new();
            let mut byte = [0u8; 1];
            while !got.ends_with(b"\r\n\r\n") {
                if s.read(&mut byte).await.unwrap_or(0) == 0 {
                    return seen;
                }
                got.push(byte[0]);
            }
            let head = String::from_utf8(got).unwrap();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .map_or(0, |v| v.trim().parse().unwrap());
            let mut body = vec![0u8; len];
            s.read_exact(&mut body).await.unwrap();
            seen.push(format!("{peer} {head}"));
            let Some(answer) = answers.next() else { return seen };
            s.write_all(answer.as_ref()).await.unwrap();
            if close_after && answers.len() == 0 {
                return seen;
            }
        }
    });
    (url, task)
}

/// Serves `text` to every request, as a `/metrics` endpoint, until the runtime ends: a metrics
/// cache frozen on one moment, or a replica whose exposition a test writes by hand.
pub async fn serve_text(text: String) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
        text.len()
    );
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                // The request is one small GET: read its head, then answer and close.
                let mut head = [0u8; 4096];
                let _ = conn.read(&mut head).await;
                let _ = conn.write_all(answer.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    url
}
