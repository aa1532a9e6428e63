//! HTTP/1.1 on the wire, as raw clients send it: several requests on one connection (pipelined,
//! or mixing the completion endpoints with the others), `Connection: close`, chunked and
//! `Expect` uploads, malformed heads, and a drain that finds connections idle or busy.

use crate::support::{Stack, TEAMS, chat, engine, http, stalling, tiny};
use serde_json::Value;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const ONE: &str = r#"
listen: 127.0.0.1:0
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}]
"#;

/// One replica behind one slot and no queue: a second request is refused while the first holds it.
const ONE_SLOT: &str = r#"
listen: 127.0.0.1:0
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}]
    classes:
      - { name: all, concurrency: 1, queue: 0, queue_wait: 1s }
"#;

/// A wire test run twice: under `server.http1: fast` (the gateway's own HTTP/1.1) and `hyper`.
macro_rules! both {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn fast() {
                super::$name("fast").await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn hyper() {
                super::$name("hyper").await;
            }
        }
    };
}

/// `yaml` served by the `http1` server.
fn serving(yaml: &str, http1: &str) -> String {
    format!("{yaml}server: {{ http1: {http1} }}\n")
}

/// One answer as it came over the wire.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: String,
}

impl Answer {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Reads one answer, framed by `content-length` or chunked; `None` once the server closed.
pub(crate) async fn read_answer(r: &mut BufReader<TcpStream>) -> Option<Answer> {
    let read = async {
        let mut line = String::new();
        loop {
            line.clear();
            if r.read_line(&mut line).await.ok()? == 0 {
                return None;
            }
            // Skip interim answers (100 Continue) and their blank line.
            if line.starts_with("HTTP/1.1 1") {
                let mut blank = String::new();
                r.read_line(&mut blank).await.ok()?;
                continue;
            }
            break;
        }
        let status: u16 = line.split(' ').nth(1)?.parse().ok()?;
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            r.read_line(&mut h).await.ok()?;
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let (n, v) = h.split_once(':')?;
            headers.push((n.trim().to_owned(), v.trim().to_owned()));
        }
        let mut answer = Answer {
            status,
            headers,
            body: String::new(),
        };
        if let Some(n) = answer.header("content-length") {
            let mut body = vec![0; n.parse().ok()?];
            r.read_exact(&mut body).await.ok()?;
            answer.body = String::from_utf8(body).ok()?;
        } else if answer.header("transfer-encoding") == Some("chunked") {
            loop {
                let mut size = String::new();
                r.read_line(&mut size).await.ok()?;
                let n = usize::from_str_radix(size.trim(), 16).ok()?;
                let mut chunk = vec![0; n + 2];
                r.read_exact(&mut chunk).await.ok()?;
                if n == 0 {
                    break;
                }
                answer.body.push_str(std::str::from_utf8(&chunk[..n]).ok()?);
            }
        }
        Some(answer)
    };
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("an answer within 20 s")
}

fn post(path: &str, body: &Value, extra: &str) -> Vec<u8> {
    let body = body.to_string();
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{extra}\r\n{body}",
        body.len()
    )
    .into_bytes()
}

async fn connect(stack: &Stack) -> BufReader<TcpStream> {
    let tcp = TcpStream::connect(stack.url.trim_start_matches("http://"))
        .await
        .unwrap();
    BufReader::new(tcp)
}

