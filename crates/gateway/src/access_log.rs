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
    // The names are shared with the configuration's (`Arc`s), not copied for each request.
    pub route: Arc<str>,
    pub class: Arc<str>,
    pub team: Arc<str>,
    pub replica: Option<Arc<str>>,
    pub status: u16,
    /// `ok`, or why it ended otherwise (a rejection reason, `client_disconnect`, `stream_idle_timeout`…).
    pub outcome: &'static str,
    /// The endpoint it came in on (`chat`, `completions`, `embeddings`, `responses`, `messages`,
    /// `count_tokens`); none for a request refused before its endpoint was known.
    pub api: Option<&'static str>,
    pub stream: bool,
    pub queue_ms: Option<f64>,
    /// Requests ahead of it in its lane's order (by arrival, or by fair share between teams)
    /// when it joined the queue; none if it did not wait.
    pub queue_ahead: Option<u32>,
    pub ttft_ms: Option<f64>,
    pub duration_ms: f64,
    pub tokens_in: Option<u32>,
    pub tokens_out: Option<u32>,
    pub retries: u32,
    /// Something about the request the outcome does not say, from a fixed vocabulary (e.g.
    /// `upstream_body_not_ended`: the replica sent `[DONE]` but never ended its body).
    pub note: Option<&'static str>,
    // What makes a day of log a trace to replay (`spillway trace`): refused requests included.
    /// When it arrived, wall clock, milliseconds since the Unix epoch.
    pub arrival_ms: Option<u64>,
    /// The model the client named (the route may serve it under another name).
    pub model: Option<Arc<str>>,
    /// The answer's length the client asked (`max_tokens`, `max_completion_tokens`), before caps
    /// and defaults: with `tokens_in`, what a refused request would have cost.
    pub max_tokens: Option<u32>,
    pub priority: Option<&'static str>,
    /// The prompt's blocks of [`HASH_BLOCK_BYTES`], each hashed with the ones before it and the
    /// deployment's salt ([`hash_ids`]): equal ids are a shared prefix, and no content is kept.
    pub hash_ids: Vec<u64>,
}

/// A prompt block for [`AccessRecord::hash_ids`]: 2048 bytes, about Mooncake's 512 tokens at the
/// four bytes a token the bench's prompts and the gateway's estimate use.
pub const HASH_BLOCK_BYTES: usize = 2048;

/// At most this many blocks are hashed (a 2 MB prompt): the line stays bounded.
pub const MAX_HASH_IDS: usize = 1024;

/// The environment variable that holds the deployment's salt; without it each process draws one,
/// and ids match only within that process's log.
pub const SALT_ENV: &str = "SPILLWAY_TRACE_SALT";

/// The wall clock at `at` (an instant of the past), in milliseconds since the Unix epoch.
pub fn wall_ms(at: tokio::time::Instant) -> Option<u64> {
    let now = std::time::SystemTime::now().checked_sub(at.elapsed())?;
    let since = now.duration_since(std::time::UNIX_EPOCH).ok()?;
    u64::try_from(since.as_millis()).ok()
}

fn salt() -> &'static [u8] {
    static SALT: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    SALT.get_or_init(|| match std::env::var(SALT_ENV) {
        Ok(s) if !s.is_empty() => s.into_bytes(),
        _ => rand::random::<[u8; 16]>().to_vec(),
    })
}

/// Prefix-block ids of a prompt given as its parts in order: each block's bytes through XXH3
/// (fast: the whole prompt is read on the request path), then SHA-256 of (salt, the previous
/// block's id, that digest) cut to 53 bits, so that every JSON reader holds them exactly and
/// nothing of the content can be tested without the salt. A chain, as vLLM's prefix cache
/// hashes blocks: a block's id says its whole prefix matched.
pub fn hash_ids<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> Vec<u64> {
    hash_ids_salted(salt(), parts)
}

