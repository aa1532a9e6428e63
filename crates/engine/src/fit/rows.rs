//! The regression's rows: each request's equation, its terms read from the requests around it.

use super::{FitOptions, Residual, Sample, TERMS};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Ttft,
    Itl,
}

/// `y ≈ x · θ`, θ in the order of [`TERMS`], seconds.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) kind: Kind,
    pub(crate) x: [f64; TERMS.len()],
    pub(crate) y: f64,
    pub(crate) prompt: u32,
    pub(crate) level: String,
}

impl Row {
    pub(crate) fn predict(&self, theta: &[f64; TERMS.len()]) -> f64 {
        self.x.iter().zip(theta).map(|(x, t)| x * t).sum()
    }
}

/// (prompt token, attended token) pairs of a whole prompt's prefill.
pub(crate) fn pairs(prompt: u32) -> f64 {
    let p = f64::from(prompt);
    p * (p + 1.0) / 2.0
}

/// A request on the run's clock: when it was sent, its first token, its end, and the middle of
/// each gap between its tokens (one engine step each).
struct Span {
    sent: f64,
    first: f64,
    end: f64,
    prompt: u32,
    output: u32,
    mids: Vec<f64>,
    /// `sums[g]`: the sum of the first g middles.
    sums: Vec<f64>,
}

impl Span {
    fn of(s: &Sample) -> Span {
        let first = s.sent + s.ttft;
        let mut t = first;
        let mut mids = Vec::with_capacity(s.itl.len());
        let mut sums = vec![0.0];
        for gap in &s.itl {
            mids.push(t + gap / 2.0);
            sums.push(sums[sums.len() - 1] + t + gap / 2.0);
            t += gap;
        }
        Span {
            sent: s.sent,
            first,
            end: s.sent + s.e2e,
            prompt: s.prompt,
            output: s.output,
            mids,
            sums,
        }
    }

    /// Tokens of context it attends, summed over `count` moments of its decode whose times add up
    /// to `times`: its prompt and what it has written, which grows one token a step.
    fn context_over(&self, count: f64, times: f64) -> f64 {
        let rate = f64::from(self.output.saturating_sub(1)) / (self.end - self.first);
        count * (f64::from(self.prompt) + 1.0) + rate * (times - count * self.first)
    }
}

/// Requests whose tokens came in one burst: their mean gap under a twentieth of their level's median.
/// An API server slower than its engine writes several steps' tokens at once (vLLM on a CPU with
/// a tiny model does), and then neither the first token nor the gaps time a step.
pub(crate) fn bursts(samples: &[Sample]) -> Vec<bool> {
    let mean = |s: &Sample| s.itl.iter().sum::<f64>() / s.itl.len().max(1) as f64;
    let mut by_level: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for s in samples.iter().filter(|s| !s.itl.is_empty()) {
        by_level.entry(&s.level).or_default().push(mean(s));
    }
    let medians: BTreeMap<&str, f64> = by_level
        .into_iter()
        .map(|(level, mut v)| {
            v.sort_by(f64::total_cmp);
            (level, v[v.len() / 2])
        })
        .collect();
    samples
        .iter()
        .map(|s| !s.itl.is_empty() && mean(s) < 0.05 * medians.get(s.level.as_str()).copied().unwrap_or(0.0))
        .collect()
}