both!(pipelined_requests_are_answered_in_order_whichever_server_part_answers_them);
async fn pipelined_requests_are_answered_in_order_whichever_server_part_answers_them(http1: &str) {
    let stack = Stack::start(vec![engine(tiny()).await], &serving(ONE, http1)).await;
    let mut c = connect(&stack).await;
    // All in one write: a stream, a whole answer, a probe (which hands the connection over to
    // the router's server), then a completion again, behind it.
    let mut all = post("/v1/chat/completions", &chat("chat", 3, true), "");
    all.extend(post("/v1/chat/completions?x=1", &chat("chat", 2, false), ""));
    all.extend(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    all.extend(post(
        "/v1/completions",
        &serde_json::json!({"model": "chat", "prompt": "hi", "max_tokens": 2}),
        "",
    ));
    c.get_mut().write_all(&all).await.unwrap();

    let stream = read_answer(&mut c).await.expect("the stream");
    assert_eq!(stream.status, 200, "{stream:?}");
    assert_eq!(
        stream.header("content-type"),
        Some("text/event-stream; charset=utf-8")
    );
    assert!(
        stream.header("date").is_some_and(|d| d.ends_with(" GMT")),
        "{stream:?}"
    );
    assert!(stream.header("x-request-id").is_some(), "{stream:?}");
    assert!(
        stream.body.trim_end().ends_with("data: [DONE]"),
        "{}",
        stream.body
    );
    let whole = read_answer(&mut c).await.expect("the whole answer");
    assert_eq!(whole.status, 200, "{whole:?}");
    let v: Value = serde_json::from_str(&whole.body).unwrap();
    assert_eq!(v["object"], "chat.completion", "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 2, "{v}");
    let probe = read_answer(&mut c).await.expect("the probe");
    assert_eq!(probe.status, 200, "{probe:?}");
    let last = read_answer(&mut c).await.expect("the completion after the probe");
    assert_eq!(last.status, 200, "{last:?}");
    let v: Value = serde_json::from_str(&last.body).unwrap();
    assert_eq!(v["object"], "text_completion", "{v}");
    let records = stack.records();
    assert_eq!(records.len(), 3, "{records:?}");
    assert!(records.iter().all(|r| r.status == 200), "{records:?}");
}

both!(connection_close_is_answered_then_done_and_keep_alive_is_not);
async fn connection_close_is_answered_then_done_and_keep_alive_is_not(http1: &str) {
    let stack = Stack::start(vec![engine(tiny()).await], &serving(ONE, http1)).await;
    let mut c = connect(&stack).await;
    c.get_mut()
        .write_all(&post("/v1/chat/completions", &chat("chat", 2, false), ""))
        .await
        .unwrap();
    let first = read_answer(&mut c).await.expect("an answer");
    assert_eq!(first.status, 200);
    assert_eq!(first.header("connection"), None, "kept alive: {first:?}");
    c.get_mut()
        .write_all(&post(
            "/v1/chat/completions",
            &chat("chat", 2, true),
            "Connection: close\r\n",
        ))
        .await
        .unwrap();
    let second = read_answer(&mut c)
        .await
        .expect("an answer on the same connection");
    assert_eq!(second.status, 200);
    assert_eq!(second.header("connection"), Some("close"), "{second:?}");
    assert!(second.body.contains("[DONE]"), "{}", second.body);
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut rest))
        .await
        .expect("closed after the answer")
        .unwrap();
    assert_eq!(
        n,
        0,
        "nothing after the answer: {:?}",
        String::from_utf8_lossy(&rest)
    );
}

both!(chunked_and_expect_uploads_and_bad_lengths_are_answered_too);
async fn chunked_and_expect_uploads_and_bad_lengths_are_answered_too(http1: &str) {
    let stack = Stack::start(vec![engine(tiny()).await], &serving(ONE, http1)).await;
    let body = chat("chat", 2, false).to_string();

    let mut c = connect(&stack).await;
    let (a, b) = body.split_at(10);
    let chunked = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
        a.len(),
        b.len()
    );
    c.get_mut().write_all(chunked.as_bytes()).await.unwrap();
    let answer = read_answer(&mut c).await.expect("an answer to a chunked upload");
    assert_eq!(answer.status, 200, "{answer:?}");

    let mut c = connect(&stack).await;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    c.get_mut().write_all(head.as_bytes()).await.unwrap();
    let mut interim = String::new();
    tokio::time::timeout(Duration::from_secs(5), c.read_line(&mut interim))
        .await
        .expect("100 Continue before the body")
        .unwrap();
    assert!(interim.starts_with("HTTP/1.1 100"), "{interim}");
    let mut blank = String::new();
    c.read_line(&mut blank).await.unwrap();
    c.get_mut().write_all(body.as_bytes()).await.unwrap();
    let answer = read_answer(&mut c).await.expect("an answer after 100 Continue");
    assert_eq!(answer.status, 200, "{answer:?}");

    let mut c = connect(&stack).await;
    c.get_mut()
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1x\r\n\r\n{}")
        .await
        .unwrap();
    let answer = read_answer(&mut c).await.expect("an answer to a bad length");
    assert_eq!(answer.status, 400, "{answer:?}");

    // A head the front leaves to hyper reaches it whole, after blank lines that are skipped.
    let mut c = connect(&stack).await;
    let head = format!(
        "\r\n\r\nPOST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {0}\r\nContent-Length: {0}\r\n\r\n{body}",
        body.len()
    );
    c.get_mut().write_all(head.as_bytes()).await.unwrap();
    let answer = read_answer(&mut c).await.expect("an answer to a repeated length");
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(
        stack.engines[0].engine.records().len(),
        3,
        "only the three good uploads reached the replica"
    );
}

