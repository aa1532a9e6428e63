//! The cost model: how long one engine step takes for the work scheduled into it.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The work one step does, as the scheduler planned it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepShape {
    /// Prompt tokens computed this step (new prefills, prefill chunks and recomputation).
    pub prefill_tokens: u32,
    /// (prompt token, attended token) pairs of those prefills: each token computed at position p
    /// attends to the p + 1 tokens up to and including itself, cached or computed earlier.
    pub prefill_pairs: u64,
    /// Sequences producing one output token this step.
    pub decode_seqs: u32,
    /// Tokens of context the decoding sequences attend to (the KV cache they read).
    pub decode_context_tokens: u64,
}

impl StepShape {
    pub fn is_empty(&self) -> bool {
        self.prefill_tokens == 0 && self.decode_seqs == 0
    }

    /// Tokens this step puts through the model, as vLLM's `iteration_tokens` histogram counts them.
    pub fn tokens(&self) -> u32 {
        self.prefill_tokens + self.decode_seqs
    }
}

/// `step = overhead + prefill_token × prefill tokens + prefill_attention × prefill pairs / 10⁶
///         + decode_seq × decoding sequences + context_token × context tokens attended by the decodes`.
///
/// The terms are the ones that move a real step: a fixed launch/sampling cost, compute-bound
/// prefill, the prefill's attention over the context it attends (quadratic in a prompt's length:
/// a 2k-token prompt costs more than twice a 1k one), per-sequence decode work, and memory-bound
/// attention over the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostModel {
    #[serde(with = "humantime_serde_compat")]
    pub overhead: Duration,
    #[serde(with = "humantime_serde_compat")]
    pub prefill_token: Duration,
    /// Per million (prompt token, attended token) pairs: a duration per pair would round the
    /// picoseconds a GPU spends on one to zero.
    #[serde(default, with = "humantime_serde_compat")]
    pub prefill_attention_per_million_pairs: Duration,
    #[serde(with = "humantime_serde_compat")]
    pub decode_seq: Duration,
    #[serde(with = "humantime_serde_compat")]
    pub context_token: Duration,
}

impl CostModel {
    /// A model whose every step takes no time: the upstream for measuring a proxy's own overhead.
    pub const ZERO: CostModel = CostModel {
        overhead: Duration::ZERO,
        prefill_token: Duration::ZERO,
        prefill_attention_per_million_pairs: Duration::ZERO,
        decode_seq: Duration::ZERO,
        context_token: Duration::ZERO,
    };

    pub fn step_time(&self, shape: &StepShape) -> Duration {
        if shape.is_empty() {
            return Duration::ZERO;
        }
        let nanos = self.overhead.as_nanos()
            + self.prefill_token.as_nanos() * u128::from(shape.prefill_tokens)
            + self.prefill_attention_per_million_pairs.as_nanos() * u128::from(shape.prefill_pairs)
                / 1_000_000
            + self.decode_seq.as_nanos() * u128::from(shape.decode_seqs)
            + self.context_token.as_nanos() * u128::from(shape.decode_context_tokens);
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

/// vLLM's API server: one process that tokenizes every prompt, then detokenizes and writes every
/// token of every stream, one after another. `per_request` is paid before a request reaches the
/// scheduler, `per_output_token` for each token a step produces. The work is serial: while the
/// server is busy, new requests wait in front of the scheduler, where `num_requests_waiting` does not
/// count them and the GPU has nothing to do.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FrontendCost {
    #[serde(with = "humantime_serde_compat")]
    pub per_request: Duration,
    #[serde(with = "humantime_serde_compat")]
    pub per_output_token: Duration,
}

impl FrontendCost {
    /// A server that costs nothing: requests reach the scheduler the moment they arrive.
    pub const ZERO: FrontendCost = FrontendCost {
        per_request: Duration::ZERO,
        per_output_token: Duration::ZERO,
    };

