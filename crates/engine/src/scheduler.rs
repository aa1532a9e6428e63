//! The continuous-batching scheduler, as vLLM V1 runs it: decodes first, then chunked prefills fill
//! the token budget; preemption by recompute when KV blocks run out.
//!
//! Pure logic over the clock values it is given: the engine loop calls [`Scheduler::schedule`],
//! waits out the step's cost, then calls [`Scheduler::complete`].

use crate::cost::StepShape;
use crate::kv::{BlockId, BlockPool};
use std::collections::VecDeque;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Why a sequence ended, with vLLM's `finished_reason` label values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    Stop,
    Length,
    Abort,
    /// The engine failed under the sequence (a crash); the client sees its stream cut.
    Error,
}

impl FinishReason {
    pub const ALL: [FinishReason; 4] = [Self::Stop, Self::Length, Self::Abort, Self::Error];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Abort => "abort",
            Self::Error => "error",
        }
    }
}

/// What a client's stream reads: tokens generated so far and, at the end, why it ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    pub tokens: u32,
    pub finish: Option<FinishReason>,
}

/// The ground truth about one finished (or aborted) sequence, for tests and the bench's accuracy check.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestRecord {
    pub id: u64,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    pub finish: FinishReason,
    pub arrival: Instant,
    /// Arrival to first scheduling (the engine's own queue).
    pub queue: Duration,
    /// First scheduling to first token.
    pub prefill: Option<Duration>,
    /// First token to the end.
    pub decode: Option<Duration>,
    pub ttft: Option<Duration>,
    pub e2e: Duration,
    pub prompt_tokens_cached: u32,
    pub preemptions: u32,
}

/// A sequence as submitted: its prompt (as block hashes for the prefix cache) and how it will end.
#[derive(Debug)]
pub struct SeqSpec {
    pub prompt_len: u32,
    pub prompt_hashes: Vec<u64>,
    pub target_tokens: u32,
    /// The reason reported when `target_tokens` is reached (`length` for `max_tokens`, `stop` for a
    /// sampled end of sequence).
    pub reason_at_target: FinishReason,
    /// Stop producing tokens (but keep the slot and the KV) once this many were produced.
    pub stall_at: Option<u32>,
}

#[derive(Debug)]
pub(crate) struct Seq {
    id: u64,
    spec: SeqSpec,
    output: u32,
    computed: u32,
    blocks: Vec<BlockId>,
    /// Blocks of the prompt already registered in the prefix cache.
    registered: usize,
    scheduled: u32,
    cached_tokens: u32,
    arrival: Instant,
    first_scheduled: Option<Instant>,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    preemptions: u32,
    tx: watch::Sender<Progress>,
}

impl Seq {
    fn num_tokens(&self) -> u32 {
        self.spec.prompt_len + self.output
    }

    fn stalled(&self) -> bool {
        self.spec.stall_at.is_some_and(|k| self.output >= k)
    }
}

/// vLLM's scheduling knobs.
#[derive(Debug, Clone, Copy)]
pub struct SchedulerLimits {
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: u32,
    pub block_size: usize,
    pub enable_prefix_caching: bool,
}

/// What a step produced, for the engine to turn into metrics and stream updates.
#[derive(Debug, Default)]
pub(crate) struct StepOutcome {
    /// For each token emitted: the gap since the sequence's previous token, or `None` for a first
    /// token (whose TTFT is in `first_tokens`).
    pub(crate) itl: Vec<Duration>,
    pub(crate) first_tokens: Vec<Duration>,
    pub(crate) new_prompt_tokens: u64,
    pub(crate) generated: u64,
    pub(crate) finished: Vec<RequestRecord>,
}

impl StepOutcome {
    pub(crate) fn clear(&mut self) {
        self.itl.clear();
        self.first_tokens.clear();
        self.new_prompt_tokens = 0;
        self.generated = 0;
        self.finished.clear();
    }
}

/// Counters the engine reads after each step.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct StepCounters {
    pub(crate) preemptions: u64,
    pub(crate) prefix_queries: u64,
    pub(crate) prefix_hits: u64,
}

#[derive(Debug)]
pub(crate) struct Scheduler {
    limits: SchedulerLimits,
    pub(crate) kv: BlockPool,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    pub(crate) counters: StepCounters,
}