both!(a_client_that_closes_mid_stream_frees_its_slot);
async fn a_client_that_closes_mid_stream_frees_its_slot(http1: &str) {
    let stack = Stack::start(vec![engine(stalling(2)).await], &serving(ONE_SLOT, http1)).await;
    let mut c = connect(&stack).await;
    c.get_mut()
        .write_all(&post("/v1/chat/completions", &chat("chat", 50, true), ""))
        .await
        .unwrap();
    // The head and the first tokens arrive; the replica then stalls with the slot held.
    let mut line = String::new();
    tokio::time::timeout(Duration::from_secs(5), c.read_line(&mut line))
        .await
        .expect("the head")
        .unwrap();
    assert!(line.starts_with("HTTP/1.1 200"), "{line}");
    drop(c);
    the_slot_frees(&stack, Duration::from_secs(5), "a client that left").await;
}

/// Asks for a stream until one is admitted: the class's one slot, held by `whose` request, is
/// free again within `within`.
async fn the_slot_frees(stack: &Stack, within: Duration, whose: &str) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let r = stack.stream("chat", 2).await;
        if r.status() == 200 {
            // Read to its end: a probe dropped after its head would race the rest of its stream
            // and might end as a client's disconnect, which these tests count.
            let body = r.text().await.unwrap();
            assert!(body.contains("[DONE]"), "{body}");
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slot of {whose} is still held: {}",
            r.status()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

both!(a_client_that_sends_ahead_then_closes_its_side_gets_the_answer_in_progress);
async fn a_client_that_sends_ahead_then_closes_its_side_gets_the_answer_in_progress(http1: &str) {
    let stack = Stack::start(vec![engine(tiny()).await], &serving(ONE, http1)).await;
    let mut c = connect(&stack).await;
    let mut both = post("/v1/chat/completions", &chat("chat", 3, true), "");
    both.extend(post("/v1/chat/completions", &chat("chat", 2, false), ""));
    c.get_mut().write_all(&both).await.unwrap();
    c.get_mut().shutdown().await.unwrap();
    // The request read ahead keeps the first one's client counted as present, as with hyper.
    // The second one then finds the client's side closed and nothing more to read: like hyper
    // (half_close off), that is a client that has left, and the connection closes.
    let first = read_answer(&mut c).await.expect("the first answer");
    assert_eq!(first.status, 200, "{first:?}");
    assert!(first.body.contains("[DONE]"), "{}", first.body);
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut rest))
        .await
        .expect("the connection closes")
        .unwrap();
}

