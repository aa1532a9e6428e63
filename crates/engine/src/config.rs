//! Engine settings: vLLM's knobs, the cost model, and the presets that fill them in.

use crate::cost::{CostModel, FrontendCost};
use crate::faults::Faults;
use rand::Rng;
use rand_distr::{Distribution, LogNormal, Normal};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// A named set of engine settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// Fast enough for tests, slow enough that queues and timeouts show: ~1 ms steps at small batches.
    Tiny,
    /// Steps that cost nothing: the upstream for measuring a proxy's own overhead.
    Zero,
    /// Llama-3.1-8B-Instruct on one H100, calibrated to NVIDIA's published NIM table (200 in / 200 out).
    Llama31_8bH100,
}

impl Preset {
    pub const NAMES: [&'static str; 3] = ["tiny", "zero", "llama-3.1-8b-h100"];

    pub fn name(self) -> &'static str {
        match self {
            Preset::Tiny => "tiny",
            Preset::Zero => "zero",
            Preset::Llama31_8bH100 => "llama-3.1-8b-h100",
        }
    }
}

impl FromStr for Preset {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "tiny" => Ok(Preset::Tiny),
            "zero" => Ok(Preset::Zero),
            "llama-3.1-8b-h100" => Ok(Preset::Llama31_8bH100),
            other => Err(format!(
                "unknown preset '{other}' (known: {})",
                Preset::NAMES.join(", ")
            )),
        }
    }
}

/// What the simulated GPU reports through the DCGM-like metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuProfile {
    pub name: String,
    pub memory_mib: u64,
    /// Memory held by the weights and activations, whatever the load.
    pub static_mib: u64,
    /// Memory of one KV-cache token (all layers, K and V).
    pub kv_bytes_per_token: u64,
}

/// Everything one engine replica needs.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The served model name (`--served-model-name` in vLLM).
    pub model: String,
    pub preset: Preset,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: u32,
    pub max_model_len: u32,
    /// KV-cache capacity in tokens (vLLM derives it from `--gpu-memory-utilization`).
    pub kv_cache_tokens: u32,
    pub block_size: u32,
    pub enable_prefix_caching: bool,
    pub cost: CostModel,
    /// The API server's serial work in front of the scheduler (zero in every preset: see
    /// docs/engine-calibration.md).
    pub frontend: FrontendCost,
    /// How many tokens a request produces when it does not set `ignore_eos`; `None`: `max_tokens`.
    pub output_len: Option<LengthDist>,
    pub tokenizer: Option<PathBuf>,
    pub seed: u64,
    /// Requests allowed to wait in the engine; beyond it new ones get 503. vLLM has no such bound,
    /// so the default is large; it exists so that a flood cannot grow memory without limit.
    pub max_waiting: usize,
    /// vLLM's `--max-num-queued-reqs`: requests the engine may hold, running and waiting (vLLM's
    /// admission check counts both); beyond it vLLM refuses a new one with 503, a streamed one as
    /// a 200 stream of one error event and `[DONE]`. `None`: no bound but `max_waiting`.
    pub max_num_queued_reqs: Option<usize>,
    pub gpu: GpuProfile,
    /// Expose DCGM-exporter-like GPU metrics beside vLLM's.
    pub dcgm: bool,
    /// Sleep the last millisecond of each step with a yielding wait instead of the runtime's 1 ms
    /// timer, so that steps end within microseconds of the cost model. Never with a paused clock.
    pub precise_timer: bool,
    /// Run the step loop on a thread of its own, as vLLM runs its engine core in a process of its
    /// own, so that thousands of streams being written do not delay the steps. Never with a paused
    /// clock (the thread has its own runtime and clock).
    pub core_thread: bool,
    /// Faults in force from the start.
    pub faults: Faults,
    /// How streamed events are written: vLLM's compact JSON, or another server's style.
    pub sse_style: protocol::sse::Style,
    /// vLLM's response store (`VLLM_ENABLE_RESPONSES_API_STORE=1`): `GET /v1/responses/{id}`,
    /// cancel, `previous_response_id`, `background`. `None`: off, as in vLLM.
    pub responses_store: Option<StoreLimit>,
}

/// How much the response store keeps: vLLM's keeps everything; this one evicts the oldest ended
/// responses once their JSON and conversations pass `max_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreLimit {
    pub max_bytes: usize,
}

