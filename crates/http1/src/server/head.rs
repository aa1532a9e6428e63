//! A request's head: where it ends in what a connection has read, and what it says.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri};
use memchr::memmem;
use std::sync::LazyLock;

/// Header lines a head may have, as hyper allows.
pub const MAX_HEADERS: usize = 100;

/// What the bytes read so far hold, as [`scan`] finds it.
#[derive(Debug, PartialEq, Eq)]
pub enum Scan {
    /// A whole head, this long (after the blank lines skipped).
    Complete(usize),
    /// Not a head this module parses: too large, or HTTP/2's preface.
    Other,
    /// Bytes that cannot begin a request.
    Invalid,
    /// Not yet a whole head.
    More,
}

/// Looks at what a connection has read: how many bytes of blank lines to skip first, then what
/// follows them. `searched` is how far an earlier call looked for the head's end (0 at first), so
/// that a head sent a byte at a time is not searched again from its start with every byte.
/// Parsing apart from the socket: the fuzz target `front_head` runs this very function.
pub fn scan(buf: &[u8], searched: &mut usize, max_head: usize) -> (usize, Scan) {
    // Blank lines before a request line are ignored (RFC 9112 2.2), as hyper does: CR LF or LF,
    // never a lone CR, which hyper answers with 400.
    let blank = blank_lines(buf);
    let buf = &buf[blank..];
    if buf.starts_with(b"PRI ") {
        return (blank, Scan::Other);
    }
    let from = searched.saturating_sub(blank).saturating_sub(2);
    *searched = buf.len();
    // A head ends at its first blank line, as an SSE event does; it is parsed once, by
    // [`RequestHead::parse`] (one that does not parse is handed over, these bytes first).
    if let Some(end) = head_end(&buf[from..]) {
        return (blank, Scan::Complete(from + end));
    }
    if buf.len() > max_head {
        return (blank, Scan::Other);
    }
    // Bytes that cannot begin a request (a TLS handshake, a lone CR, garbage) are refused at
    // once, instead of waiting for a blank line until the head's timeout.
    if !may_be_head(buf) {
        return (blank, Scan::Invalid);
    }
    (blank, Scan::More)
}

/// How many bytes of blank lines (CR LF or LF) `buf` starts with.
pub(super) fn blank_lines(buf: &[u8]) -> usize {
    let mut at = 0;
    loop {
        match &buf[at..] {
            [b'\n', ..] => at += 1,
            [b'\r', b'\n', ..] => at += 2,
            _ => return at,
        }
    }
}

/// Whether `buf`, which holds no whole head, may be the start of one: httparse finds nothing
/// wrong in it so far. Run only while a head is incomplete after a read, which a client's head
/// seldom is.
pub(super) fn may_be_head(buf: &[u8]) -> bool {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    match httparse::Request::new(&mut headers).parse(buf) {
        Ok(_) | Err(httparse::Error::TooManyHeaders) => true,
        Err(_) => false,
    }
}

/// Whether a `Host` value is one RFC 9112 §3.2 lets a server take: `uri-host [ ":" port ]`, or
/// empty (a target without an authority).
pub fn valid_host(value: &[u8]) -> bool {
    if value.is_empty() {
        return true;
    }
    // `http` takes any text for a port; RFC 3986's is digits.
    let port = match value.iter().rposition(|b| *b == b':') {
        Some(i) if !value[i..].contains(&b']') => &value[i + 1..],
        _ => b"",
    };
    port.iter().all(u8::is_ascii_digit)
        && !value.contains(&b'@')
        && http::uri::Authority::try_from(value).is_ok()
}

/// The index just past the first blank line (a line feed, then an empty line ended by LF or CR
/// LF), as an SSE event's end is found, in two vector searches: a search per line would take
/// one for each of a head's many lines (seventeen from OpenAI's client).
pub(super) fn head_end(buf: &[u8]) -> Option<usize> {
    static LF_LF: LazyLock<memmem::Finder<'static>> = LazyLock::new(|| memmem::Finder::new(b"\n\n"));
    static LF_CRLF: LazyLock<memmem::Finder<'static>> = LazyLock::new(|| memmem::Finder::new(b"\n\r\n"));
    // CR LF heads are the rule: a bare LF LF is looked for only before the CR LF blank line
    // (not through the body bytes read with the head). Both cannot start at the same byte.
    match LF_CRLF.find(buf) {
        Some(crlf) => Some(LF_LF.find(&buf[..crlf + 1]).map_or(crlf + 3, |lf| lf + 2)),
        None => LF_LF.find(buf).map(|lf| lf + 2),
    }
}

