//! What a trace holds, in a few numbers: arrivals per second, length distributions and how much
//! of the prompts a prefix cache could have reused.

use std::collections::{BTreeMap, HashSet};
use std::fmt;

use serde::Serialize;

use crate::Trace;

/// Lengths in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Lengths {
    pub mean: f64,
    pub p50: u32,
    pub p90: u32,
    pub p99: u32,
    pub max: u32,
}

impl Lengths {
    fn of(mut v: Vec<u32>) -> Option<Lengths> {
        v.sort_unstable();
        // Nearest rank: lengths are whole tokens.
        let at = |p: f64| v[((p / 100.0 * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Some(Lengths {
            mean: v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len().max(1) as f64,
            p50: at(50.0),
            p90: at(90.0),
            p99: at(99.0),
            max: *v.last()?,
        })
    }
}

/// A trace in numbers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub requests: usize,
    /// From the first arrival to the last.
    pub span_seconds: f64,
    /// Requests over the span.
    pub mean_rate: f64,
    /// The most arrivals in one second of the trace (whole seconds from the first arrival).
    pub peak_rate: usize,
    pub input: Option<Lengths>,
    pub output: Option<Lengths>,
    pub block_tokens: u32,
    /// Requests with hash ids.
    pub hashed_requests: usize,
    /// Blocks whose id an earlier request already had: what a prefix cache large enough for the
    /// whole trace would have found (a bound on the hit rate, not a prediction).
    pub reused_blocks: usize,
    pub blocks: usize,
    /// Requests whose first block an earlier request had.
    pub requests_sharing_a_prefix: usize,
    /// Requests by model, class, team and priority when the trace names them.
    pub by_model: BTreeMap<String, usize>,
    pub by_class: BTreeMap<String, usize>,
    pub by_team: BTreeMap<String, usize>,
    pub by_priority: BTreeMap<String, usize>,
    /// Requests the recorded deployment refused or cut, by its reason.
    pub refused: BTreeMap<String, usize>,
    pub skipped: Vec<String>,
}

impl Summary {
    pub fn of(t: &Trace) -> Summary {
        let span = t.span().as_secs_f64();
        let mut per_second: BTreeMap<u64, usize> = BTreeMap::new();
        let mut seen = HashSet::new();
        let (mut reused, mut blocks, mut sharing, mut hashed) = (0, 0, 0, 0);
        let mut s = Summary {
            requests: t.requests.len(),
            span_seconds: span,
            mean_rate: if span > 0.0 {
                t.requests.len() as f64 / span
            } else {
                0.0
            },
            peak_rate: 0,
            input: Lengths::of(t.requests.iter().map(|r| r.input_tokens).collect()),
            output: Lengths::of(t.requests.iter().map(|r| r.output_tokens).collect()),
            block_tokens: t.block_tokens,
            hashed_requests: 0,
            reused_blocks: 0,
            blocks: 0,
            requests_sharing_a_prefix: 0,
            by_model: BTreeMap::new(),
            by_class: BTreeMap::new(),
            by_team: BTreeMap::new(),
            by_priority: BTreeMap::new(),
            refused: BTreeMap::new(),
            skipped: t.skipped.clone(),
        };
        for r in &t.requests {
            *per_second.entry(r.at.as_secs()).or_default() += 1;
            if let Some(first) = r.hash_ids.first() {
                hashed += 1;
                sharing += usize::from(seen.contains(first));
            }
            for id in &r.hash_ids {
                blocks += 1;
                reused += usize::from(!seen.insert(*id));
            }
            for (map, key) in [
                (&mut s.by_model, &r.model),
                (&mut s.by_class, &r.class),
                (&mut s.by_team, &r.team),
                (&mut s.by_priority, &r.priority),
                (&mut s.refused, &r.refused),
            ] {
                if let Some(k) = key {
                    *map.entry(k.clone()).or_default() += 1;
                }
            }
        }
        s.peak_rate = per_second.values().copied().max().unwrap_or(0);
        (
            s.hashed_requests,
            s.reused_blocks,
            s.blocks,
            s.requests_sharing_a_prefix,
        ) = (hashed, reused, blocks, sharing);
        s
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} requests over {:.1} s: {:.2} arrivals/s on average, {} in the busiest second",
            self.requests, self.span_seconds, self.mean_rate, self.peak_rate
        )?;
        for (name, l) in [("input ", &self.input), ("output", &self.output)] {
            if let Some(l) = l {
                writeln!(
                    f,
                    "{name} tokens: mean {:.0}, p50 {}, p90 {}, p99 {}, max {}",
                    l.mean, l.p50, l.p90, l.p99, l.max
                )?;
            }
        }
        if self.blocks > 0 {
            writeln!(
                f,
                "prefix reuse: {} of {} blocks of {} tokens ({:.1}%) seen before; {} of {} requests start with a block seen before",
                self.reused_blocks,
                self.blocks,
                self.block_tokens,
                100.0 * self.reused_blocks as f64 / self.blocks as f64,
                self.requests_sharing_a_prefix,
                self.hashed_requests
            )?;
        } else {
            writeln!(f, "prefix reuse: unknown (no hash ids)")?;
        }
        for (name, map) in [
            ("model", &self.by_model),
            ("class", &self.by_class),
            ("team", &self.by_team),
            ("priority", &self.by_priority),
            ("refused or cut", &self.refused),
        ] {
            if !map.is_empty() {
                let parts: Vec<String> = map.iter().map(|(k, n)| format!("{k} {n}")).collect();
                writeln!(f, "by {name}: {}", parts.join(", "))?;
            }
        }
        for s in &self.skipped {
            writeln!(f, "left out: {s}")?;
        }
        Ok(())
    }
}
