//! One engine replica: shared state, the step loop that drives the scheduler on `tokio::time`, and
//! the handle through which the server submits work and tests read ground truth.

use crate::config::EngineConfig;
use crate::cost::StepShape;
use crate::faults::{FaultPatch, Faults};
use crate::kv::block_hashes;
use crate::metrics::{GpuReading, Metrics};
use crate::scheduler::{
    FinishReason, Progress, RequestRecord, Scheduler, SchedulerLimits, SeqSpec, StepOutcome,
};
use protocol::ApiError;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokenize::Tokenizer;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

/// Finished-request records kept for [`Engine::records`]; older ones are dropped.
const RECORDS_KEPT: usize = 100_000;
/// How often a step loop with only stalled work looks for clients that left.
const STALL_POLL: Duration = Duration::from_millis(50);

/// What the listener does: serve, refuse connections, or behave as a dead process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenerState {
    Serving,
    Refusing,
    Crashed,
}

/// A cheap, clonable handle to one engine replica.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("model", &self.inner.config.model)
            .finish()
    }
}

struct Inner {
    config: EngineConfig,
    tokenizer: Tokenizer,
    metrics: Metrics,
    core: Mutex<Core>,
    wake: Notify,
    next_id: AtomicU64,
    control: Mutex<Control>,
    listener: watch::Sender<ListenerState>,
    stopping: AtomicBool,
    /// When the API server finishes the work it has been given (`None`: never busy yet).
    frontend_free_at: Mutex<Option<Instant>>,
}

/// The running step loop of an engine; dropping it stops the loop.
pub struct StepLoop {
    inner: Arc<Inner>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl StepLoop {
    /// Stops the loop; sequences in flight stay where they are.
    pub fn stop(self) {}
}

impl std::fmt::Debug for StepLoop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepLoop")
            .field("dedicated_thread", &self.task.is_none())
            .finish()
    }
}

impl Drop for StepLoop {
    fn drop(&mut self) {
        self.inner.stopping.store(true, Ordering::Release);
        self.inner.wake.notify_one();
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

struct Control {
    faults: Faults,
    loading_until: Option<Instant>,
    /// Requests counted towards `fail_every` since it was set.
    fail_counter: u64,
}

struct Core {
    sched: Scheduler,
    out: StepOutcome,
    records: VecDeque<RequestRecord>,
    stats: Stats,
    rng: SmallRng,
    /// (end, duration) of the steps of the last second, for GPU utilisation.
    busy: VecDeque<(Instant, Duration)>,
}

/// Counters kept since the engine started.
#[derive(Debug, Clone, Default)]
struct Stats {
    max_running: usize,
    steps: u64,
    aborts: u64,
    preemptions: u64,
    generated: u64,
    lateness: Option<hdrhistogram::Histogram<u64>>,
}

/// The engine's state at one moment: the ground truth tests compare the gateway's view against.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub running: usize,
    pub waiting: usize,
    /// The most sequences ever running in one step.
    pub max_running: usize,
    pub steps: u64,
    pub aborts: u64,
    pub preemptions: u64,
    pub generated_tokens: u64,
    pub kv_usage: f64,
    pub kv_blocks_total: usize,
    pub kv_blocks_free: usize,
}

/// How late steps ended against the cost model, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lateness {
    pub steps: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
}

/// What a server asks the engine to generate.
#[derive(Debug, Clone)]
pub struct GenerateParams {
    pub prompt: Vec<u32>,
    pub max_tokens: Option<u32>,
    pub n: u32,
    pub ignore_eos: bool,
}

/// Sequences being generated for one request; dropping it aborts them at the next step.
pub struct Generation {
    pub id: u64,
    pub prompt_tokens: u32,
    pub choices: Vec<watch::Receiver<Progress>>,
    _abort_on_drop: WakeOnDrop,
}

