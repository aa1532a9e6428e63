//! vLLM's Prometheus metrics, with vLLM's names, types, labels and buckets, plus optional
//! DCGM-exporter-like GPU metrics.

use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, Opts, Registry,
    TextEncoder,
};

use crate::scheduler::FinishReason;

/// `vllm:time_to_first_token_seconds` buckets.
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
];
/// `vllm:inter_token_latency_seconds` buckets.
pub const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
];
/// Buckets of the per-request latency histograms (e2e, queue, inference, prefill, decode).
pub const REQUEST_LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
];
/// `vllm:iteration_tokens_total` buckets.
pub const ITERATION_TOKEN_BUCKETS: &[f64] = &[
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];

pub(crate) struct Metrics {
    registry: Registry,
    pub(crate) running: Gauge,
    waiting: Gauge,
    /// `vllm:num_requests_waiting_by_reason`: every waiting request waits for `capacity` here;
    /// vLLM's other reason, `deferred` (e.g. a KV transfer), stays 0.
    waiting_for_capacity: Gauge,
    pub(crate) kv_usage: Gauge,
    pub(crate) preemptions: IntCounter,
    pub(crate) prompt_tokens: IntCounter,
    pub(crate) generation_tokens: IntCounter,
    pub(crate) prefix_queries: IntCounter,
    pub(crate) prefix_hits: IntCounter,
    success: [IntCounter; 4],
    /// `vllm:admission_rejections_total{reason="max_num_queued_reqs"}`: requests refused by the
    /// `--max-num-queued-reqs` limit (vLLM's other reason, `max_num_queued_tokens`, stays 0).
    pub(crate) queued_reqs_rejections: IntCounter,
    pub(crate) ttft: Histogram,
    pub(crate) itl: Histogram,
    pub(crate) e2e: Histogram,
    pub(crate) queue: Histogram,
    pub(crate) inference: Histogram,
    pub(crate) prefill: Histogram,
    pub(crate) decode: Histogram,
    pub(crate) iteration_tokens: Histogram,
    pub(crate) dcgm: Option<Dcgm>,
}

/// The DCGM exporter's gauges for one GPU.
pub(crate) struct Dcgm {
    pub(crate) gpu_util: Gauge,
    pub(crate) gr_engine_active: Gauge,
    pub(crate) tensor_active: Gauge,
    pub(crate) dram_active: Gauge,
    pub(crate) fb_used: Gauge,
    pub(crate) fb_free: Gauge,
    pub(crate) xid: Gauge,
    pub(crate) ecc_dbe: Gauge,
}

/// What `vllm:cache_config_info` says of the KV cache.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CacheInfo {
    pub(crate) num_gpu_blocks: u32,
    pub(crate) block_size: u32,
    pub(crate) prefix_caching: bool,
}

