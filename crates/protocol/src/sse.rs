//! Server-Sent Events framing for streamed completions (`data: <json>\n\n`, ended by `[DONE]`):
//! writing events, and the one decoder that splits a byte stream into events and reads their data,
//! shared by the gateway's relay and the load tester.

use bytes::{Buf, BufMut, Bytes, BytesMut};
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

/// How a server writes its events' JSON and lines. vLLM writes them compact with LF line ends;
/// Python servers that use `json.dumps` put a space after each `,` and `:`; some pretty-print
/// over several `data:` lines; some end lines with CR LF. `spillway engine --sse-style` speaks
/// each, so that the gateway is tested against all of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Style {
    #[default]
    Compact,
    Dumps,
    Pretty,
    Crlf,
}

impl Style {
    pub const ALL: [Style; 4] = [Style::Compact, Style::Dumps, Style::Pretty, Style::Crlf];

    pub fn name(self) -> &'static str {
        match self {
            Style::Compact => "compact",
            Style::Dumps => "dumps",
            Style::Pretty => "pretty",
            Style::Crlf => "crlf",
        }
    }

    /// Events written compact (`data: {…}` and a blank line, LF) rewritten in this style: their
    /// JSON formatted again, their lines ended again. Data that is not JSON (`[DONE]`) keeps its
    /// text.
    pub fn restyle(self, compact: &[u8]) -> Vec<u8> {
        if self == Style::Compact {
            return compact.to_vec();
        }
        let mut out = Vec::with_capacity(compact.len() * 2);
        let eol: &[u8] = if self == Style::Crlf { b"\r\n" } else { b"\n" };
        let mut rest = compact;
        while let Some(end) = event_end(rest) {
            let event = &rest[..end];
            rest = &rest[end..];
            let Some(d) = crate::judge::data(event) else {
                out.extend_from_slice(event);
                continue;
            };
            let text = match serde_json::from_slice::<serde_json::Value>(d.bytes()) {
                Ok(v) => self.format(&v),
                Err(_) => d.bytes().to_vec(),
            };
            for line in text.split(|b| *b == b'\n') {
                out.extend_from_slice(b"data: ");
                out.extend_from_slice(line);
                out.extend_from_slice(eol);
            }
            out.extend_from_slice(eol);
        }
        out.extend_from_slice(rest);
        out
    }

    /// A JSON value as this style writes it.
    pub fn format(self, v: &serde_json::Value) -> Vec<u8> {
        match self {
            Style::Compact | Style::Crlf => serde_json::to_vec(v).unwrap_or_default(),
            Style::Pretty => serde_json::to_vec_pretty(v).unwrap_or_default(),
            Style::Dumps => {
                let mut out = Vec::new();
                let mut ser = serde_json::Serializer::with_formatter(&mut out, Dumps);
                let _ = v.serialize(&mut ser);
                out
            }
        }
    }
}

/// Python's `json.dumps` defaults: `", "` between members and items, `": "` after keys.
struct Dumps;

impl serde_json::ser::Formatter for Dumps {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

/// Splits a byte stream into complete SSE events (each ending in a blank line), keeping the rest
/// until more arrives. Events come out as the bytes that carried them, so a proxy can forward them
/// unchanged.
#[derive(Debug, Default)]
pub struct EventSplitter {
    partial: BytesMut,
    /// How much of `partial` is known to hold no whole terminator: a long event arriving in many
    /// pieces is searched once, not again from its start with every piece.
    searched: usize,
    /// An event has ended with CR LF: a CR that ends what has come waits for its LF.
    crlf: bool,
}

impl EventSplitter {
    /// Feeds bytes; calls `each` with every event completed by them, terminator included.
    pub fn feed(&mut self, data: &[u8], mut each: impl FnMut(Bytes)) {
        self.partial.extend_from_slice(data);
        while let Some(end) = self.next_end(0) {
            self.note_end(end);
            each(self.partial.split_to(end).freeze());
            self.searched = 0;
        }
        self.searched = self.partial.len();
    }

    /// Notes how the event that ends at `end` of `partial` (or of `data`) ended.
    fn note_end(&mut self, end: usize) {
        self.crlf |= self.partial[..end].ends_with(b"\r\n");
    }

