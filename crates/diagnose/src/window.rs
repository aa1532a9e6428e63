//! Samples at two moments and what moved between them: gauge levels, counter increases (with
//! resets), histogram quantiles computed as PromQL's `histogram_quantile` does.

use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};

/// One series' value at one moment; labels sorted by name.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Series {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Series {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Every series of every source at one moment (`at` in seconds from any fixed origin).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    pub at: f64,
    pub series: Vec<Series>,
}

impl Snapshot {
    pub fn new(at: f64) -> Self {
        Self {
            at,
            series: Vec::new(),
        }
    }

    /// Adds every sample of an exposition, each with `instance` set (as Prometheus labels a
    /// scraped target), and `up{instance} 1`.
    pub fn add_exposition(&mut self, instance: &str, text: &str) {
        for s in protocol::prom::samples(text) {
            let mut labels: Vec<(String, String)> = s
                .labels()
                .filter(|(n, _)| *n != "instance")
                .map(|(n, v)| (n.to_owned(), v.into_owned()))
                .collect();
            labels.push(("instance".into(), instance.to_owned()));
            self.push(s.name, labels, s.value);
        }
        self.push("up", vec![("instance".into(), instance.to_owned())], 1.0);
    }

    /// Records a target that did not answer: `up{instance} 0`.
    pub fn add_down(&mut self, instance: &str) {
        self.push("up", vec![("instance".into(), instance.to_owned())], 0.0);
    }

    pub fn push(&mut self, name: &str, mut labels: Vec<(String, String)>, value: f64) {
        labels.sort();
        self.series.push(Series {
            name: name.to_owned(),
            labels,
            value,
        });
    }

    /// The series `keep` accepts, at the same moment.
    pub fn filtered(&self, keep: impl Fn(&Series) -> bool) -> Snapshot {
        Snapshot {
            at: self.at,
            series: self.series.iter().filter(|s| keep(s)).cloned().collect(),
        }
    }

    pub fn has(&self, name: &str) -> bool {
        self.series.iter().any(|s| s.name == name)
    }

    pub(crate) fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Series> + 'a {
        self.series.iter().filter(move |s| s.name == name)
    }

    /// Instances whose `up` is 1.
    pub fn up_instances(&self) -> HashSet<&str> {
        self.named("up")
            .filter(|s| s.value == 1.0)
            .filter_map(|s| s.label("instance"))
            .collect()
    }
}

/// How a gauge's series combine into one level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agg {
    Sum,
    Max,
    Mean,
}

/// A gauge at the start and the end of the window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Level {
    pub start: Option<f64>,
    pub end: f64,
}

impl Level {
    /// The mean of the two ends: the window's level as far as two samples can tell.
    pub fn mean(&self) -> f64 {
        self.start.map_or(self.end, |s| (s + self.end) / 2.0)
    }

    pub fn growth(&self) -> f64 {
        self.end - self.start.unwrap_or(self.end)
    }

    pub fn peak(&self) -> f64 {
        self.start.map_or(self.end, |s| s.max(self.end))
    }
}

/// What a histogram observed inside the window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Distribution {
    /// Observations in the window.
    pub count: f64,
    /// Exact mean, from `_sum` and `_count`.
    pub mean: Option<f64>,
    pub p50: Option<f64>,
    pub p95: Option<f64>,
    pub p99: Option<f64>,
}

/// A series' identity: its name and its sorted labels.
type SeriesId<'a> = (&'a str, &'a [(String, String)]);

/// Two snapshots and the arithmetic between them.
#[derive(Debug)]
pub struct Window<'a> {
    pub start: &'a Snapshot,
    pub end: &'a Snapshot,
    before: HashMap<SeriesId<'a>, f64>,
    up_at_start: HashSet<&'a str>,
}

impl<'a> Window<'a> {
    pub fn new(start: &'a Snapshot, end: &'a Snapshot) -> Self {
        let before = start
            .series
            .iter()
            .map(|s| ((s.name.as_str(), s.labels.as_slice()), s.value))
            .collect();
        Self {
            start,
            end,
            before,
            up_at_start: start.up_instances(),
        }
    }