impl Default for StoreLimit {
    /// 64 MiB: thousands of agent turns of a few thousand tokens each.
    fn default() -> Self {
        StoreLimit { max_bytes: 64 << 20 }
    }
}

impl EngineConfig {
    pub fn preset(preset: Preset) -> Self {
        let h100 = GpuProfile {
            name: "NVIDIA H100 80GB HBM3 (simulated)".into(),
            memory_mib: 81_559,
            static_mib: 18_000,
            kv_bytes_per_token: 131_072,
        };
        let base = EngineConfig {
            model: "spillway-sim".into(),
            preset,
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            max_model_len: 8192,
            kv_cache_tokens: 400_000,
            block_size: 16,
            enable_prefix_caching: false,
            cost: CostModel::ZERO,
            frontend: FrontendCost::ZERO,
            output_len: None,
            tokenizer: None,
            seed: 0,
            max_waiting: 100_000,
            max_num_queued_reqs: None,
            gpu: h100,
            dcgm: false,
            precise_timer: false,
            core_thread: false,
            faults: Faults::default(),
            sse_style: protocol::sse::Style::Compact,
            responses_store: None,
        };
        match preset {
            Preset::Tiny => EngineConfig {
                max_num_seqs: 64,
                max_num_batched_tokens: 2048,
                max_model_len: 4096,
                kv_cache_tokens: 65_536,
                cost: CostModel {
                    overhead: Duration::from_micros(1000),
                    prefill_token: Duration::from_nanos(2000),
                    prefill_attention_per_million_pairs: Duration::ZERO,
                    decode_seq: Duration::from_micros(20),
                    context_token: Duration::from_nanos(20),
                },
                ..base
            },
            Preset::Zero => EngineConfig {
                max_num_seqs: 4096,
                max_num_batched_tokens: 1 << 20,
                max_model_len: 32_768,
                kv_cache_tokens: 1 << 26,
                ..base
            },
            Preset::Llama31_8bH100 => EngineConfig {
                max_num_seqs: 256,
                max_num_batched_tokens: 8192,
                max_model_len: 8192,
                kv_cache_tokens: 400_000,
                cost: crate::published::LLAMA31_8B_H100,
                ..base
            },
        }
    }

    /// Rejects settings that cannot run, naming the flag.
    pub fn validate(&self) -> Result<(), crate::EngineError> {
        self.check().map_err(crate::EngineError::Invalid)
    }

    fn check(&self) -> Result<(), String> {
        if self.max_num_seqs == 0 {
            return Err("--max-num-seqs must be at least 1".into());
        }
        if self.block_size == 0 {
            return Err("--block-size must be at least 1".into());
        }
        if self.max_model_len == 0 {
            return Err("--max-model-len must be at least 1".into());
        }
        if self.max_num_batched_tokens < self.max_num_seqs.min(u32::MAX as usize) as u32 {
            return Err(format!(
                "--max-num-batched-tokens ({}) must be at least --max-num-seqs ({}), as in vLLM",
                self.max_num_batched_tokens, self.max_num_seqs
            ));
        }
        if self.kv_cache_tokens < self.max_model_len {
            return Err(format!(
                "--kv-cache-tokens ({}) must hold at least one sequence of --max-model-len ({})",
                self.kv_cache_tokens, self.max_model_len
            ));
        }
        if !(self.faults.slow_factor.is_finite() && self.faults.slow_factor > 0.0) {
            return Err("the slow-down factor must be a positive number".into());
        }
        Ok(())
    }

    /// The cost model and API-server cost of a file in place of the preset's.
    pub fn use_cost_file(&mut self, file: &crate::cost::CostFile) {
        self.cost = file.cost;
        self.frontend = file.frontend;
    }

    pub fn num_blocks(&self) -> usize {
        (self.kv_cache_tokens / self.block_size) as usize
    }
}

/// A distribution of token counts: `fixed:N`, `uniform:A,B`, `normal:MEAN,SD`, `lognormal:MEAN,SD`
/// (mean and standard deviation of the lengths themselves, not of their logarithm). The grammar is
/// `spillway bench`'s too; `uniform:A-B` is read as `uniform:A,B` (see [`LengthDist::hint`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LengthDist {
    Fixed(u32),
    Uniform(u32, u32),
    Normal(f64, f64),
    LogNormal(f64, f64),
}

