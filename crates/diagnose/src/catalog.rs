//! The series a diagnosis looks for, under every name they have had, and which of them exist.

use crate::window::Snapshot;
use serde::Serialize;

/// Where a series comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    Gateway,
    Engine,
    Gpu,
}

/// How a series is read: a gauge's level, a counter's increase, a histogram's bucket increases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Gauge,
    Counter,
    Histogram,
}

/// Every signal the rules read. The names are the catalogue's keys, not metric names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Key {
    Running,
    Waiting,
    KvUsage,
    CacheConfig,
    Preemptions,
    PromptTokens,
    GenerationTokens,
    PrefixQueries,
    PrefixHits,
    RequestSuccess,
    EngineRejections,
    Ttft,
    Itl,
    E2e,
    QueueTime,
    PrefillTime,
    DecodeTime,
    GwRequests,
    GwRejections,
    GwCancellations,
    GwUpstream,
    GwQueueWait,
    GwTtft,
    GwItl,
    GwDuration,
    GwQueued,
    GwOldestWait,
    GwInFlight,
    GwConcurrencyLimit,
    GwGoodput,
    GwSloRequests,
    GwReplicaHealthy,
    GpuUtil,
    GrEngineActive,
    FbUsed,
    FbFree,
    Xid,
    EccDbe,
}

/// A signal: its names (the current one first, then older ones), its kind and its layer.
#[derive(Debug, Clone, Copy)]
pub struct Signal {
    pub key: Key,
    pub names: &'static [&'static str],
    pub kind: Kind,
    pub layer: Layer,
}

const fn s(key: Key, names: &'static [&'static str], kind: Kind, layer: Layer) -> Signal {
    Signal {
        key,
        names,
        kind,
        layer,
    }
}

use Kind::{Counter, Gauge, Histogram};
use Layer::{Engine, Gateway, Gpu};

