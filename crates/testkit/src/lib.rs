//! Helpers for integration tests across the workspace.
//!
//! # Layout
//! - [`tool`]: the path of an installed program, with a message that says how to get it;
//! - [`promtool_check`]: runs the real `promtool check metrics` over an exposition;
//! - [`python`]: the Python that has the official `openai` client (scripts/test.sh makes it);
//! - [`word_tokenizer`]: a real Hugging Face `tokenizer.json`, built in code;
//! - [`crd`]: Kubernetes objects validated strictly against their projects' CRDs;
//! - [`envoy`]: a real Envoy asking an endpoint picker over `ext_proc`, as the Gateway API
//!   Inference Extension sets it up;
//! - [`tls`]: certificates made on the spot, their PEM files, and a TLS front before a server;
//! - [`serve_script`], [`serve_text`], [`eventually`], [`poll`]: from `testkit-wire`, the floor
//!   the crates below the gateway (`http1`) test with alone;
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
pub use testkit_wire::{eventually, poll, serve_script, serve_text};

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

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

/// The paths of every field of a JSON value (`usage.input_tokens`, `output[].content[].text`),
/// sorted and each once: what a client reads of an answer, whatever the values — for holding the
/// simulator's answers to vLLM's field by field.
pub fn json_shape(v: &serde_json::Value) -> Vec<String> {
    fn walk(v: &serde_json::Value, at: &str, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    let path = if at.is_empty() {
                        k.clone()
                    } else {
                        format!("{at}.{k}")
                    };
                    out.push(path.clone());
                    walk(v, &path, out);
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, &format!("{at}[]"), out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(v, "", &mut out);
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn sse_data_reads_events_as_a_client_does() {
        let body = ": ping\n\ndata: {\"a\":1}\r\n\r\ndata: x\ndata: y\n\ndata: [DONE]";
        assert_eq!(super::sse_data(body), ["{\"a\":1}", "x\ny", "[DONE]"]);
    }
}