impl Scheduler {
    pub(crate) fn new(limits: SchedulerLimits, num_blocks: usize) -> Self {
        Self {
            limits,
            kv: BlockPool::new(num_blocks),
            waiting: VecDeque::new(),
            running: Vec::new(),
            counters: StepCounters::default(),
        }
    }

    pub(crate) fn num_running(&self) -> usize {
        self.running.len()
    }

    pub(crate) fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub(crate) fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    pub(crate) fn add(&mut self, id: u64, spec: SeqSpec, now: Instant) -> watch::Receiver<Progress> {
        let (tx, rx) = watch::channel(Progress::default());
        self.waiting.push_back(Seq {
            id,
            spec,
            output: 0,
            computed: 0,
            blocks: Vec::new(),
            registered: 0,
            scheduled: 0,
            cached_tokens: 0,
            arrival: now,
            first_scheduled: None,
            first_token: None,
            last_token: None,
            preemptions: 0,
            tx,
        });
        rx
    }

    /// Drops every sequence whose client went away, freeing its blocks (vLLM's abort).
    pub(crate) fn reap_aborted(&mut self, now: Instant, out: &mut StepOutcome) {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].tx.is_closed() {
                let seq = self.running.remove(i);
                self.finish(seq, FinishReason::Abort, now, out);
            } else {
                i += 1;
            }
        }
        let mut i = 0;
        while i < self.waiting.len() {
            if self.waiting[i].tx.is_closed() {
                if let Some(seq) = self.waiting.remove(i) {
                    self.finish(seq, FinishReason::Abort, now, out);
                }
            } else {
                i += 1;
            }
        }
    }

    /// Ends every sequence at once (a crash): clients see their streams end with an error.
    pub(crate) fn fail_all(&mut self, now: Instant, out: &mut StepOutcome) {
        let seqs: Vec<Seq> = self.running.drain(..).chain(self.waiting.drain(..)).collect();
        for seq in seqs {
            self.finish(seq, FinishReason::Error, now, out);
        }
    }

    /// Plans one step and returns its shape; an empty shape means there is nothing to run now.
    pub(crate) fn schedule(&mut self, now: Instant) -> StepShape {
        let mut budget = self.limits.max_num_batched_tokens;
        let mut shape = StepShape::default();
        let mut preempted = false;
        let bs = self.limits.block_size;

        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let seq = &self.running[i];
            if seq.stalled() {
                self.running[i].scheduled = 0;
                i += 1;
                continue;
            }
            let new = (seq.num_tokens() - seq.computed).min(budget);
            let need = (seq.computed + new).div_ceil(bs as u32) as usize;
            let mut scheduled_self = true;
            while need > self.running[i].blocks.len() + self.kv.num_free() {
                // Preempt the most recently admitted sequence; if that is this one, it waits.
                let Some(mut victim) = self.running.pop() else {
                    break;
                };
                self.preempt(&mut victim);
                preempted = true;
                let was_self = self.running.len() == i;
                self.waiting.push_front(victim);
                if was_self {
                    scheduled_self = false;
                    break;
                }
            }
            if !scheduled_self {
                break;
            }
            let seq = &mut self.running[i];
            let extra = need.saturating_sub(seq.blocks.len());
            let ok = self.kv.allocate(extra, &mut seq.blocks);
            debug_assert!(ok, "blocks were counted free");
            seq.scheduled = new;
            budget -= new;
            account(&mut shape, seq, new);
            i += 1;
        }
        for seq in &mut self.running[i..] {
            seq.scheduled = 0;
        }

        while !preempted
            && budget > 0
            && self.running.len() < self.limits.max_num_seqs
            && !self.waiting.is_empty()
        {
            let Some(seq) = self.waiting.front_mut() else {
                break;
            };
            let mut acquired = Vec::new();
            let mut hits = 0u32;
            if self.limits.enable_prefix_caching && seq.computed == 0 && seq.blocks.is_empty() {
                let n = self.kv.acquire_prefix(&seq.spec.prompt_hashes, &mut acquired);
                // As vLLM does, always recompute the last token so that there is something to sample.
                hits = ((n * bs) as u32).min(seq.num_tokens() - 1);
                self.counters.prefix_queries += u64::from(seq.spec.prompt_len);
                self.counters.prefix_hits += u64::from(hits);
            }
            let new = (seq.num_tokens() - hits).min(budget);
            let need = (hits + new).div_ceil(bs as u32) as usize;
            let extra = need.saturating_sub(acquired.len());
            if extra > self.kv.num_free() {
                self.kv.release(&mut acquired);
                break;
            }
            let Some(mut seq) = self.waiting.pop_front() else {
                break;
            };
            seq.blocks = acquired;
            let ok = self.kv.allocate(extra, &mut seq.blocks);
            debug_assert!(ok, "blocks were counted free");
            seq.computed = hits;
            seq.registered = seq.registered.max(hits as usize / bs);
            if seq.first_scheduled.is_none() {
                seq.first_scheduled = Some(now);
                seq.cached_tokens = hits;
            }
            seq.scheduled = new;
            budget -= new;
            account(&mut shape, &seq, new);
            self.running.push(seq);
        }
        shape
    }

    fn preempt(&mut self, seq: &mut Seq) {
        self.kv.release(&mut seq.blocks);
        seq.computed = 0;
        seq.scheduled = 0;
        seq.registered = 0;
        seq.preemptions += 1;
        self.counters.preemptions += 1;
    }

    /// Applies the planned step at `now`: computed tokens advance, sequences that finished their
    /// prompt sample a token, and finished sequences leave.
    pub(crate) fn complete(&mut self, now: Instant, out: &mut StepOutcome) {
        let bs = self.limits.block_size;
        let mut i = 0;
        while i < self.running.len() {
            let seq = &mut self.running[i];
            if seq.scheduled == 0 {
                i += 1;
                continue;
            }
            seq.computed += seq.scheduled;
            seq.scheduled = 0;
            if self.limits.enable_prefix_caching {
                let full = (seq.computed.min(seq.spec.prompt_len) as usize) / bs;
                for b in seq.registered..full.min(seq.spec.prompt_hashes.len()) {
                    self.kv.register(seq.blocks[b], seq.spec.prompt_hashes[b]);
                }
                seq.registered = seq.registered.max(full);
            }
            if seq.computed < seq.num_tokens() || seq.stalled() {
                i += 1;
                continue;
            }
            seq.output += 1;
            out.generated += 1;
            match seq.last_token {
                None => {
                    out.first_tokens.push(now - seq.arrival);
                    out.new_prompt_tokens += u64::from(seq.spec.prompt_len);
                    seq.first_token = Some(now);
                }
                Some(prev) => out.itl.push(now - prev),
            }
            seq.last_token = Some(now);
            let tokens = seq.output;
            if tokens >= seq.spec.target_tokens {
                let reason = seq.spec.reason_at_target;
                let seq = self.running.remove(i);
                self.finish(seq, reason, now, out);
            } else {
                seq.tx.send_modify(|p| p.tokens = tokens);
                i += 1;
            }
        }
    }

    fn finish(&mut self, mut seq: Seq, reason: FinishReason, now: Instant, out: &mut StepOutcome) {
        self.kv.release(&mut seq.blocks);
        let tokens = seq.output;
        seq.tx.send_modify(|p| {
            p.tokens = tokens;
            p.finish = Some(reason);
        });
        let queue = seq.first_scheduled.unwrap_or(now) - seq.arrival;
        out.finished.push(RequestRecord {
            id: seq.id,
            prompt_tokens: seq.spec.prompt_len,
            output_tokens: seq.output,
            finish: reason,
            arrival: seq.arrival,
            queue,
            prefill: seq.first_scheduled.zip(seq.first_token).map(|(s, f)| f - s),
            decode: seq.first_token.map(|f| now - f),
            ttft: seq.first_token.map(|f| f - seq.arrival),
            e2e: now - seq.arrival,
            prompt_tokens_cached: seq.cached_tokens,
            preemptions: seq.preemptions,
        });
    }
}

fn account(shape: &mut StepShape, seq: &Seq, new: u32) {
    if new == 0 {
        return;
    }
    if new == 1 && seq.computed >= seq.spec.prompt_len {
        shape.decode_seqs += 1;
        shape.decode_context_tokens += u64::from(seq.computed + 1);
    } else {
        shape.prefill_tokens += new;
        // Positions computed+1 ..= computed+new, each attending to everything up to itself.
        let (before, new) = (u64::from(seq.computed), u64::from(new));
        shape.prefill_pairs += new * before + new * (new + 1) / 2;
    }
}

#[cfg(test)]
mod tests;
