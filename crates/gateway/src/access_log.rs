//! One JSON line per request: where it went, how long it waited, what it cost. No prompt text.

use serde::Serialize;
use std::io::Write;
use std::sync::{Arc, Mutex};

/// What the access log says about one request.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AccessRecord {
    pub id: String,
    pub route: String,
    pub class: String,
    pub team: String,
    pub replica: Option<String>,
    pub status: u16,
    /// `ok`, or why it ended otherwise (a rejection reason, `client_disconnect`, `stream_idle_timeout`…).
    pub outcome: String,
    pub stream: bool,
    pub queue_ms: Option<f64>,
    pub ttft_ms: Option<f64>,
    pub duration_ms: f64,
    pub tokens_in: Option<u32>,
    pub tokens_out: Option<u32>,
    pub retries: u32,
}

/// Where access records go.
#[derive(Clone)]
pub struct AccessLog(Arc<dyn Fn(&AccessRecord) + Send + Sync>);

impl std::fmt::Debug for AccessLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AccessLog")
    }
}

impl AccessLog {
    /// JSON lines on standard output.
    pub fn stdout() -> AccessLog {
        let out = Mutex::new(std::io::LineWriter::new(std::io::stdout()));
        AccessLog(Arc::new(move |r| {
            if let Ok(mut line) = serde_json::to_vec(r) {
                line.push(b'\n');
                let mut out = out.lock().unwrap_or_else(|e| e.into_inner());
                let _ = out.write_all(&line);
            }
        }))
    }

    pub fn discard() -> AccessLog {
        AccessLog(Arc::new(|_| {}))
    }

    /// Records into a shared list: what tests read.
    pub fn memory() -> (AccessLog, Arc<Mutex<Vec<AccessRecord>>>) {
        let records = Arc::new(Mutex::new(Vec::new()));
        let sink = records.clone();
        (
            AccessLog(Arc::new(move |r| {
                sink.lock().unwrap_or_else(|e| e.into_inner()).push(r.clone())
            })),
            records,
        )
    }

    pub fn write(&self, record: &AccessRecord) {
        (self.0)(record);
    }
}