impl LengthDist {
    /// A length of at least 1.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> u32 {
        let v = match *self {
            LengthDist::Fixed(n) => f64::from(n),
            LengthDist::Uniform(a, b) => f64::from(rng.random_range(a..=b)),
            LengthDist::Normal(mean, sd) => Normal::new(mean, sd).map_or(mean, |d| d.sample(rng)),
            LengthDist::LogNormal(mean, sd) => {
                // Convert the lengths' mean/sd into the parameters of the underlying normal.
                let sigma2 = (1.0 + (sd * sd) / (mean * mean)).ln();
                let mu = mean.ln() - sigma2 / 2.0;
                LogNormal::new(mu, sigma2.sqrt()).map_or(mean, |d| d.sample(rng))
            }
        };
        v.round().clamp(1.0, f64::from(u32::MAX)) as u32
    }

    /// A note for `uniform:A-B`, which is accepted but spelt `uniform:A,B` like every other
    /// two-number form.
    pub fn hint(s: &str) -> Option<String> {
        let args = s.trim().strip_prefix("uniform:")?;
        let (a, b) = args.split_once('-')?;
        Some(format!(
            "'{s}' is read as 'uniform:{a},{b}'; write it that way (MIN,MAX, like normal:MEAN,SD)"
        ))
    }
}

impl FromStr for LengthDist {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || {
            format!(
                "bad length distribution '{s}': expected N, fixed:N, uniform:A,B, normal:MEAN,SD or lognormal:MEAN,SD"
            )
        };
        let (kind, args) = s.split_once(':').unwrap_or(("fixed", s));
        let dashed;
        let args = match (kind, args.split_once('-')) {
            ("uniform", Some((a, b))) if !args.contains(',') => {
                dashed = format!("{a},{b}");
                dashed.as_str()
            }
            _ => args,
        };
        let nums: Vec<f64> = args
            .split(',')
            .map(|a| a.trim().parse::<f64>())
            .collect::<Result<_, _>>()
            .map_err(|_| err())?;
        if nums.iter().any(|v| !v.is_finite() || *v < 0.0) {
            return Err(err());
        }
        let whole = |v: f64| (v.fract() == 0.0 && v >= 1.0 && v <= f64::from(u32::MAX)).then_some(v as u32);
        match (kind, nums.as_slice()) {
            ("fixed", [n]) => whole(*n).map(LengthDist::Fixed).ok_or_else(err),
            ("uniform", [a, b]) if a <= b => match (whole(*a), whole(*b)) {
                (Some(a), Some(b)) => Ok(LengthDist::Uniform(a, b)),
                _ => Err(err()),
            },
            ("normal", [m, sd]) if *m >= 1.0 => Ok(LengthDist::Normal(*m, *sd)),
            ("lognormal", [m, sd]) if *m >= 1.0 => Ok(LengthDist::LogNormal(*m, *sd)),
            _ => Err(err()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn length_dists_parse_and_reject() {
        assert_eq!("128".parse(), Ok(LengthDist::Fixed(128)));
        assert_eq!("uniform:10,20".parse(), Ok(LengthDist::Uniform(10, 20)));
        assert_eq!("uniform:10-20".parse(), Ok(LengthDist::Uniform(10, 20)));
        assert!(LengthDist::hint("uniform:10-20").is_some_and(|h| h.contains("'uniform:10,20'")));
        assert_eq!(LengthDist::hint("uniform:10,20"), None);
        assert_eq!(
            "lognormal:200,100".parse(),
            Ok(LengthDist::LogNormal(200.0, 100.0))
        );
        for bad in [
            "",
            "0",
            "uniform:20,10",
            "uniform:20-10",
            "uniform:1-2,3",
            "normal:1",
            "gamma:1,2",
            "fixed:-3",
            "fixed:1.5",
        ] {
            assert!(bad.parse::<LengthDist>().is_err(), "{bad}");
        }
    }

    #[test]
    fn lognormal_has_the_requested_mean() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let d = LengthDist::LogNormal(200.0, 100.0);
        let n = 20_000;
        let mean = (0..n).map(|_| f64::from(d.sample(&mut rng))).sum::<f64>() / f64::from(n);
        assert!((mean - 200.0).abs() < 5.0, "mean {mean}");
    }

    #[test]
    fn presets_validate() {
        for name in Preset::NAMES {
            let p: Preset = name.parse().unwrap();
            EngineConfig::preset(p).validate().unwrap();
            assert_eq!(p.name(), name);
        }
    }
}