fn hash_ids_salted<'a>(salt: &[u8], parts: impl IntoIterator<Item = &'a [u8]>) -> Vec<u64> {
    use sha2::{Digest, Sha256};
    use xxhash_rust::xxh3::Xxh3;
    let chain = |previous: u64, block: &Xxh3| {
        let mut h = Sha256::new();
        h.update(salt);
        h.update(previous.to_le_bytes());
        h.update(block.digest128().to_le_bytes());
        let d = h.finalize();
        u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]]) & ((1 << 53) - 1)
    };
    let mut ids: Vec<u64> = Vec::new();
    let mut block = Xxh3::new();
    let mut filled = 0;
    for mut part in parts {
        while !part.is_empty() && ids.len() < MAX_HASH_IDS {
            let take = part.len().min(HASH_BLOCK_BYTES - filled);
            block.update(&part[..take]);
            filled += take;
            part = &part[take..];
            if filled == HASH_BLOCK_BYTES {
                ids.push(chain(ids.last().copied().unwrap_or(0), &block));
                block.reset();
                filled = 0;
            }
        }
    }
    if filled > 0 && ids.len() < MAX_HASH_IDS {
        ids.push(chain(ids.last().copied().unwrap_or(0), &block));
    }
    ids
}

/// What the writer thread receives: a line, or a request to write out everything before it.
enum Message {
    // Boxed: a record with its trace fields is ~270 bytes, and the channel holds 8,192 messages.
    Line(Box<AccessRecord>),
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
    /// Whether lines go anywhere: with `access_log: false` nothing is written, so nothing need be
    /// worked out for a line (the prompt's block hashes read the whole prompt).
    pub fn keeps_lines(&self) -> bool {
        !matches!(self.sink, Sink::Discard)
    }

    pub fn write(&self, record: AccessRecord) {
        match &self.sink {
            Sink::Writer(tx) => match tx.try_send(Message::Line(Box::new(record))) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => self.dropped.inc(),
            },
            Sink::Memory(list) => list.lock().unwrap_or_else(|e| e.into_inner()).push(record),
            Sink::Discard => {}
        }
    }
}

/// How long the writer rests after a write: lines that come meanwhile wait in the channel and go
/// out together, so a busy gateway neither wakes the writer nor makes a system call per request.
const WRITE_EVERY: std::time::Duration = std::time::Duration::from_millis(10);

/// The writer thread: formats each record and writes them in batches, whenever the channel runs
/// empty so a quiet gateway's last lines are not held back.
fn write_lines(rx: Receiver<Message>, mut out: impl Write) {
    // The batch of lines for one write: formatted straight into it, written when the channel runs
    // empty or it passes BATCH_BYTES.
    let mut batch = Vec::with_capacity(BATCH_BYTES);
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        let mut flushed = Vec::new();
        while let Some(message) = next {
            match message {
                Message::Line(record) => {
                    write_line(&record, &mut batch);
                    if batch.len() >= BATCH_BYTES {
                        write_batch(&mut out, &mut batch);
                    }
                }
                Message::Flush(done) => flushed.push(done),
            }
            next = rx.try_recv().ok();
        }
        write_batch(&mut out, &mut batch);
        let asked = !flushed.is_empty();
        for done in flushed {
            let _ = done.try_send(());
        }
        if !asked {
            std::thread::sleep(WRITE_EVERY);
        }
    }
}

/// How many bytes of lines go out in one write at most (about 200 lines).
const BATCH_BYTES: usize = 64 * 1024;

/// Writes the batch and empties it. A closed pipe fails the write: the lines are dropped and the
/// writer goes on draining, so that senders never block.
fn write_batch(out: &mut impl Write, batch: &mut Vec<u8>) {
    if !batch.is_empty() {
        let _ = out.write_all(batch).and_then(|()| out.flush());
        batch.clear();
    }
}