impl std::fmt::Debug for Generation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generation")
            .field("id", &self.id)
            .field("choices", &self.choices.len())
            .finish()
    }
}

/// Wakes the step loop when a request's receivers go away, so an idle or stalled engine notices.
struct WakeOnDrop(Arc<Inner>);

impl Drop for WakeOnDrop {
    fn drop(&mut self) {
        self.0.wake.notify_one();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock is a bug elsewhere; the state itself stays consistent.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Engine {
    /// Builds an engine and starts its step loop: on the current runtime, or on a thread of its own
    /// when `config.core_thread` is set.
    pub fn start(config: EngineConfig) -> Result<(Engine, StepLoop), crate::EngineError> {
        config.validate()?;
        let tokenizer = match &config.tokenizer {
            Some(path) => Tokenizer::from_file(path)?,
            None => Tokenizer::Estimate,
        };
        let cache = crate::metrics::CacheInfo {
            num_gpu_blocks: u32::try_from(config.num_blocks()).unwrap_or(u32::MAX),
            block_size: config.block_size,
            prefix_caching: config.enable_prefix_caching,
        };
        let metrics = Metrics::new(&config.model, &config.gpu.name, config.dcgm, 0, cache);
        let sched = Scheduler::new(
            SchedulerLimits {
                max_num_seqs: config.max_num_seqs,
                max_num_batched_tokens: config.max_num_batched_tokens,
                block_size: config.block_size as usize,
                enable_prefix_caching: config.enable_prefix_caching,
            },
            config.num_blocks(),
        );
        let (listener, _) = watch::channel(if config.faults.refuse_connections {
            ListenerState::Refusing
        } else {
            ListenerState::Serving
        });
        let inner = Arc::new(Inner {
            control: Mutex::new(Control {
                faults: config.faults.clone(),
                loading_until: None,
                fail_counter: 0,
            }),
            core: Mutex::new(Core {
                sched,
                out: StepOutcome::default(),
                records: VecDeque::new(),
                stats: Stats {
                    lateness: hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 3).ok(),
                    ..Stats::default()
                },
                rng: SmallRng::seed_from_u64(config.seed),
                busy: VecDeque::new(),
            }),
            tokenizer,
            metrics,
            wake: Notify::new(),
            next_id: AtomicU64::new(1),
            listener,
            stopping: AtomicBool::new(false),
            frontend_free_at: Mutex::new(None),
            config,
        });
        let task = if inner.config.core_thread {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .map_err(|e| {
                    crate::EngineError::Invalid(format!("cannot start the engine core's runtime: {e}"))
                })?;
            let core = inner.clone();
            std::thread::Builder::new()
                .name("engine-core".into())
                .spawn(move || {
                    raise_core_priority(core.config.cost.overhead > Duration::ZERO);
                    runtime.block_on(step_loop(core))
                })
                .map_err(|e| {
                    crate::EngineError::Invalid(format!("cannot start the engine core thread: {e}"))
                })?;
            None
        } else {
            Some(tokio::spawn(step_loop(inner.clone())))
        };
        let steps = StepLoop {
            inner: inner.clone(),
            task,
        };
        Ok((Engine { inner }, steps))
    }

    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    pub fn model(&self) -> &str {
        &self.inner.config.model
    }

    pub fn tokenize(&self, text: &str) -> Vec<u32> {
        self.inner.tokenizer.encode(text)
    }

    /// The API server's costs now: the preset's, or a fault's.
    fn frontend_cost(&self) -> crate::cost::FrontendCost {
        lock(&self.inner.control)
            .faults
            .frontend
            .unwrap_or(self.inner.config.frontend)
    }

    /// Waits for the API server to take this request in: its turn on the server's serial
    /// timeline (behind the tokens it is still writing), then `per_request` of its own.
    pub async fn frontend_admit(&self) {
        let cost = self.frontend_cost();
        if cost.is_zero() {
            return;
        }
        let ready = {
            let mut free = lock(&self.inner.frontend_free_at);
            let now = Instant::now();
            let ready = free.map_or(now, |f| f.max(now)) + cost.per_request;
            *free = Some(ready);
            ready
        };
        if ready > Instant::now() {
            tokio::time::sleep_until(ready).await;
        }
    }

    /// Admits a request, or refuses it as vLLM would (length limits, loading, injected failures).
    pub fn submit(&self, params: GenerateParams) -> Result<Generation, ApiError> {
        let cfg = &self.inner.config;
        let now = Instant::now();
        let stall_at = {
            let mut control = lock(&self.inner.control);
            if *self.inner.listener.borrow() == ListenerState::Crashed {
                return Err(ApiError::vllm(
                    503,
                    "ServiceUnavailableError",
                    "engine is dead",
                    None,
                ));
            }
            if control.loading_until.is_some_and(|t| now < t) {
                return Err(ApiError::vllm(
                    503,
                    "ServiceUnavailableError",
                    "model is still loading",
                    None,
                ));
            }
            if let Some(fail) = control.faults.fail_every {
                control.fail_counter += 1;
                if control.fail_counter.is_multiple_of(u64::from(fail.nth.get())) {
                    return Err(injected_failure(fail.status));
                }
            }
            control.faults.stall_after_tokens
        };
        let prompt_len = u32::try_from(params.prompt.len()).unwrap_or(u32::MAX);
        if prompt_len == 0 {
            return Err(ApiError::bad_request(
                "The prompt cannot be empty.",
                Some("prompt"),
            ));
        }
        if prompt_len >= cfg.max_model_len {
            return Err(ApiError::bad_request(
                format!(
                    "This model's maximum context length is {} tokens. However, your request has {} input tokens. Please reduce the length of the input messages.",
                    cfg.max_model_len, prompt_len
                ),
                Some("messages"),
            ));
        }
        let max_tokens = match params.max_tokens {
            Some(0) => {
                return Err(ApiError::bad_request(
                    "max_tokens must be at least 1, got 0.",
                    Some("max_tokens"),
                ));
            }
            Some(m) if m > cfg.max_model_len => {
                return Err(ApiError::bad_request(
                    format!(
                        "max_tokens ({m}) is greater than the model's maximum context length of {} tokens.",
                        cfg.max_model_len
                    ),
                    Some("max_tokens"),
                ));
            }
            // As vLLM 0.32: what does not fit beside the prompt is cut, and the answer ends
            // with `length` where the context does.
            Some(m) => m.min(cfg.max_model_len - prompt_len),
            None => cfg.max_model_len - prompt_len,
        };
        if params.n == 0 {
            return Err(ApiError::bad_request("n must be at least 1, got 0.", Some("n")));
        }
        let hashes = if cfg.enable_prefix_caching {
            block_hashes(&params.prompt, cfg.block_size as usize)
        } else {
            Vec::new()
        };
        let id = self
            .inner
            .next_id
            .fetch_add(u64::from(params.n), Ordering::Relaxed);
        let mut core = lock(&self.inner.core);
        // vLLM's admission check counts the requests it holds, running and waiting alike.
        if let Some(limit) = cfg.max_num_queued_reqs
            && core.sched.num_waiting() + core.sched.num_running() + params.n as usize > limit
        {
            self.inner.metrics.queued_reqs_rejections.inc();
            return Err(queue_full());
        }
        if core.sched.num_waiting() + params.n as usize > cfg.max_waiting {
            return Err(ApiError::vllm(
                503,
                "ServiceUnavailableError",
                format!(
                    "the engine's waiting queue is full ({} requests)",
                    cfg.max_waiting
                ),
                None,
            ));
        }
        let mut choices = Vec::with_capacity(params.n as usize);
        for i in 0..params.n {
            let (target, reason) = match (&cfg.output_len, params.ignore_eos) {
                (Some(dist), false) => {
                    let len = dist.sample(&mut core.rng);
                    if len < max_tokens {
                        (len, FinishReason::Stop)
                    } else {
                        (max_tokens, FinishReason::Length)
                    }
                }
                _ => (max_tokens, FinishReason::Length),
            };
            let spec = SeqSpec {
                prompt_len,
                prompt_hashes: hashes.clone(),
                target_tokens: target,
                reason_at_target: reason,
                stall_at,
            };
            choices.push(core.sched.add(id + u64::from(i), spec, now));
        }
        let waiting = core.sched.num_waiting();
        drop(core);
        self.inner.metrics.set_waiting(waiting);
        self.inner.wake.notify_one();
        Ok(Generation {
            id,
            prompt_tokens: prompt_len,
            choices,
            _abort_on_drop: WakeOnDrop(self.inner.clone()),
        })
    }

    /// Whether `/health` is 200: not loading, not crashed.
    pub fn healthy(&self) -> bool {
        let control = lock(&self.inner.control);
        *self.inner.listener.borrow() != ListenerState::Crashed
            && control.loading_until.is_none_or(|t| Instant::now() >= t)
    }

    pub fn faults(&self) -> Faults {
        lock(&self.inner.control).faults.clone()
    }

    /// Changes the faults in force (the admin endpoint's `POST /admin/faults`).
    pub fn apply_faults(&self, patch: &FaultPatch) -> Result<Faults, crate::EngineError> {
        let faults = {
            let mut control = lock(&self.inner.control);
            let before = control.faults.fail_every;
            patch.apply_to(&mut control.faults)?;
            if control.faults.fail_every != before {
                control.fail_counter = 0;
            }
            if let Some(d) = patch.loading {
                control.loading_until = Some(Instant::now() + d);
            }
            if patch.clear {
                control.loading_until = None;
            }
            control.faults.clone()
        };
        if patch.crash {
            self.crash();
        } else if *self.inner.listener.borrow() != ListenerState::Crashed {
            let want = if faults.refuse_connections {
                ListenerState::Refusing
            } else {
                ListenerState::Serving
            };
            self.inner
                .listener
                .send_if_modified(|s| std::mem::replace(s, want) != want);
        }
        self.inner.wake.notify_one();
        Ok(faults)
    }

    /// Dies like a killed process: the listener and every connection close, every sequence is lost.
    pub fn crash(&self) {
        self.inner.listener.send_replace(ListenerState::Crashed);
        {
            let mut guard = lock(&self.inner.core);
            let core = &mut *guard;
            core.out.clear();
            core.sched.fail_all(Instant::now(), &mut core.out);
            record_finished(&self.inner.metrics, core);
        }
        self.inner.wake.notify_one();
    }

    /// Comes back after a crash, empty, as a restarted process would.
    pub fn restart(&self) {
        let refusing = lock(&self.inner.control).faults.refuse_connections;
        self.inner.listener.send_replace(if refusing {
            ListenerState::Refusing
        } else {
            ListenerState::Serving
        });
        self.inner.wake.notify_one();
    }

    pub fn listener_state(&self) -> watch::Receiver<ListenerState> {
        self.inner.listener.subscribe()
    }

    pub fn snapshot(&self) -> Snapshot {
        let core = lock(&self.inner.core);
        Snapshot {
            running: core.sched.num_running(),
            waiting: core.sched.num_waiting(),
            max_running: core.stats.max_running,
            steps: core.stats.steps,
            aborts: core.stats.aborts,
            preemptions: core.stats.preemptions,
            generated_tokens: core.stats.generated,
            kv_usage: core.sched.kv.usage(),
            kv_blocks_total: core.sched.kv.total(),
            kv_blocks_free: core.sched.kv.num_free(),
        }
    }

    /// Records of finished and aborted requests, oldest first (the last 100,000).
    pub fn records(&self) -> Vec<RequestRecord> {
        lock(&self.inner.core).records.iter().cloned().collect()
    }

    /// Forgets the step lateness recorded so far, so that a benchmark can measure one window.
    pub fn reset_lateness(&self) {
        if let Some(h) = lock(&self.inner.core).stats.lateness.as_mut() {
            h.reset();
        }
    }

    pub fn lateness(&self) -> Lateness {
        let core = lock(&self.inner.core);
        match &core.stats.lateness {
            Some(h) if !h.is_empty() => Lateness {
                steps: h.len(),
                p50_us: h.value_at_quantile(0.5),
                p99_us: h.value_at_quantile(0.99),
                max_us: h.max(),
            },
            _ => Lateness {
                steps: 0,
                p50_us: 0,
                p99_us: 0,
                max_us: 0,
            },
        }
    }

    /// What the simulated GPU would report to DCGM now: activity over the last second, memory
    /// held by the weights and the KV cache, and the XID/ECC faults in force.
    pub fn gpu_reading(&self) -> GpuReading {
        // Control before core, never inside it: one lock order everywhere.
        let faults = lock(&self.inner.control).faults.clone();
        let core = lock(&self.inner.core);
        let now = Instant::now();
        let window = Duration::from_secs(1);
        let busy: Duration = core
            .busy
            .iter()
            .filter(|(end, _)| now.saturating_duration_since(*end) < window)
            .map(|(_, d)| *d)
            .sum();
        let util = (busy.as_secs_f64() / window.as_secs_f64()).min(1.0);
        let running = core.sched.num_running() as f64;
        let gpu = &self.inner.config.gpu;
        let kv_mib = (f64::from(self.inner.config.kv_cache_tokens) * gpu.kv_bytes_per_token as f64
            / 1_048_576.0)
            .min((gpu.memory_mib - gpu.static_mib) as f64);
        let used = gpu.static_mib as f64 + kv_mib * core.sched.kv.usage();
        GpuReading {
            util,
            // Tensor pipes fill with batch size; memory traffic dominates small-batch decode.
            tensor_active: util * (running / (running + 32.0)).max(0.05),
            dram_active: util * 0.6,
            fb_used_mib: used.round(),
            fb_free_mib: (gpu.memory_mib as f64 - used).round(),
            xid: faults.xid,
            ecc_dbe: faults.ecc_dbe,
        }
    }

    /// The Prometheus text exposition of this replica.
    pub fn metrics_text(&self) -> Vec<u8> {
        let m = &self.inner.metrics;
        let gpu = m.dcgm.as_ref().map(|_| self.gpu_reading());
        let core = lock(&self.inner.core);
        m.running.set(core.sched.num_running() as f64);
        m.set_waiting(core.sched.num_waiting());
        m.kv_usage.set(core.sched.kv.usage());
        drop(core);
        if let (Some(d), Some(r)) = (&m.dcgm, gpu) {
            d.gpu_util.set((r.util * 100.0).round());
            d.gr_engine_active.set(r.util);
            d.tensor_active.set(r.tensor_active);
            d.dram_active.set(r.dram_active);
            d.fb_used.set(r.fb_used_mib);
            d.fb_free.set(r.fb_free_mib);
            d.xid.set(f64::from(r.xid));
            d.ecc_dbe.set(r.ecc_dbe as f64);
        }
        m.encode()
    }
}

/// Steps are the engine's clock, so the core thread should preempt the threads writing streams:
/// on a loaded machine a normal thread wakes milliseconds late. A real-time (FIFO) policy is safe
/// only when every step sleeps (a non-zero overhead); otherwise, or without the privilege (root or
/// CAP_SYS_NICE), the highest normal priority; failing that, late steps show in `Engine::lateness`.
fn raise_core_priority(steps_always_sleep: bool) {
    use thread_priority::{
        RealtimeThreadSchedulePolicy, ThreadPriority, ThreadPriorityValue, ThreadSchedulePolicy,
        set_current_thread_priority, set_thread_priority_and_policy, thread_native_id,
    };
    if steps_always_sleep {
        let fifo = ThreadSchedulePolicy::Realtime(RealtimeThreadSchedulePolicy::Fifo);
        let priority = ThreadPriorityValue::try_from(50u8).map(ThreadPriority::Crossplatform);
        if let Ok(p) = priority
            && set_thread_priority_and_policy(thread_native_id(), p, fifo).is_ok()
        {
            return;
        }
    }
    if let Err(e) = set_current_thread_priority(ThreadPriority::Max) {
        tracing::debug!(error = ?e, "engine core thread keeps the default priority");
    }
}

fn injected_failure(status: u16) -> ApiError {
    let kind = match status {
        429 => "TooManyRequestsError",
        503 => "ServiceUnavailableError",
        400..=499 => "BadRequestError",
        _ => "InternalServerError",
    };
    ApiError::vllm(status, kind, format!("injected failure (status {status})"), None)
}

/// What a request refused by `max_num_queued_reqs` (running and waiting) is told: vLLM 0.32's words.
const QUEUE_FULL: &str = "The engine is currently busy and cannot accept new requests. Please try again later or on a different instance.";

fn queue_full() -> ApiError {
    // vLLM 0.32's own words and type (with its space) for this refusal.
    ApiError::vllm(503, "Service Unavailable", QUEUE_FULL, None)
}

/// Whether `e` is the refusal of a full waiting queue, which vLLM sends a streamed request inside
/// a 200 stream.
pub(crate) fn is_queue_full(e: &ApiError) -> bool {
    e.status == 503 && e.message() == QUEUE_FULL
}

async fn step_loop(inner: Arc<Inner>) {
    let cost = inner.config.cost;
    let mut gpu_free_at: Option<Instant> = None;
    loop {
        if inner.stopping.load(Ordering::Acquire) {
            return;
        }
        if *inner.listener.borrow() == ListenerState::Crashed {
            gpu_free_at = None;
            inner.wake.notified().await;
            continue;
        }
        let (shape, idle) = {
            let mut guard = lock(&inner.core);
            let core = &mut *guard;
            let now = Instant::now();
            core.out.clear();
            core.sched.reap_aborted(now, &mut core.out);
            record_finished(&inner.metrics, core);
            let shape = core.sched.schedule(now);
            core.stats.max_running = core.stats.max_running.max(core.sched.num_running());
            inner.metrics.running.set(core.sched.num_running() as f64);
            inner.metrics.set_waiting(core.sched.num_waiting());
            (shape, core.sched.is_idle())
        };
        if shape.is_empty() {
            gpu_free_at = None;
            if idle {
                inner.wake.notified().await;
            } else {
                let _ = tokio::time::timeout(STALL_POLL, inner.wake.notified()).await;
            }
            continue;
        }
        let (slow, frontend) = {
            let control = lock(&inner.control);
            (
                control.faults.slow_factor,
                control.faults.frontend.unwrap_or(inner.config.frontend),
            )
        };
        let duration = cost.step_time(&shape).mul_f64(slow);
        let now = Instant::now();
        // Back-to-back steps start when the previous one ended on the model's clock, so timer
        // lateness does not accumulate; after a stall of more than a little, restart from now.
        let start = match gpu_free_at {
            Some(t) if now.saturating_duration_since(t) < Duration::from_millis(2) => t,
            _ => now,
        };
        let deadline = start + duration;
        if inner.config.core_thread {
            // This thread runs nothing but the step loop: block on the kernel's high-resolution
            // timer, which wakes within microseconds and, unlike spinning, is not preempted for
            // hogging the CPU.
            if let Some(left) = deadline.checked_duration_since(Instant::now()) {
                std::thread::sleep(left);
            }
        } else if inner.config.precise_timer {
            sleep_precise(deadline).await;
        } else if deadline > now {
            tokio::time::sleep_until(deadline).await;
        } else {
            tokio::task::yield_now().await;
        }
        let woke = Instant::now();
        gpu_free_at = Some(deadline);
        let generated = finish_step(
            &inner,
            &shape,
            duration,
            woke,
            woke.saturating_duration_since(deadline),
        );
        // The API server detokenizes and writes the step's tokens, one after another.
        if !frontend.per_output_token.is_zero() && generated > 0 {
            let mut free = lock(&inner.frontend_free_at);
            let start = free.map_or(deadline, |f| f.max(deadline));
            *free = Some(start + frontend.per_output_token * u32::try_from(generated).unwrap_or(u32::MAX));
        }
    }
}

/// Sleeps on the runtime's 1 ms timer until shortly before `deadline`, then yields until it passes.
async fn sleep_precise(deadline: Instant) {
    if let Some(coarse) = deadline.checked_sub(Duration::from_micros(1500))
        && coarse > Instant::now()
    {
        tokio::time::sleep_until(coarse).await;
    }
    while Instant::now() < deadline {
        tokio::task::yield_now().await;
    }
}

/// Records a finished step; returns the tokens it generated.
fn finish_step(inner: &Inner, shape: &StepShape, duration: Duration, now: Instant, late: Duration) -> u64 {
    let m = &inner.metrics;
    let mut guard = lock(&inner.core);
    let core = &mut *guard;
    core.out.clear();
    core.sched.complete(now, &mut core.out);
    m.iteration_tokens.observe(f64::from(shape.tokens()));
    for d in &core.out.itl {
        m.itl.observe(d.as_secs_f64());
    }
    for d in &core.out.first_tokens {
        m.ttft.observe(d.as_secs_f64());
    }
    m.prompt_tokens.inc_by(core.out.new_prompt_tokens);
    m.generation_tokens.inc_by(core.out.generated);
    let counters = std::mem::take(&mut core.sched.counters);
    m.preemptions.inc_by(counters.preemptions);
    m.prefix_queries.inc_by(counters.prefix_queries);
    m.prefix_hits.inc_by(counters.prefix_hits);
    core.stats.preemptions += counters.preemptions;
    core.stats.generated += core.out.generated;
    core.stats.steps += 1;
    if let Some(h) = core.stats.lateness.as_mut() {
        let _ = h.record(late.as_micros().max(1) as u64);
    }
    core.busy.push_back((now, duration));
    while core
        .busy
        .front()
        .is_some_and(|(end, _)| now.saturating_duration_since(*end) > Duration::from_secs(1))
    {
        core.busy.pop_front();
    }
    let generated = core.out.generated;
    record_finished(m, core);
    m.running.set(core.sched.num_running() as f64);
    m.set_waiting(core.sched.num_waiting());
    m.kv_usage.set(core.sched.kv.usage());
    generated
}

fn record_finished(m: &Metrics, core: &mut Core) {
    for r in core.out.finished.drain(..) {
        // vLLM 0.32 aborts a request whose client left but does not count it here: its
        // `finished_reason="abort"` series stays 0 (the snapshot's `aborts` still counts them).
        if r.finish != FinishReason::Abort {
            m.success(r.finish).inc();
        }
        m.e2e.observe(r.e2e.as_secs_f64());
        m.queue.observe(r.queue.as_secs_f64());
        m.inference.observe(r.e2e.saturating_sub(r.queue).as_secs_f64());
        if let Some(p) = r.prefill {
            m.prefill.observe(p.as_secs_f64());
        }
        if let Some(d) = r.decode {
            m.decode.observe(d.as_secs_f64());
        }
        if r.finish == FinishReason::Abort {
            core.stats.aborts += 1;
        }
        if core.records.len() == RECORDS_KEPT {
            core.records.pop_front();
        }
        core.records.push_back(r);
    }
}
