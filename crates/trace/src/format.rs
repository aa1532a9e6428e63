//! The three formats, each read into a [`Trace`] and written from one: the gateway's access log,
//! Mooncake's JSONL and the Azure LLM inference trace CSV.

use std::collections::HashMap;
use std::io::{BufRead, Read, Write};
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{DEFAULT_BLOCK_TOKENS, MAX_HASH_IDS, MAX_LINE_BYTES, MAX_REQUESTS, Request, Trace, TraceError};

/// A trace's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The gateway's access log: one JSON object a line, with `arrival_ms`, `tokens_in`,
    /// `tokens_out`, `max_tokens`, `hash_ids` (2048-byte prompt blocks, about 512 tokens).
    AccessLog,
    /// Mooncake (FAST'25) and `vllm bench serve --dataset-name timed_trace`: `timestamp` (ms),
    /// `input_length`, `output_length`, `hash_ids` (512-token blocks unless said otherwise).
    Mooncake,
    /// Azure LLM inference traces (2023, 2024): `TIMESTAMP,ContextTokens,GeneratedTokens`.
    Azure,
}

impl Format {
    pub const NAMES: &'static str = "access-log, mooncake or azure";

    pub fn name(self) -> &'static str {
        match self {
            Format::AccessLog => "access-log",
            Format::Mooncake => "mooncake",
            Format::Azure => "azure",
        }
    }

    /// The format of a file from its first line: a CSV header, or a JSON object whose keys say.
    pub fn sniff(first_line: &str) -> Option<Format> {
        let line = first_line.trim_start_matches('\u{feff}').trim();
        if line.starts_with('{') {
            let v: serde_json::Value = serde_json::from_str(line).ok()?;
            if v.get("input_length").is_some() {
                Some(Format::Mooncake)
            } else if v.get("tokens_in").is_some() || v.get("arrival_ms").is_some() {
                Some(Format::AccessLog)
            } else {
                None
            }
        } else if line.contains("ContextTokens") {
            Some(Format::Azure)
        } else {
            None
        }
    }
}

impl FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Format, String> {
        match s {
            "access-log" | "access_log" | "log" => Ok(Format::AccessLog),
            "mooncake" | "jsonl" => Ok(Format::Mooncake),
            "azure" | "csv" => Ok(Format::Azure),
            _ => Err(format!("format {s:?}: expected {}", Format::NAMES)),
        }
    }
}

/// Reads a whole trace; `block_tokens` is the tokens per hash id where the format does not fix it
/// (Mooncake's 512 when `None`).
pub fn read(format: Format, input: impl BufRead, block_tokens: Option<u32>) -> Result<Trace, TraceError> {
    match format {
        Format::AccessLog => read_access_log(input),
        Format::Mooncake => read_mooncake(input, block_tokens.unwrap_or(DEFAULT_BLOCK_TOKENS)),
        Format::Azure => read_azure(input),
    }
}

/// Writes `trace` in `format`.
pub fn write(trace: &Trace, format: Format, out: impl Write) -> Result<(), TraceError> {
    match format {
        Format::AccessLog => write_access_log(trace, out),
        Format::Mooncake => write_mooncake(trace, out),
        Format::Azure => write_azure(trace, out),
    }
}

/// Each line of `input` with its number, bounded in length; blank lines left out.
fn lines(input: impl BufRead) -> impl Iterator<Item = Result<(usize, String), TraceError>> {
    let mut input = input;
    let mut n = 0;
    std::iter::from_fn(move || {
        loop {
            n += 1;
            let mut buf = Vec::new();
            let read = (&mut input)
                .take(MAX_LINE_BYTES as u64 + 1)
                .read_until(b'\n', &mut buf);
            match read {
                Err(e) => return Some(Err(e.into())),
                Ok(0) => return None,
                Ok(_) if buf.len() > MAX_LINE_BYTES => return Some(Err(TraceError::LineTooLong { line: n })),
                Ok(_) => {}
            }
            let text = match String::from_utf8(buf) {
                Ok(t) => t,
                Err(_) => {
                    return Some(Err(TraceError::Line {
                        line: n,
                        detail: "not UTF-8".into(),
                    }));
                }
            };
            if !text.trim().is_empty() {
                return Some(Ok((n, text)));
            }
        }
    })
}

fn bad(line: usize, detail: impl Into<String>) -> TraceError {
    TraceError::Line {
        line,
        detail: detail.into(),
    }
}

fn push(
    requests: &mut Vec<Request>,
    starts: &mut Vec<u64>,
    at_ms: u64,
    r: Request,
) -> Result<(), TraceError> {
    if requests.len() >= MAX_REQUESTS {
        return Err(TraceError::TooMany);
    }
    requests.push(r);
    starts.push(at_ms);
    Ok(())
}

