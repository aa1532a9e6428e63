//! The prompts a run sends: synthetic text of a sampled length, or prompts read from a ShareGPT or
//! JSONL dataset, with an optional share of long requests mixed in.

use crate::error::BenchError;
use std::path::Path;
use std::sync::Arc;

use rand::Rng;
use serde::Serialize;

use crate::spec::LengthDist;

/// One request to send.
#[derive(Debug, Clone)]
pub struct Prompt {
    pub text: Arc<str>,
    pub max_tokens: u32,
    pub long: bool,
    /// The prompt's length as asked (synthetic prompts), to hold against the server's count.
    pub input_tokens: Option<u32>,
}

/// Short three-letter words: each `" xyz"` is four bytes, one token in common BPE vocabularies and
/// in Spillway's own 4-bytes-per-token estimate, so a prompt of N words is about N tokens anywhere.
const WORDS: [&str; 48] = [
    "the", "and", "for", "are", "but", "not", "you", "all", "any", "can", "had", "her", "was", "one", "our",
    "out", "day", "get", "has", "him", "his", "how", "man", "new", "now", "old", "see", "two", "way", "who",
    "boy", "did", "its", "let", "put", "say", "she", "too", "use", "sun", "sea", "sky", "red", "big", "top",
    "end", "run", "map",
];

/// Random words, `tokens` long: random so that no two prompts share a prefix the server could cache.
pub fn synthetic_text<R: Rng + ?Sized>(tokens: u32, rng: &mut R) -> String {
    let mut s = String::with_capacity(tokens as usize * 4);
    for i in 0..tokens {
        if i > 0 {
            s.push(' ');
        }
        s.push_str(WORDS[rng.random_range(0..WORDS.len())]);
    }
    s
}

/// Dataset prompts with their intended output lengths.
#[derive(Debug, Clone)]
pub struct Entry {
    text: Arc<str>,
    output: Option<u32>,
}

/// Where short (ordinary) requests come from.
#[derive(Debug, Clone)]
pub enum Source {
    Synthetic {
        input: LengthDist,
        output: LengthDist,
    },
    Dataset {
        entries: Arc<[Entry]>,
        output: LengthDist,
    },
    /// Each prompt is one of a few shared prefixes, then a unique suffix of `input` tokens: the
    /// traffic a system prompt or a few-shot template makes, which a prefix cache serves from memory.
    SharedPrefix {
        prefixes: Arc<[Arc<str>]>,
        prefix_tokens: u32,
        input: LengthDist,
        output: LengthDist,
    },
}

impl Source {
    /// `count` prefixes of `tokens` tokens each, drawn from `seed` so that runs repeat.
    pub fn shared_prefix(
        count: u32,
        tokens: u32,
        input: LengthDist,
        output: LengthDist,
        seed: u64,
    ) -> Source {
        use rand::SeedableRng;
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        Source::SharedPrefix {
            prefixes: (0..count.max(1))
                .map(|_| Arc::from(synthetic_text(tokens, &mut rng)))
                .collect(),
            prefix_tokens: tokens,
            input,
            output,
        }
    }
}

/// The mix of requests a level sends.
#[derive(Debug, Clone)]
pub struct Workload {
    pub source: Source,
    /// `(share, input, output)`: this share of requests are long ones of these lengths.
    pub long: Option<(f64, LengthDist, LengthDist)>,
}

/// What the JSON report says about the prompts.
#[derive(Debug, Clone, Serialize)]
pub struct WorkloadInfo {
    pub source: String,
    pub dataset_prompts: Option<usize>,
    /// Shared-prefix workloads only: how many prefixes, and their length in tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefixes: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix_tokens: Option<u32>,
}