both!(a_request_sent_a_byte_at_a_time_is_served);
async fn a_request_sent_a_byte_at_a_time_is_served(http1: &str) {
    let stack = Stack::start(vec![engine(tiny()).await], &serving(ONE, http1)).await;
    let mut c = connect(&stack).await;
    c.get_mut().set_nodelay(true).unwrap();
    // Bare LF line ends as well as CRLF, and every cut point, including inside "\r\n\r\n".
    let mut raw = post("/v1/chat/completions", &chat("chat", 2, false), "");
    raw.extend(b"POST /v1/chat/completions HTTP/1.1\nHost: x\nContent-Length: ");
    let body = chat("chat", 2, false).to_string();
    raw.extend(format!("{}\n\n{body}", body.len()).as_bytes());
    for b in raw {
        c.get_mut().write_all(&[b]).await.unwrap();
        // The pacing is the behaviour under test: each byte its own segment.
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    for which in ["CRLF", "LF"] {
        let answer = read_answer(&mut c).await.expect("an answer");
        assert_eq!(answer.status, 200, "{which}: {answer:?}");
    }
}

both!(a_client_that_stops_reading_is_cut_after_send_timeout_and_frees_its_slot);
async fn a_client_that_stops_reading_is_cut_after_send_timeout_and_frees_its_slot(http1: &str) {
    stopped_reader_is_cut(false, http1).await;
}

both!(a_client_that_stops_reading_is_cut_on_a_connection_hyper_serves_too);
/// The same through hyper's server: a chunked upload hands the connection over.
async fn a_client_that_stops_reading_is_cut_on_a_connection_hyper_serves_too(http1: &str) {
    stopped_reader_is_cut(true, http1).await;
}

async fn stopped_reader_is_cut(chunked_upload: bool, http1: &str) {
    let stack = one_slot_on_a_zero_cost_engine(http1).await;
    // A client with a small receive window that never reads: a long stream fills its window and
    // the gateway's send buffer, and the gateway's write blocks.
    let mut c = client_with_window(&stack, 4096).await;
    // Four sequences of 30,000 tokens: about 20 MB of events, far more than the loopback's
    // buffers hold (tcp_wmem's largest send buffer is 4 MB on a default Linux).
    let mut long = chat("chat", 30_000, true);
    long["ignore_eos"] = true.into();
    long["n"] = 4.into();
    let request = if chunked_upload {
        let body = long.to_string();
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
            body.len()
        )
        .into_bytes()
    } else {
        post("/v1/chat/completions", &long, "")
    };
    c.write_all(&request).await.unwrap();
    // Its answer has begun (so it holds the slot); it reads no more than that.
    let mut status = [0u8; 12];
    tokio::time::timeout(Duration::from_secs(5), c.read_exact(&mut status))
        .await
        .expect("the answer begins")
        .unwrap();
    assert_eq!(&status, b"HTTP/1.1 200");
    is_cut_after_send_timeout(&stack, "a client that stopped reading").await;
}

both!(a_client_that_reads_slowly_gets_the_whole_stream);
/// A client that reads slowly (2 KiB at a time, half a millisecond apart) while the replica
/// streams as fast as it is read gets the whole stream, counted whole. Whether the gateway's own
/// writes wait depends on how much the kernel's send buffer takes (up to 4 MB by default, more
/// than this stream): `front`'s unit tests cover a write that waits and a chunk that becomes
/// ready meanwhile.
///
/// Its receive buffer is small, but not 4 KiB: with one that small, Linux's sender can be left
/// with a window just under the segment size it bounds to half the largest window seen, and then
/// sends only a zero-window probe's worth every 200 ms (about 10 KB/s; `ss -tnoi` shows the
/// gateway's socket with `timer:(persist…)`, `snd_wnd` below `mss`, and the rest of the stream
/// unsent in the kernel). That took this test past its 60 s in 3 of 140 runs on a loaded
/// machine, with the gateway done and its record written: the kernel's pace, not the gateway's.
async fn a_client_that_reads_slowly_gets_the_whole_stream(http1: &str) {
    let stack = one_slot_on_a_zero_cost_engine(http1).await;
    let mut c = client_with_window(&stack, 64 * 1024).await;
    let tokens = 6_000;
    let mut long = chat("chat", tokens, true);
    long["ignore_eos"] = true.into();
    c.write_all(&post("/v1/chat/completions", &long, ""))
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut piece = [0u8; 2048];
    let read_all = async {
        while !got.ends_with(b"\r\n0\r\n\r\n") {
            let n = c.read(&mut piece).await.unwrap();
            assert!(n > 0, "the connection closed before the stream's end");
            got.extend_from_slice(&piece[..n]);
            // The slow reader is the behaviour under test.
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
    };
    if tokio::time::timeout(Duration::from_secs(60), read_all)
        .await
        .is_err()
    {
        panic!(
            "the whole stream did not arrive in 60 s: {} bytes came, the last {:?}; {}",
            got.len(),
            String::from_utf8_lossy(&got[got.len().saturating_sub(200)..]),
            where_things_stand(&stack).await
        );
    }
    assert!(got.starts_with(b"HTTP/1.1 200"));
    assert!(
        got.ends_with(b"data: [DONE]\n\n\r\n0\r\n\r\n"),
        "ends with [DONE]: {:?}",
        String::from_utf8_lossy(&got[got.len().saturating_sub(300)..])
    );
    let records = stack.records();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].outcome, "ok", "{:?}", records[0]);
    assert_eq!(records[0].tokens_out, Some(tokens), "{:?}", records[0]);
}