/// Appends `r` as one JSON line, byte for byte what `serde_json` writes for it (a test holds
/// them equal) for far fewer instructions
/// (bench/runs/2026-12-03-rust-2core-hand-written-readers.md): a string with nothing to escape is
/// copied whole, and milliseconds, which hold whole microseconds, are written from integers.
fn write_line(r: &AccessRecord, line: &mut Vec<u8>) {
    line.extend_from_slice(b"{\"id\":");
    string(line, &r.id);
    line.extend_from_slice(b",\"route\":");
    string(line, &r.route);
    line.extend_from_slice(b",\"class\":");
    string(line, &r.class);
    line.extend_from_slice(b",\"team\":");
    string(line, &r.team);
    line.extend_from_slice(b",\"replica\":");
    match &r.replica {
        Some(s) => string(line, s),
        None => line.extend_from_slice(b"null"),
    }
    line.extend_from_slice(b",\"status\":");
    int(line, r.status);
    line.extend_from_slice(b",\"outcome\":");
    string(line, r.outcome);
    line.extend_from_slice(b",\"api\":");
    match r.api {
        Some(s) => string(line, s),
        None => line.extend_from_slice(b"null"),
    }
    line.extend_from_slice(if r.stream {
        b",\"stream\":true"
    } else {
        b",\"stream\":false"
    });
    line.extend_from_slice(b",\"queue_ms\":");
    optional(line, r.queue_ms, millis);
    line.extend_from_slice(b",\"queue_ahead\":");
    optional(line, r.queue_ahead, int);
    line.extend_from_slice(b",\"ttft_ms\":");
    optional(line, r.ttft_ms, millis);
    line.extend_from_slice(b",\"duration_ms\":");
    millis(line, r.duration_ms);
    line.extend_from_slice(b",\"tokens_in\":");
    optional(line, r.tokens_in, int);
    line.extend_from_slice(b",\"tokens_out\":");
    optional(line, r.tokens_out, int);
    line.extend_from_slice(b",\"retries\":");
    int(line, r.retries);
    line.extend_from_slice(b",\"note\":");
    match r.note {
        Some(s) => string(line, s),
        None => line.extend_from_slice(b"null"),
    }
    line.extend_from_slice(b",\"arrival_ms\":");
    optional(line, r.arrival_ms, int);
    line.extend_from_slice(b",\"model\":");
    match &r.model {
        Some(s) => string(line, s),
        None => line.extend_from_slice(b"null"),
    }
    line.extend_from_slice(b",\"max_tokens\":");
    optional(line, r.max_tokens, int);
    line.extend_from_slice(b",\"priority\":");
    match r.priority {
        Some(s) => string(line, s),
        None => line.extend_from_slice(b"null"),
    }
    line.extend_from_slice(b",\"hash_ids\":[");
    for (i, id) in r.hash_ids.iter().enumerate() {
        if i > 0 {
            line.push(b',');
        }
        int(line, *id);
    }
    line.extend_from_slice(b"]}\n");
}