    pub fn secs(&self) -> f64 {
        (self.end.at - self.start.at).max(0.0)
    }

    /// The gauge's level at both ends; `None` when the end has no series of that name.
    pub fn level(&self, name: &str, agg: Agg) -> Option<Level> {
        let fold = |snap: &Snapshot| {
            let vals: Vec<f64> = snap.named(name).map(|s| s.value).collect();
            (!vals.is_empty()).then(|| match agg {
                Agg::Sum => vals.iter().sum(),
                Agg::Max => vals.iter().copied().fold(f64::MIN, f64::max),
                Agg::Mean => vals.iter().sum::<f64>() / vals.len() as f64,
            })
        };
        Some(Level {
            start: fold(self.start),
            end: fold(self.end)?,
        })
    }

    /// One counter series' increase, as PromQL's `increase` counts it without extrapolation: a
    /// drop is a reset (the process restarted) and counts the new value. A series new in the
    /// window counts from 0 if its target answered at the start; otherwise it is left out.
    fn series_increase(&self, s: &Series) -> Option<(f64, bool)> {
        match self.before.get(&(s.name.as_str(), s.labels.as_slice())) {
            Some(&b) if s.value >= b => Some((s.value - b, false)),
            Some(_) => Some((s.value, true)),
            None => match s.label("instance") {
                Some(i) if !self.up_at_start.contains(i) => None,
                _ => Some((s.value, false)),
            },
        }
    }

    /// The summed increase of the counter's series that `keep` accepts; `None` if none exists.
    pub fn increase(&self, name: &str, keep: impl Fn(&Series) -> bool) -> Option<f64> {
        let mut total = None;
        for s in self.end.named(name).filter(|s| keep(s)) {
            if let Some((inc, _)) = self.series_increase(s) {
                *total.get_or_insert(0.0) += inc;
            }
        }
        total
    }

    /// Every instance with a counter that went down or a `process_start_time_seconds` that
    /// changed: a restarted process.
    pub fn restarted_instances(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .end
            .series
            .iter()
            .filter(|s| {
                if s.name == "process_start_time_seconds" {
                    self.before
                        .get(&(s.name.as_str(), s.labels.as_slice()))
                        .is_some_and(|b| *b != s.value)
                } else {
                    (s.name.ends_with("_total") || s.name.ends_with("_count"))
                        && matches!(self.series_increase(s), Some((_, true)))
                }
            })
            .filter_map(|s| s.label("instance").map(str::to_owned))
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Instances that answered at both ends with every sample unchanged, counters included: a
    /// scrape served from a cache or a frozen process, not the present. (An idle target holds
    /// still too; the caller judges whether it claims work in hand.)
    pub fn frozen_instances(&self) -> Vec<String> {
        if self.secs() <= 0.0 {
            return Vec::new();
        }
        let mut moved: HashSet<&str> = HashSet::new();
        let mut seen: BTreeMap<&str, ()> = BTreeMap::new();
        for s in self.end.series.iter().filter(|s| s.name != "up") {
            let Some(i) = s.label("instance") else { continue };
            if !self.up_at_start.contains(i) {
                continue;
            }
            seen.insert(i, ());
            if self.before.get(&(s.name.as_str(), s.labels.as_slice())) != Some(&s.value) {
                moved.insert(i);
            }
        }
        seen.into_keys()
            .filter(|i| !moved.contains(i))
            .map(str::to_owned)
            .collect()
    }

    /// The histogram's observations in the window, all its series summed by `le`.
    pub fn distribution(&self, base: &str) -> Option<Distribution> {
        let bucket_name = format!("{base}_bucket");
        let mut by_le: BTreeMap<OrdF64, f64> = BTreeMap::new();
        let mut any = false;
        for s in self.end.named(&bucket_name) {
            let Some(le) = s.label("le").and_then(|v| v.parse::<f64>().ok()) else {
                continue;
            };
            any = true;
            if let Some((inc, _)) = self.series_increase(s) {
                *by_le.entry(OrdF64(le)).or_insert(0.0) += inc;
            }
        }
        if !any {
            return None;
        }
        let buckets: Vec<(f64, f64)> = by_le.into_iter().map(|(k, v)| (k.0, v)).collect();
        let count = self
            .increase(&format!("{base}_count"), |_| true)
            .unwrap_or_else(|| buckets.last().map_or(0.0, |b| b.1));
        let sum = self.increase(&format!("{base}_sum"), |_| true);
        let q = |q| histogram_quantile(q, &buckets);
        Some(Distribution {
            count,
            mean: sum.filter(|_| count > 0.0).map(|s| s / count),
            p50: q(0.5),
            p95: q(0.95),
            p99: q(0.99),
        })
    }
}

impl Window<'_> {
    /// Observations of the histogram in the window certainly above `bound`: those above the
    /// first bucket bound at or over it (a bucket straddling `bound` counts as within).
    pub fn observed_above(&self, base: &str, bound: f64) -> Option<f64> {
        let bucket_name = format!("{base}_bucket");
        let (mut total, mut within) = (None::<f64>, BTreeMap::<OrdF64, f64>::new());
        for s in self.end.named(&bucket_name) {
            let Some(le) = s.label("le").and_then(|v| v.parse::<f64>().ok()) else {
                continue;
            };
            let Some((inc, _)) = self.series_increase(s) else {
                continue;
            };
            if le == f64::INFINITY {
                *total.get_or_insert(0.0) += inc;
            } else if le >= bound {
                *within.entry(OrdF64(le)).or_insert(0.0) += inc;
            }
        }
        // With no finite bound at or over `bound`, nothing is certainly above it.
        total.map(|t| (t - within.into_iter().next().map_or(t, |(_, c)| c)).max(0.0))
    }
}

