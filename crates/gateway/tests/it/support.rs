//! Engines and a gateway in-process on ephemeral loopback ports (testkit's), and HTTP helpers.

use engine::EngineConfig;
use std::time::Duration;
use testkit::{Engine, GatewayOptions};

pub(crate) const UPSTREAM_MODEL: &str = "sim";

/// Two teams on one route: `search` (key "test") with `rpm: 3` and `tpm: 1000`, `batch` with one
/// request at a time.
pub(crate) const TEAMS: &str = r#"
listen: 127.0.0.1:0
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}]
tenants:
  - team: search
    key_sha256: [ "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08" ]
    rpm: 3
    tpm: 1000
  - team: batch
    key_sha256: [ "d9298a10d1b0735837dc4bd85dac641b0f3cef27a47e5d53a54f2f3f5b2fcffa" ]
    max_parallel: 1
"#;

/// The tiny engine under the replicas' own model name.
pub(crate) fn tiny() -> EngineConfig {
    testkit::tiny_engine(UPSTREAM_MODEL)
}

/// The tiny engine whose requests stop after `tokens` tokens and hold their slot (0: hung).
pub(crate) fn stalling(tokens: u32) -> EngineConfig {
    let mut c = tiny();
    c.faults = engine::Faults {
        stall_after_tokens: Some(tokens),
        ..engine::Faults::default()
    };
    c
}

pub(crate) async fn engine(config: EngineConfig) -> Engine {
    Engine::start(config).await
}

/// Engines and a gateway serving `yaml`, in which `{E0}`, `{E1}`… stand for the engines' URLs
/// (testkit's in-process gateway, whose fields it derefs to: `url`, `gateway`, `server`…).
pub(crate) struct Stack {
    pub engines: Vec<Engine>,
    gateway: testkit::Gateway,
}

impl Stack {
    pub(crate) async fn start(engines: Vec<Engine>, yaml: &str) -> Stack {
        let replicas: Vec<String> = engines.iter().map(|e| e.url()).collect();
        let gateway = testkit::Gateway::start_with(
            yaml,
            GatewayOptions {
                replicas,
                // Tests cannot set the process environment (no unsafe): secrets come from here.
                env: vec![(
                    "SPILLWAY_TEST_ADMIN_TOKEN".into(),
                    crate::operations::TOKEN.into(),
                )],
                ..GatewayOptions::default()
            },
        )
        .await;
        Stack { engines, gateway }
    }

    /// `yaml` with `{E0}`, `{E1}`… replaced by this stack's engine URLs, as `start` does.
    pub(crate) fn fill(&self, yaml: &str) -> String {
        let replicas: Vec<String> = self.engines.iter().map(|e| e.url()).collect();
        testkit::spawn::fill(yaml, &replicas)
    }

    /// POSTs a streamed chat completion for `model` to the gateway.
    pub(crate) async fn stream(&self, model: &str, max_tokens: u32) -> reqwest::Response {
        http()
            .post(format!("{}/v1/chat/completions", self.url))
            .json(&chat(model, max_tokens, true))
            .send()
            .await
            .expect("the gateway answers")
    }

    pub(crate) async fn metrics(&self) -> String {
        http()
            .get(format!("{}/metrics", self.url))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

impl std::ops::Deref for Stack {
    type Target = testkit::Gateway;

    fn deref(&self) -> &testkit::Gateway {
        &self.gateway
    }
}

impl std::ops::DerefMut for Stack {
    fn deref_mut(&mut self) -> &mut testkit::Gateway {
        &mut self.gateway
    }
}

pub(crate) use testkit::{http, sse_data};

/// POSTs a chat completion for the route `chat` to the gateway at `url` with an API key.
pub(crate) async fn keyed(url: &str, key: &str, max_tokens: u32, stream: bool) -> reqwest::Response {
    http()
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(key)
        .json(&chat("chat", max_tokens, stream))
        .send()
        .await
        .unwrap()
}

/// A response header's value; panics naming the headers there are when it is missing.
pub(crate) fn header(r: &reqwest::Response, name: &str) -> String {
    r.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_else(|| panic!("no {name} in {:?}", r.headers()))
}

pub(crate) fn chat(model: &str, max_tokens: u32, stream: bool) -> serde_json::Value {
    serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": max_tokens,
        "stream": stream,
    })
}

pub(crate) use testkit::eventually;

/// Reads a streamed response to its end, returning the body and when its first chunk came.
pub(crate) async fn read_stream(mut r: reqwest::Response) -> (String, Option<Duration>, bool) {
    let start = tokio::time::Instant::now();
    let mut first = None;
    let mut body = Vec::new();
    let mut clean = true;
    loop {
        match r.chunk().await {
            Ok(Some(c)) => {
                first.get_or_insert(start.elapsed());
                body.extend_from_slice(&c);
            }
            Ok(None) => break,
            Err(_) => {
                clean = false;
                break;
            }
        }
    }
    (String::from_utf8_lossy(&body).into_owned(), first, clean)
}

pub(crate) use testkit::post_json;