pub(crate) fn build(samples: &[Sample], options: FitOptions) -> Vec<Row> {
    let spans: Vec<Span> = samples.iter().map(Span::of).collect();
    let budget = f64::from(options.max_num_batched_tokens.max(1));
    let burst = bursts(samples);
    let mut rows = Vec::new();
    for (i, (s, me)) in samples.iter().zip(&spans).enumerate() {
        if burst[i] {
            continue;
        }
        let alone = spans
            .iter()
            .enumerate()
            .all(|(j, o)| j == i || o.end <= me.sent || o.sent >= me.first);
        if alone && s.ttft > 0.0 {
            let steps = (f64::from(s.prompt) / budget).ceil().max(1.0);
            rows.push(Row {
                kind: Kind::Ttft,
                x: [steps, 1.0, f64::from(s.prompt), pairs(s.prompt), 0.0, 0.0],
                y: s.ttft,
                prompt: s.prompt,
                level: s.level.clone(),
            });
        }
        if let Some(x) = decode_terms(&spans, i) {
            rows.push(Row {
                kind: Kind::Itl,
                x,
                y: s.itl.iter().sum::<f64>() / s.itl.len() as f64,
                prompt: s.prompt,
                level: s.level.clone(),
            });
        }
    }
    rows
}

/// The terms of request `i`'s mean gap, summed over its gaps and divided by their number: per
/// gap (one step), the requests decoding at its middle and the context they attend, and the
/// prefills whose first token ended it.
fn decode_terms(spans: &[Span], i: usize) -> Option<[f64; TERMS.len()]> {
    let me = &spans[i];
    let gaps = me.mids.len();
    if gaps == 0 || me.end <= me.first {
        return None;
    }
    let (mut seqs, mut context, mut prefill, mut prefill_pairs) = (0.0, 0.0, 0.0, 0.0);
    for (j, o) in spans.iter().enumerate() {
        if o.end > o.first {
            // The gaps whose middle falls inside o's decode (its own, for j == i).
            let a = me.mids.partition_point(|&m| m <= o.first);
            let b = me.mids.partition_point(|&m| m < o.end).max(a);
            let count = (b - a) as f64;
            seqs += count;
            context += o.context_over(count, me.sums[b] - me.sums[a]);
        }
        if j != i && o.first > me.first && o.first <= me.end {
            prefill += f64::from(o.prompt);
            prefill_pairs += pairs(o.prompt);
        }
    }
    let g = gaps as f64;
    Some([1.0, 0.0, prefill / g, prefill_pairs / g, seqs / g, context / g])
}

/// The group a row is reported (and weighed) in: TTFT by prompt length (powers of two), ITL by
/// level.
fn group(r: &Row) -> (u8, u64, String) {
    match r.kind {
        Kind::Ttft => {
            let top = r.prompt.max(1).next_power_of_two();
            let name = format!("{}-{} tokens", top / 2 + 1, top);
            (0, u64::from(top), name)
        }
        Kind::Itl => (1, level_order(&r.level), r.level.clone()),
    }
}

/// Each row's group's median measurement.
pub(crate) fn group_medians(rows: &[Row]) -> Vec<f64> {
    let mut ys: BTreeMap<(u8, u64, String), Vec<f64>> = BTreeMap::new();
    for r in rows {
        ys.entry(group(r)).or_default().push(r.y);
    }
    for v in ys.values_mut() {
        v.sort_by(f64::total_cmp);
    }
    rows.iter()
        .map(|r| ys.get(&group(r)).map_or(r.y, |v| v[v.len() / 2]))
        .collect()
}

/// Measured against predicted means, by group.
pub(crate) fn residuals(rows: &[Row], theta: &[f64; TERMS.len()]) -> Vec<Residual> {
    let mut groups: BTreeMap<(u8, u64, String), (usize, f64, f64)> = BTreeMap::new();
    for r in rows {
        let key = group(r);
        let g = groups.entry(key).or_default();
        g.0 += 1;
        g.1 += r.y;
        g.2 += r.predict(theta);
    }
    groups
        .into_iter()
        .map(|((kind, _, group), (n, y, p))| Residual {
            kind: if kind == 0 { "ttft" } else { "itl" },
            group,
            requests: n,
            measured: y / n as f64,
            predicted: p / n as f64,
        })
        .collect()
}

/// `c=16` sorts after `c=8`.
fn level_order(level: &str) -> u64 {
    let digits: String = level
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    digits.parse::<f64>().map_or(u64::MAX, |v| (v * 1000.0) as u64)
}