/// What one header line counts toward a server's limit on a head's size: the gateway counts
/// hyper's heads so too, so that both paths refuse the same heads.
pub fn header_size(name: &[u8], value: &[u8]) -> usize {
    name.len() + value.len() + 4
}

/// An HTTP/1.1 request head with a `Content-Length` body, parsed once: what this crate acts on,
/// and the headers its caller asked to keep, their values sharing the head's bytes.
#[derive(Debug)]
pub struct RequestHead {
    pub method: Method,
    pub uri: Uri,
    /// Only the headers `keep` chose: each kept costs a name check, a hash and an insertion, and
    /// a client such as OpenAI's sends seventeen.
    pub headers: HeaderMap,
    pub content_length: usize,
    /// The client asked to close after the answer.
    pub close: bool,
    /// The head's size as [`header_size`] counts it, with the request-target's.
    pub size: usize,
}

impl RequestHead {
    /// `None` for a head this crate does not serve, which its caller hands over (to hyper,
    /// which answers it as it always did): not HTTP/1.1, no `Content-Length` (or an invalid or
    /// repeated one), a transfer coding, `Expect`, an upgrade, more than [`MAX_HEADERS`]
    /// headers, a target `http` refuses, or not exactly one valid `Host` (RFC 9112 §3.2).
    pub fn parse(head: &Bytes, keep: impl Fn(&str) -> bool) -> Option<RequestHead> {
        // Left uninitialised: httparse writes the slots it fills, and zeroing them all would
        // cost more than parsing a client's usual handful.
        let mut slots = [const { std::mem::MaybeUninit::uninit() }; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut []);
        let parsed = req.parse_with_uninit_headers(head, &mut slots).ok()?;
        // The head ends where [`scan`] found its blank line: httparse must have read all of it.
        if parsed != httparse::Status::Complete(head.len()) || req.version? != 1 {
            return None;
        }
        let method = Method::from_bytes(req.method?.as_bytes()).ok()?;
        let path = req.path?;
        // A target httparse takes and `http` does not (raw UTF-8, say) is hyper's to refuse.
        let uri = Uri::from_maybe_shared(head.slice_ref(path.as_bytes())).ok()?;
        let mut content_length = None;
        let mut close = false;
        let mut hosts = 0;
        let mut size = uri.path_and_query().map_or(0, |p| p.as_str().len());
        let mut headers = HeaderMap::new();
        for h in req.headers.iter() {
            size += header_size(h.name.as_bytes(), h.value);
            if keep(h.name)
                && let (Ok(name), Ok(value)) = (
                    HeaderName::from_bytes(h.name.as_bytes()),
                    HeaderValue::from_maybe_shared(head.slice_ref(h.value)),
                )
            {
                headers.append(name, value);
            }
            let is = |name: &str| h.name.eq_ignore_ascii_case(name);
            if is("host") {
                hosts += 1;
                if !valid_host(h.value) {
                    return None;
                }
            } else if is("content-length") {
                let n = std::str::from_utf8(h.value).ok()?;
                if content_length.is_some() || n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                content_length = Some(n.parse::<usize>().ok()?);
            } else if is("transfer-encoding") || is("expect") || is("upgrade") {
                return None;
            } else if is("connection") {
                let v = std::str::from_utf8(h.value).ok()?;
                if v.split(',').any(|t| t.trim().eq_ignore_ascii_case("upgrade")) {
                    return None;
                }
                close |= v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close"));
            }
        }
        if hosts != 1 {
            return None;
        }
        Some(RequestHead {
            method,
            uri,
            headers,
            content_length: content_length?,
            close,
            size,
        })
    }
}