impl Metrics {
    pub(crate) fn new(model: &str, gpu_name: &str, dcgm: bool, gpu_index: u32, cache: CacheInfo) -> Self {
        let registry = Registry::new();
        let opts = |name: &str, help: &str| {
            Opts::new(name, help)
                .const_label("model_name", model)
                .const_label("engine", "0")
        };
        let hist = |name: &str, help: &str, buckets: &[f64]| {
            let o = opts(name, help);
            let h = Histogram::with_opts(HistogramOpts::from(o).buckets(buckets.to_vec()))
                .expect("valid histogram options");
            registry
                .register(Box::new(h.clone()))
                .expect("unique metric name");
            h
        };
        let gauge = |name: &str, help: &str| {
            let g = Gauge::with_opts(opts(name, help)).expect("valid gauge options");
            registry
                .register(Box::new(g.clone()))
                .expect("unique metric name");
            g
        };
        let counter = |name: &str, help: &str| {
            let c = IntCounter::with_opts(opts(name, help)).expect("valid counter options");
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric name");
            c
        };
        // vLLM's `cache_config_info`: an info gauge, 1, whose labels say the cache's size.
        let (blocks, block_size, prefix) = (
            cache.num_gpu_blocks.to_string(),
            cache.block_size.to_string(),
            if cache.prefix_caching { "True" } else { "False" },
        );
        let cache_info = Gauge::with_opts(
            opts(
                "vllm:cache_config_info",
                "Information of the LLMEngine CacheConfig",
            )
            .const_label("num_gpu_blocks", &blocks)
            .const_label("block_size", &block_size)
            .const_label("enable_prefix_caching", prefix),
        )
        .expect("valid gauge options");
        registry
            .register(Box::new(cache_info.clone()))
            .expect("unique metric name");
        cache_info.set(1.0);
        let success_vec = IntCounterVec::new(
            opts(
                "vllm:request_success_total",
                "Count of successfully processed requests.",
            ),
            &["finished_reason"],
        )
        .expect("valid counter options");
        registry
            .register(Box::new(success_vec.clone()))
            .expect("unique metric name");
        let success = FinishReason::ALL.map(|r| success_vec.with_label_values(&[r.as_str()]));
        // vLLM 0.32 has this reason too (a repetition detector the simulator does not model).
        success_vec.with_label_values(&["repetition"]);
        // vLLM 0.32 labels its refusals by model and reason only, with no `engine`.
        let rejections = IntCounterVec::new(
            Opts::new(
                "vllm:admission_rejections_total",
                "Number of admission attempts rejected by a queue limit, by reason.",
            )
            .const_label("model_name", model),
            &["reason"],
        )
        .expect("valid counter options");
        registry
            .register(Box::new(rejections.clone()))
            .expect("unique metric name");
        rejections.with_label_values(&["max_num_queued_tokens"]);
        let queued_reqs_rejections = rejections.with_label_values(&["max_num_queued_reqs"]);

        let dcgm = dcgm.then(|| {
            let uuid = gpu_uuid(gpu_index);
            let g = |name: &str, help: &str| {
                let o = Opts::new(name, help)
                    .const_label("gpu", gpu_index.to_string())
                    .const_label("UUID", uuid.as_str())
                    .const_label("device", format!("nvidia{gpu_index}"))
                    .const_label("modelName", gpu_name)
                    .const_label("Hostname", "spillway-engine");
                let g = Gauge::with_opts(o).expect("valid gauge options");
                registry
                    .register(Box::new(g.clone()))
                    .expect("unique metric name");
                g
            };
            Dcgm {
                gpu_util: g("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
                gr_engine_active: g(
                    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
                    "Ratio of time the graphics engine is active.",
                ),
                tensor_active: g(
                    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
                    "Ratio of cycles the tensor (HMMA) pipe is active.",
                ),
                dram_active: g(
                    "DCGM_FI_PROF_DRAM_ACTIVE",
                    "Ratio of cycles the device memory interface is active sending or receiving data.",
                ),
                fb_used: g("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
                fb_free: g("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
                xid: g(
                    "DCGM_FI_DEV_XID_ERRORS",
                    "Value of the last XID error encountered.",
                ),
                ecc_dbe: g(
                    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                    "Total number of double-bit volatile ECC errors.",
                ),
            }
        });

        Self {
            running: gauge(
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
            ),
            waiting: gauge(
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
            ),
            waiting_for_capacity: {
                let by_reason = GaugeVec::new(
                    opts(
                        "vllm:num_requests_waiting_by_reason",
                        "Number of requests waiting, by why they wait.",
                    ),
                    &["reason"],
                )
                .expect("valid gauge options");
                registry
                    .register(Box::new(by_reason.clone()))
                    .expect("unique metric name");
                by_reason.with_label_values(&["deferred"]);
                by_reason.with_label_values(&["capacity"])
            },
            kv_usage: gauge(
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
            ),
            preemptions: counter(
                "vllm:num_preemptions_total",
                "Cumulative number of preemption from the engine.",
            ),
            prompt_tokens: counter("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
            generation_tokens: counter(
                "vllm:generation_tokens_total",
                "Number of generation tokens processed.",
            ),
            prefix_queries: counter(
                "vllm:prefix_cache_queries_total",
                "Prefix cache queries, in terms of number of queried tokens.",
            ),
            prefix_hits: counter(
                "vllm:prefix_cache_hits_total",
                "Prefix cache hits, in terms of number of cached tokens.",
            ),
            success,
            queued_reqs_rejections,
            ttft: hist(
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                TTFT_BUCKETS,
            ),
            itl: hist(
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                ITL_BUCKETS,
            ),
            e2e: hist(
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                REQUEST_LATENCY_BUCKETS,
            ),
            queue: hist(
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
                REQUEST_LATENCY_BUCKETS,
            ),
            inference: hist(
                "vllm:request_inference_time_seconds",
                "Histogram of time spent in RUNNING phase for request.",
                REQUEST_LATENCY_BUCKETS,
            ),
            prefill: hist(
                "vllm:request_prefill_time_seconds",
                "Histogram of time spent in PREFILL phase for request.",
                REQUEST_LATENCY_BUCKETS,
            ),
            decode: hist(
                "vllm:request_decode_time_seconds",
                "Histogram of time spent in DECODE phase for request.",
                REQUEST_LATENCY_BUCKETS,
            ),
            iteration_tokens: hist(
                "vllm:iteration_tokens_total",
                "Histogram of number of tokens per engine_step.",
                ITERATION_TOKEN_BUCKETS,
            ),
            dcgm,
            registry,
        }
    }

    /// The waiting queue's length, in both of vLLM's gauges.
    pub(crate) fn set_waiting(&self, n: usize) {
        self.waiting.set(n as f64);
        self.waiting_for_capacity.set(n as f64);
    }

    pub(crate) fn success(&self, reason: FinishReason) -> &IntCounter {
        &self.success[reason as usize]
    }

    /// The classic Prometheus text format (0.0.4), which every Prometheus and promtool reads.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut buf = Vec::with_capacity(16 * 1024);
        // Encoding gathered families into a Vec cannot fail.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        buf
    }
}

/// One GPU's DCGM readings (see [`crate::Engine::gpu_reading`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuReading {
    /// Share of the last second the GPU was busy (0–1).
    pub util: f64,
    pub tensor_active: f64,
    pub dram_active: f64,
    pub fb_used_mib: f64,
    pub fb_free_mib: f64,
    pub xid: u32,
    pub ecc_dbe: u64,
}

/// The families of dcgm-exporter this simulator serves: name, help.
const DCGM_FAMILIES: [(&str, &str); 8] = [
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
    (
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "Ratio of time the graphics engine is active.",
    ),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
    ),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
    ),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
    (
        "DCGM_FI_DEV_XID_ERRORS",
        "Value of the last XID error encountered.",
    ),
    (
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "Total number of double-bit volatile ECC errors.",
    ),
];