    /// As [`EventSplitter::feed`], but each event is lent as a slice, without a copy or a
    /// reference count when it arrives whole: a relay that writes events on does not need them
    /// to outlive the call.
    pub fn feed_slices(&mut self, data: &[u8], mut each: impl FnMut(&[u8])) {
        if self.partial.is_empty() {
            let mut rest = data;
            while let Some(end) = ends(rest, !self.crlf) {
                self.crlf |= rest[..end].ends_with(b"\r\n");
                each(&rest[..end]);
                rest = &rest[end..];
            }
            self.partial.extend_from_slice(rest);
            self.searched = rest.len();
            return;
        }
        self.partial.extend_from_slice(data);
        let mut start = 0;
        while let Some(end) = self.next_end(start) {
            self.note_end(end);
            each(&self.partial[start..end]);
            start = end;
            self.searched = end;
        }
        self.partial.advance(start);
        self.searched = self.partial.len();
    }

    /// The end of the first event that starts at `start`, searching only what was not searched
    /// before (less three bytes, where a terminator may have begun).
    fn next_end(&self, start: usize) -> Option<usize> {
        let from = self.searched.saturating_sub(3).max(start);
        ends(&self.partial[from..], !self.crlf).map(|end| from + end)
    }

    /// Bytes held for an event not yet complete: a relay bounds this, as nothing else does.
    pub fn held(&self) -> usize {
        self.partial.len()
    }