/// For a test that timed out: the gateway's records and gauges, and the replica's, each read
/// within a few seconds (a part that hangs says so instead).
async fn where_things_stand(stack: &Stack) -> String {
    let gauges = |url: String, names: &'static [&'static str]| async move {
        let get = http().get(url).timeout(Duration::from_secs(5)).send();
        match async { get.await?.text().await }.await {
            Ok(text) => text
                .lines()
                .filter(|l| names.iter().any(|n| l.starts_with(n)))
                .collect::<Vec<_>>()
                .join("; "),
            Err(e) => format!("no metrics: {e}"),
        }
    };
    let gateway = gauges(
        format!("{}/metrics", stack.url),
        &[
            "spillway_in_flight",
            "spillway_connections",
            "spillway_send_timeouts_total",
        ],
    )
    .await;
    let engine = gauges(
        format!("{}/metrics", stack.engines[0].url()),
        &[
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:generation_tokens_total",
        ],
    )
    .await;
    format!(
        "records {:?}; gateway {gateway}; replica {engine}",
        stack.records()
    )
}

/// A connection to the gateway with a receive buffer of `bytes`: a client that reads less than
/// the stream brings soon makes the gateway's writes wait.
async fn client_with_window(stack: &Stack, bytes: u32) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(bytes).unwrap();
    socket
        .connect(stack.url.trim_start_matches("http://").parse().unwrap())
        .await
        .unwrap()
}

/// One slot, no queue, a one-second `send_timeout`, and an engine that streams as fast as the
/// gateway takes its events.
async fn one_slot_on_a_zero_cost_engine(http1: &str) -> Stack {
    let yaml = format!("{ONE_SLOT}server: {{ send_timeout: 1s, http1: {http1} }}\n");
    let mut zero = engine::EngineConfig::preset(engine::Preset::Zero);
    zero.model = crate::support::UPSTREAM_MODEL.into();
    Stack::start(vec![engine(zero).await], &yaml).await
}

/// The stream `whose` client stopped reading, begun now, is cut no sooner than `send_timeout`
/// (its write blocked some time after the answer began, the cut came a timeout later): its slot
/// is free again, the cut counted once, its record says the client left. The records, for more.
async fn is_cut_after_send_timeout(
    stack: &Stack,
    whose: &str,
) -> Vec<spillway_gateway::access_log::AccessRecord> {
    let began = tokio::time::Instant::now();
    the_slot_frees(stack, Duration::from_secs(20), whose).await;
    assert!(
        began.elapsed() >= Duration::from_secs(1),
        "cut before send_timeout: {:?}",
        began.elapsed()
    );
    let metrics = stack.metrics().await;
    assert!(
        metrics.lines().any(|l| l == "spillway_send_timeouts_total 1"),
        "the cut is counted once"
    );
    let records = stack.records();
    let cut: Vec<_> = records
        .iter()
        .filter(|r| r.outcome == "client_disconnect")
        .collect();
    assert_eq!(
        cut.len(),
        1,
        "one request ended as its client's disconnect: {records:?}"
    );
    assert!(
        cut[0].tokens_out.is_some_and(|t| t > 2),
        "and it is the long stream: {:?}",
        cut[0]
    );
    records
}

