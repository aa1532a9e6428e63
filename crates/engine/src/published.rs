//! The presets' cost models and the published points they were fitted to: the data the config and
//! the calibration both read, apart from the code that measures against it.

use crate::cost::CostModel;
use std::time::Duration;

/// Llama-3.1-8B-Instruct on one H100 (NVIDIA NIM benchmark table, DESIGN Appendix A). The table
/// does not state its lengths; 200 input / 200 output tokens is assumed because it is the only
/// common setting consistent with both its TTFT at concurrency 1 (one 200-token prefill step) and
/// its throughput at 250 (TTFT + 199 × ITL per request).
///
/// The attention term is not fitted (200-token prompts cannot show it) but counted: one
/// (token, attended token) pair is 32 layers × 32 heads × 128 dims × 2 products × 2 FLOPs
/// ≈ 0.52 MFLOP, about 1 ns at the ~500 TFLOP/s the prefill term implies (16 GFLOP per token in
/// 28 µs): an 8k-token prompt pays 35 ms for it on top of 229 ms.
pub const LLAMA31_8B_H100: CostModel = CostModel {
    overhead: Duration::from_micros(4400),
    prefill_token: Duration::from_nanos(28_000),
    prefill_attention_per_million_pairs: Duration::from_millis(1),
    decode_seq: Duration::from_nanos(14_000),
    context_token: Duration::from_nanos(10),
};

/// One published measurement: concurrency → TTFT ms, ITL ms, output tokens/s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PublishedPoint {
    pub concurrency: u32,
    pub ttft_ms: f64,
    pub itl_ms: f64,
    pub output_tok_s: f64,
}

/// NVIDIA NIM, Llama-3.1-8B-Instruct, one H100 (DESIGN Appendix A).
pub const NIM_LLAMA31_8B_H100: [PublishedPoint; 8] = [
    PublishedPoint {
        concurrency: 1,
        ttft_ms: 10.3,
        itl_ms: 4.6,
        output_tok_s: 215.0,
    },
    PublishedPoint {
        concurrency: 5,
        ttft_ms: 16.8,
        itl_ms: 4.6,
        output_tok_s: 1_077.0,
    },
    PublishedPoint {
        concurrency: 25,
        ttft_ms: 36.3,
        itl_ms: 5.2,
        output_tok_s: 4_679.0,
    },
    PublishedPoint {
        concurrency: 50,
        ttft_ms: 67.4,
        itl_ms: 5.9,
        output_tok_s: 8_018.0,
    },
    PublishedPoint {
        concurrency: 100,
        ttft_ms: 120.0,
        itl_ms: 7.6,
        output_tok_s: 12_215.0,
    },
    PublishedPoint {
        concurrency: 150,
        ttft_ms: 347.0,
        itl_ms: 9.8,
        output_tok_s: 12_989.0,
    },
    PublishedPoint {
        concurrency: 200,
        ttft_ms: 465.0,
        itl_ms: 12.7,
        output_tok_s: 13_348.0,
    },
    PublishedPoint {
        concurrency: 250,
        ttft_ms: 606.0,
        itl_ms: 16.1,
        output_tok_s: 12_965.0,
    },
];

/// The input and output lengths assumed for [`NIM_LLAMA31_8B_H100`].
pub const NIM_INPUT_TOKENS: u32 = 200;
pub const NIM_OUTPUT_TOKENS: u32 = 200;
