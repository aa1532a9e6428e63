//! Shared helpers: configs, engines in-process, HTTP and SSE reading.

use spillway_engine::engine::Generation;
use spillway_engine::{Engine, EngineConfig, GenerateParams, Preset, RunningEngine};
use std::time::Duration;

pub(crate) const MODEL: &str = "sim";

pub(crate) fn tiny() -> EngineConfig {
    let mut c = EngineConfig::preset(Preset::Tiny);
    c.model = MODEL.into();
    c
}

pub(crate) async fn start(config: EngineConfig) -> RunningEngine {
    spillway_engine::spawn_local(config).await.expect("engine starts")
}

pub(crate) fn submit(engine: &Engine, prompt_len: u32, max_tokens: u32) -> Generation {
    engine
        .submit(GenerateParams {
            prompt: (0..prompt_len).collect(),
            max_tokens: Some(max_tokens),
            n: 1,
            ignore_eos: true,
        })
        .expect("submit")
}

/// Waits until the first choice finishes and returns its token count.
pub(crate) async fn finish(g: &mut Generation) -> u32 {
    g.choices[0]
        .wait_for(|p| p.finish.is_some())
        .await
        .map(|p| p.tokens)
        .unwrap_or(0)
}

pub(crate) fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}

/// The `data:` payloads of an SSE body, in order.
pub(crate) fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            e.strip_prefix("data: ")
                .expect("every event is a data line")
                .to_owned()
        })
        .collect()
}

pub(crate) use testkit::eventually;

pub(crate) use testkit::post_json;
