//! Server-Sent Events framing for streamed completions (`data: <json>\n\n`, ended by `[DONE]`):
//! writing events, and the one decoder that splits a byte stream into events and reads their data,
//! shared by the gateway's relay and the load tester.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use memchr::memmem;
use serde::Serialize;
use std::borrow::Cow;

/// The terminal event of an OpenAI stream.
pub const DONE: &[u8] = b"data: [DONE]\n\n";

/// Appends one `data:` event holding `value` as JSON.
pub fn write_event<T: Serialize>(buf: &mut BytesMut, value: &T) {
    buf.put_slice(b"data: ");
    // Writing into a BytesMut cannot fail, and our wire types always serialise.
    let _ = serde_json::to_writer((&mut *buf).writer(), value);
    buf.put_slice(b"\n\n");
}

/// One `data:` event as its own buffer.
pub fn event<T: Serialize>(value: &T) -> Bytes {
    let mut buf = BytesMut::with_capacity(256);
    write_event(&mut buf, value);
    buf.freeze()
}

/// Splits a byte stream into complete SSE events (each ending in a blank line), keeping the rest
/// until more arrives. Events come out as the bytes that carried them, so a proxy can forward them
/// unchanged.
#[derive(Debug, Default)]
pub struct EventSplitter {
    partial: BytesMut,
}

impl EventSplitter {
    /// Feeds bytes; calls `each` with every event completed by them, terminator included.
    pub fn feed(&mut self, data: &[u8], mut each: impl FnMut(Bytes)) {
        self.partial.extend_from_slice(data);
        while let Some(end) = event_end(&self.partial) {
            each(self.partial.split_to(end).freeze());
        }
    }

    /// As [`EventSplitter::feed`], but each event is lent as a slice, without a copy or a
    /// reference count when it arrives whole: a relay that writes events on does not need them
    /// to outlive the call.
    pub fn feed_slices(&mut self, data: &[u8], mut each: impl FnMut(&[u8])) {
        if self.partial.is_empty() {
            let mut rest = data;
            while let Some(end) = event_end(rest) {
                each(&rest[..end]);
                rest = &rest[end..];
            }
            self.partial.extend_from_slice(rest);
            return;
        }
        self.partial.extend_from_slice(data);
        let mut start = 0;
        while let Some(end) = event_end(&self.partial[start..]) {
            each(&self.partial[start..start + end]);
            start += end;
        }
        self.partial.advance(start);
    }

    /// Keeps bytes without splitting them yet; the next feed hands out their events.
    pub fn hold(&mut self, data: &[u8]) {
        self.partial.extend_from_slice(data);
    }

    /// Whether the bytes held make at least one complete event.
    pub fn holds_event(&self) -> bool {
        event_end(&self.partial).is_some()
    }

    /// Whatever is left when the stream ends (an event without its blank line).
    pub fn rest(&mut self) -> Bytes {
        if self.partial.is_empty() {
            return Bytes::new();
        }
        self.partial.split().freeze()
    }
}

static LF: std::sync::LazyLock<memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memmem::Finder::new(b"\n\n"));
static CRLF: std::sync::LazyLock<memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memmem::Finder::new(b"\r\n\r\n"));

/// The index just past the first blank line (`\n\n`, or `\r\n\r\n`), if there is one.
pub fn event_end(buf: &[u8]) -> Option<usize> {
    let lf = LF.find(buf).map(|i| i + 2);
    // CRLF framing is rare (vLLM and OpenAI use LF); look for it only where a CR appears at all.
    let crlf = memchr::memchr(b'\r', buf)
        .and_then(|_| CRLF.find(buf))
        .map(|i| i + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The data of one event: its `data:` lines joined by newlines (one optional space after the colon
/// dropped, as the SSE specification says); `None` for an event without data (a comment, a
/// keep-alive, only an `event:` or `id:` line).
pub fn data(event: &[u8]) -> Option<Cow<'_, str>> {
    let mut lines = event
        .split(|b| *b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .filter_map(|l| {
            let rest = l.strip_prefix(b"data")?;
            match rest.first() {
                None => Some(&rest[..0]),
                Some(b':') => Some(rest[1..].strip_prefix(b" ").unwrap_or(&rest[1..])),
                Some(_) => None,
            }
        });
    let first = lines.next()?;
    match lines.next() {
        None => Some(String::from_utf8_lossy(first)),
        Some(second) => {
            let mut joined = String::from_utf8_lossy(first).into_owned();
            for l in std::iter::once(second).chain(lines) {
                joined.push('\n');
                joined.push_str(&String::from_utf8_lossy(l));
            }
            Some(Cow::Owned(joined))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_anywhere_come_out_whole() {
        let stream = b"data: {\"a\":1}\n\ndata: {\"b\":2}\r\n\r\n: keep-alive\n\ndata: [DONE]\n\n";
        for cut in 0..stream.len() {
            let mut s = EventSplitter::default();
            let mut events = Vec::new();
            s.feed(&stream[..cut], |e| events.push(e));
            s.feed(&stream[cut..], |e| events.push(e));
            let joined: Vec<u8> = events.iter().flat_map(|e| e.to_vec()).collect();
            assert_eq!(joined, stream.to_vec(), "cut at {cut}");
            assert_eq!(events.len(), 4, "cut at {cut}");
            assert!(s.rest().is_empty());
        }
    }

    #[test]
    fn lent_events_are_the_same_events_however_the_bytes_are_cut() {
        let stream = b"data: {\"a\":1}\n\ndata: {\"b\":2}\r\n\r\n: keep-alive\n\ndata: [DONE]\n\n";
        for a in 0..=stream.len() {
            for b in a..=stream.len() {
                let mut s = EventSplitter::default();
                let mut events: Vec<Vec<u8>> = Vec::new();
                s.hold(&stream[..a]);
                s.feed_slices(&stream[a..b], |e| events.push(e.to_vec()));
                s.feed_slices(&stream[b..], |e| events.push(e.to_vec()));
                assert_eq!(events.concat(), stream.to_vec(), "cut at {a}, {b}");
                assert_eq!(events.len(), 4, "cut at {a}, {b}");
                assert!(s.rest().is_empty());
            }
        }
        let mut s = EventSplitter::default();
        s.hold(b"data: 1\n");
        assert!(!s.holds_event());
        s.hold(b"\n");
        assert!(s.holds_event());
    }

    #[test]
    fn data_is_read_as_the_specification_says() {
        assert_eq!(data(b"data: {\"a\":1}\n\n").as_deref(), Some("{\"a\":1}"));
        assert_eq!(data(b"data:[DONE]\r\n\r\n").as_deref(), Some("[DONE]"));
        assert_eq!(data(b"data:  two spaces\n\n").as_deref(), Some(" two spaces"));
        assert_eq!(data(b"event: x\ndata: a\ndata: b\n\n").as_deref(), Some("a\nb"));
        assert_eq!(data(b"data\n\n").as_deref(), Some(""));
        assert_eq!(data(b": ping\n\n"), None);
        assert_eq!(data(b"id: 3\n\n"), None);
        assert_eq!(data(b"dataset: no\n\n"), None);
    }

    #[test]
    fn event_is_one_data_line_and_a_blank_line() {
        let e = event(&serde_json::json!({"a": 1}));
        assert_eq!(&e[..], b"data: {\"a\":1}\n\n");
    }
}