/// A float ordered for use as a map key (bucket bounds are never NaN once parsed).
#[derive(Debug, Clone, Copy, PartialEq)]
struct OrdF64(f64);

impl Eq for OrdF64 {}

impl PartialOrd for OrdF64 {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for OrdF64 {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// PromQL's `histogram_quantile` over cumulative `(upper bound, count)` buckets sorted by bound:
/// linear interpolation inside the bucket holding the rank, 0 as the lowest bucket's lower bound,
/// the last finite bound when the rank falls in `+Inf`; `None` where PromQL returns NaN (no
/// `+Inf` bucket, fewer than two buckets, no observations).
pub fn histogram_quantile(q: f64, buckets: &[(f64, f64)]) -> Option<f64> {
    if q.is_nan() {
        return None;
    }
    if q < 0.0 {
        return Some(f64::NEG_INFINITY);
    }
    if q > 1.0 {
        return Some(f64::INFINITY);
    }
    if buckets.len() < 2 || buckets.last().is_none_or(|b| b.0 != f64::INFINITY) {
        return None;
    }
    // PromQL repairs counts that are not monotonic (scrapes racing observations) the same way.
    let mut counts: Vec<f64> = Vec::with_capacity(buckets.len());
    for b in buckets {
        let prev = counts.last().copied().unwrap_or(0.0);
        counts.push(b.1.max(prev));
    }
    let total = *counts.last()?;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let b = counts.iter().position(|&c| c >= rank)?;
    if b == buckets.len() - 1 {
        return Some(buckets[b - 1].0);
    }
    if b == 0 && buckets[0].0 <= 0.0 {
        return Some(buckets[0].0);
    }
    let (start, prev) = if b == 0 {
        (0.0, 0.0)
    } else {
        (buckets[b - 1].0, counts[b - 1])
    };
    let end = buckets[b].0;
    let in_bucket = counts[b] - prev;
    Some(start + (end - start) * ((rank - prev) / in_bucket))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_as_promql_does() {
        let b = [(0.1, 10.0), (0.5, 30.0), (1.0, 40.0), (f64::INFINITY, 40.0)];
        // rank 20 of 40 is halfway through (0.1, 0.5].
        assert!((histogram_quantile(0.5, &b).unwrap() - 0.3).abs() < 1e-12);
        // rank 4 of 40 is 40% into [0, 0.1].
        assert!((histogram_quantile(0.1, &b).unwrap() - 0.04).abs() < 1e-12);
        let tail = [(0.1, 1.0), (1.0, 2.0), (f64::INFINITY, 10.0)];
        assert_eq!(
            histogram_quantile(0.99, &tail),
            Some(1.0),
            "rank in +Inf: last finite bound"
        );
        assert_eq!(
            histogram_quantile(0.5, &[(0.1, 1.0), (1.0, 2.0)]),
            None,
            "no +Inf bucket"
        );
        assert_eq!(histogram_quantile(0.5, &[(0.1, 0.0), (f64::INFINITY, 0.0)]), None);
        assert_eq!(histogram_quantile(1.5, &b), Some(f64::INFINITY));
        assert_eq!(histogram_quantile(-1.0, &b), Some(f64::NEG_INFINITY));
        // Non-monotonic counts are repaired upwards.
        let torn = [(0.1, 5.0), (0.5, 4.0), (f64::INFINITY, 10.0)];
        assert!((histogram_quantile(0.4, &torn).unwrap() - 0.08).abs() < 1e-12);
    }

    fn snap(at: f64, instance: &str, text: &str) -> Snapshot {
        let mut s = Snapshot::new(at);
        s.add_exposition(instance, text);
        s
    }

    #[test]
    fn counters_count_resets_and_new_series() {
        let a = snap(0.0, "e:1", "c_total{k=\"x\"} 10\n");
        let b = snap(5.0, "e:1", "c_total{k=\"x\"} 4\nc_total{k=\"y\"} 3\n");
        let w = Window::new(&a, &b);
        assert_eq!(w.secs(), 5.0);
        assert_eq!(w.increase("c_total", |_| true), Some(7.0));
        assert_eq!(w.increase("c_total", |s| s.label("k") == Some("y")), Some(3.0));
        assert_eq!(w.restarted_instances(), ["e:1"]);
        let a = snap(0.0, "e:2", "process_start_time_seconds 100\n");
        let b = snap(5.0, "e:2", "process_start_time_seconds 103\n");
        assert_eq!(Window::new(&a, &b).restarted_instances(), ["e:2"]);
        let mut down = Snapshot::new(0.0);
        down.add_down("e:1");
        let w = Window::new(&down, &b);
        assert_eq!(
            w.increase("c_total", |_| true),
            None,
            "a target down at the start counts nothing"
        );
    }

    #[test]
    fn histograms_sum_series_by_le_before_the_quantile() {
        let text = |n: u32| {
            format!(
                "h_bucket{{r=\"a\",le=\"0.1\"}} {n}\nh_bucket{{r=\"a\",le=\"+Inf\"}} {n}\n\
                 h_bucket{{r=\"b\",le=\"0.1\"}} 0\nh_bucket{{r=\"b\",le=\"+Inf\"}} {n}\n\
                 h_sum 0\nh_count {}\n",
                2 * n
            )
        };
        let a = snap(0.0, "g", &text(0));
        let b = snap(1.0, "g", &text(10));
        let d = Window::new(&a, &b).distribution("h").unwrap();
        assert_eq!(d.count, 20.0);
        assert_eq!(d.p50, Some(0.1));
        assert_eq!(d.p95, Some(0.1), "ranks in +Inf read as the last finite bound");
        assert_eq!(d.mean, Some(0.0));
        assert_eq!(Window::new(&a, &b).observed_above("h", 0.05), Some(10.0));
        assert_eq!(Window::new(&a, &b).observed_above("h", 0.1), Some(10.0));
        assert_eq!(
            Window::new(&a, &b).observed_above("h", 0.2),
            Some(0.0),
            "no bound over 0.2"
        );
        let g = Window::new(&a, &b).level("h_count", Agg::Sum).unwrap();
        assert_eq!((g.start, g.end, g.growth()), (Some(0.0), 20.0, 20.0));
    }
}
