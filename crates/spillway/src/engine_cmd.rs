//! `spillway engine`: one or more simulated vLLM replicas on consecutive ports.

use anyhow::{Context, Result, bail};
use clap::Args;
use engine::{EngineConfig, FailEvery, LengthDist, Preset};
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;
use tokio::net::TcpListener;

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct EngineArgs {
    #[command(subcommand)]
    action: Option<EngineAction>,
    /// Address of the first replica; replica i listens on its port + i.
    #[arg(long, default_value = "127.0.0.1:8000")]
    listen: SocketAddr,
    /// How many replicas to run in this process, each its own engine.
    #[arg(long, default_value_t = 1)]
    replicas: u16,
    /// The served model name clients send.
    #[arg(long, default_value = "spillway-sim")]
    model: String,
    /// Cost model and limits: tiny (fast, for tests), zero (free steps, for proxy overhead),
    /// llama-3.1-8b-h100 (calibrated to NVIDIA's published NIM numbers).
    #[arg(long, default_value = "tiny")]
    preset: Preset,
    /// A cost-model file (`spillway engine fit` writes one) in place of the preset's step costs
    /// and API-server cost; the preset still sets the limits.
    #[arg(long, value_name = "FILE")]
    cost_model: Option<PathBuf>,
    /// Most sequences running in one step (vLLM's --max-num-seqs).
    #[arg(long)]
    max_num_seqs: Option<usize>,
    /// Token budget of one step: decodes first, then prefill chunks (vLLM's --max-num-batched-tokens).
    #[arg(long)]
    max_num_batched_tokens: Option<u32>,
    /// Longest prompt + completion (vLLM's --max-model-len).
    #[arg(long)]
    max_model_len: Option<u32>,
    /// Requests the engine may hold, running and waiting (vLLM's --max-num-queued-reqs, whose
    /// check counts both); beyond it a new one is refused with 503, a streamed one inside a 200
    /// stream as vLLM does. Default: no bound.
    #[arg(long)]
    max_num_queued_reqs: Option<usize>,
    /// How streamed events are written: compact (vLLM's), dumps (Python's json.dumps: a space after
    /// `,` and `:`), pretty (indented over several `data:` lines) or crlf (CR LF line ends).
    #[arg(long, value_enum, default_value = "compact")]
    sse_style: SseStyle,
    /// KV-cache capacity in tokens; fewer blocks mean earlier preemption.
    #[arg(long)]
    kv_cache_tokens: Option<u32>,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    block_size: u32,
    /// Reuse KV blocks of prompts that share a prefix (vLLM's --enable-prefix-caching).
    #[arg(long)]
    enable_prefix_caching: bool,
    /// A Hugging Face tokenizer.json; without it, prompts count one token per 4 bytes.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Output length when a request does not set ignore_eos: N, uniform:A,B, normal:M,SD,
    /// lognormal:M,SD (capped by max_tokens). Default: always max_tokens.
    #[arg(long, value_parser = length_dist)]
    output_len: Option<LengthDist>,
    /// Seed of every sampled length.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Also expose DCGM-exporter-like GPU metrics on /metrics.
    #[arg(long)]
    dcgm: bool,
    /// Also serve the replicas' GPUs, one per replica (gpu="0", "1", …), on a listener of their
    /// own shaped like dcgm-exporter (its metric names and gpu/UUID/modelName/Hostname labels).
    #[arg(long, value_name = "ADDR")]
    dcgm_listen: Option<SocketAddr>,
    /// Fault: requests never receive their first token (a hung engine).
    #[arg(long)]
    fault_never_first_token: bool,
    /// Fault: requests stall after this many tokens.
    #[arg(long, value_name = "K")]
    fault_stall_after: Option<u32>,
    /// Fault: every Nth request fails with STATUS, as N:STATUS (e.g. 3:503).
    #[arg(long, value_name = "N:STATUS", value_parser = parse_fail_every)]
    fault_fail_every: Option<FailEvery>,
    /// Fault: every step takes this many times its modelled cost (a degraded GPU).
    #[arg(long, value_name = "FACTOR")]
    fault_slow: Option<f64>,
    /// Fault: a CPU-starved API server whose serial work costs PER_REQUEST for each request and
    /// PER_TOKEN for each output token, e.g. 40ms,1ms (the presets' costs nothing).
    #[arg(long, value_name = "PER_REQUEST,PER_TOKEN", value_parser = parse_frontend)]
    fault_frontend: Option<engine::cost::FrontendCost>,
    /// Fault: refuse connections from the start.
    #[arg(long)]
    fault_refuse_connections: bool,
    /// Keep Responses API answers as vLLM does with VLLM_ENABLE_RESPONSES_API_STORE=1 (which
    /// also turns it on): GET /v1/responses/{id}, cancel, previous_response_id, background.
    /// Off by default, as in vLLM.
    #[arg(long)]
    responses_store: bool,
    /// The store's bound, in MiB of kept JSON and conversations (vLLM's never forgets); the
    /// oldest ended responses go first.
    #[arg(long, value_name = "MIB", default_value_t = 64)]
    responses_store_mib: usize,
}

