//! Against a real vLLM 0.32 (its CPU build, a tiny Llama with dummy weights; `scripts/vllm.sh`
//! installs it and docs/vllm.md says what it shows). `#[ignore]`d in a plain `cargo test`:
//! scripts/test.sh runs them on their own, after the rest, so the servers' CPU does not slow the
//! other tests. Without an install they skip with a note, or fail when `CI` is set or
//! `SPILLWAY_VLLM_REQUIRED=1`.
//!
//! Two servers are shared by every test of the process (a start costs a minute of CPU) and stop
//! when it exits: `plain()` (at most 4 sequences a step, at most 8 requests in flight:
//! `--max-num-queued-reqs 8`) and `think()` (a `<think>` template and
//! `--reasoning-parser deepseek_r1`: its output is all `delta.reasoning`). The tests take one
//! lock, so they run one at a time whatever `--test-threads` says: each reads the servers'
//! counters and queues, which another test's load would move.
//!
//! Tests marked "needs issue 34's gateway/bench/plan fixes" check behaviour that the issue
//! specifies and that Spillway does not have before those fixes land.

mod agents;
mod gateway;
mod store;
mod tools;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use crate::support::BIN;

pub(crate) use testkit::vllm::{MODEL, Vllm, installed, repo_root};

/// One test at a time: see the module's note.
static SERIAL: Mutex<()> = Mutex::new(());

type Shared = OnceLock<Result<Vllm, String>>;

fn shared(
    cell: &'static Shared,
    name: &str,
    think: bool,
    args: &[&str],
    env: &[(&str, &str)],
) -> Option<&'static Vllm> {
    if !installed() {
        return None;
    }
    match cell.get_or_init(|| Vllm::start_with_env(name, think, args, env)) {
        Ok(v) => Some(v),
        Err(e) => panic!("{e}"),
    }
}

/// The shared plain server: 4 sequences a step, 8 requests in flight at most, requests logged
/// (so an abort shows in its log), and the response store on (`store::`'s tests; it changes
/// nothing but `/v1/responses`).
pub(crate) fn plain() -> Option<&'static Vllm> {
    static CELL: Shared = OnceLock::new();
    shared(
        &CELL,
        "plain",
        false,
        &[
            "--max-num-seqs",
            "4",
            "--max-num-queued-reqs",
            "8",
            "--enable-log-requests",
        ],
        &[("VLLM_ENABLE_RESPONSES_API_STORE", "1")],
    )
}

/// The shared reasoning server (`--reasoning-parser deepseek_r1`).
pub(crate) fn think() -> Option<&'static Vllm> {
    static CELL: Shared = OnceLock::new();
    shared(&CELL, "think", true, &["--max-num-seqs", "4"], &[])
}

/// Holds the one-test-at-a-time lock, and both servers, started side by side.
pub(crate) struct Servers {
    pub(crate) plain: &'static Vllm,
    pub(crate) think: &'static Vllm,
    _serial: MutexGuard<'static, ()>,
}

/// Both servers, or None when the test is skipped (no install, not required).
pub(crate) fn servers() -> Option<Servers> {
    let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !installed() {
        return None;
    }
    // Two starts at once share the cores but overlap their waits.
    let (plain, think) = std::thread::scope(|s| {
        let t = s.spawn(think);
        (plain(), t.join().expect("think() panicked"))
    });
    let servers = Servers {
        plain: plain?,
        think: think?,
        _serial: serial,
    };
    // A test that failed mid-load may have left requests running: wait for both to drain.
    for v in [servers.plain, servers.think] {
        let idle = crate::support::wait_until(1500, || {
            v.metric("vllm:num_requests_running") == 0.0 && v.metric("vllm:num_requests_waiting") == 0.0
        });
        assert!(idle, "vLLM on {} did not drain", v.port);
    }
    Some(servers)
}

/// An HTTP/1.1 answer, its chunked body decoded.
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) head: String,
    pub(crate) body: String,
}

