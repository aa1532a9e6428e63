//! The plan's units and roundings: numbers and durations as a person writes them, seconds in the
//! JSON, and the floors and ceilings that keep decimal products whole.

use std::time::Duration;

use serde::Serializer;

pub(crate) fn secs<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

pub(crate) fn opt_secs<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_some(&d.as_secs_f64()),
        None => s.serialize_none(),
    }
}

/// A number as a person writes it: `24`, `0.8`, `6.25`.
pub fn num(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round())
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    }
}

/// A duration as a person writes it: `2s`, `1.5s`, `450ms`.
pub fn dur(d: Duration) -> String {
    if d >= Duration::from_secs(1) {
        format!("{}s", num(d.as_secs_f64()))
    } else {
        format!("{}ms", num((d.as_secs_f64() * 1e4).round() / 10.0))
    }
}

/// Budgets are rounded up to 100 ms below ten seconds and to whole seconds above.
pub fn round_up(d: Duration) -> Duration {
    let step: u128 = if d <= Duration::from_secs(10) { 100 } else { 1000 };
    let ms = d.as_nanos().div_ceil(1_000_000);
    Duration::from_millis(ms.div_ceil(step).saturating_mul(step) as u64)
}

/// Little's law: requests in the system = the rate served × the time each spends there. An open
/// loop gives the rate served, not the rate offered, and a closed loop's C over its latency the same.
pub fn littles_law(throughput_rps: f64, time_in_system: Duration) -> f64 {
    throughput_rps * time_in_system.as_secs_f64()
}

// Products of decimal inputs land a hair off the integer (0.29 × 100 = 28.999…): round that away.
pub(crate) fn floor(v: f64) -> u32 {
    (v + 1e-9).floor().max(0.0) as u32
}

pub(crate) fn ceil(v: f64) -> u32 {
    (v - 1e-9).ceil().max(0.0) as u32
}