/// vLLM's switch: `bool(int(os.getenv("VLLM_ENABLE_RESPONSES_API_STORE", "0")))`, so any
/// non-zero integer turns it on and anything else but an integer stops the server.
fn vllm_store_env(value: Option<&str>) -> Result<bool> {
    match value.map(str::trim) {
        None | Some("") => Ok(false),
        Some(v) => v.parse::<i64>().map(|n| n != 0).with_context(|| {
            format!("VLLM_ENABLE_RESPONSES_API_STORE={v:?} is not an integer (vLLM reads it with int())")
        }),
    }
}

fn parse_fail_every(s: &str) -> Result<FailEvery, String> {
    let (n, status) = s.split_once(':').ok_or("expected N:STATUS, e.g. 3:503")?;
    let nth: NonZeroU32 = n
        .parse()
        .map_err(|_| format!("'{n}' is not a positive whole number"))?;
    let status: u16 = status
        .parse()
        .map_err(|_| format!("'{status}' is not a status code"))?;
    if !(400..=599).contains(&status) {
        return Err(format!("status must be 400–599, got {status}"));
    }
    Ok(FailEvery { nth, status })
}

fn parse_frontend(s: &str) -> Result<engine::cost::FrontendCost, String> {
    let (r, t) = s
        .split_once(',')
        .ok_or("expected PER_REQUEST,PER_TOKEN, e.g. 40ms,1ms")?;
    let d = |v: &str| humantime::parse_duration(v.trim()).map_err(|e| format!("'{v}': {e}"));
    Ok(engine::cost::FrontendCost {
        per_request: d(r)?,
        per_output_token: d(t)?,
    })
}

#[derive(clap::Subcommand, Debug)]
enum EngineAction {
    /// Fit a cost model to a bench run of a real engine (`spillway bench --json FILE --records`,
    /// a concurrency-1 level and varied prompt lengths among its levels) and write it for
    /// `--cost-model`; prints the terms and how far they are from each level's measurement.
    Fit(crate::engine_fit_cmd::FitArgs),
}

/// Reads a cost-model file for `--cost-model`.
pub(crate) fn cost_file(path: &std::path::Path) -> Result<engine::cost::CostFile> {
    let text = std::fs::read_to_string(path).with_context(|| format!("--cost-model {}", path.display()))?;
    engine::cost::CostFile::from_json(&text).with_context(|| format!("--cost-model {}", path.display()))
}

