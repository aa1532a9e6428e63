//! An answer's bytes: its head, hyper's framing and `date`, and chunks framed straight into the
//! connection's buffer.

use bytes::BytesMut;
use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use std::cell::RefCell;
use std::io::Write as _;
use std::task::{Context, Poll};

/// The end of a chunked body.
pub(crate) const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// What a chunked answer's bytes come from.
pub trait Chunks {
    /// Appends the next chunk, framed with [`encode_chunk`], to `out` (nothing if it is empty),
    /// or says the answer has ended (its last bytes appended first) or failed.
    fn poll_chunk_into(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut BytesMut,
    ) -> Poll<Result<Framed, StreamCut>>;

    /// Fields of the answer's head that come from the source (a stream's content type, its
    /// request's ID), written before the answer's own headers.
    fn head_fields(&self, each: &mut dyn FnMut(&[u8], &[u8])) {
        let _ = each;
    }
}

/// What a [`Chunks`] source did.
#[derive(Debug, PartialEq, Eq)]
pub enum Framed {
    More,
    End,
}

/// A chunked answer that failed before its end: the client must not take it for a whole one.
#[derive(Debug)]
pub struct StreamCut;

/// Any body as chunks, one per data frame.
pub(crate) struct BodyChunks<'a, B>(pub(crate) &'a mut B);

impl<B> Chunks for BodyChunks<'_, B>
where
    B: http_body::Body<Data = bytes::Bytes> + Unpin,
{
    fn poll_chunk_into(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut BytesMut,
    ) -> Poll<Result<Framed, StreamCut>> {
        Poll::Ready(
            match std::task::ready!(std::pin::Pin::new(&mut *self.0).poll_frame(cx)) {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        encode_chunk(out, &data);
                    }
                    Ok(Framed::More)
                }
                Some(Err(_)) => Err(StreamCut),
                None => Ok(Framed::End),
            },
        )
    }
}

/// Whether an answer with `status` has a body: a 1xx, 204 or 304 has none, and its head says
/// nothing of one (RFC 9110 §8.6, RFC 9112 §6.1), as hyper's server writes them.
pub(crate) fn has_body(status: http::StatusCode) -> bool {
    !(status.is_informational()
        || status == http::StatusCode::NO_CONTENT
        || status == http::StatusCode::NOT_MODIFIED)
}

/// The status line, the fields `fields` writes, the headers, then hyper's framing (none for a
/// status without a body) and `date`.
pub(crate) fn encode_head(
    out: &mut BytesMut,
    parts: &http::response::Parts,
    length: Option<u64>,
    close: bool,
    fields: impl FnOnce(&mut BytesMut),
) {
    let status = parts.status;
    if status == http::StatusCode::OK {
        out.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
    } else {
        let _ = write!(
            Writer(out),
            "HTTP/1.1 {} {}\r\n",
            status.as_str(),
            status.canonical_reason().unwrap_or("")
        );
    }
    fields(out);
    for (name, value) in &parts.headers {
        if name == CONTENT_LENGTH || name == TRANSFER_ENCODING || name == CONNECTION {
            continue;
        }
        encode_field(out, name.as_str().as_bytes(), value.as_bytes());
    }
    match length {
        _ if !has_body(status) => {}
        Some(n) => {
            let _ = write!(Writer(out), "content-length: {n}\r\n");
        }
        None => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"date: ");
    DATE.with_borrow_mut(|d| out.extend_from_slice(d.now()));
    out.extend_from_slice(b"\r\n\r\n");
}

/// hyper's answer to a head it cannot parse: 400, and the connection closes.
pub(crate) fn encode_bad_request(out: &mut BytesMut) {
    out.extend_from_slice(b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\ndate: ");
    DATE.with_borrow_mut(|d| out.extend_from_slice(d.now()));
    out.extend_from_slice(b"\r\n\r\n");
}

pub(crate) fn encode_field(out: &mut BytesMut, name: &[u8], value: &[u8]) {
    // What `HeaderValue` would take: a value written raw must not end the line (or the head).
    debug_assert!(
        value.iter().all(|&b| b == b'\t' || (0x20..0x7f).contains(&b)),
        "{value:?}"
    );
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// `data` as one chunk of a chunked body; nothing for empty data, which would end the body.
pub fn encode_chunk(out: &mut BytesMut, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    let mut size = [0u8; 16];
    let mut at = size.len();
    let mut n = data.len();
    while n > 0 || at == size.len() {
        at -= 1;
        size[at] = b"0123456789abcdef"[n % 16];
        n /= 16;
    }
    out.extend_from_slice(&size[at..]);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// `io::Write` into a `BytesMut`, for `write!`.
struct Writer<'a>(&'a mut BytesMut);

impl std::io::Write for Writer<'_> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

thread_local! {
    static DATE: RefCell<Date> = const { RefCell::new(Date { second: u64::MAX, text: String::new() }) };
}

/// The `date` header's value, formatted once a second.
struct Date {
    second: u64,
    text: String,
}

impl Date {
    fn now(&mut self) -> &[u8] {
        let now = std::time::SystemTime::now();
        let second = now
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if second != self.second {
            self.second = second;
            self.text = httpdate::fmt_http_date(now);
        }
        self.text.as_bytes()
    }
}
