//! Units of the JSON and the text: durations as seconds, numbers without empty decimals.

use std::time::Duration;

/// Serialises a duration as seconds, the unit of every time in the JSON output.
pub fn ser_secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// [`ser_secs`] for an optional duration (`null` when absent).
pub fn ser_opt_secs<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => ser_secs(d, s),
        None => s.serialize_none(),
    }
}

/// At most three decimals, and none that say nothing: `16`, `12.5`, `0.667`.
pub fn number(v: f64) -> String {
    let text = format!("{v:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}
