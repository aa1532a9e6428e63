//! Shared helpers: configs, engines in-process, HTTP and SSE reading.

use spillway_engine::engine::Generation;
use spillway_engine::{Engine, EngineConfig, GenerateParams};

pub(crate) const MODEL: &str = "sim";

pub(crate) fn tiny() -> EngineConfig {
    testkit::tiny_engine(MODEL)
}

/// The engine in-process on an ephemeral port (testkit's), ready and stopped when dropped.
pub(crate) async fn start(config: EngineConfig) -> testkit::Engine {
    testkit::Engine::start(config).await
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

pub(crate) use testkit::{http, sse_data};

pub(crate) use testkit::eventually;

pub(crate) use testkit::post_json;