/// What dcgm-exporter serves for the GPUs of one host: GPU `i` is `gpus[i]` (`(modelName,
/// reading)`), labelled `gpu`, `UUID`, `device`, `modelName` and `Hostname` as the exporter does.
pub fn dcgm_exposition(hostname: &str, gpus: &[(&str, GpuReading)]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(4096);
    for (f, (name, help)) in DCGM_FAMILIES.iter().enumerate() {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (i, (model, r)) in gpus.iter().enumerate() {
            let value = match f {
                0 => (r.util * 100.0).round(),
                1 => r.util,
                2 => r.tensor_active,
                3 => r.dram_active,
                4 => r.fb_used_mib,
                5 => r.fb_free_mib,
                6 => f64::from(r.xid),
                _ => r.ecc_dbe as f64,
            };
            let model = model.replace('\\', "\\\\").replace('"', "\\\"");
            let _ = writeln!(
                out,
                "{name}{{gpu=\"{i}\",UUID=\"{}\",device=\"nvidia{i}\",modelName=\"{model}\",Hostname=\"{hostname}\"}} {value}",
                gpu_uuid(i as u32)
            );
        }
    }
    out
}

/// The simulated GPU's UUID, stable per index.
pub fn gpu_uuid(index: u32) -> String {
    format!("GPU-5e1f0000-0000-4000-8000-{index:012x}")
}