fn check_ids(line: usize, ids: &[u64]) -> Result<(), TraceError> {
    if ids.len() > MAX_HASH_IDS {
        return Err(bad(
            line,
            format!("hash_ids: {} ids, over the limit of {MAX_HASH_IDS}", ids.len()),
        ));
    }
    Ok(())
}

/// The fields of an access-log line a trace needs; the others are ignored.
#[derive(Deserialize)]
struct LogLine {
    arrival_ms: Option<u64>,
    tokens_in: Option<u32>,
    tokens_out: Option<u32>,
    max_tokens: Option<u32>,
    outcome: Option<String>,
    #[serde(default)]
    hash_ids: Vec<u64>,
    model: Option<String>,
    class: Option<String>,
    priority: Option<String>,
    team: Option<String>,
}

/// Counts of lines left out, by reason, in the order first met.
#[derive(Default)]
struct Skipped(Vec<(&'static str, usize)>);

impl Skipped {
    fn add(&mut self, why: &'static str) {
        match self.0.iter_mut().find(|(w, _)| *w == why) {
            Some((_, n)) => *n += 1,
            None => self.0.push((why, 1)),
        }
    }

    fn lines(self) -> Vec<String> {
        self.0
            .into_iter()
            .map(|(why, n)| format!("{n} line{}: {why}", if n == 1 { "" } else { "s" }))
            .collect()
    }
}

/// An answer's length: what an answered request generated; what a refused or cut one asked for.
fn answer_length(l: &LogLine) -> Option<u32> {
    if l.outcome.as_deref().is_none_or(|o| o == "ok") {
        l.tokens_out.or(l.max_tokens)
    } else {
        l.max_tokens.or(l.tokens_out)
    }
}

fn read_access_log(input: impl BufRead) -> Result<Trace, TraceError> {
    let (mut requests, mut starts, mut skipped) = (Vec::new(), Vec::new(), Skipped::default());
    for line in lines(input) {
        let (n, text) = line?;
        let l: LogLine =
            serde_json::from_str(&text).map_err(|e| bad(n, format!("not an access-log line: {e}")))?;
        let Some(at) = l.arrival_ms else {
            skipped.add("no arrival_ms (written by a gateway before the access log carried it)");
            continue;
        };
        let Some(input_tokens) = l.tokens_in else {
            skipped.add("no tokens_in (refused before its prompt was counted)");
            continue;
        };
        let Some(output_tokens) = answer_length(&l) else {
            skipped.add("no answer length (refused, and it asked no max_tokens)");
            continue;
        };
        check_ids(n, &l.hash_ids)?;
        let refused = l.outcome.filter(|o| o != "ok");
        let r = Request {
            at: Duration::ZERO,
            input_tokens,
            output_tokens,
            hash_ids: l.hash_ids,
            model: l.model,
            class: l.class,
            priority: l.priority,
            team: l.team,
            refused,
        };
        push(&mut requests, &mut starts, at, r)?;
    }
    let mut t = Trace {
        start_ms: Some(0),
        block_tokens: DEFAULT_BLOCK_TOKENS,
        requests,
        skipped: skipped.lines(),
    };
    t.settle(starts);
    Ok(t)
}

/// One access-log line as [`write`] gives it: the fields [`read`] takes back, in the gateway's
/// names, so that a converted trace reads like a log.
#[derive(Serialize)]
struct LogOut<'a> {
    id: String,
    arrival_ms: u64,
    model: Option<&'a str>,
    class: Option<&'a str>,
    team: Option<&'a str>,
    priority: Option<&'a str>,
    outcome: &'a str,
    tokens_in: u32,
    tokens_out: Option<u32>,
    max_tokens: u32,
    hash_ids: &'a [u64],
}

fn write_access_log(trace: &Trace, mut out: impl Write) -> Result<(), TraceError> {
    let start = trace.start_ms.unwrap_or(0);
    for (i, r) in trace.requests.iter().enumerate() {
        let line = LogOut {
            id: format!("trace-{i}"),
            arrival_ms: start + r.at.as_millis() as u64,
            model: r.model.as_deref(),
            class: r.class.as_deref(),
            team: r.team.as_deref(),
            priority: r.priority.as_deref(),
            outcome: r.refused.as_deref().unwrap_or("ok"),
            tokens_in: r.input_tokens,
            tokens_out: r.refused.is_none().then_some(r.output_tokens),
            max_tokens: r.output_tokens,
            hash_ids: &r.hash_ids,
        };
        serde_json::to_writer(&mut out, &line).map_err(|e| TraceError::Format(e.to_string()))?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

#[derive(Deserialize)]
struct MooncakeLine {
    timestamp: f64,
    input_length: u32,
    output_length: u32,
    #[serde(default)]
    hash_ids: Vec<u64>,
}

fn read_mooncake(input: impl BufRead, block_tokens: u32) -> Result<Trace, TraceError> {
    let (mut requests, mut starts) = (Vec::new(), Vec::new());
    for line in lines(input) {
        let (n, text) = line?;
        let l: MooncakeLine =
            serde_json::from_str(&text).map_err(|e| bad(n, format!("not a Mooncake trace line: {e}")))?;
        if !(l.timestamp.is_finite() && l.timestamp >= 0.0) {
            return Err(bad(
                n,
                format!("timestamp {}: must be milliseconds, 0 or more", l.timestamp),
            ));
        }
        check_ids(n, &l.hash_ids)?;
        let r = Request {
            input_tokens: l.input_length,
            output_tokens: l.output_length,
            hash_ids: l.hash_ids,
            ..Request::default()
        };
        push(&mut requests, &mut starts, l.timestamp.round() as u64, r)?;
    }
    if block_tokens == 0 {
        return Err(TraceError::Format(
            "--block-size: must be at least 1 token".into(),
        ));
    }
    let mut t = Trace {
        start_ms: None,
        block_tokens,
        requests,
        skipped: Vec::new(),
    };
    t.settle(starts);
    Ok(t)
}

/// Mooncake's ids are small integers in order of first use; a trace from the access log has
/// 53-bit hashes, renumbered so (equal stays equal, different stays different).
fn write_mooncake(trace: &Trace, mut out: impl Write) -> Result<(), TraceError> {
    let mut dense: HashMap<u64, u64> = HashMap::new();
    for r in &trace.requests {
        let ids: Vec<u64> = r
            .hash_ids
            .iter()
            .map(|h| {
                let next = dense.len() as u64;
                *dense.entry(*h).or_insert(next)
            })
            .collect();
        let line = serde_json::json!({
            "timestamp": r.at.as_millis() as u64,
            "input_length": r.input_tokens,
            "output_length": r.output_tokens,
            "hash_ids": ids,
        });
        serde_json::to_writer(&mut out, &line).map_err(|e| TraceError::Format(e.to_string()))?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

fn read_azure(input: impl BufRead) -> Result<Trace, TraceError> {
    let mut lines = lines(input);
    let (_, header) = lines.next().transpose()?.ok_or_else(|| {
        TraceError::Format("empty file: expected the header TIMESTAMP,ContextTokens,GeneratedTokens".into())
    })?;
    let names: Vec<&str> = header
        .trim_start_matches('\u{feff}')
        .trim()
        .split(',')
        .map(str::trim)
        .collect();
    let column = |want: &str| {
        names
            .iter()
            .position(|n| n.eq_ignore_ascii_case(want))
            .ok_or_else(|| {
                TraceError::Format(format!(
                    "header {:?}: no {want} column (TIMESTAMP,ContextTokens,GeneratedTokens)",
                    header.trim()
                ))
            })
    };
    let (ts, ctx, gen_) = (
        column("TIMESTAMP")?,
        column("ContextTokens")?,
        column("GeneratedTokens")?,
    );
    let (mut requests, mut starts) = (Vec::new(), Vec::new());
    for line in lines {
        let (n, text) = line?;
        let cells: Vec<&str> = text.trim().split(',').map(str::trim).collect();
        let cell = |i: usize, name: &str| {
            cells
                .get(i)
                .copied()
                .ok_or_else(|| bad(n, format!("no {name} cell")))
        };
        let at = timestamp_ms(cell(ts, "TIMESTAMP")?).map_err(|e| bad(n, format!("TIMESTAMP: {e}")))?;
        let tokens = |i: usize, name: &str| -> Result<u32, TraceError> {
            let v = cell(i, name)?;
            v.parse()
                .map_err(|_| bad(n, format!("{name} {v:?}: not a whole number of tokens")))
        };
        let r = Request {
            input_tokens: tokens(ctx, "ContextTokens")?,
            output_tokens: tokens(gen_, "GeneratedTokens")?,
            ..Request::default()
        };
        push(&mut requests, &mut starts, at, r)?;
    }
    let mut t = Trace {
        start_ms: Some(0),
        block_tokens: DEFAULT_BLOCK_TOKENS,
        requests,
        skipped: Vec::new(),
    };
    t.settle(starts);
    Ok(t)
}

fn write_azure(trace: &Trace, mut out: impl Write) -> Result<(), TraceError> {
    out.write_all(b"TIMESTAMP,ContextTokens,GeneratedTokens\n")?;
    let start = trace.start_ms.unwrap_or(0);
    for r in &trace.requests {
        let at = start + r.at.as_millis() as u64;
        writeln!(out, "{},{},{}", datetime(at), r.input_tokens, r.output_tokens)?;
    }
    Ok(())
}

/// `2023-11-16 18:15:46.6805900` (UTC, as the Azure traces write it; `T` and fewer decimals
/// accepted) in milliseconds since the Unix epoch.
pub fn timestamp_ms(s: &str) -> Result<u64, String> {
    let wrong = || format!("{s:?}: expected YYYY-MM-DD HH:MM:SS[.fraction]");
    let (date, time) = s.split_once([' ', 'T']).ok_or_else(wrong)?;
    let num = |t: &str| t.parse::<u64>().map_err(|_| wrong());
    let d: Vec<&str> = date.split('-').collect();
    let (secs, frac) = time
        .trim_end_matches('Z')
        .split_once('.')
        .unwrap_or((time.trim_end_matches('Z'), ""));
    let t: Vec<&str> = secs.split(':').collect();
    if d.len() != 3 || t.len() != 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(wrong());
    }
    let (y, m, day) = (num(d[0])?, num(d[1])?, num(d[2])?);
    let (h, min, sec) = (num(t[0])?, num(t[1])?, num(t[2])?);
    if !(1970..=9999).contains(&y)
        || !(1..=12).contains(&m)
        || !(1..=31).contains(&day)
        || h > 23
        || min > 59
        || sec > 60
    {
        return Err(wrong());
    }
    let ms = frac
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(3)
        .fold(0, |a, b| a * 10 + u64::from(b - b'0'));
    let days = days_from_civil(y as i64, m, day) as u64;
    Ok(((days * 24 + h) * 60 + min) * 60_000 + sec * 1000 + ms)
}

/// The inverse of [`timestamp_ms`], with the Azure traces' seven decimals.
pub fn datetime(ms: u64) -> String {
    let days = (ms / 86_400_000) as i64;
    let rest = ms % 86_400_000;
    let (y, m, d) = civil_from_days(days);
    let (h, min, s, milli) = (
        rest / 3_600_000,
        rest / 60_000 % 60,
        rest / 1000 % 60,
        rest % 1000,
    );
    format!("{y:04}-{m:02}-{d:02} {h:02}:{min:02}:{s:02}.{milli:03}0000")
}

// Howard Hinnant's days-from-civil and its inverse (proleptic Gregorian, days since 1970-01-01).
fn days_from_civil(y: i64, m: u64, d: u64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, u64, u64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u64;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u64;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_round_trip_through_the_calendar() {
        assert_eq!(timestamp_ms("1970-01-01 00:00:00").unwrap(), 0);
        let t = timestamp_ms("2023-11-16 18:15:46.6805900").unwrap();
        assert_eq!(t, 1_700_158_546_680);
        assert_eq!(datetime(t), "2023-11-16 18:15:46.6800000");
        assert_eq!(timestamp_ms("2024-02-29T23:59:59.5Z").unwrap() % 1000, 500);
        for ms in [0, 951_782_400_000, 1_709_251_199_999, 4_102_444_800_123] {
            assert_eq!(timestamp_ms(&datetime(ms)).unwrap(), ms);
        }
        for bad in [
            "2023-13-01 00:00:00",
            "2023-11-16",
            "yesterday",
            "2023-11-16 25:00:00",
            "2023-11-16 1:2:3.x",
        ] {
            assert!(timestamp_ms(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn formats_are_sniffed_from_the_first_line() {
        assert_eq!(
            Format::sniff("TIMESTAMP,ContextTokens,GeneratedTokens"),
            Some(Format::Azure)
        );
        assert_eq!(
            Format::sniff(r#"{"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": []}"#),
            Some(Format::Mooncake)
        );
        assert_eq!(
            Format::sniff(r#"{"id":"a","arrival_ms":1,"tokens_in":3}"#),
            Some(Format::AccessLog)
        );
        assert_eq!(Format::sniff("hello"), None);
    }

    #[test]
    fn a_line_too_long_is_refused_by_number() {
        let mut text = String::from("{\"timestamp\":0,\"input_length\":1,\"output_length\":1}\n");
        text.push_str(&"x".repeat(MAX_LINE_BYTES + 10));
        let err = read(Format::Mooncake, text.as_bytes(), None).unwrap_err();
        assert!(matches!(err, TraceError::LineTooLong { line: 2 }), "{err}");
    }
}
