//! What Kubernetes and KServe say: an InferenceService's conditions and its pods' restarts, read
//! from `kubectl get … -o json`.

use crate::Error;
use serde::Serialize;
use serde_json::Value;

/// A condition of the InferenceService (`Ready`, `PredictorReady`, `IngressReady`, …).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Condition {
    pub kind: String,
    pub ready: bool,
    pub reason: Option<String>,
    pub message: Option<String>,
    /// Seconds since the Unix epoch.
    pub since: Option<f64>,
}

/// A container that restarted, and when it last stopped.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Restart {
    pub pod: String,
    pub container: String,
    pub count: u64,
    pub ready: bool,
    /// Why the last run ended (`OOMKilled`, `Error`, …).
    pub reason: Option<String>,
    /// When the last run ended, seconds since the Unix epoch.
    pub at: Option<f64>,
}

/// The cluster's side of the picture; empty when no file was given.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Cluster {
    pub service: Option<String>,
    pub conditions: Vec<Condition>,
    pub restarts: Vec<Restart>,
}

impl Cluster {
    /// Restarts whose last stop falls inside `[from, to]` (epoch seconds), with a minute of slack
    /// either side for clocks and scrape intervals.
    pub fn restarts_within(&self, from: f64, to: f64) -> impl Iterator<Item = &Restart> {
        self.restarts
            .iter()
            .filter(move |r| r.at.is_some_and(|at| at >= from - 60.0 && at <= to + 60.0))
    }

    /// Conditions that are not `True`.
    pub fn not_ready(&self) -> impl Iterator<Item = &Condition> {
        self.conditions.iter().filter(|c| !c.ready)
    }

    /// Reads `kubectl get inferenceservice NAME -o json`.
    pub fn add_inference_service(&mut self, json: &str) -> Result<(), Error> {
        let v: Value =
            serde_json::from_str(json).map_err(|e| Error::Kube(format!("InferenceService: {e}")))?;
        if v["kind"] != "InferenceService" {
            return Err(Error::Kube(format!(
                "expected kind InferenceService, got {}",
                v["kind"]
            )));
        }
        self.service = v["metadata"]["name"].as_str().map(str::to_owned);
        for c in v["status"]["conditions"].as_array().into_iter().flatten() {
            self.conditions.push(Condition {
                kind: c["type"].as_str().unwrap_or("?").to_owned(),
                ready: c["status"] == "True",
                reason: c["reason"].as_str().map(str::to_owned),
                message: c["message"].as_str().map(str::to_owned),
                since: c["lastTransitionTime"].as_str().and_then(parse_rfc3339),
            });
        }
        Ok(())
    }

    /// Reads `kubectl get pods -o json` (a `List`) or one pod.
    pub fn add_pods(&mut self, json: &str) -> Result<(), Error> {
        let v: Value = serde_json::from_str(json).map_err(|e| Error::Kube(format!("pods: {e}")))?;
        let pods: Vec<&Value> = match v["items"].as_array() {
            Some(items) => items.iter().collect(),
            None if v["kind"] == "Pod" => vec![&v],
            None => return Err(Error::Kube("expected a Pod or a List of pods".into())),
        };
        for p in pods {
            let pod = p["metadata"]["name"].as_str().unwrap_or("?");
            for cs in p["status"]["containerStatuses"].as_array().into_iter().flatten() {
                let count = cs["restartCount"].as_u64().unwrap_or(0);
                if count == 0 {
                    continue;
                }
                let last = &cs["lastState"]["terminated"];
                self.restarts.push(Restart {
                    pod: pod.to_owned(),
                    container: cs["name"].as_str().unwrap_or("?").to_owned(),
                    count,
                    ready: cs["ready"].as_bool().unwrap_or(false),
                    reason: last["reason"].as_str().map(str::to_owned),
                    at: last["finishedAt"].as_str().and_then(parse_rfc3339),
                });
            }
        }
        Ok(())
    }
}

/// `2026-12-01T03:04:05Z` (or with fractional seconds or an offset) as seconds since the epoch.
pub fn parse_rfc3339(s: &str) -> Option<f64> {
    let (date, time) = s.split_once(['T', 't', ' '])?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (clock, offset) = if let Some(c) = time.strip_suffix(['Z', 'z']) {
        (c, 0)
    } else {
        let i = time.rfind(['+', '-'])?;
        let (c, off) = time.split_at(i);
        let sign = if off.starts_with('-') { -1 } else { 1 };
        let (oh, om) = off[1..].split_once(':')?;
        (
            c,
            sign * (oh.parse::<i64>().ok()? * 3600 + om.parse::<i64>().ok()? * 60),
        )
    };
    let mut t = clock.splitn(3, ':');
    let (h, min, sec) = (
        t.next()?.parse::<i64>().ok()?,
        t.next()?.parse::<i64>().ok()?,
        t.next()?.parse::<f64>().ok()?,
    );
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + h * 3600 + min * 60 - offset) as f64 + sec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_parse() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0.0));
        assert_eq!(parse_rfc3339("2026-12-01T03:04:05Z"), Some(1_796_094_245.0));
        assert_eq!(
            parse_rfc3339("2026-12-01T04:04:05.5+01:00"),
            Some(1_796_094_245.5)
        );
        assert_eq!(parse_rfc3339("yesterday"), None);
    }
}