fn int(line: &mut Vec<u8>, n: impl itoa::Integer) {
    line.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

fn optional<T>(line: &mut Vec<u8>, value: Option<T>, write: impl FnOnce(&mut Vec<u8>, T)) {
    match value {
        Some(v) => write(line, v),
        None => line.extend_from_slice(b"null"),
    }
}

/// A JSON string: whole when nothing in it needs escaping (what an ID, a route or a URL holds),
/// else as `serde_json` escapes it.
fn string(line: &mut Vec<u8>, s: &str) {
    // A fold without an early exit, which the compiler turns into vector compares.
    let escapes = s
        .bytes()
        .fold(false, |any, b| any | (b < 0x20) | (b == b'"') | (b == b'\\'));
    if !escapes {
        line.push(b'"');
        line.extend_from_slice(s.as_bytes());
        line.push(b'"');
    } else {
        let _ = serde_json::to_writer(&mut *line, s);
    }
}

/// Milliseconds as `serde_json` writes them. A value of whole microseconds (what [`ms`] makes)
/// has a shortest form of at most three decimals, written here from its integer count; any
/// other value is left to `serde_json`.
///
/// [`ms`]: crate::path::ledger
fn millis(line: &mut Vec<u8>, v: f64) {
    let micros = (v * 1e3).round();
    if !(0.0..1e15).contains(&micros) || micros / 1e3 != v {
        let _ = serde_json::to_writer(&mut *line, &v);
        return;
    }
    let micros = micros as u64;
    int(line, micros / 1000);
    let frac = micros % 1000;
    let digits = [
        b'0' + (frac / 100) as u8,
        b'0' + (frac / 10 % 10) as u8,
        b'0' + (frac % 10) as u8,
    ];
    // No trailing zeros, but at least one decimal, as in `2.0`.
    let keep = match frac {
        f if f % 10 != 0 => 3,
        f if f % 100 != 0 => 2,
        _ => 1,
    };
    line.push(b'.');
    line.extend_from_slice(&digits[..keep]);
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
            tx.send(Message::Line(Box::new(AccessRecord {
                id: id.into(),
                status: 200,
                ..AccessRecord::default()
            })))
            .unwrap();
        }
        drop(tx);
        write_lines(rx, &mut out);
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1]["id"], "b");
    }

    /// The hand-written line is serde_json's, byte for byte: escapes, nulls, and milliseconds
    /// from whole microseconds (what the gateway writes) to values it never writes.
    #[test]
    fn a_line_is_what_serde_json_writes() {
        let mut records = vec![AccessRecord::default()];
        for (i, v) in [
            0.0,
            0.001,
            0.01,
            0.1,
            0.5,
            1.0,
            1.487,
            2.05,
            12.3,
            999.999,
            1000.0,
            86_400_000.5,
        ]
        .into_iter()
        .enumerate()
        {
            records.push(AccessRecord {
                id: format!("req-{i}"),
                route: "llama-3.1-8b".into(),
                class: "interactive".into(),
                team: "search".into(),
                replica: Some("http://10.0.0.7:8000".into()),
                status: 200,
                outcome: "ok",
                api: (i % 2 == 0).then_some("responses"),
                stream: i % 2 == 0,
                queue_ms: Some(v),
                queue_ahead: (i % 2 == 1).then_some(i as u32),
                ttft_ms: (i % 3 != 0).then_some(v * 2.0),
                duration_ms: v + 7.0,
                tokens_in: Some(i as u32 * 1000),
                tokens_out: (i % 2 == 1).then_some(u32::MAX),
                retries: i as u32,
                note: (i % 2 == 0).then_some("upstream_body_not_ended"),
                arrival_ms: (i % 2 == 0).then_some(1_765_000_000_000 + i as u64),
                model: (i % 3 == 0).then(|| "meta-llama/Llama-3.1-8B".into()),
                max_tokens: (i % 2 == 1).then_some(i as u32 * 100),
                priority: (i % 2 == 0).then_some("sheddable"),
                hash_ids: (0..i as u64).map(|k| k * 0x1f_ffff_ffff_ffff / 7).collect(),
            });
        }
        for micros in (0..20_000).step_by(7) {
            records.push(AccessRecord {
                duration_ms: micros as f64 / 1e3,
                ..AccessRecord::default()
            });
        }
        records.push(AccessRecord {
            id: "quote\" back\\slash \n tab\t nul\u{0} del\u{7f} é 日本".into(),
            team: "\u{1f}".into(),
            // Not whole microseconds, negative, huge, not finite: serde_json's own form.
            queue_ms: Some(0.0001),
            ttft_ms: Some(-1.5),
            duration_ms: 1e300,
            ..AccessRecord::default()
        });
        records.push(AccessRecord {
            duration_ms: f64::NAN,
            queue_ms: Some(f64::INFINITY),
            ..AccessRecord::default()
        });
        for r in records {
            let mut line = Vec::new();
            write_line(&r, &mut line);
            let mut want = serde_json::to_vec(&r).unwrap();
            want.push(b'\n');
            assert_eq!(String::from_utf8(line).unwrap(), String::from_utf8(want).unwrap());
        }
    }

    /// Lines wait up to [`WRITE_EVERY`] to go out together; a flush (the gateway's last act)
    /// writes every line logged before it at once.
    #[test]
    fn a_flush_writes_every_line_logged_before_it() {
        #[derive(Clone, Default)]
        struct SharedLimits(Arc<Mutex<Vec<u8>>>);
        impl Write for SharedLimits {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let out = SharedLimits::default();
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

    /// Equal prefixes give equal leading ids, whatever the parts' boundaries; a different salt
    /// gives different ids; the last block may be partial; the count is bounded.
    #[test]
    fn hash_ids_chain_blocks_under_a_salt() {
        let a = vec![b'a'; HASH_BLOCK_BYTES * 2 + 10];
        let mut b = a.clone();
        b[HASH_BLOCK_BYTES * 2 + 3] = b'b';
        let ids_a = hash_ids_salted(b"s", [&a[..]]);
        let ids_b = hash_ids_salted(b"s", [&b[..5], &b[5..]]);
        assert_eq!(ids_a.len(), 3);
        assert_eq!(ids_a[..2], ids_b[..2], "the shared two blocks");
        assert_ne!(ids_a[2], ids_b[2], "the partial block differs");
        assert_ne!(
            ids_a[0], ids_a[1],
            "a block's id carries its prefix, not only its bytes"
        );
        assert!(ids_a.iter().all(|id| *id < 1 << 53));
        assert_ne!(hash_ids_salted(b"t", [&a[..]])[0], ids_a[0]);
        assert_eq!(hash_ids_salted(b"s", [&[][..]]), Vec::<u64>::new());
        let huge = vec![0u8; HASH_BLOCK_BYTES * (MAX_HASH_IDS + 5)];
        assert_eq!(hash_ids_salted(b"s", [&huge[..]]).len(), MAX_HASH_IDS);
    }
}