impl Workload {
    pub fn next<R: Rng + ?Sized>(&self, rng: &mut R) -> Prompt {
        if let Some((share, input, output)) = &self.long
            && rng.random_bool(share.clamp(0.0, 1.0))
        {
            let tokens = input.sample(rng);
            return Prompt {
                text: synthetic_text(tokens, rng).into(),
                max_tokens: output.sample(rng),
                long: true,
                input_tokens: Some(tokens),
            };
        }
        match &self.source {
            Source::Synthetic { input, output } => {
                let tokens = input.sample(rng);
                Prompt {
                    text: synthetic_text(tokens, rng).into(),
                    max_tokens: output.sample(rng),
                    long: false,
                    input_tokens: Some(tokens),
                }
            }
            Source::Dataset { entries, output } => {
                let e = &entries[rng.random_range(0..entries.len())];
                Prompt {
                    text: e.text.clone(),
                    max_tokens: e.output.unwrap_or_else(|| output.sample(rng)),
                    long: false,
                    input_tokens: None,
                }
            }
            Source::SharedPrefix {
                prefixes,
                prefix_tokens,
                input,
                output,
            } => {
                let prefix = &prefixes[rng.random_range(0..prefixes.len())];
                let tokens = input.sample(rng);
                Prompt {
                    text: format!("{prefix} {}", synthetic_text(tokens, rng)).into(),
                    max_tokens: output.sample(rng),
                    long: false,
                    input_tokens: Some(prefix_tokens + tokens),
                }
            }
        }
    }

    /// The same workload with a long share, for the long-mix phase.
    pub fn with_long(&self, share: f64, input: LengthDist, output: LengthDist) -> Workload {
        Workload {
            source: self.source.clone(),
            long: Some((share, input, output)),
        }
    }

    pub fn info(&self) -> WorkloadInfo {
        match &self.source {
            Source::Synthetic { .. } => WorkloadInfo {
                source: "synthetic".into(),
                dataset_prompts: None,
                prefixes: None,
                prefix_tokens: None,
            },
            Source::Dataset { entries, .. } => WorkloadInfo {
                source: "dataset".into(),
                dataset_prompts: Some(entries.len()),
                prefixes: None,
                prefix_tokens: None,
            },
            Source::SharedPrefix {
                prefixes,
                prefix_tokens,
                ..
            } => WorkloadInfo {
                source: "shared-prefix".into(),
                dataset_prompts: None,
                prefixes: Some(prefixes.len()),
                prefix_tokens: Some(*prefix_tokens),
            },
        }
    }
}

/// Reads a ShareGPT JSON file (an array of `{"conversations":[{"from":"human","value":..},
/// {"from":"gpt","value":..}]}`; the reply's length, at four bytes a token, becomes the output length)
/// or JSONL (one `{"prompt": "..", "output_len": N}` or a bare JSON string per line).
pub fn load_dataset(path: &Path, output: LengthDist) -> Result<Source, BenchError> {
    let bad = |reason: String| BenchError::Dataset {
        path: path.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let entries = if text.trim_start().starts_with('[') {
        parse_sharegpt(&text).map_err(bad)?
    } else {
        parse_jsonl(&text).map_err(bad)?
    };
    if entries.is_empty() {
        return Err(bad("no usable prompts in the file".into()));
    }
    Ok(Source::Dataset {
        entries: entries.into(),
        output,
    })
}

fn parse_sharegpt(text: &str) -> Result<Vec<Entry>, String> {
    let items: Vec<serde_json::Value> =
        serde_json::from_str(text).map_err(|e| format!("not valid ShareGPT JSON ({e})"))?;
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let turns = item
            .get("conversations")
            .and_then(|c| c.as_array())
            .ok_or_else(|| format!("item {i}: no \"conversations\" array"))?;
        fn value(t: &serde_json::Value) -> Option<&str> {
            t.get("value").and_then(|v| v.as_str())
        }
        let Some(human) = turns
            .iter()
            .position(|t| matches!(t.get("from").and_then(|f| f.as_str()), Some("human" | "user")))
        else {
            continue;
        };
        let Some(prompt) = value(&turns[human]).filter(|p| !p.is_empty()) else {
            continue;
        };
        let reply = turns.get(human + 1).and_then(value);
        out.push(Entry {
            text: prompt.into(),
            output: reply.map(|r| (r.len() as u32).div_ceil(4).max(1)),
        });
    }
    Ok(out)
}

