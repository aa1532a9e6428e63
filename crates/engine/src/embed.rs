//! `/v1/embeddings` as vLLM serves a pooling model: each input's prompt goes through the
//! scheduler like any request's (its prefill is the cost; one step stands for the pooling), then
//! the answer holds one vector per input in OpenAI's shape. The vectors are made from the input's
//! token ids, so the same input always gets the same unit vector.

use crate::engine::{Engine, GenerateParams};
use crate::scheduler::FinishReason;
use protocol::ApiError;
use protocol::openai::{
    Embedding, EmbeddingRequest, EmbeddingResponse, EmbeddingUsage, EmbeddingVector, Prompt,
};

/// The width of a vector when the request does not ask for `dimensions`.
pub(crate) const DIMENSIONS: u32 = 32;
/// The widest vector a request may ask for.
const MAX_DIMENSIONS: u32 = 4096;

/// The inputs of a request as token ids, each checked as vLLM checks a prompt.
pub(crate) fn inputs(engine: &Engine, req: &EmbeddingRequest) -> Result<Vec<Vec<u32>>, ApiError> {
    let inputs = match &req.input {
        Prompt::Text(t) => vec![engine.tokenize(t)],
        Prompt::Texts(ts) => ts.iter().map(|t| engine.tokenize(t)).collect(),
        Prompt::Tokens(ids) => vec![ids.clone()],
        Prompt::TokenBatches(b) => b.clone(),
    };
    if inputs.is_empty() {
        return Err(ApiError::bad_request("input must not be empty", Some("input")));
    }
    match req.encoding_format.as_deref() {
        None | Some("float" | "base64") => {}
        Some(other) => {
            return Err(ApiError::bad_request(
                format!("encoding_format must be float or base64, not {other}"),
                Some("encoding_format"),
            ));
        }
    }
    if req.dimensions.is_some_and(|d| d == 0 || d > MAX_DIMENSIONS) {
        return Err(ApiError::bad_request(
            format!("dimensions must be between 1 and {MAX_DIMENSIONS}"),
            Some("dimensions"),
        ));
    }
    Ok(inputs)
}

/// Runs every input through the scheduler, all at once, and answers when the last is done.
pub(crate) async fn embed(
    engine: &Engine,
    req: &EmbeddingRequest,
    inputs: Vec<Vec<u32>>,
) -> Result<Vec<u8>, ApiError> {
    let mut generations = Vec::with_capacity(inputs.len());
    for prompt in &inputs {
        let params = GenerateParams {
            prompt: prompt.clone(),
            max_tokens: Some(1),
            n: 1,
            ignore_eos: true,
        };
        generations.push(engine.submit(params)?);
    }
    let mut prompt_tokens = 0u32;
    for g in &mut generations {
        prompt_tokens = prompt_tokens.saturating_add(g.prompt_tokens);
        for rx in &mut g.choices {
            let done = rx.wait_for(|p| p.finish.is_some()).await.map(|p| p.finish);
            if !matches!(done, Ok(Some(f)) if f != FinishReason::Error) {
                return Err(ApiError::vllm(
                    500,
                    "InternalServerError",
                    "the engine failed during pooling",
                    None,
                ));
            }
        }
    }
    let width = req.dimensions.unwrap_or(DIMENSIONS);
    let base64 = req.encoding_format.as_deref() == Some("base64");
    let data = inputs
        .iter()
        .zip(0u32..)
        .map(|(ids, index)| {
            let v = vector(ids, width);
            Embedding {
                object: "embedding".into(),
                index,
                embedding: if base64 {
                    EmbeddingVector::Base64(to_base64(&v))
                } else {
                    EmbeddingVector::Float(v)
                },
            }
        })
        .collect();
    let first = generations.first().map_or(0, |g| g.id);
    let body = EmbeddingResponse {
        id: Some(format!("embd-{first}")),
        object: "list".into(),
        created: Some(crate::clock::unix_now()),
        model: req.model.clone(),
        data,
        usage: EmbeddingUsage {
            prompt_tokens,
            total_tokens: prompt_tokens,
        },
    };
    serde_json::to_vec(&body).map_err(|e| ApiError::vllm(500, "InternalServerError", e.to_string(), None))
}

/// A unit vector of `width` numbers drawn from the token ids (FNV-1a, then a mix per dimension).
fn vector(ids: &[u32], width: u32) -> Vec<f32> {
    let seed = ids.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, id| {
        (h ^ u64::from(*id)).wrapping_mul(0x0100_0000_01b3)
    });
    let raw: Vec<f32> = (0..u64::from(width))
        .map(|i| {
            let mut x = seed ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            x ^= x >> 33;
            x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
            x ^= x >> 33;
            // The top 24 bits as a number in [-1, 1).
            (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect();
    let norm = raw
        .iter()
        .map(|x| x * x)
        .sum::<f32>()
        .sqrt()
        .max(f32::MIN_POSITIVE);
    raw.into_iter().map(|x| x / norm).collect()
}

/// The vector's little-endian f32 bytes in standard base64, as OpenAI and vLLM send them.
fn to_base64(v: &[f32]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (k, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if k <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_input_gets_the_same_unit_vector() {
        let a = vector(&[1, 2, 3], 32);
        assert_eq!(a, vector(&[1, 2, 3], 32));
        assert_ne!(a, vector(&[1, 2, 4], 32));
        let norm: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{norm}");
        assert_eq!(vector(&[7], 5).len(), 5);
    }

    #[test]
    fn base64_is_the_little_endian_floats() {
        // 1.0f32 is 00 00 80 3f; 2.0 is 00 00 00 40.
        assert_eq!(to_base64(&[1.0]), "AACAPw==");
        assert_eq!(to_base64(&[1.0, 2.0]), "AACAPwAAAEA=");
        assert_eq!(to_base64(&[]), "");
    }
}