impl EngineArgs {
    fn config(&self, env_store: bool) -> Result<EngineConfig> {
        let mut c = EngineConfig::preset(self.preset);
        if let Some(path) = &self.cost_model {
            c.use_cost_file(&cost_file(path)?);
        }
        c.responses_store = (self.responses_store || env_store).then(|| engine::StoreLimit {
            max_bytes: self.responses_store_mib.saturating_mul(1 << 20),
        });
        c.model.clone_from(&self.model);
        if let Some(v) = self.max_num_seqs {
            c.max_num_seqs = v;
        }
        if let Some(v) = self.max_num_batched_tokens {
            c.max_num_batched_tokens = v;
        }
        if let Some(v) = self.max_model_len {
            c.max_model_len = v;
        }
        c.max_num_queued_reqs = self.max_num_queued_reqs;
        c.sse_style = match self.sse_style {
            SseStyle::Compact => engine::SseStyle::Compact,
            SseStyle::Dumps => engine::SseStyle::Dumps,
            SseStyle::Pretty => engine::SseStyle::Pretty,
            SseStyle::Crlf => engine::SseStyle::Crlf,
        };
        if let Some(v) = self.kv_cache_tokens {
            c.kv_cache_tokens = v;
        }
        c.block_size = self.block_size;
        c.enable_prefix_caching = self.enable_prefix_caching;
        c.tokenizer.clone_from(&self.tokenizer);
        c.output_len = self.output_len;
        c.seed = self.seed;
        c.dcgm = self.dcgm;
        c.core_thread = true;
        c.faults.stall_after_tokens = if self.fault_never_first_token {
            Some(0)
        } else {
            self.fault_stall_after
        };
        c.faults.fail_every = self.fault_fail_every;
        c.faults.refuse_connections = self.fault_refuse_connections;
        c.faults.frontend = self.fault_frontend;
        if let Some(f) = self.fault_slow {
            c.faults.slow_factor = f;
        }
        Ok(c)
    }
}

/// Parses a length distribution, with a note on stderr for a form that is accepted but spelt
/// otherwise (`uniform:A-B`).
fn length_dist(s: &str) -> Result<LengthDist, String> {
    let d = s.parse()?;
    if let Some(hint) = LengthDist::hint(s) {
        eprintln!("spillway: note: {hint}");
    }
    Ok(d)
}

pub(crate) async fn run(args: EngineArgs) -> Result<()> {
    if let Some(EngineAction::Fit(fit)) = &args.action {
        return crate::engine_fit_cmd::run(fit);
    }
    if args.replicas == 0 {
        bail!("--replicas must be at least 1");
    }
    let env_store = vllm_store_env(std::env::var("VLLM_ENABLE_RESPONSES_API_STORE").ok().as_deref())?;
    let config = args.config(env_store)?;
    config.validate()?;
    let mut running = Vec::new();
    for i in 0..args.replicas {
        let port = args
            .listen
            .port()
            .checked_add(i)
            .context("replica ports run past 65535")?;
        let addr = SocketAddr::new(args.listen.ip(), port);
        let listener = engine::server::listen(addr).with_context(|| format!("cannot listen on {addr}"))?;
        let mut cfg = config.clone();
        cfg.seed = config.seed.wrapping_add(u64::from(i));
        let replica = engine::spawn(listener, cfg)?;
        tracing::info!(
            replica = i,
            url = %replica.url(),
            model = %config.model,
            preset = config.preset.name(),
            "engine ready"
        );
        running.push(replica);
    }
    let (stop_dcgm, dcgm_stopped) = tokio::sync::oneshot::channel::<()>();
    let dcgm = match args.dcgm_listen {
        Some(addr) => {
            let listener = TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} for DCGM metrics"))?;
            let engines = running.iter().map(|r| r.engine.clone()).collect();
            let hostname = std::env::var("HOSTNAME").unwrap_or_else(|_| "spillway-engine".into());
            tracing::info!(url = %format!("http://{addr}/metrics"), "DCGM exporter ready");
            Some(tokio::spawn(engine::server::serve_dcgm(
                listener,
                engines,
                hostname,
                async move {
                    let _ = dcgm_stopped.await;
                },
            )))
        }
        None => None,
    };
    shutdown_signal().await;
    tracing::info!("shutting down");
    let _ = stop_dcgm.send(());
    if let Some(task) = dcgm {
        let _ = task.await;
    }
    for r in running {
        r.shutdown().await;
    }
    Ok(())
}

pub(crate) async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// `--sse-style`'s values (protocol's `Style`, which has no clap of its own).
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum SseStyle {
    Compact,
    Dumps,
    Pretty,
    Crlf,
}

#[cfg(test)]
mod tests {
    use super::vllm_store_env;

    #[test]
    fn the_store_switch_reads_as_vllm_reads_it() {
        assert!(!vllm_store_env(None).unwrap());
        assert!(!vllm_store_env(Some("0")).unwrap());
        assert!(vllm_store_env(Some("1")).unwrap());
        assert!(vllm_store_env(Some("2")).unwrap(), "any non-zero integer");
        assert!(vllm_store_env(Some("true")).is_err(), "vLLM's int() fails on it");
    }
}
