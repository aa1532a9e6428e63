//! Helpers shared by the benchmarks of this crate.

/// CPU seconds (user + system) and resident memory (KiB) of a process, from /proc.
pub(crate) fn proc_stat(pid: u32) -> (f64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let ticks = 100.0; // USER_HZ on Linux
    let cpu = fields.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
        + fields.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss_kb = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (cpu / ticks, rss_kb)
}

/// A port that was free a moment ago on 127.0.0.1.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The bytes of a streamed chat-completion request for a keep-alive HTTP/1.1 connection.
pub(crate) fn chat_request(model: &str, content: &str, max_tokens: u32) -> Vec<u8> {
    let body = format!(
        r#"{{"model":"{model}","messages":[{{"role":"user","content":{}}}],"max_tokens":{max_tokens},"stream":true}}"#,
        serde_json::Value::from(content)
    );
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer sk-bench\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Sends one streamed request on a keep-alive connection and reads the chunked answer to its end.
/// Returns the time to the first `data:` bytes; `None` if the answer was not a 200 or the
/// connection failed (the connection is then unusable).
pub(crate) async fn streamed_request(
    s: &mut tokio::net::TcpStream,
    req: &[u8],
    buf: &mut [u8],
) -> Option<std::time::Duration> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let sent = tokio::time::Instant::now();
    s.write_all(req).await.ok()?;
    let mut first = None;
    let mut seen_head = false;
    let mut tail: Vec<u8> = Vec::new();
    loop {
        let n = match s.read(buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => n,
        };
        let chunk = &buf[..n];
        if !seen_head {
            if !chunk.starts_with(b"HTTP/1.1 200") {
                return None;
            }
            seen_head = true;
        }
        if first.is_none() && chunk.windows(6).any(|w| w == b"data: ") {
            first = Some(sent.elapsed());
        }
        tail.extend_from_slice(&chunk[n.saturating_sub(5)..]);
        if tail.len() > 5 {
            tail.drain(..tail.len() - 5);
        }
        if tail == b"0\r\n\r\n" {
            return first;
        }
    }
}
