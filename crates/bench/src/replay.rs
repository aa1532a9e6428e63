//! A trace replayed on its timestamps (`--trace`): each request sent when the trace says, over
//! `--speed`, with a prompt built to its length whose blocks are shared exactly where the trace's
//! hash ids are, so that a prefix cache finds what it found the first time.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::SmallRng;
use serde::Serialize;
use tokio::task::JoinSet;
use tokio::time::Instant;
use trace::{Request, Trace};

use crate::load::{Driver, LevelRun, Sink};
use crate::workload::{Prompt, synthetic_text};

/// What to replay and how fast.
#[derive(Debug, Clone)]
pub struct Replay {
    pub trace: Arc<Trace>,
    /// 2 sends the trace in half its time; 0.5 stretches it to twice.
    pub speed: f64,
    /// The file it came from, for the report.
    pub file: String,
}

/// The replay as the JSON report records it.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayInfo {
    pub file: String,
    pub requests: usize,
    /// The trace's own span, before `speed`.
    pub span_seconds: f64,
    pub speed: f64,
    pub block_tokens: u32,
    /// Arrivals per second as sent (the trace's mean rate × speed).
    pub rate: f64,
}

impl Replay {
    pub fn info(&self) -> ReplayInfo {
        let span = self.trace.span().as_secs_f64() / self.speed;
        ReplayInfo {
            file: self.file.clone(),
            requests: self.trace.requests.len(),
            span_seconds: self.trace.span().as_secs_f64(),
            speed: self.speed,
            block_tokens: self.trace.block_tokens,
            rate: if span > 0.0 {
                self.trace.requests.len() as f64 / span
            } else {
                0.0
            },
        }
    }
}

/// The prompt of the `index`-th request: for each of its hash ids a block of `block_tokens`
/// words drawn from that id (equal ids, equal blocks), cut at its input length; whatever the ids
/// do not cover, words of its own. Four-byte words, one token each (see [`synthetic_text`]).
pub fn prompt(r: &Request, index: usize, block_tokens: u32, seed: u64) -> Prompt {
    let block = block_tokens.max(1);
    let mut text = String::with_capacity(r.input_tokens as usize * 4);
    let mut left = r.input_tokens.max(1);
    for id in &r.hash_ids {
        if left == 0 {
            break;
        }
        let n = left.min(block);
        let mut rng = SmallRng::seed_from_u64(seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        // The whole block is drawn, then cut: a partial last block is the start of the full one.
        let words = synthetic_text(block, &mut rng);
        push_words(&mut text, &words, n);
        left -= n;
    }
    if left > 0 {
        let mut rng = SmallRng::seed_from_u64(!seed ^ (index as u64).wrapping_mul(0xD1B5_4A32_D192_ED03));
        push_words(&mut text, &synthetic_text(left, &mut rng), left);
    }
    Prompt {
        text: text.into(),
        max_tokens: r.output_tokens.max(1),
        long: false,
        input_tokens: Some(r.input_tokens.max(1)),
    }
}

/// Appends the first `n` words of `words`, a space between blocks as between words.
fn push_words(text: &mut String, words: &str, n: u32) {
    let cut = words.split(' ').take(n as usize).map(str::len).sum::<usize>() + n as usize - 1;
    if !text.is_empty() {
        text.push(' ');
    }
    text.push_str(&words[..cut.min(words.len())]);
}

impl Driver {
    /// Sends every request of the trace at its time over `speed` from now, whatever the answers
    /// do (an open loop); at most `max_in_flight` open, the rest counted as unsent.
    pub async fn replay(&self, replay: &Replay, sink: Sink) -> LevelRun {
        sink.lock().unwrap_or_else(|e| e.into_inner()).clear();
        let level_start = Instant::now();
        let start = level_start.saturating_duration_since(self.epoch);
        let in_flight = Arc::new(AtomicUsize::new(0));
        let mut tasks = JoinSet::new();
        let mut unsent = 0u64;
        let block = replay.trace.block_tokens;
        for (i, r) in replay.trace.requests.iter().enumerate() {
            let scheduled = level_start + Duration::from_secs_f64(r.at.as_secs_f64() / replay.speed);
            tokio::time::sleep_until(scheduled).await;
            while tasks.try_join_next().is_some() {}
            if in_flight.load(Ordering::Relaxed) >= self.max_in_flight {
                unsent += 1;
                continue;
            }
            in_flight.fetch_add(1, Ordering::Relaxed);
            let prompt = prompt(r, i, block, self.seed);
            let (client, sink, in_flight) = (self.client.clone(), sink.clone(), in_flight.clone());
            tasks.spawn(async move {
                let rec = client.send(&prompt, scheduled, level_start).await;
                in_flight.fetch_sub(1, Ordering::Relaxed);
                sink.lock().unwrap_or_else(|e| e.into_inner()).push(rec);
            });
        }
        while tasks.join_next().await.is_some() {}
        let records = std::mem::take(&mut *sink.lock().unwrap_or_else(|e| e.into_inner()));
        LevelRun {
            start,
            end: self.epoch.elapsed(),
            records,
            unsent,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(input: u32, ids: &[u64]) -> Request {
        Request {
            input_tokens: input,
            output_tokens: 7,
            hash_ids: ids.to_vec(),
            ..Request::default()
        }
    }

    fn words(p: &Prompt) -> Vec<&str> {
        p.text.split(' ').collect()
    }

    #[test]
    fn prompts_share_blocks_where_the_ids_do_and_have_the_asked_length() {
        let a = prompt(&req(40, &[1, 2, 3]), 0, 16, 9);
        let b = prompt(&req(37, &[1, 2, 4]), 1, 16, 9);
        let c = prompt(&req(40, &[5, 2, 3]), 2, 16, 9);
        let (wa, wb, wc) = (words(&a), words(&b), words(&c));
        assert_eq!((wa.len(), wb.len(), wc.len()), (40, 37, 40));
        assert!(wa.iter().chain(&wb).all(|w| w.len() == 3), "four bytes a token");
        assert_eq!(wa[..32], wb[..32], "blocks 1 and 2 shared");
        assert_ne!(wa[32..37], wb[32..37], "block 3 against 4");
        assert_ne!(wa[..16], wc[..16]);
        assert_eq!(a.max_tokens, 7);
        // The ids cover less than the prompt: the rest is the request's own.
        let d = prompt(&req(50, &[1]), 3, 16, 9);
        let e = prompt(&req(50, &[1]), 4, 16, 9);
        assert_eq!(words(&d)[..16], wa[..16]);
        assert_ne!(words(&d)[16..], words(&e)[16..]);
        assert_eq!(words(&d).len(), 50);
        // No ids (an Azure trace): every prompt its own, at its length.
        let f = prompt(&req(5, &[]), 5, 16, 9);
        assert_eq!(words(&f).len(), 5);
    }
}
