//! Request traces: "yesterday's traffic" as arrivals with their lengths and shared prefixes, read
//! from the formats operators have and written back, so that the bench can replay one and the
//! planner simulate one.
//!
//! # Layout
//! - [`Trace`], [`Request`] and [`TraceError`] (this file): the one form every format reads into;
//! - [`format`]: the three formats — the gateway's access log (JSON lines, issue 51's fields),
//!   Mooncake's JSONL (`timestamp`, `input_length`, `output_length`, `hash_ids`) and the Azure LLM
//!   inference trace CSV (`TIMESTAMP,ContextTokens,GeneratedTokens`) — each a reader and a writer;
//! - [`summary`]: arrivals per second, length distributions and prefix reuse.
//!
//! Pure functions over bytes and values: opening files is the binary's.

pub mod format;
pub mod summary;

use std::time::Duration;

pub use format::Format;
pub use summary::Summary;

/// Mooncake's block: each hash id stands for this many prompt tokens unless a trace says otherwise.
pub const DEFAULT_BLOCK_TOKENS: u32 = 512;

/// The most requests one trace holds (a busy day of one deployment); more is refused, not buffered.
pub const MAX_REQUESTS: usize = 10_000_000;

/// The most hash ids one request holds (a 2-million-token prompt in 512-token blocks).
pub const MAX_HASH_IDS: usize = 4096;

/// The longest line read (an access-log line with its hash ids is a few kilobytes).
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// One request of a trace.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Request {
    /// From the trace's first arrival.
    pub at: Duration,
    pub input_tokens: u32,
    /// The answer's length: what was generated, or, for a request that was refused, what it asked.
    pub output_tokens: u32,
    /// The prompt's blocks, in order: equal ids at the same place are a shared prefix.
    pub hash_ids: Vec<u64>,
    pub model: Option<String>,
    pub class: Option<String>,
    pub priority: Option<String>,
    pub team: Option<String>,
    /// The access log's outcome when it was not `ok` (a refusal's reason): what the original
    /// deployment did with it, kept for comparison, never used to replay.
    pub refused: Option<String>,
}

/// A trace: requests in arrival order.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// The first arrival's wall clock (ms since the Unix epoch), when the format says it.
    pub start_ms: Option<u64>,
    /// Prompt tokens per hash id.
    pub block_tokens: u32,
    pub requests: Vec<Request>,
    /// Lines left out and why (e.g. `12 lines: no tokens_in (refused before the prompt was
    /// counted)`), so that a summary can say what the trace does not hold.
    pub skipped: Vec<String>,
}

impl Trace {
    /// From the first arrival to the last.
    pub fn span(&self) -> Duration {
        self.requests.last().map_or(Duration::ZERO, |r| r.at)
    }

    /// Puts requests in arrival order (stable) and measures every time from the first.
    fn settle(&mut self, starts: Vec<u64>) {
        let mut order: Vec<(u64, Request)> = starts.into_iter().zip(self.requests.drain(..)).collect();
        order.sort_by_key(|(ms, _)| *ms);
        let first = order.first().map_or(0, |(ms, _)| *ms);
        self.requests = order
            .into_iter()
            .map(|(ms, mut r)| {
                r.at = Duration::from_millis(ms - first);
                r
            })
            .collect();
        if self.start_ms.is_some() {
            self.start_ms = Some(first);
        }
    }
}

/// Why a trace could not be read or written: each names the line and the field.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("line {line}: {detail}")]
    Line { line: usize, detail: String },
    #[error("line {line}: longer than {MAX_LINE_BYTES} bytes")]
    LineTooLong { line: usize },
    #[error("more than {MAX_REQUESTS} requests: cut the trace into pieces")]
    TooMany,
    #[error("{0}")]
    Format(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}
