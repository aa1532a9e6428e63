//! Turning prompt text into token ids: a real `tokenizer.json`, or a documented estimate without one.
//!
//! Shared by the engine (which schedules by token) and the gateway (which caps input tokens), so
//! that both count the same prompt the same way.

use std::borrow::Cow;
use std::path::Path;

/// How prompts are counted and hashed for the prefix cache.
pub enum Tokenizer {
    /// A Hugging Face `tokenizer.json`, as the served model would use.
    Hf(Box<tokenizers::Tokenizer>),
    /// One token per 4 bytes of UTF-8 (rounded up, never splitting a character), OpenAI's rule of
    /// thumb for English; ids are hashes of the 4-byte pieces, so equal prefixes get equal ids.
    Estimate,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Tokenizer::Hf(_) => "Tokenizer::Hf",
            Tokenizer::Estimate => "Tokenizer::Estimate",
        })
    }
}

/// A `tokenizer.json` that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("cannot load tokenizer {path}: {reason}")]
pub struct LoadError {
    pub path: std::path::PathBuf,
    pub reason: String,
}

impl Tokenizer {
    pub fn from_file(path: &Path) -> Result<Self, LoadError> {
        tokenizers::Tokenizer::from_file(path)
            .map(|t| Tokenizer::Hf(Box::new(t)))
            .map_err(|e| LoadError {
                path: path.to_owned(),
                reason: e.to_string(),
            })
    }

    pub fn encode(&self, text: &str) -> Vec<u32> {
        match self {
            Tokenizer::Hf(t) => t
                .encode_fast(text, false)
                .map(|e| e.get_ids().to_vec())
                // A tokenizer that cannot encode the text still must not lose the request.
                .unwrap_or_else(|_| estimate(text)),
            Tokenizer::Estimate => estimate(text),
        }
    }

    /// `encode(text).len()`, without the ids where they are not needed: the gateway counts every
    /// prompt on its request path, and the estimate's ids cost a hash per byte.
    pub fn count(&self, text: &str) -> usize {
        match self {
            Tokenizer::Hf(_) => self.encode(text).len(),
            Tokenizer::Estimate => pieces(text).count(),
        }
    }
}

/// The ends of the estimate's pieces: 4 bytes each, never splitting a character.
fn pieces(text: &str) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= text.len() {
            return None;
        }
        let mut end = (start + 4).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        let piece = (start, end);
        start = end;
        Some(piece)
    })
}

fn estimate(text: &str) -> Vec<u32> {
    let mut ids = Vec::with_capacity(text.len() / 4 + 1);
    for (start, end) in pieces(text) {
        let mut h: u32 = 0x811c_9dc5;
        for b in &text.as_bytes()[start..end] {
            h ^= u32::from(*b);
            h = h.wrapping_mul(0x0100_0193);
        }
        ids.push(h % 128_000);
    }
    ids
}

/// The text a chat request is tokenized as: a fixed, documented template standing in for the
/// model's own (`<|role|>` header, content, end marker; then the assistant header).
pub fn chat_prompt<'a>(messages: impl Iterator<Item = (&'a str, Cow<'a, str>)>) -> String {
    // Room for a short conversation at once, rather than four growths of an empty string.
    let mut out = String::with_capacity(256);
    for (role, content) in messages {
        out.push_str("<|");
        out.push_str(role);
        out.push_str("|>\n");
        out.push_str(&content);
        out.push_str("<|end|>\n");
    }
    out.push_str("<|assistant|>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counting_gives_the_number_of_ids_encoding_gives() {
        let t = Tokenizer::Estimate;
        for text in [
            "",
            "a",
            "abcd",
            "abcde",
            "héllo wörld",
            "日本語のテキスト",
            "🙂🙂x",
            &"long ".repeat(999),
        ] {
            assert_eq!(t.count(text), t.encode(text).len(), "{text:?}");
        }
    }

    #[test]
    fn estimate_is_a_quarter_of_the_bytes_and_prefix_stable() {
        assert_eq!(estimate("").len(), 0);
        assert_eq!(estimate("abcd").len(), 1);
        assert_eq!(estimate("abcde").len(), 2);
        let a = estimate("the same prefix, then one ending");
        let b = estimate("the same prefix, then another");
        assert_eq!(a[..5], b[..5]);
        // Multi-byte characters are never split.
        assert_eq!(estimate("ééé").len(), 2);
    }
}