both!(a_streams_head_says_the_same_whichever_server_part_writes_it);
/// A stream's head is written by the front (a plain upload), by hyper's HTTP/1.1 (a chunked
/// upload, which the front hands over) and by hyper's HTTP/2: each says the same, each field
/// once, its team's rate limits included.
async fn a_streams_head_says_the_same_whichever_server_part_writes_it(http1: &str) {
    // Three requests, within `search`'s rpm: 3; its key is "test".
    let stack = Stack::start(vec![engine(tiny()).await], &serving(TEAMS, http1)).await;
    let check = |how: &str, headers: Vec<(String, String)>, id: &str| {
        let all = |name: &str| -> Vec<&str> {
            headers
                .iter()
                .filter(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
                .collect()
        };
        assert_eq!(
            all("content-type"),
            ["text/event-stream; charset=utf-8"],
            "{how}: {headers:?}"
        );
        assert_eq!(all("cache-control"), ["no-cache"], "{how}: {headers:?}");
        assert_eq!(all("x-request-id"), [id], "{how}: {headers:?}");
        let timing = all("server-timing");
        assert_eq!(timing.len(), 1, "{how}: {headers:?}");
        assert!(
            timing[0].starts_with("queue;dur=") && timing[0].contains(", upstream;dur="),
            "{how}: {timing:?}"
        );
        assert_eq!(all("x-ratelimit-limit-requests"), ["3"], "{how}: {headers:?}");
        assert_eq!(all("x-ratelimit-limit-tokens"), ["1000"], "{how}: {headers:?}");
        for name in [
            "x-ratelimit-remaining-requests",
            "x-ratelimit-reset-requests",
            "x-ratelimit-remaining-tokens",
            "x-ratelimit-reset-tokens",
        ] {
            assert_eq!(all(name).len(), 1, "{how}: {name}: {headers:?}");
        }
    };
    let body = chat("chat", 3, true).to_string();

    let mut c = connect(&stack).await;
    let plain = post(
        "/v1/chat/completions",
        &chat("chat", 3, true),
        "X-Request-Id: front-1\r\nAuthorization: Bearer test\r\n",
    );
    c.get_mut().write_all(&plain).await.unwrap();
    let a = read_answer(&mut c).await.expect("the front's answer");
    assert!(a.body.trim_end().ends_with("data: [DONE]"), "{}", a.body);
    check("front", a.headers, "front-1");

    let mut c = connect(&stack).await;
    let chunked = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: hyper-1\r\nAuthorization: Bearer test\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
        body.len()
    );
    c.get_mut().write_all(chunked.as_bytes()).await.unwrap();
    let a = read_answer(&mut c).await.expect("hyper's answer");
    assert!(a.body.trim_end().ends_with("data: [DONE]"), "{}", a.body);
    check("hyper HTTP/1.1", a.headers, "hyper-1");

    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let r = h2
        .post(format!("{}/v1/chat/completions", stack.url))
        .header("x-request-id", "h2-1")
        .bearer_auth("test")
        .json(&chat("chat", 3, true))
        .send()
        .await
        .unwrap();
    assert_eq!(
        (r.version(), r.status().as_u16()),
        (reqwest::Version::HTTP_2, 200)
    );
    let headers = r
        .headers()
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
        .collect();
    let text = r.text().await.unwrap();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    check("hyper HTTP/2", headers, "h2-1");
}