fn parse_jsonl(text: &str) -> Result<Vec<Entry>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("line {}: not JSON ({e})", i + 1))?;
        let (prompt, output) = match &v {
            serde_json::Value::String(s) => (s.as_str(), None),
            serde_json::Value::Object(o) => {
                let prompt = ["prompt", "text", "input"]
                    .iter()
                    .find_map(|k| o.get(*k).and_then(|p| p.as_str()))
                    .ok_or_else(|| format!("line {}: no \"prompt\" string", i + 1))?;
                let output = ["output_len", "max_tokens"]
                    .iter()
                    .find_map(|k| o.get(*k).and_then(|n| n.as_u64()))
                    .map(|n| n.clamp(1, u64::from(u32::MAX)) as u32);
                (prompt, output)
            }
            _ => {
                return Err(format!(
                    "line {}: expected a string or an object with \"prompt\"",
                    i + 1
                ));
            }
        };
        out.push(Entry {
            text: prompt.into(),
            output,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn synthetic_prompts_are_four_bytes_a_token_and_differ() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let a = synthetic_text(100, &mut rng);
        let b = synthetic_text(100, &mut rng);
        assert_eq!(a.len() + 1, 400);
        assert_ne!(a, b);
    }

    #[test]
    fn shared_prefix_prompts_share_one_of_n_prefixes_and_differ_after_it() {
        let source = Source::shared_prefix(
            3,
            64,
            LengthDist::Fixed { tokens: 16 },
            LengthDist::Fixed { tokens: 8 },
            7,
        );
        let Source::SharedPrefix { prefixes, .. } = &source else {
            unreachable!()
        };
        let w = Workload {
            source: source.clone(),
            long: None,
        };
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let prompts: Vec<Prompt> = (0..60).map(|_| w.next(&mut rng)).collect();
        let mut used = std::collections::BTreeSet::new();
        for p in &prompts {
            let i = prefixes
                .iter()
                .position(|x| p.text.starts_with(&**x))
                .expect("every prompt starts with a shared prefix");
            used.insert(i);
            assert_eq!(p.input_tokens, Some(64 + 16));
            assert_eq!(p.text.len() + 1, (64 + 16) * 4);
        }
        assert_eq!(used.len(), 3, "all prefixes are drawn");
        let suffixes: std::collections::BTreeSet<&str> = prompts.iter().map(|p| &p.text[64 * 4..]).collect();
        assert_eq!(suffixes.len(), prompts.len(), "every suffix is unique");
        let info = w.info();
        assert_eq!(
            (info.source.as_str(), info.prefixes, info.prefix_tokens),
            ("shared-prefix", Some(3), Some(64))
        );
    }

    #[test]
    fn datasets_parse_and_bad_ones_say_where() {
        let fixed = LengthDist::Fixed { tokens: 9 };
        let share = r#"[{"conversations":[{"from":"human","value":"Hi there"},{"from":"gpt","value":"Hello, how can I help?"}]},
                        {"conversations":[{"from":"gpt","value":"orphan"}]}]"#;
        let entries = parse_sharegpt(share).unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].output, Some(6));
        let jsonl = "{\"prompt\":\"a\",\"output_len\":5}\n\"b\"\n\n{\"text\":\"c\"}\n";
        let entries = parse_jsonl(jsonl).unwrap();
        assert_eq!(
            entries.iter().map(|e| e.output).collect::<Vec<_>>(),
            [Some(5), None, None]
        );
        assert!(
            parse_jsonl("{\"prompt\":\"a\"}\n{oops")
                .unwrap_err()
                .contains("line 2")
        );
        assert!(
            parse_jsonl("{\"q\":\"a\"}")
                .unwrap_err()
                .contains("no \"prompt\"")
        );
        assert!(parse_sharegpt("[{\"x\":1}]").unwrap_err().contains("item 0"));
        let missing = load_dataset(Path::new("/nonexistent/prompts.jsonl"), fixed).unwrap_err();
        assert!(
            missing.to_string().contains("/nonexistent/prompts.jsonl"),
            "{missing}"
        );
    }
}
