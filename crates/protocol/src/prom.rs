//! Reading a Prometheus text exposition (what vLLM's, DCGM's and Spillway's `/metrics` serve).
//!
//! One parser for the workspace: [`samples`] yields every sample line (name, labels, value);
//! [`values`], [`sum`] and [`max`] are the short forms the balancer and the bench use. Histograms
//! are their `_bucket{le=…}`, `_sum` and `_count` samples, as the format defines them.

use std::borrow::Cow;

/// One sample line: `name{labels} value [timestamp]`. Labels stay as written until asked for, so
/// reading a value allocates nothing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample<'a> {
    pub name: &'a str,
    /// The text between `{` and `}`, escapes and all; empty without labels.
    pub raw_labels: &'a str,
    pub value: f64,
}

impl<'a> Sample<'a> {
    /// The labels as `(name, value)` pairs, values unescaped (`\\`, `\"`, `\n`).
    pub fn labels(&self) -> Labels<'a> {
        Labels {
            rest: self.raw_labels,
        }
    }

    /// The value of label `name`, if the sample has it.
    pub fn label(&self, name: &str) -> Option<Cow<'a, str>> {
        self.labels().find(|(n, _)| *n == name).map(|(_, v)| v)
    }
}

/// Iterator over a sample's labels; stops at the first malformed pair.
#[derive(Debug, Clone)]
pub struct Labels<'a> {
    rest: &'a str,
}

impl<'a> Iterator for Labels<'a> {
    type Item = (&'a str, Cow<'a, str>);

    fn next(&mut self) -> Option<Self::Item> {
        let s = self.rest.trim_start_matches([',', ' ', '\t']);
        let (name, after) = s.split_once('=')?;
        let after = after.trim_start().strip_prefix('"')?;
        let end = closing_quote(after)?;
        let raw = &after[..end];
        self.rest = &after[end + 1..];
        let value = if raw.contains('\\') {
            Cow::Owned(unescape(raw))
        } else {
            Cow::Borrowed(raw)
        };
        Some((name.trim(), value))
    }
}

/// The index of the quote that closes a label value starting at `s[0]`, skipping escaped ones.
fn closing_quote(s: &str) -> Option<usize> {
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return Some(i),
            _ => i += 1,
        }
    }
    None
}

fn unescape(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('n') => out.push('\n'),
                Some(other) => out.push(other),
                None => out.push('\\'),
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Parses one line; `None` for comments, blank lines and lines that are not a sample.
fn parse_line(line: &str) -> Option<Sample<'_>> {
    let line = line.trim_start();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(['{', ' ', '\t']).unwrap_or(line.len());
    let name = &line[..name_end];
    let (raw_labels, rest) = match line[name_end..].strip_prefix('{') {
        Some(inner) => {
            let close = labels_end(inner)?;
            (&inner[..close], &inner[close + 1..])
        }
        None => ("", &line[name_end..]),
    };
    let value = rest.split_whitespace().next()?.parse::<f64>().ok()?;
    Some(Sample {
        name,
        raw_labels,
        value,
    })
}

/// The index of the `}` that ends a label set (braces inside quoted values do not count).
fn labels_end(s: &str) -> Option<usize> {
    let bytes = s.as_bytes();
    let mut i = 0;
    let mut quoted = false;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if quoted => i += 1,
            b'"' => quoted = !quoted,
            b'}' if !quoted => return Some(i),
            _ => {}
        }
        i += 1;
    }
    None
}

/// Every sample of the exposition, in order; comments and unparsable lines are skipped.
pub fn samples(text: &str) -> impl Iterator<Item = Sample<'_>> {
    text.lines().filter_map(parse_line)
}

/// The values of every series named `name` (any labels), in order. The value is the first field
/// after the labels (which may hold spaces inside quotes); an optional timestamp after it is ignored.
pub fn values<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = f64> + 'a {
    samples(text).filter(move |s| s.name == name).map(|s| s.value)
}

/// The sum over every series named `name`; `None` when the name is absent.
pub fn sum(text: &str, name: &str) -> Option<f64> {
    values(text, name).fold(None, |acc, v| Some(acc.unwrap_or(0.0) + v))
}

/// The largest value of the series named `name`; `None` when the name is absent.
pub fn max(text: &str, name: &str) -> Option<f64> {
    values(text, name).fold(None, |acc: Option<f64>, v| Some(acc.map_or(v, |a| a.max(v))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_are_found_by_exact_name_whatever_their_labels() {
        let text = "# HELP vllm:num_requests_waiting x\n# TYPE vllm:num_requests_waiting gauge\n\
            vllm:num_requests_waiting{engine=\"0\",model_name=\"a b\"} 3.0\n\
            vllm:num_requests_waiting{engine=\"1\",model_name=\"a b\"} 2 1700000000000\n\
            vllm:num_requests_waiting_total 99\n\
            up 1\n";
        assert_eq!(sum(text, "vllm:num_requests_waiting"), Some(5.0));
        assert_eq!(max(text, "vllm:num_requests_waiting"), Some(3.0));
        assert_eq!(sum(text, "up"), Some(1.0));
        assert_eq!(sum(text, "absent"), None);
    }

    #[test]
    fn labels_are_unescaped_and_braces_in_values_do_not_end_them() {
        let text = "m{a=\"x}y\",b=\"q\\\"uo\\\\te\\n\", le=\"+Inf\"} +Inf\nh_bucket{le=\"0.5\"} 7\n";
        let all: Vec<_> = samples(text).collect();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].name, "m");
        assert!(all[0].value.is_infinite());
        let labels: Vec<_> = all[0].labels().map(|(n, v)| (n, v.into_owned())).collect();
        assert_eq!(
            labels,
            [
                ("a", "x}y".to_owned()),
                ("b", "q\"uo\\te\n".to_owned()),
                ("le", "+Inf".to_owned())
            ]
        );
        assert_eq!(all[1].label("le").as_deref(), Some("0.5"));
        assert_eq!(all[1].label("absent"), None);
    }

    #[test]
    fn nan_and_garbage_lines() {
        let text = "a NaN\nb{x=\"1\"}\nc{x=\"unterminated} 3\n  d 4\n\n";
        let all: Vec<_> = samples(text).collect();
        assert_eq!(all.len(), 2);
        assert!(all[0].value.is_nan());
        assert_eq!((all[1].name, all[1].value), ("d", 4.0));
    }
}