/// HTTP/2: a client that stops reading one stream keeps its connection alive (it answers pings)
/// but gives that stream no more window, so the socket never blocks. The stream is cut after
/// `send_timeout` all the same, and its slot freed; the connection goes on serving other streams,
/// and the cut stream ends in an error for the client, never as a whole one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_stream_its_client_stops_reading_is_cut_after_send_timeout() {
    let stack = one_slot_on_a_zero_cost_engine("fast").await;
    // A small window per stream, a large one for the connection: one stream shut does not shut
    // the others.
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .http2_initial_stream_window_size(65_535)
        .http2_initial_connection_window_size(16 << 20)
        .build()
        .unwrap();
    let whole_stream = || async {
        let r = h2_stream(&h2, &stack, chat("chat", 5, true)).await;
        r.text().await.unwrap()
    };
    // A stream read to its end ends whole, as on HTTP/1.1.
    let text = whole_stream().await;
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let mut long = chat("chat", 30_000, true);
    long["ignore_eos"] = true.into();
    let held = h2_stream(&h2, &stack, long).await;
    let records = is_cut_after_send_timeout(&stack, "an HTTP/2 stream nobody reads").await;
    assert!(
        records
            .iter()
            .any(|r| r.outcome == "ok" && r.tokens_out == Some(5)),
        "the whole stream's record: {records:?}"
    );
    // The client (reqwest multiplexes its HTTP/2 streams) is served another stream whole while
    // the cut one is still unread.
    let text = whole_stream().await;
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    // Read at last, the cut stream gives what was relayed before the cut, then an error.
    let rest = tokio::time::timeout(Duration::from_secs(10), held.text())
        .await
        .expect("the cut stream ends");
    assert!(rest.is_err(), "a cut stream must not read as a whole one");
}

/// HTTP/2: a client that resets its stream (drops the response) frees the slot at once, well
/// before `send_timeout`, and nothing counts it as a timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_stream_its_client_resets_ends_at_once() {
    let yaml = format!("{ONE_SLOT}server: {{ send_timeout: 1h }}\n");
    let stack = Stack::start(vec![engine(stalling(2)).await], &yaml).await;
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let held = h2_stream(&h2, &stack, chat("chat", 50, true)).await;
    drop(held);
    the_slot_frees(
        &stack,
        Duration::from_secs(5),
        "an HTTP/2 stream its client reset",
    )
    .await;
    let metrics = stack.metrics().await;
    assert!(
        metrics.lines().any(|l| l == "spillway_send_timeouts_total 0"),
        "a reset is no timeout"
    );
}

/// A chat stream asked over HTTP/2, its answer begun: the head only has been read.
async fn h2_stream(h2: &reqwest::Client, stack: &Stack, body: Value) -> reqwest::Response {
    let r = h2
        .post(format!("{}/v1/chat/completions", stack.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.version(), reqwest::Version::HTTP_2);
    assert_eq!(r.status(), 200);
    r
}

/// The public port keeps of a request's head only the headers the request path reads, a class
/// rule's among them: the rules of the table in force once the body is in, even when a reload
/// between the head and the body brought the rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rules_header_counts_when_a_reload_brings_the_rule_between_head_and_body() {
    let stack = Stack::start(vec![engine(tiny()).await], &serving(ONE, "fast")).await;
    let mut c = connect(&stack).await;
    let body = chat("chat", 3, false).to_string();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nx-workload: batch\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    c.get_mut().write_all(head.as_bytes()).await.unwrap();
    // Time for the gateway to read the head; if it has not, the rule is in force when it does.
    // Kept fixed: nothing the gateway exposes says that a head without its body has been read.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // ONE, with a class that a header puts requests in.
    let with_rule = format!(
        "{ONE}    classes:
      - {{ name: interactive, concurrency: 8, queue: 8, queue_wait: 2s }}
      - name: batch
        when: {{ header: {{ name: X-Workload, value: batch }} }}
        concurrency: 1
        queue: 2
        queue_wait: 3s
"
    );
    let config = spillway_gateway::config::Config::from_yaml(&stack.fill(&with_rule)).unwrap();
    stack.gateway.reload(config).unwrap();
    c.get_mut().write_all(body.as_bytes()).await.unwrap();
    let a = read_answer(&mut c).await.unwrap();
    assert_eq!(a.status, 200, "{}", a.body);
    let records = stack.records();
    assert_eq!(records.len(), 1);
    assert_eq!(&*records[0].class, "batch", "{records:?}");
    // And a request without the header is not put there.
    c.get_mut()
        .write_all(&post("/v1/chat/completions", &chat("chat", 3, false), ""))
        .await
        .unwrap();
    assert_eq!(read_answer(&mut c).await.unwrap().status, 200);
    assert_eq!(&*stack.records()[1].class, "interactive");
}