/// The catalogue. vLLM renamed `gpu_cache_usage_perc` to `kv_cache_usage_perc`,
/// `time_per_output_token_seconds` to `inter_token_latency_seconds` and dropped the `gpu_` of the
/// prefix-cache counters; a diagnosis must read whichever the running release serves.
pub const SIGNALS: &[Signal] = &[
    s(Key::Running, &["vllm:num_requests_running"], Gauge, Engine),
    s(Key::Waiting, &["vllm:num_requests_waiting"], Gauge, Engine),
    s(
        Key::KvUsage,
        &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
        Gauge,
        Engine,
    ),
    // An info gauge: its `num_gpu_blocks` label is the cache's size, for a relative KV line.
    s(Key::CacheConfig, &["vllm:cache_config_info"], Gauge, Engine),
    s(Key::Preemptions, &["vllm:num_preemptions_total"], Counter, Engine),
    s(Key::PromptTokens, &["vllm:prompt_tokens_total"], Counter, Engine),
    s(
        Key::GenerationTokens,
        &["vllm:generation_tokens_total"],
        Counter,
        Engine,
    ),
    s(
        Key::PrefixQueries,
        &[
            "vllm:prefix_cache_queries_total",
            "vllm:gpu_prefix_cache_queries_total",
        ],
        Counter,
        Engine,
    ),
    s(
        Key::PrefixHits,
        &["vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"],
        Counter,
        Engine,
    ),
    s(
        Key::RequestSuccess,
        &["vllm:request_success_total"],
        Counter,
        Engine,
    ),
    s(
        Key::EngineRejections,
        &["vllm:admission_rejections_total"],
        Counter,
        Engine,
    ),
    s(
        Key::Ttft,
        &["vllm:time_to_first_token_seconds"],
        Histogram,
        Engine,
    ),
    s(
        Key::Itl,
        &[
            "vllm:inter_token_latency_seconds",
            "vllm:time_per_output_token_seconds",
        ],
        Histogram,
        Engine,
    ),
    s(Key::E2e, &["vllm:e2e_request_latency_seconds"], Histogram, Engine),
    s(
        Key::QueueTime,
        &["vllm:request_queue_time_seconds"],
        Histogram,
        Engine,
    ),
    s(
        Key::PrefillTime,
        &["vllm:request_prefill_time_seconds"],
        Histogram,
        Engine,
    ),
    s(
        Key::DecodeTime,
        &["vllm:request_decode_time_seconds"],
        Histogram,
        Engine,
    ),
    s(Key::GwRequests, &["spillway_requests_total"], Counter, Gateway),
    s(
        Key::GwRejections,
        &["spillway_rejections_total"],
        Counter,
        Gateway,
    ),
    s(
        Key::GwCancellations,
        &["spillway_cancellations_total"],
        Counter,
        Gateway,
    ),
    s(
        Key::GwUpstream,
        &["spillway_upstream_requests_total"],
        Counter,
        Gateway,
    ),
    s(
        Key::GwQueueWait,
        &["spillway_queue_wait_seconds"],
        Histogram,
        Gateway,
    ),
    s(
        Key::GwTtft,
        &["spillway_time_to_first_token_seconds"],
        Histogram,
        Gateway,
    ),
    s(
        Key::GwItl,
        &["spillway_inter_token_latency_seconds"],
        Histogram,
        Gateway,
    ),
    s(
        Key::GwDuration,
        &["spillway_request_duration_seconds"],
        Histogram,
        Gateway,
    ),
    s(Key::GwQueued, &["spillway_queued"], Gauge, Gateway),
    s(
        Key::GwOldestWait,
        &["spillway_queue_oldest_wait_seconds"],
        Gauge,
        Gateway,
    ),
    s(Key::GwInFlight, &["spillway_in_flight"], Gauge, Gateway),
    s(
        Key::GwConcurrencyLimit,
        &["spillway_concurrency_limit"],
        Gauge,
        Gateway,
    ),
    s(
        Key::GwGoodput,
        &["spillway_goodput_requests_total"],
        Counter,
        Gateway,
    ),
    s(
        Key::GwSloRequests,
        &["spillway_slo_requests_total"],
        Counter,
        Gateway,
    ),
    s(
        Key::GwReplicaHealthy,
        &["spillway_replica_healthy"],
        Gauge,
        Gateway,
    ),
    s(Key::GpuUtil, &["DCGM_FI_DEV_GPU_UTIL"], Gauge, Gpu),
    s(
        Key::GrEngineActive,
        &["DCGM_FI_PROF_GR_ENGINE_ACTIVE"],
        Gauge,
        Gpu,
    ),
    s(Key::FbUsed, &["DCGM_FI_DEV_FB_USED"], Gauge, Gpu),
    s(Key::FbFree, &["DCGM_FI_DEV_FB_FREE"], Gauge, Gpu),
    s(Key::Xid, &["DCGM_FI_DEV_XID_ERRORS"], Gauge, Gpu),
    s(Key::EccDbe, &["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"], Gauge, Gpu),
];

/// What discovery found for one signal.
#[derive(Debug, Clone, Serialize)]
pub struct Found {
    pub key: Key,
    pub layer: Layer,
    pub kind: Kind,
    /// The current name.
    pub wanted: &'static str,
    /// The name the sources serve, if any.
    pub name: Option<&'static str>,
    /// True when only an older name was found.
    pub renamed: bool,
}

/// Which names of the catalogue exist in `snap` (histograms by their `_bucket` series).
pub fn discover(snap: &Snapshot) -> Vec<Found> {
    SIGNALS
        .iter()
        .map(|sig| {
            let hit = sig.names.iter().position(|n| match sig.kind {
                Histogram => snap.has(&format!("{n}_bucket")),
                _ => snap.has(n),
            });
            Found {
                key: sig.key,
                layer: sig.layer,
                kind: sig.kind,
                wanted: sig.names[0],
                name: hit.map(|i| sig.names[i]),
                renamed: hit.is_some_and(|i| i > 0),
            }
        })
        .collect()
}

/// The `{__name__=~…}` alternation of every name in the catalogue, for one Prometheus query.
pub fn name_regex() -> String {
    let mut names: Vec<String> = Vec::new();
    for sig in SIGNALS {
        for n in sig.names {
            match sig.kind {
                Histogram => {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        names.push(format!("{n}{suffix}"));
                    }
                }
                _ => names.push((*n).to_owned()),
            }
        }
    }
    names.push("up".into());
    names.push("process_start_time_seconds".into());
    names.join("|")
}