impl Reply {
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// A header's value (names compared case-insensitively).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    /// The JSON of every `data:` event but `[DONE]`.
    pub(crate) fn events(&self) -> Vec<serde_json::Value> {
        self.body
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim)
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
            .collect()
    }
}

/// Sends a request and reads the whole answer (`connection: close`).
pub(crate) fn request(port: u16, method: &str, path: &str, body: &str) -> Reply {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read the answer");
    parse_reply(&raw)
}

pub(crate) fn post(port: u16, path: &str, body: &serde_json::Value) -> Reply {
    request(port, "POST", path, &body.to_string())
}

pub(crate) fn get_body(port: u16, path: &str) -> String {
    request(port, "GET", path, "").body
}

fn parse_reply(raw: &[u8]) -> Reply {
    let text = String::from_utf8_lossy(raw);
    let (head, rest) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP head in {text:?}"));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    let chunked = head.to_ascii_lowercase().contains("transfer-encoding: chunked");
    let body = if chunked {
        testkit::vllm::dechunk(rest)
    } else {
        rest.to_owned()
    };
    Reply {
        status,
        head: head.to_owned(),
        body,
    }
}

/// A chat request for the tiny model.
pub(crate) fn chat(max_tokens: u32, stream: bool) -> serde_json::Value {
    serde_json::json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me about spillways."}],
        "max_tokens": max_tokens,
        "stream": stream,
        "ignore_eos": true,
    })
}

/// Sends a streamed request and returns its connection, unread, for the caller to drop.
pub(crate) fn send_stream(port: u16, body: &serde_json::Value) -> TcpStream {
    let body = body.to_string();
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    s
}

/// Sends a streamed request and reads until its first `data:` event has arrived; the stream is
/// left open, unread, for the caller to drop or finish.
pub(crate) fn open_stream(port: u16, body: &serde_json::Value) -> (TcpStream, String) {
    let mut s = send_stream(port, body);
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("data:") {
        let n = s.read(&mut buf).expect("the stream's first event");
        assert!(
            n > 0,
            "closed before any event: {:?}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    (s, String::from_utf8_lossy(&seen).into_owned())
}

/// A gateway in front of vLLM replicas (testkit's `spillway serve` process), its access log in a
/// file.
pub(crate) struct Gateway {
    pub(crate) port: u16,
    process: testkit::Process,
}

impl Gateway {
    /// `spillway serve` with one route, `tiny`, to `replicas`; `route_extra` is YAML added to the
    /// route (indented for it, e.g. `"    balance: engine_aware\n"`).
    pub(crate) fn start(replicas: &[u16], route_extra: &str) -> Gateway {
        let replicas: Vec<String> = replicas.iter().map(|p| format!("http://127.0.0.1:{p}")).collect();
        let config = format!(
            "routes:\n  - model: {MODEL}\n    replicas: [{}]\n{route_extra}",
            replicas.join(", ")
        );
        Gateway::with_config(&config)
    }

    /// `spillway serve` with `config` (its `listen` is added).
    pub(crate) fn with_config(config: &str) -> Gateway {
        let process = testkit::Process::gateway(BIN, config, &[], |_| {});
        Gateway {
            port: process.port,
            process,
        }
    }

    /// The access log's lines so far, parsed (each request's line is written when it ends).
    pub(crate) fn access_log(&self) -> Vec<serde_json::Value> {
        self.process
            .stdout()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Waits up to 5 s for `n` access-log lines.
    pub(crate) fn access_lines(&self, n: usize) -> Vec<serde_json::Value> {
        crate::support::wait_until(250, || self.access_log().len() >= n);
        let lines = self.access_log();
        assert!(
            lines.len() >= n,
            "{} access-log lines, wanted {n}: {lines:?}",
            lines.len()
        );
        lines
    }
}

/// A folder under the system's temp dir, removed on drop.
pub(crate) struct TempDir(pub(crate) PathBuf);

impl TempDir {
    pub(crate) fn new(tag: &str) -> TempDir {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("spillway-vllm-{tag}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `spillway ARGS`: exit code, stdout, stderr.
pub(crate) fn spillway(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
