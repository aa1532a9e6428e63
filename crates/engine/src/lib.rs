//! `spillway engine`: a stand-in for vLLM that behaves like it under load, without a GPU.
//!
//! # Layout
//! - [`config`]: vLLM's knobs, presets, length distributions.
//! - [`cost`]: the step-time formula and its file; [`published`]: the fitted presets and the
//!   published points; [`calibration`]: the closed-loop run that holds a preset against them;
//!   [`fit`]: a cost model fitted to a bench run's records of a real engine.
//! - `kv`: the paged KV cache and prefix cache; [`scheduler`]: vLLM V1's continuous batching.
//! - [`engine`]: one replica's step loop on `tokio::time`, and the [`Engine`] handle that submits
//!   requests and reads ground truth (running, waiting, aborts, per-request timings).
//! - [`metrics`]: vLLM's Prometheus metrics and DCGM-like GPU metrics; [`server::serve_dcgm`]
//!   serves the GPUs of several replicas on a listener of their own, as dcgm-exporter does.
//! - [`faults`]: scripted failures, by flag or through `POST /admin/faults`.
//! - [`server`]: the OpenAI HTTP surface and an accept loop that can refuse or die on command;
//!   `stream` renders tokens as SSE chunks; `text` is the filler output; `embed` answers
//!   `/v1/embeddings` (each input through the scheduler); `agents` serves the Messages and
//!   Responses APIs and vLLM's response store; `reply` holds the answers every route shares. Prompts are counted by the shared
//!   `tokenize` crate; `clock` gives the answers their `created` second.
//!
//! Tests start replicas in-process with [`spawn`] on a bound `127.0.0.1:0` listener.

mod agents;
pub mod calibration;
mod clock;
pub mod config;
pub mod cost;
mod embed;
pub mod engine;
pub mod faults;
pub mod fit;
mod kv;
pub mod metrics;
pub mod published;
mod reply;
pub mod scheduler;
pub mod server;
mod stream;
mod text;
pub use protocol::sse::Style as SseStyle;
pub use tokenize;

pub use config::{EngineConfig, LengthDist, Preset, StoreLimit};
pub use engine::{Engine, GenerateParams, Lateness, ListenerState, Snapshot};
pub use faults::{FailEvery, FaultPatch, Faults};
pub use metrics::GpuReading;
pub use scheduler::{FinishReason, RequestRecord};

use std::net::SocketAddr;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A replica serving on a socket; dropping it stops the server and the step loop.
#[derive(Debug)]
pub struct RunningEngine {
    pub addr: SocketAddr,
    pub engine: Engine,
    stop: Option<oneshot::Sender<()>>,
    server: JoinHandle<std::io::Result<()>>,
    steps: Option<engine::StepLoop>,
}

impl RunningEngine {
    /// `http://ADDR`, the base URL clients use (append `/v1`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting, lets connections finish what they have in flight, and ends the step loop.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.server).await;
    }
}

impl Drop for RunningEngine {
    fn drop(&mut self) {
        self.server.abort();
        self.steps.take();
    }
}

/// Why an engine cannot start or take a change.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A setting or a fault out of range; the message names the flag or the field.
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Tokenizer(#[from] tokenize::LoadError),
    #[error("cannot listen: {0}")]
    Io(#[from] std::io::Error),
}

/// Starts one replica on an already bound listener.
pub fn spawn(listener: TcpListener, config: EngineConfig) -> Result<RunningEngine, EngineError> {
    let addr = listener.local_addr()?;
    let (engine, steps) = Engine::start(config)?;
    let (stop, stopped) = oneshot::channel();
    let server = tokio::spawn(server::serve(listener, engine.clone(), async move {
        let _ = stopped.await;
    }));
    Ok(RunningEngine {
        addr,
        engine,
        stop: Some(stop),
        server,
        steps: Some(steps),
    })
}

/// Binds `127.0.0.1:0` and starts a replica there: what tests use.
pub async fn spawn_local(config: EngineConfig) -> Result<RunningEngine, EngineError> {
    let listener = server::listen(SocketAddr::from(([127, 0, 0, 1], 0)))?;
    spawn(listener, config)
}
