//! One JSON line per request: where it went, how long it waited, what it cost. No prompt text.
//! Lines leave the request path through a bounded buffer to a writer thread: a slow or stopped
//! reader of the log drops lines (and counts them), never requests.

use prometheus::IntCounter;
use serde::Serialize;
use std::io::Write;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

/// Lines waiting for the writer thread at most; more are dropped.
const BUFFERED_LINES: usize = 8192;

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

/// What the writer thread receives: a line, or a request to write out everything before it.
enum Message {
    Line(AccessRecord),
    Flush(SyncSender<()>),
}

#[derive(Clone)]
enum Sink {
    Writer(SyncSender<Message>),
    Memory(Arc<Mutex<Vec<AccessRecord>>>),
    Discard,
}

/// Where access records go.
#[derive(Clone)]
pub struct AccessLog {
    sink: Sink,
    dropped: IntCounter,
}

impl std::fmt::Debug for AccessLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AccessLog")
    }
}

fn dropped_counter() -> IntCounter {
    IntCounter::new(
        "spillway_access_log_dropped_total",
        "Access-log lines dropped because the log's reader fell behind (the buffer was full).",
    )
    .unwrap_or_else(|e| panic!("metric definition: {e}"))
}

impl AccessLog {
    /// JSON lines on standard output, written by a thread of their own.
    pub fn stdout() -> AccessLog {
        Self::writer(std::io::stdout())
    }

    /// JSON lines on `out`, written by a thread of their own through a buffer of
    /// [`BUFFERED_LINES`] records.
    pub fn writer(out: impl Write + Send + 'static) -> AccessLog {
        let (tx, rx) = std::sync::mpsc::sync_channel(BUFFERED_LINES);
        let spawned = std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || write_lines(rx, out));
        match spawned {
            Ok(_) => AccessLog {
                sink: Sink::Writer(tx),
                dropped: dropped_counter(),
            },
            Err(e) => {
                tracing::error!(error = %e, "cannot start the access-log writer; access log off");
                Self::discard()
            }
        }
    }

    pub fn discard() -> AccessLog {
        AccessLog {
            sink: Sink::Discard,
            dropped: dropped_counter(),
        }
    }

    /// Records into a shared list: what tests read.
    pub fn memory() -> (AccessLog, Arc<Mutex<Vec<AccessRecord>>>) {
        let records = Arc::new(Mutex::new(Vec::new()));
        (
            AccessLog {
                sink: Sink::Memory(records.clone()),
                dropped: dropped_counter(),
            },
            records,
        )
    }

    /// The counter of dropped lines, for the gateway's registry.
    /// Writes out every line logged so far, waiting at most `timeout` (a stuck reader): the last
    /// lines of a gateway that stops are not lost with the process.
    pub fn flush(&self, timeout: std::time::Duration) {
        if let Sink::Writer(tx) = &self.sink {
            let start = tokio::time::Instant::now();
            let (done_tx, done_rx) = std::sync::mpsc::sync_channel(1);
            let mut message = Message::Flush(done_tx);
            // The buffer may be full of lines: wait for room, within the timeout.
            loop {
                match tx.try_send(message) {
                    Ok(()) => break,
                    Err(TrySendError::Full(m)) if start.elapsed() < timeout => {
                        message = m;
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                    Err(_) => return,
                }
            }
            let _ = done_rx.recv_timeout(timeout.saturating_sub(start.elapsed()));
        }
    }

    pub(crate) fn dropped(&self) -> IntCounter {
        self.dropped.clone()
    }

    /// Hands the record to the writer without waiting; drops it (and counts it) when the buffer is full.
    pub fn write(&self, record: AccessRecord) {
        match &self.sink {
            Sink::Writer(tx) => match tx.try_send(Message::Line(record)) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => self.dropped.inc(),
            },
            Sink::Memory(list) => list.lock().unwrap_or_else(|e| e.into_inner()).push(record),
            Sink::Discard => {}
        }
    }
}

/// The writer thread: serialises each record and writes them in batches, flushing whenever the
/// buffer runs empty so a quiet gateway's last lines are not held back.
/// How long the writer rests after a write: lines that come meanwhile wait in the channel and go
/// out together, so a busy gateway neither wakes the writer nor makes a system call per request.
const WRITE_EVERY: std::time::Duration = std::time::Duration::from_millis(10);

fn write_lines(rx: Receiver<Message>, out: impl Write) {
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, out);
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        let mut flushed = Vec::new();
        while let Some(message) = next {
            match message {
                Message::Line(record) => {
                    if serde_json::to_writer(&mut out, &record).is_ok() {
                        let _ = out.write_all(b"\n");
                    }
                }
                Message::Flush(done) => flushed.push(done),
            }
            next = rx.try_recv().ok();
        }
        // A closed pipe fails the flush: keep draining so senders never block.
        let _ = out.flush();
        let asked = !flushed.is_empty();
        for done in flushed {
            let _ = done.try_send(());
        }
        if !asked {
            std::thread::sleep(WRITE_EVERY);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that blocks forever after its first write, like stdout into a pipe nobody reads.
    struct Stuck(Arc<std::sync::Barrier>);

    impl Write for Stuck {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            self.0.wait();
            std::thread::park();
            Ok(0)
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stuck_reader_drops_lines_and_never_blocks_a_request() {
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let log = AccessLog::writer(Stuck(barrier.clone()));
        log.write(AccessRecord::default());
        barrier.wait();
        let total = BUFFERED_LINES as u64 + 1000;
        for _ in 0..total {
            log.write(AccessRecord::default());
        }
        // The writer holds one record; the buffer the next BUFFERED_LINES; the rest are dropped.
        assert!(log.dropped().get() >= 1000, "{}", log.dropped().get());
        assert!(log.dropped().get() <= 1001, "{}", log.dropped().get());
    }

    #[test]
    fn lines_are_json_one_per_record() {
        let (tx, rx) = std::sync::mpsc::sync_channel(4);
        let mut out = Vec::new();
        for id in ["a", "b"] {
            tx.send(Message::Line(AccessRecord {
                id: id.into(),
                status: 200,
                ..AccessRecord::default()
            }))
            .unwrap();
        }
        drop(tx);
        write_lines(rx, &mut out);
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1]["id"], "b");
    }

    /// Lines wait up to [`WRITE_EVERY`] to go out together; a flush (the gateway's last act)
    /// writes every line logged before it at once.
    #[test]
    fn a_flush_writes_every_line_logged_before_it() {
        #[derive(Clone, Default)]
        struct Shared(Arc<Mutex<Vec<u8>>>);
        impl Write for Shared {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let out = Shared::default();
        let log = AccessLog::writer(out.clone());
        for i in 0..500 {
            log.write(AccessRecord {
                id: format!("r{i}"),
                ..AccessRecord::default()
            });
        }
        log.flush(std::time::Duration::from_secs(5));
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 500);
        assert!(text.lines().last().unwrap().contains("\"r499\""));
    }
}