    pub fn is_zero(&self) -> bool {
        self.per_request.is_zero() && self.per_output_token.is_zero()
    }
}

/// The schema of a cost-model file.
pub const COST_FILE_SCHEMA: &str = "spillway-cost-model/1";

/// A cost model in a file (`spillway engine fit` writes one; `spillway engine --cost-model` and
/// `spillway plan --simulate --cost-model` read it): JSON, durations as humantime strings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostFile {
    /// [`COST_FILE_SCHEMA`]; another version is refused rather than misread.
    pub schema: String,
    /// Where the numbers came from, for the reader.
    #[serde(default)]
    pub source: String,
    pub cost: CostModel,
    #[serde(default = "no_frontend")]
    pub frontend: FrontendCost,
    /// How well the fit explained its measurement, when the file came from one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fit: Option<FitNote>,
}

fn no_frontend() -> FrontendCost {
    FrontendCost::ZERO
}

/// A fit's summary as the file keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FitNote {
    pub ttft_requests: usize,
    pub itl_requests: usize,
    pub ttft_rms_relative_error: f64,
    pub itl_rms_relative_error: f64,
    /// The measured engine's step budget the fit assumed.
    pub max_num_batched_tokens: u32,
    #[serde(default)]
    pub notes: Vec<String>,
}

impl CostFile {
    pub fn from_json(text: &str) -> Result<CostFile, crate::EngineError> {
        let bad = |m: String| crate::EngineError::Invalid(m);
        // The version first, so that another one is named as such rather than as a field it lacks.
        #[derive(Deserialize)]
        struct Versioned {
            schema: String,
        }
        let v: Versioned =
            serde_json::from_str(text).map_err(|e| bad(format!("not a cost-model file: {e}")))?;
        if v.schema != COST_FILE_SCHEMA {
            return Err(bad(format!(
                "cost-model schema '{}' is not {COST_FILE_SCHEMA}",
                v.schema
            )));
        }
        serde_json::from_str(text).map_err(|e| bad(format!("not a cost-model file: {e}")))
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
    }
}

mod humantime_serde_compat {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub(crate) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_time_adds_the_four_terms() {
        let m = CostModel {
            overhead: Duration::from_millis(4),
            prefill_token: Duration::from_micros(10),
            prefill_attention_per_million_pairs: Duration::from_micros(300),
            decode_seq: Duration::from_micros(20),
            context_token: Duration::from_nanos(5),
        };
        let shape = StepShape {
            prefill_tokens: 100,
            prefill_pairs: 5050,
            decode_seqs: 10,
            decode_context_tokens: 2000,
        };
        // 5,050 pairs at 300 µs per million: 1,515 ns.
        assert_eq!(
            m.step_time(&shape),
            Duration::from_nanos(4_000_000 + 1_000_000 + 1_515 + 200_000 + 10_000)
        );
        assert_eq!(m.step_time(&StepShape::default()), Duration::ZERO);
    }

    #[test]
    fn a_cost_file_round_trips_and_refuses_another_schema() {
        let file = CostFile {
            schema: COST_FILE_SCHEMA.into(),
            source: "test".into(),
            cost: CostModel {
                overhead: Duration::from_micros(4400),
                prefill_token: Duration::from_nanos(28_123),
                prefill_attention_per_million_pairs: Duration::from_micros(1500),
                decode_seq: Duration::from_nanos(14_000),
                context_token: Duration::from_nanos(10),
            },
            frontend: FrontendCost {
                per_request: Duration::from_micros(300),
                per_output_token: Duration::ZERO,
            },
            fit: None,
        };
        let text = file.to_json();
        assert_eq!(CostFile::from_json(&text).unwrap(), file);
        let other = text.replace("spillway-cost-model/1", "spillway-cost-model/2");
        assert!(CostFile::from_json(&other).is_err());
        assert!(CostFile::from_json(&text.replace("\"overhead\"", "\"overheads\"")).is_err());
    }

    #[test]
    fn a_file_without_the_attention_term_still_reads() {
        let m: CostModel = serde_json::from_str(
            r#"{"overhead":"4ms","prefill_token":"28us","decode_seq":"14us","context_token":"10ns"}"#,
        )
        .unwrap();
        assert_eq!(m.prefill_attention_per_million_pairs, Duration::ZERO);
        assert_eq!(m.prefill_token, Duration::from_micros(28));
    }
}
