//! Helpers for integration tests across the workspace.
//!
//! # Layout
//! - [`tool`]: the path of an installed program, with a message that says how to get it;
//! - [`promtool_check`]: runs the real `promtool check metrics` over an exposition;
//! - [`python`]: the Python that has the official `openai` client (scripts/test.sh makes it);
//! - [`eventually`], [`poll`]: poll a condition, or what a request reads, on the runtime's clock;
//! - [`word_tokenizer`]: a real Hugging Face `tokenizer.json`, built in code;
//! - [`crd`]: Kubernetes objects validated strictly against their projects' CRDs;
//! - [`envoy`]: a real Envoy asking an endpoint picker over `ext_proc`, as the Gateway API
//!   Inference Extension sets it up;
//! - [`tls`]: certificates made on the spot, their PEM files, and a TLS front before a server;
//! - [`serve_script`]: a replica that answers each request with scripted bytes;
//! - [`tiny_engine`], [`http`], [`sse_data`]: the small engine, the HTTP client and the SSE
//!   reading every crate's integration tests use;
//! - [`vllm`]: a real vLLM (CPU, the tiny model) as a process group, skipped where not installed;
//! - [`spawn`]: engines and gateways, in-process ([`Engine`], [`Gateway`]) or as `spillway`
//!   processes ([`Process`]), ready when returned and stopped when dropped.

pub mod crd;
pub mod envoy;
pub mod spawn;
pub mod tls;
pub mod vllm;

pub use spawn::{Engine, Gateway, GatewayOptions, Process};

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The engine's tiny preset serving `model`: fast steps, a small KV cache, for tests.
pub fn tiny_engine(model: &str) -> engine::EngineConfig {
    let mut c = engine::EngineConfig::preset(engine::Preset::Tiny);
    c.model = model.into();
    c
}

/// An HTTP client for tests: a bound on every request, so a hung server fails the test instead.
pub fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("an HTTP client")
}

/// The data of each event of an SSE body, in order, read as a client would (`protocol::sse`):
/// events without data (comments, keep-alives) are left out.
pub fn sse_data(body: &str) -> Vec<String> {
    let mut splitter = protocol::sse::EventSplitter::default();
    let mut events = Vec::new();
    splitter.feed_slices(body.as_bytes(), |e| events.push(e.to_vec()));
    let rest = splitter.rest();
    if !rest.is_empty() {
        events.push(rest.to_vec());
    }
    events
        .iter()
        .filter_map(|e| protocol::sse::data(e).map(|d| d.into_owned()))
        .collect()
}

/// The path of `name` on `PATH`; panics with how to install it when it is missing.
pub fn tool(name: &str) -> String {
    let found = std::process::Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    assert!(
        !found.is_empty(),
        "{name} is not installed: run scripts/test.sh, which installs it"
    );
    found
}

/// What `promtool check metrics` says about `exposition`: one problem a line, empty if none.
pub async fn promtool_check(exposition: &str) -> String {
    let mut child = tokio::process::Command::new(tool("promtool"))
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool starts");
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin
        .write_all(exposition.as_bytes())
        .await
        .expect("promtool reads its input");
    drop(stdin);
    let out = child.wait_with_output().await.expect("promtool finishes");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The Python with the `openai` package: `SPILLWAY_PYTHON`, else the venv scripts/test.sh makes.
pub fn python() -> PathBuf {
    if let Ok(p) = std::env::var("SPILLWAY_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = repo_root().join("target/venv/bin/python");
    assert!(
        venv.exists(),
        "{} missing: run scripts/test.sh, which makes it",
        venv.display()
    );
    venv
}

/// The workspace root, for scripts under `tests/`.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `tests/python/<script>` with `args`; returns its output, panicking with it on failure.
pub async fn run_python(script: &str, args: &[&str]) -> String {
    let out = tokio::process::Command::new(python())
        .arg(repo_root().join("tests/python").join(script))
        .args(args)
        .output()
        .await
        .expect("python starts");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{script} failed:\n{report}");
    report
}

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

/// Saves a word-level Hugging Face tokenizer (whitespace pre-tokenizer, `[UNK]` for the rest) that
/// knows `words`, as `dir/tokenizer.json`: a real tokenizer file, without downloading a model.
pub fn word_tokenizer(dir: &std::path::Path, words: &[&str]) -> PathBuf {
    use tokenizers::models::wordlevel::WordLevel;
    use tokenizers::pre_tokenizers::whitespace::Whitespace;
    let vocab = std::iter::once("[UNK]")
        .chain(words.iter().copied())
        .zip(0u32..)
        .map(|(w, i)| (w.to_owned(), i))
        .collect();
    let model = WordLevel::builder()
        .vocab(vocab)
        .unk_token("[UNK]".into())
        .build()
        .expect("word-level model");
    let mut tokenizer = tokenizers::Tokenizer::new(model);
    tokenizer.with_pre_tokenizer(Some(Whitespace {}));
    let path = dir.join("tokenizer.json");
    tokenizer.save(&path, false).expect("tokenizer.json written");
    path
}

/// POSTs `body` as JSON and parses the JSON answer (panics on any failure: a test helper).
pub async fn post_json<T: serde::de::DeserializeOwned>(
    url: impl reqwest::IntoUrl,
    body: &impl serde::Serialize,
) -> T {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client")
        .post(url)
        .json(body)
        .send()
        .await
        .expect("request sent")
        .json()
        .await
        .expect("a JSON answer")
}

/// Asserts that `body` is an OpenAI error body whose message mentions `needle`.
pub fn assert_error_mentions(body: &serde_json::Value, needle: &str) {
    let message = body["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("not an OpenAI error body: {body}"));
    assert!(message.contains(needle), "{needle:?} not in {body}");
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

#[cfg(test)]
mod tests {
    #[test]
    fn sse_data_reads_events_as_a_client_does() {
        let body = ": ping\n\ndata: {\"a\":1}\r\n\r\ndata: x\ndata: y\n\ndata: [DONE]";
        assert_eq!(super::sse_data(body), ["{\"a\":1}", "x\ny", "[DONE]"]);
    }
}