    /// Whatever is left when the stream ends (an event without its blank line).
    pub fn rest(&mut self) -> Bytes {
        self.searched = 0;
        if self.partial.is_empty() {
            return Bytes::new();
        }
        self.partial.split().freeze()
    }
}

/// The index just past the first blank line, if there is one: a line ending (CR LF, LF or CR, as
/// the SSE specification allows) followed by another. One scan for CR and LF: an event is usually
/// a single line, so this is one `memchr2` per event. A CR that ends what has come may be the
/// first half of a CR LF; as the second line ending it ends the event at once (a replica that
/// ends its lines with CR alone would otherwise have each event held until the next arrives),
/// and an LF after it then starts the next event as a stray blank line, which dispatches nothing.
/// It waits for that LF instead when the line before ended with CR LF, and [`EventSplitter`]
/// does once the stream has shown that it writes CR LF.
pub fn event_end(buf: &[u8]) -> Option<usize> {
    ends(buf, true)
}

/// Whether what was left when a stream ended is one whole event: at the stream's end a CR that
/// ends it is a line's end, whatever the line before it ended with.
pub fn whole_at_end(rest: &[u8]) -> bool {
    if event_end(rest) == Some(rest.len()) {
        return true;
    }
    rest.ends_with(b"\r") && {
        let mut with_lf = rest.to_vec();
        with_lf.push(b'\n');
        event_end(&with_lf) == Some(with_lf.len())
    }
}

/// [`event_end`], where a CR that ends `buf` as the blank line's ends the event only if
/// `lone_cr_ends` and the line before it did not end with CR LF.
fn ends(buf: &[u8], lone_cr_ends: bool) -> Option<usize> {
    memchr::memchr2_iter(b'\n', b'\r', buf).find_map(|i| {
        // The LF of a CR LF was read with its CR.
        if buf[i] == b'\n' && i > 0 && buf[i - 1] == b'\r' {
            return None;
        }
        let crlf = buf[i] == b'\r' && buf.get(i + 1) == Some(&b'\n');
        let next = match (buf[i], buf.get(i + 1)) {
            (b'\r', Some(b'\n')) => i + 2,
            (b'\r', None) => return None,
            _ => i + 1,
        };
        match (buf.get(next), buf.get(next + 1)) {
            (Some(b'\n'), _) => Some(next + 1),
            (Some(b'\r'), Some(b'\n')) => Some(next + 2),
            (Some(b'\r'), None) if crlf || !lone_cr_ends => None,
            (Some(b'\r'), _) => Some(next + 1),
            _ => None,
        }
    })
}

/// The data of one event: its `data:` lines joined by newlines (one optional space after the colon
/// dropped, lines ended by CR LF, LF or CR, as the SSE specification says); `None` for an event
/// without data (a comment, a keep-alive, only an `event:` or `id:` line).
pub fn data(event: &[u8]) -> Option<Cow<'_, str>> {
    Some(match crate::judge::data(event)? {
        crate::judge::Data::Line { value, .. } => String::from_utf8_lossy(value),
        crate::judge::Data::Joined(v) => Cow::Owned(String::from_utf8_lossy(&v).into_owned()),
    })
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
                for part in [&stream[..a], &stream[a..b], &stream[b..]] {
                    s.feed_slices(part, |e| events.push(e.to_vec()));
                }
                assert_eq!(events.concat(), stream.to_vec(), "cut at {a}, {b}");
                assert_eq!(events.len(), 4, "cut at {a}, {b}");
                assert!(s.rest().is_empty());
            }
        }
    }

    #[test]
    fn a_long_event_in_many_pieces_comes_out_whole_and_is_held_until_then() {
        let event = [&b"data: "[..], &vec![b'x'; 10_000], b"\r\n\r\n"].concat();
        for piece in [1, 2, 3, 7, 4096] {
            let (mut lent, mut owned) = (EventSplitter::default(), EventSplitter::default());
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for chunk in event.chunks(piece) {
                lent.feed_slices(chunk, |e| a.push(e.to_vec()));
                owned.feed(chunk, |e| b.push(e.to_vec()));
                if a.is_empty() {
                    assert_eq!(lent.held(), owned.held());
                }
            }
            assert_eq!(a, vec![event.clone()], "pieces of {piece}");
            assert_eq!(b, vec![event.clone()], "pieces of {piece}");
            assert_eq!(lent.held(), 0);
        }
    }

    #[test]
    fn an_event_ends_at_its_first_blank_line_whatever_the_line_endings() {
        for (stream, end) in [
            (&b"data: x\n\nrest"[..], Some(9)),
            (b"data: x\r\n\r\nrest", Some(11)),
            (b"data: x\r\n\nrest", Some(10)),
            (b"data: x\n\r\nrest", Some(10)),
            (b"data: x\ndata: y\n\n", Some(17)),
            (b"data: x\r\ndata: y\r\n\r\n", Some(20)),
            (b"data: x\r\n\n\n", Some(10)),
            (b"data: x\n", None),
            // A CR alone ends a line too; one that ends what came ends the event at once.
            (b"data: x\n\r", Some(9)),
            (b"data: x\r\n\r", None),
            (b"data: x\r\r", Some(9)),
            (b"data: x\r\rdata: y\r\r", Some(9)),
            (b"data: x\rdata: y\r\r", Some(17)),
            (b"data: x\r", None),
            (b"data: x\r\n", None),
            (b"", None),
        ] {
            assert_eq!(event_end(stream), end, "{:?}", String::from_utf8_lossy(stream));
        }
    }

    #[test]
    fn what_is_left_at_the_end_is_an_event_when_its_blank_line_is_whole() {
        assert!(whole_at_end(b"data: [DONE]\r\n\r"));
        assert!(whole_at_end(b"data: [DONE]\n\n"));
        assert!(whole_at_end(b"data: [DONE]\r\r"));
        assert!(!whole_at_end(b"data: [DONE]\r\n"));
        assert!(!whole_at_end(b"data: [DONE]"));
        assert!(!whole_at_end(b"data: a\n\ndata: b\n\n"));
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
        assert_eq!(data(b"data: a\rdata: b\r\r").as_deref(), Some("a\nb"));
    }

    #[test]
    fn styles_write_the_same_events_differently() {
        let compact = b"data: {\"a\":[1,2],\"b\":\"x\"}\n\ndata: [DONE]\n\n";
        let out = |s: Style| String::from_utf8(s.restyle(compact)).unwrap();
        assert_eq!(out(Style::Compact), String::from_utf8_lossy(compact));
        assert_eq!(
            out(Style::Dumps),
            "data: {\"a\": [1, 2], \"b\": \"x\"}\n\ndata: [DONE]\n\n"
        );
        assert_eq!(
            out(Style::Crlf),
            "data: {\"a\":[1,2],\"b\":\"x\"}\r\n\r\ndata: [DONE]\r\n\r\n"
        );
        assert_eq!(
            out(Style::Pretty),
            "data: {\ndata:   \"a\": [\ndata:     1,\ndata:     2\ndata:   ],\ndata:   \"b\": \"x\"\ndata: }\n\ndata: [DONE]\n\n"
        );
    }

    #[test]
    fn event_is_one_data_line_and_a_blank_line() {
        let e = event(&serde_json::json!({"a": 1}));
        assert_eq!(&e[..], b"data: {\"a\":1}\n\n");
    }
}
